"""MeZOConfig / MeZOTrainer as a TRL user meets them: TRL's option names, GRPOConfig options that mean nothing
for MeZO, every input form, and one line for each mistake before any model loads."""
from __future__ import annotations

import json

import logging

import pytest

from conftest import make_tiny_causal_lm
from mezo_rl import MeZOConfig, MeZOTrainer
from mezo_rl.cli.main import build_parser, main, parse_into
from mezo_rl.errors import ConfigError, UserError
from mezo_rl.training.config import NO_MEANING
from mezo_rl.training.defaults import PROMPT_TASK_DEFAULTS, PROMPT_TASK_MODE

datasets = pytest.importorskip("datasets")
from datasets import Dataset  # noqa: E402

PROMPTS = [f"the movie was good and the acting was bad . {i}" for i in range(30)]
NOT_A_MODEL = "nobody/no-such-model"  # loading it would fail: a mistake found first never gets that far


def reward_len(completions, **kwargs):
    return [-abs(20 - len(c)) for c in completions]


def one_line(info) -> str:
    text = str(info.value)
    assert isinstance(info.value, UserError) and "\n" not in text
    return text


def test_one_name_per_thing_the_earlier_aliases_are_gone():
    import mezo_rl

    for earlier in ("Trainer", "TrainingArguments"):
        assert not hasattr(mezo_rl, earlier) and earlier not in mezo_rl.__all__


def test_one_name_per_field_trls_and_the_earlier_names_are_refused(capsys):
    trl = MeZOConfig(learning_rate=1e-3, max_steps=7, per_device_train_batch_size=4, max_completion_length=9)
    ns = build_parser().parse_args(["train", "--learning-rate", "1e-3", "--max-steps", "7",
                                    "--per-device-train-batch-size", "4", "--max-completion-length", "9"])
    assert parse_into(MeZOConfig, ns).to_dict() == trl.to_dict()
    with pytest.raises(ConfigError, match="unknown MeZOConfig fields 'lr' \\(now 'learning_rate'\\), 'steps' "
                                          "\\(now 'max_steps'\\), 'batch_size' \\(now 'per_device_train_batch_size'\\)"):
        MeZOConfig(lr=1e-3, steps=7, batch_size=4, max_new_tokens=9)
    for command, old, new in (("train", "--lr", "--learning-rate"), ("train", "--steps", "--max-steps"),
                              ("train", "--batch-size", "--per-device-train-batch-size"),
                              ("train", "--max-new-tokens", "--max-completion-length"),
                              ("eval", "--batch-size", "--eval-batch-size"),
                              ("eval", "--max-new-tokens", "--max-completion-length"),
                              ("baseline", "--max-new-tokens", "--max-completion-length")):
        assert main([command, old, "1", "--model", NOT_A_MODEL]) == 2  # not even as an abbreviation: one line
        assert capsys.readouterr().err == f"mezo-rl: error: {old} is now {new} (see `mezo-rl {command} --help`)\n"
    assert main(["eval", "--batch-size", "1", "--no-such-option"]) == 2
    assert "is now --eval-batch-size; unrecognized arguments: --no-such-option" in capsys.readouterr().err
    assert MeZOConfig(bf16=True).autocast == "bfloat16" and MeZOConfig(bf16=False).autocast == "none"
    assert MeZOConfig(lr_scheduler_type="linear").lr_scheduler_type == "linear"
    assert MeZOConfig(log_completions=False).log_completions == 0


@pytest.mark.parametrize("name", sorted(NO_MEANING)[:6] + ["vllm_mode"])
def test_a_grpo_option_with_no_meaning_for_mezo_is_accepted_and_named_with_why(name, caplog):
    with caplog.at_level(logging.WARNING, logger="mezo_rl"):
        MeZOConfig(**{name: 1})
    (line,) = [r.getMessage() for r in caplog.records if r.name == "mezo_rl"]
    assert "no meaning for MeZO, accepted and not used" in line and f"{name} (" in line.replace(",", " (")


def test_a_config_file_with_a_grpo_only_option_is_one_warning_line_on_the_command_line(tmp_path, caplog, capsys):
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text("learning_rate: 1.0e-5\nloss_type: dapo\nfp16: false\n")
    with caplog.at_level(logging.WARNING, logger="mezo_rl"):
        assert main(["train", "--config", str(cfg), "--model", NOT_A_MODEL]) == 2  # then the missing model: one line
    # one line for the GRPO-only options; GRPO's learning rate gets its own line (issue 68), naming the mode's default
    (line, lr) = [r.getMessage() for r in caplog.records if r.name == "mezo_rl"]
    assert "loss_type (MeZO has no surrogate loss" in line and "fp16" not in line
    assert "learning_rate 1e-05 is below 1/100 of the norm mode's default" in lr
    assert capsys.readouterr().err.count("\n") == 1


def test_a_dataset_without_a_prompt_column_lists_its_columns_before_the_model_loads(tmp_path):
    with pytest.raises(UserError) as info:
        MeZOTrainer(model=NOT_A_MODEL, reward_funcs=reward_len, args=MeZOConfig(output_dir=str(tmp_path)),
                    train_dataset=Dataset.from_dict({"question": PROMPTS, "topic": PROMPTS}))
    assert "no 'prompt' column" in one_line(info) and "['question', 'topic']" in str(info.value)


def test_an_iterable_dataset_needs_max_steps_and_reads_only_the_rows_the_run_uses(tmp_path, tiny_tokenizer):
    stream = Dataset.from_dict({"prompt": PROMPTS}).to_iterable_dataset()
    with pytest.raises(ConfigError) as info:
        MeZOTrainer(model=NOT_A_MODEL, reward_funcs=reward_len, args=MeZOConfig(output_dir=str(tmp_path)),
                    train_dataset=stream)
    assert "IterableDataset: a stream has no length, so give max_steps" in one_line(info)
    trainer = MeZOTrainer(model=make_tiny_causal_lm(tiny_tokenizer), processing_class=tiny_tokenizer,
                          reward_funcs=reward_len, train_dataset=stream,
                          args=MeZOConfig(output_dir=str(tmp_path), max_steps=1, num_train=8, num_eval=2, num_test=2,
                                          progress=False))
    # only the first num_train + num_eval + num_test = 12 rows of the stream are read; validation and test are
    # carved from them and train samples its 8 from the rest
    seen = [ex.prompt for split in trainer.splits.values() for ex in split]
    assert set(seen) <= set(PROMPTS[:12]) and len(trainer.splits["train"]) == 8 and len(set(seen)) == len(seen)


@pytest.mark.parametrize("reward, message", [
    (42, "reward_funcs[0]: got a int, which is not callable"),
    ([reward_len, "not-a-registered-reward"], "not-a-registered-reward"),
    ([], "give at least one reward"),
])
def test_a_reward_that_is_not_a_function_or_a_name_is_one_line(tmp_path, reward, message):
    with pytest.raises(UserError) as info:
        MeZOTrainer(model=NOT_A_MODEL, reward_funcs=reward, args=MeZOConfig(output_dir=str(tmp_path)),
                    train_dataset=Dataset.from_dict({"prompt": PROMPTS}))
    assert message in one_line(info)


def test_peft_config_and_model_objects(tmp_path, tiny_tokenizer):
    peft = pytest.importorskip("peft")
    trainer = MeZOTrainer(model=make_tiny_causal_lm(tiny_tokenizer), processing_class=tiny_tokenizer,
                          reward_funcs=reward_len, train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                          peft_config=peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.05),
                          args=MeZOConfig(output_dir=str(tmp_path), max_steps=1, progress=False))
    a = trainer.args
    assert (a.peft, a.lora_r, a.lora_alpha, a.lora_dropout) == ("lora", 4, 8, 0.05)
    assert any("lora" in name for name, p in trainer.model.named_parameters() if p.requires_grad)
    with pytest.raises(ConfigError) as info:  # before any model loads
        MeZOTrainer(model=NOT_A_MODEL, reward_funcs=reward_len, train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                    peft_config=peft.LoraConfig(r=4, lora_dropout=1.0), args=MeZOConfig(output_dir=str(tmp_path)))
    assert "--lora-dropout: got 1.0, accepted: a number >= 0 and < 1" in one_line(info)
    trainer = MeZOTrainer(model=make_tiny_causal_lm(tiny_tokenizer), processing_class=tiny_tokenizer,
                          reward_funcs=reward_len, train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                          peft_config=peft.LoraConfig(r=4, target_modules="all-linear", modules_to_save=["lm_head"]),
                          args=MeZOConfig(output_dir=str(tmp_path / "all"), max_steps=1, progress=False))
    trainable = {name for name, p in trainer.model.named_parameters() if p.requires_grad}
    import torch

    fresh = make_tiny_causal_lm(tiny_tokenizer)
    linear = {name.rsplit(".", 1)[-1] for name, m in fresh.named_modules() if isinstance(m, torch.nn.Linear)} - {"lm_head"}
    wrapped = {name.split(".")[-4] for name in trainable if ".lora_A." in name}
    assert wrapped == linear and len(wrapped) >= 4  # every linear layer but the output head, as peft's all-linear
    assert trainer.model.lm_head.weight.requires_grad  # modules_to_save: trained in full
    assert trainer.args.lora_target_modules == ["all-linear"] and trainer.args.lora_modules_to_save == ["lm_head"]
    with pytest.raises(ConfigError) as info:
        MeZOTrainer(model=3.14, reward_funcs=reward_len, args=MeZOConfig(output_dir=str(tmp_path)))
    assert "model: got a float" in one_line(info)


def test_the_run_records_what_it_was_given_the_trl_way(tmp_path, tiny_model_dir):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    trainer = MeZOTrainer(model=str(tiny_model_dir), reward_funcs=[reward_len],
                          train_dataset=str(data), args=MeZOConfig(output_dir=str(tmp_path / "run"), progress=False))
    args = trainer.args
    assert (args.model, args.task, args.reward) == (str(tiny_model_dir), str(data), [f"{__name__}:reward_len"])
    # a prompt task: the prompt tasks' defaults, from the data file given as train_dataset
    row = PROMPT_TASK_DEFAULTS[PROMPT_TASK_MODE]
    assert (args.peft, args.max_steps, args.per_device_train_batch_size) == (PROMPT_TASK_MODE, row["max_steps"], row["per_device_train_batch_size"])


def test_docs_rl_md_lists_every_grpo_option_with_no_meaning():
    import pathlib

    from mezo_rl.training.config import NO_MEANING_PREFIXES

    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "rl.md").read_text()
    missing = [k for k in NO_MEANING if f"`{k}`" not in text] + [p for p in NO_MEANING_PREFIXES if f"`{p}*`" not in text]
    assert not missing, f"docs/rl.md's table lacks {missing}"


@pytest.mark.slow  # trl is the benchmarks' extra (pip install 'mezo-rl[bench]'), not a test dependency
def test_a_grpo_config_object_is_refused_in_one_line_naming_mezo_config(tmp_path):
    trl = pytest.importorskip("trl")
    grpo = trl.GRPOConfig(output_dir=str(tmp_path), learning_rate=1e-5, use_cpu=True, bf16=False)
    with pytest.raises(ConfigError) as info:
        MeZOTrainer(model=NOT_A_MODEL, reward_funcs=reward_len, args=grpo)
    assert "args: got a GRPOConfig; accepted: a MeZOConfig" in one_line(info)


def test_a_code_task_of_prompts_gets_the_prompt_defaults_and_resumes(tmp_path, tiny_model_dir):
    """The kind of a task given as code is known only once it is built: the run's defaults follow it, on the
    command line too, so --resume compares like with like."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:12]))  # a step sees the 10 train rows
    code = tmp_path / "my_task.py"
    code.write_text(f"from mezo_rl.tasks import from_prompts\n\ndef build():\n    return from_prompts({str(data)!r})\n")
    reward = tmp_path / "my_reward.py"
    reward.write_text("def reward_len(completions, **kwargs):\n    return [-abs(20 - len(c)) for c in completions]\n")
    run = tmp_path / "run"
    argv = ["train", "--model", str(tiny_model_dir), "--task", f"{code}:build", "--reward", f"{reward}:reward_len",
            "--n-spsa", "1", "--max-completion-length", "8", "--autocast", "none", "--no-progress",
            "--output-dir", str(run)]
    assert main(argv + ["--max-steps", "1"]) == 0
    config = json.loads((run / "training_args.json").read_text())
    row = PROMPT_TASK_DEFAULTS[PROMPT_TASK_MODE]  # a prompt task's mode and row, though only the built task tells the kind
    assert (config["peft"], config["per_device_train_batch_size"], config["learning_rate"]) == (
        PROMPT_TASK_MODE, row["per_device_train_batch_size"], row["learning_rate"])
    assert main(argv + ["--max-steps", "2", "--resume"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 2


def test_eval_dataset_is_the_validation_split(tmp_path, tiny_tokenizer):
    train, held_out = Dataset.from_dict({"prompt": PROMPTS[:20]}), Dataset.from_dict({"prompt": PROMPTS[20:]})
    trainer = MeZOTrainer(model=make_tiny_causal_lm(tiny_tokenizer), processing_class=tiny_tokenizer,
                          reward_funcs=reward_len, train_dataset=train, eval_dataset=held_out,
                          args=MeZOConfig(output_dir=str(tmp_path), progress=False))
    assert sorted(ex.prompt for ex in trainer.splits["validation"]) == sorted(PROMPTS[20:])
    assert {ex.prompt for ex in trainer.splits["train"]} <= set(PROMPTS[:20])  # test is carved from train
    with pytest.raises(ConfigError) as info:
        MeZOTrainer(model=NOT_A_MODEL, reward_funcs=reward_len, eval_dataset=held_out, args=MeZOConfig(output_dir=str(tmp_path)))
    assert "eval_dataset needs a train_dataset" in one_line(info)
