"""`mezo-rl train` for a wall-clock training budget, the rule benchmarks/grpo_sentiment.py applies to TRL's GRPO:
the reward-KL frontier's MeZO cells (benchmarks/rl.py --frontier), so that both tools train the same seconds.

    python benchmarks/mezo_budget.py --time-budget-s 640 --eval-points 3 -- --task arithmetic --reward exact_answer \\
        --max-steps 1000 --output-dir runs/x ...

Everything after ``--`` is `mezo-rl train`'s arguments (``--resume`` included). Training time is the sum of the
steps' own seconds (the trainer's ``seconds`` of each step: evaluations excluded), read back from the run's
metrics.jsonl when it resumes. A callback (:class:`TimeBudget`) asks for a validation at each ``1/N`` of the budget
and ends training at the step boundary nearest the budget: after step k if ``T_k + d_k / 2 >= budget`` (d_k that
step's seconds), then the trainer validates, tests its best validated step and writes the summary, as at its last
step. ``--max-steps`` stays an upper bound; give ``--eval-steps`` at least as large so that only the budget's
validations run.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


class TimeBudget:
    """A training callback: validations at each ``1/eval_points`` of ``budget_s`` training seconds, and the stop at
    the step boundary nearest the budget (after a step if the seconds so far plus half of that step's reach it)."""

    def __init__(self, budget_s: float, eval_points: int):
        if not budget_s > 0 or eval_points < 1:
            raise ValueError(f"a budget of seconds > 0 and eval_points >= 1, got {budget_s!r} and {eval_points!r}")
        self.budget, self.points = float(budget_s), int(eval_points)
        self.spent = 0.0
        self.stopped_by = None

    def _marks_passed(self, spent: float) -> int:
        return sum(spent >= self.budget * k / self.points for k in range(1, self.points))

    def on_train_begin(self, args, state, control, **kwargs):
        """The seconds of the steps already taken (a resumed run): its metrics.jsonl's step records."""
        path = pathlib.Path(args.output_dir) / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.is_file() else []
        records = [json.loads(line) for line in lines if line.strip()]
        self.spent = sum(r["seconds"] for r in records if "loss" in r and r["step"] <= state.global_step)

    def on_step_end(self, args, state, control, record=None, **kwargs):
        d = float(record["seconds"])
        before = self._marks_passed(self.spent)
        self.spent += d
        if self.spent + d / 2 >= self.budget:
            control.should_training_stop, self.stopped_by = True, "budget"
        elif self._marks_passed(self.spent) > before:
            control.should_evaluate = True
        return control


def parse(argv):
    if "--" not in argv:
        raise SystemExit("usage: mezo_budget.py --time-budget-s S [--eval-points N] -- <mezo-rl train arguments>")
    cut = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--time-budget-s", type=float, required=True, help="training seconds (evaluations excluded)")
    p.add_argument("--eval-points", type=int, default=3, help="validations at each 1/N of the budget (and at the end)")
    a = p.parse_args(argv[:cut])
    if not a.time_budget_s > 0 or a.eval_points < 1:
        p.error(f"--time-budget-s must be > 0 and --eval-points >= 1, got {a.time_budget_s} and {a.eval_points}")
    return a, argv[cut + 1:]


def main(argv=None) -> int:
    from mezo_rl.cli.main import main as cli

    a, train = parse(list(sys.argv[1:] if argv is None else argv))
    return cli(["train", *train], callbacks=[TimeBudget(a.time_budget_s, a.eval_points)])


if __name__ == "__main__":
    sys.exit(main())
