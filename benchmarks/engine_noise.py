"""Cost of one noise sweep ``p <- p + a z`` over one 28.3M-element fp32 tensor (SmolLM2's embedding
size), for each way of drawing z, and the quality of the Gaussian ones (one process).

    flock /tmp/mezo-heavy.lock python benchmarks/engine_noise.py [--threads 2] [--reps 7] [--json out.json]

Rows:
  memory only            p.mul_(1.0): the memory traffic every sweep pays
  torch.randn            torch.Generator normals, materialised then added (the "torch" backend)
  compiled gaussian      the engine's kernel: 3 rounds of a 32-bit multiply-xorshift hash, Box-Muller (cos only)
  candidate: 2 rounds    2 hash rounds (u1 and u2 from two halves of one 32-bit word is too few bits;
                         second word from one more round), Box-Muller (cos only)
  candidate: both BM     pairs of elements share one (u1, u2): r cos and r sin, hash rounds per pair
  candidate: BM halves   element i and i + n/2 share one (u1, u2): r cos to the first half, r sin to
                         the second (two contiguous stores instead of an interleaving stack)
  candidate: ndtri       inverse normal CDF of one 24-bit uniform (torch.special.ndtri), 2 hash rounds
  compiled rademacher    the engine's kernel: 2 hash rounds, the top bit as the sign
  lowrank r=1, r=4       z = B A^T / sqrt(r) on the 49152 x 576 matrix (NoiseSpec.axpy_: the sample's draw, then one broadcast _foreach_addcmul_ per factor column)

For every Gaussian generator: mean, variance, kurtosis of 2**22 draws and the Kolmogorov-Smirnov
statistic against N(0, 1) (scipy.stats.kstest; the 1e-6 critical value for n = 2**22 is ~1.3e-3).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch

from mezo_rl.engine import noise
from mezo_rl.engine.noise import hash_keys, mix32

SHAPE = (49152, 576)


def _u24(x):
    return ((x >> 8) & 0xFFFFFF).to(torch.float32)


def _two_rounds(flat, keys, a):
    i = torch.arange(flat.numel(), dtype=torch.int32, device=flat.device)
    w = mix32(i ^ keys[0])
    v = mix32(w ^ keys[1])
    u1 = (_u24(w) + 0.5) * 2.0**-24
    u2 = _u24(v) * 2.0**-24
    z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * math.pi) * u2)
    flat.add_(a * z)


def _both_box_muller(flat, keys, a):
    pairs = flat.view(-1, 2)  # numel must be even here
    i = torch.arange(pairs.shape[0], dtype=torch.int32, device=flat.device)
    w = mix32(mix32(i ^ keys[0]) ^ keys[1])
    v = mix32(w ^ keys[2])
    r = torch.sqrt(-2.0 * torch.log((_u24(w) + 0.5) * 2.0**-24))
    t = (2.0 * math.pi) * _u24(v) * 2.0**-24
    pairs.add_(a * torch.stack([r * torch.cos(t), r * torch.sin(t)], dim=-1))


def _both_halves(flat, keys, a):
    h = flat.numel() // 2  # (an odd last element would need one more draw; the benchmark tensor is even)
    i = torch.arange(h, dtype=torch.int32, device=flat.device)
    w = mix32(mix32(i ^ keys[0]) ^ keys[1])
    v = mix32(w ^ keys[2])
    r = a * torch.sqrt(-2.0 * torch.log((_u24(w) + 0.5) * 2.0**-24))
    t = (2.0 * math.pi) * _u24(v) * 2.0**-24
    flat[:h].add_(r * torch.cos(t))
    flat[h:2 * h].add_(r * torch.sin(t))


def _ndtri(flat, keys, a):
    i = torch.arange(flat.numel(), dtype=torch.int32, device=flat.device)
    w = mix32(mix32(i ^ keys[0]) ^ keys[1])
    u = (((w >> 9) & 0x7FFFFF).to(torch.float32) + 0.5) * 2.0**-23  # 23 bits: 1 - 2**-24 < 1 in float32
    flat.add_(a * torch.special.ndtri(u))


CANDIDATES = {"candidate: 2 rounds": _two_rounds, "candidate: both BM": _both_box_muller,
              "candidate: BM halves": _both_halves, "candidate: ndtri": _ndtri}


def median_ms(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def quality(z: torch.Tensor) -> dict:
    from scipy import stats

    z64 = z.double()
    m, v = z64.mean().item(), z64.var().item()
    kurt = ((z64 - m) ** 4).mean().item() / v**2
    return {"mean": m, "var": v, "kurtosis": kurt, "ks": float(stats.kstest(z64.numpy(), "norm").statistic)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    p = torch.zeros(SHAPE)
    flat = p.view(-1)
    keys = hash_keys(12345, p.device)
    rows = []
    seeds = iter(range(10**6))

    def add(name, fn, sample=None):
        fn()  # warm-up (compiles)
        row = {"name": name, "ms": median_ms(fn, args.reps)}
        if sample is not None:
            row.update(quality(sample()))
        rows.append(row)
        extra = "" if sample is None else "  mean {mean:+.1e} var {var:.5f} kurt {kurtosis:.4f} KS {ks:.2e}".format(**row)
        print(f"{name:22s} {row['ms']:8.1f} ms{extra}", flush=True)

    n_q = 2**22
    add("memory only", lambda: p.mul_(1.0))
    add("torch.randn", lambda: noise.axpy_(p, next(seeds), "gaussian", "torch", a=1e-3),
        lambda: noise.generate(7, n_q, "gaussian", "torch"))
    add("compiled gaussian", lambda: noise.axpy_(p, next(seeds), "gaussian", "compiled", a=1e-3),
        lambda: noise.generate(7, n_q, "gaussian", "compiled"))
    for name, kernel in CANDIDATES.items():
        compiled = torch.compile(kernel, dynamic=True, fullgraph=True)

        def sample(compiled=compiled):
            out = torch.zeros(n_q)
            compiled(out, keys, 1.0)
            return out

        add(name, lambda compiled=compiled: compiled(flat, keys, 1e-3), sample)
    add("compiled rademacher", lambda: noise.axpy_(p, next(seeds), "rademacher", "compiled", a=1e-3))
    for r in (1, 4):
        spec = noise.NoiseSpec("lowrank", "torch", rank=r, layout=noise.layout([(0, p)]))
        add(f"lowrank r={r}", lambda spec=spec: spec.axpy_(p, next(seeds), 0, a=1e-3))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "shape": SHAPE, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
