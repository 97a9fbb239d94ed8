"""Writing an update into bf16 / fp16 weights: computed in float32, rounded once, stochastically by default.

A MeZO update ``theta <- c theta + sum_j s_j z_j`` is far below a bf16 weight's spacing at the learning rates
zeroth-order training uses (bf16 keeps 8 significant bits): rounded to nearest, most of it is dropped every
step, and a weight whose update stays below half its spacing never moves. Stochastic rounding rounds a value
``v`` between two neighbours ``lo < v < hi`` up with probability ``(v - lo) / (hi - lo)``, so the written
weight equals ``v`` in expectation whatever the size of the update: the update is unbiased at any lr.

:func:`update_` writes the update of low-precision tensors this way: the tensors are cut into pieces (whole
tensors, or row blocks of a large matrix) packed into chunks of at most :func:`chunk_elements` elements, and
for each chunk the pieces are copied into one float32 buffer, the update is applied there, the buffer is
rounded once into the weights' dtype and copied back. The only temporaries are one chunk's buffer and its
random bits, a small fraction of the weights' memory, and the number of operations grows with the number of
chunks, not of tensors. The random bits come from a ``torch.Generator`` seeded by the step's noise seed, so a
run, its resume and its replay write the same bits.

``rounding="nearest"`` rounds the same float32 values to nearest instead (one rounding per step).

:class:`UpdateMeter` measures, on a fixed sample of entries (a strided slice of every chunk), the share of the
intended change that reached the weights: the projection ``<realised, intended> / <intended, intended>``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mezo_rl.choices import ROUNDINGS

__all__ = ["ROUNDINGS", "LOW_PRECISION", "is_low_precision", "low_precision_trainable", "chunk_elements", "pieces", "chunks", "round_", "update_",
           "random_words", "chunk_words",
           "UpdateMeter", "METER_SAMPLES"]

#: accepted values of MeZO's ``rounding``: how an update is written into bf16 / fp16 weights
#: the dtypes whose updates are computed in float32 and rounded once (:func:`update_`)
LOW_PRECISION = (torch.bfloat16, torch.float16)
#: entries of the update :class:`UpdateMeter` reads per update, spread over every chunk
METER_SAMPLES = 4096
_TABLE = 1 << 20  # a chunk's random words repeat with this period
_SHIFT = 1 << 16  # each chunk reads the update's words from its own offset below this
_TAG_ROUND = 0x726F756E64696E67  # "rounding": the key of an update's random bits


def is_low_precision(p: torch.Tensor) -> bool:
    return p.dtype in LOW_PRECISION


def low_precision_trainable(params) -> str | None:
    """The dtype of a trainable bf16 / fp16 tensor among ``params`` (tensors), or None."""
    return next((str(p.dtype).removeprefix("torch.") for p in params if p.requires_grad and is_low_precision(p)), None)


def chunk_elements(total: int) -> int:
    """The most elements one chunk's float32 buffer holds: 1/64 of the low-precision weights (2**20 at least),
    so the buffer costs at most 1/32 of bf16 weights' memory (plus its random bits, as much again)."""
    return max(1 << 20, -(-total // 64))


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of the tensor ``p`` at layout ``index`` (all of it for tensors of fewer than 2
    dimensions or noise that is not low-rank)."""

    index: int
    p: torch.Tensor
    start: int
    stop: int
    group: dict

    @property
    def view(self) -> torch.Tensor:
        return self.p if self.start == 0 and self.stop == self.rows else self.p[self.start:self.stop]

    @property
    def rows(self) -> int:
        return self.p.shape[0] if self.p.dim() >= 2 else 1

    @property
    def numel(self) -> int:
        return self.view.numel()


def pieces(entries, limit: int, split_rows: bool) -> list[Piece]:
    """Every ``(index, tensor, group)`` of ``entries`` as pieces of at most ``limit`` elements where
    ``split_rows`` allows cutting a matrix into row blocks (low-rank noise: a row block's noise is the rows of
    its B factor), whole otherwise."""
    out = []
    for index, p, group in entries:
        if p.dim() >= 2 and split_rows and p.numel() > limit:
            step = max(1, limit // max(1, p[0].numel()))
            out += [Piece(index, p, s, min(s + step, p.shape[0]), group) for s in range(0, p.shape[0], step)]
        else:
            out.append(Piece(index, p, 0, p.shape[0] if p.dim() >= 2 else 1, group))
    return out


def chunks(items: list[Piece], limit: int) -> list[list[Piece]]:
    """``items`` in order, packed into runs of at most ``limit`` elements (a larger piece alone), one device
    and dtype each."""
    out, size, key = [], 0, None
    for piece in items:
        k = (piece.p.device, piece.p.dtype)
        if not out or size + piece.numel > limit or k != key:
            out.append([])
            size, key = 0, k
        out[-1].append(piece)
        size += piece.numel
    return out


def random_words(key: int, device: torch.device) -> torch.Tensor:
    """An update's random integers in [0, 2**16) (int32, ``_TABLE + _SHIFT`` of them) from ``key``, on ``device``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(_mix(key) & ((1 << 63) - 1))
    return torch.randint(0, 1 << 16, (_TABLE + _SHIFT,), dtype=torch.int32, generator=gen, device=device)


def chunk_words(words: torch.Tensor, key: int, k: int) -> torch.Tensor:
    """The ``_TABLE`` words chunk ``k`` of an update reads: ``words`` from an offset of its own."""
    offset = _mix(key ^ (k * 0x9E3779B97F4A7C15)) % _SHIFT
    return words[offset: offset + _TABLE]


def _add_tiled_(words: torch.Tensor, table: torch.Tensor) -> None:
    """``words[i] += table[i % len(table)]`` for a flat int32 tensor, in two operations."""
    n, k = words.numel(), table.numel()
    full = n - n % k
    if full:
        words[:full].view(-1, k).add_(table)
    if n - full:
        words[full:].add_(table[: n - full])


def round_(buf: torch.Tensor, dtype: torch.dtype, mode: str, words: torch.Tensor | None = None) -> torch.Tensor:
    """The float32 flat ``buf`` rounded to ``dtype``'s values, in place (``buf`` then holds values that
    ``dtype`` represents exactly): stochastically, reading the random integers in [0, 2**16) ``words``
    (repeated as often as ``buf`` needs), or to nearest. Returns ``buf``."""
    if mode == "nearest":
        return buf.copy_(buf.to(dtype))
    if dtype == torch.bfloat16:
        # bf16 is float32's upper 16 bits: add 16 random low bits to the magnitude, then truncate them
        bits = buf.view(torch.int32)
        _add_tiled_(bits, words)
        bits.bitwise_and_(-65536)
        return buf
    # float16: between the two neighbours of v, the upper one with probability (v - lo) / (hi - lo)
    near = buf.to(dtype)
    nf = near.to(torch.float32)
    away = torch.nextafter(near, torch.where(buf > nf, torch.inf, -torch.inf).to(dtype)).to(torch.float32)
    gap = (away - nf).abs_()
    frac = torch.where(gap > 0, (buf - nf).abs_() / gap, torch.zeros_like(gap))
    u = torch.zeros_like(buf, dtype=torch.int32)
    _add_tiled_(u, words)
    up = u.to(torch.float32).add_(0.5).div_(1 << 16) < frac
    return buf.copy_(torch.where(up, away, nf))


class UpdateMeter:
    """The share of the intended update that reached the weights, on a fixed sample of entries (every
    ``stride``-th entry of every chunk): ``sum(realised * intended) / sum(intended ** 2)`` over the sample,
    summed over the chunks of one update. 1 when the weights took the intended change; near 0 when rounding
    dropped it; in expectation 1 with stochastic rounding."""

    def __init__(self, total: int):
        self.stride = max(1, total // METER_SAMPLES)
        self.dot = self.norm = 0.0

    def sample(self, buf: torch.Tensor) -> torch.Tensor:
        """The sampled entries of a chunk's flat buffer, as float64 (a copy)."""
        return buf[:: self.stride].double()

    def add(self, start: torch.Tensor, intended: torch.Tensor, written: torch.Tensor) -> None:
        """One chunk's samples: the weights before, the float32 values intended, the values written."""
        want, got = intended - start, written - start
        self.dot += float(torch.dot(got, want))
        self.norm += float(torch.dot(want, want))

    @property
    def kept(self) -> float | None:
        """None where the intended change was exactly zero on the sample."""
        return self.dot / self.norm if self.norm > 0 else None


def update_(entries, add_noise, coefs, mode: str, key: int, split_rows: bool, limit: int | None = None) -> float | None:
    """Write ``p <- c p + (update)`` into low-precision tensors, computed in float32 and rounded once.

    ``entries``: ``(index, tensor, group)`` of bf16 / fp16 tensors. ``coefs(group) -> c``: the decay factor.
    ``add_noise(items)``: adds the update's noise terms (every sample's coefficient times its z) to the float32
    views ``[(piece, view)]`` of one chunk. ``mode``: ``"stochastic"`` or ``"nearest"``; ``key``: the random
    bits' seed (the step's). ``limit``: a chunk's most elements (default :func:`chunk_elements`); how the tensors are
    cut changes nothing but the random bits an entry reads. Returns the share of the update kept
    (:class:`UpdateMeter`), or None."""
    total = sum(p.numel() for _, p, _ in entries)
    if not total:
        return None
    limit = limit or chunk_elements(total)
    meter, words = UpdateMeter(total), {}
    for k, chunk in enumerate(chunks(pieces(entries, limit, split_rows), limit)):
        device = chunk[0].p.device
        buf = torch.empty(sum(pc.numel for pc in chunk), dtype=torch.float32, device=device)
        views = [v.view(pc.view.shape) for v, pc in zip(buf.split([pc.numel for pc in chunk]), chunk)]
        torch._foreach_copy_(views, [pc.view for pc in chunk])
        start = meter.sample(buf)
        scaled = [(v, coefs(pc.group)) for v, pc in zip(views, chunk)]
        scaled = [(v, c) for v, c in scaled if c != 1.0]
        if scaled:
            torch._foreach_mul_([v for v, _ in scaled], [c for _, c in scaled])
        add_noise(list(zip(chunk, views)))
        intended = meter.sample(buf)
        if mode == "stochastic" and device not in words:
            words[device] = random_words(key, device)
        round_(buf, chunk[0].p.dtype, mode, chunk_words(words[device], key, k) if mode == "stochastic" else None)
        torch._foreach_copy_([pc.view for pc in chunk], views)
        meter.add(start, intended, meter.sample(buf))
    return meter.kept


def _mix(x: int) -> int:
    """splitmix64's finaliser of ``x ^ _TAG_ROUND``: well-spread 64-bit keys from step seeds and chunk numbers."""
    x = (int(x) ^ _TAG_ROUND) & ((1 << 64) - 1)
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return x ^ (x >> 31)
