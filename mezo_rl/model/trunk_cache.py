"""The frozen-trunk cache: the final norm's input at the scored positions of each sequence seen.

The *trunk* of a decoder LM is everything before its final normalisation layer. While every trunk
parameter is frozen (``requires_grad=False``), the trunk's output at a position is a function of the
input tokens alone, so :class:`~mezo_rl.model.lm.LanguageModel` keeps it per (sequence, scored
positions) and, on a hit, runs only the final norm and the output head. This is what makes MeZO on the
final norm (``--peft norm``) cheap. The cache holds values; the language model runs the trunk.

What a hit costs is small: the final norm and a few output-head rows over a few hundred scored tokens.
Split over several intra-op threads, each such op ends in a synchronisation of the threads, and on a
CPU shared with other jobs a thread that has lost its core holds every op up for a scheduler time
slice, far longer than the op itself; :func:`one_thread` runs that work on the calling thread alone.
The trunk's own batches are large matrix products, which several threads do run faster on an idle CPU
and slower on a busy one: :class:`ThreadChoice` times them and runs each batch with the faster setting.
"""
from __future__ import annotations

import contextlib
import time

import torch

__all__ = ["TrunkCache", "ThreadChoice", "one_thread"]


@contextlib.contextmanager
def one_thread():
    """Within the block, torch's CPU ops run on one intra-op thread (``torch.set_num_threads(1)``); the
    thread count before it is restored after, even on an exception. For blocks of small ops, where
    threads cost a synchronisation per op and compute nothing faster."""
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class ThreadChoice:
    """Which intra-op thread count runs each batch of the trunk: the process's (``torch.get_num_threads()``)
    or one, whichever measured faster, per unit of ``work`` (the batch's padded tokens).

    The first batch is not timed (it pays one-time costs), the next two try each setting, and every
    ``every``-th batch after them tries the slower one again, since the load on a shared CPU changes; a
    setting's rate is the mean of its last two timings. The choice changes nothing but the time: the trunk's
    ops give the same values on any number of threads (tests/test_trunk_cache.py checks the trunk's output)."""

    def __init__(self, every: int = 16, clock=time.perf_counter):
        self.every, self.clock = int(every), clock
        self.rate: dict[int, float] = {}  # threads -> seconds per unit of work
        self.batches = 0

    def pick(self, many: int) -> int:
        """The thread count for the next batch, given the process's count ``many``."""
        if many == 1 or self.batches == 0:
            return many
        for n in (many, 1):
            if n not in self.rate:
                return n
        best, other = sorted((many, 1), key=self.rate.__getitem__)
        return other if self.batches % self.every == 0 else best

    @contextlib.contextmanager
    def run(self, work: int):
        """Run the block (one batch of ``work`` units) with :meth:`pick`'s thread count, time it, and restore the
        process's count after, even on an exception."""
        many = torch.get_num_threads()
        n = self.pick(many)
        torch.set_num_threads(n)
        t0 = self.clock()
        try:
            yield n
        finally:
            seconds = self.clock() - t0
            torch.set_num_threads(many)
            if self.batches > 0 and many > 1:
                rate = seconds / max(int(work), 1)
                self.rate[n] = rate if n not in self.rate else (self.rate[n] + rate) / 2
            self.batches += 1


class TrunkCache:
    """Final-norm inputs keyed by ``(input ids, scored positions)`` (tuples), valid while ``params`` are frozen.

    ``norm``: the final normalisation module (the boundary); ``params``: every trunk parameter (the
    base's parameters but the norm's own); ``fingerprint``: the trunk's output on a probe input, which
    tells whether another model's cache holds this trunk's values (:meth:`adopt`). ``encoded`` memoises
    the tokenisation of each scored (prompt, candidate) text pair, since the same texts come back every step.
    """

    def __init__(self, norm: torch.nn.Module, params: list[torch.nn.Parameter], fingerprint: torch.Tensor):
        self.norm = norm
        self.params = list(params)
        self.fingerprint = fingerprint
        self.entries: dict[tuple, torch.Tensor] = {}
        self.encoded: dict[tuple[str, str], tuple] = {}
        self.threads = ThreadChoice()  # the thread count of each batch of the trunk (on a CPU)

    def __len__(self) -> int:
        return len(self.entries)

    def usable(self) -> bool:
        """Whether the cache may be read now: every trunk parameter frozen. Otherwise the trunk may change,
        so nothing cached can be trusted: the entries are dropped."""
        if any(p.requires_grad for p in self.params):
            self.entries.clear()
            return False
        return True

    def clear(self) -> None:
        """Forget every cached value (after frozen weights were changed in place)."""
        self.entries.clear()

    def values_only(self) -> "TrunkCache":
        """The cached values and the fingerprint without the references to the model (its norm and trunk
        parameters), to carry over to a rebuilt model (:meth:`adopt`) while the old one is freed."""
        out = TrunkCache(None, [], self.fingerprint)
        out.entries, out.encoded = self.entries, self.encoded
        return out

    def adopt(self, other: "TrunkCache") -> bool:
        """Take ``other``'s entries if its trunk gave bit for bit the same output on the probe (the same
        frozen trunk, e.g. a model rebuilt from the same weights); returns whether they were taken."""
        a, b = self.fingerprint, other.fingerprint
        if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b.to(a.device)):
            return False
        self.entries.update({k: v.to(a.device) for k, v in other.entries.items()})
        self.encoded.update(other.encoded)
        return True

    def missing(self, keys) -> list[tuple]:
        """The distinct keys not cached yet, shortest sequence first (so a batch of them pads little)."""
        return sorted({k for k in keys if k not in self.entries}, key=lambda k: len(k[0]))

    def store(self, keys, pre: torch.Tensor) -> None:
        """Keep, for each key of a batch, its row of ``pre`` [B, T, H] (the final norm's input) at its positions."""
        for b, key in enumerate(keys):
            self.entries[key] = pre[b, list(key[1])].clone()

    def rows(self, keys) -> tuple[torch.Tensor, dict[tuple, int]]:
        """The cached rows of the distinct ``keys``, concatenated [N, H] in first-seen order, and each key's
        first row in that block."""
        first: dict[tuple, int] = {}
        n = 0
        for k in keys:
            if k not in first:
                first[k], n = n, n + len(k[1])
        return torch.cat([self.entries[k] for k in first]), first
