"""Peak memory (RSS) of MeZO vs inference vs backprop AdamW on SmolLM2-135M, one process per mode.

    flock /tmp/mezo-heavy.lock python benchmarks/memory_run.py [--steps 3] [--dtype float32] [--modes ...]
    python benchmarks/memory_run.py --mode mezo     # one mode in this process (what the driver runs)

Modes (batch 16, sequence 64, random token ids, next-token cross-entropy from the logits):
  inference    two forward passes per step under torch.no_grad()
  mezo-<row>   one optimizer step per step, <row> one of benchmarks/step_cost.py's rows:
               default (MeZO() defaults), gaussian (compiled), gaussian-torch (torch.Generator, no
               compiler in the process), rademacher (compiled), lowrank1, lowrank4, reference
               (Algorithm 1 written as the MeZO reference implementation writes it)
  adamw        forward + backward + torch.optim.AdamW step

Reported per mode: RSS after loading the model, the peak RSS of the run phase (Linux VmHWM, reset
after loading by writing 5 to /proc/self/clear_refs, so a transient peak while loading does not
hide the difference), and the lifetime peak (ru_maxrss).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from step_cost import ROWS, make_optimizer

MODES = ("inference", *(f"mezo-{row}" for row in ROWS), "adamw")


def status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def run_mode(mode: str, steps: int, dtype: str) -> dict:
    import torch
    import torch.nn.functional as F

    from mezo_rl.model.loading import load_model

    model = load_model("smollm2-135m", dtype=dtype).model
    ids = torch.randint(0, model.config.vocab_size, (16, 64), generator=torch.Generator().manual_seed(0))

    def loss():
        logits = model(input_ids=ids).logits
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())

    after_load = status_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    if mode == "inference":
        for _ in range(2 * steps):
            with torch.no_grad():
                loss()
    elif mode.startswith("mezo-"):
        opt = make_optimizer(mode.removeprefix("mezo-"), list(model.parameters()))
        for _ in range(steps):
            opt.step(loss)
    elif mode == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        for _ in range(steps):
            loss().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    else:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return {"mode": mode, "dtype": dtype, "steps": steps, "rss_after_load_mb": after_load / 1024,
            "peak_run_mb": status_kb("VmHWM") / 1024,
            "peak_lifetime_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=MODES, help="run one mode in this process and print its JSON")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, help="modes of the driver (inference first)")
    ap.add_argument("--json", help="write all results here")
    args = ap.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.steps, args.dtype)))
        return
    results = []
    modes = ["inference", *(m for m in args.modes if m != "inference")]
    for mode in modes:
        out = subprocess.run([sys.executable, __file__, "--mode", mode, "--steps", str(args.steps), "--dtype", args.dtype],
                             check=True, capture_output=True, text=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
        r = results[-1]
        print(f"{mode:11s} after load {r['rss_after_load_mb']:7.0f} MB   peak (run) {r['peak_run_mb']:7.0f} MB   "
              f"peak (lifetime) {r['peak_lifetime_mb']:7.0f} MB", flush=True)
    base = results[0]["peak_run_mb"]
    for r in results[1:]:
        print(f"{r['mode']:11s} / inference (run peak): {r['peak_run_mb'] / base:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
