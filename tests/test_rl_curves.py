"""Validation reward against training time (benchmarks/suite/curves.py), on a tiny fabricated record set: the
curves read from each tool's own logs, and the plot of both tools."""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))

from suite import curves  # noqa: E402


def test_a_mezo_curve_adds_the_seconds_of_the_steps_before_each_validation():
    lines = [{"step": 0, "split": "validation", "metrics": {"r": 0.1}},
             {"step": 1, "loss": 1.0, "seconds": 5.0}, {"step": 2, "loss": 1.0, "seconds": 6.0},
             {"step": 2, "split": "validation", "metrics": {"r": 0.3}, "seconds": 40.0},   # its own time not counted
             {"step": 3, "loss": 1.0, "seconds": 4.0},
             {"step": 3, "split": "validation", "metrics": {"r": 0.2}}, {"step": 3, "split": "test", "metrics": {"r": 1}}]
    assert curves.mezo_curve(lines, "r") == [[0.0, 0.1], [11.0, 0.3], [15.0, 0.2]]


def test_a_grpo_curve_reads_its_summarys_validations():
    vals = [{"step": 0, "train_s": 0.0, "r": 0.1, "r/se": 0.01}, {"step": 9, "train_s": 60.5, "r": 0.4}]
    assert curves.grpo_curve(vals, "r") == [[0.0, 0.1], [60.5, 0.4]]


def test_both_tools_on_one_plot(tmp_path):
    records = [{"tool": "mezo-rl", "cell": "m", "seed": s, "validation_curve": [[0, 0.1], [100, 0.2 + s / 10]]}
               for s in (1, 0)]
    records += [{"tool": "trl-grpo", "cell": "g", "seed": 0, "validation_curve": [[50, 0.3], [0, 0.1]]},
                {"tool": "trl-grpo", "cell": "old", "seed": 0}]   # a record written before curves: left out
    got = curves.series(records)
    assert [(s["tool"], s["cell"], s["seed"]) for s in got] == [("mezo-rl", "m", 0), ("mezo-rl", "m", 1),
                                                                 ("trl-grpo", "g", 0)]
    assert got[2]["points"] == [[0, 0.1], [50, 0.3]]   # in order of time
    png = curves.plot(records, tmp_path / "c.png", "r", "t")
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert curves.plot([{"tool": "mezo-rl", "cell": "m", "seed": 0}], tmp_path / "none.png", "r", "t") is None
