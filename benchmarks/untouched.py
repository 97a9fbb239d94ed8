"""The untouched test split (issue 70; ``benchmarks/suite/untouched.py`` is its rule book): draw it, or read it once.

    python benchmarks/untouched.py --write                 # (re)write benchmarks/untouched/ from the seed; needs
                                                           # MEZO_RL_DATA for sentiment (the same files each time)
    python benchmarks/untouched.py --check                 # the committed selection is what the seed draws
    python benchmarks/untouched.py --read-run runs/rl_frontier/arithmetic-CELL-s0/run --task arithmetic \\
        --cell CELL --seed 0                               # replay a MeZO run to validation's pick, read once

``--read-run`` rebuilds the run's weights at its picked step from its trajectory (``mezo_rl.training.rundir.load_run``:
the base model and the steps up to the pick replayed), claims the read in ``docs/results/untouched_reads.jsonl`` (a
second read of the same task, cell and seed is refused) and writes the outcomes to ``<run>/untouched.json``, which
``benchmarks/rl.py`` copies into the cell's record. ``--start`` reads the starting weights instead (the cell
``starting-weights``, seed 0: the baseline of the gains) and appends it, per-prompt outcomes and all, to
``docs/results/untouched_start.jsonl``.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))   # the suite package beside this file
from suite import untouched  # noqa: E402
from suite.protocol import commit, cpu_info  # noqa: E402
from suite.records import append_record  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
#: the starting weights' reads (``--start``), each with its per-prompt outcomes
START_RECORDS = REPO / "docs" / "results" / "untouched_start.jsonl"
#: the reward each task's verdict reads (sentiment-guard's figures stay positivity's) and its completion tokens
READS = {"arithmetic": ("exact_answer", 16), "arithmetic-4x": ("exact_answer", 16),
         "sentiment": ("examples/sentiment_reward.py:positivity", 24),
         "sentiment-guard": ("examples/sentiment_reward.py:positivity", 24)}


def write(data_dir) -> None:
    untouched.DATA.mkdir(parents=True, exist_ok=True)
    rows = untouched.draw_arithmetic()
    (untouched.DATA / "arithmetic.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if data_dir:
        sel = untouched.draw_sentiment(data_dir)
        (untouched.DATA / "sentiment.json").write_text(json.dumps(sel, indent=1) + "\n")
    else:
        print("MEZO_RL_DATA not set: the sentiment selection was left as it is", file=sys.stderr)


def check(data_dir) -> int:
    ok = untouched.arithmetic_rows() == untouched.draw_arithmetic()
    print(f"arithmetic: {'the committed rows are the draw' if ok else 'DIFFERS from the draw'}")
    if data_dir:
        same = json.loads((untouched.DATA / "sentiment.json").read_text()) == untouched.draw_sentiment(data_dir)
        print(f"sentiment: {'the committed selection is the draw' if same else 'DIFFERS from the draw'}")
        ok &= same
    return 0 if ok else 1


def read_run(run_dir: pathlib.Path, task: str, cell: str, seed: int, start: bool, data_dir) -> dict:
    from mezo_rl.model.loading import load_model
    from mezo_rl.training.rundir import load_run, read_args

    reward, tokens = READS[task]
    untouched.Ledger().check(task, cell, seed)  # a second read is refused before any model is built
    if start:
        args = read_args(run_dir) if run_dir else None
        lm, step = load_model("smollm2-135m"), 0
        autocast = getattr(args, "autocast", "auto") if args else "auto"
    else:
        lm, args, step = load_run(run_dir, "best")
        autocast, tokens = args.autocast, args.max_completion_length or tokens
    out = untouched.read(lm, task, cell, seed, step, reward, tokens, autocast, commit(REPO), data_dir=data_dir,
                         batch_size=getattr(args, "eval_batch_size", 64) if args else 64)
    if run_dir:
        (run_dir / "untouched.json").write_text(json.dumps(out) + "\n")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="write benchmarks/untouched/ from the seed")
    p.add_argument("--check", action="store_true", help="check the committed selection is the seed's draw")
    p.add_argument("--read-run", type=pathlib.Path, default=None, help="a mezo-rl run directory to read at its pick")
    p.add_argument("--start", action="store_true", help="read the starting weights (cell starting-weights, seed 0)")
    p.add_argument("--task", choices=sorted(READS), default=None)
    p.add_argument("--cell", default=None)
    p.add_argument("--seed", type=int, default=None)
    a = p.parse_args(argv)
    data_dir = os.environ.get("MEZO_RL_DATA")
    if a.write:
        write(data_dir)
        return 0
    if a.check:
        return check(data_dir)
    if a.start and a.task:
        out = read_run(a.read_run, a.task, untouched.START, 0, True, data_dir)
        # the baseline's per-prompt outcomes, kept: a gain is paired with them prompt by prompt
        append_record(START_RECORDS, {"task": a.task, "cell": untouched.START, "seed": 0, "commit": commit(REPO),
                                      "cpu": cpu_info(), "untouched": out})
    elif a.read_run and a.task and a.cell and a.seed is not None:
        out = read_run(a.read_run, a.task, a.cell, a.seed, False, data_dir)
    else:
        p.error("give --write, --check, --start --task T, or --read-run RUN --task T --cell C --seed S")
    print(json.dumps({k: v for k, v in out.items() if k != "outcomes"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
