"""benchmarks/mezo_budget.py: `mezo-rl train` for a budget of training seconds, the frontier's MeZO cells (the
stopping rule of benchmarks/grpo_sentiment.py)."""
from __future__ import annotations

import json
import pathlib
import sys
from types import SimpleNamespace

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from mezo_budget import ScaleDecay, TimeBudget, main, parse  # noqa: E402
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
                 "--member-evaluation", "inplace", "--autocast", "none", "--no-progress", "--output-dir", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["stopped_early"] is True
    validated = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()
                 if json.loads(x).get("split") == "validation"]
    assert validated == [0, 1]


def test_scale_decay_sets_each_steps_lr_and_eps_from_the_schedule_not_from_the_groups():
    """The factor (1 + k t)^-p multiplies the schedule's lr and the run's eps; groups that already hold a decayed
    value (a resumed run's) are not decayed again."""
    cb = ScaleDecay(0.5, 2.0)
    opt = SimpleNamespace(param_groups=[{"lr": 123.0, "eps": 456.0}, {"lr": 7.0, "eps": 8.0}])
    sched = SimpleNamespace(get_last_lr=lambda: [0.1, 0.2])
    args = SimpleNamespace(eps=0.01)
    for step in (0, 3, 3):
        cb.on_step_begin(args, SimpleNamespace(global_step=step), TrainerControl(), optimizer=opt, lr_scheduler=sched)
        f = (1 + 0.5 * step) ** -2.0
        assert [(g["lr"], g["eps"]) for g in opt.param_groups] == [(0.1 * f, 0.01 * f), (0.2 * f, 0.01 * f)]
    with pytest.raises(ValueError, match="scale-decay"):
        ScaleDecay(0.0, 1.0)
    for bad in (["--scale-decay", "0.1"], ["--scale-decay-power", "1"], ["--scale-decay", "-1", "--scale-decay-power", "1"]):
        with pytest.raises(SystemExit):
            parse(["--time-budget-s", "10", *bad, "--", "--task", "sst2"])


def test_a_decayed_run_logs_the_decayed_lr_and_eps_of_every_step(tmp_path, tiny_model_dir):
    """A real run under --scale-decay 1 --scale-decay-power 1: the trajectory (what replay re-executes) holds
    lr / (1 + t) and eps / (1 + t) at step t."""
    run = tmp_path / "run"
    assert main(["--time-budget-s", "1e6", "--scale-decay", "1", "--scale-decay-power", "1", "--", "--model",
                 str(tiny_model_dir), "--task", "arithmetic-plain", "--reward", "exact_answer", "--max-steps", "3",
                 "--eval-steps", "3", "--per-device-train-batch-size", "2", "--num-train", "4", "--num-eval", "2",
                 "--num-test", "2", "--max-completion-length", "3", "--learning-rate", "0.25", "--eps", "0.5",
                 "--member-evaluation", "inplace", "--autocast", "none", "--no-progress", "--output-dir", str(run)]) == 0
    with np.load(run / "checkpoint" / "trajectory.npz") as z:
        lrs, epss = z["lrs"], z["epss"]
    assert lrs.shape[0] == 3
    for t in range(3):
        assert set(lrs[t]) == {0.25 * (1 + t) ** -1.0} and set(epss[t]) == {0.5 * (1 + t) ** -1.0}
