"""Countdown's base rates: how often a model solves the puzzle before any training, by difficulty.

    flock /tmp/mezo-heavy.lock python benchmarks/countdown_base.py --model smollm2-135m --n 200

Issue 35 puts Countdown in the RL study only where a small model starts above 0%. For each difficulty
(how many numbers a puzzle gives, ``--counts``, and the largest number, ``--max-numbers``; chat form) and
for ES-at-scale's published prompt (``countdown-paper``), ``n`` test puzzles are evaluated greedily with
``mezo_rl.training.evaluation.evaluate``, the same code a training run's evaluation uses. Prints one JSON line
per difficulty and a markdown table: ``correct`` (``countdown_correct``: the expression uses every number
once and reaches the target) and the ``countdown`` reward (0.1 x format + 1.0 x correct), each with its SE.
Each row is also appended to ``--record`` (default ``docs/results/countdown_base.jsonl``) with what issue 50's
protocol asks of a record: the command, the commit, the CPU (model, AVX512-BF16), the seed, n, the precision
(``--autocast``, mezo-rl's spelling, the protocol's setting by default) and sample completions.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import pathlib
import shlex
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))   # the suite package beside this file
from suite.protocol import PRECISION, commit, cpu_info, precision_of  # noqa: E402
from suite.records import append_record  # noqa: E402

from mezo_rl.model.loading import load_model
from mezo_rl.stats import Moments
from mezo_rl.training.evaluation import evaluate
from mezo_rl.tasks import get_task


REPO = pathlib.Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--counts", type=int, nargs="*", default=[2, 3, 4])
    ap.add_argument("--max-numbers", type=int, nargs="*", default=[10, 20])
    ap.add_argument("--paper", action=argparse.BooleanOptionalAction, default=True,
                    help="also ES-at-scale's prompt (countdown-paper: 3-4 numbers from 1..99, plain text)")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--autocast", default=PRECISION, choices=["auto", "bfloat16", "none"],
                    help="mezo-rl's --autocast for the evaluations (default: the protocol's, as the RL cells)")
    ap.add_argument("--record", default=str(REPO / "docs" / "results" / "countdown_base.jsonl"),
                    help="JSONL the rows are appended to ('' : none)")
    args = ap.parse_args()
    import torch

    from mezo_rl.training.outputs import autocast

    code, command = commit(REPO), shlex.join([sys.executable, *sys.argv])

    lm = load_model(args.model, batch_size=args.batch_size)
    settings = [("countdown", dict(count=c, max_number=m)) for c in args.counts for m in args.max_numbers]
    if args.paper:
        settings.append(("countdown-paper", {}))
    rows = []
    for name, options in settings:
        task = get_task(name, **options)
        examples = task.load_split("test", n=args.n, seed=args.seed)
        values = {"countdown": [], "countdown_correct": []}
        samples = []

        def keep(batch, outputs, vals):
            for k in values:
                values[k] += vals[k]
            if len(samples) < 6:  # a few completions beside their puzzles
                samples.extend({"numbers": ex.columns["numbers"], "target": ex.columns["target"], "completion": text}
                               for ex, text in zip([batch[g] for g in outputs.groups[:3]], outputs.texts[:3]))

        t0 = time.perf_counter()
        with torch.no_grad(), autocast(args.autocast, lm.device.type):
            evaluate(lm, task, examples, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, on_batch=keep)
        reward, correct = (Moments.of(values[k]) for k in values)
        row = {"model": args.model, "task": name, **options, "n": correct.count, "correct": correct.mean,
               "correct_se": correct.se, "reward": reward.mean, "reward_se": reward.se,
               "seconds": round(time.perf_counter() - t0, 1), "samples": samples, "seed": args.seed,
               "max_new_tokens": args.max_new_tokens, "command": command, "commit": code, "cpu": cpu_info(),
               "precision": precision_of(args.autocast), "date": _dt.date.today().isoformat()}
        rows.append(row)
        if args.record:
            append_record(args.record, row)
        print(json.dumps(row), flush=True)
    print("\n| task | numbers | from 1.. | correct (SE) | reward (SE) | n |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['task']} | {r.get('count', '3-4')} | {r.get('max_number', 99)} | "
              f"{100 * r['correct']:.1f}% ({100 * r['correct_se']:.1f}) | {r['reward']:.3f} ({r['reward_se']:.3f}) | {r['n']} |")


if __name__ == "__main__":
    main()
