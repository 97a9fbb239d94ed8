"""Validation reward against training time (issue 70's 4x-budget cells): one line per run, both tools on one plot.

A record's ``validation_curve`` holds ``[training seconds, validation reward]`` at each validation of the run, the
start (0 s) included: MeZO's from its ``metrics.jsonl`` (the seconds of the steps up to each validated step), GRPO's
from its summary's ``validations``. Training seconds exclude evaluations, as both tools' budgets do.
"""
from __future__ import annotations

import pathlib

from .frontier import STYLE, TOOLS, pyplot, save


def mezo_curve(metrics_lines: list[dict], reward: str) -> list[list[float]]:
    """``[seconds, reward]`` at each validation of a mezo-rl run, from its metrics.jsonl records: a step's record
    (``loss``, ``seconds``) names the steps done with it, so a validation at step N follows the steps 1..N."""
    steps = {r["step"]: r.get("seconds", 0.0) for r in metrics_lines if "loss" in r}
    out = []
    for r in metrics_lines:
        if r.get("split") == "validation" and reward in (r.get("metrics") or {}):
            out.append([sum(s for k, s in steps.items() if k <= r["step"]), float(r["metrics"][reward])])
    return out


def grpo_curve(validations: list[dict], reward: str) -> list[list[float]]:
    """``[seconds, reward]`` at each validation of a GRPO script run, from its summary's ``validations``."""
    return [[float(v.get("train_s") or 0.0), float(v[reward])] for v in validations if reward in v]


def series(records: list[dict]) -> list[dict]:
    """One series per record with a curve: tool, cell, seed and the points in order of time."""
    out = []
    for r in records:
        points = sorted(r.get("validation_curve") or [])
        if points:
            out.append({"tool": r["tool"], "cell": r["cell"], "seed": r["seed"], "points": points})
    return sorted(out, key=lambda s: (s["tool"], s["cell"], s["seed"]))


def plot(records: list[dict], path, reward: str, title: str) -> pathlib.Path | None:
    """Validation ``reward`` against training seconds, one line per run (MeZO circles, GRPO squares; a cell's seeds
    share its colour shade and label); None where matplotlib is missing or no record has a curve."""
    lines = series(records)
    plt = pyplot() if lines else None
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    labelled = set()
    cells = sorted({(s["tool"], s["cell"]) for s in lines})
    for s in lines:
        marker, colour = STYLE.get(s["tool"], ("^", "C2"))
        shade = 0.45 + 0.55 * (cells.index((s["tool"], s["cell"])) + 1) / len(cells)
        label = f"{TOOLS.get(s['tool'], s['tool'])}: {s['cell']}"
        xs, ys = zip(*s["points"])
        ax.plot(xs, ys, marker=marker, ms=3, lw=1, color=colour, alpha=shade,
                label=None if label in labelled else label)
        labelled.add(label)
    ax.set_xlabel("training seconds (evaluations excluded)")
    ax.set_ylabel(f"validation {reward}")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=6)
    return save(plt, fig, path)
