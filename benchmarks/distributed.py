"""Data-parallel MeZO throughput: steps/s with 1 vs 2 ranks, and bytes communicated per step.

Runs the trainer's data-parallel step (same global batch on every rank, own shard, all-reduced
objective sums/counts, same MeZO update) under ``torchrun`` for several (ranks, threads per rank)
layouts and prints a markdown table. The model is SmolLM2-135M-Instruct (``--model``), the data is
SST-2 with the paper's prompt, the objective is the candidates' cross-entropy, batch 16 (paper).

    flock /tmp/mezo-heavy.lock .venv/bin/python benchmarks/distributed.py --steps 8
    flock /tmp/mezo-heavy.lock .venv/bin/python benchmarks/distributed.py --layouts 1x2,2x1 --json out.json

Each layout is a fresh ``torchrun --standalone`` launch with ``OMP_NUM_THREADS`` set to the threads
per rank. Timing starts after ``--warmup`` steps (model load, first-call overheads excluded). The
global losses of every layout are printed too: they must agree to float rounding, since every
layout computes the loss of the same global batch.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(a) -> None:
    """One rank: load, check replicas agree, run warmup + timed steps, rank 0 writes the result."""
    import torch

    torch.set_num_threads(a.threads)
    from mezo_rl.training.distributed import DistContext
    from mezo_rl.model.lm import LanguageModel
    from mezo_rl.model.loading import load_model
    from mezo_rl.engine.optim import MeZO
    from mezo_rl.rewards import build_objective
    from mezo_rl.tasks import get_task

    ctx = DistContext.from_env()
    lm = load_model(a.model, dtype="float32")
    if not isinstance(lm, LanguageModel):
        raise TypeError(f"load_model returned {type(lm).__name__}, expected a LanguageModel")
    t0 = time.perf_counter()
    ctx.check_same_weights(lm.model.named_parameters())
    checksum_seconds = time.perf_counter() - t0
    task = get_task(a.task)
    train = task.load_split("train", n=a.batch_size * (a.warmup + a.steps), seed=0)
    objective = build_objective(["cross_entropy"])
    keys = list(objective.names)
    opt = MeZO([p for p in lm.model.parameters() if p.requires_grad], lr=a.lr, eps=1e-3, seed=0)

    losses, step_seconds, step_bytes, closure_seconds = [], [], [], []
    for step in range(a.warmup + a.steps):
        batch = train[step * a.batch_size:(step + 1) * a.batch_size]  # same global batch on every rank
        shard = ctx.shard(batch)

        def closure():
            t_fwd = time.perf_counter()
            with torch.no_grad():
                scores = lm.score([ex.prompt for ex in shard], [ex.candidates for ex in shard])
            out = objective.evaluate(prompts=[ex.prompt for ex in shard], candidate_scores=scores,
                                     labels=[ex.label for ex in shard], columns={})
            stats = ctx.all_reduce_sum([out.sums[k] for k in keys] + [out.counts[k] for k in keys]
                                       + [out.sq_sums[k] for k in keys])
            n = len(keys)
            closure_seconds[-1] += time.perf_counter() - t_fwd
            return objective.loss_from(dict(zip(keys, stats[:n])), dict(zip(keys, stats[n:2 * n])),
                                       dict(zip(keys, stats[2 * n:])))

        ctx.barrier()
        closure_seconds.append(0.0)
        b0, t0 = ctx.bytes_communicated, time.perf_counter()
        res = opt.step(closure)
        step_seconds.append(time.perf_counter() - t0)
        step_bytes.append(ctx.bytes_communicated - b0)
        losses.append(float(res.loss))
    timed, forward = step_seconds[a.warmup:], closure_seconds[a.warmup:]
    ctx.check_same_weights(lm.model.named_parameters())  # the replicas are still identical
    if ctx.is_main:
        with open(a.result, "w") as f:
            json.dump({"ranks": ctx.world_size, "threads": a.threads, "steps": a.steps,
                       "seconds_per_step": sum(timed) / len(timed), "steps_per_s": len(timed) / sum(timed),
                       "closure_seconds_per_step": sum(forward) / len(forward),
                       "load_average_1min": os.getloadavg()[0],
                       "bytes_per_step": step_bytes[-1], "checksum_seconds": checksum_seconds,
                       "losses": losses}, f)
    ctx.close()


def launch(a, ranks: int, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
               os.path.abspath(__file__), "--worker", "--threads", str(threads), "--result", result,
               "--model", a.model, "--task", a.task, "--batch-size", str(a.batch_size),
               "--steps", str(a.steps), "--warmup", str(a.warmup), "--lr", str(a.lr)]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                   TOKENIZERS_PARALLELISM="false")
        subprocess.run(cmd, check=True, cwd=ROOT, env=env)
        with open(result) as f:
            return json.load(f)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layouts", default="1x1,1x2,2x1,2x2",
                   help="comma-separated RANKSxTHREADS layouts (threads per rank); default %(default)s")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--task", default="sst2")
    p.add_argument("--batch-size", type=int, default=16, help="global batch (split across ranks)")
    p.add_argument("--steps", type=int, default=8, help="timed steps per layout")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--json", help="also write all results to this file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)

    layouts = []
    for item in a.layouts.split(","):
        try:
            r, t = (int(x) for x in item.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--layouts: {item!r} is not RANKSxTHREADS (e.g. 2x1)")
        layouts.append((r, t))
    results = [launch(a, r, t) for r, t in layouts]
    print(f"\nmodel {a.model}, task {a.task}, global batch {a.batch_size}, {a.steps} timed steps "
          f"(+{a.warmup} warmup), {os.cpu_count()} CPU cores\n")
    print("| ranks | threads/rank | s/step | steps/s | of which closures (forward + all-reduce) | "
          "perturb + update | bytes all-reduced/step/rank | weight checksum s | load avg |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        rest = r["seconds_per_step"] - r["closure_seconds_per_step"]
        print(f"| {r['ranks']} | {r['threads']} | {r['seconds_per_step']:.3f} | {r['steps_per_s']:.3f} "
              f"| {r['closure_seconds_per_step']:.3f} | {rest:.3f} | {r['bytes_per_step']} "
              f"| {r['checksum_seconds']:.2f} | {r['load_average_1min']:.1f} |")
    ref = results[0]["losses"]
    worst = max(max(abs(x - y) for x, y in zip(ref, r["losses"])) for r in results)
    print(f"\nlargest difference in the global loss between layouts: {worst:.3g} (losses of layout "
          f"{layouts[0][0]}x{layouts[0][1]}: {[round(x, 6) for x in ref]})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
