"""MeZO with bf16 weights: the batched member evaluation against fp32, and against the in-place mode.

    flock /tmp/mezo-heavy.lock python benchmarks/batched_bf16.py [--steps 30] [--out /tmp/bf16] [--threads 2]
        [--runs fp32_batched bf16_batched bf16_in-place] [--reuse]

Three runs of ``python -m mezo_rl train`` on SST-2, SmolLM2-135M, full-parameter MeZO (low-rank
r = 1 noise), cross-entropy, the same seed, batches and noise seeds: ``--dtype float32 --evaluation
batched`` (the reference), ``--dtype bfloat16 --evaluation batched`` (weights never perturbed in
place: only the updates round to bf16) and ``--dtype bfloat16 --evaluation inplace`` (three sweeps
per step, each rounding every perturbed weight to bf16). No autocast. Prints, per run, the validation
accuracy at every evaluation and the mean training cross-entropy (the mean of the step's member
losses) over the steps before it, and the median seconds per step.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

RUNS = {"fp32 batched": ("float32", "batched"), "bf16 batched": ("bfloat16", "batched"),
        "bf16 in-place": ("bfloat16", "inplace")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--eval-steps", type=int, default=10)
    ap.add_argument("--num-eval", type=int, default=128)
    ap.add_argument("--out", default="/tmp/mezo-bf16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--runs", nargs="+", choices=[n.replace(" ", "_") for n in RUNS],
                    help="only these runs (default: all three)")
    ap.add_argument("--reuse", action="store_true",
                    help="a run whose directory under --out already holds summary.json is read, not rerun")
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    curves = {}
    for name, (dtype, evaluation) in RUNS.items():
        out = os.path.join(args.out, name.replace(" ", "_"))
        if args.runs and name.replace(" ", "_") not in args.runs:
            continue
        cmd = [sys.executable, "-m", "mezo_rl", "train", "--model", args.model, "--task", "sst2", "--peft", "none", "--reward", "cross_entropy",
               "--dtype", dtype, "--autocast", "none", "--evaluation", evaluation, "--steps", str(args.steps),
               "--batch-size", "16", "--lr", "2e-4", "--eps", "1e-2", "--num-train", "256", "--num-eval", str(args.num_eval),
               "--num-test", "0", "--eval-steps", str(args.eval_steps), "--metric-for-best", "accuracy", "--seed", "0",
               "--no-progress", "--overwrite-output-dir", "--output-dir", out]
        print(" ".join(cmd[1:]), flush=True)
        if not (args.reuse and os.path.isfile(os.path.join(out, "summary.json"))):
            subprocess.run(cmd, check=True, env=env)
        records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
        curves[name] = {"validation": [(r["step"], r["metrics"]) for r in records if r.get("split") == "validation"],
                        "loss": [r["loss"] for r in records if "split" not in r],
                        "seconds": [r["seconds"] for r in records if "split" not in r]}
    evals = [s for s, _ in next(iter(curves.values()))["validation"]]
    w = args.eval_steps
    print("\n| run | " + " | ".join(f"step {s}" for s in evals) + " | s/step |")
    print("|---|" + "---:|" * (len(evals) + 1))
    for name, c in curves.items():
        cells = [f"{m['accuracy']:.3f}" + (f" / {sum(c['loss'][s - w:s]) / w:.4f}" if s else "") for s, m in c["validation"]]
        print(f"| {name} | " + " | ".join(cells) + f" | {sorted(c['seconds'])[len(c['seconds']) // 2]:.2f} |")
    print(f"(validation accuracy / mean training cross-entropy over the {w} steps before it)")
    with open(os.path.join(args.out, "curves.json"), "w") as f:
        json.dump(curves, f, indent=1)


if __name__ == "__main__":
    main()
