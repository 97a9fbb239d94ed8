"""What a MeZO step with a generation-based reward costs compared with two batched greedy decodes,
on SmolLM2-135M (one process, so every ratio is within one run).

    flock /tmp/mezo-heavy.lock python benchmarks/generation_step.py [--reps 5] [--batch 16] \\
        [--max-new-tokens 16] [--modes full prefix] [--threads 2] [--json out.json]

The batch: the first ``--batch`` questions of a seed-0 sample of SQuAD's train split (paper
prompt, ``tasks.get_task("squad")``), from $MEZO_RL_DATA. The reward: ``squad_f1`` (greedy
decoding, ``--max-new-tokens`` new tokens, stop at a newline), through the same path as training
(``mezo_rl.outputs.objective_outputs``: generate, then score the completions).

Per mode (``full``: every weight trainable; ``prefix``: the paper's prefix-tuning, 5 tokens):
  D   one batched greedy decode of the batch (``lm.generate``) at the current weights
  S   one ``MeZO.step`` (the mode's defaults from ``mezo_rl.defaults``) whose closure generates for
      the batch and returns the squad_f1 loss, i.e. two decodes at +eps and -eps plus the sweeps
  and S / (2D). Where the step's time goes: its two decodes (at +eps and -eps, timed inside the
  step; their length may differ from D's, since a decode stops when every row has hit a newline
  or EOS, so the longest completion of each is reported), the noise sweeps (``sweep``: one pass
  of the mode's noise over its trainable tensors, timed alone as +eps and -eps and halved; a step
  does three), the reward
  (``objective``: scoring the decoded completions, timed alone; twice a step), and the
  remainder S - decodes - 3 sweep - 2 objective.
Reps interleave D, S and the parts, medians reported (wall and process CPU time).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

import tasks
from mezo_rl.models import load_model
from mezo_rl.noise import NoiseSpec, resolve_backend
from mezo_rl.optim import MeZO
from mezo_rl.outputs import example_columns, objective_outputs
from mezo_rl.defaults import MODE_DEFAULTS, mezo_options
from mezo_rl.peft import apply_peft
from rewards import build_objective
from step_cost import timed  # (wall, process CPU) seconds of one call


def measure(mode: str, examples, args) -> dict:
    lm = load_model("smollm2-135m")
    if mode == "prefix":
        apply_peft(lm, "prefix")
    params = [p for p in lm.model.parameters() if p.requires_grad]
    defaults = mezo_options(MODE_DEFAULTS["prefix" if mode == "prefix" else "full"])
    opt = MeZO(params, record=False, seed=0, **defaults)
    objective = build_objective("squad_f1")
    prompts = [e.prompt for e in examples]

    def closure():
        return objective_outputs(lm, objective, examples, max_new_tokens=args.max_new_tokens).loss

    plain_generate, decodes = lm.generate, []  # decodes: (seconds, completions) of every lm.generate call

    def logged_generate(*a, **k):
        t = time.perf_counter()
        out = plain_generate(*a, **k)
        decodes.append((time.perf_counter() - t, out))
        return out

    lm.generate = logged_generate  # the closure's decodes are timed where they happen

    completions = plain_generate(prompts, max_new_tokens=args.max_new_tokens)
    spec = NoiseSpec(defaults["noise"], resolve_backend("auto", defaults["noise"]))

    def sweeps():  # +eps z then -eps z (a = 0 would let BLAS skip the low-rank gemm): two sweeps
        with torch.no_grad():
            for sign in (1.0, -1.0):
                for i, p in enumerate(params):
                    spec.axpy_(p, 12345, i, a=sign * defaults["eps"])

    columns = example_columns(examples)

    def score():  # what the closure does after decoding: the reward on the completions
        objective.evaluate(prompts, completions=completions, columns=columns)

    parts = {"D": lambda: plain_generate(prompts, max_new_tokens=args.max_new_tokens), "S": lambda: opt.step(closure),
             "sweep": sweeps, "objective": score}
    for name, fn in parts.items():  # warm-up (compiles the noise kernel where the noise needs one)
        fn()
    times = {name: [] for name in parts}
    inside = []  # per S: (seconds of its two decodes, longest completion in tokens of each)
    ntok = lambda texts: max(len(lm.tokenizer(c, add_special_tokens=False)["input_ids"]) for c in texts)
    for rep in range(args.reps):
        for name, fn in parts.items():
            decodes.clear()
            times[name].append(timed(fn))
            if name == "S":
                inside.append((sum(d[0] for d in decodes), [ntok(d[1]) for d in decodes]))
        print(f"{mode} rep {rep + 1}: " + ", ".join(f"{n} {t[-1][0] * 1e3:.0f} ms" for n, t in times.items())
              + f", decodes inside S {inside[-1][0] * 1e3:.0f} ms (longest {inside[-1][1]} tokens)", flush=True)
    med = {n: tuple(statistics.median(x[i] for x in t) for i in (0, 1)) for n, t in times.items()}
    med["sweep"] = tuple(v / 2 for v in med["sweep"])  # timed as two sweeps
    lengths = [len(lm.tokenizer(c, add_special_tokens=False)["input_ids"]) for c in completions]
    lm.generate = plain_generate
    return {"mode": mode, "decodes_in_S": statistics.median(d[0] for d in inside), "decode_lengths_in_S": [d[1] for d in inside],
            "D_length": ntok(completions), "trainable": sum(p.numel() for p in params), "noise": defaults["noise"],
            "backend": spec.backend, "medians": med, "all": times, "S/2D": med["S"][0] / (2 * med["D"][0]),
            "S/2D_cpu": med["S"][1] / (2 * med["D"][1]), "completion_tokens": lengths}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--modes", nargs="+", default=["full", "prefix"], choices=["full", "prefix"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    examples = tasks.get_task("squad").load_split("train", n=args.batch, seed=0)
    rows = [measure(mode, examples, args) for mode in args.modes]
    print(f"\nbatch {args.batch}, greedy, {args.max_new_tokens} new tokens, squad_f1; medians of {args.reps} (wall ms)")
    print("| mode | trainable | noise | D | S | S/(2D) | S/(2D) CPU | decodes in S | sweep | objective | S - decodes - 3 sweep - 2 objective |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        m = {k: v[0] * 1e3 for k, v in r["medians"].items()}
        dec = r["decodes_in_S"] * 1e3
        rest = m["S"] - dec - 3 * m["sweep"] - 2 * m["objective"]
        print(f"| {r['mode']} | {r['trainable']:,} | {r['noise']} / {r['backend']} | {m['D']:.0f} | {m['S']:.0f} | "
              f"{r['S/2D']:.3f} | {r['S/2D_cpu']:.3f} | {dec:.0f} | {m['sweep']:.0f} | {m['objective']:.1f} | {rest:.0f} |")
    for r in rows:
        print(f"{r['mode']}: longest completion at the current weights {r['D_length']} tokens; inside S (+eps, -eps) "
              f"{r['decode_lengths_in_S']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
