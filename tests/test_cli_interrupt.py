"""Ctrl-C in the middle of `mezo-rl train`: the weights are restored, a checkpoint is written at the last
completed step, the command to resume is printed, and the resumed run ends bit-identical to an
uninterrupted one."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import torch

from mezo_rl.cli.main import main

TESTS = pathlib.Path(__file__).parent
PAUSE = TESTS / "user_rewards" / "slow_rewards.py"


def step_records(run_dir: pathlib.Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines[:-1] + ([lines[-1]] if lines and lines[-1].endswith("}") else [])
            if line.strip() and "split" not in line]


def test_sigint_checkpoints_and_the_resumed_run_is_bit_identical(tmp_path, tiny_model_dir, shared_data_dir, capsys):
    # a weight-0 reward that sleeps 20 ms per call makes a step last long enough to be interrupted inside it
    common = ["--model", str(tiny_model_dir), "--task", "sst2", "--data-dir", str(shared_data_dir),
              "--reward", "cross_entropy", "--reward", f"{PAUSE}:pause", "--reward-weights", "1,0",
              "--steps", "12", "--eval-steps", "4", "--batch-size", "4", "--num-train", "16", "--num-eval", "4",
              "--num-test", "4", "--lr", "1e-3", "--eps", "1e-2", "--autocast", "none", "--no-progress", "--seed", "3"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    # every part of the comparison runs with the same number of threads: a forward pass's last bits may
    # depend on how its work is split (bit-identical resume is promised on the same machine and settings)
    threads = os.environ.get("OMP_NUM_THREADS", "1")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS=threads)
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        _interrupt_resume_and_compare(common, whole, parts, env, capsys)
    finally:
        torch.set_num_threads(torch_threads)


def _interrupt_resume_and_compare(common, whole, parts, env, capsys):
    from mezo_rl.training.rundir import load_run

    assert main(["train", *common, "--output-dir", str(whole)]) == 0
    proc = subprocess.Popen([sys.executable, "-m", "mezo_rl", "train", *common, "--output-dir", str(parts)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 300
    while len(step_records(parts)) < 4 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended before it could be interrupted:\n{proc.stderr.read()}"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("mezo-rl: interrupted at step ") and "--resume" in last, err
    done = int(last.split("interrupted at step ")[1].split()[0])
    assert 4 <= done < 12, err
    state = json.loads((parts / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == done and not (parts / "summary.json").exists()
    assert not (parts / ".lock").exists()  # released on the way out

    # the same command without --resume would start over and replace that checkpoint: refused, nothing touched
    kept = {p: p.read_bytes() for p in parts.rglob("*") if p.is_file()}
    assert main(["train", *common, "--output-dir", str(parts)]) == 2
    err_fresh = capsys.readouterr().err
    assert f"step {done} of 12" in err_fresh and "--resume" in err_fresh and "--overwrite-output-dir" in err_fresh
    assert {p: p.read_bytes() for p in parts.rglob("*") if p.is_file()} == kept

    resume = last.split("resume with: ", 1)[1]
    assert resume.startswith("mezo-rl train ") and resume.endswith(" --resume")
    assert main(["train", *common, "--output-dir", str(parts), "--resume"]) == 0
    capsys.readouterr()

    a, _, step_a = load_run(whole, "final")
    b, _, step_b = load_run(parts, "final")
    assert step_a == step_b == 12
    for (name, x), y in zip(a.model.named_parameters(), b.model.parameters()):
        assert torch.equal(x, y), f"{name} differs after interrupt + resume"
    assert json.loads((whole / "summary.json").read_text())["test"] == json.loads((parts / "summary.json").read_text())["test"]
