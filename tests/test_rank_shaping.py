"""Rank shaping (``reward_shaping="rank"``): a member's loss is its centred rank among the step's members, so a step
depends only on the members' order: where each member's fitness is one completion's reward, the same run with the
reward through any increasing transform is the same run (with more completions a member's fitness is their mean,
whose order a non-linear transform of each reward can change)."""
from __future__ import annotations

import json
import math

import pytest

from conftest import make_tiny_causal_lm
from mezo_rl import rewards
from mezo_rl.model.lm import LanguageModel
from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.training.fitness import centred_ranks
from mezo_rl.training.setup import trainable_parameters
from mezo_rl.training.trainer import MeZOTrainer

STEPS = 2


def test_centred_ranks_run_from_minus_a_half_for_the_lowest_loss_to_a_half_for_the_highest():
    assert centred_ranks([3.0, 1.0, 2.0, 2.0]) == [0.5, -0.5, 0.0, 0.0]  # ties share their mean rank
    assert centred_ranks([-7.0, 40.0]) == [-0.5, 0.5]
    assert centred_ranks([5.0]) == [0.0]
    out = centred_ranks([1.0, math.nan, 0.0])  # a member no reward scored stays unranked
    assert out[0] == 0.0 and math.isnan(out[1]) and out[2] == -0.5


def reward_len(completions, **kwargs):
    return [-abs(20 - len(c)) for c in completions]


def reward_len_exp(completions, **kwargs):  # an increasing, far from linear transform of reward_len
    return [math.exp(v / 3.0) + 7.0 for v in reward_len(completions)]


@pytest.fixture()
def registered():
    for fn in (reward_len, reward_len_exp):
        rewards.register_reward(fn.__name__, replace=True)(fn)
    yield
    for fn in (reward_len, reward_len_exp):
        rewards.unregister_reward(fn.__name__)


def run(tmp_path, tiny_tokenizer, reward: str, shaping: str):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"the movie was {i}"}) + "\n" for i in range(30)))
    args = MeZOConfig(model="tiny", task=str(prompts), reward=[reward], peft="full", reward_shaping=shaping,
                      max_steps=STEPS, per_device_train_batch_size=1, eval_steps=STEPS, autocast="none", progress=False,
                      output_dir=str(tmp_path / f"{reward}-{shaping}"), num_train=20, num_eval=6, num_test=6,
                      max_completion_length=8, member_evaluation="inplace", do_sample=True, n_spsa=2, eps=2.0)
    trainer = MeZOTrainer(args=args, lm=LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer))
    grads = [trainer.training_step()["projected_grad"] for _ in range(STEPS)]
    return [p.detach().clone() for p in trainable_parameters(trainer.lm.model)], grads


def test_a_rank_shaped_run_is_the_same_run_under_any_increasing_transform_of_the_reward(tmp_path, tiny_tokenizer,
                                                                                     registered):
    w1, g1 = run(tmp_path, tiny_tokenizer, "reward_len", "rank")
    w2, g2 = run(tmp_path, tiny_tokenizer, "reward_len_exp", "rank")
    assert any(g != 0 for g in g1)  # the steps moved the weights
    assert g1 == g2  # the members' order is all a step reads: bit for bit
    assert all((a == b).all() for a, b in zip(w1, w2))
    _, g_mean = run(tmp_path, tiny_tokenizer, "reward_len_exp", "none")
    assert g_mean != g2  # without rank shaping the transform changes the steps
