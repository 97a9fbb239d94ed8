"""Moments of a set of numbers from their sum, sum of squares and count: the one home of a mean, a
variance and a standard error.

Statistics travel in this form because it adds up: the moments of a union of batches (across members,
ranks or evaluation batches) are the sums of their moments, so one all-reduce gives what a single
process would compute. A leaf module: ``rewards`` uses it as the trainer and the evaluation do.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

__all__ = ["Moments"]


@dataclass(frozen=True)
class Moments:
    """``total`` = sum of the values, ``squares`` = sum of their squares, ``count`` = how many."""

    total: float = 0.0
    squares: float = 0.0
    count: int = 0

    @classmethod
    def of(cls, values: Iterable[float]) -> "Moments":
        """The moments of ``values`` (exactly rounded sums, :func:`math.fsum`)."""
        vals = [float(v) for v in values]
        return cls(math.fsum(vals), math.fsum(v * v for v in vals), len(vals))

    def __add__(self, other: "Moments") -> "Moments":
        return Moments(self.total + other.total, self.squares + other.squares, self.count + other.count)

    @property
    def mean(self) -> float:
        """NaN for no values."""
        return self.total / self.count if self.count else math.nan

    def variance(self, ddof: int = 1) -> float:
        """``ddof=1``: the sample variance (NaN below two values); ``ddof=0``: the population variance.
        Never negative (rounding in ``squares - total**2 / count`` is clipped at 0)."""
        if self.count <= ddof:
            return math.nan
        return max(0.0, (self.squares - self.total * self.total / self.count) / (self.count - ddof))

    def std(self, ddof: int = 1) -> float:
        return math.sqrt(self.variance(ddof))

    @property
    def se(self) -> float:
        """The standard error of the mean: sample std / sqrt(count); NaN below two values."""
        return math.sqrt(self.variance(1) / self.count) if self.count >= 2 else math.nan
