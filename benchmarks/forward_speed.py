"""Speed of the forward pass itself (nearly all of a MeZO step) on this CPU: attention kernel,
torch.compile, thread count and padding, on SmolLM2-135M scoring real SST-2 batches.

    flock /tmp/mezo-heavy.lock python benchmarks/forward_speed.py [--reps 5] [--batch 32] [--json out.json]

The work timed is what a training step's closure does for the default full/LoRA/prefix modes:
``LanguageModel.score`` of a batch of ``--batch`` SST-2 train prompts (paper prompt, seed-0
sample from $MEZO_RL_DATA) against both label words: the distinct sequences in length-sorted,
right-padded sub-batches of ``lm.batch_size`` (16), hidden states through the final norm, the
output head only at the scored positions. Rows (all in one process, interleaved per rep, medians;
the ratio is against ``sdpa`` in the same rep order):

  sdpa         the default: transformers' scaled_dot_product_attention, 2 threads
  eager        transformers' eager attention (matmul + softmax)
  threads1     sdpa with torch.set_num_threads(1) (is the second core worth having?)
  compiled     sdpa with the base model's forward wrapped in torch.compile(dynamic=True)
               (compile time reported separately, from the warm-up)
  sub-batch-8  sdpa with length-sorted sub-batches of 8 (lm.batch_size = 8): less padding, more calls
  one-batch    sdpa with every sequence in one sub-batch (lm.batch_size = --batch): fewer calls,
               more padding

Padding: for the default sub-batching, the fraction of computed token positions that are padding
(sum over sub-batches of rows x longest - real tokens, over rows x longest), and the same with one
sub-batch; a number, not a timing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from mezo_rl import tasks
from mezo_rl.model.loading import load_model
from mezo_rl.training.outputs import score_requests


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def padding_fraction(lm, prompts, candidates, sub: int) -> float:
    seqs = sorted({tuple(lm.encode(p, c)[0]) for p, cs in zip(prompts, candidates) for c in cs}, key=len)
    real = computed = 0
    for i in range(0, len(seqs), sub):
        chunk = seqs[i:i + sub]
        real += sum(len(s) for s in chunk)
        computed += len(chunk) * max(len(s) for s in chunk)
    return 1 - real / computed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    examples = tasks.get_task("sst2").load_split("train", n=args.batch, seed=0)
    lm = load_model("smollm2-135m")
    prompts, candidates, _ = score_requests(examples, lm.is_causal, False)
    base = lm.model.base_model          # the transformer below the output head (what score runs per batch)
    base_forward = base.forward
    compiled_forward = torch.compile(base_forward, dynamic=True)

    def run(attn="sdpa", threads=args.threads, compiled=False, sub=16):
        lm.model.set_attn_implementation(attn)
        torch.set_num_threads(threads)
        base.forward = compiled_forward if compiled else base_forward
        lm.batch_size = sub
        try:
            with torch.no_grad():
                lm.score(prompts, candidates)
        finally:
            base.forward, lm.batch_size = base_forward, 16
            lm.model.set_attn_implementation("sdpa")
            torch.set_num_threads(args.threads)

    rows = {"sdpa": {}, "eager": dict(attn="eager"), "threads1": dict(threads=1), "compiled": dict(compiled=True),
            "sub-batch-8": dict(sub=8), "one-batch": dict(sub=args.batch)}
    warm = {}
    for name, kw in rows.items():
        warm[name] = timed(lambda: run(**kw))
        print(f"warm-up {name}: {warm[name]:.1f}s", flush=True)
    # compiled: dynamic shapes may still recompile for new lengths; a second warm-up pass settles it
    warm["compiled (2nd)"] = timed(lambda: run(compiled=True))
    times = {name: [] for name in rows}
    for rep in range(args.reps):
        for name, kw in rows.items():
            times[name].append(timed(lambda: run(**kw)))
        print(f"rep {rep + 1}: " + ", ".join(f"{n} {t[-1] * 1e3:.0f} ms" for n, t in times.items()), flush=True)
    med = {n: statistics.median(t) for n, t in times.items()}
    pad = {"sub-batches of 8": padding_fraction(lm, prompts, candidates, 8),
           "sub-batches of 16": padding_fraction(lm, prompts, candidates, 16),
           f"one batch of {args.batch}": padding_fraction(lm, prompts, candidates, args.batch)}
    print(f"\nLanguageModel.score of {args.batch} SST-2 prompts x 2 label words, medians of {args.reps}")
    print("| row | ms | / sdpa | min ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    for n, t in times.items():
        print(f"| {n} | {med[n] * 1e3:.0f} | {med[n] / med['sdpa']:.3f} | {min(t) * 1e3:.0f} | {max(t) * 1e3:.0f} |")
    print("warm-up (s): " + ", ".join(f"{n} {w:.1f}" for n, w in warm.items()))
    print("padding (fraction of computed positions): " + ", ".join(f"{k} {v:.3f}" for k, v in pad.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "times": times, "medians": med, "warm": warm, "padding": pad}, f, indent=1)


if __name__ == "__main__":
    main()
