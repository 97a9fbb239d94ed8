"""RL on prompts, measured: the sentiment example (examples/rl_sentiment.py) over seeds and settings,
and TRL's GRPO on the same model, prompts, reward, completions per prompt and training time.

    MEZO_RL_DATA=DIR HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \\
        python benchmarks/rl.py --variants mezo --seeds 0,1,2          # the example's defaults, 3 seeds
    python benchmarks/rl.py --variants grpo --seeds 0                  # GRPO with the training time of mezo seed 0
    python benchmarks/rl.py --variants mezo-g4-group,grpo-long --seeds 0   # sampled G=4 + group shaping, and GRPO
                                                                       # with that cell's (longer) training time
    python benchmarks/rl.py --variants shaping --seeds 0 --parallel 2  # the sampling / shaping comparison
    python benchmarks/rl.py --render-only                              # print the Markdown tables
    python benchmarks/rl.py --study arithmetic --cells mezo-norm-lr0.1,grpo-lora-lr1e-5   # issue 35's study (below)
    python benchmarks/rl.py --frontier arithmetic --stage grid     # issue 50: every grid cell on seed 0 (resumable)
    python benchmarks/rl.py --frontier arithmetic --stage seeds    # seeds 1, 2 of seed 0's validation frontier
    python benchmarks/rl.py --frontier sentiment-guard --stage grid   # sentiment with the example's repetition guard
    python benchmarks/rl.py --frontier arithmetic --stage untouched   # issue 70: the verdict pairs' cells again, each
                                                                      # seed reading the untouched split once
    python benchmarks/rl.py --frontier arithmetic --stage more-seeds  # seeds 3-4 of a pair within 3 SE
    python benchmarks/rl.py --frontier arithmetic-4x --stage grid    # the 4x-budget cells, every seed

Issue 70 (``benchmarks/suite/untouched.py``, ``bootstrap.py``, ``curves.py``): issue 50's test split is the
*development* split (the records' ``test`` fields); verdicts come from the untouched split, which every new run of a
task in ``UNTOUCHED_TASKS`` reads once at validation's pick (a MeZO run replayed to it by ``benchmarks/untouched.py
--read-run``, a GRPO run in its own process), compared by a paired bootstrap over prompts and seeds; a pair is run
again only on the kind of machine its cells ran on (there 640 s of step time buys the steps validation chose at,
at the same precision). Each declared
cell has records, or is ``pruned`` (never run) with its reason, or is ``planned`` for a later session with its
reason (tests/test_rl_grid_accounting.py).

Issue 50's protocol (``benchmarks/suite/protocol.py``; its docstring is the rule book) governs the ``--frontier``
cells (``FRONTIER_GRIDS``): choices on validation only, test read once per run at validation's pick (the runner
replays each run's evaluations through ``TestGate`` before it takes a test figure, and records the pick), compared
cells with >= 3 seeds and >= 200 validation prompts (a definition short of that is refused unless exploratory),
both tools at ``PRECISION``, and every record with the protocol's fields. The ``--variants`` and ``--study`` cells
predate it: their records have no ``protocol`` field and the pages show them as exploratory (pre-protocol), never
as a comparison.

A *cell* is (variant, seed). Each runs its real command in a subprocess (recorded in the cell's
line); the runner adds the wall time and peak RSS of that subprocess (``os.wait4``), the time spent
in training steps, and the completions' mean log-likelihood per token under the *base* model (each
test completion scored given its prompt by the untrained model: a reward-hacked policy writes text
the base model finds unlikely), then appends one JSON line to ``docs/results/rl.jsonl``. A cell with
an ``ok`` line is skipped; a MeZO cell stopped part-way continues from its checkpoint.

Fairness of the GRPO cells: ``benchmarks/grpo_sentiment.py`` trains with TRL's documented GRPO
settings, G = 4 completions per prompt, 16 completions per step and 24-token completions, for the
training time (seconds in steps, evaluations excluded) that a MeZO cell of the same seed spent
(``GRPO_BUDGET``: ``grpo`` gets the ``mezo`` cell's, ``grpo-long`` the ``mezo-g4-group`` cell's), then
scores its model with mezo-rl's own evaluation (greedy, 24 tokens, stop at a newline).

The gain of a cell is the mean per-prompt difference on the same test prompts, before and after, and
its SE is that of the paired differences (``paired_gain``); the issue's bar is a gain above
``BAR_SE`` of them on each seed.

Each record names the machine's CPU (``machine``): the tables keep machines apart, and a GRPO cell takes
its budget only from a MeZO cell run on the same CPU.

``--parallel N`` runs N cells at once with ``OMP_NUM_THREADS = 2 / N`` each (the machine has two
cores): per-step times of cells run that way are comparable only with each other.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import math
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))   # the suite package beside this file
from mezo_rl.stats import Moments  # noqa: E402
from mezo_rl.training.rundir import CONFIG_FILE  # noqa: E402
from suite.hacking import hacking_measures  # noqa: E402
from suite.frontier import TOOLS, candidates, left_start, statements, summarise, val_gain, who_wins  # noqa: E402
from suite import bootstrap  # noqa: E402
from suite.frontier import plot as plot_frontier, table as frontier_table  # noqa: E402
from suite.protocol import (COUNTED_WORDS, LOOP_REPETITION, MIN_SEEDS, PRECISION, PROTOCOL, WEIGHTS, ProtocolError,  # noqa: E402
                            TestGate, admitted, check_cell, cpu_info, made_before, precision_of, reads_of_mezo_run,
                            text_counts)
from suite.protocol import commit as protocol_commit  # noqa: E402
from suite.records import append_record, load_records  # noqa: E402
from suite.run import cpu, import_path  # noqa: E402
from suite import curves, untouched  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
RECORDS = REPO / "docs" / "results" / "rl.jsonl"
RUNS = REPO / "runs" / "rl"
EXAMPLE = REPO / "examples" / "rl_sentiment.py"
GRPO = REPO / "benchmarks" / "grpo_sentiment.py"
REWARD = "positivity"


def _mezo(peft: str, lr: str, steps: int, *extra: str, eval_steps: int | None = None, batch: int = 16,
          n_spsa: int = 4) -> list[str]:
    """A MeZO cell's arguments (``mezo-rl train`` and the sentiment example take the same): ``batch`` prompts a step
    (16), ``n_spsa`` SPSA samples (4: 8 members), the normalised step; validated every ``eval_steps`` (default: at
    the start and the end)."""
    return ["--peft", peft, "--learning-rate", lr, "--max-steps", str(steps), "--eval-steps", str(eval_steps or steps),
            "--per-device-train-batch-size", str(batch), "--n-spsa", str(n_spsa), "--step-normalize", "std", *extra]


_BATCHED = ("--member-evaluation", "batched")
_IN_PLACE = ("--member-evaluation", "inplace")


def _guarded(steps: int, weight: str) -> list[str]:
    """A guard cell's arguments: every weight, lr 1e-3, members batched, validated every 30 steps, positivity
    with the example's `repetition` guard at ``weight``."""
    return _mezo("full", "1e-3", steps, *_BATCHED, "--repetition-weight", weight, eval_steps=30)


#: a GRPO sentiment cell's arguments: 4 completions a prompt, 16 a step, validated at its start, middle and end
_GRPO = ["--num-generations", "4", "--batch-size", "16", "--eval-points", "2"]
_GRPO_FULL_LR1E5 = [*_GRPO, "--peft", "full", "--lr", "1e-5"]

#: variant -> (tool, extra arguments, what it is). ``mezo`` is the example with its defaults.
VARIANTS = {
    "mezo": ("mezo-rl", [], "the example's defaults: --peft norm, greedy members, 4 SPSA samples (8 members) in one "
                            "batched decode, lr 0.1"),
    "mezo-g4-group": ("mezo-rl", ["--num-generations", "4", "--reward-shaping", "group", "--learning-rate", "0.05", "--n-spsa", "2",
                                  "--member-evaluation", "inplace"],
                      "4 sampled completions per prompt (GRPO's G), group shaping, 2 SPSA samples, lr 0.05 "
                      "(the example's defaults before 2026-11-25)"),
    "mezo-full": ("mezo-rl", _mezo("full", "1e-3", 20, *_BATCHED),
                  "every weight (low-rank noise, batched members), lr 1e-3, 20 steps of 16, 4 SPSA samples"),
    "mezo-full-40": ("mezo-rl", _mezo("full", "1e-3", 40, *_BATCHED, eval_steps=20),
                     "every weight, lr 1e-3, 40 steps of 16 (validated at 20 and 40), 4 SPSA samples"),
    "mezo-full-test600": ("mezo-rl", _mezo("full", "1e-3", 20, *_BATCHED, "--num-test", "600", "--log-completions", "600"),
                          "the mezo-full cell (the same training) tested on 600 held-out prompts, the 200 of every "
                          "other cell among them"),
    "mezo-lora": ("mezo-rl", _mezo("lora", "3e-2", 20, *_BATCHED),
                  "LoRA r 8 (batched members), lr 3e-2, 20 steps of 16, 4 SPSA samples"),
    "mezo-lora-beta1": ("mezo-rl", _mezo("lora", "3e-2", 20, "--beta", "1", *_IN_PLACE),
                        "LoRA r 8 (members in place), lr 3e-2, 20 steps of 16, 4 SPSA samples, beta 1"),
    # issue 35's comparison on sentiment: each tool's best cell of the arithmetic study (chosen there on validation)
    "mezo-full-lr3e-3": ("mezo-rl", _mezo("full", "3e-3", 60, *_BATCHED, eval_steps=30),
                         "every weight (low-rank noise, batched members), lr 3e-3, 60 steps of 16, 4 SPSA samples: the "
                         "arithmetic study's best MeZO cell"),
    "mezo-full-lr1e-3-60steps": ("mezo-rl", _mezo("full", "1e-3", 60, *_BATCHED, eval_steps=30),
                                 "every weight, lr 1e-3, 60 steps of 16: the GRPO cell's training time at MeZO's "
                                 "defaults' lr (the reward at GRPO's kl)"),
    "mezo-full-lr1e-3-60steps-beta1": ("mezo-rl", _mezo("full", "1e-3", 60, *_BATCHED, "--beta", "1", eval_steps=30),
                                       "every weight, lr 1e-3, 60 steps of 16, beta 1: the 60-step cell with the KL "
                                       "penalty (does it keep distinct-2 while clearing 3 SE?)"),
    "mezo-full-lr1e-3-60steps-beta0.3": ("mezo-rl", _mezo("full", "1e-3", 60, *_BATCHED, "--beta", "0.3", eval_steps=30),
                                         "every weight, lr 1e-3, 60 steps of 16, beta 0.3: between the beta-0 cell "
                                         "(gain with repetition) and beta 1 (no repetition, no gain)"),
    "mezo-full-lr1e-3-60steps-guard": ("mezo-rl", _guarded(60, "1"),
                                       "every weight, lr 1e-3, 60 steps of 16, positivity + the `repetition` guard "
                                       "(weight 1): the 60-step cell with a reward on its repeats instead of a KL"),
    "mezo-full-lr1e-3-90steps-guard": ("mezo-rl", _guarded(90, "1"),
                                       "the guard cell for 90 steps (validated every 30), as many as the norm "
                                       "example's"),
    "mezo-full-lr1e-3-90steps-guard2": ("mezo-rl", _guarded(90, "2"),
                                        "the 90-step guard cell at guard weight 2: a completion that repeats half its "
                                        "bigrams loses as much as the most positive text gains"),
    "grpo-full-lr1e-5": ("trl-grpo", _GRPO_FULL_LR1E5,
                         "TRL GRPOTrainer, every weight, lr 1e-5 (the arithmetic study's best GRPO cell), the training "
                         "time of the mezo-full-lr3e-3 cell of the same seed"),
    "grpo-full-lr1e-5-guard": ("trl-grpo", [*_GRPO_FULL_LR1E5, "--repetition-weight", "1"],
                               "TRL GRPOTrainer, every weight, lr 1e-5, positivity + the `repetition` guard (weight 1), "
                               "the training time of the mezo-full-lr1e-3-60steps-guard cell of the same seed"),
    "grpo-full-lr1e-5-guard-90": ("trl-grpo", [*_GRPO_FULL_LR1E5, "--repetition-weight", "1"],
                                  "the grpo-full-lr1e-5-guard cell for the training time of the "
                                  "mezo-full-lr1e-3-90steps-guard cell of the same seed"),
    "grpo": ("trl-grpo", _GRPO,
             "TRL GRPOTrainer, documented settings, the training time of the mezo cell of the same seed "
             "(validated at its start, middle and end, as the mezo cell)"),
    "grpo-long": ("trl-grpo", ["--num-generations", "4", "--batch-size", "16"],
                  "TRL GRPOTrainer, documented settings, the training time of the mezo-g4-group cell of the same seed"),
    # the sampling / shaping comparison (benchmarks/README.md "RL on prompts"): 40 steps at the norm mode's lr
    "cmp-greedy": ("mezo-rl", ["--max-steps", "40", "--eval-steps", "20", "--num-eval", "100", "--learning-rate", "0.02",
                               "--num-generations", "1", "--reward-shaping", "none", "--n-spsa", "2"],
                   "greedy, 1 completion per prompt, two-point n=2, step_normalize std"),
    "cmp-g4-group": ("mezo-rl", ["--max-steps", "40", "--eval-steps", "20", "--num-eval", "100", "--learning-rate", "0.02",
                                 "--num-generations", "4", "--reward-shaping", "group", "--n-spsa", "2"],
                     "4 sampled completions per prompt, per-prompt group shaping"),
    "cmp-g4-none": ("mezo-rl", ["--max-steps", "40", "--eval-steps", "20", "--num-eval", "100", "--learning-rate", "0.02",
                                "--num-generations", "4", "--reward-shaping", "none", "--n-spsa", "2"],
                    "4 sampled completions per prompt, mean reward"),
    "cmp-es4": ("mezo-rl", ["--max-steps", "40", "--eval-steps", "20", "--num-eval", "100", "--learning-rate", "0.02",
                            "--num-generations", "1", "--reward-shaping", "none", "--estimator", "es", "--n-spsa", "4",
                            "--step-normalize", "std"], "ES-at-scale: 4 one-sided members, z-scored rewards, greedy"),
}
#: which mezo cell's training seconds a GRPO variant gets as its budget
GRPO_BUDGET = {"grpo": "mezo", "grpo-long": "mezo-g4-group", "grpo-full-lr1e-5": "mezo-full-lr3e-3",
               "grpo-full-lr1e-5-guard": "mezo-full-lr1e-3-60steps-guard",
               "grpo-full-lr1e-5-guard-90": "mezo-full-lr1e-3-90steps-guard"}
#: the issue's bar for the example: a held-out gain above this many standard errors of the gain, on each seed
BAR_SE = 3.0
GROUPS = {"shaping": ["cmp-greedy", "cmp-es4", "cmp-g4-group", "cmp-g4-none"]}


# ---------------------------------------------------------------------------------------------- the machine
def machine() -> str:
    """The CPU a cell ran on: its kind changes the speed and, through the kernels it picks (AVX2 or AVX-512),
    the rounding of float32 sums, so greedy completions, and the figures, can differ between machines."""
    model, isa = cpu()
    return f"{platform.machine()} {os.cpu_count()} cpus, {model or platform.processor() or 'unknown CPU'}, {isa}"


def done(records, variant: str, seed: int) -> dict | None:
    return next((r for r in reversed(records) if r["variant"] == variant and r["seed"] == seed and r.get("ok")), None)


def train_seconds(run_dir: pathlib.Path) -> float:
    """Seconds spent in training steps (evaluations excluded), from metrics.jsonl."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return sum(json.loads(line).get("seconds", 0.0) for line in lines if '"loss"' in line)


def step_seconds(run_dir: pathlib.Path) -> list[float]:
    return [json.loads(line)["seconds"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


# ---------------------------------------------------------------------------------------------- the gain
def paired_gain(before: list[dict], after: list[dict], reward: str = REWARD) -> dict:
    """The held-out gain with its standard error, from the per-prompt rewards of the same test prompts
    before and after training, paired by prompt (the evaluation is greedy, so each prompt's reward is a
    fixed number at given weights: the SE is that of the mean per-prompt difference over the n prompts);
    {} unless both hold a reward for every prompt of the same set."""
    rewards_before = {json.dumps(x["prompt"]): x.get(reward) for x in before}
    pairs = [(rewards_before.get(json.dumps(x["prompt"])), x.get(reward)) for x in after]
    if len(before) != len(after) or len(pairs) < 2 or any(b is None or a is None for b, a in pairs):
        return {}
    diffs = [a - b for b, a in pairs]
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    return {"gain": mean, "se": sd / math.sqrt(n), "n": n}


def hacking_cells(b: dict, a: dict, ll: dict) -> str:
    """The table cells 'distinct-2 before → after (SE of the change)' and 'base log-lik before → after (SE)'."""
    d2_se = f" ({_f(ll['distinct_2_change_se'])})" if "distinct_2_change_se" in ll else ""
    ll_se = f" ({_f(ll['change_se'])})" if "change_se" in ll else ""
    return (f"{_f(b.get('distinct_2'))} → {_f(a.get('distinct_2'))}{d2_se} | "
            f"{_f(b.get('completion_chars'), 1)} → {_f(a.get('completion_chars'), 1)} | "
            f"{_f(ll.get('before'))} → {_f(ll.get('after'))}{ll_se}")


# ---------------------------------------------------------------------------------------------- running
def command(variant: str, seed: int, out_dir: pathlib.Path, records) -> list[str]:
    tool, extra, _ = VARIANTS[variant]
    if tool == "mezo-rl":
        return [sys.executable, str(EXAMPLE), "--output-dir", str(out_dir), "--seed", str(seed), *extra]
    here = machine()  # seconds are only comparable on one machine
    ref = done([r for r in records if r.get("machine") == here], GRPO_BUDGET[variant], seed)
    if ref is None:
        raise SystemExit(f"{variant} seed {seed}: run the {GRPO_BUDGET[variant]} cell of seed {seed} on this machine "
                         f"({here}) first (its training time is the budget)")
    return [sys.executable, str(GRPO), "--output-dir", str(out_dir), "--seed", str(seed),
            "--time-budget-s", f"{ref['train_s']:.0f}", "--no-base-loglik", *extra]  # the runner scores it (complete)


def set_aside(out_dir: pathlib.Path) -> None:
    """Move a cell's earlier directory to the first free ``<name>-prev<N>`` (a rerun starts afresh, and the
    earlier samples stay readable)."""
    if out_dir.exists():
        n = 1
        while out_dir.with_name(f"{out_dir.name}-prev{n}").exists():
            n += 1
        out_dir.rename(out_dir.with_name(f"{out_dir.name}-prev{n}"))


def run_cell(variant: str, seed: int, threads: int, records, lock: threading.Lock) -> dict:
    out_dir = RUNS / f"{variant}-s{seed}"
    cmd = command(variant, seed, out_dir, records)
    run_dir = out_dir / "run"
    if VARIANTS[variant][0] == "mezo-rl" and (run_dir / "checkpoint").is_dir() and not (run_dir / "summary.json").is_file():
        cmd.append("--resume")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
    out_dir.mkdir(parents=True, exist_ok=True)
    code = protocol_commit(REPO)
    t0 = time.time()
    with (out_dir / "log.txt").open("a") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    record = {"variant": variant, "tool": VARIANTS[variant][0], "seed": seed, "command": shlex.join(cmd),
              "commit": code, "cpu": cpu_info(),
              "threads": threads, "wall_s": time.time() - t0, "peak_rss_mb": usage.ru_maxrss / 1024,
              "date": _dt.date.today().isoformat(), "machine": machine(),
              "ok": os.waitstatus_to_exitcode(status) == 0}
    with lock:
        append_record(RECORDS, complete(record, out_dir))
    return record


def complete(record: dict, out_dir: pathlib.Path) -> dict:
    """The cell's record with the run's figures added (for a finished run)."""
    from mezo_rl.cli.plots import read_jsonl
    from mezo_rl.training.rundir import read_samples

    run_dir = out_dir / "run"
    if record["ok"]:
        if record["tool"] == "mezo-rl":
            summary = json.loads((run_dir / "summary.json").read_text())
            secs = step_seconds(run_dir)
            before, after = read_samples(run_dir, "test", 0), read_samples(run_dir, "test", summary["steps"])
            record.update(steps=summary["steps"], best_step=summary["best_step"], train_s=sum(secs),
                          s_per_step=sorted(secs)[len(secs) // 2],
                          **{k: summary[k] for k in ("initial_validation", "validation", "initial_test", "test")},
                          base_loglik=hacking_measures(before, after), paired=paired_gain(before, after),
                          samples=sample_pairs(before, after, REWARD),
                          **run_fields(json.loads((run_dir / CONFIG_FILE).read_text()), summary, before, after))
        else:
            summary = json.loads((out_dir / "summary.json").read_text())
            record.update({k: summary.get(k) for k in ("steps", "train_s", "s_per_step", "initial_test", "test",
                                                       "settings", "trl_version", "peak_train_rss_mb")})
            before, after = (read_jsonl(out_dir / "samples" / f"test-{when}.jsonl") for when in ("before", "after"))
            record["base_loglik"] = hacking_measures(before, after)  # the same scoring as the MeZO cells'
            record["paired"] = paired_gain(before, after)
            record["samples"] = sample_pairs(before, after, REWARD)
            record.update(run_fields(None, summary, before, after))
    return record


def run_fields(config: dict | None, summary: dict, before: list[dict], after: list[dict]) -> dict:
    """What the protocol asks of every record beyond the figures (suite/protocol.py): the tool's full configuration
    (mezo-rl's training_args.json; TRL's GRPOConfig as the GRPO script dumped it), the precision, n and the counts."""
    if config is not None:
        out = {"config": config, "precision": precision_of(config.get("autocast", "auto"))}
    else:  # GRPO summaries written before the script took --autocast ran in fp32
        out = {"config": summary.get("grpo_config"), "precision": summary.get("precision", "fp32")}
    out["n"] = {"validation": int((summary.get("validation") or {}).get("n", 0)),
                "test": int((summary.get("test") or {}).get("n", 0))}
    out["counts"] = {"before": text_counts(before), "after": text_counts(after)}
    if summary.get("pick"):
        out["pick"] = summary["pick"]
    return out


def adopt(variant: str, seed: int, out_dir: pathlib.Path, cmd: str, threads: int) -> dict:
    """A record for a cell that was run by hand with ``/usr/bin/time -v`` (its log holds the wall time and
    peak RSS), e.g. two cells at once with ``OMP_NUM_THREADS=1``."""
    log = (out_dir.parent / f"{out_dir.name}.log").read_text()

    def field(label):
        line = next(l for l in log.splitlines() if label in l)
        return line.split(": ", 1)[1].strip()

    h, m, sec = (["0"] + field("Elapsed (wall clock)").split(":"))[-3:]
    record = {"variant": variant, "tool": VARIANTS[variant][0], "seed": seed, "command": cmd, "threads": threads,
              "wall_s": int(h) * 3600 + int(m) * 60 + float(sec), "peak_rss_mb": int(field("Maximum resident")) / 1024,
              "date": _dt.date.today().isoformat(), "machine": machine(),
              "ok": field("Exit status") == "0"}
    return complete(record, out_dir)


def test_after(variant: str, seed: int) -> list[dict]:
    """The test completions of a cell's trained model, with their rewards, from its run directory."""
    from mezo_rl.cli.plots import read_jsonl
    from mezo_rl.training.rundir import read_samples

    out_dir = RUNS / f"{variant}-s{seed}"
    if VARIANTS[variant][0] == "mezo-rl":
        summary = json.loads((out_dir / "run" / "summary.json").read_text())
        return read_samples(out_dir / "run", "test", summary["steps"])
    return read_jsonl(out_dir / "samples" / "test-after.jsonl")


def head_to_head(a: list[dict], b: list[dict]) -> dict:
    """Model A against model B on the same test prompts: the mean of (A's reward - B's reward) per prompt,
    paired by prompt, and its standard error (``paired_gain`` with B as "before")."""
    return paired_gain(b, a)


# ---------------------------------------------------------------------------------------------- rendering
def _f(x, digits=3) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def gain_and_se(record: dict) -> tuple[float, float, bool]:
    """(gain, its standard error, paired?): the paired SE of the per-prompt differences where the cell kept
    them (``paired``), else sqrt(SE_before^2 + SE_after^2), which ignores the pairing (records from
    before the per-prompt figures were kept)."""
    b, a = record.get("initial_test") or {}, record.get("test") or {}
    if record.get("paired"):
        return record["paired"]["gain"], record["paired"]["se"], True
    se_b, se_a = b.get(f"{REWARD}/se"), a.get(f"{REWARD}/se")
    if se_b is None or se_a is None or REWARD not in a or REWARD not in b:
        return math.nan, math.nan, False
    return a[REWARD] - b[REWARD], math.sqrt(se_b ** 2 + se_a ** 2), False


def above_bar(record: dict) -> bool:
    """Whether the cell's gain is above ``BAR_SE`` standard errors of it."""
    gain, se, _ = gain_and_se(record)
    return se > 0 and gain / se > BAR_SE


def render(records: list[dict]) -> str:
    """The RL tables: one row per cell (variant, seed, machine), then each variant over its seeds on each machine.
    Machines are kept apart: their speeds differ and so, through float32 rounding, can their completions.
    The study's section (``--study``) follows, where it has cells."""
    return render_sentiment(records) + render_study(load_records(STUDY_RECORDS))


#: what the pages say of the records written before issue 50's protocol (benchmarks/suite/protocol.py)
PRE_PROTOCOL = ("**Exploratory (pre-protocol): not a comparison.** These cells ran before issue 50's protocol: most on "
                "one seed, validated on 50-100 prompts, some of their settings (steps, variants) chosen after reading "
                "the test split. They are kept as a record of what ran, not as evidence that one setting or tool is "
                "better; the comparisons are the frontier sections, whose records obey the protocol.")


def render_sentiment(records: list[dict]) -> str:
    cells = {}
    for r in records:
        if r.get("ok"):
            cells[(r["variant"], r["seed"], r.get("machine", "?"))] = r  # the latest line of a cell wins
    if not cells:
        return "No RL cells yet: `python benchmarks/rl.py`.\n"
    machines = list(dict.fromkeys(m for _, _, m in cells))  # first seen first: M1, M2, ...
    label = {m: f"M{i + 1}" for i, m in enumerate(machines)}
    lines = ["| variant | machine | seed | steps | test reward before → after, n | gain (SE) | gain / SE | kl | "
             "distinct-2 before → after | chars before → after | base log-lik/token before → after | s/step | train s | "
             "wall min | peak RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    order = lambda kv: (list(VARIANTS).index(kv[0][0]) if kv[0][0] in VARIANTS else 99,  # noqa: E731
                        machines.index(kv[0][2]), kv[0][1])
    unpaired = False
    for (variant, seed, m), r in sorted(cells.items(), key=order):
        b, a = r.get("initial_test") or {}, r.get("test") or {}
        gain, se, paired = gain_and_se(r)
        unpaired |= not paired
        ll = r.get("base_loglik") or {}
        lines.append(f"| {variant} | {label[m]} | {seed} | {r.get('steps')} | {_f(b.get(REWARD))} → {_f(a.get(REWARD))}, "
                     f"{int(a.get('n', 0))} | {gain:+.3f} ({_f(se)}){'' if paired else '†'} | {_f(gain / se, 1) if se else '–'} | "
                     f"{_f(a['kl'], 3) if a.get('kl') is not None else '–'} | "
                     f"{hacking_cells(b, a, ll)} | {_f(r.get('s_per_step'), 1)} | "
                     f"{_f(r.get('train_s'), 0)} | {_f(r.get('wall_s', math.nan) / 60, 1)} | {_f(r.get('peak_rss_mb'), 0)} |")
    lines += ["", "Gain: mean over the test prompts of (reward after − reward before); SE: the standard error of that "
              "mean (paired: the same prompts, greedy, before and after)."]
    if unpaired:
        lines += ["† the cell's per-prompt rewards were not kept: SE = sqrt(SE_before² + SE_after²), which ignores "
                  "the pairing."]
    png = STUDY_PLOTS / "rl_sentiment_kl.png"
    with_kl = [r for r in cells.values() if (r.get("test") or {}).get("kl") is not None]
    if with_kl and study_plot("sentiment", with_kl, png, reward=REWARD):
        lines += ["", "Cells that measured `kl` (cells before issue 35 did not):", "",
                  f"![sentiment: gain against kl](results/{png.name})"]
    with_samples = [(key, r) for key, r in sorted(cells.items(), key=order) if r.get("samples")]
    if with_samples:  # cells recorded before the records kept them have none
        lines += ["", "Sample test completions (the first two test prompts, before → after):", ""]
        lines += [f"- {v} seed {s} on {label[m]}: {smp['prompt']!r}: {smp['before']!r} → {smp['after']!r}"
                  for (v, s, m), r in with_samples for smp in r["samples"][:2]]
    lines += ["", "Machines (as each record names its CPU; records written before the CPU model was kept name only "
              "the architecture and the core count):", ""]
    lines += [f"- {label[m]}: {m}" for m in machines]
    notes = [f"- {v} seed {s} on {label[m]}: {r['note']}" for (v, s, m), r in sorted(cells.items(), key=order)
             if r.get("note")]
    lines += [""] + notes if notes else []
    lines += ["", f"Each variant over its seeds on one machine (mean ± standard deviation over seeds; the bar: a gain "
              f"above {BAR_SE:g} SE on each seed):", "",
              "| variant | machine | what | seeds | test reward before → after | gain | seeds above the bar | "
              "longest wall min | peak RSS MiB |", "|---|---|---|---|---|---|---|---|---|"]
    for variant in VARIANTS:
        for m in machines:
            rows = [r for (v, _, mm), r in sorted(cells.items()) if v == variant and mm == m]
            if not rows:
                continue
            before = [r["initial_test"][REWARD] for r in rows]
            after = [r["test"][REWARD] for r in rows]

            def ms(xs):
                mean = sum(xs) / len(xs)
                sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else math.nan
                return f"{mean:.3f}" + (f" ± {sd:.3f}" if len(xs) > 1 else "")

            gains = [x - y for x, y in zip(after, before)]
            above = sum(1 for r in rows if above_bar(r))
            lines.append(f"| {variant} | {label[m]} | {VARIANTS[variant][2]} | {len(rows)} | {ms(before)} → {ms(after)} | "
                         f"{ms(gains)} | {above} of {len(rows)} | {max(r.get('wall_s', math.nan) for r in rows) / 60:.1f} | "
                         f"{max(r['peak_rss_mb'] for r in rows):.0f} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- issue 35's study
# A verifiable task (no scorer to game): MeZO and TRL's GRPO on the same model, prompts, reward, completion
# length and held-out prompts, for the same training seconds on this machine, scored by the same code
# (mezo_rl.training.evaluation.evaluate; `kl` by mezo_rl.training.kl). Validation (50 prompts) at the start and
# at the end of each cell, the better of the two tested on 200 test prompts (both tools alike).
STUDY_RECORDS = REPO / "docs" / "results" / "rl_study.jsonl"
STUDY_RUNS = REPO / "runs" / "rl_study"
STUDY_PLOTS = REPO / "docs" / "results"
STUDY_TASKS = {"arithmetic": dict(reward="exact_answer", max_new_tokens=16)}
STUDY_SIZES = dict(num_train=1000, num_eval=50, num_test=200)
#: training seconds of a cell (both tools, this machine): a GRPO cell stops at them, a MeZO cell's steps are
#: sized to them from its s/step measured here (each record's train_s says what it spent)
STUDY_BUDGET_S = 640


#: cell -> (tool, arguments, what it is). MeZO: 16 prompts a step, 4 SPSA samples, greedy members; the steps
#: fill STUDY_BUDGET_S at 11 s a step for LoRA and 10.5 s for full (batched members); a cell with fewer is
#: named for its steps.
STUDY_CELLS = {
    "mezo-norm-lr0.1": ("mezo-rl", _mezo("norm", "0.1", 20), "MeZO, final norm's gains, lr 0.1"),
    "mezo-norm-lr0.03": ("mezo-rl", _mezo("norm", "0.03", 20), "MeZO, final norm's gains, lr 0.03"),
    "mezo-lora-lr3e-2-20steps": ("mezo-rl", _mezo("lora", "3e-2", 20, *_BATCHED),
                                 "MeZO, LoRA r 8 (batched members), lr 3e-2, 20 steps (a third of the budget)"),
    "mezo-lora-lr3e-3": ("mezo-rl", _mezo("lora", "3e-3", 57, *_BATCHED), "MeZO, LoRA r 8 (batched members), lr 3e-3"),
    "mezo-lora-lr3e-2": ("mezo-rl", _mezo("lora", "3e-2", 57, *_BATCHED), "MeZO, LoRA r 8 (batched members), lr 3e-2"),
    "mezo-lora-lr3e-2-20steps-beta1": ("mezo-rl", _mezo("lora", "3e-2", 20, "--beta", "1", *_IN_PLACE),
                                       "MeZO, LoRA r 8 (members in place), lr 3e-2, 20 steps, beta 1"),
    "mezo-lora-lr3e-2-20steps-beta10": ("mezo-rl", _mezo("lora", "3e-2", 20, "--beta", "10", *_IN_PLACE),
                                        "MeZO, LoRA r 8 (members in place), lr 3e-2, 20 steps, beta 10"),
    "mezo-full-lr3e-3": ("mezo-rl", _mezo("full", "3e-3", 60, *_BATCHED),
                         "MeZO, every weight (low-rank noise, batched members), lr 3e-3"),
    "mezo-full-lr5e-3": ("mezo-rl", _mezo("full", "5e-3", 60, *_BATCHED),
                         "MeZO, every weight (low-rank noise, batched members), lr 5e-3"),
    "mezo-full-lr3e-3-22steps": ("mezo-rl", _mezo("full", "3e-3", 22, *_BATCHED),
                                 "MeZO, every weight (low-rank noise, batched members), lr 3e-3, 22 steps (the beta-1 "
                                 "cell's steps, beta 0)"),
    "mezo-full-lr3e-3-beta1": ("mezo-rl", _mezo("full", "3e-3", 22, *_BATCHED, "--beta", "1"),
                               "MeZO, every weight (low-rank noise, batched members), lr 3e-3, beta 1: 22 steps (the "
                               "budget at beta's 25-30 s a step)"),
    "mezo-full-lr1e-3": ("mezo-rl", _mezo("full", "1e-3", 60, *_BATCHED),
                         "MeZO, every weight (low-rank noise, batched members), lr 1e-3"),
    "mezo-full-lr1e-3-20steps": ("mezo-rl", _mezo("full", "1e-3", 20, *_BATCHED),
                                 "MeZO, every weight (low-rank noise, batched members), lr 1e-3, 20 steps"),
    "mezo-full-lr1e-3-20steps-beta1": ("mezo-rl", _mezo("full", "1e-3", 20, "--beta", "1", *_IN_PLACE),
                                       "MeZO, every weight (low-rank noise, members in place), lr 1e-3, 20 steps, beta 1"),
    "mezo-full-lr1e-3-20steps-beta0.04": ("mezo-rl", _mezo("full", "1e-3", 20, "--beta", "0.04", *_IN_PLACE),
                                          "MeZO, every weight (members in place), lr 1e-3, 20 steps, beta 0.04 "
                                          "(GRPO's beta cell's)"),
    "grpo-lora-lr1e-6": ("trl-grpo", ["--peft", "lora", "--lr", "1e-6"], "TRL GRPO, LoRA r 8, lr 1e-6 (TRL's default)"),
    "grpo-lora-lr1e-5": ("trl-grpo", ["--peft", "lora", "--lr", "1e-5"], "TRL GRPO, LoRA r 8, lr 1e-5 (10x)"),
    "grpo-lora-lr1e-4": ("trl-grpo", ["--peft", "lora", "--lr", "1e-4"], "TRL GRPO, LoRA r 8, lr 1e-4 (100x)"),
    "grpo-lora-lr1e-4-beta0.04": ("trl-grpo", ["--peft", "lora", "--lr", "1e-4", "--beta", "0.04"],
                                  "TRL GRPO, LoRA r 8, lr 1e-4, beta 0.04 (TRL's default before 0.19; a reference "
                                  "model loaded)"),
    "grpo-full-lr1e-6": ("trl-grpo", ["--peft", "full", "--lr", "1e-6"], "TRL GRPO, every weight, lr 1e-6 (TRL's default)"),
    "grpo-full-lr1e-5": ("trl-grpo", ["--peft", "full", "--lr", "1e-5"], "TRL GRPO, every weight, lr 1e-5 (10x)"),
    "grpo-full-lr1e-5-beta0.04": ("trl-grpo", ["--peft", "full", "--lr", "1e-5", "--beta", "0.04"],
                                  "TRL GRPO, every weight, lr 1e-5, beta 0.04 (a reference model loaded)"),
    "grpo-full-lr3e-5": ("trl-grpo", ["--peft", "full", "--lr", "3e-5"], "TRL GRPO, every weight, lr 3e-5 (30x)"),
    "grpo-full-lr1e-4": ("trl-grpo", ["--peft", "full", "--lr", "1e-4"], "TRL GRPO, every weight, lr 1e-4 (100x)"),
}


def study_command(task: str, cell: str, seed: int, out_dir: pathlib.Path) -> list[str]:
    tool, extra, _ = STUDY_CELLS[cell]
    t = STUDY_TASKS[task]
    sizes = [f"--{k.replace('_', '-')}" if i % 2 == 0 else str(v)
             for k, v in STUDY_SIZES.items() for i in (0, 1)]
    if tool == "mezo-rl":
        return [sys.executable, "-m", "mezo_rl", "train", "--task", task, "--reward", t["reward"],
                "--max-completion-length", str(t["max_new_tokens"]), "--eval-batch-size", "64", "--log-completions", "200",
                "--seed", str(seed), *sizes, *extra, "--output-dir", str(out_dir / "run")]
    return [sys.executable, str(GRPO), "--task", task, "--reward", t["reward"], "--output-dir", str(out_dir),
            "--seed", str(seed), "--max-completion-length", str(t["max_new_tokens"]), "--num-generations", "4",
            "--batch-size", "16", "--eval-points", "1", "--time-budget-s", str(STUDY_BUDGET_S),
            "--no-base-loglik", *sizes, *extra]  # the runner scores the completions (complete_study)


def run_study_cell(task: str, cell: str, seed: int) -> dict:
    """Run one cell in a subprocess (a MeZO cell stopped part-way resumes) and append its record."""
    out_dir = STUDY_RUNS / f"{task}-{cell}-s{seed}"
    cmd = study_command(task, cell, seed, out_dir)
    run_dir = out_dir / "run"
    if STUDY_CELLS[cell][0] == "mezo-rl" and (run_dir / "checkpoint").is_dir() and not (run_dir / "summary.json").is_file():
        cmd.append("--resume")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(REPO))
    out_dir.mkdir(parents=True, exist_ok=True)
    code = protocol_commit(REPO)
    t0 = time.time()
    with (out_dir / "log.txt").open("a") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    record = {"task": task, "cell": cell, "tool": STUDY_CELLS[cell][0], "seed": seed, "command": shlex.join(cmd),
              "commit": code, "cpu": cpu_info(),
              "wall_s": time.time() - t0, "peak_rss_mb": usage.ru_maxrss / 1024, "machine": machine(),
              "ok": os.waitstatus_to_exitcode(status) == 0}
    if record["ok"]:
        record = complete_study(record, out_dir)
    append_record(STUDY_RECORDS, record)
    return record


def complete_study(record: dict, out_dir: pathlib.Path) -> dict:
    """A finished cell's figures: test before -> after with the paired gain, kl, distinct-2, completion
    length, the completions' base log-likelihood per token, s/step, and a few sample completions."""
    from mezo_rl.cli.plots import read_jsonl
    from mezo_rl.training.rundir import read_samples

    reward = STUDY_TASKS[record["task"]]["reward"]
    if record["tool"] == "mezo-rl":
        run_dir = out_dir / "run"
        summary = json.loads((run_dir / "summary.json").read_text())
        secs = step_seconds(run_dir)
        before = read_samples(run_dir, "test", 0)
        after = read_samples(run_dir, "test", summary["steps"])
        record.update(steps=summary["steps"], best_step=summary["best_step"], train_s=sum(secs),
                      s_per_step=sorted(secs)[len(secs) // 2])
        config = json.loads((run_dir / CONFIG_FILE).read_text())
    else:
        config = None
        summary = json.loads((out_dir / "summary.json").read_text())
        before, after = (read_jsonl(out_dir / "samples" / f"test-{w}.jsonl") for w in ("before", "after"))
        record.update({k: summary.get(k) for k in ("steps", "best_step", "train_s", "s_per_step", "trl_version",
                                                   "peak_train_rss_mb")})
    record.update({k: summary[k] for k in ("initial_validation", "validation", "initial_test", "test")})
    record["paired"] = paired_gain(before, after, reward)
    record["base_loglik"] = hacking_measures(before, after)
    record["samples"] = sample_pairs(before, after, reward)
    record.update(run_fields(config, summary, before, after))
    return record


def sample_pairs(before: list[dict], after: list[dict], reward: str, k: int = 4) -> list[dict]:
    """The first ``k`` test prompts' completions before -> after, with the reward after (a record's samples)."""
    return [{"prompt": s["prompt"] if isinstance(s["prompt"], str) else s["prompt"][-1]["content"],
             "before": b["completion"], "after": s["completion"], reward: s.get(reward)}
            for b, s in list(zip(before, after))[:k]]


def study_plot(task: str, cells: list[dict], path: pathlib.Path, reward: str | None = None) -> bool:
    """Held-out gain (paired SE bars) against the test completions' kl, one point per cell that measured kl
    (labelled with its study cell, or its sentiment variant, and seed)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    top = 0.0
    for r in cells:
        kl, pg = (r.get("test") or {}).get("kl"), r.get("paired") or {}
        if kl is None or not pg or r.get("kl_note") or r.get("best_step") == 0:  # step 0 tested: the start itself
            continue
        top = max(top, kl)
        ax.errorbar([kl], [pg["gain"]], yerr=[pg["se"]], fmt="o" if r["tool"] == "mezo-rl" else "s",
                    color="C0" if r["tool"] == "mezo-rl" else "C3", capsize=3)
        ax.annotate(f"{r.get('cell') or r.get('variant')} s{r['seed']}", (kl, pg["gain"]), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xscale("symlog", linthresh=1e-4)
    ax.set_xlim(0, max(top, 1e-3) * 2)
    ax.set_xlabel("kl to the starting model (per token, test completions)")
    ax.set_ylabel(f"held-out {reward or STUDY_TASKS[task]['reward']} gain (± paired SE)")
    ax.set_title(f"{task}: reward gain against KL (circles MeZO, squares TRL GRPO; cells that kept step 0 "
                 f"left out)", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def study_seed_summary(rows: list[dict]) -> list[str]:
    """Lines for the cells run on several seeds: the gain's mean and standard deviation over seeds, how many
    seeds clear BAR_SE, and the mean kl."""
    by_cell: dict = {}
    for r in rows:
        if r.get("paired"):
            by_cell.setdefault(r["cell"], []).append(r)
    many = {c: rs for c, rs in by_cell.items() if len(rs) > 1}
    if not many:
        return []
    out = ["", f"Over seeds (the bar: a gain above {BAR_SE:g} paired SE on each seed):", "",
           "| cell | seeds | gain, mean ± sd over seeds | seeds above the bar | kl, mean | train s, max |",
           "|---|---|---|---|---|---|"]
    for cell, rs in many.items():
        gains = Moments.of(r["paired"]["gain"] for r in rs)
        above = sum(r["paired"]["gain"] > BAR_SE * r["paired"]["se"] for r in rs)
        kl = Moments.of((r.get("test") or {}).get("kl", math.nan) for r in rs)
        out.append(f"| {cell} | {', '.join(str(r['seed']) for r in rs)} | {gains.mean:+.3f} ± {gains.std():.3f} | "
                   f"{above} of {len(rs)} | {_f(kl.mean, 4)} | {_f(max(r.get('train_s') or math.nan for r in rs), 0)} |")
    return out


def render_study(records: list[dict]) -> str:
    """The study's section of docs/results.md: one table per task and its reward-KL plot (written beside it)."""
    cells = {}
    for r in records:
        if r.get("ok"):
            cells[(r["task"], r["cell"], r["seed"], r["machine"])] = r
    if not cells:
        return ""
    out = ["", "## RL on a verifiable task: issue 35's reduced study (exploratory, pre-protocol)", "",
           f"{PRE_PROTOCOL} Generated from `docs/results/rl_study.jsonl` by `python benchmarks/rl.py --study arithmetic` (each cell's "
           "exact command: its `command` in the JSONL). Model SmolLM2-135M-Instruct, chat prompts "
           "(\"What is 37 + 48? Reply with the number only.\"), reward `exact_answer` (the completion's last number is "
           f"the sum), greedy completions of at most {STUDY_TASKS['arithmetic']['max_new_tokens']} tokens; "
           f"{STUDY_SIZES['num_train']} training questions, validation {STUDY_SIZES['num_eval']} (at the start and the "
           f"end; the better is tested), test {STUDY_SIZES['num_test']} held-out questions. Each cell trains for about "
           f"{STUDY_BUDGET_S} s on this machine (a cell named for its steps, fewer): MeZO 16 prompts a step, 4 SPSA "
           "samples, greedy members, FZOO-normalised (`--step-normalize std`), its steps sized to the budget; GRPO: TRL's "
           "GRPOTrainer, 4 completions per prompt, 16 per step, stopped at the budget. `kl`: exact per-token "
           "KL(trained ‖ starting model) over the test completions (`mezo_rl.training.kl`). Distinct-2 and base "
           "log-likelihood carry the SE of their change (paired bootstrap, paired differences: "
           "`benchmarks/suite/hacking.py`). The issue's grid reduced to what two CPU cores allow; cells not listed "
           "were not run.", ""]
    for task in dict.fromkeys(t for t, _, _, _ in cells):
        rows = [r for (t, _, _, _), r in cells.items() if t == task]
        rows.sort(key=lambda r: (list(STUDY_CELLS).index(r["cell"]) if r["cell"] in STUDY_CELLS else 99, r["seed"]))
        reward = STUDY_TASKS[task]["reward"]
        out += [f"### {task}", "",
                "| cell | what | seed | steps (best) | test before → after, n | gain (paired SE) | gain / SE | kl | "
                "distinct-2 before → after | chars before → after | base log-lik/token before → after | s/step | "
                "train s | peak RSS MiB |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            b, a, pg, ll = r.get("initial_test") or {}, r.get("test") or {}, r.get("paired") or {}, r.get("base_loglik") or {}
            gain, se = pg.get("gain", math.nan), pg.get("se", math.nan)
            out.append(f"| {r['cell']} | {STUDY_CELLS.get(r['cell'], ('', '', ''))[2]} | {r['seed']} | {r.get('steps')} "
                       f"({r.get('best_step')}) | {_f(b.get(reward))} → {_f(a.get(reward))}, {int(a.get('n', 0))} | "
                       f"{gain:+.3f} ({_f(se)}) | {_f(gain / se, 1) if se else '–'} | "
                       f"{'n/m*' if r.get('kl_note') else _f(a.get('kl'), 5)} | "
                       f"{hacking_cells(b, a, ll)} | {_f(r.get('s_per_step'), 1)} | "
                       f"{_f(r.get('train_s'), 0)} | {_f(r.get('peak_rss_mb'), 0)} |")
        out += [f"\n\\* {r['cell']} seed {r['seed']}: {r['kl_note']}" for r in rows if r.get("kl_note")]
        out += study_seed_summary(rows)
        png = STUDY_PLOTS / f"rl_study_{task}.png"
        if study_plot(task, rows, png):
            out += ["", f"![{task}: gain against kl](results/{png.name})"]
        out += ["", "Sample test completions (first prompts, before → after):", ""]
        for r in rows:
            for smp in r.get("samples", [])[:2]:
                out.append(f"- {r['cell']}: {smp['prompt']!r}: {smp['before']!r} → {smp['after']!r}")
        machines = sorted({r["machine"] for r in rows})
        out += ["", "Machine: " + "; ".join(machines) + " (timings taken while other work shared the cores are noisy)."]
    return "\n".join(out) + "\n"


def rescore(path: pathlib.Path, key: str, names: list[str], seeds: list[int], out_dir, complete_fn, kept: tuple) -> int:
    """Recompute the figures of the recorded cells (``key`` in ``names``, of ``seeds``) whose run directory
    (``out_dir(record)``) is still here, after the scoring code changed: the same ``complete_fn`` a finished cell
    gets; the run's own figures (``kept``: command, wall time, peak RSS, machine) are kept, and the new line wins."""
    latest = {}
    for r in load_records(path):
        if r.get("ok") and r[key] in names and r["seed"] in seeds:
            latest[(r[key], r["seed"], r["machine"])] = r
    for (name, seed, _), r in latest.items():
        if not out_dir(r).is_dir():
            print(f"{name} seed {seed}: no run directory, kept as recorded")
            continue
        append_record(path, complete_fn({k: r[k] for k in kept if k in r}, out_dir(r)))
        print(f"{name} seed {seed}: rescored")
    return 0


def rescore_study(task: str, cells: list[str], seeds: list[int]) -> int:
    return rescore(STUDY_RECORDS, "cell", cells, seeds, lambda r: STUDY_RUNS / f"{task}-{r['cell']}-s{r['seed']}",
                   complete_study, ("task", "cell", "tool", "seed", "command", "wall_s", "peak_rss_mb", "machine", "ok"))


def rescore_sentiment(variants: list[str], seeds: list[int]) -> int:
    return rescore(RECORDS, "variant", variants, seeds, lambda r: RUNS / f"{r['variant']}-s{r['seed']}", complete,
                   ("variant", "tool", "seed", "command", "threads", "wall_s", "peak_rss_mb", "date", "machine", "ok",
                    "note"))


def study_main(task: str, cells: list[str], seeds: list[int], rerun: bool, dry_run: bool) -> int:
    """Run the pending cells of ``task`` in order (each one a subprocess; a finished cell is skipped unless
    ``rerun``), then print the study's section."""
    records = load_records(STUDY_RECORDS)
    pending = [(c, s) for s in seeds for c in cells
               if rerun or not any(r["task"] == task and r["cell"] == c and r["seed"] == s and r.get("ok")
                                   and r.get("machine") == machine() for r in records)]
    if dry_run:
        print("\n".join(f"{task} {c} seed {s}" for c, s in pending) or "nothing pending")
        return 0
    for c, s in pending:
        if rerun:
            set_aside(STUDY_RUNS / f"{task}-{c}-s{s}")
        r = run_study_cell(task, c, s)
        print(f"{task} {c} seed {s}: {'ok' if r['ok'] else 'FAILED'} in {r['wall_s']:.0f} s", flush=True)
    print(render_study(load_records(STUDY_RECORDS)), end="")
    return 0


# ---------------------------------------------------------------------------------------------- issue 50's frontier
# Each tool's reward-KL frontier under the protocol (benchmarks/suite/protocol.py): grids of lr x beta, run in two
# stages. Stage "grid": every cell on seed 0. Stage "seeds": the cells on each tool's seed-0 *validation* frontier
# (suite.frontier.candidates) on the other seeds. A cell's record is appended as soon as it finishes; a rerun skips
# the finished (cell, seed) pairs of this machine, and a MeZO cell stopped part-way resumes from its checkpoint.
FRONTIER_RECORDS = REPO / "docs" / "results" / "rl_frontier.jsonl"
FRONTIER_RUNS = REPO / "runs" / "rl_frontier"
FRONTIER_PLOTS = REPO / "docs" / "results"
FRONTIER_SEEDS = (0, 1, 2)
#: the seeds a compared pair whose untouched verdict is within bootstrap.CLOSE_SE SE adds (to bootstrap.MORE_SEEDS)
EXTRA_SEEDS = tuple(range(len(FRONTIER_SEEDS), bootstrap.MORE_SEEDS))
#: the tasks: reward, completion tokens, prompt counts (validation >= protocol.MIN_VALIDATION) and the training
#: seconds of both tools' cells (see MEZO_STEP_CAP for how MeZO keeps to them)
FRONTIER_TASKS = {
    "arithmetic": dict(reward="exact_answer", max_new_tokens=16, num_train=1000, num_eval=200, num_test=500,
                       budget_s=640),
    "sentiment": dict(reward=REWARD, max_new_tokens=24, num_train=1000, num_eval=200, num_test=200, budget_s=450,
                      words=6),  # words: of each review kept as the prompt (the example's and the GRPO script's)
}
#: sentiment with the user's guard against the gamed lexicon: both tools train on positivity plus the example's
#: `repetition` reward at weight ``guard`` (examples/sentiment_reward.py; the GRPO script's ``--repetition-weight``)
#: and pick their step on that weighted objective; the figures stay positivity's
FRONTIER_TASKS["sentiment-guard"] = dict(FRONTIER_TASKS["sentiment"], guard="1")
#: issue 70: arithmetic for four times the budget (``task``: the registered task the cells train on)
FRONTIER_TASKS["arithmetic-4x"] = dict(FRONTIER_TASKS["arithmetic"], budget_s=4 * FRONTIER_TASKS["arithmetic"]["budget_s"],
                                       task="arithmetic", every_seed=True)
#: issue 70: Countdown's curriculum (tasks/verifiable.py CURRICULUM; each stage's own split sizes): 2 numbers from the
#: model itself, then 3 and 4, each from the previous stage's picks (``start_from``: per tool and seed, the weights of
#: the stage's compared cell with the highest mean validation gain, written by ``--stage export``)
FRONTIER_TASKS["countdown-curriculum2"] = dict(reward="countdown_lenient", max_new_tokens=32, num_train=250, num_eval=200,
                                               num_test=200, budget_s=640)
FRONTIER_TASKS["countdown-curriculum3"] = dict(FRONTIER_TASKS["countdown-curriculum2"], num_train=1000, num_test=500,
                                               start_from="countdown-curriculum2")
FRONTIER_TASKS["countdown-curriculum4"] = dict(FRONTIER_TASKS["countdown-curriculum3"], start_from="countdown-curriculum3")
#: where a curriculum stage's picks are written (relative to the checkout, as the sentiment prompts)
#: the tasks whose runs read the untouched split once at their pick (benchmarks/suite/untouched.py)
UNTOUCHED_TASKS = ("arithmetic", "arithmetic-4x", "sentiment", "sentiment-guard")


def verdict_split(task: str) -> str:
    """The split a task's verdict pairs are compared on: the untouched one, or development for a task without one."""
    return "untouched" if task in UNTOUCHED_TASKS else "development"
#: the tasks whose prompts are SST-2 review openings (``write_sentiment_prompts``), scored by the example's rewards
SENTIMENT_TASKS = ("sentiment", "sentiment-guard")


@dataclasses.dataclass(frozen=True)
class FrontierCell:
    """One grid point: a tool, what it trains, lr and beta, its other arguments, and its seeds. A compared cell's
    definition is refused with fewer than protocol.MIN_SEEDS seeds or a validation under MIN_VALIDATION prompts
    unless it is declared exploratory (then it is never compared)."""
    task: str
    family: str  # tool and what it trains (mezo-full, mezo-lora, mezo-norm, grpo-full, grpo-lora), and a variant's name
    lr: str
    beta: str
    args: tuple
    seeds: tuple = FRONTIER_SEEDS
    exploratory: bool = False
    launcher: tuple = ()  # a MeZO cell's arguments of benchmarks/mezo_budget.py itself (its --scale-decay)
    #: why the cell is not run (read off the records' validation figures, or the budget): a pruned cell is never
    #: pending; every declared cell has records, or a reason here, or ``planned`` (test_rl_grid_accounting.py)
    pruned: str = ""
    #: a cell declared for a later session to run, and why (issue 70's cells): pending until it has records
    planned: str = ""

    def __post_init__(self):
        check_cell(self.name, self.seeds, FRONTIER_TASKS[self.task]["num_eval"], self.exploratory)
        if self.pruned and self.planned:
            raise ValueError(f"cell {self.name}: pruned and planned at once")

    @property
    def name(self) -> str:
        return f"{self.family}-lr{self.lr}-beta{self.beta}"

    def allows(self, seed: int) -> bool:
        """A seed of the cell's definition, or one of the seeds a close verdict adds (``EXTRA_SEEDS``)."""
        return seed in self.seeds or (not self.exploratory and seed in EXTRA_SEEDS)

    @property
    def tool(self) -> str:
        return "mezo-rl" if self.family.startswith("mezo") else "trl-grpo"

    @property
    def variant(self) -> bool:
        """A moonshot variant (a family with a third part: ``mezo-full-pop16``): a fix the issue compares on every
        seed, on the frontier or not (at the lr seed 0's validation picks, when it has several)."""
        return self.family.count("-") >= 2


#: MeZO trains for the task's budget of seconds, as GRPO does (benchmarks/mezo_budget.py: the same stopping rule),
#: with validations at each third of it; its --max-steps and --eval-steps are only a cap. A record whose command is
#: not its cell's current one is superseded (kept out), and a record whose training seconds miss the budget by more
#: than one validation interval is not equal-time (kept out).
MEZO_STEP_CAP = 1000
#: the sentiment prompt files MeZO's cells train and score on: the example's writer (examples/rl_sentiment.py) at
#: the task's sizes, the same files the GRPO script writes into each cell's folder; named relative to the checkout
#: (the cells run there), so a command does not depend on where the checkout lies
SENTIMENT_PROMPTS = FRONTIER_RUNS.relative_to(REPO) / "sentiment-prompts"
SENTIMENT_REWARD = "examples/sentiment_reward.py:" + REWARD
SENTIMENT_GUARD = "examples/sentiment_reward.py:repetition"
MEZO_BUDGET = REPO / "benchmarks" / "mezo_budget.py"
UNTOUCHED_SCRIPT = REPO / "benchmarks" / "untouched.py"
#: the picked weights a curriculum stage starts from: PICKS / "<stage>-<tool>-s<seed>" (``--stage export`` writes them)
PICKS = FRONTIER_RUNS.relative_to(REPO) / "picks"
#: validations in a cell's training (both tools: at each third of the budget; MeZO through mezo_budget.py, GRPO by
#: --eval-points): the resolution of its pick, and so the tolerance of "equal time" (a third of the budget)
FRONTIER_EVAL_POINTS = 3


def _frontier_cells(task: str, family: str, lrs, betas, *variant: str, launcher: tuple = (), pruned=None,
                    planned: str = "", **sizes) -> list[FrontierCell]:
    """The cells of ``family`` (tool-peft, then an optional variant's name: ``mezo-full-rank``) over ``lrs`` x
    ``betas``; a MeZO variant's own arguments are ``variant``, its ``batch``/``n_spsa`` (``_mezo``'s) and its
    ``launcher`` arguments (benchmarks/mezo_budget.py's). ``pruned``: cell name -> why it is not run (see
    :data:`PRUNED`); ``planned``: why the cells are declared for a later session."""
    out = []
    pruned = PRUNED if pruned is None else pruned
    tool, peft = family.split("-")[:2]
    for lr in lrs:
        for beta in betas:
            if tool == "mezo":
                extra = () if peft == "norm" else _BATCHED
                args = _mezo(peft, lr, MEZO_STEP_CAP, *extra, "--beta", beta, "--autocast", PRECISION, *variant,
                             **sizes)
            else:
                args = ["--peft", peft, "--lr", lr, "--beta", beta, "--autocast", PRECISION,
                        "--eval-points", str(FRONTIER_EVAL_POINTS), *variant]
            name = f"{family}-lr{lr}-beta{beta}"
            out.append(FrontierCell(task, family, lr, beta, tuple(args), launcher=tuple(launcher),
                                    pruned=pruned.get((task, name), ""), planned=planned))
    return out


#: (task, cell) -> why the declared cell is not run (issue 70: "each declared cell either has records or is pruned,
#: with the reason"). Issue 50 left these 17 arithmetic cells without a current record and recorded no reason; the
#: reasons below are read off the records' *validation* figures (docs/results/rl_frontier.jsonl, including the seed-0
#: records of earlier definitions of a cell, which the protocol keeps out of comparisons but which still say where
#: a cell lands), never off test. Where no record speaks for or against a cell, the reason says so.
_BETA1 = ("pruned: beta 1 shrinks MeZO's step towards the start; at lr 1e-3 its earlier 24-step definition gained "
          "+0.020 on validation at validation kl 0.014 (seed 0), below mezo-lora-lr3e-3-beta0's +0.12 at kl 0.009, so "
          "beta 1 adds no frontier point at the kl it reaches")
_GRPO_FULL_BETA0 = ("pruned: beta 0 only moves a full-weight GRPO cell to a larger kl than its beta-0.04 cell, which at "
                    "this lr already reaches validation kl 0.31-0.47; at kl that large GRPO's LoRA beta-0 cells hold "
                    "its frontier (grpo-lora-lr3e-4-beta0: validation gain +0.59 at kl 0.53)")
_GRPO_LORA_BETA04 = ("pruned: GRPO's low-kl side is held by its full-weight beta-0.2 and beta-1 cells (validation kl "
                     "0.006-0.18); a LoRA cell with beta 0.04 lands between LoRA's beta-0 cells (kl 0.39-0.56) and "
                     "grpo-full-lr3e-6-beta0.04 (kl 0.34, gain +0.52), where GRPO already has compared cells")
PRUNED = {
    ("arithmetic", "mezo-full-lr1e-3-beta1"): _BETA1,
    ("arithmetic", "mezo-full-lr3e-3-beta1"): _BETA1 + " (at lr 3e-3, beta 0.1 already held the earlier 24-step "
                                                       "definition to +0.20 at kl 0.086)",
    ("arithmetic", "mezo-full-lr1e-2-beta0"): "pruned: lr 1e-2 diverges; its earlier 58-step definition picked step 19 "
                                              "with a validation gain of +0.040 at validation kl 0.54 (seed 0)",
    ("arithmetic", "mezo-full-lr1e-2-beta0.1"): "pruned: its earlier 24-step definition gained +0.17 on validation at "
                                                "validation kl 0.36 (seed 0), dominated by mezo-full-lr3e-3-beta0 "
                                                "(+0.44 at kl 0.38 on the same seed)",
    ("arithmetic", "mezo-full-lr1e-2-beta1"): "pruned: lr 1e-2 diverges at beta 0 (mezo-full-lr1e-2-beta0's reason), "
                                              "and beta 1 adds no frontier point at lr 1e-3",
    ("arithmetic", "mezo-lora-lr3e-3-beta1"): "pruned: mezo-lora-lr3e-3-beta0 already sits at validation kl 0.005-0.011 "
                                              "(gain +0.10-0.14); beta 1 can only lower a kl that small",
    ("arithmetic", "mezo-lora-lr1e-2-beta1"): "pruned: beta 1 at lr 1e-2 lands between mezo-lora-lr3e-3-beta0 (kl 0.009) "
                                              "and mezo-lora-lr1e-2-beta0 (kl 0.12-0.17), where mezo-full-lr1e-3-beta0.1 "
                                              "(kl 0.07-0.08, gain +0.25-0.27) already holds MeZO's frontier",
    ("arithmetic", "mezo-lora-lr3e-2-beta0"): "pruned for the budget, not on evidence: no record speaks for or against "
                                              "it; LoRA's validation gain grew from lr 3e-3 (+0.12) to 1e-2 (+0.34), so "
                                              "this cell might extend MeZO's frontier and is the first to add if time "
                                              "allows",
    ("arithmetic", "mezo-lora-lr3e-2-beta1"): "pruned for the budget: its beta-0 cell has no record (see "
                                              "mezo-lora-lr3e-2-beta0)",
    ("arithmetic", "mezo-norm-lr0.03-beta0"): "pruned: the final norm alone reached a validation gain of only "
                                              "+0.12-0.14 at lr 0.1 (kl 0.03-0.24), where every-weight and LoRA cells "
                                              "gain more at less kl; a smaller lr moves less",
    ("arithmetic", "mezo-norm-lr0.3-beta0"): "pruned: the final norm alone reached +0.12-0.14 at lr 0.1 with a kl that "
                                             "already varied 0.03-0.24 over seeds; a 3x larger sign step of the norm's "
                                             "gains moves kl further for a gain its lr 0.1 cell shows to be small",
    ("arithmetic", "grpo-full-lr3e-6-beta0"): _GRPO_FULL_BETA0,
    ("arithmetic", "grpo-full-lr1e-5-beta0"): _GRPO_FULL_BETA0,
    ("arithmetic", "grpo-full-lr3e-5-beta0"): _GRPO_FULL_BETA0 + " (at lr 3e-5, beta 0.04 already lost gain: +0.34 at "
                                                                 "kl 0.51, seed 0)",
    ("arithmetic", "grpo-lora-lr1e-4-beta0.04"): _GRPO_LORA_BETA04,
    ("arithmetic", "grpo-lora-lr3e-4-beta0.04"): _GRPO_LORA_BETA04,
    ("arithmetic", "grpo-lora-lr1e-3-beta0.04"): _GRPO_LORA_BETA04,
}
#: issue 70's cells: declared here, run by a later session (each says why it exists)
_GAP = "issue 70: GRPO's compared frontier jumps from validation kl {lo} to {hi}; this cell aims between them ({how})"
_FOUR_X = ("issue 70: four times the budget for {what} (chosen on validation: its tool's highest mean validation "
           "gain among compared cells in docs/results/rl_frontier.jsonl), to see whether MeZO, stopped while it was "
           "climbing, catches up")
_NO_GC = ("issue 70: the best full-weight GRPO cell (on validation) without TRL's default gradient checkpointing, "
          "which every full-weight GRPO run so far used (its step time and memory both ways: benchmarks/grpo_gc.py)")
_CURRICULUM = ("issue 70: Countdown's curriculum: 2-number puzzles in chat form (where the model sometimes answers "
               "right, without tags), then 3, then 4, reward countdown_lenient (a right equation with or without "
               "tags, 0.1 for a well-formed one over the numbers); a stage after the first starts from the previous "
               "stage's validation pick of the same tool and seed")

#: the grids. Arithmetic: each tool's lr x beta, GRPO LoRA's lr bracketed above 1e-4 (the study's best was its
#: grid's top); sentiment: the lr tuned on sentiment itself (not carried over from arithmetic)
FRONTIER_GRIDS = {
    "arithmetic": [*_frontier_cells("arithmetic", "mezo-full", ["1e-3", "3e-3", "1e-2"], ["0", "0.1", "1"]),
                   *_frontier_cells("arithmetic", "mezo-lora", ["3e-3", "1e-2", "3e-2"], ["0", "1"]),
                   *_frontier_cells("arithmetic", "mezo-norm", ["0.03", "0.1", "0.3"], ["0"]),
                   *_frontier_cells("arithmetic", "grpo-full", ["3e-6", "1e-5", "3e-5"], ["0", "0.04", "0.2"]),
                   *_frontier_cells("arithmetic", "grpo-lora", ["1e-4", "3e-4", "1e-3"], ["0", "0.04"]),
                   # GRPO below the smallest kl its grid reached, where only MeZO had a compared cell
                   # (docs/mezo-or-grpo.md): lr 1e-6, then 3e-7 below that one's kl, then a larger beta
                   *_frontier_cells("arithmetic", "grpo-full", ["1e-6", "3e-7"], ["0.2"]),
                   *_frontier_cells("arithmetic", "grpo-full", ["1e-6"], ["1"]),
                   # issue 70: a cell in each of GRPO's kl gaps (0.073-0.176: lr between the two beta-0.2 cells;
                   # 0.176-0.341: beta between lr 1e-5's 0.2 and 0.04 cells)
                   *_frontier_cells("arithmetic", "grpo-full", ["5e-6"], ["0.2"],
                                    planned=_GAP.format(lo=0.073, hi=0.176, how="lr 5e-6, between grpo-full-lr3e-6-"
                                                        "beta0.2 and grpo-full-lr1e-5-beta0.2")),
                   *_frontier_cells("arithmetic", "grpo-full", ["1e-5"], ["0.1"],
                                    planned=_GAP.format(lo=0.176, hi=0.341, how="beta 0.1, between grpo-full-lr1e-5-"
                                                        "beta0.2 (kl 0.176) and grpo-full-lr1e-5-beta0.04 (kl 0.46)")),
                   # issue 70: GRPO both ways: its best full-weight cell without gradient checkpointing
                   *_frontier_cells("arithmetic", "grpo-full-nogc", ["3e-6"], ["0.04"], "--no-gradient-checkpointing",
                                    planned=_NO_GC),
                   # the moonshot (issue 50): MeZO's best seed-0 cell (every weight, lr 3e-3, beta 0) with what the
                   # literature says closes the gap: a larger population (16 members), more prompts per member (32
                   # a step), rank-based fitness shaping (ES-at-scale)
                   *_frontier_cells("arithmetic", "mezo-full-pop16", ["3e-3"], ["0"], n_spsa=8),
                   *_frontier_cells("arithmetic", "mezo-full-b32", ["3e-3"], ["0"], batch=32),
                   *_frontier_cells("arithmetic", "mezo-full-rank", ["3e-3"], ["0"], "--reward-shaping", "rank"),
                   # and diagonal preconditioning of the update: ZO-Adam (the paper's Appendix B.2: a per-weight
                   # second moment scales each weight's step), over MeZO's full-weight lrs
                   *_frontier_cells("arithmetic", "mezo-full-adam", ["3e-4", "1e-3", "3e-3"], ["0"], "--adam"),
                   # and of the perturbation: HiZOO (a curvature estimate scales each weight's noise), its smoothing
                   # alpha on a grid of decades at that cell's lr; one variant, its alpha picked on validation
                   *[c for alpha in ("1e-5", "1e-4", "1e-3")
                     for c in _frontier_cells("arithmetic", f"mezo-full-hizoo-a{alpha}", ["3e-3"], ["0"],
                                              "--hessian-smooth", alpha)],
                   # HiZOO's control: its curvature grew alike for every weight (H^-1/2's RMS over the weights, from
                   # the 3 seeds' trajectories replayed, fits (1 + k t)^-p), so plain MeZO with its lr and eps
                   # decayed as that RMS did tells the per-weight part from the decay; one cell per alpha matched
                   # (1e-5: k 0.023, p 1/2; 1e-4: k 0.072, p 1), each its own variant (on every seed)
                   *_frontier_cells("arithmetic", "mezo-full-decaysqrt", ["3e-3"], ["0"],
                                    launcher=("--scale-decay", "0.023", "--scale-decay-power", "0.5")),
                   *_frontier_cells("arithmetic", "mezo-full-decayinv", ["3e-3"], ["0"],
                                    launcher=("--scale-decay", "0.072", "--scale-decay-power", "1"))],
    "sentiment": [*_frontier_cells("sentiment", "mezo-full", ["3e-4", "1e-3", "3e-3"], ["0", "0.3"]),
                  *_frontier_cells("sentiment", "grpo-full", ["3e-6", "1e-5", "3e-5", "1e-4"], ["0", "0.04"])],
    # issue 70: four times the budget (FRONTIER_TASKS["arithmetic-4x"]) for each tool's best cell on validation
    "arithmetic-4x": [*_frontier_cells("arithmetic-4x", "mezo-full-hizoo-a1e-5", ["3e-3"], ["0"], "--hessian-smooth",
                                       "1e-5", planned=_FOUR_X.format(what="MeZO's best cell")),
                      *_frontier_cells("arithmetic-4x", "grpo-full", ["3e-6"], ["0.04"],
                                       planned=_FOUR_X.format(what="GRPO's best full-weight cell")),
                      *_frontier_cells("arithmetic-4x", "grpo-lora", ["3e-4"], ["0"],
                                       planned=_FOUR_X.format(what="GRPO's best LoRA cell"))],
    # issue 70: Countdown's curriculum (2 numbers, then 3, then 4), both tools around their arithmetic lrs
    **{stage: [*_frontier_cells(stage, "mezo-full", ["1e-3", "3e-3"], ["0"], planned=_CURRICULUM),
               *_frontier_cells(stage, "grpo-full", ["3e-6", "1e-5"], ["0"], planned=_CURRICULUM),
               *_frontier_cells(stage, "grpo-lora", ["3e-4"], ["0"], planned=_CURRICULUM)]
       for stage in ("countdown-curriculum2", "countdown-curriculum3", "countdown-curriculum4")},
    # the guard is the regulariser here (beta 0); each tool's lrs around its unguarded sentiment picks
    "sentiment-guard": [*_frontier_cells("sentiment-guard", "mezo-full", ["3e-4", "1e-3", "3e-3"], ["0"]),
                        *_frontier_cells("sentiment-guard", "grpo-full", ["3e-6", "1e-5", "3e-5"], ["0"])],
}


def frontier_cell(task: str, name: str) -> FrontierCell:
    for c in FRONTIER_GRIDS[task]:
        if c.name == name:
            return c
    raise SystemExit(f"unknown {task} frontier cell {name!r}; known: {', '.join(c.name for c in FRONTIER_GRIDS[task])}")


def frontier_command(cell: FrontierCell, seed: int, out_dir: pathlib.Path) -> list[str]:
    """The cell's command: ``mezo-rl train`` for the task's budget of seconds (benchmarks/mezo_budget.py; sentiment:
    on the prompt files of ``SENTIMENT_PROMPTS``, which ``run_frontier_cell`` writes first) or the GRPO script, with
    the task's prompt counts and the protocol's precision."""
    t = FRONTIER_TASKS[cell.task]
    if not cell.allows(seed):
        raise SystemExit(f"{cell.name}: seed {seed} is not one of the cell's seeds {cell.seeds} (or {EXTRA_SEEDS}, "
                         "which a close verdict adds)")
    sizes = ["--num-train", str(t["num_train"]), "--num-eval", str(t["num_eval"]), "--num-test", str(t["num_test"])]
    if t.get("start_from"):  # a curriculum stage: the previous stage's pick of this tool and seed
        sizes += ["--model", str(PICKS / f"{t['start_from']}-{cell.tool}-s{seed}")]
    guard = t.get("guard")
    if cell.tool == "mezo-rl":
        if cell.task in SENTIMENT_TASKS:
            files = {split: str(SENTIMENT_PROMPTS / f"{split}.jsonl") for split in ("train", "validation", "test")}
            task = ["--task", files["train"], "--validation-file", files["validation"], "--test-file", files["test"],
                    "--reward", SENTIMENT_REWARD,
                    *(["--reward", SENTIMENT_GUARD, "--reward-weights", "1", "--reward-weights", guard] if guard else [])]
        else:
            task = ["--task", t.get("task", cell.task), "--reward", t["reward"]]
        return [sys.executable, str(MEZO_BUDGET), "--time-budget-s", str(t["budget_s"]), "--eval-points",
                str(FRONTIER_EVAL_POINTS), *cell.launcher, "--", *task,
                "--max-completion-length", str(t["max_new_tokens"]), "--eval-batch-size", "64", "--log-completions",
                str(t["num_test"]), "--seed", str(seed), *sizes, *cell.args, "--dtype", WEIGHTS,
                "--output-dir", str(out_dir / "run")]
    task = (["--repetition-weight", guard] if guard else []) if cell.task in SENTIMENT_TASKS \
        else ["--task", t.get("task", cell.task), "--reward", t["reward"]]
    return [sys.executable, str(GRPO), *task, "--output-dir", str(out_dir), "--seed", str(seed),
            "--max-completion-length", str(t["max_new_tokens"]), "--num-generations", "4", "--batch-size", "16",
            "--time-budget-s", str(t["budget_s"]), "--no-base-loglik", *sizes, *cell.args]


#: mezo-rl's options renamed since records were made (issue 69: one word, one meaning), old -> new: a recorded
#: command is read under the new names, so it still stands for the cell it ran
RENAMED_FLAGS = {"--evaluation": "--member-evaluation"}


def _command_key(command: str) -> list[str]:
    """A cell command's arguments without the interpreter, the output directory, ``--resume`` (a run stopped
    part-way and resumed is the same run) and the checkout's own path (a script is named by its folder and file);
    a renamed option under its new name (:data:`RENAMED_FLAGS`); without ``--dtype float32``, which MeZO's cells pin
    since ``--dtype``'s default became ``auto`` (their earlier records ran float32 weights without it)."""
    args = [RENAMED_FLAGS.get(a, a) for a in shlex.split(command)[1:]]
    for i in range(len(args) - 1):  # the pinned weights (WEIGHTS): a record made before the pin ran them unpinned
        if args[i:i + 2] == ["--dtype", WEIGHTS]:
            del args[i:i + 2]
            break
    valued = ("--output-dir", *UNTOUCHED_OPTIONS)  # the untouched read happens after training: not the cell's definition
    return ["/".join(pathlib.PurePath(a).parts[-2:]) if a.endswith(".py") else a
            for i, a in enumerate(args) if a not in ("--resume", *UNTOUCHED_OPTIONS)
            and (i == 0 or args[i - 1] not in valued)]


#: the GRPO script's options of what it does after training (the untouched read, benchmarks/suite/untouched.py; the
#: picked weights saved for a curriculum's next stage), each with a value: not part of a cell's definition
UNTOUCHED_OPTIONS = ("--untouched-cell", "--untouched-task", "--save-picked")


#: where a tool's behaviour changed under an unchanged command: (tool, the commit that changed it, what ran before).
#: A record made at a commit that does not contain the change is superseded (``protocol.made_before``).
BEHAVIOUR_CHANGES = [
    ("trl-grpo", "f0736e8", "the GRPO script ended completions at their first newline before f0736e8 (now at EOS, "
                            "as TRL and mezo-rl's prompt tasks do)"),
]


def superseded(record: dict) -> str:
    """Why a frontier record does not stand for its cell: its command is not the cell's current definition (e.g.
    a MeZO cell since re-sized to the budget), it was made before a change of its tool's behaviour under the same
    command (``BEHAVIOUR_CHANGES``), or its training time missed the budget by more than a validation interval;
    "" if it stands."""
    cell = next((c for c in FRONTIER_GRIDS.get(record.get("task"), []) if c.name == record.get("cell")), None)
    if cell is None:
        return "no such cell in the current grid"
    seed = record.get("seed")
    if "command" not in record:
        return "no command recorded"
    if not cell.allows(seed):
        return "not a seed of the cell's current definition"
    now = _command_key(shlex.join(frontier_command(cell, seed, FRONTIER_RUNS / "x")))
    if _command_key(record["command"]) != now:
        was = record.get("steps")
        return "superseded: an earlier definition of the cell" + (f" ({was} steps)" if was is not None else "")
    for tool, change, before in BEHAVIOUR_CHANGES:
        if cell.tool == tool and made_before(str(REPO), change, str(record.get("commit", ""))):
            return f"superseded: {before}"
    budget, took = FRONTIER_TASKS[cell.task]["budget_s"], record.get("train_s")
    if record.get("ok") and took is not None and abs(took - budget) > budget / FRONTIER_EVAL_POINTS:
        return (f"not equal-time: trained {took:.0f} s against the {budget} s budget (more than a validation "
                f"interval, {budget / FRONTIER_EVAL_POINTS:.0f} s, apart)")
    return ""


def current_records(records: list[dict]) -> list[dict]:
    """The frontier records that stand for their cell's current definition."""
    return [r for r in records if not superseded(r)]


def write_sentiment_prompts(data_dir: str | None, root: pathlib.Path = REPO) -> dict[str, pathlib.Path]:
    """The prompt files of the sentiment MeZO cells (``SENTIMENT_PROMPTS`` under the checkout ``root``): the example's
    own writer at the task's sizes, from ``data_dir``'s SST-2 (a fixed shuffle: written again, the same files)."""
    if not data_dir or not (pathlib.Path(data_dir) / "SST-2" / "LM-BFF-original").is_dir():
        raise SystemExit(f"the sentiment cells read SST-2: set MEZO_RL_DATA to the directory holding "
                         f"SST-2/LM-BFF-original/, got {data_dir!r}")
    example = import_path(EXAMPLE, "rl_sentiment_example")
    t = FRONTIER_TASKS["sentiment"]
    return example.write_prompts(pathlib.Path(data_dir), root / SENTIMENT_PROMPTS, t["num_train"], t["num_eval"],
                                 t["num_test"], t["words"])


def run_frontier_cell(cell: FrontierCell, seed: int) -> dict:
    """Run one (cell, seed) in a subprocess (a MeZO cell stopped part-way resumes) and append its record."""
    if cell.task in SENTIMENT_TASKS and cell.tool == "mezo-rl":
        write_sentiment_prompts(os.environ.get("MEZO_RL_DATA"))
    out_dir = FRONTIER_RUNS / f"{cell.task}-{cell.name}-s{seed}"
    cmd = frontier_command(cell, seed, out_dir)
    reads_untouched = cell.task in UNTOUCHED_TASKS and not cell.exploratory
    if reads_untouched:
        untouched.Ledger().check(cell.task, cell.name, seed)  # refused before any training: read once
        if cell.tool == "trl-grpo":  # read in the GRPO process, with the picked weights in place
            cmd += ["--untouched-cell", cell.name, "--untouched-task", cell.task]
    if cell.tool == "trl-grpo" and any(t.get("start_from") == cell.task for t in FRONTIER_TASKS.values()):
        cmd += ["--save-picked", str(out_dir / "picked")]  # a later curriculum stage may start from it
    run_dir = out_dir / "run"
    if (run_dir / "summary.json").is_file() or (out_dir / "summary.json").is_file():
        set_aside(out_dir)  # a finished run whose record no longer stands (pending again): start afresh
    if cell.tool == "mezo-rl" and (run_dir / "checkpoint").is_dir() and not (run_dir / "summary.json").is_file():
        cmd.append("--resume")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(REPO))
    out_dir.mkdir(parents=True, exist_ok=True)
    code = protocol_commit(REPO)  # the code the run starts with
    t0 = time.time()
    with (out_dir / "log.txt").open("a") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    if reads_untouched and cell.tool == "mezo-rl" and os.waitstatus_to_exitcode(status) == 0:
        # the MeZO run replayed to validation's pick from its trajectory, the untouched split read once
        with (out_dir / "log.txt").open("a") as log:
            subprocess.run([sys.executable, str(UNTOUCHED_SCRIPT), "--read-run", str(run_dir), "--task", cell.task,
                            "--cell", cell.name, "--seed", str(seed)], cwd=REPO, env=env, stdout=log,
                           stderr=subprocess.STDOUT, check=False)
    record = {"protocol": PROTOCOL, "task": cell.task, "cell": cell.name, "family": cell.family, "tool": cell.tool,
              "lr": float(cell.lr), "beta": float(cell.beta), "seed": seed, "exploratory": cell.exploratory,
              "command": shlex.join(cmd), "commit": code, "cpu": cpu_info(), "machine": machine(),
              "wall_s": time.time() - t0, "peak_rss_mb": usage.ru_maxrss / 1024,
              "date": _dt.date.today().isoformat(), "ok": os.waitstatus_to_exitcode(status) == 0}
    if record["ok"]:
        try:
            record = complete_frontier(record, out_dir)
        except ProtocolError as e:  # the run broke the protocol: recorded, never admitted
            record.update(ok=False, protocol_error=str(e))
        if reads_untouched and "untouched" not in record:  # its ledger line stands: the cell is not read again
            record["untouched_error"] = f"the untouched read left no untouched.json (see {out_dir / 'log.txt'})"
    append_record(FRONTIER_RECORDS, record)
    return record


def complete_frontier(record: dict, out_dir: pathlib.Path) -> dict:
    """A finished cell's figures, its test figures taken only after its evaluations replay through the protocol's
    TestGate (ProtocolError otherwise): the pick, test before -> after with the paired gain, kl, n, the tool's full
    configuration, the precision, the counts, sample completions, distinct-2 and base log-likelihood, s/step."""
    from mezo_rl.cli.plots import read_jsonl
    from mezo_rl.training.rundir import read_samples

    reward = FRONTIER_TASKS[record["task"]]["reward"]
    if record["tool"] == "mezo-rl":
        run_dir = out_dir / "run"
        summary = json.loads((run_dir / "summary.json").read_text())
        config = json.loads((run_dir / CONFIG_FILE).read_text())
        lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        gate = TestGate.replay(reads_of_mezo_run(lines, summary["best_step"]))
        record["validation_curve"] = curves.mezo_curve(lines, reward)
        secs = step_seconds(run_dir)
        before, after = read_samples(run_dir, "test", 0), read_samples(run_dir, "test", summary["steps"])
        record.update(train_s=sum(secs), s_per_step=sorted(secs)[len(secs) // 2] if secs else None,
                      precision=precision_of(config.get("autocast", "auto")), config=config)
    else:
        summary = json.loads((out_dir / "summary.json").read_text())
        gate = TestGate.replay(summary["reads"])
        before, after = (read_jsonl(out_dir / "samples" / f"test-{w}.jsonl") for w in ("before", "after"))
        record.update({k: summary.get(k) for k in ("train_s", "s_per_step", "trl_version", "peak_train_rss_mb",
                                                   "precision", "stopped_by")})
        record["validation_curve"] = curves.grpo_curve(summary.get("validations") or [], reward)
        record["config"] = summary["grpo_config"]
    if gate.pick() != summary["best_step"]:
        raise ProtocolError(f"the run tested step {summary['best_step']}; validation picked step {gate.pick()}")
    record.update(steps=summary["steps"], best_step=summary["best_step"], pick=gate.record(),
                  **{k: summary[k] for k in ("initial_validation", "validation", "initial_test", "test")})
    record["n"] = {"validation": int(summary["validation"]["n"]), "test": int(summary["test"]["n"])}
    record["paired"] = paired_gain(before, after, reward)
    record["counts"] = {"before": text_counts(before), "after": text_counts(after)}
    record["base_loglik"] = hacking_measures(before, after)
    record["samples"] = sample_pairs(before, after, reward)
    # per-prompt outcomes (issue 70: a bootstrap over prompts and seeds needs them): the development split ("test"
    # in the run's files) before and after, and the untouched split where the cell read it
    record["outcomes"] = {"development": {"before": prompt_outcomes(before, reward),
                                          "after": prompt_outcomes(after, reward)}}
    read = next((d / "untouched.json" for d in (out_dir / "run", out_dir) if (d / "untouched.json").is_file()), None)
    if read is not None:
        got = json.loads(read.read_text())
        if got["step"] != record["best_step"]:
            raise ProtocolError(f"the untouched split was read at step {got['step']}; validation picked step "
                                f"{record['best_step']}")
        record["outcomes"]["untouched"] = {"after": got.pop("outcomes")}
        record["untouched"] = got
    return record


def prompt_id(sample: dict) -> str:
    """A completion's prompt as text (a chat prompt: its last message), the key that pairs outcomes across runs."""
    prompt = sample["prompt"]
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


def prompt_outcomes(samples: list[dict], reward: str) -> list[list]:
    """``[prompt id, reward]`` per completion, in the order evaluated."""
    return [[prompt_id(x), x.get(reward)] for x in samples]


def bootstrap_verdicts(summaries: list[dict], records: list[dict], split: str = "untouched") -> list[str]:
    """One line per kl band of ``who_wins`` (the cells validation chose at each validation-kl budget) whose two cells
    both carry per-prompt outcomes of ``split`` on the same seeds (at least MIN_SEEDS): the paired bootstrap of
    MeZO - GRPO over prompts and seeds, the verdict, and whether the pair needs ``bootstrap.MORE_SEEDS`` seeds."""
    out = []
    for row in who_wins(summaries):
        if not (row["mezo"] and row["grpo"]):
            continue
        pair = [[r for r in records if r["cell"] == cell and split in (r.get("outcomes") or {})]
                for cell in (row["mezo"], row["grpo"])]
        seeds = {r["seed"] for r in pair[0]} & {r["seed"] for r in pair[1]}
        if len(seeds) < MIN_SEEDS:
            continue
        iv = bootstrap.compare_cells(pair[0], pair[1], split)
        more = (f"; within {bootstrap.CLOSE_SE:g} SE: run seeds {len(seeds)}..{bootstrap.MORE_SEEDS - 1} of both cells"
                if bootstrap.needs_more_seeds(iv) else "")
        budgets = f"{row['lo']:.4f}" + (f" to {row['hi']:.4f}" if row["hi"] > row["lo"] else "")
        out.append(f"- the pair chosen at validation kl {budgets}: **{bootstrap.verdict(iv, 'MeZO', 'TRL GRPO')}**: "
                   f"MeZO {row['mezo']} vs GRPO {row['grpo']}, {split} difference {iv.diff:+.3f}, 95% interval "
                   f"[{iv.lo:+.3f}, {iv.hi:+.3f}] (SE {iv.se:.3f}; {iv.seeds} seeds x {iv.prompts} prompts){more}.")
    return out


def learned_statements(summaries: list[dict], records: list[dict], split: str = "development") -> list[str]:
    """One line per compared cell whose every seed carries per-prompt ``split`` outcomes before and after training:
    the paired bootstrap (over prompts and seeds) of its gain over the starting weights, and whether it learned (the
    95% interval excludes 0) or not. Issue 70's question for Countdown, "learned, or an honest negative", answered
    with error bars that include the prompts."""
    out = []
    for s in summaries:
        rows = [r for r in records if r["cell"] == s["cell"]
                and {"before", "after"} <= set((r.get("outcomes") or {}).get(split) or ())]
        if not s["compared"] or len(rows) != len(s["seeds"]):
            continue
        iv = bootstrap.gain_over_start(rows, split)
        said = "learned" if iv.lo > 0 else ("lost" if iv.hi < 0 else "not learned (the interval includes 0)")
        out.append(f"- {TOOLS.get(s['tool'], s['tool'])} {s['cell']}: **{said}**: {split} gain {iv.diff:+.3f}, "
                   f"95% interval [{iv.lo:+.3f}, {iv.hi:+.3f}] (SE {iv.se:.3f}; {iv.seeds} seeds x {iv.prompts} "
                   f"prompts), at {split} kl {s['kl']:.3f}.")
    return out


def frontier_pending(task: str, stage: str, names: list[str] | None, records: list[dict]) -> list[tuple]:
    """The (cell, seed) pairs a stage still has to run on this machine: "grid" every cell's first seed, "seeds"
    the other seeds of the cells on seed 0's validation frontier (candidates) and of the moonshot's variants
    (``variants_chosen``: each fix is compared on every seed), "all" both."""
    here = machine()
    records = current_records(records)
    done = {(r["cell"], r["seed"]) for r in records if r.get("task") == task and r.get("ok") and r.get("machine") == here}
    grid = [c for c in FRONTIER_GRIDS[task] if (names is None or c.name in names) and not c.pruned]
    todo = []
    if stage in ("grid", "all"):  # a task declared every_seed (the 4x-budget cells) runs every seed in this stage
        every = FRONTIER_TASKS[task].get("every_seed")
        todo += [(c, s) for c in grid for s in (c.seeds if every else c.seeds[:1])]
    if stage in ("seeds", "all"):
        mine = [r for r in records if r.get("task") == task and r.get("machine") == here]
        chosen = set(candidates(mine, FRONTIER_TASKS[task]["reward"], seed=FRONTIER_SEEDS[0]))
        chosen |= variants_chosen(task, mine)
        todo += [(c, s) for c in grid if c.name in chosen for s in c.seeds[1:]]
    if stage == "export":
        return []  # export_picks does the work
    if stage in ("untouched", "more-seeds"):
        # a pair is read again where its cells ran: the same 640 s of step time buys another number of steps, at
        # another precision (bf16 autocast only where it is native), on another kind of CPU, so a rerun elsewhere
        # is not the cell validation chose
        mine = [r for r in records if r.get("task") == task and r.get("machine") == here]
        if not mine and any(r.get("task") == task for r in records):
            print(f"{task}: its records were made on {sorted({r.get('machine') for r in records if r.get('task') == task})}"
                  f", not on this machine ({here}): stage {stage!r} reruns a pair on the machine its cells ran on",
                  file=sys.stderr)
        return untouched_pending(task, stage, grid, mine)
    return [(c, s) for c, s in todo if (c.name, s) not in done]


def verdict_pairs(task: str, records: list[dict]) -> list[tuple[str, str]]:
    """The (MeZO cell, GRPO cell) pairs validation chose at each kl band (``who_wins`` over the compared cells), the
    pairs a verdict compares."""
    rows = who_wins(summarise([r for r in records if r.get("task") == task], FRONTIER_TASKS[task]["reward"]))
    return list(dict.fromkeys((r["mezo"], r["grpo"]) for r in rows if r["mezo"] and r["grpo"]))


def untouched_pending(task: str, stage: str, grid: list, records: list[dict]) -> list[tuple]:
    """Stage "untouched": every seed of the cells in a verdict pair (``verdict_pairs``) whose record carries no
    untouched read (it is run again: the read happens at the end of a run); stage "more-seeds": the EXTRA_SEEDS of
    both cells of each pair whose verdict is within bootstrap.CLOSE_SE SE (``bootstrap.needs_more_seeds``), judged
    on the untouched split, or on development for a task without one (Countdown: ``bootstrap_verdicts``' split)."""
    split = verdict_split(task)
    read = {(r["cell"], r["seed"]) for r in records if r.get("ok") and split in (r.get("outcomes") or {})}
    pairs = verdict_pairs(task, records)
    if stage == "untouched":
        if split != "untouched":
            print(f"{task} has no untouched split: its pairs are compared on development (stage 'more-seeds' adds "
                  "seeds to the close ones)", file=sys.stderr)
            return []
        chosen = {cell for pair in pairs for cell in pair}
        return [(c, s) for c in grid if c.name in chosen for s in c.seeds if (c.name, s) not in read]
    close = set()
    for m, g in pairs:
        sides = [[r for r in records if r.get("cell") == cell and (cell, r["seed"]) in read] for cell in (m, g)]
        if min(len({r["seed"] for r in side}) for side in sides) < MIN_SEEDS:
            continue  # the pair's reads are not all in (untouched: run stage "untouched" first)
        if bootstrap.needs_more_seeds(bootstrap.compare_cells(*sides, split)):
            close |= {m, g}
    # seed-major: both cells of a pair have seed 3 before either starts seed 4, so a stop between runs leaves pairs
    return [(c, s) for s in EXTRA_SEEDS for c in grid if c.name in close and (c.name, s) not in read]


def variants_chosen(task: str, records: list[dict]) -> set[str]:
    """The moonshot's variants that run on every seed: of each variant whose cells all have a seed-0 record, the cell
    with the largest seed-0 validation gain (one cell when the variant has one lr; the lr picked on validation when
    it has several; a variant with a setting of its own, ``mezo-full-hizoo-a1e-4``, is one variant over its
    settings: the families that share their first three parts). As for ``candidates``, a run whose validation picked its start (step 0) is the
    untrained model: a family whose every lr did so runs no more seeds."""
    first = {r["cell"]: r for r in records if r.get("seed") == FRONTIER_SEEDS[0] and r.get("ok")}
    families: dict[str, list[FrontierCell]] = {}
    for c in FRONTIER_GRIDS[task]:
        if c.variant:
            families.setdefault("-".join(c.family.split("-")[:3]), []).append(c)
    reward = FRONTIER_TASKS[task]["reward"]
    chosen = set()
    for cells in families.values():
        if all(c.name in first for c in cells):
            moved = [c for c in cells if left_start(first[c.name])]
            if moved:
                chosen.add(max(moved, key=lambda c: val_gain(first[c.name], reward)).name)
    return chosen


def stage_picks(task: str, records: list[dict]) -> dict[str, str]:
    """tool -> the cell a curriculum's next stage starts from: the tool's compared cell (MIN_SEEDS admitted seeds)
    with the highest mean validation gain (a choice on validation)."""
    rows = summarise([r for r in current_records(records) if r.get("task") == task], FRONTIER_TASKS[task]["reward"])
    out = {}
    for tool in ("mezo-rl", "trl-grpo"):
        compared = [s for s in rows if s["tool"] == tool and s["compared"]]
        if compared:
            out[tool] = max(compared, key=lambda s: s["val_gain"])["cell"]
    return out


def export_picks(task: str, dry_run: bool) -> int:
    """Write each tool's picked weights of ``task`` (``stage_picks``) for every seed to PICKS, where the next stage's
    commands read them: MeZO's by ``mezo-rl export`` (the run replayed to its pick), GRPO's from the run's saved
    ``picked`` directory."""
    import shutil

    picks = stage_picks(task, load_records(FRONTIER_RECORDS))
    if not picks:
        print(f"{task}: no compared cell yet (each needs {MIN_SEEDS} seeds)")
        return 1
    for tool, name in picks.items():
        cell = frontier_cell(task, name)
        for seed in cell.seeds:
            out_dir, dest = FRONTIER_RUNS / f"{task}-{name}-s{seed}", REPO / PICKS / f"{task}-{tool}-s{seed}"
            print(f"{task} {tool}: {name} seed {seed} -> {dest.relative_to(REPO)}")
            if dry_run:
                continue
            if tool == "mezo-rl":
                subprocess.run([sys.executable, "-m", "mezo_rl", "export", "--run-dir", str(out_dir / "run"),
                                "--output", str(dest), "--step", "best"], cwd=REPO, check=True,
                               env=dict(os.environ, PYTHONPATH=str(REPO)))
            else:
                shutil.copytree(out_dir / "picked", dest, dirs_exist_ok=True)
    return 0


def frontier_main(task: str, stage: str, names: list[str] | None, dry_run: bool) -> int:
    if stage == "export":
        return export_picks(task, dry_run)
    pending = frontier_pending(task, stage, names, load_records(FRONTIER_RECORDS))
    if dry_run:
        print("\n".join(f"{task} {c.name} seed {s}: {shlex.join(frontier_command(c, s, FRONTIER_RUNS / 'DIR'))}"
                        for c, s in pending) or "nothing pending")
        return 0
    for c, s in pending:
        try:
            r = run_frontier_cell(c, s)
        except ProtocolError as e:  # refused before training (its untouched split was read): the other cells still run
            print(f"{task} {c.name} seed {s}: REFUSED {e}", flush=True)
            continue
        print(f"{task} {c.name} seed {s}: {'ok' if r['ok'] else 'FAILED ' + r.get('protocol_error', '')} in "
              f"{r['wall_s']:.0f} s", flush=True)
    following = {"grid": "seeds", "seeds": "untouched", "all": "untouched", "untouched": "more-seeds"}
    if stage in following and not names:
        print(f"next: python benchmarks/rl.py --frontier {task} --stage {following[stage]}", flush=True)
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "results.py"), "--render-only"], cwd=REPO, check=False,
                   stdout=subprocess.DEVNULL)  # docs/results.md carries the frontier
    return 0


def render_frontier(records: list[dict]) -> str:
    """The frontier section of docs/results.md: per task, the cells' table, the plot, the generated statements
    of where each tool wins, the records kept out and why, counts and sample completions."""
    out = []
    for task in FRONTIER_TASKS:
        every = [r for r in records if r.get("task") == task]
        if not every:
            continue
        rows, old = current_records(every), [r for r in every if superseded(r)]
        reward = FRONTIER_TASKS[task]["reward"]
        summaries = summarise(rows, reward)
        t = FRONTIER_TASKS[task]
        out += ["", f"### {task}: each tool's reward-KL frontier (issue 50's protocol)", "",
                f"Generated from `docs/results/rl_frontier.jsonl` (`python benchmarks/rl.py --frontier {task}`). Every "
                f"choice read validation only ({t['num_eval']} prompts; the pick of each run is its record's `pick`); "
                "the development split ("
                + ("issue 50's test split, which every run read; renamed by issue 70; " if task in UNTOUCHED_TASKS
                   else "this task has no untouched split; ")
                + f"{t['num_test']} prompts a seed; the records' `test` fields) was read once per run, at that pick. "
                f"Compared cells have at least {MIN_SEEDS} seeds; development gain and kl are means over seeds with "
                "their SE over seeds (training noise only: every seed read the same prompts). Frontier: "
                "the cells no other cell of the tool beats on validation (gain at no larger kl). Equal time: each "
                f"cell trains for about {t['budget_s']} s (the sum of its steps' seconds, evaluations excluded; "
                "MeZO through `benchmarks/mezo_budget.py`, GRPO through its script's `--time-budget-s`, one stopping "
                "rule; a record that missed it by more than a validation interval is kept out). Precision: "
                + ", ".join(sorted({r.get('precision') or '?' for r in rows if r.get('ok')})) + "."
                + (f" Guard: both tools train on {reward} plus the example's `repetition` reward at weight "
                   f"{t['guard']} and pick their step on that objective; gains are {reward}'s." if t.get("guard")
                   else ""), ""]
        out += frontier_table(summaries)
        png = plot_frontier(summaries, FRONTIER_PLOTS / f"rl_frontier_{task}.png",
                            f"{task}: held-out gain against kl, frontiers joined", reward)
        if png:
            out += ["", f"![{task}: reward-KL frontier](results/{png.name})"]
        if any(r.get("validation_curve") for r in rows):  # issue 70: validation reward against time, both tools
            png = curves.plot([r for r in rows if admitted(r)[0]], FRONTIER_PLOTS / f"rl_curves_{task}.png", reward,
                              f"{task}: validation {reward} against training seconds, one line per run")
            if png:
                out += ["", f"![{task}: validation reward against time](results/{png.name})"]
        said = statements(summaries)
        out += ["", "Where each tool led on the development split (generated from the records; a difference within 2 "
                    "SE over seeds names no leader). Not a verdict: "
                    + ("verdicts come from the untouched split below." if task in UNTOUCHED_TASKS else
                       "the same pairs with a paired bootstrap over prompts and seeds follow."), ""]
        out += said or ["- no compared cell yet (a compared cell has every one of its seeds recorded)."]
        counted = [r for r in rows if admitted(r)[0]]
        if task not in UNTOUCHED_TASKS:
            out += ["", "The same pairs on the development split with error bars that include the prompts (a paired "
                        "bootstrap over prompts and seeds, `benchmarks/suite/bootstrap.py`; a leader only where the 95% "
                        "interval of the difference excludes 0):", ""]
            out += bootstrap_verdicts(summaries, counted, verdict_split(task)) or [
                "- none: no compared pair carries per-prompt development outcomes."]
        learned = learned_statements(summaries, counted)
        if learned:
            out += ["", "Learned past the starting weights? (issue 70: each compared cell's development gain, a paired "
                        "bootstrap over prompts and seeds, `benchmarks/suite/bootstrap.py`; learned only where the 95% "
                        "interval excludes 0):", ""] + learned
        if task in UNTOUCHED_TASKS:
            out += ["", "Verdicts on the untouched split (issue 70: read once per cell and seed at validation's pick; "
                        "a paired bootstrap over prompts and seeds, `benchmarks/suite/bootstrap.py`; a winner only "
                        "where the 95% interval of the difference excludes 0):", ""]
            out += bootstrap_verdicts(summaries, counted) or [
                "- none yet: no compared pair has its untouched reads."]
        kept_out = [(r, admitted(r)[1]) for r in rows if not admitted(r)[0]] + [(r, superseded(r)) for r in old]
        if kept_out:
            out += ["", "Records kept out of the comparison:", ""]
            out += [f"- {r.get('cell')} seed {r.get('seed')}: {why}" + (f" ({r['protocol_error']})" if r.get("protocol_error")
                                                                        else "") for r, why in kept_out]
        if counted:
            words = [w for w in COUNTED_WORDS if w in counted[0]["counts"]["after"]]
            out += ["", "Counts over each run's test completions, before → after (loops: `repetition` below "
                        f"{LOOP_REPETITION}; a word: completions that contain it):", "",
                    "| cell | seed | n | loops | " + " | ".join(f'"{w}"' for w in words) + " |",
                    "|---|---|---|---|" + "---|" * len(words)]
            for r in sorted(counted, key=lambda r: (r["cell"], r["seed"])):
                b, a = r["counts"]["before"], r["counts"]["after"]
                out.append(f"| {r['cell']} | {r['seed']} | {a['n']} | {b['loops']} → {a['loops']} | "
                           + " | ".join(f"{b[w]} → {a[w]}" for w in words) + " |")
            out += ["", "Sample test completions (first prompts, before → after):", ""]
            out += [f"- {r['cell']} seed {r['seed']}: {smp['prompt']!r}: {smp['before']!r} → {smp['after']!r}"
                    for r in counted if r["seed"] == FRONTIER_SEEDS[0] for smp in r["samples"][:1]]
            out += ["", "CPUs: " + "; ".join(sorted({f"{r['cpu']['model']} (AVX512-BF16: "
                                                      f"{'yes' if r['cpu']['avx512_bf16'] else 'no'})" for r in counted}))
                    + "; commits: " + ", ".join(sorted({r["commit"][:12] for r in counted})) + "."]
    return "\n".join(out) + "\n" if out else ""


# ---------------------------------------------------------------------------------------------- command line
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default="mezo", help=f"comma-separated: {', '.join(VARIANTS)}, or a group: {', '.join(GROUPS)}")
    p.add_argument("--seeds", default="0", help="comma-separated seeds")
    p.add_argument("--parallel", type=int, default=1, choices=[1, 2], help="cells at once (each gets 2 / N threads)")
    p.add_argument("--threads", type=int, default=None, help="OMP threads per cell (default: 2 / --parallel)")
    p.add_argument("--render-only", action="store_true", help="print the tables from docs/results/rl.jsonl")
    p.add_argument("--dry-run", action="store_true", help="list the pending cells")
    p.add_argument("--rerun", action="store_true",
                   help="run the named cells again even if recorded (the new record wins; a previous run directory "
                        "is kept as runs/rl/<cell>-prev<N>)")
    p.add_argument("--versus", default=None, metavar="A,B",
                   help="print variant A's trained model against B's on the same test prompts, per seed (paired by "
                        "prompt; from the cells' run directories under runs/rl); runs nothing")
    p.add_argument("--study", default=None, choices=sorted(STUDY_TASKS),
                   help="issue 35's study on this task: MeZO and TRL GRPO cells (--cells), recorded in "
                        "docs/results/rl_study.jsonl")
    p.add_argument("--rescore", action="store_true",
                   help="recompute the recorded cells' figures (--variants, or --study's --cells) from their run "
                        "directories (runs nothing)")
    p.add_argument("--cells", default=None, help=f"with --study: comma-separated, of {', '.join(STUDY_CELLS)} (default: "
                   "all); with --frontier: of the task's grid (default: all)")
    p.add_argument("--frontier", default=None, choices=sorted(FRONTIER_TASKS),
                   help="issue 50's reward-KL frontier on this task, under the protocol (benchmarks/suite/protocol.py); "
                        "recorded in docs/results/rl_frontier.jsonl")
    p.add_argument("--stage", default="grid", choices=["grid", "seeds", "all", "untouched", "more-seeds", "export"],
                   help="with --frontier: grid (every cell, first seed), seeds (the other seeds of the cells on the "
                        "first seed's validation frontier), all (both); issue 70: untouched (every seed of the cells "
                        "validation chose for a verdict, run again to read the untouched split once at their pick), "
                        "more-seeds (seeds 3 and 4 of both cells of a pair whose verdict is within 3 SE), export (a "
                        "curriculum stage's picks, for the next stage to start from)")
    a = p.parse_args(argv)
    if a.frontier:
        names = a.cells.split(",") if a.cells else None
        for name in names or ():
            frontier_cell(a.frontier, name)
        return frontier_main(a.frontier, a.stage, names, a.dry_run)
    if a.cells is None:
        a.cells = ",".join(STUDY_CELLS)
    if a.study:
        cells = a.cells.split(",")
        unknown = [c for c in cells if c not in STUDY_CELLS]
        if unknown:
            p.error(f"unknown cell(s) {unknown}; known: {', '.join(STUDY_CELLS)}")
        seeds = [int(x) for x in a.seeds.split(",")]
        if a.rescore:
            return rescore_study(a.study, cells, seeds)
        return study_main(a.study, cells, seeds, a.rerun, a.dry_run)
    records = load_records(RECORDS)
    if a.versus:
        va, vb = a.versus.split(",")
        print(f"| seed | {va} − {vb}, test reward after (SE), n | / SE |\n|---|---|---|")
        for seed in (int(x) for x in a.seeds.split(",")):
            h = head_to_head(test_after(va, seed), test_after(vb, seed))
            print(f"| {seed} | {h['gain']:+.3f} ({h['se']:.3f}), {h['n']} | {h['gain'] / h['se']:.1f} |" if h and h["se"]
                  else f"| {seed} | not comparable (prompts or rewards differ) | – |")
        return 0
    if a.render_only:
        print(render(records), end="")
        return 0
    names = [v for name in a.variants.split(",") for v in GROUPS.get(name, [name])]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)} and groups {', '.join(GROUPS)}")
    if a.rescore:
        return rescore_sentiment(names, [int(x) for x in a.seeds.split(",")])
    pending = [(v, int(s)) for v in names for s in a.seeds.split(",") if a.rerun or done(records, v, int(s)) is None]
    if a.dry_run:
        print("\n".join(f"{v} seed {s}" for v, s in pending) or "nothing pending")
        return 0
    lock, queue = threading.Lock(), list(pending)

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                v, s = queue.pop(0)
            if a.rerun:
                set_aside(RUNS / f"{v}-s{s}")
            r = run_cell(v, s, a.threads or 2 // a.parallel, load_records(RECORDS), lock)
            print(f"{v} seed {s}: {'ok' if r['ok'] else 'FAILED'} in {r['wall_s']:.0f} s", flush=True)

    threads = [threading.Thread(target=worker) for _ in range(a.parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(render(load_records(RECORDS)), end="")
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "results.py"), "--render-only"], cwd=REPO, check=False,
                   stdout=subprocess.DEVNULL)  # docs/results.md carries these tables
    return 0


if __name__ == "__main__":
    sys.exit(main())
