"""benchmarks/mezo_budget.py: `mezo-rl train` for a budget of training seconds, the frontier's MeZO cells (the
stopping rule of benchmarks/grpo_sentiment.py)."""
from __future__ import annotations

import json
import pathlib
import sys
from types import SimpleNamespace

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from mezo_budget import TimeBudget, main, parse  # noqa: E402
from mezo_rl.training.callbacks import TrainerControl  # noqa: E402


def steps_until_stop(cb, args, state, seconds):
    events = []
    for _ in range(100):
        state.global_step += 1
        control = TrainerControl()
        cb.on_step_end(args, state, control, record={"seconds": seconds})
        if control.should_evaluate:
            events.append(("validate", state.global_step))
        if control.should_training_stop:
            return events + [("stop", state.global_step)]
    raise AssertionError("never stopped")


def test_validations_at_each_third_and_the_stop_at_the_nearest_step_boundary(tmp_path):
    """4 s steps, a 30 s budget: the thirds (10 s, 20 s) are passed after steps 3 and 5; step 7 ends at 28 s, and
    28 + 4 / 2 reaches 30, so training stops there (step 8 would end 2 s past it)."""
    cb, args, state = TimeBudget(30, 3), SimpleNamespace(output_dir=tmp_path), SimpleNamespace(global_step=0)
    cb.on_train_begin(args, state, TrainerControl())
    assert steps_until_stop(cb, args, state, 4.0) == [("validate", 3), ("validate", 5), ("stop", 7)]
    assert cb.spent == 28.0


def resumed(tmp_path, steps, at, seconds=4.0):
    """A TimeBudget(30 s, 3) begun on a run whose metrics.jsonl holds ``steps`` and whose checkpoint is ``at``."""
    lines = [{"step": 0, "split": "validation", "metrics": {}, "seconds": 50.0}]
    lines += [{"step": k, "loss": 0.1, "seconds": seconds} for k in steps]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    cb, args, state, control = TimeBudget(30, 3), SimpleNamespace(output_dir=tmp_path), SimpleNamespace(global_step=at), \
        TrainerControl()
    cb.on_train_begin(args, state, control)
    return cb, args, state, control


def test_a_resumed_run_counts_the_seconds_of_its_earlier_steps(tmp_path):
    # step 4 ran after the checkpoint (not counted); steps 2 and 3 ran twice (a resume from step 1): counted once
    cb, args, state, control = resumed(tmp_path, [1, 2, 3, 4, 2, 3], at=3)
    assert cb.spent == 12.0   # the evaluation's seconds and the steps past the checkpoint are not counted
    assert control.should_evaluate and not control.should_training_stop   # step 3 passed the 10 s mark
    assert steps_until_stop(cb, args, state, 4.0) == [("validate", 5), ("stop", 7)]
    cb, args, state, control = resumed(tmp_path, [1, 2, 3, 4], at=4)
    assert cb.spent == 16.0 and not control.should_evaluate   # no mark passed in step 4
    cb, args, state, control = resumed(tmp_path, range(1, 8), at=7)
    assert control.should_training_stop   # step 7 reached the budget: the resumed run stops there


def test_bad_input_is_one_line():
    with pytest.raises(SystemExit, match="usage"):
        parse(["--time-budget-s", "10"])
    with pytest.raises(SystemExit):
        parse(["--time-budget-s", "0", "--", "--task", "sst2"])
    with pytest.raises(ValueError, match="budget"):
        TimeBudget(10, 0)
    with pytest.raises(SystemExit):
        parse(["--time-budget-s", "10", "--", "--logging-steps", "5"])


def test_a_run_stops_at_its_budget_validated_and_tested(tmp_path, tiny_model_dir):
    """A budget shorter than any step: the run stops after its first step (of at most 5), validates it, tests
    validation's pick and says it stopped early."""
    run = tmp_path / "run"
    assert main(["--time-budget-s", "1e-9", "--", "--model", str(tiny_model_dir), "--task", "arithmetic-plain",
                 "--reward", "exact_answer", "--max-steps", "5", "--eval-steps", "5", "--per-device-train-batch-size",
                 "2", "--num-train", "4", "--num-eval", "2", "--num-test", "2", "--max-completion-length", "3",
                 "--evaluation", "inplace", "--autocast", "none", "--no-progress", "--output-dir", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["stopped_early"] is True
    validated = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()
                 if json.loads(x).get("split") == "validation"]
    assert validated == [0, 1]
