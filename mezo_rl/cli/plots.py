"""What a run directory shows: the training curves (``curves.png``) and a short text report.

    >>> from mezo_rl.cli.plots import report
    >>> print(report("runs/sst2-accuracy"))        # also writes runs/sst2-accuracy/curves.png

:func:`plot_training_curves` draws, from the run's ``metrics.jsonl``, the training reward of every
step (each reward component, with a running mean) beside the validation metric at each evaluation.
:func:`report` reads ``config.json`` / ``summary.json`` / ``metrics.jsonl`` and returns the task,
model, objective, steps, validation and test before -> after with their n, the best step, wall time
and peak memory; a run without ``summary.json`` (interrupted, or still running) is reported from its
evaluations so far. ``mezo-rl report RUN_DIR`` prints it; ``mezo-rl train`` writes the plot at the end.

Plots need matplotlib (the ``plot`` extra: ``pip install 'mezo-rl[plot]'``). It is imported only
when a plot is drawn; without it :func:`pyplot` raises :class:`MissingPlotDependency`, a
:class:`~mezo_rl.errors.UserError` that says what to install.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import warnings
from typing import Optional

from mezo_rl.errors import UserError
from mezo_rl.training.callbacks import TrainerCallback
from mezo_rl.training.rundir import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, read_samples

__all__ = ["CURVES_FILE", "MissingPlotDependency", "pyplot", "read_jsonl", "run_records", "load_run_records",
           "running_mean", "objective_text", "plot_validation", "training_curves", "plot_training_curves", "write_curves_or_warn", "CurvesCallback", "results_line", "report"]

CURVES_FILE = "curves.png"
RUN_FILES = (CONFIG_FILE, METRICS_FILE)


class MissingPlotDependency(UserError, ImportError):
    """matplotlib is not installed."""


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (imported on first use)."""
    try:
        import matplotlib
    except ImportError:
        raise MissingPlotDependency("plots need matplotlib, which is not installed: "
                                    "pip install 'mezo-rl[plot]' (or pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ---------------------------------------------------------------------------------------- reading
def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The JSON objects of a JSONL file, one per non-empty line."""
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]


def run_records(run_dir: str | os.PathLike) -> tuple[dict, Optional[dict], list[dict], list[dict]]:
    """``(config, summary or None, step records, evaluation records)`` of a run directory.

    Raises :class:`~mezo_rl.errors.UserError` when ``run_dir`` is not a mezo-rl run (no
    ``config.json`` / ``metrics.jsonl``). ``summary`` is None until the run has finished.
    """
    run = pathlib.Path(run_dir)
    if not run.is_dir():
        raise UserError(f"run directory {str(run)!r} does not exist")
    missing = [f for f in RUN_FILES if not (run / f).is_file()]
    if missing:
        raise UserError(f"{str(run)!r} is not a mezo-rl run directory (missing {', '.join(missing)}); "
                        f"give the --output-dir of a `mezo-rl train` run")
    config = json.loads((run / CONFIG_FILE).read_text())
    summary = json.loads((run / SUMMARY_FILE).read_text()) if (run / SUMMARY_FILE).is_file() else None
    records = read_jsonl(run / METRICS_FILE)
    steps = [r for r in records if "split" not in r]
    evals = [r for r in records if "split" in r]
    return config, summary, steps, evals


def load_run_records(run_dir: str | os.PathLike) -> tuple[dict, dict, list[dict]]:
    """``(config, summary, validation eval records)`` of a *finished* run directory."""
    config, summary, _, evals = run_records(run_dir)
    if summary is None:
        raise UserError(f"{str(run_dir)!r} is not a finished mezo-rl run (no summary.json yet)")
    return config, summary, [r for r in evals if r.get("split") == "validation"]


def running_mean(values: list[float], window: int) -> list[float]:
    """Mean of the last ``window`` values at each position (fewer at the start); NaN/None are skipped."""
    out, kept = [], []
    for v in values:
        kept.append(v)
        recent = [x for x in kept[-window:] if x is not None and not math.isnan(x)]
        out.append(sum(recent) / len(recent) if recent else math.nan)
    return out


# ---------------------------------------------------------------------------------------- plots
def plot_validation(ax, runs: dict[str, list[dict]], metric: str, x_key: str = "step", x_label: str = "training step") -> None:
    """Draw the validation ``metric`` of each run (name -> its validation eval records) against ``x_key``."""
    for name, evals in runs.items():
        pts = [(r[x_key], r["metrics"][metric]) for r in evals if metric in r.get("metrics", {})]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=name)
    ax.set_xlabel(x_label)
    ax.set_ylabel(f"validation {metric}")
    ax.grid(alpha=0.3)
    if any(ax.get_legend_handles_labels()[1]):
        ax.legend()


def _metric(config: dict, summary: Optional[dict], evals: list[dict]) -> Optional[str]:
    if summary and summary.get("metric_for_best"):
        return summary["metric_for_best"]
    if config.get("metric_for_best"):
        return config["metric_for_best"]
    first = next((r for r in evals if r.get("split") == "validation" and r.get("metrics")), None)
    return next((k for k in first["metrics"] if k != "n"), None) if first else None


def training_curves(run_dir: str | os.PathLike, window: int | None = None) -> dict:
    """The series ``curves.png`` draws, read from the run's ``metrics.jsonl``.

    Returns ``{"window": w, "reward": {name: (steps, values, running means)}, "metric": name,
    "validation": (steps, values), "best_step": step or None}``: each training reward component per
    logged step with its running mean over ``w`` steps (default: a tenth of the steps, at least 1),
    and the validation metric at each evaluation (step 0 is the untrained model).
    """
    config, summary, steps, evals = run_records(run_dir)
    window = window or max(1, len(steps) // 10)
    xs = [r["step"] for r in steps]
    reward = {}
    for key in (k for k in (steps[0] if steps else {}) if k.startswith("reward/") and not k.endswith("/std")):
        ys = [math.nan if r.get(key) is None else r[key] for r in steps]
        reward[key[len("reward/"):]] = (xs, ys, running_mean(ys, window))
    metric = _metric(config, summary, evals)
    validation = [(r["step"], r["metrics"][metric]) for r in evals
                  if r.get("split") == "validation" and metric in r.get("metrics", {})]
    return {"window": window, "reward": reward, "metric": metric,
            "validation": tuple(map(list, zip(*validation))) if validation else ([], []),
            "best_step": summary.get("best_step") if summary else None,
            "title": f"{config.get('task')} / {config.get('model')}: {objective_text(config)}"}


def plot_training_curves(run_dir: str | os.PathLike, path: str | os.PathLike | None = None, window: int | None = None) -> pathlib.Path:
    """Write ``curves.png`` (or ``path``) for the run in ``run_dir``; returns its path.

    Left: each training reward component per step (the objective's rewards, as logged) and its
    running mean. Right: the validation metric at each evaluation. See :func:`training_curves`.
    """
    curves = training_curves(run_dir, window)
    plt = pyplot()
    path = pathlib.Path(path) if path is not None else pathlib.Path(run_dir) / CURVES_FILE
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, (xs, ys, mean) in curves["reward"].items():
        line, = left.plot(xs, ys, alpha=0.35, linewidth=1, label=f"{name} (per step)")
        left.plot(xs, mean, color=line.get_color(), linewidth=2, label=f"{name} (running mean, {curves['window']} steps)")
    left.set_xlabel("training step")
    left.set_ylabel("training reward (batch mean)")
    left.set_title("training reward")
    left.grid(alpha=0.3)
    if curves["reward"]:
        left.legend(fontsize=8)
    else:
        left.text(0.5, 0.5, "no training steps logged yet", ha="center", va="center", transform=left.transAxes)
    metric = curves["metric"]
    if metric:
        xs, ys = curves["validation"]
        plot_validation(right, {"validation": [{"step": x, "metrics": {metric: y}} for x, y in zip(xs, ys)]}, metric)
        if curves["best_step"] is not None:
            right.axvline(curves["best_step"], color="grey", linestyle="--", linewidth=1, label="best step")
            right.legend(fontsize=8)
    right.set_title(f"validation {metric or ''}".strip())
    fig.suptitle(curves["title"], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_curves_or_warn(run_dir: str | os.PathLike) -> Optional[pathlib.Path]:
    """:func:`plot_training_curves`, or a warning (once per process) and None without matplotlib."""
    global _warned_no_matplotlib
    try:
        return plot_training_curves(run_dir)
    except MissingPlotDependency as err:
        if not _warned_no_matplotlib:
            _warned_no_matplotlib = True
            warnings.warn(f"no {CURVES_FILE} written: {err}", stacklevel=2)
        return None


_warned_no_matplotlib = False


class CurvesCallback(TrainerCallback):
    """Draws the run's ``curves.png`` when training ends (``mezo-rl train`` adds it; add it to a
    ``Trainer`` of your own to get the same file)."""

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            write_curves_or_warn(args.output_dir)


# ---------------------------------------------------------------------------------------- text
def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _n(metrics: Optional[dict]) -> str:
    return f" (n={int(metrics['n'])})" if metrics and metrics.get("n") is not None else ""


def _before_after(label: str, metric: str, before: Optional[dict], after: Optional[dict]) -> Optional[str]:
    b, a = (before or {}).get(metric), (after or {}).get(metric)
    if a is None and b is None:
        return None
    if b is None:
        return f"{label} {metric} {_fmt(a)}{_n(after)}"
    if a is None:
        return f"{label} {metric} {_fmt(b)}{_n(before)} before training"
    n = _n(after) if _n(after) == _n(before) else f"{_n(before)} -> {_n(after).strip()}"
    se = (after or {}).get(f"{metric}/se")  # prompt tasks report each mean's standard error
    return f"{label} {metric} {_fmt(b)} -> {_fmt(a)}{f' (SE {_fmt(se)})' if se is not None else ''}{n}"


def results_line(summary: dict) -> str:
    """One line: validation and test before -> after with n, and the best step, in the form
    ``validation <metric> <before> -> <after> (n=<N>), test <metric> <before> -> <after> (n=<N>), best step <k> of <steps>``."""
    metric = summary["metric_for_best"]
    parts = [_before_after("validation", metric, summary.get("initial_validation"), summary.get("validation")),
             _before_after("test", metric, summary.get("initial_test"), summary.get("test"))]
    parts.append(f"best step {summary['best_step']} of {summary['steps']}")
    return ", ".join(p for p in parts if p)


def objective_text(config: dict) -> str:
    """The objective of a run's config as text, e.g. ``accuracy + 0.5*cross_entropy``."""
    rewards = config.get("reward") or []
    weights = config.get("reward_weights") or [1] * len(rewards)
    text = " + ".join(f"{w:g}*{r}" if w != 1 else str(r) for r, w in zip(rewards, weights))
    return text + (f" (reward_scale={config['reward_scale']})" if config.get("reward_scale") else "")


def _or_default(value) -> str:
    return "default" if value is None else f"{value:g}"


def sample_pairs(run_dir, config: dict, summary: Optional[dict], pairs: int = 3) -> list[str]:
    """Lines showing up to ``pairs`` prompts with their completion before training and after (a prompt
    task's test samples: the untrained model's, step 0, and the best weights', written at the end)."""
    if not pairs or summary is None:
        return []
    before = {json.dumps(r["prompt"]): r for r in read_samples(run_dir, "test", 0)}
    after = read_samples(run_dir, "test", summary.get("steps", config.get("max_steps", 0)))
    matched = [(before[json.dumps(r["prompt"])], r) for r in after if json.dumps(r["prompt"]) in before]
    shown = sorted(matched, key=lambda ba: ba[0]["completion"] == ba[1]["completion"])[:pairs]  # changed ones first
    if not shown:
        return []
    lines = [f"before -> after (test completions; greedy; best step {summary['best_step']}):"]
    for b, a in shown:
        prompt = b["prompt"] if isinstance(b["prompt"], str) else b["prompt"][-1]["content"]
        lines += [f"  prompt: {prompt!r}", f"    before: {b['completion']!r}", f"    after:  {a['completion']!r}"]
    return lines


def report(run_dir: str | os.PathLike, plot: bool = True, pairs: int = 3) -> str:
    """A short text summary of the run in ``run_dir``; with ``plot``, also writes its ``curves.png``.
    A prompt task's report also shows ``pairs`` test prompts with their completions before -> after.

    Without matplotlib the plot is skipped and the text says so (the report itself needs nothing).
    """
    config, summary, steps, evals = run_records(run_dir)
    lines = [f"run {run_dir}: task {config.get('task')}, model {config.get('model')}, objective {objective_text(config)}"]
    peft = config.get("peft") or "none"
    lines.append(f"MeZO: {'full fine-tuning' if peft in ('full', 'none') else peft}, {config.get('max_steps')} steps of "
                 f"{config.get('per_device_train_batch_size')} examples, lr {_or_default(config.get('learning_rate'))}, eps {_or_default(config.get('eps'))}, "
                 f"seed {config.get('seed')}")
    if summary is not None:
        lines.append(results_line(summary))
        lines.append(f"wall time {summary['wall_time_s']:.0f} s, peak memory {summary.get('peak_rss_mb') or 0:.0f} MiB (RSS)")
    else:
        metric = _metric(config, None, evals)
        validation = [r for r in evals if r.get("split") == "validation"]
        done = steps[-1]["step"] if steps else 0
        lines.append(f"unfinished (no summary.json): {done} of {config.get('max_steps')} steps logged")
        if metric and validation:
            first, last = validation[0], validation[-1]
            lines.append(f"validation {metric} {_fmt(first['metrics'].get(metric))} (step {first['step']}) -> "
                         f"{_fmt(last['metrics'].get(metric))} (step {last['step']}){_n(last['metrics'])}")
        peak = max((r.get("peak_rss_mb") or 0 for r in steps + evals), default=0)
        wall = max((r.get("wall_time_s") or 0 for r in evals), default=0)
        lines.append(f"wall time {wall:.0f} s so far, peak memory {peak:.0f} MiB (RSS)")
    lines += sample_pairs(run_dir, config, summary, pairs)
    if plot:
        try:
            lines.append(f"plot: {plot_training_curves(run_dir)}")
        except MissingPlotDependency as err:
            lines.append(f"no plot: {err}")
    return "\n".join(lines)
