"""Aggregation (pure functions of the records): one group per (model, task, method, variant) over seeds,
with its mean, standard deviation and standard error."""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from .plan import variant_of
from .records import latest_by_key


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

