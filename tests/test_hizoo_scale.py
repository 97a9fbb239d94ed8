"""benchmarks/hizoo_scale.py: the fit of HiZOO's noise scale that its controls decay by, and the runs it reads."""
from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import hizoo_scale  # noqa: E402
from suite.records import load_records  # noqa: E402


@pytest.mark.parametrize("k, p", [(0.023, 0.5), (0.072, 1.0)])
def test_the_fit_recovers_the_decay_of_runs_of_different_lengths(k, p):
    runs = [list((1 + k * np.arange(1, n + 1)) ** -p) for n in (85, 122)]
    fixed = hizoo_scale.fit(runs, p)
    assert fixed["k"] == pytest.approx(k, rel=1e-6) and fixed["resid_log_rms"] < 1e-8 and fixed["n"] == 207
    free = hizoo_scale.fit(runs, None)
    assert free["k"] == pytest.approx(k, rel=1e-3) and free["p"] == pytest.approx(p, rel=1e-3)
    other = hizoo_scale.fit(runs, 1.5 - p)   # the other fixed power fits worse
    assert other["resid_log_rms"] > 10 * fixed["resid_log_rms"]


def test_it_reads_the_hizoo_cells_runs_named_by_their_records():
    runs = hizoo_scale.runs_of(load_records(hizoo_scale.FRONTIER_RECORDS))
    assert {(r["cell"].split("-lr")[0], r["seed"]) for r, _ in runs} == {
        (f"mezo-full-hizoo-a{a}", s) for a in ("1e-5", "1e-4", "1e-3") for s in (0, 1, 2)}
    assert all(d.name == "run" and f"{r['cell']}-s{r['seed']}" in d.parent.name for r, d in runs)
