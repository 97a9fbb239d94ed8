"""Zero-shot evaluation of one model on the built-in tasks (the paper's "Zero-shot" rows).

    MEZO_RL_DATA=DIR flock /tmp/mezo-heavy.lock \
        python benchmarks/zero_shot.py --model smollm2-135m --n 200 --out zero_shot.json

For each task: ``n`` test examples sampled with ``--seed`` (all of them where the split is smaller),
evaluated with ``mezo_rl.training.evaluation.evaluate`` (argmax of mean log-likelihood; greedy generation for
SQuAD/DROP). Prints one JSON line per task (metrics, n, seconds) and a markdown table at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch

from mezo_rl.training.evaluation import evaluate
from mezo_rl.model.loading import load_model
from mezo_rl.tasks import PAPER_TASKS, get_task


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tasks", nargs="*", default=PAPER_TASKS)
    ap.add_argument("--split", default="test")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", default=None, help="write all results as JSON here")
    args = ap.parse_args()

    t0 = time.perf_counter()
    lm = load_model(args.model, batch_size=args.batch_size)
    print(json.dumps({"model": args.model, "load_s": round(time.perf_counter() - t0, 1),
                      "threads": torch.get_num_threads()}), flush=True)
    results = []
    for name in args.tasks:
        task = get_task(name)
        examples = task.load_split(args.split, data_dir=args.data_dir, n=args.n, seed=args.seed)
        t0 = time.perf_counter()
        metrics = evaluate(lm, task, examples, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens)
        row = {"task": name, "kind": task.kind, **metrics, "seconds": round(time.perf_counter() - t0, 1)}
        results.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "split": args.split, "n": args.n, "seed": args.seed, "results": results}, f, indent=1)
    print(f"\n| task | kind | metric | value | examples | seconds |\n|---|---|---|---|---|---|")
    for r in results:
        for m in get_task(r["task"]).metrics:
            print(f"| {r['task']} | {r['kind']} | {m} | {100 * r[m]:.1f} | {r['n']} | {r['seconds']} |")


if __name__ == "__main__":
    main()
