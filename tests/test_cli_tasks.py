"""The user's own data and code from the command line: `--task FILE` with template and columns,
`--task module:function`, the `mezo_rl.tasks` entry point, a Hugging Face dataset directory; `eval`,
`compare` and `report` take the same task options; mid-run failures leave the checkpoint intact."""
from __future__ import annotations

import json
import pathlib

import pytest

from mezo_rl.cli.main import main
from test_cli_errors import assert_one_line_error, run_cli

TESTS = pathlib.Path(__file__).parent
USER_TASKS = TESTS / "user_tasks"
WORDS = {1: ["good", "great", "fun", "warm"], 0: ["bad", "terrible", "dull", "cold"]}
FAST = ["--max-steps", "2", "--eval-steps", "1", "--per-device-train-batch-size", "4", "--num-train", "16", "--num-eval", "4",
        "--num-test", "4", "--learning-rate", "1e-3", "--eps", "1e-2", "--autocast", "none", "--no-progress"]


@pytest.fixture()
def reviews(tmp_path):
    """40 labelled reviews (label as text), JSONL."""
    rows = [{"review": f"the movie was {WORDS[i % 2][i % 4]} .", "sentiment": ["negative", "positive"][i % 2]}
            for i in range(40)]
    path = tmp_path / "reviews.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def file_options(path):
    return ["--task", str(path), "--template", "{review} It was", "--label-column", "sentiment",
            "--candidates", "negative,positive"]


def test_train_on_a_jsonl_file_given_by_path_then_eval_and_report_it(tmp_path, tiny_model_dir, reviews, capsys):
    out = tmp_path / "run"
    rc, stdout, err = run_cli(["train", "--model", tiny_model_dir, *file_options(reviews), "--reward", "cross_entropy",
                               *FAST, "--output-dir", out], capsys)
    assert rc == 0, err
    config, summary = (json.loads((out / f).read_text()) for f in ("training_args.json", "summary.json"))
    assert config["task"] == str(reviews) and config["candidates"] == ["negative", "positive"]
    assert summary["steps"] == 2 and summary["validation"]["n"] == 4 and summary["test"]["n"] == 4
    assert stdout.splitlines()[-1].startswith("validation accuracy ") and "(n=4)" in stdout.splitlines()[-1]

    # eval --run-dir reads the task and its options from the run; eval --model takes them on the command line
    rc, stdout, err = run_cli(["eval", "--run-dir", out, "--step", "final", "--split", "test"], capsys)
    assert rc == 0, err
    replayed = json.loads(stdout)
    assert replayed["task"] == str(reviews) and replayed["n"] == 4  # the 4 carved test rows (10% of 40)
    rc, stdout, err = run_cli(["eval", "--model", tiny_model_dir, *file_options(reviews), "--split", "test"], capsys)
    assert rc == 0, err
    assert json.loads(stdout)["metrics"]["accuracy"] == summary["initial_test"]["accuracy"]  # the untrained model

    rc, stdout, err = run_cli(["report", out], capsys)
    assert rc == 0, err
    assert stdout.splitlines()[0] == f"run {out}: task {reviews}, model {tiny_model_dir}, objective cross_entropy"
    assert "best step" in stdout and (out / "curves.png").is_file()


def test_train_on_a_task_given_as_module_function_and_as_an_entry_point(tmp_path, tiny_model_dir, capsys, monkeypatch):
    rc, _, err = run_cli(["train", "--model", tiny_model_dir, "--task", f"{USER_TASKS / 'mezo_user_tasks.py'}:arithmetic",
                          "--reward", "cross_entropy", *FAST, "--output-dir", tmp_path / "by-path"], capsys)
    assert rc == 0, err
    summary = json.loads((tmp_path / "by-path" / "summary.json").read_text())
    assert summary["validation"]["n"] == 4 and summary["steps"] == 2

    monkeypatch.syspath_prepend(str(USER_TASKS))  # as if `pip install`ed: importable, with its entry point
    rc, stdout, err = run_cli(["eval", "--model", tiny_model_dir, "--task", "user_arithmetic", "--n", "6"], capsys)
    assert rc == 0, err
    assert json.loads(stdout)["task"] == "user_arithmetic" and json.loads(stdout)["n"] == 6
    rc, stdout, err = run_cli(["eval", "--model", tiny_model_dir, "--task", "mezo_user_tasks:arithmetic", "--n", "6"], capsys)
    assert rc == 0, err
    rc, stdout, _ = run_cli(["tasks"], capsys)
    assert "user_arithmetic" in stdout


def test_a_hugging_face_dataset_directory_with_the_same_options(tmp_path, tiny_model_dir, capsys, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    rows = [{"review": f"the movie was {WORDS[i % 2][i % 4]} .", "label": i % 2} for i in range(30)]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:20]),
                          "test": datasets.Dataset.from_list(rows[20:])}).save_to_disk(tmp_path / "ds")
    rc, stdout, err = run_cli(["eval", "--model", tiny_model_dir, "--task", tmp_path / "ds", "--template", "{review} It was",
                               "--label-column", "label", "--candidates", "bad,good", "--split", "test"], capsys)
    assert rc == 0, err
    assert json.loads(stdout)["n"] == 10
    rc, stdout, err = run_cli(["baseline", "--method", "zero-shot", "--model", tiny_model_dir, "--task", tmp_path / "ds",
                               "--template", "{review} It was", "--label-column", "label", "--candidates", "bad,good"],
                              capsys)
    assert rc == 0, err
    assert json.loads(stdout)["test"]["n"] == 10
    rc, _, err = run_cli(["eval", "--model", tiny_model_dir, "--task", tmp_path / "ds", "--template", "{text} It was",
                          "--label-column", "label", "--candidates", "bad,good"], capsys)
    assert_one_line_error(rc, err, "missing column(s) ['text']", "the data has columns ['label', 'review']")


def test_compare_takes_the_task_options(tmp_path, tiny_model_dir, reviews, capsys):
    rc, stdout, err = run_cli(["compare", "--model", tiny_model_dir, *file_options(reviews), *FAST, "--max-steps", "1",
                               "--objective", "cross_entropy", "--objective", "accuracy", "--output-dir", tmp_path / "cmp"],
                              capsys)
    assert rc == 0, err
    for run in ("cross_entropy", "accuracy"):
        assert json.loads((tmp_path / "cmp" / run / "training_args.json").read_text())["task"] == str(reviews)
    assert "| cross_entropy | cross_entropy | 1 |" in (tmp_path / "cmp" / "comparison.md").read_text()


@pytest.mark.parametrize("reward, culprit", [
    ("not_a_number", r"returned nan for example 1 (prompt "),
    ("one_short", "returned 3 values for a batch of 4"),
])
def test_a_reward_failing_mid_run_names_itself_and_leaves_the_checkpoint(reward, culprit, tmp_path, tiny_model_dir,
                                                                          data_dir, capsys):
    out = tmp_path / "run"
    ref = f"{TESTS / 'user_rewards' / 'bad_rewards.py'}:{reward}"
    rc, _, err = run_cli(["train", "--model", tiny_model_dir, "--task", "sst2", "--data-dir", data_dir,
                          "--reward", "cross_entropy", "--reward", ref, "--reward-weights", "1,0", *FAST,
                          "--output-dir", out], capsys)
    assert_one_line_error(rc, err, f"reward '{ref}'", culprit)
    state = json.loads((out / "checkpoint" / "trainer_state.json").read_text())
    assert state["global_step"] == 0 and state["stateful_callbacks"]["MeZOTrainer"]["initial_validation"] is not None  # the last checkpoint, intact
    assert not (out / "summary.json").exists() and not (out / ".lock").exists()


def test_a_user_task_that_raises_names_the_task_and_split(tmp_path, tiny_model_dir, capsys):
    ref = f"{USER_TASKS / 'mezo_user_tasks.py'}:broken"
    rc, _, err = run_cli(["train", "--model", tiny_model_dir, "--task", ref, *FAST, "--output-dir", tmp_path / "run"],
                         capsys)
    assert_one_line_error(rc, err, f"task '{ref}' raised KeyError: 'text' while reading its 'train' examples")
    assert not (tmp_path / "run").exists()  # the run directory the lock made is removed again
