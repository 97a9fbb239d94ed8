"""The `mezo-rl` command: option parsing (dataclasses + --config) and the subcommands end to end.

End-to-end runs use a tiny causal LM saved with save_pretrained and passed as `--model DIR`, on
hand-made SST-2-style data written in the GLUE layout (no real data or model needed).
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mezo_rl.cli.main import build_parser, main, parse_into
from mezo_rl.training.arguments import MeZOConfig


def parse_train(argv, config=None):
    ns = build_parser().parse_args(["train", *argv])
    return parse_into(MeZOConfig, ns, config)


def test_train_spellings_from_the_issue():
    args = parse_train([
        "--model", "m", "--task", "rte", "--reward", "accuracy", "--reward", "cross_entropy",
        "--reward-weights", "1,0.5", "--max-steps", "7", "--per-device-train-batch-size", "3", "--learning-rate", "2e-6", "--eps", "0.01",
        "--eval-steps", "2", "--seed", "5", "--output-dir", "o", "--data-dir", "d", "--resume",
    ])
    assert (args.model, args.task, args.max_steps, args.per_device_train_batch_size, args.eval_steps, args.seed) == \
        ("m", "rte", 7, 3, 2, 5)
    assert args.reward == ["accuracy", "cross_entropy"] and args.reward_weights == [1.0, 0.5]
    assert (args.learning_rate, args.eps, args.output_dir, args.data_dir, args.resume) == (2e-6, 0.01, "o", "d", True)


def test_defaults_underscores_and_negated_flags():
    args = parse_train(["--per_device_train_batch_size", "5", "--no-progress"])
    default = MeZOConfig()
    assert args.per_device_train_batch_size == 5 and args.progress is False
    assert args.reward == default.reward and args.max_steps == default.max_steps


def test_config_file_then_command_line_wins(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_steps: 11\nper-device-train-batch-size: 4\nreward: [cross_entropy]\nlearning_rate: 1.0e-7\n")
    ns = build_parser().parse_args(["train", "--config", str(cfg), "--max-steps", "3"])
    from mezo_rl.cli.main import load_config_file

    args = parse_into(MeZOConfig, ns, load_config_file(str(cfg)))
    assert (args.max_steps, args.per_device_train_batch_size, args.reward, args.learning_rate) == (3, 4, ["cross_entropy"], 1e-7)


def test_bad_options_name_the_problem(tmp_path):
    from mezo_rl.cli.main import UsageError, load_config_file
    from mezo_rl.errors import ConfigError

    with pytest.raises(ConfigError, match="--reward-weights"):
        parse_train(["--reward", "accuracy", "--reward-weights", "1,2"])
    with pytest.raises(UsageError, match="invalid choice: 'adapters'"):
        build_parser().parse_args(["train", "--peft", "adapters"])
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("stepz: 3\n")
    ns = build_parser().parse_args(["train"])
    with pytest.raises(ConfigError, match="unknown option.*stepz"):
        parse_into(MeZOConfig, ns, load_config_file(str(cfg)))


def test_every_training_argument_is_an_option():
    import dataclasses

    help_text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    for f in dataclasses.fields(MeZOConfig):
        flag = f.name.replace('_', '-')
        assert f"--{flag} " in help_text or f"--[no-]{flag} " in help_text


def test_train_help_is_one_line_per_option_with_one_default_each():
    import dataclasses

    help_text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    lines = help_text.splitlines()
    assert len(lines) <= 120
    options = [line for line in lines if line.lstrip().startswith("--")]
    assert len(options) == len(dataclasses.fields(MeZOConfig)) + 2  # + --config, --dry-run
    assert all(line.count("(default") <= 1 for line in options), [line for line in options if line.count("(default") > 1]


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


def test_compare_export_and_eval_end_to_end(tmp_path, tiny_model_dir, data_dir, capsys):
    out = tmp_path / "cmp"
    common = ["--model", str(tiny_model_dir), "--task", "sst2", "--data-dir", str(data_dir),
              "--max-steps", "2", "--eval-steps", "1", "--per-device-train-batch-size", "4", "--num-train", "16", "--num-eval", "8",
              "--num-test", "8", "--learning-rate", "1e-3", "--eps", "1e-2", "--autocast", "none", "--no-progress"]
    assert main(["compare", *common, "--objective", "cross_entropy", "--objective", "accuracy",
                 "--output-dir", str(out)]) == 0
    table = (out / "comparison.md").read_text()
    assert "| cross_entropy | cross_entropy | 2 |" in table and "| accuracy | accuracy | 2 |" in table
    for png in ("validation_vs_steps.png", "validation_vs_time.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for run in ("cross_entropy", "accuracy"):
        summary = json.loads((out / run / "summary.json").read_text())
        assert json.loads((out / run / "training_args.json").read_text())["reward"] == [run]
        assert set(summary["initial_validation"]) >= {"accuracy"}
    # same data and seed: both runs start from the same validation accuracy
    starts = {json.loads((out / r / "summary.json").read_text())["initial_validation"]["accuracy"]
              for r in ("cross_entropy", "accuracy")}
    assert len(starts) == 1

    # the report alone, from finished runs
    assert main(["compare", "--runs", str(out / "cross_entropy"), str(out / "accuracy"),
                 "--report-dir", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "comparison.md").read_text() == table

    # export the final weights and evaluate them with `eval --model DIR`; `eval --run-dir` agrees
    run = out / "cross_entropy"
    assert main(["export", "--run-dir", str(run), "--step", "final", "--output", str(tmp_path / "exported")]) == 0
    assert (tmp_path / "exported" / "config.json").is_file()
    capsys.readouterr()
    base = ["--task", "sst2", "--split", "validation", "--n", "8", "--data-dir", str(data_dir)]
    assert main(["eval", "--model", str(tmp_path / "exported"), *base]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert main(["eval", "--run-dir", str(run), "--step", "final", *base]) == 0
    replayed = json.loads(capsys.readouterr().out)
    assert exported["metrics"] == replayed["metrics"] and replayed["step"] == 2


def test_train_command_writes_a_run(tmp_path, tiny_model_dir, data_dir, capsys):
    out = tmp_path / "run"
    cfg = tmp_path / "train.yaml"
    cfg.write_text(f"model: {tiny_model_dir}\ntask: sst2\nreward: [cross_entropy]\nmax_steps: 2\nper_device_train_batch_size: 4\n"
                   f"num_train: 16\nnum_eval: 8\nnum_test: 8\nautocast: none\nprogress: false\nlearning_rate: 1.0e-3\n")
    assert main(["train", "--config", str(cfg), "--data-dir", str(data_dir), "--output-dir", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    summary = json.loads((out / "summary.json").read_text())
    assert lines[-2] == (f"results in {out}: summary.json, metrics.jsonl, curves.png, checkpoint/ "
                         f"({summary['wall_time_s']:.0f} s, peak memory {summary['peak_rss_mb']:.0f} MB)")
    v0, v1 = summary["initial_validation"]["accuracy"], summary["validation"]["accuracy"]
    t0, t1 = summary["initial_test"]["accuracy"], summary["test"]["accuracy"]
    sv, st = summary["validation"]["accuracy/se"], summary["test"]["accuracy/se"]
    assert lines[-1] == (f"validation accuracy {v0:.3f} -> {v1:.3f} (SE {sv:.3f}) (n=8), test accuracy {t0:.3f} -> "
                         f"{t1:.3f} (SE {st:.3f}) (n=8), best step {summary['best_step']} of 2")
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert not (out / ".lock").exists()
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    assert json.loads((out / "training_args.json").read_text())["model"] == str(tiny_model_dir)


def test_baseline_command(tmp_path, tiny_model_dir, data_dir, capsys):
    assert main(["baseline", "--method", "lp", "--model", str(tiny_model_dir), "--task", "sst2",
                 "--data-dir", str(data_dir), "--num-train", "16", "--num-test", "8",
                 "--output-dir", str(tmp_path)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["method"] == "lp" and 0.0 <= result["test"]["accuracy"] <= 1.0
    assert json.loads((tmp_path / "baseline_lp.json").read_text()) == result


def test_docs_cli_md_is_generated_from_the_parser():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "docs" / "generate_cli.py"
    spec = importlib.util.spec_from_file_location("generate_cli", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0, "run: python docs/generate_cli.py"
