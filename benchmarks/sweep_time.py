"""What the default (low-rank) step costs beyond its two forward passes on a CPU, SmolLM2-135M, one process.

    flock /tmp/mezo-heavy.lock python benchmarks/sweep_time.py [--reps 5] [--threads 2]
        [--before OLD/mezo_rl/engine/noise.py]

fp32 weights, batch 16 x 64 random token ids. Per rep, interleaved: F = one forward pass and its next-token
cross-entropy, in fp32 and under bf16 autocast; ``sweeps after``: a step's three low-rank sweeps of every
weight (+eps, -2 eps, +eps) with this engine (``NoiseSpec.sweep_``, the sample's draw included); with
``--before``, the same three sweeps with another engine's noise module, loaded from that file and swept
tensor by tensor with its ``NoiseSpec.axpy_`` (e.g. a checkout of the commit before fused sweeps:
``git worktree add /tmp/before 7e63745``); S = one ``MeZO.step`` (default options, lr 0) whose closure is
F, and S/own = S over its own two closure calls (immune to the forward's drift between reps). Prints
medians and minima, (2F + three sweeps) / 2F for each engine, and S/(2F).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.nn.functional as F

from mezo_rl.engine.noise import NoiseSpec, layout
from mezo_rl.engine.optim import MeZO
from mezo_rl.model.loading import load_model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--before", help="another engine's mezo_rl/engine/noise.py, swept tensor by tensor")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model("smollm2-135m").model
    params = list(model.parameters())
    ids = torch.randint(0, model.config.vocab_size, (16, 64), generator=torch.Generator().manual_seed(0))
    inner = []  # seconds of each closure call

    def forward(bf16: bool = False):
        t = time.perf_counter()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=ids).logits
            out = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
        inner.append(time.perf_counter() - t)
        return out

    spec = NoiseSpec("lowrank", "torch", layout=layout(enumerate(params)))
    sweeps = {"after": lambda seed: [spec.sweep_(list(enumerate(params)), seed, [(a, 0.0, 1.0)] * len(params))
                                     for a in (1e-3, -2e-3, 1e-3)]}
    if args.before:
        found = importlib.util.spec_from_file_location("noise_before", args.before)
        before = importlib.util.module_from_spec(found)
        sys.modules["noise_before"] = before
        found.loader.exec_module(before)
        old = before.NoiseSpec("lowrank", "torch")
        sweeps["before"] = lambda seed: [old.axpy_(p, seed, i, a=a) for a in (1e-3, -2e-3, 1e-3)
                                         for i, p in enumerate(params)]
    opts = {bf16: MeZO(params, lr=0.0, record=False) for bf16 in (False, True)}

    def timed(fn) -> float:
        t = time.perf_counter()
        with torch.no_grad():
            fn()
        return time.perf_counter() - t

    names = {False: "fp32", True: "bf16 autocast"}
    times = {k: [] for k in [f"F {n}" for n in names.values()] + [f"sweeps {w}" for w in sweeps]
             + [f"S {n}" for n in names.values()]}
    own = {n: [] for n in names.values()}
    for rep in range(args.reps + 1):  # rep 0 warms up
        row = {f"F {n}": timed(lambda: forward(bf16)) for bf16, n in names.items()}
        row.update({f"sweeps {w}": timed(lambda: fn(100 + rep)) for w, fn in sweeps.items()})
        for bf16, n in names.items():
            inner.clear()
            row[f"S {n}"] = timed(lambda: opts[bf16].step(lambda: forward(bf16)))
            if rep:
                own[n].append(row[f"S {n}"] / sum(inner))
        if rep:
            for k, v in row.items():
                times[k].append(v)
            print(f"rep {rep}: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in row.items()), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    low = {k: min(v) for k, v in times.items()}
    print(f"\nSmolLM2-135M fp32 weights, batch 16 x 64, {args.threads} threads, {args.reps} reps (medians; minima)")
    for k in times:
        print(f"{k}: {med[k] * 1e3:.0f} ms; {low[k] * 1e3:.0f} ms")
    for n in names.values():
        for w in sweeps:
            print(f"{n}: (2F + three sweeps {w}) / 2F = {1 + med[f'sweeps {w}'] / (2 * med[f'F {n}']):.4f}; "
                  f"{1 + low[f'sweeps {w}'] / (2 * low[f'F {n}']):.4f}")
        print(f"{n}: S/(2F) = {med[f'S {n}'] / (2 * med[f'F {n}']):.4f}; {low[f'S {n}'] / (2 * low[f'F {n}']):.4f}; "
              f"S/own = {statistics.median(own[n]):.4f}")


if __name__ == "__main__":
    main()
