"""TRL's GRPO quick start runs with two names changed (GRPOTrainer -> MeZOTrainer, GRPOConfig -> MeZOConfig),
a local Dataset in place of load_dataset(...) and a tiny model; TRL's documented reward examples run unchanged,
in plain and conversational form."""
from __future__ import annotations

import copy
import json
import re

import pytest

from conftest import make_tiny_causal_lm

datasets = pytest.importorskip("datasets")
from datasets import Dataset  # noqa: E402

from mezo_rl import MeZOConfig, MeZOTrainer  # noqa: E402
from mezo_rl.training.defaults import PROMPT_TASK_DEFAULTS  # noqa: E402

PROMPTS = [f"the movie was good and the acting was bad . {i}" for i in range(40)]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


# TRL's reward examples, as its documentation writes them
def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_grpo_quickstart_with_two_names_changed(tmp_path, tiny_tokenizer, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, tokenizer = make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer
    # --- TRL's quick start; the dataset is local and the model tiny ---
    dataset = Dataset.from_dict({"prompt": PROMPTS})

    trainer = MeZOTrainer(model=model, reward_funcs=reward_len,
                          args=MeZOConfig(output_dir="out", learning_rate=1e-5), train_dataset=dataset,
                          processing_class=tokenizer)
    trainer.train()
    # ---
    config = json.loads((tmp_path / "out" / "training_args.json").read_text())
    row = PROMPT_TASK_DEFAULTS[config["peft"]]  # a prompt task's run length, for the mode it defaults to
    assert (config["max_steps"], config["per_device_train_batch_size"]) == (row["max_steps"], row["per_device_train_batch_size"])
    assert [r["step"] for r in records(tmp_path / "out") if "split" not in r] == list(range(1, row["max_steps"] + 1))


def test_the_quickstart_trains_records_its_reward_and_logs_trls_keys(tmp_path, tiny_tokenizer):
    model, tokenizer = make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer
    dataset = Dataset.from_dict({"prompt": PROMPTS})
    trainer = MeZOTrainer(model=model, reward_funcs=reward_len,
                          args=MeZOConfig(output_dir=str(tmp_path / "out"), learning_rate=1e-5, max_steps=3,
                                          progress=False),
                          train_dataset=dataset, processing_class=tokenizer)
    # the defaults of a prompt task, though the task is an object and args.task says nothing of it
    assert (trainer.args.per_device_train_batch_size, trainer.args.n_spsa) == (16, 4)
    trainer.train()
    summary = trainer.summary
    assert summary["steps"] == 3

    config = json.loads((tmp_path / "out" / "training_args.json").read_text())
    assert config["reward"] == [f"{__name__}:reward_len"] and config["learning_rate"] == 1e-5
    # an in-memory Dataset cannot be named in a config: the run says so
    assert summary["config_replayable"] is False
    reasons = summary["config_not_replayable_because"]
    assert any("in-memory" in why for why in reasons)
    assert any("LlamaForCausalLM object without a name_or_path" in why for why in reasons)

    steps = [r for r in records(tmp_path / "out") if "split" not in r]
    for r in steps:
        # one reward of weight 1: TRL's reward is minus the loss, both means of the same member rewards
        assert r["reward"] == pytest.approx(-r["loss"], rel=1e-12, abs=1e-12)
        assert r["reward_std"] >= 0 and 0 <= r["frac_reward_zero_std"] <= 1
        assert r["completions/mean_length"] > 0  # the completions' text in tokens (re-tokenised: may differ by a few)
    validation = [r for r in records(tmp_path / "out") if r.get("split") == "validation"]
    assert validation and all(r["metrics"][f"{__name__}:reward_len"] <= 0 for r in validation)


def test_conversational_prompts_reach_trls_format_reward_as_messages(tmp_path, tiny_tokenizer):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = CHAT_TEMPLATE
    model = make_tiny_causal_lm(tokenizer)
    seen = []

    def length_of_content(completions, **kwargs):  # the length reward over TRL's conversational completions
        seen.extend(completions)
        return [-abs(20 - len(completion[0]["content"])) for completion in completions]

    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in PROMPTS]})
    trainer = MeZOTrainer(model=model, reward_funcs=[format_reward_func, length_of_content],
                          args=MeZOConfig(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=8,
                                          max_completion_length=16, progress=False),
                          train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    summary = trainer.summary
    assert seen and all(isinstance(c, list) and c[0]["role"] == "assistant" and isinstance(c[0]["content"], str)
                        for c in seen)
    assert 0 <= summary["validation"][f"{__name__}:format_reward_func"] <= 1  # a share of completions in the format
    # the local function trains, and the run records that its config cannot bring it back
    assert any("defined inside another" in why for why in summary["config_not_replayable_because"])


def test_a_string_model_and_a_data_file_make_a_run_its_config_repeats(tmp_path, tiny_model_dir, monkeypatch):
    """A callable reward is recorded as module:qualname and `mezo-rl train --config` imports it again: the replay
    writes the same trajectory, bit for bit."""
    from mezo_rl.cli.main import main

    rewards_dir = tmp_path / "code"
    rewards_dir.mkdir()
    (rewards_dir / "my_trl_rewards.py").write_text(
        "def reward_len(completions, **kwargs):\n    return [-abs(20 - len(c)) for c in completions]\n")
    monkeypatch.syspath_prepend(str(rewards_dir))
    import my_trl_rewards

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    first, again = tmp_path / "first", tmp_path / "again"
    trainer = MeZOTrainer(model=str(tiny_model_dir), reward_funcs=my_trl_rewards.reward_len,
                          args=MeZOConfig(output_dir=str(first), max_steps=2, per_device_train_batch_size=4, n_spsa=1,
                                          max_completion_length=8, autocast="none", progress=False),
                          train_dataset=str(data))
    trainer.train()
    summary = trainer.summary
    config = json.loads((first / "training_args.json").read_text())
    assert config["reward"] == ["my_trl_rewards:reward_len"] and config["task"] == str(data)
    assert summary["config_replayable"] is True
    assert main(["train", "--config", str(first / "training_args.json"), "--output-dir", str(again)]) == 0
    assert (again / "checkpoint" / "trajectory.npz").read_bytes() == (first / "checkpoint" / "trajectory.npz").read_bytes()


def test_a_lambda_reward_trains_but_its_config_says_in_one_line_it_cannot_be_replayed(tmp_path, tiny_tokenizer, capsys):
    from mezo_rl.cli.main import main

    trainer = MeZOTrainer(model=make_tiny_causal_lm(tiny_tokenizer), reward_funcs=lambda completions, **kw: [1.0] * len(completions),
                          args=MeZOConfig(output_dir=str(tmp_path / "run"), max_steps=1, per_device_train_batch_size=4,
                                          max_completion_length=8, progress=False),
                          train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=tiny_tokenizer)
    trainer.train()
    summary = trainer.summary
    assert summary["config_replayable"] is False
    assert any("is a lambda" in why for why in summary["config_not_replayable_because"])
    assert main(["train", "--config", str(tmp_path / "run" / "training_args.json"), "--output-dir", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a lambda" in err and "the reward must be importable" in err
