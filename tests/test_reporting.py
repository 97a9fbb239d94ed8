"""report_to: trackio (local) and wandb (offline) receive TRL's keys; each evaluation's completions as a parquet
table; a missing integration is one line naming the extra to install."""
from __future__ import annotations

import glob
import json
import os
import pathlib
import struct
import subprocess
import sys

import pytest

from mezo_rl.errors import ConfigError, UserError
from mezo_rl.training import reporting
from mezo_rl.training.arguments import MeZOConfig

TESTS = pathlib.Path(__file__).resolve().parent
REWARD = f"{TESTS / 'user_rewards' / 'my_file_rewards.py'}:word_count"
PROMPTS = [f"the movie was good and the acting was bad . {i}" for i in range(30)]
TRL_TRAIN_KEYS = {"train/loss", "train/reward", "train/reward_std", "train/frac_reward_zero_std",
                  "train/completions/mean_length", "train/rewards/word_count/mean", "train/rewards/word_count/std",
                  "train/learning_rate"}
TRL_EVAL_KEYS = {"eval/reward", "eval/rewards/word_count/mean"}


def prompt_run(tmp_path, tiny_model_dir, *extra) -> list[str]:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return ["train", "--model", str(tiny_model_dir), "--task", str(data), "--reward", REWARD, "--max-steps", "2",
            "--per-device-train-batch-size", "4", "--n-spsa", "1", "--eval-steps", "2", "--max-completion-length", "8",
            "--autocast", "none", "--no-progress", "--output-dir", str(tmp_path / "run"), *extra]


@pytest.mark.slow  # a process of its own, and a training run
def test_trackio_receives_trls_keys_locally(tmp_path, tiny_model_dir):
    """trackio reads TRACKIO_DIR when it is imported, so the run goes in a process of its own."""
    script = ("import json, sys\nfrom mezo_rl.cli.main import main\n"
              "assert main(json.loads(sys.argv[1])) == 0\n"
              "from trackio.sqlite_storage import SQLiteStorage\n"
              "print(json.dumps(SQLiteStorage.get_logs('mezo-rl', 'run')))\n")
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script, json.dumps(prompt_run(tmp_path, tiny_model_dir, "--report-to", "trackio"))],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    logs = json.loads(done.stdout.strip().splitlines()[-1])
    keys = {k for row in logs for k in row}
    assert TRL_TRAIN_KEYS | TRL_EVAL_KEYS <= keys
    assert sorted(row["step"] for row in logs if "train/loss" in row) == [1, 2]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step2 = next(r for r in metrics if r.get("step") == 2 and "split" not in r)
    logged = next(row for row in logs if row.get("step") == 2 and "train/reward" in row)
    assert logged["train/reward"] == pytest.approx(step2["reward"], rel=1e-12)  # the value metrics.jsonl holds


def wandb_history(run_dir) -> list[dict]:
    """The history rows of an offline wandb run, read from its .wandb file (a LevelDB-style log of protobuf
    records: 7-byte header, 32 KiB blocks, records of crc32 (4) + length (2) + type (1) + data)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    data, pos, rows, buf = pathlib.Path(path).read_bytes(), 7, [], b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            buf = b""
            if rec.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
    return rows


@pytest.mark.slow  # wandb starts its service process
def test_offline_wandb_receives_trls_keys(tmp_path, tiny_model_dir, monkeypatch):
    pytest.importorskip("wandb")
    from mezo_rl.cli.main import main

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    assert main(prompt_run(tmp_path, tiny_model_dir, "--report-to", "wandb")) == 0
    rows = wandb_history(tmp_path / "run")
    assert TRL_TRAIN_KEYS | TRL_EVAL_KEYS <= {k for row in rows for k in row}


def test_each_evaluation_writes_its_completions_as_a_parquet_table(tmp_path, tiny_model_dir):
    pq = pytest.importorskip("pyarrow.parquet")
    from mezo_rl.cli.main import main

    assert main(prompt_run(tmp_path, tiny_model_dir, "--log-completions", "3")) == 0
    table = pq.read_table(reporting.completions_file(tmp_path / "run", "validation", 2)).to_pylist()
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples" / "validation-step000002.jsonl").read_text().splitlines()]
    assert len(table) == 3 and {"step", "prompt", "completion", REWARD} <= set(table[0])
    for row, sample in zip(table, samples):  # the same completions as the JSONL samples, and their rewards
        assert (row["step"], row["prompt"], row["completion"]) == (2, sample["prompt"], sample["completion"])
        assert row[REWARD] == len(row["completion"].split())


def test_report_to_names_are_checked_and_a_missing_package_names_its_extra(monkeypatch, tiny_model_dir, tmp_path, capsys):
    # trackio and tensorboard come with the [all] extra; wandb is an extra of its own (its test is slow)
    assert reporting.check_report_to("none") == [] and reporting.check_report_to(["trackio", "tensorboard"]) == ["trackio", "tensorboard"]
    with pytest.raises(ConfigError, match="--report-to: got 'mlflow', accepted: none, all, tensorboard, trackio, wandb"):
        MeZOConfig(report_to="mlflow")
    with pytest.raises(ConfigError, match="'none' cannot be combined"):
        MeZOConfig(report_to=["none", "wandb"])
    # as if wandb were not installed: the check looks for a module that does not exist
    monkeypatch.setitem(reporting.INTEGRATIONS, "wandb", ("mezo_rl_no_such_wandb", "wandb"))
    with pytest.raises(UserError, match=r"--report-to wandb: the mezo_rl_no_such_wandb package is not installed; "
                                        r"install it with pip install 'mezo-rl\[wandb\]'"):
        MeZOConfig(report_to="wandb")
    from mezo_rl.cli.main import main

    assert main(prompt_run(tmp_path, tiny_model_dir, "--report-to", "wandb")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mezo-rl[wandb]" in err and not (tmp_path / "run").exists()


def test_train_logs_rename_the_step_record_to_trls_keys():
    record = {"step": 3, "loss": -0.5, "lr": 0.1, "reward/pkg.mod:reward_len": 0.5, "reward/pkg.mod:reward_len/std": 0.2,
              "reward": 0.5, "reward_std": 0.1, "frac_reward_zero_std": 0.25, "completions/mean_length": 7.0,
              "kl": 0.01, "skipped": False, "seconds": 1.5, "loss_plus": None}
    assert reporting.train_logs(record) == {
        "loss": -0.5, "learning_rate": 0.1, "rewards/reward_len/mean": 0.5, "rewards/reward_len/std": 0.2,
        "reward": 0.5, "reward_std": 0.1, "frac_reward_zero_std": 0.25, "completions/mean_length": 7.0, "kl": 0.01,
        "step_time": 1.5}
    evaluation = {"step": 3, "split": "validation", "seconds": 2.0,
                  "metrics": {"pkg.mod:reward_len": 0.4, "pkg.mod:reward_len/se": 0.1, "objective": 0.4, "kl": 0.02, "n": 8}}
    assert reporting.eval_logs(evaluation, ["pkg.mod:reward_len"]) == {
        "eval_rewards/reward_len/mean": 0.4, "eval_rewards/reward_len/se": 0.1, "eval_reward": 0.4, "eval_kl": 0.02,
        "eval_n": 8.0, "eval_runtime": 2.0}
