"""Baselines: zero-shot, ICL, linear probing (scipy logistic regression), Adam fine-tuning."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import make_tiny_causal_lm
from mezo_rl.cli.baselines import (BaselineArguments, finetune, fit_logistic_regression, icl, linear_probe,
                               pick_demonstrations, run_baseline, zero_shot, _ft_loss)
from mezo_rl.training.evaluation import evaluate
from mezo_rl.model.lm import LanguageModel
from mezo_rl.rewards import candidate_cross_entropy
from mezo_rl.tasks import Example, get_task
from test_trainer import sst2_like


@pytest.fixture()
def lm(tiny_tokenizer):
    return LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)


def test_logistic_regression_separates_separable_data_and_generalises():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(3, 5)) * 4
    y = rng.integers(0, 3, size=300)
    x = centers[y] + rng.normal(size=(300, 5))
    predict = fit_logistic_regression(x[:200], y[:200], n_classes=3, l2=1.0)
    assert (predict(x[200:]) == y[200:]).mean() > 0.95
    # a constant feature (zero variance) must not break standardisation
    x_const = np.concatenate([x, np.ones((300, 1))], axis=1)
    assert (fit_logistic_regression(x_const[:200], y[:200], 3)(x_const[200:]) == y[200:]).mean() > 0.95


def test_linear_probe_learns_a_feature_the_model_exposes(lm):
    # the label is spelled out in the prompt, so the features separate the classes linearly
    train, test = sst2_like(40, 0), sst2_like(20, 1)
    result = linear_probe(lm, get_task("sst2"), train, test)
    assert result["train_accuracy"] >= 0.9
    assert 0.0 <= result["accuracy"] <= 1.0


def test_linear_probe_rejects_generation_tasks(lm):
    with pytest.raises(ValueError, match="classification"):
        linear_probe(lm, get_task("squad"), [], [])


def test_zero_shot_and_icl_use_the_task_evaluation(lm):
    task = get_task("sst2")
    train, test = sst2_like(40, 0), sst2_like(8, 1)
    assert zero_shot(lm, task, test) == {k: float(v) for k, v in evaluate(lm, task, test).items()}
    demos = pick_demonstrations(train, 32, seed=3)
    assert len(demos) == 32 and demos == pick_demonstrations(train, 32, seed=3)
    assert icl(lm, task, train, test, num_demonstrations=32, seed=3) == {
        k: float(v) for k, v in evaluate(lm, task, test, demonstrations=demos).items()}
    with pytest.raises(ValueError, match="empty"):
        icl(lm, task, [], test)


def test_finetune_with_adam_lowers_the_training_loss(lm):
    task = get_task("sst2")
    train = sst2_like(16, 0)
    with torch.no_grad():
        before = float(_ft_loss(lm, task, train))
    info = finetune(lm, task, train, lr=5e-3, batch_size=16, epochs=6, progress=False)
    with torch.no_grad():
        after = float(_ft_loss(lm, task, train))
    assert info["steps"] == 6
    assert after < 0.9 * before


def test_finetune_generation_uses_teacher_forced_gold_answer(lm):
    task = get_task("squad")
    train = [Example(prompt="Question: what is the answer ?\nAnswer:", answers=[" 42", " forty two"]) for _ in range(4)]
    with torch.no_grad():
        before = float(_ft_loss(lm, task, train))
    finetune(lm, task, train, lr=1e-2, batch_size=4, epochs=5, progress=False)
    with torch.no_grad():
        assert float(_ft_loss(lm, task, train)) < before


def test_finetune_on_a_masked_lm_scores_the_mask_prompt(tiny_masked_lm):
    """The backprop baseline reads the model outputs training reads: a masked LM scores the mask
    prompt and the label words (it once scored ``ex.prompt``, which has no [MASK])."""
    lm = LanguageModel(*tiny_masked_lm)
    task = get_task("sst2")
    train = [Example(prompt=ex.prompt, candidates=ex.candidates, label=ex.label, mask_prompt=ex.prompt + " [MASK] .",
                     mask_candidates=["terrible", "great"]) for ex in sst2_like(8, 0)]
    with torch.no_grad():
        scores = lm.score([ex.mask_prompt for ex in train], [ex.mask_candidates for ex in train])
        expected = float(torch.stack(candidate_cross_entropy(scores, [ex.label for ex in train])).mean())
        assert float(_ft_loss(lm, task, train)) == pytest.approx(expected, rel=1e-6)
    info = finetune(lm, task, train, lr=5e-3, batch_size=8, epochs=2, progress=False)
    assert info["steps"] == 2 and math.isfinite(info["final_loss"])


def test_run_baseline_writes_its_result(tmp_path, lm):
    args = BaselineArguments(method="icl", model="tiny", num_demonstrations=4, output_dir=str(tmp_path))
    splits = {"train": sst2_like(10, 0), "test": sst2_like(6, 1)}
    result = run_baseline(args, lm=lm, task=get_task("sst2"), splits=splits)
    assert set(result) >= {"method", "test", "wall_time_s", "peak_rss_mb"}
    assert (tmp_path / "baseline_icl.json").is_file()
    with pytest.raises(ValueError, match="accepted: zero-shot, icl, lp, ft"):
        BaselineArguments(method="few-shot")
