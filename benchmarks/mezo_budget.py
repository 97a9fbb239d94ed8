"""`mezo-rl train` for a wall-clock training budget, the rule benchmarks/grpo_sentiment.py applies to TRL's GRPO:
the reward-KL frontier's MeZO cells (benchmarks/rl.py --frontier), so that both tools train the same seconds.

    python benchmarks/mezo_budget.py --time-budget-s 640 --eval-points 3 -- --task arithmetic --reward exact_answer \\
        --max-steps 1000 --output-dir runs/x ...

Everything after ``--`` is `mezo-rl train`'s arguments (``--resume`` included: an interrupted run resumes with
this same command and ``--resume``, not with the `mezo-rl train ... --resume` the command line prints). Training
time is the sum of the steps' own seconds (the trainer's ``seconds`` of each step: evaluations excluded), read back
from the run's metrics.jsonl when it resumes, so ``--logging-steps`` must stay 1; one process (no torchrun). A
callback (:class:`TimeBudget`) asks for a validation at each ``1/N`` of the budget and ends training at the step
boundary nearest the budget: after step k if ``T_k + d_k / 2 >= budget`` (d_k that step's seconds), then the trainer
validates, tests its best validated step and writes the summary, as at its last step. A run resumed from a
checkpoint whose last step passed a mark or the budget validates or stops there, as it would have. ``--max-steps``
stays an upper bound; give ``--eval-steps`` at least as large so that only the budget's validations run.

``--scale-decay K --scale-decay-power P`` (a second callback, :class:`ScaleDecay`) multiplies the lr and the eps of
the step that follows t steps by ``(1 + K t)^-P``: plain MeZO with its noise and its step shrinking over the run as
HiZOO's curvature shrinks them when it grows alike for every weight (``H = (1 + K t)^2P``), the control that tells
HiZOO's per-weight part from its decay (benchmarks/rl.py's ``mezo-full-decay*`` cells).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
for _path in (REPO, REPO / "benchmarks"):  # the package, and the suite package beside this file
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
from suite.protocol import after_step  # noqa: E402


class TimeBudget:
    """A training callback: validations at each ``1/eval_points`` of ``budget_s`` training seconds, and the stop at
    the step boundary nearest the budget (the protocol's equal-time rule, ``suite.protocol.after_step``, which the
    GRPO script applies to TRL's steps)."""

    def __init__(self, budget_s: float, eval_points: int):
        if not budget_s > 0 or eval_points < 1:
            raise ValueError(f"a budget of seconds > 0 and eval_points >= 1, got {budget_s!r} and {eval_points!r}")
        self.budget, self.points = float(budget_s), int(eval_points)
        self.spent = 0.0

    def _after(self, control, before: float, d: float) -> None:
        """Steer ``control`` after a step of ``d`` seconds that began at ``before`` seconds."""
        decision = after_step(before, d, self.budget, self.points)
        if decision == "stop":
            control.should_training_stop = True
        elif decision == "validate":
            control.should_evaluate = True

    def on_train_begin(self, args, state, control, **kwargs):
        """A resumed run: the seconds of its steps so far (metrics.jsonl's step records up to the checkpoint's step,
        the latest record of a step that ran twice), and what its last step asked for (a validation or the stop)."""
        path = pathlib.Path(args.output_dir) / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.is_file() else []
        seconds = {}
        for r in (json.loads(line) for line in lines if line.strip()):
            if "loss" in r and r["step"] <= state.global_step:
                seconds[r["step"]] = float(r["seconds"])
        self.spent = sum(seconds.values())
        if state.global_step and state.global_step in seconds:
            last = seconds[state.global_step]
            self._after(control, self.spent - last, last)

    def on_step_end(self, args, state, control, record=None, **kwargs):
        d = float(record["seconds"])
        self._after(control, self.spent, d)
        self.spent += d
        return control


class ScaleDecay:
    """A training callback: before the step that follows ``t`` steps, every param group's lr is the schedule's
    (``lr_scheduler``) and its eps the run's (``args.eps``), each times ``(1 + k t)^-power``. Set from those, not
    from the groups, so that a resumed run (whose groups hold the last step's values) does not decay twice; the
    trajectory logs each step's lr and eps, so a replay needs no callback."""

    def __init__(self, k: float, power: float):
        if not (k > 0 and power > 0):
            raise ValueError(f"--scale-decay and --scale-decay-power must be > 0, got {k!r} and {power!r}")
        self.k, self.power = float(k), float(power)

    def factor(self, steps: int) -> float:
        return (1.0 + self.k * steps) ** -self.power

    def on_step_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        f = self.factor(state.global_step)
        for group, lr in zip(optimizer.param_groups, lr_scheduler.get_last_lr()):
            group["lr"], group["eps"] = lr * f, args.eps * f


def parse(argv):
    if "--" not in argv:
        raise SystemExit("usage: mezo_budget.py --time-budget-s S [--eval-points N] -- <mezo-rl train arguments>")
    cut = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--time-budget-s", type=float, required=True, help="training seconds (evaluations excluded)")
    p.add_argument("--eval-points", type=int, default=3, help="validations at each 1/N of the budget (and at the end)")
    p.add_argument("--scale-decay", type=float, default=None, metavar="K",
                   help="lr and eps of the step after t steps times (1 + K t)^-P (ScaleDecay); with --scale-decay-power")
    p.add_argument("--scale-decay-power", type=float, default=None, metavar="P", help="P of --scale-decay")
    a = p.parse_args(argv[:cut])
    if not a.time_budget_s > 0 or a.eval_points < 1:
        p.error(f"--time-budget-s must be > 0 and --eval-points >= 1, got {a.time_budget_s} and {a.eval_points}")
    if (a.scale_decay is None) != (a.scale_decay_power is None):
        p.error(f"--scale-decay and --scale-decay-power go together; got {a.scale_decay} and {a.scale_decay_power}")
    a.decay = None
    if a.scale_decay is not None:
        try:
            a.decay = ScaleDecay(a.scale_decay, a.scale_decay_power)  # its own check, before any model loads
        except ValueError as e:
            p.error(str(e))
    train = argv[cut + 1:]
    logging = [train[i + 1] for i, x in enumerate(train[:-1]) if x in ("--logging-steps", "--logging_steps")]
    if any(v != "1" for v in logging):
        p.error(f"--logging-steps must stay 1 (the budget reads every step's seconds back on a resume), got {logging[-1]}")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        p.error("one process only: under torchrun each rank would time its own steps and stop at its own step")
    return a, train


def main(argv=None) -> int:
    from mezo_rl.cli.main import main as cli

    a, train = parse(list(sys.argv[1:] if argv is None else argv))
    callbacks = [TimeBudget(a.time_budget_s, a.eval_points)]
    if a.decay is not None:
        callbacks.append(a.decay)
    # the protocol's runs test validation's pick (benchmarks/suite/protocol.py): the best step's weights
    return cli(["train", "--load-best-model-at-end", *train], callbacks=callbacks)


if __name__ == "__main__":
    sys.exit(main())
