"""Compare objectives or configurations on the same task, data and seed.

:func:`compare` trains one run per variant (each in ``output_dir/<name>``) and :func:`write_report`
reads the runs' ``summary.json`` / ``metrics.jsonl`` and writes

* ``comparison.md``: one row per run (objective, steps, best step, validation before/best, test,
  wall time, peak memory);
* ``validation_vs_steps.png`` and ``validation_vs_time.png``: the validation metric of every run
  against training steps and against wall-clock seconds.

Example (cross-entropy vs accuracy on SST-2, same everything else)::

    from mezo_rl.training.arguments import MeZOConfig
    from mezo_rl.cli.compare import compare, objective_variants
    base = MeZOConfig(task="sst2", max_steps=100, output_dir="runs/compare-sst2")
    compare(objective_variants(base, ["cross_entropy", "accuracy"]), "runs/compare-sst2")
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Callable, Optional

from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.cli.plots import CurvesCallback, load_run_records, objective_text, plot_validation, pyplot
from mezo_rl.training.trainer import MeZOTrainer


def objective_variants(base: MeZOConfig, objectives: list[str]) -> dict[str, MeZOConfig]:
    """One variant of ``base`` per objective; ``"a+b"`` combines rewards a and b (equal weights)."""
    if not objectives:
        raise ValueError("objective_variants: give at least one objective, e.g. ['cross_entropy', 'accuracy']")
    variants = {}
    for obj in objectives:
        names = [n.strip() for n in obj.split("+") if n.strip()]
        if not names:
            raise ValueError(f"objective {obj!r}: expected reward names joined by '+', e.g. 'accuracy' or 'accuracy+cross_entropy'")
        name = "+".join(names)
        if name in variants:
            raise ValueError(f"objective {name!r} given twice")
        variants[name] = dataclasses.replace(base, reward=names, reward_weights=None, resume=False)
    return variants


def compare(variants: dict[str, MeZOConfig], output_dir: str | os.PathLike,
            lm_factory: Optional[Callable] = None, trainer_kwargs: Optional[dict] = None) -> dict[str, dict]:
    """Train every variant into ``output_dir/<name>`` and write the report; returns name -> summary.

    The variants should differ only in what is being compared: data, seed and model come from each
    variant's arguments. ``lm_factory`` (optional) returns a fresh base model for each run (and for
    rebuilding the best weights); by default each run loads ``args.model``.
    """
    out = pathlib.Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    summaries, run_dirs = {}, {}
    for name, args in variants.items():
        run_dir = out / _safe(name)
        args = dataclasses.replace(args, output_dir=str(run_dir))
        lm = lm_factory() if lm_factory is not None else None
        kwargs = dict(trainer_kwargs or {})
        kwargs["callbacks"] = [*kwargs.get("callbacks", []), CurvesCallback()]
        trainer = MeZOTrainer(args=args, lm=lm, lm_factory=lm_factory, **kwargs)
        trainer.train()
        summaries[name] = trainer.summary
        run_dirs[name] = run_dir
        del trainer, lm
    write_report(run_dirs, out)
    return summaries


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_+." else "_" for c in name)


def _fmt(x, digits=4):
    return "-" if x is None else (f"{x:.{digits}f}" if isinstance(x, float) else str(x))


def write_report(run_dirs: dict[str, str | os.PathLike], output_dir: str | os.PathLike,
                 metric: Optional[str] = None) -> dict[str, pathlib.Path]:
    """Write comparison.md and the two PNG plots for finished runs; returns their paths.

    ``metric``: the validation metric to compare (default: each run's ``metric_for_best`` in summary.json).
    """
    out = pathlib.Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = {name: load_run_records(d) for name, d in run_dirs.items()}
    if not runs:
        raise ValueError("write_report: no runs given")
    metric = metric or next(iter(runs.values()))[1]["metric_for_best"]
    lines = [
        f"# Comparison ({metric} on validation, test at the best validation step)", "",
        "| run | objective | steps | best step | validation before | validation best | test | wall time (s) | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, (config, summary, _) in runs.items():
        lines.append("| " + " | ".join([
            name, objective_text(config), str(summary["steps"]), str(summary["best_step"]),
            _fmt((summary["initial_validation"] or {}).get(metric)), _fmt((summary["validation"] or {}).get(metric)),
            _fmt((summary["test"] or {}).get(metric)), _fmt(summary["wall_time_s"], 1), _fmt(summary.get("peak_rss_mb"), 0),
        ]) + " |")
    paths = {"table": out / "comparison.md"}
    paths["table"].write_text("\n".join(lines) + "\n")

    plt = pyplot()
    for x_key, x_label, fname in (("step", "training step", "validation_vs_steps.png"),
                                  ("wall_time_s", "wall-clock time (s)", "validation_vs_time.png")):
        fig, ax = plt.subplots(figsize=(6, 4))
        plot_validation(ax, {name: evals for name, (_, _, evals) in runs.items()}, metric, x_key, x_label)
        fig.tight_layout()
        paths[fname] = out / fname
        fig.savefig(paths[fname], dpi=120)
        plt.close(fig)
    return paths
