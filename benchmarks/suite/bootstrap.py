"""Error bars that include the prompts (issue 70): a paired bootstrap over prompts and seeds.

Issue 50's "SE over seeds" measured training noise only: every seed of both tools read the same prompts, so the
sampling of those prompts (which prompts happened to be drawn) was left out. Here the difference between two cells
is resampled over both sources at once:

* each resample draws ``k`` seed indices with replacement out of the ``k`` seeds both cells have, and ``n`` prompt
  indices with replacement out of the ``n`` prompts both cells read;
* the **same** draw serves both cells (a paired comparison: the prompts are the same prompts for both tools, and
  seed ``i`` of one is matched with seed ``i`` of the other, as the seeds share the data order and the prompts);
* the statistic is the mean over the drawn seeds and prompts of ``a[seed][prompt] - b[seed][prompt]`` (a cell's
  per-prompt outcome: its reward on that prompt at its pick, or its gain over the starting weights, which is the
  same difference, the starting weights being the same model for both tools).

The interval is the percentile interval of the resampled statistic (``LEVEL``, 95%), and its SE their standard
deviation. :func:`verdict` names a winner only where the interval excludes 0; :func:`needs_more_seeds` says which
compared pairs must go to ``MORE_SEEDS`` seeds (a difference within ``CLOSE_SE`` SE of 0).

Pure functions of the per-prompt outcomes a record carries (``outcomes``); NumPy only.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

#: the interval's coverage
LEVEL = 0.95
#: resamples drawn (the Monte Carlo error of a 2.5% quantile with this many is about sqrt(0.025 * 0.975 / B) in
#: probability: 0.0016)
RESAMPLES = 10_000
#: a compared pair whose difference is within this many SE of 0 goes to MORE_SEEDS seeds
CLOSE_SE = 3.0
MORE_SEEDS = 5


@dataclasses.dataclass(frozen=True)
class Interval:
    """The bootstrap of a difference ``a - b``: its point estimate (the mean over every seed and prompt), the
    percentile interval, the SE (sd of the resampled statistic), and what it rests on."""

    diff: float
    lo: float
    hi: float
    se: float
    seeds: int
    prompts: int
    resamples: int

    @property
    def excludes_zero(self) -> bool:
        return self.lo > 0 or self.hi < 0


def as_matrix(outcomes: list[list[float]]) -> np.ndarray:
    """Seeds x prompts, float64; every seed must hold a value for every prompt."""
    m = np.asarray(outcomes, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] < 1 or m.shape[1] < 1:
        raise ValueError(f"outcomes must be seeds x prompts with at least one of each, got shape {m.shape}")
    if not np.isfinite(m).all():
        raise ValueError("outcomes must be finite numbers (a prompt without an outcome cannot be resampled)")
    return m


def paired_bootstrap(a: list[list[float]], b: list[list[float]], resamples: int = RESAMPLES, seed: int = 0,
                     level: float = LEVEL) -> Interval:
    """The bootstrap interval of the mean difference ``a - b`` (each seeds x prompts, in the same seed and prompt
    order), resampling seeds and prompts with replacement, the same draw for ``a`` and ``b``."""
    a, b = as_matrix(a), as_matrix(b)
    if a.shape != b.shape:
        raise ValueError(f"a paired comparison needs the same seeds and prompts on both sides: shapes {a.shape} "
                         f"and {b.shape}")
    if not 0 < level < 1 or resamples < 1:
        raise ValueError(f"level in (0, 1) and resamples >= 1, got {level!r} and {resamples!r}")
    d = a - b
    k, n = d.shape
    rng = np.random.default_rng(seed)
    stats = np.empty(resamples)
    chunk = max(1, 2_000_000 // (k * n))  # resamples at once, a bounded index array
    for start in range(0, resamples, chunk):
        m = min(chunk, resamples - start)
        rows = rng.integers(0, k, size=(m, k))
        cols = rng.integers(0, n, size=(m, n))
        # mean over drawn seeds and drawn prompts: d[rows[r, i], cols[r, j]] averaged over i, j
        picked = d[rows[:, :, None], cols[:, None, :]]
        stats[start:start + m] = picked.mean(axis=(1, 2))
    tail = (1 - level) / 2
    lo, hi = np.quantile(stats, [tail, 1 - tail], method="inverted_cdf")
    return Interval(float(d.mean()), float(lo), float(hi), float(stats.std(ddof=1)) if resamples > 1 else math.nan,
                    k, n, resamples)


def verdict(iv: Interval, a: str = "A", b: str = "B") -> str:
    """Who wins: ``a`` where the interval of ``a - b`` lies above 0, ``b`` where below, else no winner."""
    if iv.lo > 0:
        return a
    if iv.hi < 0:
        return b
    return f"neither ({LEVEL:.0%} interval includes 0)"


def needs_more_seeds(iv: Interval) -> bool:
    """Whether the pair must go to MORE_SEEDS seeds: its difference is within CLOSE_SE SE of 0 and it does not
    have them yet."""
    return iv.seeds < MORE_SEEDS and abs(iv.diff) < CLOSE_SE * iv.se


def outcome_matrix(records: list[dict], split: str, when: str = "after") -> tuple[list[int], list[str], list[list[float]]]:
    """(seeds, prompt ids, seeds x prompts) from a cell's records' ``outcomes[split][when]`` (each a list of
    ``[prompt id, value]`` pairs), in seed order and the first record's prompt order; a record missing a prompt
    of the first raises ValueError (the comparison would not be paired)."""
    rows = sorted(records, key=lambda r: r["seed"])
    if not rows:
        raise ValueError("no records")
    ids = [pid for pid, _ in rows[0]["outcomes"][split][when]]
    out = []
    for r in rows:
        got = dict((pid, v) for pid, v in r["outcomes"][split][when])
        missing = [pid for pid in ids if pid not in got]
        if missing or len(got) != len(ids):
            raise ValueError(f"{r.get('cell')} seed {r['seed']}: its {split} prompts are not the first record's "
                             f"({len(missing)} missing, {len(got)} against {len(ids)})")
        out.append([got[pid] for pid in ids])
    return [r["seed"] for r in rows], ids, out


def compare_cells(a_records: list[dict], b_records: list[dict], split: str, **kw) -> Interval:
    """The paired bootstrap of cell A against cell B on ``split`` over the seeds both have (the same prompt ids)."""
    seeds = sorted({r["seed"] for r in a_records} & {r["seed"] for r in b_records})
    if not seeds:
        raise ValueError("the two cells share no seed")
    _, ids_a, ma = outcome_matrix([r for r in a_records if r["seed"] in seeds], split)
    _, ids_b, mb = outcome_matrix([r for r in b_records if r["seed"] in seeds], split)
    return paired_bootstrap(ma, in_order(ids_a, ids_b, mb, split), **kw)


def gain_over_start(records: list[dict], split: str, **kw) -> Interval:
    """The paired bootstrap of a cell's gain over its starting weights on ``split``: each record's ``after``
    outcomes against its ``before`` ones, prompt by prompt, over the cell's seeds."""
    _, ids, after = outcome_matrix(records, split, "after")
    _, ids_before, before = outcome_matrix(records, split, "before")
    return paired_bootstrap(after, in_order(ids, ids_before, before, split), **kw)


def in_order(ids: list[str], ids_m: list[str], m: list[list[float]], split: str) -> list[list[float]]:
    """``m`` (seeds x prompts, its columns in ``ids_m``'s order) with its columns in ``ids``'s order; ValueError
    where the two read different prompts (the comparison would not be paired)."""
    if ids_m == ids:
        return m
    if sorted(ids_m) != sorted(ids):
        raise ValueError(f"the two sides read different {split} prompts: not a paired comparison")
    order = {pid: i for i, pid in enumerate(ids_m)}
    return [[row[order[pid]] for pid in ids] for row in m]
