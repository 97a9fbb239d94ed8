"""How far MeZO's perturb/restore round trips move the weights when nothing should move (lr = 0).

    flock /tmp/mezo-heavy.lock python benchmarks/engine_drift.py [--steps 1000] [--layers 2] [--json out.json]

Each step at lr = 0 is theta + eps z, then - 2 eps z, then + eps z (fused restore with a zero
update): in exact arithmetic a no-op. In floating point each sweep rounds. For each mode this runs
``--steps`` steps on real weights (the first ``--layers`` decoder layers of SmolLM2-135M, as
dequantised from its Q4_1 GGUF, i.e. with few significant bits) and on random N(0, 0.02^2) float32
weights of the same size (full 24-bit mantissas), and reports the drift from the start:
max |delta|, RMS delta, max |delta| / (|theta| + 1e-3), and the fraction of weights that changed.
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from mezo_rl.engine.optim import MeZO

MODES = [  # (name, noise, eps, dtype)
    ("gaussian eps=1e-3", "gaussian", 1e-3, torch.float32),
    ("rademacher eps=1e-3", "rademacher", 1e-3, torch.float32),
    ("rademacher eps=2^-10 (exact mode)", "rademacher", 2**-10, torch.float32),
]  # bf16 / fp16 weights are never perturbed in place (MeZO refuses it): benchmarks/bf16_weights.py measures them


def drift(initial: list[torch.Tensor], final: list[torch.Tensor]) -> dict:
    d = torch.cat([(f.float() - i.float()).reshape(-1) for i, f in zip(initial, final)])
    base = torch.cat([i.float().reshape(-1) for i in initial])
    return {"max_abs": d.abs().max().item(), "rms": d.pow(2).mean().sqrt().item(),
            "max_rel": (d.abs() / (base.abs() + 1e-3)).max().item(), "frac_changed": (d != 0).float().mean().item()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--noise-backend", default="auto")
    ap.add_argument("--json")
    args = ap.parse_args()
    from mezo_rl.model.loading import load_model

    model = load_model("smollm2-135m").model
    real = [p.detach().clone() for layer in model.model.layers[: args.layers] for p in layer.parameters()]
    del model
    n = sum(p.numel() for p in real)
    g = torch.Generator().manual_seed(0)
    rand = [torch.randn(p.shape, generator=g) * 0.02 for p in real]
    print(f"{n:,} weights ({args.layers} SmolLM2 layers) / the same shapes of N(0, 0.02^2); {args.steps} steps at lr=0")
    results = []
    for source, weights in (("smollm2", real), ("random", rand)):
        for name, kind, eps, dtype in MODES:
            initial = [w.to(dtype) for w in weights]
            params = [w.clone().requires_grad_() for w in initial]
            opt = MeZO(params, lr=0.0, eps=eps, noise=kind, noise_backend=args.noise_backend, record=False)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                opt.step(lambda: 0.0)
            r = dict(source=source, mode=name, dtype=str(dtype).removeprefix("torch."), steps=args.steps,
                     backend=opt.noise_backend, seconds=time.perf_counter() - t0, **drift(initial, params))
            results.append(r)
            print(f"{source:8s} {r['dtype']:8s} {name:34s} max|d|={r['max_abs']:.3g}  rms={r['rms']:.3g}  "
                  f"max rel={r['max_rel']:.3g}  changed={100 * r['frac_changed']:.2f}%  ({r['seconds']:.0f}s)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
