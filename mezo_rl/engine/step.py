"""The parts of one MeZO step outside the optimizer's own state: its members evaluated
(:class:`MemberEvaluation`: in place, each perturbation applied in turn, or handed to the batched strategy), the
closure's values checked, the spread that normalises a step, and what a step returns (:class:`StepResult`).
:class:`mezo_rl.engine.optim.MeZO` runs a step through them.

Members and fitness: a step evaluates M *members*, each one noise seed and sign: (+s0, -s0, +s1, -s1, ...)
for the two-point estimator (M = 2n), (+s0, ..., +s_{n-1}) for ``"es"`` (M = n), (+s0) for one-point.
The engine hands them out: a closure with a positional parameter is called as ``closure(members)``, with
:class:`Members` (a tuple of :class:`Member` descriptors: ``index``, ``seed``, ``sign``, ``sample``, in that
order) and returns one value per member; in place it is called once per member with that member alone, its
perturbation applied to the weights, and batched once with all M (below), so one closure serves both modes.
torch.optim's ``closure()`` (no argument) is called once per member in place and returns its value.
``step(closure, fitness=f)`` lets the closure return any object per member (say,
per-example rewards) and turns the M objects into M losses with ``f(objects)`` once all members ran:
the place for fitness shaping that needs the whole population (per-prompt centring across members).
The engine never looks inside the objects.

Batched evaluation: ``MeZO(params, ..., member_evaluation=BatchedMembers(model))`` evaluates a step's M
members in one batched pass with the weights untouched (:mod:`mezo_rl.engine.population`): ``closure(members)``
is called once with the M members (``members.batched`` is True), every forward of ``model`` inside it must hold
M equal blocks of rows in member-major layout (rows [k*b, (k+1)*b) are member k's; see
``LanguageModel.score/generate(..., members=M)``), each module holding a trainable tensor adds member
k's perturbation to its block (activation-side ``sign_k eps (x A) B^T / sqrt(r)`` for low-rank
matrices), and the closure returns M values (or M objects for ``fitness``); ``members.paused()`` gives a block
of plain forwards on the weights in place (another model's view of the members' outputs). Then the same update as
in place, without a restore to fuse it with: the estimator, the trajectory and replay are those of
the in-place mode with the same seeds, and with no perturbation sweeps nothing drifts, in any dtype
(bf16 included: a step at lr 0 leaves the weights bit for bit). Matrices of nn.Embedding need
``noise="lowrank"``; element-wise noise on other matrices copies them per member (adapters).
``member_evaluation`` is recorded in the trajectory, whose replay then applies only the updates.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from mezo_rl.engine.population import Member, Members, member_values, step_members, takes_members

if TYPE_CHECKING:
    from mezo_rl.engine.optim import MeZO

__all__ = ["MemberEvaluation", "StepResult", "spread", "as_float", "append_checked"]


class MemberEvaluation:
    """Phase 1 of a step: every member evaluated, in place (each perturbation applied in turn, the closure called
    for it) or by the batched strategy. ``values``: the closure's losses as they come (without fitness);
    ``offset``: where the parameters are left, ``(seed, mult)`` for theta + mult eps z(seed), or None at theta."""

    def __init__(self, opt: "MeZO", entries, closure, seeds: list[int], fitness: bool):
        self.opt, self.entries, self.closure, self.seeds, self.fitness = opt, entries, closure, seeds, fitness
        self.values: list[float] = []
        self.offset = None

    def evaluate(self) -> list:
        """What the closure returned, one object per member (with ``fitness``; otherwise also in ``values``)."""
        opt, cfg = self.opt, self.opt.config
        members = step_members(self.seeds, cfg["estimator"], center=cfg["hessian_smooth"] > 0)
        if cfg["member_evaluation"] == "batched":
            return [self._keep(v, "member") for v in opt._evaluate_members(self.closure, members, self.entries)]
        closure = self.closure
        if takes_members(closure):  # closure(members): one member at a time, its perturbation in the weights
            call = lambda m: member_values(closure(Members([m])), 1)[0]  # noqa: E731
        else:  # torch.optim's closure()
            call = lambda m: closure()  # noqa: E731
        out = []
        for m in members:
            self._to(m)
            out.append(self._keep(call(m), "call"))
        if cfg["adam"] or cfg["momentum"] > 0:  # the buffered update starts from theta; SGD fuses the restore into it
            self.restore()
        return out

    def _to(self, member: Member) -> None:
        """Move the weights to ``member``'s point, theta + sign eps z(seed), from where they are."""
        if self.offset is not None and (self.offset[0] != member.seed or member.sign == 0):
            self.restore()
        if member.sign:
            self._move(member.seed, member.sign - (0.0 if self.offset is None else self.offset[1]))

    def restore(self) -> None:
        if self.offset is not None:
            self._move(self.offset[0], -self.offset[1])

    def _move(self, seed: int, mult: float) -> None:
        self.opt._sweep(self.entries, seed, mult)
        total = (self.offset[1] if self.offset is not None else 0.0) + mult
        self.offset = None if total == 0.0 else (seed, total)

    def _keep(self, value, what: str):
        if not self.fitness:
            append_checked(self.values, as_float(value), what)
        return value


@dataclass
class StepResult:
    """What one :meth:`MeZO.step` did.

    ``loss_plus`` / ``loss_minus``: closure values at theta + eps z and theta - eps z (means over
    the n samples of n-SPSA; ``loss_minus`` is None for the one-point estimator).
    ``projected_grads``: the scalar applied per sample with the first group's eps:
    ``(l+ - l-) / (2 eps)``, or ``(l+ - l-) / (2 sigma)`` with ``step_normalize="std"``.
    ``seeds``: the noise seed of each sample. ``loss``: the mean of all closure values.
    ``skipped``: True when a non-finite loss made the step a no-op (``on_nonfinite="skip"``).
    With ``hessian_smooth`` the last of ``values`` is the unperturbed weights' (HiZOO's l0).
    ``lr``: the first group's learning rate used for the update. ``values``: every closure value,
    in call order. ``spread``: sigma, the standard deviation of the step's closure values
    (``step_normalize="std"`` only; 0 means the step changed nothing but weight decay). ``update_kept``: the share
    of the intended update that reached the bf16 / fp16 weights, measured on a fixed sample of their entries
    (:class:`mezo_rl.engine.rounding.UpdateMeter`; in expectation 1 with stochastic rounding); None where no
    low-precision weight was to change.
    """

    loss_plus: float
    loss_minus: float | None
    projected_grads: list[float]
    seeds: list[int]
    loss: float
    skipped: bool = False
    lr: float = 0.0
    values: list[float] = field(default_factory=list)
    spread: float | None = None
    update_kept: float | None = None


def as_float(value) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"the closure must return a float or a 0-d tensor, got a tensor of shape {tuple(value.shape)}")
        return float(value.detach().item())
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"the closure must return a float or a 0-d tensor, got {type(value).__name__}") from None


def append_checked(values: list[float], value: float, what: str) -> None:
    """``values.append(value)``; then FloatingPointError if it is not finite (the skip policy reads it)."""
    values.append(value)
    if not math.isfinite(value):
        raise FloatingPointError(f"the closure returned a non-finite loss ({value}) at {what} {len(values) - 1} "
                                 f"of the step")


def spread(values: list[float]) -> float:
    """Population standard deviation of the values (float64, fixed summation order)."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
