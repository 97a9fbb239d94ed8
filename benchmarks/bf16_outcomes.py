"""bf16 weights against float32 weights: held-out gain and memory of the same runs, one process each.

    MEZO_RL_DATA=DIR flock /tmp/mezo-heavy.lock python benchmarks/bf16_outcomes.py --out DIR [--task sst2|arithmetic] \\
        [--seeds 0 1 2] [--dtypes float32 bfloat16] [--record docs/results/bf16_outcomes_cpu.jsonl] [-- TRAIN OPTIONS]

Each (dtype, seed) is one run in a process of its own, with the rest of the options at their defaults (plus any
given after ``--``); a run whose directory already holds summary.json is read, not rerun (the study resumes):

- ``--task sst2``: ``mezo-rl train --task sst2 --peft full --dtype DTYPE --seed SEED --autocast none``. Then, in one
  more process per run, the weights the run tested (``load_run`` at summary.json's ``best_step``: the final step
  unless ``--load-best-model-at-end``) and the base model score the run's test examples (with the default
  ``--num-test``, every one of SST-2's, the same for every seed): a per-example gain (correct after minus before).
- ``--task arithmetic``: ``mezo-rl train --task arithmetic --dtype DTYPE --seed SEED --autocast none`` (the prompt
  task's defaults: full mode), keeping every test completion (``--log-completions``); the per-prompt gain is the
  ``exact_answer`` reward of the tested step's completion minus the base model's (the run's own step-0 test). Memory: the run's peak RSS minus the RSS of a process that has imported
what ``mezo-rl train`` imports, before any model loads (measured once, the same way for every dtype).

Each dtype's gain over the starting weights gets a paired bootstrap interval over test examples and seeds (against
zero: the gain is already per example). The comparison: bf16's gain minus float32's, a paired bootstrap over test examples and seeds
(``benchmarks/suite/bootstrap.py``: the same resample for both dtypes), and the ratio of their memory above the
baseline. One JSON line per run, one per dtype's gain and one for the comparison go to ``--record`` with the command, commit and CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

BASELINE = ("import resource, mezo_rl.cli.main, mezo_rl.training.trainer; "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")


def cpu() -> str:
    import torch
    with open("/proc/cpuinfo") as f:
        name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), platform.processor())
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return f"{name}, {os.cpu_count()} cores, native bf16: {'yes' if native else 'no'}"


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


def per_example(run_dir: str) -> None:
    """Print, as one JSON line, the test examples' correctness before (base model) and after (the tested step), each
    read through :func:`mezo_rl.training.evaluation.evaluate`, the path the run's own test took: the same calls, so
    the same padding and rounding (in bf16 a different grouping of the same examples flips a few near-ties)."""
    from mezo_rl.choices import parse_max_memory, weights_dtype
    from mezo_rl.tasks import get_task
    from mezo_rl.training.evaluation import evaluate
    from mezo_rl.training.rundir import load_run, read_args
    from mezo_rl.training.setup import build_model, load_splits

    args = read_args(run_dir)
    task = get_task("sst2")
    examples = load_splits(task, "sst2", {"test": args.num_test}, args.data_dir, args.seed)["test"]
    out = {}
    tested = json.load(open(os.path.join(run_dir, "summary.json")))["best_step"]  # the step the run tested
    for when in ("before", "after"):
        if when == "after":
            lm, _, step = load_run(run_dir, tested)
            out["step"] = step
        else:
            lm = build_model(args, dtype=weights_dtype(args.dtype, args.autocast),  # the dtype the run's options give
                             max_memory=parse_max_memory(args.max_memory))
        values = []  # in evaluate's order, which follows from the examples alone: the same for both and every run
        evaluate(lm, task, examples, batch_size=args.eval_batch_size, metrics=["accuracy"],
                 on_batch=lambda batch, outputs, v: values.extend(float(x) for x in v["accuracy"]))
        out[when] = values
        del lm
    print(json.dumps(out))


def completion_outcomes(run_dir: str, tested: int) -> dict:
    """A prompt task's per-prompt ``exact_answer`` before (the run's step-0 test) and at the tested step, in the
    order the run evaluated its test prompts (the same for both: one split, one order)."""
    from mezo_rl.training.rundir import read_samples

    before, after = read_samples(run_dir, "test", 0), read_samples(run_dir, "test", tested)
    if not before or len(before) != len(after) or any(a["prompt"] != b["prompt"] for a, b in zip(after, before)):
        raise SystemExit(f"{run_dir}: the test completions of step 0 and step {tested} do not pair")
    return {"step": tested, "before": [float(x["exact_answer"]) for x in before],
            "after": [float(x["exact_answer"]) for x in after]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--task", default="sst2", choices=["sst2", "arithmetic"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    ap.add_argument("--record", default=None)
    ap.add_argument("--per-example", default=None, help=argparse.SUPPRESS)  # one run's scoring, in its own process
    args, extra = ap.parse_known_args()
    extra = [a for a in extra if a != "--"]
    if args.per_example:
        per_example(args.per_example)
        return
    from suite.bootstrap import paired_bootstrap
    from mezo_rl.training.rundir import read_args

    exe = [sys.executable, "-m", "mezo_rl"]
    baseline = float(subprocess.run([sys.executable, "-c", BASELINE], capture_output=True, text=True, check=True).stdout)
    here = dict(commit=commit(), cpu=cpu(), omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
                baseline_rss_mib=round(baseline, 1))
    runs = {}
    for seed in args.seeds:  # seed-major: each seed's pair is complete before the next seed starts
        for dtype in args.dtypes:
            out = os.path.join(args.out, f"{dtype}-s{seed}")
            task = ["--task", "sst2", "--peft", "full"] if args.task == "sst2" else \
                ["--task", "arithmetic", "--log-completions", "100000"]
            cmd = [*exe, "train", *task, "--dtype", dtype, "--seed", str(seed),
                   "--autocast", "none", "--no-progress", *extra, "--output-dir", out]
            if not os.path.isfile(os.path.join(out, "summary.json")):
                subprocess.run([*cmd, "--overwrite-output-dir"], check=True)
            summary = json.load(open(os.path.join(out, "summary.json")))
            if args.task == "sst2":
                scored = subprocess.run([sys.executable, __file__, "--out", args.out, "--per-example", out],
                                        capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
                ex = json.loads(scored)
            else:
                ex = completion_outcomes(out, summary["best_step"])
            gain = [a - b for a, b in zip(ex["after"], ex["before"])]
            rec = dict(kind="run", task=args.task, model=read_args(out).model, command=" ".join(["mezo-rl", *cmd[3:]]), dtype=dtype, seed=seed, n=len(gain),
                       best_step=summary["best_step"], test_before=sum(ex["before"]) / len(gain),
                       test_after=sum(ex["after"]) / len(gain), gain=sum(gain) / len(gain),
                       peak_rss_mib=summary["peak_rss_mb"], above_baseline_mib=round(summary["peak_rss_mb"] - baseline, 1),
                       wall_time_s=round(summary["wall_time_s"], 1), update_kept=summary.get("update_kept"),
                       summary_test=summary["test"], **here)
            runs[(dtype, seed)] = (rec, gain)
            print(json.dumps(rec), flush=True)
            if args.record:
                with open(args.record, "a") as f:
                    f.write(json.dumps({**rec, "outcomes": gain}) + "\n")
    for dtype in args.dtypes:  # each dtype's gain over the starting weights, the same bootstrap against zero
        gains = [runs[(dtype, s)][1] for s in args.seeds]
        iv = paired_bootstrap(gains, [[0.0] * len(g) for g in gains])
        rec = dict(kind="gain", task=args.task, model=runs[(dtype, args.seeds[0])][0]["model"], dtype=dtype,
                   what=f"{dtype} weights' test gain over the starting weights", seeds=args.seeds, n=len(gains[0]),
                   gain=iv.diff, lo=iv.lo, hi=iv.hi, se=iv.se, **here)
        print(json.dumps(rec), flush=True)
        if args.record:
            with open(args.record, "a") as f:
                f.write(json.dumps(rec) + "\n")
    if set(args.dtypes) == {"float32", "bfloat16"}:
        low = [runs[("bfloat16", s)][1] for s in args.seeds]
        ref = [runs[("float32", s)][1] for s in args.seeds]
        iv = paired_bootstrap(low, ref)
        mem = lambda d: sum(runs[(d, s)][0]["above_baseline_mib"] for s in args.seeds) / len(args.seeds)  # noqa: E731
        rec = dict(kind="comparison", task=args.task, what="bf16 gain minus float32 gain", seeds=args.seeds, n=len(low[0]),
                   diff=iv.diff, lo=iv.lo, hi=iv.hi, se=iv.se,
                   gain_float32=sum(map(sum, ref)) / sum(map(len, ref)), gain_bfloat16=sum(map(sum, low)) / sum(map(len, low)),
                   memory_ratio=mem("bfloat16") / mem("float32"), **here)
        print(json.dumps(rec), flush=True)
        if args.record:
            with open(args.record, "a") as f:
                f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
