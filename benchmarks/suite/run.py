"""Running one cell: the real CLI in a subprocess, its wall time and peak RSS, the numbers it wrote.

A cell's record adds to the run's own files (``summary.json`` / ``baseline_<method>.json``,
``config.json``, ``metrics.jsonl``) the command that reproduces it, the machine, the date and the load
average. A ``train`` cell stopped part-way continues from its checkpoint (``--resume``).
"""
from __future__ import annotations

import datetime as _dt
import importlib.util
import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import time
from typing import Optional

from .plan import REPO, Cell, TaskProtocol, option, variant_of
from .records import load_records


def import_path(path: pathlib.Path, name: str):
    """The module of the Python file ``path`` (an example or a reward file beside the package), loaded as ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu() -> tuple[Optional[str], str]:
    """The CPU's model name (None where /proc/cpuinfo has none) and its widest vector instructions
    (``avx512``, ``avx2`` or ``no avx2``), from /proc/cpuinfo."""
    model, flags = None, []
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and model is None:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1].split()
    except OSError:
        pass
    return model, "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "no avx2"


def machine_info() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpu": cpu()[0],
            "logical_cpus": os.cpu_count(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "cuda": None}
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
            out["batch"] = int(option(cell.argv, "--ft-batch-size", 8))
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
            cfg_file = run_dir / "training_args.json"
            cfg = json.loads((cfg_file if cfg_file.is_file() else run_dir / "config.json").read_text())
            out["batch"] = cfg.get("per_device_train_batch_size", cfg.get("batch_size"))  # config.json before the TRL names
            out["config"] = {k: cfg.get(k) for k in ("peft", "reward", "learning_rate", "lr", "eps", "noise", "step_normalize", "normalize",
                                                      "n_spsa", "momentum", "adam", "per_device_train_batch_size",
                                                      "batch_size", "max_steps", "steps", "eval_steps", "dtype",
                                                      "autocast") if k in cfg}
        except (OSError, ValueError):
            out["batch"] = int(option(cell.argv, "--per-device-train-batch-size", 0)) or None
        out["curve"] = validation_curve(run_dir / "metrics.jsonl", protocol.metric)
    value = out["metrics"].get(protocol.metric)
    if value is None:
        raise KeyError(f"the run's test metrics have no {protocol.metric!r}: {sorted(out['metrics'])}")
    out["value"] = float(value)
    if "n" in out["metrics"]:
        out["n"] = int(out["metrics"]["n"])
    return out



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
    from mezo_rl.training import rundir
    if rundir.unfinished_step(run_dir) is None:
        return None
    state = rundir.TrainerState.load_from_json(rundir.checkpoint_dir(run_dir) / rundir.STATE_FILE)
    return state.global_step, round(state.wall_time_s, 2)


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


def model_available(model: str) -> tuple[bool, str]:
    """Whether ``mezo_rl.model.loading.load_model`` can load ``model`` here (a quick subprocess, so the suite
    process stays free of model memory); (False, the error's first line) if not."""
    code = ("import sys\nfrom mezo_rl.model.loading import load_model\n"
            "try:\n    load_model(sys.argv[1])\nexcept Exception as e:\n"
            "    print(type(e).__name__ + ': ' + ' '.join(str(e).split())[:300]); sys.exit(3)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.setdefault("HF_HUB_OFFLINE", "1")
    p = subprocess.run([sys.executable, "-c", code, model], cwd=REPO, env=env, capture_output=True, text=True)
    if p.returncode == 0:
        return True, ""
    msg = (p.stdout.strip() or p.stderr.strip().splitlines()[-1:] or ["unknown error"])
    return False, msg if isinstance(msg, str) else msg[0]

