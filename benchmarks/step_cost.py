"""What a MeZO step costs compared with a forward pass, on SmolLM2-135M (one process).

    flock /tmp/mezo-cpu.lock python benchmarks/step_cost.py [--dtypes float32 bfloat16]
        [--noise-backend auto|compiled|torch] [--noise gaussian|rademacher] [--reps 7] [--json out.json]

For each dtype: F = median time of one forward pass of the plain model under torch.no_grad()
(batch 16, sequence 64, random token ids, next-token cross-entropy computed from the logits),
S = median time of one ``MeZO.step`` whose closure is that forward pass (dtypes: float32; bfloat16
weights; autocast = float32 master weights with a bfloat16-autocast forward, the remedy for bf16 drift), and S / (2F): how much a
step costs beyond its two forward passes. Also: the median time of one noise sweep over all
parameters (the overhead a step adds is about three sweeps), for the chosen backend and for the
plain torch generator. Peak memory is measured separately, one process per mode:
benchmarks/memory_run.py.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.nn.functional as F

from mezo_rl import noise as mezo_noise
from mezo_rl.models import load_model
from mezo_rl.optim import MeZO


def batch(vocab: int, bsz: int = 16, seq: int = 64) -> torch.Tensor:
    return torch.randint(0, vocab, (bsz, seq), generator=torch.Generator().manual_seed(0))


def make_loss(model, ids, autocast: bool = False):
    def loss():
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=ids).logits
            return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    return loss


def median_time(fn, reps: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def measure(dtype: str, backend: str, kind: str, reps: int) -> dict:
    autocast = dtype == "autocast"  # float32 master weights, bfloat16 compute
    lm = load_model("smollm2-135m", dtype="float32" if autocast else dtype)
    model = lm.model
    ids = batch(model.config.vocab_size)
    loss = make_loss(model, ids, autocast)
    opt = MeZO(model.parameters(), lr=1e-7, eps=1e-3, noise=kind, noise_backend=backend, record=False)
    loss()
    opt.step(loss)  # warm-up: first forward, compiles the noise kernels if needed
    entries = opt._prepare()
    out = {"dtype": dtype, "noise": kind, "backend": opt.noise_backend,
           "params": sum(p.numel() for p in model.parameters()), "threads": torch.get_num_threads()}
    # interleave forward and step measurements so background load hits both alike
    fwd, step = [], []
    for _ in range(reps):
        fwd.append(median_time(loss, 1)[0])
        step.append(median_time(lambda: opt.step(loss), 1)[0])
    out["F"], out["S"] = statistics.median(fwd), statistics.median(step)
    out["S/2F"] = out["S"] / (2 * out["F"])
    out["F_all"], out["S_all"] = fwd, step
    seeds = iter(range(10**6))
    for name in sorted({opt.noise_backend, "torch"}):
        saved, opt._backend = opt._backend, name
        if name == "compiled":
            mezo_noise.axpy_(torch.zeros(8, dtype=model.dtype), 0, kind, name, a=0.0)
        with torch.no_grad():
            out[f"sweep_{name}"] = median_time(lambda: opt._sweep(entries, next(seeds), 0.0), max(3, reps // 2))[0]
        opt._backend = saved
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "autocast"],
                    help="float32, bfloat16 (bf16 weights), autocast (fp32 weights, bf16 autocast forward)")
    ap.add_argument("--noise-backend", default="auto", choices=mezo_noise.BACKENDS)
    ap.add_argument("--noise", default="gaussian", choices=mezo_noise.KINDS)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    results = []
    for dtype in args.dtypes:
        r = measure(dtype, args.noise_backend, args.noise, args.reps)
        results.append(r)
        sweeps = "  ".join(f"{k}={v * 1e3:.0f}ms" for k, v in r.items() if k.startswith("sweep_"))
        print(f"{dtype:9s} noise={r['noise']} backend={r['backend']} threads={r['threads']}: "
              f"F={r['F'] * 1e3:.0f}ms  S={r['S'] * 1e3:.0f}ms  S/(2F)={r['S/2F']:.3f}  sweep: {sweeps}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
