"""What a MeZO step with a generation-based reward costs compared with two batched greedy decodes,
on SmolLM2-135M (one process, so every ratio is within one run).

    flock /tmp/mezo-heavy.lock python benchmarks/generation_step.py [--reps 5] [--batch 16] \\
        [--max-new-tokens 16] [--modes full prefix] [--threads 2] [--json out.json]
    flock /tmp/mezo-heavy.lock python benchmarks/generation_step.py --population [--reps 3]
    flock /tmp/mezo-heavy.lock python benchmarks/generation_step.py --memory

``--population``: the batched member evaluation (``MeZO(member_evaluation="batched")``, docs/engine.md)
against the in-place step, full-parameter MeZO with the default low-rank noise, greedy decoding, on
two workloads: RL-style prompts (16 short instructions, 32 new tokens, no stop at a newline) and
SQuAD (the first 16 questions, 16 new tokens, stop at a newline, squad_f1), each with 1 and 2 SPSA
samples (M = 2 and 4 members). Per row: D, one decode of the 16 prompts at the current weights;
S_inplace, an in-place step (2n sequential decodes of 16 rows, the sweeps between them); S_batched,
a batched step (one decode of 2n x 16 rows, member-major, plus the update); P, plain inference on
the batched step's rows (2n copies of the prompts in one batch: what batching alone gains). It prints
``population-batched step / two sequential decodes: X.XX``, that is S_batched / (2n D): the batched
step over the decodes the in-place step makes (two per SPSA sample), and S_batched / S_inplace.

``--plain``: the population's decode against plain inference on the same rows. For each workload (the
RL example's prompts: ``"Movie review: "`` + the first 6 words of SST-2 training sentences, 24 new
tokens, no stop at a newline; SQuAD's: paper prompts, 16 new tokens, stop at a newline), each mode
(``full``: every weight, low-rank noise; ``lora``: the adapter, Gaussian noise; ``norm``: the final
norm's gains, Rademacher noise; the mode's defaults otherwise) and M = 2, 4, 8 members (two-point, M/2
SPSA samples), greedy: P = ``lm.generate`` on M copies of the B prompts in one batch at the
unperturbed weights; E = the batched member evaluation's decode of the same M x B rows (the closure of
a batched ``MeZO.step``, timed inside the step). Decode throughput = rows x decoding steps (the longest
completion, in tokens, of the call) / seconds. Prints, per row,
``population decode / plain inference, same rows: X.XX`` (E's throughput over P's; 1.00 = the
population costs nothing beyond its rows).

``--memory``: peak RSS (VmHWM, reset after loading) of one batched step with M members against plain
inference (``lm.generate``) on the same M x 16 rows, one process each.

The batch: the first ``--batch`` questions of a seed-0 sample of SQuAD's train split (paper
prompt, ``mezo_rl.tasks.get_task("squad")``), from $MEZO_RL_DATA. The reward: ``squad_f1`` (greedy
decoding, ``--max-new-tokens`` new tokens, stop at a newline), through the same path as training
(``mezo_rl.training.outputs.objective_outputs``: generate, then score the completions).

Per mode (``full``: every weight trainable; ``prefix``: the paper's prefix-tuning, 5 tokens):
  D   one batched greedy decode of the batch (``lm.generate``) at the current weights
  S   one ``MeZO.step`` (the mode's defaults from ``mezo_rl.training.defaults``) whose closure generates for
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
import pathlib
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from mezo_rl import tasks
from memory_run import status_kb  # benchmarks/ is on the path when run as a script
from mezo_rl.model.loading import load_model
from mezo_rl.engine.noise import NoiseSpec, layout, resolve_backend
from mezo_rl.engine.optim import BatchedMembers, MeZO
from mezo_rl.rewards.objective import example_columns
from mezo_rl.training.outputs import objective_outputs
from mezo_rl.training.defaults import MODE_DEFAULTS, mezo_options
from mezo_rl.model.peft import apply_peft
from mezo_rl.rewards import build_objective
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
        return objective_outputs(lm, objective, examples, max_new_tokens=args.max_new_tokens, stop=["\n"]).loss

    plain_generate, decodes = lm.generate, []  # decodes: (seconds, completions) of every lm.generate call

    def logged_generate(*a, **k):
        t = time.perf_counter()
        out = plain_generate(*a, **k)
        decodes.append((time.perf_counter() - t, out))
        return out

    lm.generate = logged_generate  # the closure's decodes are timed where they happen

    completions = plain_generate(prompts, max_new_tokens=args.max_new_tokens, stop=["\n"])
    spec = NoiseSpec(defaults["noise"], resolve_backend("auto", defaults["noise"]), layout=layout(enumerate(params)))

    def sweeps():  # +eps z then -eps z: two sweeps of every tensor, as a step makes them
        with torch.no_grad():
            for sign in (1.0, -1.0):
                spec.sweep_(list(enumerate(params)), 12345, [(sign * defaults["eps"], 0.0, 1.0)] * len(params))

    columns = example_columns(examples)

    def score():  # what the closure does after decoding: the reward on the completions
        objective.evaluate(prompts, completions=completions, columns=columns)

    parts = {"D": lambda: plain_generate(prompts, max_new_tokens=args.max_new_tokens, stop=["\n"]), "S": lambda: opt.step(closure),
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


# RL-style prompts: short instructions of the kind a policy is tuned on with a reward over its completion
RL_PROMPTS = [
    "Write a one-sentence review of a film you enjoyed.", "Give me a tip for sleeping better.",
    "Describe the sea in a few words.", "What is a good name for a grey cat?",
    "Explain what a rainbow is to a child.", "Write a friendly greeting for a new colleague.",
    "Suggest a quick vegetarian dinner.", "Why do leaves change colour in autumn?",
    "Write a short motivational sentence.", "Tell me a fun fact about octopuses.",
    "How do I keep basil alive indoors?", "Describe your perfect weekend.",
    "Write a haiku about coffee.", "What should I pack for a day hike?",
    "Give one reason to learn a second language.", "Summarise why exercise is healthy.",
]


def population(args) -> list[dict]:
    """Batched vs in-place steps on the two workloads, 1 and 2 SPSA samples, in one process."""
    lm = load_model("smollm2-135m")
    squad = tasks.get_task("squad").load_split("train", n=args.batch, seed=0)
    workloads = {
        "RL-style prompts": dict(prompts=RL_PROMPTS[: args.batch], max_new_tokens=32, stop=None),
        "SQuAD": dict(prompts=[e.prompt for e in squad], max_new_tokens=16, stop=["\n"]),
    }
    objective = build_objective("squad_f1")
    cols = example_columns(squad)
    params = [p for p in lm.model.parameters() if p.requires_grad]

    def reward_loss(prompts, texts):  # a cheap reward on the completions (squad_f1 against SQuAD's answers)
        return objective.evaluate(prompts, completions=texts, columns=cols).loss

    rows = []
    for name, w in workloads.items():
        if args.workloads and name.split()[0].lower() not in args.workloads:
            continue
        gen = dict(max_new_tokens=w["max_new_tokens"], stop=w["stop"])
        prompts = w["prompts"]
        for n in (1, 2):
            inplace = MeZO(params, lr=0.0, eps=1e-3, n_spsa=n, record=False, seed=0)
            batched = MeZO(params, lr=0.0, eps=1e-3, n_spsa=n, record=False, seed=0, member_evaluation=BatchedMembers(lm.model))
            lengths = []

            def closure_inplace():
                texts = lm.generate(prompts, **gen)
                return reward_loss(prompts, texts)

            def closure_batched(members):
                per_member = lm.generate(prompts, members=len(members), **gen)
                lengths.append(max(len(lm.tokenizer(t, add_special_tokens=False)["input_ids"]) for m in per_member for t in m))
                return [reward_loss(prompts, texts) for texts in per_member]

            def plain():  # inference on the batched step's rows: 2n copies of the prompts in one batch
                lm.batch_size = 2 * n * len(prompts)
                try:
                    with torch.no_grad():
                        lm.generate(prompts * (2 * n), **gen)
                finally:
                    lm.batch_size = len(prompts)

            parts = {"D": lambda: lm.generate(prompts, **gen), "P": plain, "S_inplace": lambda: inplace.step(closure_inplace),
                     "S_batched": lambda: batched.step(closure_batched)}
            parts["D"]()  # warm-up
            times = {k: [] for k in parts}
            for rep in range(args.reps):
                for k, fn in parts.items():
                    times[k].append(timed(fn))
                print(f"{name}, n_spsa={n} rep {rep + 1}: " + ", ".join(f"{k} {t[-1][0]:.2f} s" for k, t in times.items()),
                      flush=True)
            med = {k: tuple(statistics.median(x[i] for x in t) for i in (0, 1)) for k, t in times.items()}
            row = {"workload": name, "n_spsa": n, "members": 2 * n, "medians": med, "all": times,
                   "ratio": med["S_batched"][0] / (2 * n * med["D"][0]),
                   "ratio_cpu": med["S_batched"][1] / (2 * n * med["D"][1]),
                   "vs_inplace": med["S_batched"][0] / med["S_inplace"][0],
                   "inplace_ratio": med["S_inplace"][0] / (2 * n * med["D"][0]), "longest_completion": max(lengths),
                   "plain_ratio": med["P"][0] / (2 * n * med["D"][0]), "vs_plain": med["S_batched"][0] / med["P"][0],
                   "vs_plain_cpu": med["S_batched"][1] / med["P"][1]}
            rows.append(row)
            print(f"[{name}, n_spsa={n}, {2 * n} members] population-batched step / two sequential decodes: "
                  f"{row['ratio']:.2f}", flush=True)
    print(f"\nSmolLM2-135M fp32, full-parameter MeZO (low-rank r=1), greedy, batch {args.batch}, {args.threads} threads; "
          f"medians of {args.reps} (wall s; CPU ratios in brackets)")
    print("| workload | n_spsa | members | D | P | S in-place | S batched | S_batched / (2n D) | P / (2n D) | "
          "S_inplace / (2n D) | S_batched / S_inplace | S_batched / P |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        m = {k: v[0] for k, v in r["medians"].items()}
        print(f"| {r['workload']} | {r['n_spsa']} | {r['members']} | {m['D']:.2f} | {m['P']:.2f} | {m['S_inplace']:.2f} | "
              f"{m['S_batched']:.2f} | **{r['ratio']:.2f}** ({r['ratio_cpu']:.2f}) | {r['plain_ratio']:.2f} | "
              f"{r['inplace_ratio']:.2f} | {r['vs_inplace']:.2f} | {r['vs_plain']:.2f} ({r['vs_plain_cpu']:.2f}) |")
    return rows


def rl_example_prompts(n: int) -> list[str]:
    """The RL example's training prompts (examples/rl_sentiment.py): "Movie review: " + the first 6 words of
    SST-2 training sentences long enough to continue, duplicates dropped, shuffled with seed 0."""
    import random

    path = pathlib.Path(os.environ.get("MEZO_RL_DATA", "")) / "SST-2" / "LM-BFF-original" / "train.tsv"
    out = []
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        words = line.split("\t", 1)[0].split()
        if len(words) > 8:
            out.append(" ".join(words[:6]))
    out = list(dict.fromkeys(out))
    random.Random(0).shuffle(out)
    return ["Movie review: " + p for p in out[:n]]


def mode_model(mode: str):
    """SmolLM2-135M set up for ``mode`` and its optimizer options (mezo_rl.training.defaults)."""
    import re

    from mezo_rl.model.peft import FINAL_NORM

    lm = load_model("smollm2-135m")
    if mode == "lora":
        apply_peft(lm, "lora")
    elif mode == "norm":
        for name, p in lm.model.named_parameters():
            p.requires_grad_(re.search(FINAL_NORM, name) is not None)
    return lm, mezo_options(MODE_DEFAULTS[mode])


def plain_vs_population(args) -> list[dict]:
    """``--plain``: the batched member evaluation's decode throughput over lm.generate's on the same rows."""
    squad = tasks.get_task("squad").load_split("train", n=args.squad_batch, seed=0)
    workloads = {
        "RL example": dict(prompts=rl_example_prompts(args.batch), max_new_tokens=24, stop=None),
        "SQuAD": dict(prompts=[e.prompt for e in squad], max_new_tokens=16, stop=["\n"]),
    }
    rows = []
    for mode in args.modes_plain:
        lm, options = mode_model(mode)
        params = [p for p in lm.model.parameters() if p.requires_grad]
        ntok = lambda texts: max(len(lm.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)  # noqa: E731
        for name, w in workloads.items():
            if args.workloads and name.split()[0].lower() not in args.workloads:
                continue
            gen = dict(max_new_tokens=w["max_new_tokens"], stop=w["stop"])
            prompts = w["prompts"]
            for M in args.members:
                opt = MeZO(params, record=False, seed=0, member_evaluation=BatchedMembers(lm.model),
                           **{**options, "lr": 0.0, "n_spsa": M // 2})
                inside = []  # (seconds, longest completion) of the closure's decode

                def closure(members):
                    t = time.perf_counter()
                    per_member = lm.generate(prompts, members=len(members), **gen)
                    inside.append((time.perf_counter() - t, max(ntok(texts) for texts in per_member)))
                    return [0.0] * len(members)

                def plain():
                    with lm.batches_of(M * len(prompts)), torch.no_grad():
                        t = time.perf_counter()
                        texts = lm.generate(prompts * M, **gen)
                        return time.perf_counter() - t, ntok(texts)

                if M == args.members[0]:
                    with lm.batches_of(len(prompts)):
                        opt.step(closure)  # warm-up
                P, E = [], []
                for rep in range(args.reps):
                    P.append(plain())
                    inside.clear()
                    with lm.batches_of(len(prompts)):
                        opt.step(closure)
                    E.append(inside[-1])
                rate = lambda runs: statistics.median(M * len(prompts) * n / s for s, n in runs)  # noqa: E731
                row = {"mode": mode, "workload": name, "members": M, "rows": M * len(prompts), "P": P, "E": E,
                       "plain_tokens_per_s": rate(P), "population_tokens_per_s": rate(E)}
                row["ratio"] = row["population_tokens_per_s"] / row["plain_tokens_per_s"]
                rows.append(row)
                print(f"[{mode}, {name}, M={M}, {M * len(prompts)} rows] plain {row['plain_tokens_per_s']:.0f} tok/s, "
                      f"population {row['population_tokens_per_s']:.0f} tok/s; "
                      f"population decode / plain inference, same rows: {row['ratio']:.2f}", flush=True)
        del lm, params
    print(f"\nSmolLM2-135M fp32, greedy, B = {args.batch} RL prompts / {args.squad_batch} SQuAD questions x M members, "
          f"{args.threads} threads; medians of "
          f"{args.reps}; decode throughput in rows x decoding steps per second")
    print("| mode | workload | M | rows | plain inference tok/s | population tok/s | population / plain |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['workload']} | {r['members']} | {r['rows']} | {r['plain_tokens_per_s']:.0f} | "
              f"{r['population_tokens_per_s']:.0f} | **{r['ratio']:.2f}** |")
    return rows


def memory_child(mode: str, members: int, args) -> dict:
    """One process: peak RSS of a batched step with ``members`` members, or of inference on as many rows."""
    lm = load_model("smollm2-135m", batch_size=args.batch * (members if mode == "inference" else 1))
    prompts = RL_PROMPTS[: args.batch]
    gen = dict(max_new_tokens=32, stop=None)
    opt = MeZO(lm.model.parameters(), lr=0.0, eps=1e-3, n_spsa=members // 2, record=False, member_evaluation=BatchedMembers(lm.model)) if mode == "batched" else None
    after_load = status_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    for _ in range(2):
        if mode == "batched":
            opt.step(lambda ms: [float(len(t[0])) for t in lm.generate(prompts, members=len(ms), **gen)])
        else:
            with torch.no_grad():
                lm.generate(prompts * members, **gen)  # the same M x 16 rows in one batch (lm.batch_size: 16 x M)
    return {"mode": mode, "members": members, "after_load_mb": after_load / 1024, "peak_mb": status_kb("VmHWM") / 1024}


def memory(args) -> list[dict]:
    import subprocess
    import sys

    out = []
    for members in (2, 4):
        for mode in ("inference", "batched"):
            proc = subprocess.run([sys.executable, __file__, "--memory-child", mode, "--memory-members", str(members),
                                   "--threads", str(args.threads), "--batch", str(args.batch)],
                                  capture_output=True, text=True, check=True)
            out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(out[-1], flush=True)
    print("\n| members | rows | inference peak RSS (MB) | batched step peak RSS (MB) | ratio |")
    print("|---:|---:|---:|---:|---:|")
    for members in (2, 4):
        inf, bat = (next(r for r in out if r["members"] == members and r["mode"] == m) for m in ("inference", "batched"))
        print(f"| {members} | {members * args.batch} | {inf['peak_mb']:.0f} | {bat['peak_mb']:.0f} | {bat['peak_mb'] / inf['peak_mb']:.3f} |")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--modes", nargs="+", default=["full", "prefix"], choices=["full", "prefix"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--population", action="store_true", help="batched vs in-place steps (see above)")
    ap.add_argument("--memory", action="store_true", help="peak RSS: batched step vs inference on as many rows")
    ap.add_argument("--plain", action="store_true", help="population decode vs plain inference on the same rows")
    ap.add_argument("--modes-plain", nargs="+", default=["full", "lora", "norm"], choices=["full", "lora", "norm"],
                    help="--plain: the modes")
    ap.add_argument("--members", nargs="+", type=int, default=[2, 4, 8], help="--plain: member counts M (even)")
    ap.add_argument("--squad-batch", type=int, default=4, help="--plain: SQuAD questions (B of its rows)")
    ap.add_argument("--workloads", nargs="+", choices=["rl-style", "rl", "squad"],
                    help="--population / --plain: only these workloads (rl-style: --population's; rl: --plain's)")
    ap.add_argument("--memory-child", choices=["inference", "batched"], help=argparse.SUPPRESS)
    ap.add_argument("--memory-members", type=int, default=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_child:
        print(json.dumps(memory_child(args.memory_child, args.memory_members, args)))
        return
    if args.plain:
        result = {"plain": plain_vs_population(args)}
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), **result}, f, indent=1)
        return
    if args.population or args.memory:
        result = {"population": population(args)} if args.population else {}
        if args.memory:
            result["memory"] = memory(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), **result}, f, indent=1)
        return
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
