"""LoRA's dropout, drawn so that a MeZO step can difference it.

peft's LoRA layer computes ``W x + lora_B(lora_A(dropout(x))) * scaling``. MeZO evaluates a step's members (the
+eps and -eps of each sample) and takes differences of their losses: a dropout mask drawn afresh for each member
would make those differences compare different functions. :func:`install_step_dropout` replaces each LoRA layer's
dropout with a :class:`StepDropout`, which is the identity except within :func:`step_dropout`, the block in which
a training step evaluates its members. There each call draws its mask from the step's seed, not from the global
random state, so every member of the step sees the same masks:

- a layer's mask for an input is keyed on (the step's seed, the layer, the shape of one member's input, and how
  many inputs of that shape the layer has read since the block began). The in-place evaluation enters the block
  once per member, so the k-th input of a shape a layer reads gets the same mask in every member, however many
  decoding steps another member took before it;
- a member-batched pass (``members=M``: M equal blocks of rows in member-major layout,
  :mod:`mezo_rl.model.members`) draws the mask of one member's rows once and tiles it over the M blocks, so its
  masks are the in-place evaluation's;
- kept entries are scaled by ``1 / (1 - p)``, as ``torch.nn.Dropout`` and peft do.

Outside a step (evaluation, generation for evaluation, the starting model of the KL penalty, which reads it within
:func:`dropout_paused`) the layers compute the adapter without dropout. A step's masks are a function of its
seed, so a resumed run draws the masks the uninterrupted run drew.
"""
from __future__ import annotations

import hashlib
from contextlib import contextmanager

import torch
from torch import nn

__all__ = ["StepDropout", "check_dropout", "install_step_dropout", "step_dropout", "dropout_paused", "dropout_active"]

_STATE_ATTR = "mezo_step_dropout"   # the DropoutState shared by a model's StepDropout layers


class DropoutState:
    """What a model's :class:`StepDropout` layers share: the step's ``seed`` (None outside a step), the
    ``members`` blocks of each batch, the inputs read so far per key, and how deep :func:`dropout_paused` is."""

    def __init__(self):
        self.seed = None
        self.members = 1
        self.counts: dict = {}
        self.paused = 0

    @property
    def active(self) -> bool:
        return self.seed is not None and not self.paused


class StepDropout(nn.Module):
    """Dropout with probability ``p`` on one LoRA layer's input (``index``: the layer's place among the model's
    LoRA layers): the identity unless its model is within :func:`step_dropout`."""

    def __init__(self, p: float, index: int, state: DropoutState):
        super().__init__()
        self.p, self.index, self.state = float(p), int(index), state

    def extra_repr(self) -> str:
        return f"p={self.p}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = self.state
        if not state.active:
            return x
        M = state.members
        if x.shape[0] % M:
            raise ValueError(f"LoRA dropout: an input of {x.shape[0]} rows for {M} members; every forward pass of a "
                             f"batched step must hold {M} equal blocks of rows")
        shape = (x.shape[0] // M, *x.shape[1:])
        key = (self.index, shape)
        n = state.counts.get(key, 0)
        state.counts[key] = n + 1
        generator = torch.Generator(device=x.device)
        generator.manual_seed(_mask_seed(state.seed, self.index, shape, n))
        keep = torch.rand(shape, generator=generator, device=x.device) >= self.p
        if M > 1:
            keep = keep.repeat(M, *(1,) * (x.dim() - 1))
        return x * (keep.to(x.dtype) / (1.0 - self.p))


def _mask_seed(seed: int, index: int, shape: tuple, n: int) -> int:
    digest = hashlib.blake2b(repr((int(seed), index, tuple(shape), n)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def check_dropout(p: float) -> None:
    """LoRA's dropout is a probability in [0, 1) (ValueError, one line, otherwise)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"LoRA dropout must be a probability in [0, 1), got {p!r}")


def install_step_dropout(model: nn.Module, p: float) -> int:
    """Give every LoRA layer of ``model`` (a module with peft's ``lora_dropout`` dict) a :class:`StepDropout` of
    probability ``p`` in place of its dropout; return how many layers it gave one. ``p`` in [0, 1); at 0 the
    layers keep peft's identity."""
    check_dropout(p)
    if p == 0.0:
        return 0
    state = getattr(model, _STATE_ATTR, None) or DropoutState()
    layers = [m for m in model.modules() if isinstance(getattr(m, "lora_dropout", None), nn.ModuleDict)]
    for index, layer in enumerate(layers):
        for name in list(layer.lora_dropout.keys()):
            layer.lora_dropout[name] = StepDropout(p, index, state)
    setattr(model, _STATE_ATTR, state)
    return len(layers)


@contextmanager
def step_dropout(model: nn.Module, seed, members: int = 1):
    """Within the block, ``model``'s LoRA dropout draws its masks from ``seed`` (a training step's), the counts
    starting afresh: enter it once per member (in place) or once for a member-batched pass of ``members``
    blocks. A model without :class:`StepDropout` layers, or ``seed`` None, computes as outside."""
    state = getattr(model, _STATE_ATTR, None)
    if state is None or seed is None:
        yield
        return
    held = (state.seed, state.members, state.counts)
    state.seed, state.members, state.counts = int(seed), int(members), {}
    try:
        yield
    finally:
        state.seed, state.members, state.counts = held


@contextmanager
def dropout_paused(model: nn.Module):
    """Within the block ``model``'s LoRA layers compute without dropout, and read no mask (a step's reference
    passes: the starting model of the KL penalty)."""
    state = getattr(model, _STATE_ATTR, None)
    if state is None:
        yield
        return
    state.paused += 1
    try:
        yield
    finally:
        state.paused -= 1


def dropout_active(model: nn.Module) -> bool:
    """Whether ``model``'s LoRA layers draw dropout masks now (a step is being evaluated)."""
    state = getattr(model, _STATE_ATTR, None)
    return state is not None and state.active
