"""Ctrl-C in the middle of `mezo-rl train`: the weights are restored, a checkpoint is written at the last
completed step, the command to resume is printed, the same command without --resume is refused, and the
resumed run ends bit-identical to an uninterrupted one.

The fast test sends SIGINT to its own process from inside a training step (a reward presses Ctrl-C at its
Nth call), so the whole check runs in-process; the slow one interrupts a separate `python -m mezo_rl
train` process from outside, as a terminal does."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import torch

from mezo_rl.cli.main import main

TESTS = pathlib.Path(__file__).parent
PAUSE = TESTS / "user_rewards" / "slow_rewards.py"
SIGINT = TESTS / "user_rewards" / "interrupting_rewards.py"


def step_records(run_dir: pathlib.Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines[:-1] + ([lines[-1]] if lines and lines[-1].endswith("}") else [])
            if line.strip() and "split" not in line]


def train_argv(model_dir, data_dir, reward: str, steps: int, eval_steps: int) -> list[str]:
    """A short run on the tiny model; ``reward`` is a weight-0 extra reward called in every step's members."""
    return ["--model", str(model_dir), "--task", "sst2", "--data-dir", str(data_dir),
            "--reward", "cross_entropy", "--reward", reward, "--reward-weights", "1,0",
            "--max-steps", str(steps), "--eval-steps", str(eval_steps), "--per-device-train-batch-size", "4", "--n-spsa", "2",
            "--num-train", "16", "--num-eval", "4", "--num-test", "4", "--learning-rate", "1e-3", "--eps", "1e-2",
            "--autocast", "none", "--no-progress", "--seed", "3"]


def test_sigint_inside_a_step_checkpoints_and_the_resumed_run_is_bit_identical(tmp_path, tiny_model_dir, data_dir,
                                                                                capsys, monkeypatch):
    steps = 4
    common = train_argv(tiny_model_dir, data_dir, f"{SIGINT}:sigint_at_call", steps=steps, eval_steps=3)
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert main(["train", *common, "--output-dir", str(whole)]) == 0
    capsys.readouterr()
    # two-point with --n-spsa 2: four member evaluations per step, so call 10 is the second member of step 3
    monkeypatch.setenv("MEZO_RL_TEST_SIGINT_AT_CALL", "10")
    assert main(["train", *common, "--output-dir", str(parts)]) == 130
    err = capsys.readouterr().err
    assert "MEZO_RL_TEST_SIGINT_AT_CALL" not in os.environ  # it fired
    done = check_interrupted_run(err, parts, steps, common, capsys)
    assert done == 2  # the step it stopped in is not kept: the checkpoint (written on the way out) is step 2's
    check_resume_matches(common, whole, parts, steps, capsys)


@pytest.mark.slow  # two runs in this process and one in a subprocess (its start-up imports torch and transformers)
def test_sigint_to_a_training_process_checkpoints_and_the_resumed_run_is_bit_identical(tmp_path, tiny_model_dir,
                                                                                       data_dir, capsys):
    # a weight-0 reward that sleeps 20 ms per call makes a step last long enough to be interrupted inside it
    steps = 12
    common = train_argv(tiny_model_dir, data_dir, f"{PAUSE}:pause", steps=steps, eval_steps=4)
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    # every part of the comparison runs with the same number of threads: a forward pass's last bits may
    # depend on how its work is split (bit-identical resume is promised on the same machine and settings)
    threads = os.environ.get("OMP_NUM_THREADS", "1")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS=threads)
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
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
        done = check_interrupted_run(err, parts, steps, common, capsys)
        assert 4 <= done < steps, err
        check_resume_matches(common, whole, parts, steps, capsys)
    finally:
        torch.set_num_threads(torch_threads)


def check_interrupted_run(err: str, parts: pathlib.Path, steps: int, common: list, capsys) -> int:
    """The interrupted run's last line, checkpoint and lock; the same command without --resume is refused and
    touches nothing. Returns the step the checkpoint holds."""
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("mezo-rl: interrupted at step ") and "--resume" in last, err
    done = int(last.split("interrupted at step ")[1].split()[0])
    state = json.loads((parts / "checkpoint" / "trainer_state.json").read_text())
    assert state["global_step"] == done and not (parts / "summary.json").exists()
    assert len(step_records(parts)) == done  # the steps logged are the steps kept
    assert not (parts / ".lock").exists()  # released on the way out
    resume = last.split("resume with: ", 1)[1]
    assert resume.startswith("mezo-rl train ") and resume.endswith(" --resume")

    # the same command without --resume would start over and replace that checkpoint: refused, nothing touched
    kept = {p: p.read_bytes() for p in parts.rglob("*") if p.is_file()}
    assert main(["train", *common, "--output-dir", str(parts)]) == 2
    err_fresh = capsys.readouterr().err
    assert f"step {done} of {steps}" in err_fresh and "--resume" in err_fresh and "--overwrite-output-dir" in err_fresh
    assert {p: p.read_bytes() for p in parts.rglob("*") if p.is_file()} == kept
    return done


def check_resume_matches(common: list, whole: pathlib.Path, parts: pathlib.Path, steps: int, capsys) -> None:
    """--resume finishes the interrupted run with the weights and test result of the uninterrupted one."""
    from mezo_rl.training.rundir import load_run

    assert main(["train", *common, "--output-dir", str(parts), "--resume"]) == 0
    capsys.readouterr()
    a, _, step_a = load_run(whole, "final")
    b, _, step_b = load_run(parts, "final")
    assert step_a == step_b == steps
    for (name, x), y in zip(a.model.named_parameters(), b.model.parameters()):
        assert torch.equal(x, y), f"{name} differs after interrupt + resume"
    assert json.loads((whole / "summary.json").read_text())["test"] == json.loads((parts / "summary.json").read_text())["test"]
    assert [r["loss"] for r in step_records(whole)] == [r["loss"] for r in step_records(parts)]
