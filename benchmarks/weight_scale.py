"""The scale of a model's weight matrices, against which ``--eps`` and ``--learning-rate`` are absolute sizes.

    python benchmarks/weight_scale.py [--models smollm2-135m gemma3-270m] [--record docs/results/weight_scale.jsonl]

One JSON line per model: the RMS over all of its 2-D weights (the matrices full mode perturbs entry by entry, the
embedding included) and the smallest, median and largest RMS of one matrix. A perturbation of ``eps`` per entry (a
low-rank or Gaussian direction has entries of unit variance) moves a matrix by ``eps / RMS`` of its size, so the
same ``eps`` is a larger probe on a model with smaller weights.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def scale(model) -> dict:
    squares, count, per = 0.0, 0, []
    for p in model.parameters():
        if p.dim() == 2:
            x = p.detach().double()
            squares += float(x.pow(2).sum())
            count += x.numel()
            per.append(float(x.pow(2).mean().sqrt()))
    per.sort()
    return dict(matrices=len(per), rms=(squares / count) ** 0.5, matrix_rms_min=per[0],
                matrix_rms_median=per[len(per) // 2], matrix_rms_max=per[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--record", default=None)
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bf16_outcomes import commit, cpu
    from mezo_rl.model.loading import load_model

    for name in args.models:
        model = load_model(name).model  # the torch module of the LanguageModel
        rec = dict(kind="weights", model=name, **scale(model), command=f"python benchmarks/weight_scale.py --models {name}",
                   commit=commit(), cpu=cpu())
        print(json.dumps(rec), flush=True)
        if args.record:
            with open(args.record, "a") as f:
                f.write(json.dumps(rec) + "\n")
        del model


if __name__ == "__main__":
    main()
