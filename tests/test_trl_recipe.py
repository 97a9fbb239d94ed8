"""A TRL GRPO recipe runs as written (issue 68): reward weights over reward_funcs, one set of metric names, the
final weights by default, hub checks before the first step, PEFT adapters, completions while training."""
from __future__ import annotations

import pytest

from conftest import make_tiny_causal_lm
from test_cli_errors import assert_one_line_error, run_cli

from mezo_rl import MeZOConfig
from mezo_rl.errors import ConfigError
from mezo_rl.training.plan import plan_given

datasets = pytest.importorskip("datasets")
from datasets import Dataset  # noqa: E402

PROMPTS = [f"the movie was good and the acting was bad . {i}" for i in range(24)]


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def reward_words(completions, **kwargs):
    return [float(len(completion.split())) for completion in completions]


# ---------------------------------------------------------------------- 1. reward_weights weigh reward_funcs
def test_reward_weights_weigh_reward_funcs_in_order(tmp_path, tiny_tokenizer):
    args = MeZOConfig(output_dir=str(tmp_path / "out"), reward_weights=[1.0, 0.5])
    plan, _, _ = plan_given(args, make_tiny_causal_lm(tiny_tokenizer), [reward_len, reward_words],
                            Dataset.from_dict({"prompt": PROMPTS}), processing_class=tiny_tokenizer)
    weights = [plan.objective.weights[name] for name in plan.objective.names]
    assert [n.rpartition(":")[2] for n in plan.objective.names] == ["reward_len", "reward_words"]
    assert weights == [1.0, 0.5] and plan.args.reward_weights == [1.0, 0.5]


def test_a_count_mismatch_is_one_line_naming_the_functions_given(tmp_path, tiny_tokenizer):
    args = MeZOConfig(output_dir=str(tmp_path / "out"), reward_weights=[1.0, 0.5, 2.0])
    with pytest.raises(ConfigError) as err:
        plan_given(args, make_tiny_causal_lm(tiny_tokenizer), [reward_len, reward_words],
                   Dataset.from_dict({"prompt": PROMPTS}), processing_class=tiny_tokenizer)
    message = str(err.value)
    assert "\n" not in message and "got 3 weights for 2 rewards ['reward_len', 'reward_words']" in message
    assert "reward_funcs" in message


def test_the_cli_checks_weights_against_the_task_own_reward_before_anything_loads(tmp_path, capsys):
    rc, _, err = run_cli(["train", "--model", "/nonexistent/model-dir", "--task", "sst2", "--reward-weights", "1,2",
                          "--output-dir", tmp_path / "run"], capsys)
    assert_one_line_error(rc, err, "--reward-weights", "['accuracy']")
    assert not (tmp_path / "run").exists()
