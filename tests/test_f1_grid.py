"""benchmarks/f1_grid.py's time budget: configurations get the same seconds of steps, validated by time, and a
run stopped by it still validates and tests its best step."""
from __future__ import annotations

import pathlib
import sys
import types

from mezo_rl.training.callbacks import TrainerControl
from test_trainer import factory, make_args, train  # noqa: F401  (factory is a fixture)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))  # as the script sees it

from f1_grid import TimeBudget  # noqa: E402


def test_the_budget_asks_for_validations_by_seconds_of_steps_and_stops_at_its_end():
    cb, trainer = TimeBudget(budget=10.0, validate_every=3.0), types.SimpleNamespace(seconds={"steps": 0.0})
    seen = []
    for spent in (1.0, 3.5, 4.0, 7.0, 9.0, 10.5):
        control = TrainerControl()
        trainer.seconds["steps"] = spent
        cb.on_step_end(None, None, control, trainer=trainer)
        seen.append((control.should_evaluate, control.should_training_stop))
    # validations at 3.5 (due at 3) and 7 (due 3 s after the last, at 6.5); the stop once 10 s are spent
    assert seen == [(False, False), (True, False), (False, False), (True, False), (False, False), (False, True)]


def test_a_run_stopped_by_the_budget_validates_and_tests_its_best_step(tmp_path, factory):  # noqa: F811
    args = make_args(tmp_path, max_steps=50, eval_steps=50)
    _, summary = train(args, factory, callbacks=[TimeBudget(budget=0.0, validate_every=1e9)])
    assert summary["steps"] == 1 and summary["stopped_early"] is True
    assert summary["test"]["n"] > 0 and summary["final_validation"] is not None
