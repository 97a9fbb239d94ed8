"""Counting the aten operators a piece of code dispatches (a leaf module).

On a GPU every dispatched operator is (at least) one kernel launch, and a launch costs the host several
microseconds whatever the kernel does. Small models, and the per-member and per-tensor work of a MeZO step,
are bound by that cost long before the GPU's arithmetic, so the number of operators a step dispatches,
next to the number plain inference dispatches for the same rows, predicts their time ratio on a GPU. The
count is the same on every device, so it can be measured (and tested) on a CPU.

    >>> with OpCounter() as ops:
    ...     model(input_ids)
    >>> ops.total, ops.counts.most_common(5)

Only operators that reach the dispatcher below autograd are counted (views and factory functions
included, Python-level work excluded); nested counters each count everything inside them.
"""
from __future__ import annotations

from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCounter"]


class OpCounter(TorchDispatchMode):
    """A context manager counting dispatched aten operators by name (``aten.mm``, ``aten.add_`` ...).

    ``counts``: a :class:`collections.Counter` of operator names; ``total``: their sum.
    """

    def __init__(self):
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def reset(self) -> None:
        self.counts.clear()
