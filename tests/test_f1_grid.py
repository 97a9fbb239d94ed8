"""benchmarks/f1_grid.py's time budget (benchmarks/mezo_budget.py's TimeBudget, the protocol's equal-time rule,
tested in tests/test_rl_protocol.py): a run stopped by it still validates and tests its best step."""
from __future__ import annotations

import pathlib
import sys

from test_trainer import factory, make_args, train  # noqa: F401  (factory is a fixture)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))  # as the script sees it

from f1_grid import TimeBudget  # noqa: E402


def test_a_run_stopped_by_the_budget_validates_and_tests_its_best_step(tmp_path, factory):  # noqa: F811
    args = make_args(tmp_path, max_steps=50, eval_steps=50)
    _, summary = train(args, factory, callbacks=[TimeBudget(1e-9, 1)])
    assert summary["steps"] == 1 and summary["stopped_early"] is True
    assert summary["test"]["n"] > 0 and summary["final_validation"] is not None
