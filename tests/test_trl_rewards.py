"""Rewards as TRL takes them: a sequence-classification reward model (an object, a path or a hub id, with
reward_processing_classes) scores prompt + completion by its logits[:, 0]; TRL's reward keywords
(completion_ids, trainer_state, log_extra, log_metric) are passed; a reward model that cannot load is one line,
exit 2, before the policy loads."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import make_tiny_causal_lm
from mezo_rl import MeZOConfig, MeZOTrainer
from mezo_rl.cli.main import main
from mezo_rl.errors import ConfigError
from mezo_rl.training.trl_rewards import RewardModel, is_reward_model_ref

datasets = pytest.importorskip("datasets")
PROMPTS = [f"Tell me about the number {i} and" for i in range(12)]


def _reward_model(tokenizer, seed=1):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    return LlamaForSequenceClassification(config).eval()


def _args(tmp_path, name, **kw):
    return MeZOConfig(output_dir=str(tmp_path / name), max_steps=1, per_device_train_batch_size=4,
                      max_completion_length=6, progress=False, autocast="none", **kw)


def test_a_reward_model_scores_prompt_plus_completion_by_its_first_logit(tiny_tokenizer):
    rm = _reward_model(tiny_tokenizer)
    prompts, completions = ["the movie was", "a long day"], [" great fun", " and then some more"]
    got = RewardModel(rm, tiny_tokenizer)(prompts=prompts, completions=completions)
    for p, c, value in zip(prompts, completions, got):  # one at a time, unpadded: the same number
        ids = tiny_tokenizer(p + c, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            assert value == pytest.approx(rm(**ids).logits[0, 0].item(), abs=1e-5)


def test_a_reward_model_object_path_or_id_trains_and_is_recorded(tmp_path, tiny_tokenizer):
    rm = _reward_model(tiny_tokenizer)
    data = datasets.Dataset.from_dict({"prompt": PROMPTS})
    trainer = MeZOTrainer(model=make_tiny_causal_lm(tiny_tokenizer), processing_class=tiny_tokenizer,
                          reward_funcs=[rm], reward_processing_classes=[tiny_tokenizer], train_dataset=data,
                          args=_args(tmp_path, "object"))
    assert trainer.train().global_step == 1
    saved = tmp_path / "rm"
    rm.save_pretrained(saved)
    tiny_tokenizer.save_pretrained(saved)
    assert is_reward_model_ref(str(saved)) and is_reward_model_ref("org/reward-model")
    assert not is_reward_model_ref("accuracy") and not is_reward_model_ref("my_rewards.py:fn")
    trainer = MeZOTrainer(model=make_tiny_causal_lm(tiny_tokenizer), processing_class=tiny_tokenizer,
                          reward_funcs=str(saved), train_dataset=data, args=_args(tmp_path, "path"))
    trainer.train()
    assert json.loads((tmp_path / "path" / "training_args.json").read_text())["reward"] == [str(saved)]
    rows = [json.loads(line) for line in (tmp_path / "path" / "metrics.jsonl").read_text().splitlines()]
    assert any(f"rewards/{saved.name}/mean" in json.dumps(r) or str(saved) in json.dumps(r) for r in rows)


def test_a_reward_model_that_cannot_load_is_one_line_before_the_policy_loads(tmp_path, tiny_tokenizer, capsys):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    rc = main(["train", "--task", str(data), "--reward", "nobody/no-such-reward-model", "--model", "nobody/no-model",
               "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "reward model 'nobody/no-such-reward-model' cannot be loaded" in err and "no-model" not in err
    with pytest.raises(ConfigError, match="reward_processing_classes: got 2 for 1 reward_funcs"):
        MeZOTrainer(model="nobody/no-model", reward_funcs=[_reward_model(tiny_tokenizer)],
                    reward_processing_classes=[tiny_tokenizer, tiny_tokenizer], args=_args(tmp_path, "x"))


def test_trl_reward_keywords_are_passed(tmp_path, tiny_tokenizer):
    seen = {}

    def reward_logging(prompts, completions, completion_ids, trainer_state, log_metric, log_extra, **kwargs):
        seen["ids"] = completion_ids
        seen["texts"] = list(completions)
        seen["step"] = trainer_state.global_step
        log_metric("my_metric", 2.5)
        log_extra("my_column", [len(c) for c in completions])
        return [float(len(c)) for c in completions]

    trainer = MeZOTrainer(model=make_tiny_causal_lm(tiny_tokenizer), processing_class=tiny_tokenizer,
                          reward_funcs=reward_logging, train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}),
                          args=_args(tmp_path, "kw", log_completions=4))
    trainer.train()
    assert seen["ids"] == [tiny_tokenizer(t, add_special_tokens=False)["input_ids"] for t in seen["texts"]]
    steps = [json.loads(line) for line in (tmp_path / "kw" / "metrics.jsonl").read_text().splitlines()]
    assert [r["my_metric"] for r in steps if "split" not in r] == [2.5]  # log_metric: the step's record
    samples = (tmp_path / "kw" / "samples").glob("validation-*.jsonl")
    rows = [json.loads(line) for path in samples for line in path.read_text().splitlines()]
    assert rows and all(row["my_column"] == len(row["completion"]) for row in rows)  # log_extra: the samples
