"""The `mezo-rl` command: option parsing (dataclasses + --config) and the subcommands end to end.

End-to-end runs use a tiny causal LM saved with save_pretrained and passed as `--model DIR`, on
hand-made SST-2-style data written in the GLUE layout (no real data or model needed).
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mezo_rl.cli import build_parser, main, parse_into
from mezo_rl.trainer import TrainingArguments


def parse_train(argv, config=None):
    ns = build_parser().parse_args(["train", *argv])
    return parse_into(TrainingArguments, ns, config)


def test_train_spellings_from_the_issue():
    args = parse_train([
        "--model", "m", "--task", "rte", "--reward", "accuracy", "--reward", "cross_entropy",
        "--reward-weights", "1,0.5", "--steps", "7", "--batch-size", "3", "--lr", "2e-6", "--eps", "0.01",
        "--eval-steps", "2", "--seed", "5", "--output-dir", "o", "--data-dir", "d", "--resume",
    ])
    assert (args.model, args.task, args.steps, args.batch_size, args.eval_steps, args.seed) == ("m", "rte", 7, 3, 2, 5)
    assert args.reward == ["accuracy", "cross_entropy"] and args.reward_weights == [1.0, 0.5]
    assert (args.lr, args.eps, args.output_dir, args.data_dir, args.resume) == (2e-6, 0.01, "o", "d", True)


def test_defaults_underscores_and_negated_flags():
    args = parse_train(["--batch_size", "5", "--no-progress"])
    default = TrainingArguments()
    assert args.batch_size == 5 and args.progress is False
    assert args.reward == default.reward and args.steps == default.steps


def test_config_file_then_command_line_wins(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("steps: 11\nbatch-size: 4\nreward: [cross_entropy]\nlr: 1.0e-7\n")
    ns = build_parser().parse_args(["train", "--config", str(cfg), "--steps", "3"])
    from mezo_rl.cli import load_config_file

    args = parse_into(TrainingArguments, ns, load_config_file(str(cfg)))
    assert (args.steps, args.batch_size, args.reward, args.lr) == (3, 4, ["cross_entropy"], 1e-7)


def test_bad_options_name_the_problem(tmp_path, capsys):
    with pytest.raises(SystemExit, match="reward_weights"):
        parse_train(["--reward", "accuracy", "--reward-weights", "1,2"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--peft", "adapters"])
    assert "invalid choice: 'adapters'" in capsys.readouterr().err
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("stepz: 3\n")
    ns = build_parser().parse_args(["train"])
    from mezo_rl.cli import load_config_file

    with pytest.raises(SystemExit, match="unknown option.*stepz"):
        parse_into(TrainingArguments, ns, load_config_file(str(cfg)))


def test_every_training_argument_is_an_option():
    import dataclasses

    help_text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    for f in dataclasses.fields(TrainingArguments):
        assert f"--{f.name.replace('_', '-')}" in help_text


def test_tasks_and_rewards_list(capsys):
    assert main(["rewards"]) == 0
    out = capsys.readouterr().out
    assert "accuracy" in out and "cross_entropy" in out
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert "sst2" in out


def test_python_dash_m_entry_point():
    res = subprocess.run([sys.executable, "-m", "mezo_rl", "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    for cmd in ("train", "eval", "export", "compare", "baseline", "tasks", "rewards"):
        assert cmd in res.stdout
