"""A prompt task's step does not depend on the reward's scale, in every mode (issue 35): the same run with
the reward multiplied by 100 makes the same weights, up to float rounding."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mezo_rl import rewards
from conftest import make_tiny_causal_lm
from mezo_rl.model.lm import LanguageModel
from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.training.resolve import mode_defaults
from mezo_rl.training.setup import trainable_parameters
from mezo_rl.training.trainer import MeZOTrainer

STEPS = 2
WORDS = ["the movie was", "a film about", "the acting is", "this story has", "the plot was", "an ending that"]


def reward_len(completions, **kwargs):
    """TRL's documented example reward (values around -20)."""
    return [-abs(20 - len(c)) for c in completions]


def reward_len_x100(completions, **kwargs):
    return [100.0 * v for v in reward_len(completions)]


@pytest.fixture()
def registered():
    for fn in (reward_len, reward_len_x100):
        rewards.register_reward(fn.__name__, replace=True)(fn)
    yield
    for fn in (reward_len, reward_len_x100):
        rewards.unregister_reward(fn.__name__)


def prompts_file(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{WORDS[i % len(WORDS)]} {i}"}) + "\n" for i in range(30)))
    return path


def run(tmp_path, tiny_tokenizer, mode: str, reward: str):
    """STEPS steps of a prompt run (sampled completions, so a small perturbation changes them) with the mode's
    prompt-task defaults (set: the run's length, 2 SPSA samples so that each step has a spread to normalise by, and
    an eps large enough to change a tiny model's completions); the
    trainable tensors after them and the steps' projected gradients."""
    args = MeZOConfig(model="tiny", task=str(prompts_file(tmp_path)), reward=[reward], peft=mode,
                             max_steps=STEPS, per_device_train_batch_size=4, eval_steps=STEPS, autocast="none",
                             progress=False, output_dir=str(tmp_path / f"{mode}-{reward}"), num_train=20, num_eval=6,
                             num_test=6, max_completion_length=8, member_evaluation="inplace", do_sample=True,
                             n_spsa=2, eps=2.0)
    lm = LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)
    trainer = MeZOTrainer(args=args, lm=lm)
    grads = [trainer.training_step()["projected_grad"] for _ in range(STEPS)]
    return [p.detach().clone() for p in trainable_parameters(trainer.lm.model)], grads, args


@pytest.mark.parametrize("mode", ["norm", "full", "lora", "prefix"])
def test_a_reward_times_100_makes_the_same_weights(tmp_path, tiny_tokenizer, registered, mode):
    assert mode_defaults(mode, "prompts")["step_normalize"] != "none"  # the default that makes this hold
    w1, g1, args = run(tmp_path, tiny_tokenizer, mode, "reward_len")
    w100, g100, _ = run(tmp_path, tiny_tokenizer, mode, "reward_len_x100")
    assert any(g != 0 for g in g1)  # the steps moved the weights
    # The loss differences scale by 100 and so does their spread: each projected gradient is the same number
    # up to the float64 rounding of the handful of operations that form it (the scaled rewards, their means,
    # the spread's sum of squares and square root, one division)
    u64 = np.finfo(np.float64).eps
    for a, b in zip(g1, g100):
        assert abs(a - b) <= 64 * u64 * max(abs(a), 1e-300)
    # A weight then differs at most by the float32 rounding of each step's update (one ulp of the weight and one
    # of the update per step)
    for a, b in zip(w1, w100):
        bound = STEPS * 2 * torch.finfo(torch.float32).eps * float(max(a.abs().max(), 1.0))
        assert float((a - b).abs().max()) <= bound
