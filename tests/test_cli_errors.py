"""Every mistake a user can make on the command line ends with one line, exit status 2, no traceback,
before any model or data is loaded, and with nothing written to the output directory.

Most cases run `main()` in-process (fast); a few run `python -m mezo_rl` to see the real stderr.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from mezo_rl.cli.main import main

TESTS = pathlib.Path(__file__).parent
USER_REWARD_FILE = TESTS / "user_rewards" / "my_file_rewards.py"


def run_cli(argv, capsys):
    """(exit status, stdout, stderr) of `mezo-rl ARGV` run in this process."""
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc, err, *culprits):
    assert rc == 2, err
    assert err.startswith("mezo-rl: error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for c in culprits:
        assert str(c) in err, (c, err)


@pytest.fixture()
def out(tmp_path):
    """An output directory that must never be created by a refused command."""
    path = tmp_path / "run"
    yield path
    assert not path.exists(), f"a refused command wrote {sorted(p.name for p in path.iterdir())}"


MISSING_MODEL = "/nonexistent/model-dir"


@pytest.mark.parametrize("argv, culprits", [
    (["--eps", "0"], ["--eps", "0"]),
    (["--learning-rate", "-1"], ["--learning-rate", "-1"]),
    (["--reward-scale", "minmax"], ["--reward-scale", "minmax", "std"]),
    (["--max-completion-length", "0"], ["--max-completion-length", "0"]),
    (["--do-sample", "--temperature", "0"], ["--temperature", "--do-sample"]),
    (["--max-steps", "-3"], ["--max-steps", "-3"]),
    (["--peft", "adapters"], ["--peft", "adapters", "lora"]),
    (["--reward", "accuracy", "--reward-weights", "1,2"], ["--reward-weights"]),
    (["--stepz", "3"], ["--stepz"]),
    (["--max-steps", "many"], ["--max-steps", "many"]),
    (["--hessian-smooth", "1"], ["--hessian-smooth", "1"]),
    (["--peft", "lora", "--lora-dropout", "1"], ["--lora-dropout: got 1.0", "< 1"]),
    (["--lora-dropout", "0.05"], ["--lora-dropout 0.05", "--peft norm has no LoRA adapter"]),
    (["--peft", "full", "--hessian-smooth", "1e-3", "--rank", "2"], ["--hessian-smooth", "--rank 2", "--rank 1"]),
    (["--peft", "lora", "--hessian-smooth", "1e-3"], ["--hessian-smooth", "--noise gaussian", "--noise lowrank"]),
])
def test_bad_options_are_refused_before_anything_loads(argv, culprits, out, capsys):
    # the model and the data do not exist: the option is refused first, so neither is looked at
    rc, _, err = run_cli(["train", "--model", MISSING_MODEL, "--data-dir", "/nonexistent/data",
                          "--output-dir", out, *argv], capsys)
    assert_one_line_error(rc, err, *culprits)


@pytest.mark.parametrize("argv, culprits", [
    (["--task", "sst3"], ["unknown task 'sst3'", "sst2"]),
    (["--reward", "acuracy"], ["acuracy", "accuracy"]),
    (["--reward", "no_such_module_xyz:fn"], ["no_such_module_xyz"]),
    (["--reward", f"{USER_REWARD_FILE}:no_such_function"], ["no_such_function"]),
    (["--model", MISSING_MODEL], [MISSING_MODEL]),
    (["--model", "no-such-org/no-such-model-xyz"], ["no-such-org/no-such-model-xyz"]),
    (["--data-dir", "/nonexistent/data"], ["/nonexistent/data"]),
    (["--task", "missing.jsonl", "--template", "{text}", "--target-column", "y"], ["missing.jsonl"]),
    (["--template", "{text} It was"], ["--template"]),  # a template for a built-in task
    (["--task", "reviews.jsonl", "--label-column", "label"], ["--template"]),
    (["--metric-for-best-model", "f1"], ["--metric-for-best-model", "'f1'", "accuracy"]),
])
def test_unknown_names_and_missing_files_are_refused(argv, culprits, out, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli(["train", "--output-dir", out, *argv], capsys)
    assert_one_line_error(rc, err, *culprits)


@pytest.fixture()
def unloadable_models(tmp_path):
    """Model directories holding only a config.json: found by the checks, but loading one would fail."""
    made = {}
    for name, arch in (("causal", "LlamaForCausalLM"), ("masked", "BertForMaskedLM")):
        made[name] = tmp_path / f"{name}-config-only"
        made[name].mkdir()
        (made[name] / "config.json").write_text(json.dumps({"architectures": [arch]}))
    return made


@pytest.mark.parametrize("argv, culprits", [
    (["--task", "squad", "--reward", "accuracy"], ["reward 'accuracy'", "classification/multiple_choice", "'generation'"]),
    (["--task", "copa", "--reward", "squad_f1"], ["reward(s) ['squad_f1'] need generated completions", "masked"]),
    (["--reward", "cross_entropy", "--reward-weights", "nan"], ["weight nan", "'cross_entropy'"]),
    (["--reward", "cross_entropy", "--reward", "accuracy", "--reward-weights", "0,0"], ["all weights are 0"]),
    (["--reward", "accuracy", "--reward", "accuracy"], ["['accuracy'] given more than once"]),
])
def test_rewards_that_do_not_fit_the_task_or_the_model_are_refused_before_any_data_or_weights(
        argv, culprits, unloadable_models, out, tmp_path, capsys):
    # the data directory is empty and the model has no weights: reading either would fail differently
    (tmp_path / "no-data").mkdir()
    model = unloadable_models["masked" if "squad_f1" in argv else "causal"]
    rc, _, err = run_cli(["train", "--model", model, "--data-dir", tmp_path / "no-data", "--output-dir", out, *argv],
                         capsys)
    assert_one_line_error(rc, err, *culprits)


def test_a_reward_needing_a_column_the_task_lacks_is_refused_before_the_model_loads(unloadable_models, out,
                                                                                   data_dir, capsys):
    # the columns are known once the examples are read (before the model: this one has no weights)
    rc, _, err = run_cli(["train", "--model", unloadable_models["causal"], "--data-dir", data_dir,
                          "--task", "sst2", "--reward", "squad_f1", "--output-dir", out], capsys)
    assert_one_line_error(rc, err, "reward 'squad_f1' needs column(s) ['answers']", "['label', 'sentence']")


def test_unparsable_yaml_and_a_bad_config_value(tmp_path, out, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [1, 2\nlr: 0.1\n")
    rc, _, err = run_cli(["train", "--config", bad, "--output-dir", out], capsys)
    assert_one_line_error(rc, err, str(bad), "YAML")
    cfg = tmp_path / "eps.yaml"
    cfg.write_text("eps: 0\n")
    rc, _, err = run_cli(["train", "--config", cfg, "--output-dir", out], capsys)
    assert_one_line_error(rc, err, "eps", "0")


def test_output_dir_that_is_a_file(tmp_path, capsys):
    path = tmp_path / "results.txt"
    path.write_text("keep me")
    rc, _, err = run_cli(["train", "--output-dir", path], capsys)
    assert_one_line_error(rc, err, str(path), "not a directory")
    assert path.read_text() == "keep me"


def test_resume_without_a_checkpoint(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = run_cli(["train", "--output-dir", empty, "--resume"], capsys)
    assert_one_line_error(rc, err, "--resume", "checkpoint", str(empty))
    assert list(empty.iterdir()) == []
    rc, _, err = run_cli(["train", "--output-dir", tmp_path / "never", "--resume"], capsys)
    assert_one_line_error(rc, err, "--resume", str(tmp_path / "never"))
    assert not (tmp_path / "never").exists()


def test_export_and_report_of_a_directory_that_is_not_a_run(tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    rc, _, err = run_cli(["export", "--run-dir", tmp_path / "notes", "--output", tmp_path / "exported"], capsys)
    assert_one_line_error(rc, err, str(tmp_path / "notes"), "not a mezo-rl run")
    assert not (tmp_path / "exported").exists()
    rc, _, err = run_cli(["report", tmp_path / "notes"], capsys)
    assert_one_line_error(rc, err, str(tmp_path / "notes"), "not a mezo-rl run")
    rc, _, err = run_cli(["eval", "--run-dir", tmp_path / "nope"], capsys)
    assert_one_line_error(rc, err, str(tmp_path / "nope"))


def test_eval_checks_its_options_too(capsys):
    rc, _, err = run_cli(["eval", "--model", MISSING_MODEL, "--max-completion-length", "0"], capsys)
    assert_one_line_error(rc, err, "--max-completion-length", "0")
    rc, _, err = run_cli(["eval", "--model", MISSING_MODEL, "--n", "-2"], capsys)
    assert_one_line_error(rc, err, "--n", "-2")


def test_a_second_run_on_the_same_output_directory_is_refused(tmp_path, tiny_model_dir, data_dir, capsys):
    from mezo_rl.training.runguard import RunLock

    busy = tmp_path / "busy"
    with RunLock(busy):
        before = sorted(p.name for p in busy.iterdir())
        rc, _, err = run_cli(["train", "--output-dir", busy, "--model", tiny_model_dir, "--data-dir", data_dir,
                              "--max-steps", "1", "--no-progress"], capsys)
        assert_one_line_error(rc, err, str(busy), "in use by another mezo-rl run", f"pid {os.getpid()}")
        assert sorted(p.name for p in busy.iterdir()) == before  # nothing written beside the holder's lock


def test_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    rc, _, err = run_cli(["--debug", "train", "--eps", "0", "--output-dir", tmp_path / "o"], capsys)
    lines = err.rstrip().splitlines()
    assert rc == 2 and lines[0] == "Traceback (most recent call last):"
    assert lines[-2].startswith("mezo_rl.errors.ConfigError: --eps") and lines[-1].startswith("mezo-rl: error: --eps")
    monkeypatch.setenv("MEZO_RL_DEBUG", "1")
    rc, _, err = run_cli(["train", "--eps", "0", "--output-dir", tmp_path / "o"], capsys)
    assert rc == 2 and "Traceback" in err


def test_the_real_command_prints_one_line(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("MEZO_RL_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "mezo_rl", "train", "--task", "sst3", "--output-dir", tmp_path / "o"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert_one_line_error(proc.returncode, proc.stderr, "unknown task 'sst3'")
    assert not (tmp_path / "o").exists()


def test_a_fresh_run_into_an_unfinished_run_is_refused_and_the_checkpoint_kept(tmp_path, capsys, tiny_tokenizer):
    from conftest import make_tiny_causal_lm
    from mezo_rl.cli import checks
    from mezo_rl.model.lm import LanguageModel
    from mezo_rl.training.arguments import MeZOConfig
    from test_trainer import make_args, train

    run = tmp_path / "run"
    train(make_args(tmp_path, "run", max_steps=3, eval_steps=3),     # a finished run: step 3 of 3
          lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer))
    config = json.loads((run / "training_args.json").read_text())
    checks.check_output_dir(MeZOConfig(output_dir=str(run)))   # finished: starting over loses nothing
    config["max_steps"] = 6                                   # now a 6-step run stopped at its step-3 checkpoint
    (run / "training_args.json").write_text(json.dumps(config))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    rc, _, err = run_cli(["train", "--output-dir", run], capsys)
    assert_one_line_error(rc, err, str(run), "step 3 of 6", "--resume", "--overwrite-output-dir")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    checks.check_output_dir(MeZOConfig(output_dir=str(run), overwrite_output_dir=True))


def test_a_prompt_file_without_a_reward_is_refused_before_anything_loads(tmp_path, out, capsys):
    """A registered task brings its reward (its metric); a file of prompts has none, so --reward is asked for."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Continue this movie review: a gem"}) + "\n")
    rc, _, err = run_cli(["train", "--model", MISSING_MODEL, "--task", prompts, "--output-dir", out], capsys)
    assert_one_line_error(rc, err, "--reward", "prompts only", "mezo-rl rewards")
