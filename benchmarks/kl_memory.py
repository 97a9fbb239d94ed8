"""Peak memory of ``completion_kl`` (the exact per-token KL of an evaluation's completions to the starting
model) against how many (prompt, completion) pairs a forward pass reads: each size in a fresh process.

    HF_HUB_OFFLINE=1 python benchmarks/kl_memory.py --samples RUN/samples/test-after.jsonl --batch-sizes 64,8

``--samples``: a JSONL of ``prompt_text`` (or plain-text ``prompt``) and ``completion`` lines, e.g. a study
cell's test completions. Prints each size's rise of the process's peak RSS over its peak before the call,
and the ratio to the first size's.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys


def measure(model: str, samples: str, n: int, batch_size: int, autocast: str) -> float:
    import torch

    from mezo_rl.model.loading import load_model
    from mezo_rl.training.kl import StartingPoint, completion_kl
    from mezo_rl.training.outputs import autocast as autocast_context

    rows = [json.loads(line) for line in open(samples, encoding="utf-8") if line.strip()][:n]
    lm = load_model(model)
    start = StartingPoint(lm.model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in lm.model.parameters():  # a policy near the start (a run's first steps)
            p.add_(1e-3 * torch.randn(p.shape, generator=g))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with torch.no_grad(), autocast_context(autocast, lm.device.type):
        completion_kl(lm, start, [r.get("prompt_text", r["prompt"]) for r in rows], [r["completion"] for r in rows],
                      batch_size=batch_size)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", required=True)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--n", type=int, default=64, help="pairs scored")
    p.add_argument("--batch-sizes", default="64,8")
    p.add_argument("--autocast", default="auto", choices=["auto", "none", "bfloat16"])
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child process: one size
    a = p.parse_args(argv)
    if a.one is not None:
        print(measure(a.model, a.samples, a.n, a.one, a.autocast))
        return 0
    rises = {}
    for b in (int(x) for x in a.batch_sizes.split(",")):
        out = subprocess.run([sys.executable, __file__, "--samples", a.samples, "--model", a.model, "--n", str(a.n),
                              "--autocast", a.autocast, "--one", str(b)], capture_output=True, text=True, check=True)
        rises[b] = float(out.stdout.strip().splitlines()[-1])
    first = next(iter(rises.values()))
    for b, rise in rises.items():
        print(f"{b:4d} pairs a pass: peak RSS +{rise:.0f} MiB ({rise / first:.2f}x the first)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
