"""The paper's comparisons at small scale, one command: runs every cell, writes docs/results.md + plots.

    MEZO_RL_DATA=../shared/data HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2 \
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
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import hashlib
import json
import math
import os
import pathlib
import platform
import shlex
import signal
import subprocess
import sys
import time
from typing import Iterable, Optional

REPO = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_RESULTS = REPO / "docs" / "results" / "cells.jsonl"
DEFAULT_MD = REPO / "docs" / "results.md"
DEFAULT_RUNS = REPO / "runs" / "results"


# ---------------------------------------------------------------------------------------------------
# What is run
# ---------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TaskProtocol:
    """The data of a task's cells: the same for every method (the sampling seed is the cell's)."""

    name: str
    label: str
    num_train: int = 1000
    num_eval: int = 200
    num_test: int = 1000
    metric: str = "accuracy"          # the task metric reported (summary/baseline "test" key)
    metric_reward: str = "accuracy"   # the non-differentiable objective of the "mezo-metric" method
    icl_demos: int = 32               # paper: 32 demonstrations
    kind: str = "classification"
    max_new_tokens: Optional[int] = None  # generation tasks: the answer length limit of every method
    # ((method, (option, value, ...)), ...): this task's own options for a method, appended to its command
    # (later options win, as with --method-args, which comes after them)
    method_args: tuple = ()


TASKS = {
    "sst2": TaskProtocol("sst2", "SST-2"),
    "rte": TaskProtocol("rte", "RTE"),
    # the third classification task: full train/dev/test files (CB's test has 56 examples, BoolQ has no
    # train file here, TREC's causal prompt is empty so linear probing has no features to read)
    # 500 of its 2210 test examples: 5 two-token candidates make an SST-5 evaluation ~4x an SST-2 one
    "sst5": TaskProtocol("sst5", "SST-5", num_test=500),
    # 200 questions: greedy generation over long contexts; 2 demonstrations fit SmolLM2's context
    # 16 new tokens (a SQuAD answer is a few words; the training step decodes twice per question)
    # LoRA at lr 1e-3: SST-2's 3e-3 diverged here (loss 2.8 -> 15 by step 30, validation F1 0.0 at step 40;
    # SQuAD's projected gradients are ~3x SST-2's); 1e-3 reached test F1 32.2 (benchmarks/README.md)
    "squad": TaskProtocol("squad", "SQuAD", num_eval=100, num_test=200, metric="squad_f1",
                          metric_reward="squad_f1", icl_demos=2, kind="generation", max_new_tokens=16,
                          method_args=(("mezo-lora", ("--lr", "1e-3")),)),
}


@dataclasses.dataclass(frozen=True)
class Method:
    name: str
    label: str
    command: str                      # "baseline" or "train"
    kinds: tuple = ("classification", "generation")
    mezo: bool = False
    # train: peft, reward (None = the task's metric_reward), lr, eps, batch
    peft: str = "none"
    reward: Optional[str] = "cross_entropy"
    lr: Optional[float] = None
    eps: Optional[float] = None
    batch: int = 16
    steps: Optional[int] = None       # the method's own run length (None: the suite's --steps)
    extra: tuple = ()                 # further `mezo-rl train` options, written into the command


# lr/eps are written out (not left to the CLI defaults) so a recorded command reproduces its cell
# even after the defaults change. full: the paper's eps with an lr measured to lower SST-2 dev loss
# (benchmarks/README.md, engine_sst2); prefix: mezo_rl.peft.PEFT_DEFAULTS (paper Table 16); LoRA: the
# paper's eps with an lr picked on SST-2 validation accuracy at this 200-step budget (seed 0: the paper's
# 1e-4, tuned for 20,000 steps, leaves validation at 0.565 throughout; best step: 1e-3 0.595, 3e-3 0.675;
# 1e-2 diverges; benchmarks/README.md, "LoRA's learning rate at 200 steps");
# metric objective: the main job's settings (README) on classification, prefix-tuning for SQuAD F1.
# The final norm (the main job's mode) runs its own length: its steps skip the frozen trunk (cached).
# "mezo-metric" on classification is the main job: its 3000 steps are `mezo-rl train`'s default for
# --peft norm (mezo_rl.arguments.RUN_LENGTH; a test keeps the two equal). "mezo-norm" (CE) keeps the
# 1500 steps its cells on three tasks were measured at.
NORM = dict(peft="norm", lr=2e-2, eps=1e-1, batch=64, steps=1500,
            extra=("--noise", "rademacher", "--normalize", "std", "--n-spsa", "2"))
MAIN_JOB_STEPS = 3000
METHODS = {
    "zero-shot": Method("zero-shot", "Zero-shot", "baseline"),
    "icl": Method("icl", "ICL", "baseline"),
    "lp": Method("lp", "Linear probing", "baseline", kinds=("classification",)),
    "ft": Method("ft", "FT (Adam, backprop)", "baseline"),
    "mezo-full": Method("mezo-full", "MeZO full (CE)", "train", mezo=True, lr=1e-5, eps=1e-3),
    "mezo-lora": Method("mezo-lora", "MeZO LoRA (CE)", "train", mezo=True, peft="lora", lr=3e-3, eps=1e-2),
    "mezo-prefix": Method("mezo-prefix", "MeZO prefix (CE)", "train", mezo=True, peft="prefix", lr=1e-2, eps=1e-1),
    "mezo-norm": Method("mezo-norm", "MeZO final norm (CE)", "train", mezo=True, kinds=("classification",), **NORM),
    "mezo-metric": Method("mezo-metric", "MeZO final norm (accuracy objective)", "train", mezo=True, reward=None,
                          **{**NORM, "steps": MAIN_JOB_STEPS}),
}
# F1 at +eps and -eps is a step function: examples/optimize_f1.py's FZOO-style sign steps (docs/user_flows.md)
METRIC_ON_GENERATION = Method("mezo-metric", "MeZO prefix (F1 objective)", "train", mezo=True, peft="prefix",
                              reward=None, lr=2e-2, eps=1e-1, batch=16, steps=160,
                              extra=("--noise", "rademacher", "--normalize", "std", "--n-spsa", "1",
                                     "--eval-steps", "20"))
MEZO_CE = ("mezo-full", "mezo-lora", "mezo-prefix")   # the paper's three modes ("comparable")
MEZO_ANY_CE = MEZO_CE + ("mezo-norm",)                 # "MeZO" in the other claims: the best of these
MODELS = ("smollm2-135m", "gemma3-270m")


def method_for(method: str, protocol: TaskProtocol) -> Method:
    m = METHODS[method]
    if method == "mezo-metric" and protocol.kind == "generation":
        return METRIC_ON_GENERATION
    return m


def method_label(method: str, task: str) -> str:
    """The row label of a method on a task (a method or task unknown to this script: its name)."""
    if method not in METHODS:
        return method
    return method_for(method, TASKS[task]).label if task in TASKS else METHODS[method].label


@dataclasses.dataclass
class Settings:
    """Knobs of one suite invocation that shape the command lines."""

    steps: tuple = (200,)             # MeZO steps (one cell per value)
    batch_size: Optional[int] = None  # MeZO batch; None = the method's own
    ft_epochs: float = 1.0
    ft_max_steps: Optional[int] = None
    eval_batch_size: Optional[int] = None
    method_args: dict = dataclasses.field(default_factory=dict)   # method -> extra argv (later options win)
    protocol_overrides: dict = dataclasses.field(default_factory=dict)   # e.g. num_train=16 for --quick


@dataclasses.dataclass
class Cell:
    model: str
    task: str
    method: str
    seed: int
    steps: Optional[int]              # MeZO steps; None for baselines
    argv: list                        # after `python -m mezo_rl`, without --output-dir

    @property
    def key(self) -> str:
        return cell_key(self.model, self.task, self.method, self.seed, self.argv)


def cell_key(model: str, task: str, method: str, seed: int, argv: list) -> str:
    """Identity of a cell: everything that defines it (the command line, apart from where it writes)."""
    blob = json.dumps({"model": model, "task": task, "method": method, "seed": seed, "argv": list(argv)},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def variant_of(argv: list) -> str:
    """The settings of a cell apart from its seed and its model: cells of one variant are averaged over
    seeds, and one variant is one row of a task's table, whose columns are the models."""
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--seed", "--model"):
            skip = True
            continue
        rest.append(a)
    return hashlib.sha256(json.dumps(rest).encode()).hexdigest()[:8]


def _fmt(x) -> str:
    return repr(x) if isinstance(x, float) else str(x)


def build_argv(model: str, protocol: TaskProtocol, method: str, seed: int, settings: Settings,
               steps: Optional[int] = None) -> list:
    m = method_for(method, protocol)
    p = dataclasses.replace(protocol, **settings.protocol_overrides)
    common = ["--model", model, "--task", p.name, "--num-train", str(p.num_train), "--num-test", str(p.num_test),
              "--seed", str(seed)]
    if settings.eval_batch_size:
        common += ["--eval-batch-size", str(settings.eval_batch_size)]
    if p.max_new_tokens:
        common += ["--max-new-tokens", str(p.max_new_tokens)]
    if m.command == "baseline":
        argv = ["baseline", "--method", m.name] + common
        if m.name == "icl":
            argv += ["--num-demonstrations", str(p.icl_demos)]
        if m.name == "ft":
            argv += ["--ft-epochs", _fmt(settings.ft_epochs)]
            if settings.ft_max_steps is not None:
                argv += ["--ft-max-steps", str(settings.ft_max_steps)]
    else:
        batch = settings.batch_size or m.batch
        argv = ["train"] + common + ["--num-eval", str(p.num_eval), "--peft", m.peft,
                                     "--reward", m.reward or p.metric_reward, "--lr", _fmt(m.lr), "--eps", _fmt(m.eps),
                                     "--steps", str(steps), "--batch-size", str(batch), *m.extra,
                                     "--no-initial-test", "--no-progress"]
    return argv + list(dict(p.method_args).get(method, ())) + list(settings.method_args.get(method, ()))


def test_split_size(task: str, data_dir: Optional[str] = None) -> Optional[int]:
    """Number of examples in the task's test split (None if it cannot be read here)."""
    try:
        from tasks import get_task

        return len(get_task(task).load_split("test", data_dir=data_dir))
    except Exception:  # noqa: BLE001 -- only an optimisation / a label; the cell itself reports errors
        return None


def plan(models: Iterable[str], tasks: Iterable[str], methods: Iterable[str], seeds: Iterable[int],
         settings: Settings, split_sizes: Optional[dict] = None) -> list[Cell]:
    """Every cell of the grid, in run order: model, then seed (all of seed 0 first), task, method.

    Zero-shot depends on the seed only through the test sample: where the test sample is the whole
    split (``num_test`` >= its size), only the first seed is run.
    """
    split_sizes = split_sizes or {}
    seeds = list(seeds)
    cells = []
    for model in models:
        for seed in seeds:
            for task in tasks:
                protocol = dataclasses.replace(TASKS[task], **settings.protocol_overrides)
                for method in methods:
                    m = method_for(method, protocol)
                    if protocol.kind not in m.kinds:
                        continue
                    size = split_sizes.get(task)
                    if (method == "zero-shot" and seed != seeds[0] and size is not None
                            and protocol.num_test >= size):
                        continue
                    for steps in (((m.steps,) if m.steps else settings.steps) if m.mezo else (None,)):
                        argv = build_argv(model, TASKS[task], method, seed, settings, steps)
                        cells.append(Cell(model, task, method, seed, steps, argv))
    return cells


# ---------------------------------------------------------------------------------------------------
# The results file
# ---------------------------------------------------------------------------------------------------

def load_records(path) -> list[dict]:
    """Every record of the JSONL file (a torn last line, from an interrupted write, is ignored)."""
    path = pathlib.Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def append_record(path, record: dict) -> None:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torn = path.exists() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
    with open(path, "a") as f:
        # after an interrupted write, start a new line so the torn one does not swallow this record
        f.write(("\n" if torn else "") + json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def latest_by_key(records: list[dict]) -> dict:
    out = {}
    for r in records:
        if "key" in r:
            out[r["key"]] = r
    return out


def pending(cells: list[Cell], records: list[dict]) -> list[Cell]:
    """The cells without a successful record (never run, or failed last time)."""
    done = {k for k, r in latest_by_key(records).items() if r.get("status") == "ok"}
    return [c for c in cells if c.key not in done]


# ---------------------------------------------------------------------------------------------------
# Running one cell
# ---------------------------------------------------------------------------------------------------

def machine_info() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpu": None,
            "logical_cpus": os.cpu_count(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "cuda": None}
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["cuda"] = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 -- a label, not a requirement
        pass
    return info


def cell_run_dir(runs_dir, cell: Cell) -> pathlib.Path:
    """Where a cell's run writes: relative to the repository root (the subprocesses' working
    directory) when it lies inside it, so the recorded command works from any clone."""
    path = pathlib.Path(runs_dir).absolute() / cell.model / cell.task / cell.method / f"seed{cell.seed}-{cell.key}"
    try:
        return path.relative_to(REPO)
    except ValueError:
        return path


def command_string(argv: list, run_dir) -> str:
    return shlex.join(["python", "-m", "mezo_rl"] + list(argv) + ["--output-dir", str(run_dir)])


def _tail(path, lines=20) -> str:
    try:
        text = pathlib.Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    text = [t for t in text if t.strip() and "\r" not in t]
    return "\n".join(text[-lines:])


def read_run(cell: Cell, run_dir: pathlib.Path, protocol: TaskProtocol) -> dict:
    """The numbers of a finished run, from the files the CLI documents."""
    out: dict = {}
    if cell.argv[0] == "baseline":
        res = json.loads((run_dir / f"baseline_{cell.method}.json").read_text())
        out["metrics"] = res["test"]
        out["run_wall_time_s"] = res.get("wall_time_s")
        out["run_peak_rss_mb"] = res.get("peak_rss_mb")
        if cell.method == "ft" and isinstance(res.get("ft"), dict):
            out["steps"] = res["ft"].get("steps")
            out["batch"] = int(_arg(cell.argv, "--ft-batch-size", 8))
    else:
        summary = json.loads((run_dir / "summary.json").read_text())
        out["metrics"] = summary["test"]
        out["validation"] = summary.get("validation")
        out["initial_validation"] = summary.get("initial_validation")
        out["best_step"] = summary.get("best_step")
        out["steps"] = summary.get("steps")
        out["run_wall_time_s"] = summary.get("wall_time_s")
        out["run_peak_rss_mb"] = summary.get("peak_rss_mb")
        out["trainable_parameters"] = summary.get("trainable_parameters")
        try:
            cfg = json.loads((run_dir / "config.json").read_text())
            out["batch"] = cfg.get("batch_size")
            out["config"] = {k: cfg.get(k) for k in ("peft", "reward", "lr", "eps", "noise", "normalize", "n_spsa",
                                                      "momentum", "adam", "batch_size", "steps", "eval_steps", "dtype",
                                                      "autocast") if k in cfg}
        except (OSError, ValueError):
            out["batch"] = int(_arg(cell.argv, "--batch-size", 0)) or None
        out["curve"] = validation_curve(run_dir / "metrics.jsonl", protocol.metric)
    value = out["metrics"].get(protocol.metric)
    if value is None:
        raise KeyError(f"the run's test metrics have no {protocol.metric!r}: {sorted(out['metrics'])}")
    out["value"] = float(value)
    if "n" in out["metrics"]:
        out["n"] = int(out["metrics"]["n"])
    return out


def _options(argv: list) -> dict:
    """A command's options as {"--name": "value"} ("" for a bare flag; a later option wins, as in the CLI)."""
    out = {}
    for i, a in enumerate(argv):
        if a.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[a] = nxt if nxt is not None and not nxt.startswith("--") else ""
    return out


def _arg(argv: list, name: str, default=None):
    value = _options(argv).get(name)
    return default if value in (None, "") else value


def validation_curve(metrics_jsonl, metric: str) -> list:
    """[[step, value], ...] of the run's validation evaluations (``metrics.jsonl`` eval records)."""
    curve = []
    for r in load_records(metrics_jsonl):
        if r.get("split") == "validation" and isinstance(r.get("metrics"), dict) and metric in r["metrics"]:
            curve.append([r.get("step"), float(r["metrics"][metric])])
    return curve


def run_cell(cell: Cell, runs_dir, protocol: TaskProtocol, machine: dict, expected_n: Optional[int] = None,
             timeout: Optional[float] = None, log=print) -> dict:
    """Run one cell as a subprocess of the real CLI and return its record (never raises for a failed run)."""
    run_dir = cell_run_dir(runs_dir, cell)        # as the subprocess (cwd = REPO) sees it
    where = REPO / run_dir                         # as this process sees it
    where.mkdir(parents=True, exist_ok=True)
    argv = list(cell.argv) + ["--output-dir", str(run_dir)]
    stopped = unfinished_run(where) if cell.argv[:1] == ["train"] else None
    if stopped is not None:          # a cell stopped part-way: continue it from its checkpoint, never start over
        argv.append("--resume")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    record = {"key": cell.key, "model": cell.model, "task": cell.task, "method": cell.method, "seed": cell.seed,
              "variant": variant_of(cell.argv), "argv": cell.argv, "command": command_string(cell.argv, run_dir),
              "run_dir": str(run_dir),
              "metric": protocol.metric, "steps": cell.steps, "machine": machine,
              "data_dir": env.get("MEZO_RL_DATA"),
              "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if stopped is not None:
        record["resumed_from_step"], record["wall_time_before_resume_s"] = stopped
    log(f"[results] {cell.model} {cell.task} {cell.method} seed {cell.seed}"
        f"{'' if cell.steps is None else f' steps {cell.steps}'}"
        f"{'' if stopped is None else f', resumed from its step-{stopped[0]} checkpoint'}: {record['command']}")
    record["loadavg_start"] = _loadavg()
    t0 = time.perf_counter()
    mode = "w" if stopped is None else "a"
    with open(where / "stdout.log", mode) as out, open(where / "stderr.log", mode) as err:
        proc = subprocess.Popen([sys.executable, "-m", "mezo_rl"] + argv, cwd=REPO, env=env,
                                stdout=out, stderr=err)
        try:
            rc, rusage = _wait(proc, timeout)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    record["wall_time_s"] = round(time.perf_counter() - t0 + record.get("wall_time_before_resume_s", 0.0), 2)
    record["loadavg_end"] = _loadavg()        # 1-minute load average: wall times on a shared machine
    if rusage is not None:
        record["peak_rss_mb"] = round(rusage.ru_maxrss / 1024.0, 1)   # Linux: KiB
    if rc != 0:
        record.update(status="failed", returncode=rc,
                      error=("timed out after %ss\n" % timeout if rc == "timeout" else "") + _tail(where / "stderr.log"))
        return record
    try:
        record.update(read_run(cell, where, protocol))
    except Exception as e:  # noqa: BLE001 -- a run without its result files is a failed cell
        record.update(status="failed", returncode=0, error=f"{type(e).__name__}: {e}\n" + _tail(where / "stderr.log"))
        return record
    if "n" not in record and expected_n is not None:
        record["n"] = expected_n            # lp reports no n: the test sample size of the protocol
    record["status"] = "ok"
    return record


def unfinished_run(run_dir) -> Optional[tuple]:
    """``(step, wall seconds)`` of the checkpoint of a ``train`` run in ``run_dir`` that stopped before its
    last step (killed, interrupted, out of time), else None. The suite resumes such a cell with
    ``--resume``; its record's wall time is the stopped part's training time plus the resumed process's."""
    from mezo_rl import rundir
    if rundir.unfinished_step(run_dir) is None:
        return None
    state = rundir.TrainerState.load(rundir.checkpoint_dir(run_dir) / rundir.STATE_FILE)
    return state.step, round(state.wall_time_s, 2)


def _loadavg() -> Optional[float]:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _wait(proc: subprocess.Popen, timeout: Optional[float]):
    """Wait for the child and return (returncode | "timeout", its own rusage: ru_maxrss = its peak RSS)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG if deadline else 0)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, rusage
        if deadline and time.monotonic() > deadline:
            proc.kill()
            _, _, rusage = os.wait4(proc.pid, 0)
            proc.returncode = -9
            return "timeout", rusage
        time.sleep(0.5)


# ---------------------------------------------------------------------------------------------------
# Aggregation and the paper's claims (pure functions of the records)
# ---------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Group:
    """The cells of one (model, task, method, variant), over seeds."""

    model: str
    task: str
    method: str
    variant: str
    values: list
    seeds: list
    n: Optional[int]
    steps: Optional[int]
    batch: Optional[int]
    wall_time_s: float
    peak_rss_mb: Optional[float]
    commands: list
    curves: list
    records: list

    @property
    def k(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    @property
    def std(self) -> Optional[float]:
        """Sample standard deviation over seeds (None with one seed)."""
        if self.k < 2:
            return None
        m = self.mean
        return math.sqrt(sum((v - m) ** 2 for v in self.values) / (self.k - 1))

    @property
    def se(self) -> Optional[float]:
        """Standard error of the mean: the larger of the sampling error of one test set,
        sqrt(p(1-p)/n) (for F1 in [0, 1] an upper bound, since its variance is at most p(1-p)),
        and the spread over seeds, std/sqrt(k)."""
        parts = []
        if self.n:
            p = min(max(self.mean, 0.0), 1.0)
            parts.append(math.sqrt(p * (1 - p) / self.n))
        if self.std is not None:
            parts.append(self.std / math.sqrt(self.k))
        return max(parts) if parts else None


def aggregate(records: list[dict]) -> list[Group]:
    """One Group per (model, task, method, variant) from the latest ``ok`` record of each cell."""
    groups: dict = {}
    for r in latest_by_key(records).values():
        if r.get("status") != "ok" or r.get("value") is None:
            continue
        # from the command, so that records written before variant_of left the model out group the same way
        variant = variant_of(r["argv"]) if r.get("argv") else r.get("variant", "")
        gk = (r["model"], r["task"], r["method"], variant)
        g = groups.get(gk)
        if g is None:
            g = groups[gk] = Group(r["model"], r["task"], r["method"], variant, [], [], r.get("n"),
                                   r.get("steps"), r.get("batch"), 0.0, None, [], [], [])
        g.values.append(float(r["value"]))
        g.seeds.append(r["seed"])
        g.records.append(r)
        g.commands.append(r.get("command", ""))
        if r.get("curve"):
            g.curves.append(r["curve"])
        g.wall_time_s += float(r.get("wall_time_s") or 0.0)
        if r.get("peak_rss_mb") is not None:
            g.peak_rss_mb = max(g.peak_rss_mb or 0.0, float(r["peak_rss_mb"]))
        if g.n is None or (r.get("n") is not None and r["n"] < g.n):
            g.n = r.get("n")
    for g in groups.values():
        order = sorted(range(g.k), key=lambda i: g.seeds[i])
        for name in ("values", "seeds", "commands", "records"):
            setattr(g, name, [getattr(g, name)[i] for i in order])
    return list(groups.values())


@dataclasses.dataclass
class Verdict:
    claim: str
    task: str
    model: str
    verdict: str          # "holds" | "does not hold" | "inconclusive" | "not measured"
    detail: str


HOLDS, FAILS, MISSING = "holds", "does not hold", "not measured"
INCONCLUSIVE = "inconclusive"   # a closeness claim whose methods did not move off zero-shot: close by standing still
Z = 2.0          # "well above": the difference exceeds 2 standard errors
TOLERANCE = 0.05  # "within 5 points" / "comparable": 5 accuracy (or F1) points


def _diff(a: Group, b: Group) -> tuple[float, float]:
    se = math.sqrt((a.se or 0.0) ** 2 + (b.se or 0.0) ** 2)
    return a.mean - b.mean, se


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def _name(g: Group) -> str:
    s = method_label(g.method, g.task)
    return s + (f" ({g.steps} steps)" if g.steps else "")


def _best(groups: list[Group]) -> Optional[Group]:
    return max(groups, key=lambda g: g.mean) if groups else None


def _above(claim, task, model, a: Optional[Group], b: Optional[Group], what_b: str) -> Verdict:
    if a is None or b is None:
        missing = [w for w, g in ((("MeZO" if claim.startswith("MeZO") else "the objective"), a), (what_b, b)) if g is None]
        return Verdict(claim, task, model, MISSING, " and ".join(missing) + " not measured")
    d, se = _diff(a, b)
    ok = d > Z * se
    return Verdict(claim, task, model, HOLDS if ok else FAILS,
                   f"{_name(a)} {100 * a.mean:.1f} vs {what_b} {100 * b.mean:.1f}: {_pts(d)} points "
                   f"(SE {100 * se:.1f}; {'>' if ok else '<='} {Z:g} SE)")


def _standing_still(groups: list[Group], zero_shot: Optional[Group]) -> str:
    """Why a closeness claim says nothing here: every one of ``groups`` is within 2 SE of zero-shot
    (a method that does not learn is "close" to another that does not). '' when one of them moved
    or zero-shot is not measured."""
    if zero_shot is None or any(_diff(g, zero_shot)[0] > Z * _diff(g, zero_shot)[1] for g in groups):
        return ""
    return "; ".join(f"{_name(g)} {100 * g.mean:.1f} vs zero-shot {100 * zero_shot.mean:.1f}: "
                     f"{_pts(_diff(g, zero_shot)[0])} (SE {100 * _diff(g, zero_shot)[1]:.1f})" for g in groups)


def verdicts(groups: list[Group]) -> list[Verdict]:
    """The paper's claims, decided from the measured groups (never from anything else).

    * MeZO well above zero-shot / ICL: the best MeZO cross-entropy variant (full, LoRA, prefix, as
      the paper reports the best of the three, or the final norm) exceeds it by more than 2 standard errors.
    * full, LoRA and prefix comparable: the largest gap between the measured ones is <= 5 points.
    * accuracy/F1 objective well above zero-shot: by more than 2 standard errors.
    * MeZO within 5 points of FT: best MeZO (CE) >= FT - 5 points; reported with the steps it took.

    The two closeness claims are "inconclusive" when none of the methods compared is more than 2 SE
    above zero-shot: then they agree only because none of them learned the task.
    """
    out = []
    by = {}
    for g in groups:
        by.setdefault((g.task, g.model), []).append(g)
    for (task, model), gs in sorted(by.items(), key=lambda kv: (_task_order(kv[0][0]), kv[0][1])):
        pick = {m: _best([g for g in gs if g.method == m]) for m in METHODS}
        mezo = _best([g for g in gs if g.method in MEZO_ANY_CE])
        out.append(_above("MeZO well above zero-shot", task, model, mezo, pick["zero-shot"], "zero-shot"))
        out.append(_above("MeZO well above ICL", task, model, mezo, pick["icl"], "ICL"))
        modes = [pick[m] for m in MEZO_CE if pick[m] is not None]
        claim = "MeZO full / LoRA / prefix comparable"
        if len(modes) < 2:
            out.append(Verdict(claim, task, model, MISSING,
                               f"{len(modes)} of the 3 modes measured" + (f" ({_name(modes[0])})" if modes else "")))
        else:
            hi, lo = max(modes, key=lambda g: g.mean), min(modes, key=lambda g: g.mean)
            d, se = _diff(hi, lo)
            ok = d <= TOLERANCE
            missing = [METHODS[m].label for m in MEZO_CE if pick[m] is None]
            still = _standing_still(modes, pick["zero-shot"])
            out.append(Verdict(claim, task, model, INCONCLUSIVE if still else HOLDS if ok else FAILS,
                               (f"none moved off zero-shot ({still}); " if still else "") + f"largest gap {_name(hi)} {100 * hi.mean:.1f} vs {_name(lo)} {100 * lo.mean:.1f}: "
                               f"{100 * d:.1f} points (SE {100 * se:.1f}; tolerance {100 * TOLERANCE:g})"
                               + (f"; not measured: {', '.join(missing)}" if missing else "")))
        out.append(_above("accuracy/F1 objective well above zero-shot", task, model, pick["mezo-metric"],
                          pick["zero-shot"], "zero-shot"))
        claim = "MeZO within 5 points of FT"
        ft = pick["ft"]
        ce = [g for g in gs if g.method in MEZO_ANY_CE]
        if ft is None or not ce:
            out.append(Verdict(claim, task, model, MISSING,
                               " and ".join(w for w, g in (("MeZO", ce), ("FT", ft)) if not g) + " not measured"))
        else:
            close = sorted((g for g in ce if g.mean >= ft.mean - TOLERANCE), key=lambda g: (g.steps or 0, -g.mean))
            ft_steps = f" ({ft.steps} steps of {ft.batch})" if ft.steps else ""
            if close:
                g = close[0]
                verdict, detail = HOLDS, (f"{_name(g)} {100 * g.mean:.1f} vs FT{ft_steps} {100 * ft.mean:.1f}: "
                                          f"{_pts(g.mean - ft.mean)} points, first at {g.steps} MeZO steps")
            else:
                g = _best(ce)
                d, se = _diff(g, ft)
                verdict, detail = FAILS, (f"best {_name(g)} {100 * g.mean:.1f} vs FT{ft_steps} {100 * ft.mean:.1f}: "
                                          f"{_pts(d)} points (SE {100 * se:.1f}); most MeZO steps measured: "
                                          f"{max(x.steps or 0 for x in ce)}")
            still = _standing_still([g, ft], pick["zero-shot"])
            out.append(Verdict(claim, task, model, INCONCLUSIVE if still else verdict,
                               (f"neither moved off zero-shot ({still}); " if still else "") + detail))
    return out


def _task_order(task: str) -> tuple:
    names = list(TASKS)
    return (names.index(task) if task in names else len(names), task)


def _method_order(method: str) -> int:
    names = list(METHODS)
    return names.index(method) if method in names else len(names)


# ---------------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------------

def row_labels(groups: list[Group]) -> dict:
    """A row label per (task, method, variant): the method's label, plus, where a method was run with
    several settings, the options that tell its variants apart ("1500 steps", "lr 0.003")."""
    labels = {}
    variants = {}
    for g in groups:
        variants.setdefault((g.task, g.method), {}).setdefault(g.variant, g)
    for (task, method), vs in variants.items():
        base = method_label(method, task)
        opts = {v: _options(g.records[0].get("argv") or []) for v, g in vs.items()}
        names = sorted({k for o in opts.values() for k in o} - {"--seed", "--model", "--output-dir"})
        differ = [k for k in names if len({o.get(k) for o in opts.values()}) > 1]
        for v, g in vs.items():
            label = base
            if len(vs) > 1:
                parts = [(f"{opts[v][k]} steps" if k == "--steps" else f"{k[2:]} {opts[v][k]}".rstrip())
                         for k in sorted(differ, key=lambda k: k != "--steps") if k in opts[v]]
                label += ", " + ", ".join(parts) if parts else f" [{v}]"
            labels[(task, method, v)] = label
    return labels


def _cell_text(g: Group) -> str:
    s = f"**{100 * g.mean:.1f}**"
    if g.std is not None:
        s += f" ± {100 * g.std:.1f}"
    return s


def render_markdown(records: list[dict], plots: dict, notes: list[str] = (), title="Results: the paper's comparisons "
                    "at small scale", command_hint="python benchmarks/results.py", tasks: Iterable[str] = ()) -> str:
    """The report. ``tasks``: tasks that get a section (all "not measured") even without any record."""
    groups = aggregate(records)
    failed = [r for r in latest_by_key(records).values() if r.get("status") == "failed"]
    labels = row_labels(groups)
    models = sorted({g.model for g in groups} | {r["model"] for r in failed}, key=lambda m: (m not in MODELS, m))
    tasks = sorted({g.task for g in groups} | {r["task"] for r in failed} | set(tasks), key=_task_order)
    models = models or [MODELS[0]]
    ok = [r for r in latest_by_key(records).values() if r.get("status") == "ok"]
    lines = [f"# {title}", "",
             f"Generated by `{command_hint}` from `{len(ok)}` finished cells"
             + (f" ({len(failed)} failed)" if failed else "") + ". Every number below was measured by a run "
             "of the suite; the exact command of each is in [Commands](#commands). Re-render without running: "
             "`python benchmarks/results.py --render-only`. Cells marked \"not measured\" have not been run yet: "
             "`python benchmarks/results.py --dry-run` lists their commands, and benchmarks/README.md estimates "
             "their cost. Wall times depend on what else ran on the machine: each record in the JSONL keeps "
             "the 1-minute load average at the start and end of its cell.", ""]
    lines += _protocol_section(records, tasks)
    machines = sorted({_machine_label(r.get("machine") or {}) for r in ok})
    dates = sorted(r.get("date", "") for r in ok if r.get("date"))
    if machines:
        span = (dates[0][:10] if dates[0][:10] == dates[-1][:10] else f"{dates[0][:10]} to {dates[-1][:10]}") if dates else ""
        lines += ["Machines: " + "; ".join(machines) + (f". Dates (UTC): {span}." if span else "."), ""]
    for note in notes:
        lines += [f"> {note}", ""]
    footnotes: list[str] = []
    for task in tasks:
        gs = [g for g in groups if g.task == task]
        metric = (TASKS[task].metric if task in TASKS else "metric")
        lines += [f"## {TASKS[task].label if task in TASKS else task}", "",
                  f"Test {metric} ×100 (mean ± std over seeds; one seed: no ±). n = test examples per seed; "
                  "steps × batch; wall = total seconds of the cells' processes (model load included); "
                  "RSS = the largest peak resident memory of a cell's process.", ""]
        header = ["method"]
        for m in models:
            header += [f"{m}", "n", "seeds", "steps × batch", "wall (s)", "peak RSS (MB)", "cmd"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        steps_of = {(g.method, g.variant): g.steps or 0 for g in gs}   # variants of a method: fewest steps first
        rows = sorted(steps_of, key=lambda mv: (_method_order(mv[0]), steps_of[mv], labels[(task, *mv)]))
        for method in METHODS:   # methods with nothing measured still get a row: "not measured"
            if not any(mv[0] == method for mv in rows) and task in TASKS \
                    and TASKS[task].kind in method_for(method, TASKS[task]).kinds:
                rows.append((method, None))
        rows.sort(key=lambda mv: _method_order(mv[0]))
        for method, variant in rows:
            label = labels.get((task, method, variant), method_label(method, task))
            row = [label]
            for model in models:
                g = next((x for x in gs if x.model == model and x.method == method and x.variant == variant), None)
                if g is None:
                    fail = [r for r in failed if r["model"] == model and r["task"] == task and r["method"] == method]
                    row += ["failed" if fail else "not measured"] + [""] * 6
                    continue
                footnotes.append(f"[^c{len(footnotes) + 1}]: " + "<br>".join(f"`{c}`" for c in g.commands))
                steps = f"{g.steps} × {g.batch}" if g.steps else "–"
                row += [_cell_text(g), str(g.n or "?"), ",".join(map(str, g.seeds)), steps, f"{g.wall_time_s:.0f}",
                        f"{g.peak_rss_mb:.0f}" if g.peak_rss_mb else "?", f"[^c{len(footnotes)}]"]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
        for kind in ("bars", "curves"):
            if (task, kind) in plots:
                lines += [f"![{task} {kind}]({plots[(task, kind)]})", ""]
    lines += ["## The paper's claims at this scale", "",
              "Computed from the tables above by `verdicts()` in `benchmarks/results.py`. Standard error of a "
              "result: the larger of sqrt(p(1-p)/n) (test sampling; an upper bound for F1) and std/sqrt(seeds); "
              f"of a difference: both combined in quadrature. \"Well above\" = by more than {Z:g} SE; "
              f"\"comparable\" / \"within\" = a gap of at most {100 * TOLERANCE:g} points. MeZO = the best of "
              "full / LoRA / prefix (the paper reports the best of the three) and the final norm, with "
              "cross-entropy; \"full / LoRA / prefix comparable\" compares those three only. The two closeness "
              "claims (comparable; within 5 of FT) are **inconclusive** where none of the methods compared is more "
              f"than {Z:g} SE above zero-shot: they are then close only because none of them learned the task.", "",
              "| claim | task | model | verdict | by how much |", "|---|---|---|---|---|"]
    vs = verdicts(groups)
    # claims with nothing measured for a (task, model) at all still get their rows
    for v in vs:
        lines.append(f"| {v.claim} | {TASKS[v.task].label if v.task in TASKS else v.task} | {v.model} | "
                     f"**{v.verdict}** | {v.detail} |")
    for task in tasks:
        if not any(v.task == task for v in vs):
            lines.append(f"| every claim | {TASKS[task].label if task in TASKS else task} | – | **not measured** | "
                         "no cell of this task finished |")
    lines.append("")
    if failed:
        lines += ["## Failed cells", ""]
        for r in sorted(failed, key=lambda r: (_task_order(r["task"]), _method_order(r["method"]), r["seed"])):
            err = (r.get("error") or "").strip().splitlines()
            lines += [f"- {r['model']} / {r['task']} / {r['method']} / seed {r['seed']} ({r.get('date', '')}): "
                      f"`{r.get('command', '')}`: {err[-1] if err else 'no error text'}"]
        lines.append("")
    lines += ["## Commands", "",
              "Run from the repository root with `MEZO_RL_DATA` pointing at the data and "
              "`HF_HUB_OFFLINE=1`; each cell's output directory is under `runs/results/` (not committed).", ""]
    lines += footnotes + [""]
    return "\n".join(lines)


def _protocol_section(records: list[dict], tasks: Iterable[str] = ()) -> list[str]:
    lines = ["## Protocol", "",
             "Every method of a task sees the same data: `--num-train` training examples and `--num-test` test "
             "examples sampled with the cell's `--seed` (the baselines and `mezo-rl train` sample them "
             "identically; where `--num-test` is at least the split's size the whole test split is used). "
             "MeZO selects its best step on `--num-eval` validation examples carved from the train file, "
             "evaluating every steps/5, and reports the test metric of that step. The settings as run "
             "(from the recorded commands):", "",
             "| task | train | validation (MeZO) | test | ICL demonstrations |", "|---|---|---|---|---|"]
    seen = {}
    for r in records:
        if r.get("status") != "ok":
            continue
        argv = r.get("argv") or []
        row = seen.setdefault(r["task"], {"train": set(), "eval": set(), "test": set(), "demos": set()})
        row["train"].add(_arg(argv, "--num-train"))
        row["test"].add(str(r.get("n")) if r.get("n") else _arg(argv, "--num-test"))
        if argv and argv[0] == "train":
            row["eval"].add(_arg(argv, "--num-eval"))
        if r["method"] == "icl":
            row["demos"].add(_arg(argv, "--num-demonstrations"))
    for task in sorted(set(seen) | {t for t in tasks if t in TASKS}, key=_task_order):
        if task not in seen:    # nothing run yet: this script's settings
            p = TASKS[task]
            lines.append(f"| {p.label} (planned) | {p.num_train} | {p.num_eval} | at most {p.num_test} | {p.icl_demos} |")
            continue
        row = seen[task]
        f = lambda s: ", ".join(sorted(x for x in s if x)) or "–"  # noqa: E731
        lines.append(f"| {TASKS[task].label if task in TASKS else task} | {f(row['train'])} | {f(row['eval'])} | "
                     f"{f(row['test'])} | {f(row['demos'])} |")
    lines.append("")
    return lines


def _machine_label(m: dict) -> str:
    s = f"{m.get('cpu') or 'unknown CPU'}, {m.get('logical_cpus')} logical CPUs"
    if m.get("omp_num_threads"):
        s += f", OMP_NUM_THREADS={m['omp_num_threads']}"
    if m.get("torch"):
        s += f", torch {m['torch']}"
    s += f", CUDA: {m['cuda']}" if m.get("cuda") else ", no CUDA device"
    return s


def render_plots(records: list[dict], out_dir) -> dict:
    """Per task: a bar chart (methods × models, mean with SE bars) and the MeZO validation curves.
    Returns {(task, "bars"|"curves"): path}; {} without matplotlib (the `plot` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    groups = aggregate(records)
    labels = row_labels(groups)
    paths = {}
    for task in sorted({g.task for g in groups}, key=_task_order):
        gs = sorted((g for g in groups if g.task == task), key=lambda g: (_method_order(g.method), g.steps or 0))
        metric = TASKS[task].metric if task in TASKS else "metric"
        models = sorted({g.model for g in gs}, key=lambda m: (m not in MODELS, m))
        rows = list(dict.fromkeys((g.method, g.variant) for g in gs))
        fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(rows) + 2), 4))
        width = 0.8 / len(models)
        for j, model in enumerate(models):
            xs, ys, es = [], [], []
            for i, (method, variant) in enumerate(rows):
                g = next((x for x in gs if x.model == model and x.method == method and x.variant == variant), None)
                if g is not None:
                    xs.append(i + (j - (len(models) - 1) / 2) * width)
                    ys.append(100 * g.mean)
                    es.append(100 * (g.se or 0.0))
            ax.bar(xs, ys, width, yerr=es, capsize=3, label=model)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([labels[(task, *mv)] for mv in rows], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(f"test {metric} ×100 (± 1 SE)")
        ax.set_title(TASKS[task].label if task in TASKS else task)
        paths[(task, "bars")] = _save(fig, ax, out_dir / f"{task}_bars.png", 8)
        curved = [g for g in gs if g.curves]
        if curved:
            fig, ax = plt.subplots(figsize=(6, 4))
            for g in curved:
                steps = sorted({s for c in g.curves for s, _ in c if s is not None})
                mean = [100 * _mean([v for c in g.curves for s2, v in c if s2 == s]) for s in steps]
                ax.plot(steps, mean, marker="o", label=f"{labels[(task, g.method, g.variant)]} ({g.model}, "
                                                       f"{g.k} seed{'s' if g.k > 1 else ''})")
            ax.set_xlabel("MeZO step")
            ax.set_ylabel(f"validation {metric} ×100")
            ax.set_title(f"{TASKS[task].label if task in TASKS else task}: MeZO validation curves")
            paths[(task, "curves")] = _save(fig, ax, out_dir / f"{task}_curves.png", 7)
    return paths


def _save(fig, ax, path: pathlib.Path, legend_size: int) -> pathlib.Path:
    import matplotlib.pyplot as plt

    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _mean(xs):
    return sum(xs) / len(xs)


def render(results, out_md, notes: list[str] = (), command_hint="python benchmarks/results.py",
           tasks: Iterable[str] = ()) -> pathlib.Path:
    """Write ``out_md`` and its plots (into a folder named after it) from the JSONL ``results``."""
    out_md = pathlib.Path(out_md)
    records = load_records(results)
    notes = list(notes) + [r["note"] for r in records if r.get("status") == "note"
                           and r.get("note") and not _superseded_note(r, records)]
    plot_dir = out_md.parent / out_md.stem
    plots = {k: os.path.relpath(p, out_md.parent) for k, p in render_plots(records, plot_dir).items()}
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text(render_markdown(records, plots, list(dict.fromkeys(notes)), command_hint=command_hint,
                                      tasks=tasks))
    return out_md


def _superseded_note(note: dict, records: list[dict]) -> bool:
    """A "model unavailable" note no longer applies once a cell of that model finished."""
    return any(r.get("status") == "ok" and r.get("model") == note.get("model") for r in records)


# ---------------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------------

def model_available(model: str) -> tuple[bool, str]:
    """Whether ``mezo_rl.models.load_model`` can load ``model`` here (a quick subprocess, so the suite
    process stays free of model memory); (False, the error's first line) if not."""
    code = ("import sys\nfrom mezo_rl.models import load_model\n"
            "try:\n    load_model(sys.argv[1])\nexcept Exception as e:\n"
            "    print(type(e).__name__ + ': ' + ' '.join(str(e).split())[:300]); sys.exit(3)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.setdefault("HF_HUB_OFFLINE", "1")
    p = subprocess.run([sys.executable, "-c", code, model], cwd=REPO, env=env, capture_output=True, text=True)
    if p.returncode == 0:
        return True, ""
    msg = (p.stdout.strip() or p.stderr.strip().splitlines()[-1:] or ["unknown error"])
    return False, msg if isinstance(msg, str) else msg[0]


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


QUICK = dict(tasks=["sst2"], methods=["zero-shot", "lp", "ft", "mezo-prefix"], seeds=[0], steps=[4],
             batch_size=4, protocol=dict(num_train=16, num_eval=8, num_test=16), ft_max_steps=2)


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
                         "mezo-full='--lr 2e-5'; part of the cell's key")
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
