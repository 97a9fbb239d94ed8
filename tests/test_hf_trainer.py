"""MeZOTrainer is shaped like transformers' Trainer: train() returns a TrainOutput, state is a TrainerState
(transformers reads its JSON), evaluate() prefixes its keys, save_model() writes a from_pretrained directory
with its card into output_dir, push_to_hub() defaults its repo, log_metrics / save_metrics / save_state."""
from __future__ import annotations

import json

import pytest
import torch

from mezo_rl.model.lm import LanguageModel
from mezo_rl.tasks import get_task
from mezo_rl.training.model_card import HubPushError
from mezo_rl.training.trainer import MeZOTrainer
from test_trainer import factory, make_args, splits  # noqa: F401  (factory is a fixture)


def _trainer(args, factory, **kw):  # noqa: F811
    return MeZOTrainer(args=args, lm=factory(), lm_factory=factory, task=get_task("sst2"), splits=splits(), **kw)


def test_train_returns_a_train_output_and_state_is_a_trainer_state(tmp_path, factory):  # noqa: F811
    from transformers.trainer_utils import TrainOutput

    trainer = _trainer(make_args(tmp_path, max_steps=4, eval_steps=2, load_best_model_at_end=True), factory)
    out = trainer.train()
    assert isinstance(out, TrainOutput) and out.global_step == 4 == trainer.state.global_step
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "split" not in r]
    assert out.training_loss == pytest.approx(sum(losses) / len(losses)) == out.metrics["train_loss"]
    summary = trainer.summary
    assert out.metrics["eval_accuracy"] == summary["validation"]["accuracy"]
    assert out.metrics["test_accuracy"] == summary["test"]["accuracy"]
    assert out.metrics["initial_eval_accuracy"] == summary["initial_validation"]["accuracy"]
    assert {"train_runtime", "train_samples_per_second", "train_steps_per_second", "epoch"} <= set(out.metrics)
    state = trainer.state
    assert state.best_metric == summary["validation"]["accuracy"] and state.best_global_step in (0, 2, 4)
    assert state.best_model_checkpoint == str(tmp_path / "run" / "checkpoint")
    logged = [h for h in state.log_history if "loss" in h]
    assert [h["step"] for h in logged] == [1, 2, 3, 4] and [h["loss"] for h in logged] == pytest.approx(losses)
    assert any("eval_accuracy" in h for h in state.log_history)


def test_evaluate_prefixes_its_keys_and_takes_an_eval_dataset(tmp_path, factory):  # noqa: F811
    trainer = _trainer(make_args(tmp_path, max_steps=1), factory)
    got = trainer.evaluate()
    assert set(got) == {"eval_accuracy", "eval_accuracy/se", "eval_n", "eval_runtime"}
    assert got["eval_n"] == len(splits()["validation"])
    test = trainer.evaluate(eval_dataset=splits()["test"], metric_key_prefix="test")
    assert set(test) == {"test_accuracy", "test_accuracy/se", "test_n", "test_runtime"}
    assert test["test_n"] == len(splits()["test"])


def test_save_model_writes_a_from_pretrained_directory_into_output_dir(tmp_path, factory):  # noqa: F811
    from transformers import AutoModelForCausalLM

    trainer = _trainer(make_args(tmp_path, max_steps=2, eval_steps=2), factory)
    trainer.train()
    out = trainer.save_model()
    assert out == tmp_path / "run" and (out / "README.md").is_file() and (out / "training_args.json").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(out)
    for (name, saved), (_, mine) in zip(loaded.named_parameters(), trainer.model.named_parameters()):
        assert torch.equal(saved, mine), name
    other = trainer.save_model(tmp_path / "elsewhere")
    assert (other / "config.json").is_file() and (other / "README.md").is_file()


def test_push_to_hub_defaults_its_repo_to_the_output_directory_or_hub_model_id(tmp_path, factory, monkeypatch):  # noqa: F811
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing leaves the machine: the one-line refusal names the repo
    trainer = _trainer(make_args(tmp_path, "my-run", max_steps=1), factory)
    with pytest.raises(HubPushError, match="push_to_hub 'my-run'"):
        trainer.push_to_hub()
    trainer = _trainer(make_args(tmp_path, "my-run", max_steps=1, hub_model_id="me/mezo-sst2"), factory)
    with pytest.raises(HubPushError, match="push_to_hub 'me/mezo-sst2'"):
        trainer.push_to_hub()


def test_log_metrics_save_metrics_and_save_state_as_transformers(tmp_path, factory, capsys):  # noqa: F811
    from transformers import TrainerState

    trainer = _trainer(make_args(tmp_path, max_steps=2, eval_steps=1), factory)
    out = trainer.train()
    capsys.readouterr()
    trainer.log_metrics("train", out.metrics)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "***** train metrics *****" and any(line.split()[0] == "train_loss" for line in printed[1:])
    trainer.save_metrics("train", out.metrics)
    trainer.save_metrics("eval", {"eval_accuracy": 0.5})
    run = tmp_path / "run"
    assert json.loads((run / "train_results.json").read_text())["train_loss"] == pytest.approx(out.training_loss)
    assert json.loads((run / "all_results.json").read_text())["eval_accuracy"] == 0.5
    trainer.save_state()
    theirs = TrainerState.load_from_json(str(run / "trainer_state.json"))  # transformers reads our layout
    assert theirs.global_step == 2 and theirs.best_metric == trainer.state.best_metric
    assert theirs.log_history == json.loads(json.dumps(trainer.state.log_history))


def test_train_resume_from_checkpoint_continues_the_run(tmp_path, factory):  # noqa: F811
    _trainer(make_args(tmp_path, "split", max_steps=2, eval_steps=2), factory).train()
    resumed = _trainer(make_args(tmp_path, "split", max_steps=4, eval_steps=2), factory)
    out = resumed.train(resume_from_checkpoint=str(tmp_path / "split" / "checkpoint"))
    whole = _trainer(make_args(tmp_path, "whole", max_steps=4, eval_steps=2), factory)
    whole.train()
    assert out.global_step == 4
    for a, b in zip(resumed.model.parameters(), whole.model.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="resumes from the checkpoint in its own output_dir"):
        _trainer(make_args(tmp_path, "other", max_steps=4), factory).train(resume_from_checkpoint=str(tmp_path / "split"))


def test_the_first_argument_is_the_model_and_a_config_there_is_one_line(tmp_path, factory):  # noqa: F811
    args = make_args(tmp_path, max_steps=1)
    with pytest.raises(ValueError, match="give the configuration as args="):
        MeZOTrainer(args, lm=factory(), task=get_task("sst2"), splits=splits())
    with pytest.raises(ValueError, match="optimizers: MeZO is the optimizer"):
        MeZOTrainer(args=args, optimizers=(torch.optim.SGD([torch.zeros(1)], lr=1), None), lm=factory())
    assert isinstance(factory(), LanguageModel)
