"""The paper's comparisons at small scale, one command: runs every cell, writes docs/results.md + plots.

    MEZO_RL_DATA=DIR HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2 \
        python benchmarks/results.py                      # every pending cell, then render
    python benchmarks/results.py --only task=sst2 --only method=zero-shot,lp --seeds 0
    python benchmarks/results.py --dry-run                # list the pending cells and their commands
    python benchmarks/results.py --render-only            # re-render docs/results.md from the JSONL
    python benchmarks/results.py --quick                  # minutes: tiny SST-2 run into runs/results/quick/

A *cell* is (model, task, method, seed[, steps]). Each cell runs the real command line in a
subprocess (``python -m mezo_rl baseline ...`` or ``python -m mezo_rl train ...``), so the exact
command that reproduces it is recorded. Its numbers are read from the run's ``summary.json`` /
``baseline_<method>.json``; the suite adds the subprocess's wall time and peak RSS (``os.wait4``),
the date and the machine, and appends one JSON line to ``docs/results/cells.jsonl``.

Resuming: a cell whose key (model, task, method, seed and the full command line apart from the
output directory) already has an ``ok`` line is skipped, so changing any setting re-runs it; a cell
that failed is recorded with its error and retried on the next run. A MeZO cell stopped part-way
(killed, Ctrl-C, out of time) continues from its run's checkpoint (``--resume``), not from step 0. Run directories go to
``runs/results/`` (ignored by git).

Protocol (``TASKS``): the paper's 1000 train examples sampled with the cell's seed, the same train
and test examples for every method of a task (``--num-train``/``--num-test`` with the same seed;
baselines and ``train`` sample them identically), the full test split where it is at most 1000
examples (SST-2 872, RTE 277), 500 sampled SST-5 test examples, 200 SQuAD questions (scoring five
candidates / greedy generation is the cost on a CPU). MeZO picks its best step on validation examples carved from the
train file (never the test examples). The per-method hyperparameters are in ``METHODS`` and can be
changed per method with ``--method-args``.

This file is the command; the suite itself is the package ``benchmarks/suite/``: ``plan`` (tasks,
methods, cells and their command lines), ``records`` (the JSONL file), ``run`` (one cell in a
subprocess), ``stats`` (groups over seeds, standard errors), ``verdicts`` (the paper's claims) and
``render`` (docs/results.md and its plots).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import os
import pathlib
import shlex
import signal
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))   # the suite package beside this file

from suite.plan import (DEFAULT_MD, DEFAULT_RESULTS, DEFAULT_RUNS, METHODS, MODELS, QUICK, REPO, TASKS,  # noqa: E402
                        Settings, plan, test_split_size)
from suite.records import append_record, load_records, pending  # noqa: E402
from suite.render import render  # noqa: E402
from suite.run import cell_run_dir, command_string, machine_info, model_available, run_cell  # noqa: E402
from suite.verdicts import verdicts  # noqa: E402,F401 -- the claims docs/results.md cites by this file's name


def parse_only(values: list[str]) -> dict:
    """``--only task=sst2,rte --only method=zero-shot`` -> {"task": {"sst2", "rte"}, "method": {...}}."""
    out: dict = {}
    for v in values or ():
        if "=" not in v:
            raise SystemExit(f"--only {v!r}: expected FIELD=VALUE[,VALUE...] with FIELD one of task, method, seed, model")
        k, vals = v.split("=", 1)
        k = k.strip()
        if k not in ("task", "method", "seed", "model"):
            raise SystemExit(f"--only {v!r}: unknown field {k!r}; accepted: task, method, seed, model")
        out.setdefault(k, set()).update(x.strip() for x in vals.split(",") if x.strip())
    return out


def parse_method_args(values: list[str]) -> dict:
    out = {}
    for v in values or ():
        if "=" not in v:
            raise SystemExit(f"--method-args {v!r}: expected METHOD='--option value ...'")
        k, rest = v.split("=", 1)
        if k not in METHODS:
            raise SystemExit(f"--method-args {v!r}: unknown method {k!r}; accepted: {', '.join(METHODS)}")
        out[k] = shlex.split(rest)
    return out


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), help=f"default: {' '.join(MODELS)} "
                    "(a model that cannot be loaded here is skipped with a note)")
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--only", action="append", default=[], metavar="FIELD=V1,V2",
                    help="keep only cells whose task/method/seed/model is one of these (repeatable)")
    ap.add_argument("--steps", nargs="+", type=int, default=[200], help="MeZO steps; several values = one cell each")
    ap.add_argument("--batch-size", type=int, default=None, help="MeZO batch for every MeZO method "
                    "(default: the method's own: 16, 32 for the accuracy objective)")
    ap.add_argument("--ft-epochs", type=float, default=1.0, help="FT epochs over the training examples (batch 8)")
    ap.add_argument("--ft-max-steps", type=int, default=None)
    ap.add_argument("--eval-batch-size", type=int, default=None, help="passed to every cell")
    ap.add_argument("--method-args", action="append", default=[], metavar="METHOD='--opt v ...'",
                    help="extra options appended to one method's command (later options win), e.g. "
                         "mezo-full='--learning-rate 2e-5'; part of the cell's key")
    ap.add_argument("--results", default=None, help=f"JSONL of cell records (default: {os.path.relpath(DEFAULT_RESULTS, REPO)})")
    ap.add_argument("--out-md", default=None, help=f"the report (default: {os.path.relpath(DEFAULT_MD, REPO)}); "
                    "plots go into a folder of the same name without .md")
    ap.add_argument("--runs-dir", default=None, help=f"run directories (default: {os.path.relpath(DEFAULT_RUNS, REPO)})")
    ap.add_argument("--cell-timeout", type=float, default=None, help="seconds before a cell is killed and recorded as failed")
    ap.add_argument("--quick", action="store_true", help="minutes: SST-2, 16/8/16 examples, zero-shot, lp, "
                    "ft (2 steps), MeZO prefix (4 steps of 4), seed 0; writes into runs/results/quick/ unless "
                    "--results/--out-md say otherwise")
    ap.add_argument("--render-only", action="store_true", help="re-render the report from the JSONL; run nothing")
    ap.add_argument("--dry-run", action="store_true", help="list the pending cells and their commands; run nothing")
    a = ap.parse_args(argv)

    if a.quick:
        quick_dir = DEFAULT_RUNS / "quick"
        results = pathlib.Path(a.results or quick_dir / "cells.jsonl")
        out_md = pathlib.Path(a.out_md or quick_dir / "results.md")
        runs_dir = pathlib.Path(a.runs_dir or quick_dir / "runs")
        settings = Settings(steps=tuple(QUICK["steps"]), batch_size=QUICK["batch_size"],
                            ft_max_steps=QUICK["ft_max_steps"], eval_batch_size=a.eval_batch_size,
                            method_args=parse_method_args(a.method_args), protocol_overrides=QUICK["protocol"])
        models, tasks, methods, seeds = ["smollm2-135m"], QUICK["tasks"], QUICK["methods"], QUICK["seeds"]
    else:
        results = pathlib.Path(a.results or DEFAULT_RESULTS)
        out_md = pathlib.Path(a.out_md or DEFAULT_MD)
        runs_dir = pathlib.Path(a.runs_dir or DEFAULT_RUNS)
        settings = Settings(steps=tuple(a.steps), batch_size=a.batch_size, ft_epochs=a.ft_epochs,
                            ft_max_steps=a.ft_max_steps, eval_batch_size=a.eval_batch_size,
                            method_args=parse_method_args(a.method_args))
        models, tasks, methods, seeds = a.models, a.tasks, a.methods, a.seeds
    only = parse_only(a.only)
    if a.render_only:
        print(render(results, out_md, tasks=tasks))
        return 0
    if not os.environ.get("MEZO_RL_DATA"):
        print("[results] note: MEZO_RL_DATA is not set; the tasks will try the Hugging Face hub", file=sys.stderr)
    data_dir = os.environ.get("MEZO_RL_DATA")
    sizes = {t: test_split_size(t, data_dir) for t in tasks}
    cells = plan(models, tasks, methods, seeds, settings, sizes)
    cells = [c for c in cells if all(str(getattr(c, f)) in vals for f, vals in only.items())]
    todo = pending(cells, load_records(results))
    print(f"[results] {len(cells)} cells selected, {len(cells) - len(todo)} already done, {len(todo)} to run; "
          f"results: {results}", flush=True)
    if a.dry_run:
        for c in todo:
            print(command_string(c.argv, cell_run_dir(runs_dir, c)))
        return 0
    machine = machine_info()
    available: dict = {}
    # `kill PID` of the suite also ends the cell it is running (run_cell kills its child on the way out)
    previous_handler = signal.signal(signal.SIGTERM, _terminate)
    try:
        for cell in todo:
            if cell.model not in available:
                available[cell.model] = model_available(cell.model)
                if not available[cell.model][0]:
                    note = (f"{cell.model}: not available on this machine ({available[cell.model][1]}); its cells "
                            "were skipped.")
                    print(f"[results] {note}", flush=True)
                    if not any(r.get("note") == note for r in load_records(results)):
                        append_record(results, {"status": "note", "model": cell.model, "note": note,
                                                "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")})
            if not available[cell.model][0]:
                continue
            protocol = dataclasses.replace(TASKS[cell.task], **settings.protocol_overrides)
            size = sizes.get(cell.task)
            expected_n = min(protocol.num_test, size) if size is not None else None
            record = run_cell(cell, runs_dir, protocol, machine, expected_n, a.cell_timeout)
            append_record(results, record)
            msg = (f"{record['metric']} {record['value']:.4f} (n={record.get('n')})" if record["status"] == "ok"
                   else f"FAILED: {(record.get('error') or '').strip().splitlines()[-1:] or ''}")
            print(f"[results]   -> {msg}; {record['wall_time_s']:.0f} s, peak RSS {record.get('peak_rss_mb')} MB",
                  flush=True)
            render(results, out_md, tasks=tasks)     # the report is current after every cell
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        if results.exists():
            print(f"[results] report: {render(results, out_md, tasks=tasks)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
