"""MeZO: in-place zeroth-order SGD with seed-replayed noise (Malladi et al. 2023, Algorithm 1).

    opt = MeZO(model.parameters(), lr=1e-6, eps=1e-3)

    def closure():                       # called with the parameters perturbed in place
        with torch.no_grad():
            return loss_fn(model(batch))   # float or 0-d tensor, the loss to minimise

    res = opt.step(closure)              # StepResult(loss_plus, loss_minus, projected_grads, ...)

One step of the default two-point estimator (SPSA, n=1) makes three in-place sweeps over the
trainable tensors, each regenerating the same noise z from the step's seed (:mod:`mezo_rl.engine.noise`):

    theta + eps z           -> l+ = closure()
    theta - eps z           -> l- = closure()          g = (l+ - l-) / (2 eps)
    (theta + eps z) restored and updated in one pass:  theta <- theta (1 - lr wd) - lr g z

No buffer the size of the model is ever allocated; at most one temporary the size of the largest
tensor (the plain "torch" noise backend materialises element-wise z for one tensor at a time; the
compiled backend materialises nothing; low-rank noise keeps the factors of the step's samples and
sweeps every tensor in a few ``torch._foreach_*`` operations, :meth:`mezo_rl.engine.noise.NoiseSpec.sweep_`).
Only tensors with ``requires_grad=True`` are touched, so a frozen base model with LoRA adapters works
unchanged.

Variants (paper Appendix B), with their memory cost:

``n_spsa=n``    Algorithm 2: n samples of z per step, evaluated at the same theta, update with the
                mean of the n estimates. 2n scalars of state; 4n-1 sweeps and 2n closure calls.
``estimator="one_point"``  Zhang et al. (2022): one closure call per step,
                g_t = (l(theta_t + eps z_t) - l_{t-1}) / eps. One scalar of state (the previous
                loss); the first step has no previous loss and so makes no update.
``estimator="es"``  the evolution-strategies population of ES-at-scale (Qiu et al., 2025): n one-sided
                members theta + eps z_j (n = ``n_spsa``), g_j = (l_j - mean(l)) / eps, update
                theta <- theta - lr/n sum_j g_j z_j. With ``step_normalize="std"`` the losses are
                z-scored across the population, g_j = (l_j - mean(l)) / sigma: their recipe with
                sigma = eps and alpha = lr. n closure calls and 2n sweeps per step.
``momentum=mu`` heavy-ball momentum on the ZO estimate, m <- mu m + g z, theta <- theta - lr m.
                Costs one float32 buffer per trainable tensor (+4 bytes per parameter).
``adam=True``   Adam on the ZO estimate. Two float32 buffers (+8 bytes per parameter).
                Both update after the restore, in a separate fourth sweep; Adam materialises
                g z per tensor, momentum with low-rank noise adds the factors to its buffers
                for every tensor at once (element-wise noise: z per tensor). (The history could
                be recomputed from the logged seeds instead, as the paper notes, but that costs
                one sweep per remembered step; buffers are the honest default.)
``hessian_smooth=alpha``  HiZOO (Zhao et al., ICLR 2025): a diagonal curvature estimate H preconditions the
                perturbation, z -> H^-1/2 z, and so the step; one more member a step, the unperturbed
                weights (last), measures the curvature along each sample's direction,
                |l+ + l- - 2 l0| / (2 eps^2), and H moves towards it at the rate alpha
                (:mod:`mezo_rl.engine.curvature`, where a matrix's H is a row times a column vector so that
                its noise stays low-rank). Two-point, rank-1 low-rank noise, one eps; m + n floats of
                state per matrix and one per element of a 1-D tensor.

``step_normalize="std"``  FZOO-style: the projected gradient of sample j is (l+_j - l-_j) / (2 sigma),
                sigma the standard deviation of the step's 2n closure values, instead of / (2 eps):
                a step that does not depend on the loss scale (n=1: a sign step of length lr).
                With n > 1 each coefficient is below 1 (sigma also spans the other samples'
                differences) and the update averages over n: at the same lr the step is shorter
                than with n=1, so scale lr up with n (benchmarks/README.md has a measurement).

Noise: ``noise="lowrank"`` (default: z = B A^T / sqrt(rank) per tensor of 2+ dimensions, rank 1,
LOZO/SubZero, Gaussian for 1-D tensors; :class:`mezo_rl.engine.noise.NoiseSpec`), ``"gaussian"`` (the
paper's) or ``"rademacher"`` (z_i = +-1). Low-rank is the default because its step costs the least (one BLAS
pass per matrix, no compiler) and per forward pass it ends level with Gaussian on the tasks we
measured (docs/engine.md, "Which noise is the default").
With Rademacher z and a power-of-two eps (e.g. ``eps=2**-10``) the perturbation eps*z is exactly representable, and
``theta + eps z - 2 eps z + eps z`` returns theta exactly whenever ``theta +- eps`` is exactly
representable (see docs/engine.md for measured drift).

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

Exception safety: if the closure raises (anything, KeyboardInterrupt included) the parameters are
restored before the exception propagates. If it returns a non-finite value the parameters are
restored and, with ``on_nonfinite="raise"`` (default), ``FloatingPointError`` is raised; with
``"skip"`` the step is skipped (no update) and ``StepResult.skipped`` is True. Restoring is exact
in the exact mode and within rounding (~1e-7 relative) otherwise; the trajectory logs skipped and
aborted steps so that replay repeats their sweeps too.

Reproducibility: step seeds are ``seed * 2**32 + k`` for the k-th noise sample of the run; the
global RNG is never used. ``opt.trajectory`` logs every step; :func:`replay_trajectory` (here, with
the optimizer that re-executes the steps; :meth:`MeZO.replay` takes the seeds from the log)
rebuilds the final weights from the initial ones; ``state_dict()`` resumes a run exactly.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from mezo_rl.choices import ESTIMATORS, HIZOO_OPTIONS, MEMBER_EVALUATIONS, ON_NONFINITE
from mezo_rl.engine import noise as _noise
from mezo_rl.engine import rounding as _rounding
from mezo_rl.engine.curvature import Curvature
from mezo_rl.engine.population import BatchedMembers, Member, Members, member_values, step_members, takes_members
from mezo_rl.engine.trajectory import STATUS, Trajectory
from mezo_rl.errors import refuse_keywords

__all__ = ["MeZO", "BatchedMembers", "Member", "Members", "StepResult", "spread", "get_scheduler", "replay_trajectory",
           "recorded_options", "RENAMED", "ESTIMATORS", "MEMBER_EVALUATIONS", "HIZOO_OPTIONS", "ON_NONFINITE", "ROUNDINGS",
           "SCHEDULERS"]

#: accepted values of MeZO's ``estimator`` / ``on_nonfinite`` and of :func:`get_scheduler`'s ``name``
#: (the one declaration: command-line choices can be read from here, as noise kinds from ``noise.NOISES``)
ROUNDINGS = _rounding.ROUNDINGS
SCHEDULERS = ("constant", "linear")
_STEP_NORMALIZE = (None, "std")
#: options of the whole run (the same in every param group), with their defaults
_RUN_DEFAULTS = dict(n_spsa=1, noise="lowrank", rank=1, lowrank_interval=1, step_normalize=None,
                     estimator="two_point", momentum=0.0, adam=False, betas=(0.9, 0.999), adam_eps=1e-8,
                     seed=0, on_nonfinite="raise", noise_backend="auto", member_evaluation="inplace", hessian_smooth=0.0,
                     rounding="stochastic")
#: earlier names of MeZO's options -> theirs: a keyword of an earlier name is refused naming its successor, and a run
#: recorded under them (trajectory header, state dict) is read under the new names (:func:`recorded_options`)
RENAMED = {"normalize": "step_normalize", "evaluation": "member_evaluation"}
#: options added after the first trajectory format, with the value that reproduces older runs (``rounding``: any
#: value reproduces a float32 run; :func:`_check_rounding_recorded` refuses an older run of low-precision weights)
_ADDED_LATER = {k: _RUN_DEFAULTS[k] for k in ("rank", "lowrank_interval", "step_normalize", "member_evaluation",
                                              "hessian_smooth", "rounding")}


def recorded_options(options: dict) -> dict:
    """A recorded run's options (a trajectory header, a state dict's config or param group) under this version's
    names: the keys of :data:`RENAMED` read as theirs; a run records the new names."""
    return {RENAMED.get(k, k): v for k, v in options.items()}


def _check_rounding_recorded(recorded: dict, dtypes) -> None:
    """Refuse, in one line, to replay or resume a run of bf16 / fp16 weights recorded before ``rounding`` existed:
    its updates were rounded to nearest in the weights' dtype, operation by operation, which this version does
    not do again."""
    low = sorted({d for d in dtypes if d in ("bfloat16", "float16")})
    if "rounding" not in recorded and low:
        raise ValueError(f"this run's {'/'.join(low)} weights were updated by an earlier mezo-rl, which rounded every "
                         "operation of an update to nearest in their dtype; this version computes an update in float32 "
                         "and rounds it once, so it cannot replay or resume that run bit for bit: use the version that "
                         "recorded it")


def _low_precision_in_place(params) -> str | None:
    """The dtype of a trainable bf16 / fp16 tensor among ``params`` (tensors), or None."""
    return next((str(p.dtype).removeprefix("torch.") for p in params
                 if p.requires_grad and _rounding.is_low_precision(p)), None)


def _with_noise_format(header: dict) -> dict:
    """A recorded run's header with the noise format this version draws; a run whose noise this version
    cannot draw again (low-rank noise of another format) is refused in one line. Headers without the key
    predate it: format 1, whose element-wise noise is format 2's."""
    fmt = header.get("noise_format", 1)
    if fmt != _noise.FORMAT and (header.get("noise") == "lowrank" or fmt > _noise.FORMAT):
        raise ValueError(f"this run's {header.get('noise')} noise has format {fmt} "
                         f"({'factors drawn tensor by tensor' if fmt == 1 else 'from a newer mezo-rl'}); this version "
                         f"draws format {_noise.FORMAT} (every tensor of a noise sample in one draw) and cannot replay "
                         "or resume it: use the mezo-rl version that recorded it")
    return {**header, "noise_format": _noise.FORMAT}


class _Evaluation:
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
            _append_checked(self.values, _as_float(value), what)
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


class _ReplayAbort(Exception):
    """Raised by the replay closure where the recorded run's closure raised."""


def _as_float(value) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"the closure must return a float or a 0-d tensor, got a tensor of shape {tuple(value.shape)}")
        return float(value.detach().item())
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"the closure must return a float or a 0-d tensor, got {type(value).__name__}") from None


def _append_checked(values: list[float], value: float, what: str) -> None:
    """``values.append(value)``; then FloatingPointError if it is not finite (the skip policy reads it)."""
    values.append(value)
    if not math.isfinite(value):
        raise FloatingPointError(f"the closure returned a non-finite loss ({value}) at {what} {len(values) - 1} "
                                 f"of the step")


def spread(values: list[float]) -> float:
    """Population standard deviation of the values (float64, fixed summation order)."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


class MeZO(torch.optim.Optimizer):
    """In-place zeroth-order SGD (MeZO) and its Appendix-B variants; see the module docstring.

    Args:
        params: tensors or param groups (dicts with ``params`` and optionally ``lr``, ``eps``,
            ``weight_decay``), as for any ``torch.optim`` optimizer. Tensors must be contiguous.
        lr: learning rate (per group). eps: perturbation scale (per group, > 0).
        weight_decay: decoupled decay ``theta <- theta (1 - lr wd)`` applied with the update.
        n_spsa: samples of z per step (Algorithm 2).
        noise: ``"lowrank"`` (default; z = B A^T / sqrt(rank) per tensor of 2+ dimensions,
            Gaussian for 1-D ones; see :class:`mezo_rl.engine.noise.NoiseSpec`), ``"gaussian"`` or
            ``"rademacher"``.
        rank: r of the low-rank noise (>= 1; used only by ``noise="lowrank"``).
        lowrank_interval: hold the factor A for this many noise samples (LOZO's lazy subspace;
            1 = fresh every sample; used only by ``noise="lowrank"``).
        hessian_smooth: HiZOO's smoothing scale alpha of the curvature that preconditions the perturbation
            (0 = off; > 0 needs the two-point estimator, ``noise="lowrank"`` with ``rank=1`` and one eps).
        step_normalize: None, or ``"std"``: divide each sample's loss difference by the standard
            deviation sigma of the step's 2n closure values instead of by 2 eps (FZOO-style):
            ``g_j = (l+_j - l-_j) / (2 sigma)``; no ZO update when sigma = 0. See docs/engine.md.
        estimator: ``"two_point"`` (SPSA, default) or ``"one_point"``.
        momentum: heavy-ball momentum in [0, 1) (0 = off). adam: use ZO-Adam with ``betas``
            and ``adam_eps``. momentum and adam are exclusive.
        seed: base seed of the run (0 <= seed < 2**31).
        on_nonfinite: ``"raise"`` or ``"skip"`` when the closure returns NaN/inf.
        noise_backend: ``"auto"`` (element-wise noise: compiled if torch.compile works, else
            torch; low-rank: torch), ``"compiled"`` or ``"torch"``; see :mod:`mezo_rl.engine.noise`.
        record: keep ``opt.trajectory`` (default True).
        member_evaluation: ``"inplace"`` (default: the closure runs once per member, the weights perturbed in
            place) or a :class:`~mezo_rl.engine.population.BatchedMembers` strategy (``closure(members)``
            runs once, the strategy's model evaluating every member in member-major row blocks; see the
            module docstring); a ``closure(members)`` serves both. ``"batched"`` names that mode without a
            model: enough to replay a trajectory, whose closure hands back logged values. bf16 / fp16 trainable
            tensors need the batched mode: a perturbation swept into them in place rounds, and the restore does
            not return them to where they were (refused in one line).
        rounding: how an update is written into bf16 / fp16 tensors, computed in float32 and rounded once:
            ``"stochastic"`` (default; unbiased at any lr, its random bits drawn from the step's seed, so replay
            and resume stay exact) or ``"nearest"`` (drops an update below half a weight's spacing).
            float32 tensors are updated as always. See :mod:`mezo_rl.engine.rounding`.

    Every hyperparameter is in ``opt.defaults`` (and, as in ``torch.optim``, in every param
    group); those of the whole run (all but lr, eps, weight_decay) cannot differ between groups.
    """

    def __init__(self, params, lr: float = 1e-6, eps: float = 1e-3, weight_decay: float = 0.0, *,
                 n_spsa: int = 1, noise: str = "lowrank", rank: int = 1, lowrank_interval: int = 1,
                 step_normalize: str | None = None, estimator: str = "two_point",
                 momentum: float = 0.0, adam: bool = False, betas=(0.9, 0.999), adam_eps: float = 1e-8,
                 seed: int = 0, on_nonfinite: str = "raise", noise_backend: str = "auto", record: bool = True,
                 member_evaluation: str | BatchedMembers = "inplace", hessian_smooth: float = 0.0,
                 rounding: str = "stochastic", **renamed):
        refuse_keywords("MeZO", renamed, RENAMED)
        if noise not in _noise.NOISES:
            raise ValueError(f"noise must be one of {_noise.NOISES}, got {noise!r}")
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
        if on_nonfinite not in ON_NONFINITE:
            raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE}, got {on_nonfinite!r}")
        if noise_backend not in _noise.BACKENDS:
            raise ValueError(f"noise_backend must be one of {_noise.BACKENDS}, got {noise_backend!r}")
        if step_normalize not in _STEP_NORMALIZE:
            raise ValueError(f"step_normalize must be one of {_STEP_NORMALIZE}, got {step_normalize!r}")
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
        strategy = member_evaluation if isinstance(member_evaluation, BatchedMembers) else None
        if strategy is not None:
            member_evaluation = "batched"
        if member_evaluation not in MEMBER_EVALUATIONS:
            raise ValueError(f"member_evaluation must be one of {MEMBER_EVALUATIONS} or BatchedMembers(model), "
                             f"got {member_evaluation!r}")
        for name, value in (("n_spsa", n_spsa), ("rank", rank), ("lowrank_interval", lowrank_interval)):
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if estimator == "one_point" and n_spsa != 1:
            raise ValueError("the one-point estimator uses one sample per step: n_spsa must be 1")
        if estimator == "es" and n_spsa < 2:
            raise ValueError("the es estimator centres the losses across its population: n_spsa must be >= 2")
        if estimator == "one_point" and step_normalize:
            raise ValueError("step_normalize='std' needs the two-point estimator (one closure value per step has no spread)")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
        if adam and momentum:
            raise ValueError("choose either momentum or adam, not both")
        if not (len(betas) == 2 and all(0.0 <= b < 1.0 for b in betas)):
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
        if not (isinstance(hessian_smooth, (int, float)) and 0.0 <= hessian_smooth < 1.0):
            raise ValueError(f"hessian_smooth must be a number in [0, 1), got {hessian_smooth!r}")
        given = dict(estimator=estimator, noise=noise, rank=rank)
        if hessian_smooth and given != HIZOO_OPTIONS:
            raise ValueError(f"hessian_smooth (HiZOO) needs the two-point estimator with noise='lowrank' and rank=1; "
                             f"got estimator={estimator!r}, noise={noise!r}, rank={rank}")
        if not (isinstance(seed, int) and 0 <= seed < 2**31):
            raise ValueError(f"seed must be an integer in [0, 2**31), got {seed!r}")
        run = dict(n_spsa=n_spsa, noise=noise, rank=rank, lowrank_interval=lowrank_interval,
                   step_normalize=step_normalize, estimator=estimator, momentum=float(momentum),
                   adam=bool(adam), betas=[float(b) for b in betas], adam_eps=float(adam_eps),
                   seed=seed, on_nonfinite=on_nonfinite, noise_backend=noise_backend, member_evaluation=member_evaluation,
                   hessian_smooth=float(hessian_smooth), rounding=rounding)
        assert run.keys() == _RUN_DEFAULTS.keys()
        super().__init__(params, dict(lr=lr, eps=eps, weight_decay=weight_decay, **run))
        self._samples = 0          # noise samples drawn so far; the next seed is seed * 2**32 + _samples
        self._updates = 0          # applied updates (Adam bias correction)
        self._prev_loss = None     # one-point estimator: the previous step's loss
        self._noise = None         # NoiseSpec with the resolved backend, fixed at the first step
        self._curvature = None     # hessian_smooth > 0: HiZOO's curvature, made with the noise
        self._record = record
        self.trajectory = Trajectory()
        self._members = strategy   # batched evaluation: the strategy that evaluates a step's members
        self._replaying = False
        if strategy is not None:   # a tensor it cannot perturb: one line now, not at the first step
            strategy.prepare([e for e in self._flat() if e[1].requires_grad], noise, self.members_per_step)
        self._check_in_place([p for _, p, _ in self._flat()])

    def _check_in_place(self, params) -> None:
        """In-place evaluation of bf16 / fp16 weights is refused in one line: a perturbation swept into them rounds
        and the restore does not return them bit for bit (the weights would walk away over a run)."""
        low = _low_precision_in_place(params) if self.config["member_evaluation"] == "inplace" else None
        if low is not None:
            raise ValueError(f"MeZO cannot perturb {low} weights in place: a perturbation rounds and its restore does "
                             "not return them bit for bit; use member_evaluation=BatchedMembers(model) (the weights untouched "
                             "until the update) or float32 weights (with autocast for low-precision compute)")

    @property
    def member_evaluation(self) -> BatchedMembers | None:
        """The batched evaluation's strategy (``member_evaluation=BatchedMembers(model)``), or None in place. A closure
        needs none of it: the members it is given say how they are evaluated (:class:`Members`)."""
        return self._members

    @property
    def config(self) -> dict:
        """The options of the whole run (every default but lr, eps and weight_decay), read from ``defaults``."""
        return {k: self.defaults[k] for k in _RUN_DEFAULTS}

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        g = self.param_groups[-1]
        for name, ok, what in (("lr", g["lr"] >= 0, ">= 0"), ("eps", g["eps"] > 0, "> 0"),
                               ("weight_decay", g["weight_decay"] >= 0, ">= 0")):
            if not ok:
                raise ValueError(f"param group {name} must be {what}, got {g[name]!r}")
        for name in _RUN_DEFAULTS:
            if g[name] != self.defaults[name]:
                raise ValueError(f"{name} is an option of the whole run, not of a param group: pass it to MeZO(...), "
                                 f"got {g[name]!r} in a group and {self.defaults[name]!r} for the optimizer")
        for p in g["params"]:
            if not p.is_contiguous():
                raise ValueError("MeZO perturbs tensors in place through a flat view: every parameter must be contiguous")

    # ------------------------------------------------------------------------------------------
    @property
    def noise_backend(self) -> str | None:
        """The noise backend in use (None until the first step resolves ``"auto"``)."""
        return None if self._noise is None else self._noise.backend

    def _flat(self) -> list[tuple[int, torch.Tensor, dict]]:
        out, idx = [], 0
        for group in self.param_groups:
            for p in group["params"]:
                out.append((idx, p, group))
                idx += 1
        return out

    @property
    def curvature(self) -> Curvature | None:
        """HiZOO's curvature (``hessian_smooth`` > 0; :meth:`Curvature.noise_scale` says what it does to the
        noise), None otherwise or before the first step."""
        return self._curvature

    @property
    def members_per_step(self) -> int:
        """M, the closure values one step needs: 2 n_spsa (two-point; + 1, the unperturbed weights, with
        ``hessian_smooth``), n_spsa (es), 1 (one-point)."""
        est, n = self.config["estimator"], self.config["n_spsa"]
        return 1 if est == "one_point" else n if est == "es" else 2 * n + (self.config["hessian_smooth"] > 0)

    def _set_backend(self, backend: str) -> None:
        """The run's noise: its kind and backend over the trainable tensors' layout, keeping one step's draws."""
        cfg = self.config
        trainable = [(idx, p) for idx, p, _ in self._flat() if p.requires_grad]
        self._noise = _noise.NoiseSpec(cfg["noise"], backend, cfg["rank"], cfg["lowrank_interval"],
                                       layout=_noise.layout(trainable), keep=cfg["n_spsa"])
        self._curvature = Curvature(self._noise) if cfg["hessian_smooth"] else None

    def _prepare(self) -> list[tuple[int, torch.Tensor, dict]]:
        """Resolve the backend, fill the trajectory header, and list the trainable tensors."""
        flat = self._flat()
        trainable = [e for e in flat if e[1].requires_grad]
        if not trainable:
            raise ValueError("MeZO has no trainable tensors: every parameter has requires_grad=False")
        self._check_in_place([p for _, p, _ in trainable])
        if self._noise is None:
            self._set_backend(_noise.resolve_backend(self.config["noise_backend"], self.config["noise"]))
        if self._noise.kind == "lowrank" and self._noise.layout != _noise.layout((i, p) for i, p, _ in trainable):
            raise ValueError("the trainable tensors changed since the first step; the noise covers the tensors it was "
                             "built for: build a new MeZO for the new setup")
        if self._curvature is not None and len({g["eps"] for g in self.param_groups}) > 1:
            raise ValueError("hessian_smooth (HiZOO) measures the curvature with one eps: give every param group the "
                             f"same eps, got {sorted({g['eps'] for g in self.param_groups})}")
        header = dict(self.config, noise_backend=self._noise.backend, noise_format=_noise.FORMAT,
                      calls_per_step=self.members_per_step,
                      group_sizes=[len(g["params"]) for g in self.param_groups],
                      group_weight_decays=[g["weight_decay"] for g in self.param_groups],
                      param_shapes=[list(p.shape) for _, p, _ in flat],
                      param_dtypes=[str(p.dtype).removeprefix("torch.") for _, p, _ in flat],
                      trainable=[i for i, _, _ in trainable])
        if not self.trajectory.header:
            self.trajectory.header = header
        elif self._record and header != self.trajectory.header:
            raise ValueError("the parameters, their groups or which of them are trainable changed since the first "
                             "step; a trajectory describes one fixed setup: build a new MeZO for the new setup")
        return trainable

    def _sweep(self, entries, seed: int, a_mult: float, update=None, skip_identity: bool = False) -> None:
        """For every trainable tensor: p <- (p + a_mult*eps*z) * c + b*z, (b, c) = update(group).
        ``skip_identity``: leave a tensor alone where that is the identity (a_mult = b = 0, c = 1)."""
        tensors, coefs, of_group = [], [], {}
        for idx, p, group in entries:
            coef = of_group.get(id(group))
            if coef is None:
                b, c = update(group) if update is not None else (0.0, 1.0)
                coef = of_group[id(group)] = (a_mult * group["eps"], b, c)
            if skip_identity and coef == (0.0, 0.0, 1.0):
                continue
            tensors.append((idx, p))
            coefs.append(coef)
        self._noise.sweep_(tensors, seed, coefs)

    def _grads(self, values: list[float], eps: float, spread: float | None) -> list[float]:
        """The projected gradient of each sample for a group with perturbation scale eps."""
        if self.config["estimator"] == "one_point":
            return [0.0 if self._prev_loss is None else (values[0] - self._prev_loss) / eps]
        n = self.config["n_spsa"]
        if self.config["estimator"] == "es":
            mean = sum(values) / n
            scale = eps if spread is None else spread
            return [0.0] * n if scale == 0.0 else [(v - mean) / scale for v in values]
        if spread is None:
            return [(values[2 * j] - values[2 * j + 1]) / (2 * eps) for j in range(n)]
        if spread == 0.0:  # every value equal: no direction is preferred
            return [0.0] * n
        return [(values[2 * j] - values[2 * j + 1]) / (2 * spread) for j in range(n)]

    # ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure, fitness=None) -> StepResult:
        """One MeZO step, its closure called under torch.no_grad(). ``closure(members)`` is given the
        :class:`Members` it evaluates and returns one loss to minimise per member (or, with ``fitness``,
        any object per member, and ``fitness(objects)`` returns the M losses once every member ran): in
        place once per member, that member alone, the parameters perturbed for it; with
        ``member_evaluation="batched"`` once, all M members, the module evaluating each in its block of
        member-major rows. torch.optim's ``closure()`` is called once per member in place and returns
        that member's loss (or object). Returns a :class:`StepResult`."""
        if closure is None:
            raise ValueError("MeZO.step needs a closure: MeZO evaluates the loss itself (it has no gradients)")
        entries = self._prepare()
        base = self.config["seed"] * 2**32
        seeds = [base + self._samples + j for j in range(self.config["n_spsa"])]
        self._samples += len(seeds)
        return self._step(entries, closure, seeds, fitness)

    def _step(self, entries, closure, seeds: list[int], fitness=None) -> StepResult:
        """The step with its noise seeds given (by :meth:`step`, or by :meth:`replay` from the log), in three
        phases: evaluate the members, turn what they returned into losses, update."""
        lrs = [g["lr"] for g in self.param_groups]
        epss = [g["eps"] for g in self.param_groups]
        run = _Evaluation(self, entries, closure, seeds, fitness is not None)
        try:
            outcomes = run.evaluate()
            values = self._losses(outcomes, fitness, run.values)
            center = values.pop() if self._curvature is not None else None
        except BaseException as err:
            run.restore()  # undo the perturbation we are in
            values = run.values
            skip = isinstance(err, FloatingPointError) and self.config["on_nonfinite"] == "skip" and len(values) > 0 \
                and not math.isfinite(values[-1])
            self._log(seeds, values, [], lrs, epss, STATUS["skipped" if skip else "aborted"])
            if not skip:
                raise
            finite = [v for v in values if math.isfinite(v)]
            plain = self.config["estimator"] in ("one_point", "es")
            return StepResult(loss_plus=math.nan, loss_minus=None if plain else math.nan, projected_grads=[],
                              seeds=seeds, loss=sum(finite) / len(finite) if finite else math.nan,
                              skipped=True, lr=lrs[0], values=values)
        return self._update(entries, seeds, values, run.offset, lrs, epss, center)

    def _losses(self, outcomes: list, fitness, values: list[float]) -> list[float]:
        """Phase 2: the members' losses, ``values`` (filled as the closure returned them), or ``fitness``
        applied to what the closure returned; a non-finite loss raises FloatingPointError."""
        if fitness is None:
            return values
        losses = list(fitness(outcomes))
        if len(losses) != len(outcomes):
            raise ValueError(f"fitness returned {len(losses)} losses for {len(outcomes)} members; "
                             f"it must return one per member ({len(outcomes)})")
        for v in losses:
            _append_checked(values, _as_float(v), "member")
        return values

    def _update(self, entries, seeds, values, offset, lrs, epss, center=None) -> StepResult:
        """Phase 3: the projected gradients and the update. The parameters are at theta + offset (in place,
        plain SGD: the restore is fused into the update) or at theta (batched, momentum, Adam, HiZOO).
        ``center``: HiZOO's loss at theta, which then moves the curvature (after the update, which used the
        curvature the members were perturbed with)."""
        cfg = self.config
        n, one_point, es = cfg["n_spsa"], cfg["estimator"] == "one_point", cfg["estimator"] == "es"
        buffered = cfg["adam"] or cfg["momentum"] > 0
        sigma = spread(values) if cfg["step_normalize"] == "std" else None
        grads = self._grads(values, epss[0], sigma)
        group_grads = {id(g): self._grads(values, g["eps"], sigma) for g in self.param_groups}

        def sgd(j, decay):
            def coeffs(group):
                b = -group["lr"] * group_grads[id(group)][j] / n
                return b, (1.0 - group["lr"] * group["weight_decay"]) if decay else 1.0
            return coeffs

        low = [e for e in entries if _rounding.is_low_precision(e[1])]
        if low:  # bf16 / fp16: computed in float32 and rounded once (batched evaluation: the weights are at theta)
            entries = [e for e in entries if not _rounding.is_low_precision(e[1])]
        kept = None
        if buffered:
            self._buffered_update(entries, seeds, group_grads)
            kept = self._buffered_update(low, seeds, group_grads, rounded=True) if low else None
        elif offset is None:  # the weights are at theta: the same updates, without a restore to fuse
            self._sweep(entries, seeds[-1], 0.0, update=sgd(n - 1, decay=True), skip_identity=True)
            for j in range(n - 1):
                self._sweep(entries, seeds[j], 0.0, update=sgd(j, decay=False), skip_identity=True)
            kept = self._rounded_update(low, seeds, group_grads) if low else None
        else:
            self._sweep(entries, seeds[-1], -offset[1], update=sgd(n - 1, decay=True))  # restore + update, fused
            for j in range(n - 1):  # Algorithm 2: the other samples' updates
                self._sweep(entries, seeds[j], 0.0, update=sgd(j, decay=False))
        self._updates += 1
        if one_point:
            self._prev_loss = values[0]
        plus = values if one_point or es else values[0::2]
        minus = values[1::2]
        if center is not None:
            self._move_curvature(seeds, values, center, epss[0])
            values = [*values, center]
        self._log(seeds, values, grads, lrs, epss, STATUS["applied"])
        return StepResult(loss_plus=sum(plus) / len(plus), loss_minus=None if one_point or es else sum(minus) / len(minus),
                          projected_grads=grads, seeds=seeds, loss=sum(values) / len(values), lr=lrs[0],
                          values=values, spread=sigma, update_kept=kept)

    def _move_curvature(self, seeds, values, center: float, eps: float) -> None:
        """HiZOO: each sample's curvature along its direction, ``|l+ + l- - 2 l0| / (2 eps^2)``, moves H
        (:meth:`Curvature.update`), and the noise of the steps to come is scaled by the new ``H^-1/2``."""
        raws = [self._noise.raw(s) for s in seeds]
        curv = torch.tensor([abs(values[2 * j] + values[2 * j + 1] - 2.0 * center) / (2.0 * eps * eps)
                             for j in range(len(seeds))], dtype=torch.float64)
        self._curvature.update(torch.stack([b for b, _ in raws]), torch.stack([a for _, a in raws]), curv,
                               self.config["hessian_smooth"])
        self._noise.precondition(*self._curvature.scales())

    def _evaluate_members(self, closure, members: list[Member], entries) -> list:
        """Batched evaluation: ``closure(members)`` once, the strategy evaluating every member; its M values."""
        if self._replaying:  # the replay closure hands back the logged values; nothing is evaluated
            return list(closure(members))
        if self._members is None:
            raise ValueError("member_evaluation='batched' needs the model the parameters belong to: "
                             "MeZO(params, member_evaluation=BatchedMembers(model))")
        return self._members.evaluate(closure, members, self._noise, entries)

    def _rounded_update(self, entries, seeds, group_grads) -> float | None:
        """The SGD update of bf16 / fp16 tensors (weights at theta): ``c p + sum_j s_j z_j`` computed in float32
        chunk by chunk and rounded once (:func:`mezo_rl.engine.rounding.update_`); the share of it kept. Nothing
        is written where the update is the identity (lr 0), so those weights stay bit for bit."""
        n = self.config["n_spsa"]
        coefs = {id(g): [-g["lr"] * group_grads[id(g)][j] / n for j in range(len(seeds))] for g in self.param_groups}
        decay = {id(g): 1.0 - g["lr"] * g["weight_decay"] for g in self.param_groups}
        entries = [e for e in entries if decay[id(e[2])] != 1.0 or any(coefs[id(e[2])])]

        def add(items):
            for j, s in enumerate(seeds):
                self._noise.add_([(pc.index, pc.p, pc.start, v, coefs[id(pc.group)][j]) for pc, v in items
                                  if coefs[id(pc.group)][j] != 0.0], s)

        return _rounding.update_(entries, add, lambda g: decay[id(g)], self.config["rounding"], seeds[-1],
                                 split_rows=self._noise.kind == "lowrank") if entries else None

    def _buffered_update(self, entries, seeds, group_grads, rounded: bool = False) -> float | None:
        """Momentum / Adam: materialise z per tensor and update the per-tensor float32 buffers (momentum with
        low-rank noise on float32 weights: :meth:`_lowrank_momentum_update`, every tensor at once). ``rounded``:
        bf16 / fp16 tensors, the step computed in float32 and rounded once (:mod:`mezo_rl.engine.rounding`);
        returns the share of it kept."""
        cfg = self.config
        n, mu, (b1, b2) = cfg["n_spsa"], cfg["momentum"], cfg["betas"]
        if cfg["noise"] == "lowrank" and not cfg["adam"] and not rounded:
            return self._lowrank_momentum_update(entries, seeds, group_grads)
        t = self._updates + 1

        def step_of(idx, p, group) -> tuple[torch.Tensor, float]:
            """``(d, alpha)``: the change of ``p`` after its weight decay is ``alpha * d`` (float32), its buffers moved."""
            est = None  # the ZO gradient estimate for this tensor: mean_j g_j z_j
            for j, s in enumerate(seeds):
                z = self._noise.sample(p, s, idx).mul_(group_grads[id(group)][j] / n)
                est = z if est is None else est.add_(z)
            state, lr = self.state[p], group["lr"]
            if cfg["adam"]:
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(est, alpha=1 - b1)
                v.mul_(b2).addcmul_(est, est, value=1 - b2)
                denom = (v / (1 - b2**t)).sqrt_().add_(cfg["adam_eps"])
                return m / denom, -lr / (1 - b1**t)
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, dtype=torch.float32)
            return state["momentum_buffer"].mul_(mu).add_(est), -lr

        if rounded:
            def add(items):
                for pc, v in items:
                    d, alpha = step_of(pc.index, pc.p, pc.group)
                    v.add_(d.view(v.shape), alpha=alpha)
            return _rounding.update_(entries, add, lambda g: 1.0 - g["lr"] * g["weight_decay"], cfg["rounding"],
                                     seeds[-1], split_rows=False)
        for idx, p, group in entries:
            if group["weight_decay"]:
                p.mul_(1.0 - group["lr"] * group["weight_decay"])
            d, alpha = step_of(idx, p, group)
            p.add_(d, alpha=alpha)
        return None

    def _lowrank_momentum_update(self, entries, seeds, group_grads) -> None:
        """Heavy-ball momentum with low-rank noise, in operations that do not grow with the number of tensors:
        ``m <- mu m``, then ``m <- m + (g_j / n) z_j`` for each sample (a sweep of the buffers: the factors are
        added to them as to the weights, never materialised), then ``p <- p (1 - lr wd) - lr m``."""
        n, mu = self.config["n_spsa"], self.config["momentum"]
        bufs = []
        for _, p, _ in entries:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, dtype=torch.float32)
            bufs.append(state["momentum_buffer"])
        by_device: dict = {}
        for (_, p, group), buf in zip(entries, bufs):
            by_device.setdefault(p.device, []).append((p, buf, group))
        for device, items in by_device.items():
            with _noise.one_thread_on_cpu([device]):
                torch._foreach_mul_([b for _, b, _ in items], mu)
        for j, s in enumerate(seeds):
            self._noise.sweep_([(idx, buf) for (idx, _, _), buf in zip(entries, bufs)], s,
                               [(0.0, group_grads[id(group)][j] / n, 1.0) for _, _, group in entries])
        for device, items in by_device.items():
            decayed = [(p, 1.0 - group["lr"] * group["weight_decay"]) for p, _, group in items if group["weight_decay"]]
            one = torch.ones((), dtype=torch.float32, device=device)
            with _noise.one_thread_on_cpu([device]):
                if decayed:
                    torch._foreach_mul_([p for p, _ in decayed], [c for _, c in decayed])
                torch._foreach_addcmul_([p for p, _, _ in items], [b for _, b, _ in items], [one] * len(items),
                                        [-group["lr"] for _, _, group in items])

    def _log(self, seeds, values, grads, lrs, epss, status) -> None:
        if self._record:
            self.trajectory.append(seeds=seeds, values=values, projected_grads=grads, lrs=lrs, epss=epss,
                                   status=status, calls=len(values))

    # ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def replay(self, trajectory: Trajectory, on_step: Callable[[int, "MeZO"], None] | None = None) -> None:
        """Re-execute every step of ``trajectory`` on this optimizer's parameters, with the
        logged seeds, lrs and eps, and the closure replaced by the logged values. Raises
        RuntimeError where the replay diverges from the log (an abort or projected gradient that
        differs). Build the optimizer with :func:`replay_trajectory` unless you know its setup.
        ``on_step(t, optimizer)``, if given, is called after each row ``t`` of the log (whether it
        moved the weights or not): the weights and state are then those of the run after step t + 1."""
        _with_noise_format(trajectory.header)
        _check_rounding_recorded(trajectory.header, trajectory.header.get("param_dtypes", ()))
        entries = self._prepare()
        batched = self.config["member_evaluation"] == "batched"
        for t, row in enumerate(trajectory):
            self._replay_row(entries, row, t, batched)
            if on_step is not None:
                on_step(t, self)

    def _replay_row(self, entries, row, t: int, batched: bool) -> None:
        """One logged step re-executed (:meth:`replay`)."""
        if batched and row.status != STATUS["applied"]:
            return  # a batched step that aborted or was skipped never touched the weights
        for g, lr, eps in zip(self.param_groups, row.lrs, row.epss):
            g["lr"], g["eps"] = lr, eps
        recorded = iter(row.values[: row.calls])

        def closure(members):
            try:
                return [next(recorded) for _ in members]
            except StopIteration:
                raise _ReplayAbort() from None

        try:
            self._replaying = True
            res = self._step(entries, closure, list(row.seeds))
        except (_ReplayAbort, FloatingPointError):
            if row.status != STATUS["aborted"]:
                raise RuntimeError(f"replay diverged at step {t}: it aborted, the run did not") from None
            return
        finally:
            self._replaying = False
        if row.status == STATUS["applied"] and res.projected_grads != list(row.projected_grads):
            raise RuntimeError(f"replay diverged at step {t}: projected gradients differ")

    # ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The torch optimizer state plus MeZO's own: counters, one-point memory and the trajectory."""
        sd = super().state_dict()
        sd["mezo"] = {"config": dict(self.config), "samples": self._samples, "updates": self._updates,
                      "prev_loss": self._prev_loss, "backend": self.noise_backend, "noise_format": _noise.FORMAT,
                      "trajectory": self.trajectory.state_dict() if self._record else None,
                      "curvature": None if self._curvature is None else self._curvature.state_dict()}
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        sd = dict(state_dict)
        extra = sd.pop("mezo", None)
        if extra is None:
            raise ValueError("not a MeZO state dict: the 'mezo' entry is missing")
        _check_rounding_recorded(extra["config"], [str(p.dtype).removeprefix("torch.") for _, p, _ in self._flat()
                                                   if p.requires_grad])
        saved = {**_ADDED_LATER, **recorded_options(extra["config"])}
        if saved != self.config:
            diff = {k: (saved.get(k), v) for k, v in self.config.items() if saved.get(k) != v}
            raise ValueError(f"the state dict was saved by a MeZO with a different configuration (saved, here): {diff}")
        _with_noise_format({"noise": saved["noise"], "noise_format": extra.get("noise_format", 1)})
        # groups saved before every hyperparameter was recorded in them: complete them from this run
        sd["param_groups"] = [{**{k: v for k, v in mine.items() if k != "params"}, **recorded_options(theirs)}
                              for mine, theirs in zip(self.param_groups, sd["param_groups"])]
        super().load_state_dict(sd)
        # torch casts floating state to the parameter's dtype; MeZO's buffers stay float32
        for idx, p, _ in self._flat():
            for k, v in sd["state"].get(idx, {}).items():
                if isinstance(v, torch.Tensor):
                    self.state[p][k] = v.detach().clone().to(p.device)
        self._samples, self._updates, self._prev_loss = extra["samples"], extra["updates"], extra["prev_loss"]
        self._noise = None
        if extra["backend"] is not None:
            self._set_backend(extra["backend"])
            if self._curvature is not None:
                self._curvature.load_state_dict(extra["curvature"])
                self._noise.precondition(*self._curvature.scales())
        if extra["trajectory"] is not None:
            self.trajectory = Trajectory.from_state_dict(extra["trajectory"])
            if self.trajectory.header:
                self.trajectory.header = _with_noise_format({**_ADDED_LATER, **recorded_options(self.trajectory.header)})


def _flat_params(params) -> list[torch.Tensor]:
    if isinstance(params, torch.nn.Module):
        return list(params.parameters())
    params = list(params)
    if params and isinstance(params[0], dict):
        return [p for g in params for p in g["params"]]
    return [p[1] if isinstance(p, tuple) else p for p in params]


def replay_trajectory(params: torch.nn.Module | Iterable, trajectory: Trajectory | str | os.PathLike,
                      on_step: Callable[[int, MeZO], None] | None = None) -> None:
    """Rebuild trained weights in place from the initial weights and the run's trajectory.

    ``params`` must hold the weights the run *started* from, in the optimizer's order: a module
    (its ``.parameters()``), an iterable of tensors or ``(name, tensor)`` pairs, or the param
    groups the optimizer was built with. Group structure (which tensors share an lr, eps and
    weight decay) is taken from the trajectory. Tensors with ``requires_grad=False`` are left
    alone, as in training. No data and no forward pass are needed; the result is bit-identical to
    the end of the run on the same machine and torch version, with the same noise backend.
    Momentum and Adam runs allocate their buffers again while replaying. Replay a prefix with
    ``replay_trajectory(params, trajectory[:n])``; look at every step on the way with
    ``on_step(t, optimizer)`` (:meth:`MeZO.replay`).
    """
    traj = trajectory if isinstance(trajectory, Trajectory) else Trajectory.load(trajectory)
    h = traj.header
    if not h:
        raise ValueError("the trajectory has no header: it was never filled by a MeZO run")
    _check_rounding_recorded(h, h["param_dtypes"])
    h = _with_noise_format({**_ADDED_LATER, **recorded_options(h)})
    flat = _flat_params(params)
    shapes = [list(p.shape) for p in flat]
    if shapes != h["param_shapes"]:
        first = next((i for i, (a, b) in enumerate(zip(shapes, h["param_shapes"])) if a != b),
                     min(len(shapes), len(h["param_shapes"])))
        raise ValueError(f"replay needs the {len(h['param_shapes'])} tensors the run was built with, in the same "
                         f"order and shapes; got {len(flat)} tensors (first mismatch at index {first})")
    dtypes = [str(p.dtype).removeprefix("torch.") for p in flat]
    if dtypes != h["param_dtypes"]:
        raise ValueError(f"replay needs the same dtypes as the run ({sorted(set(h['param_dtypes']))}); got {sorted(set(dtypes))}")
    trainable = [i for i, p in enumerate(flat) if p.requires_grad]
    if trainable != h["trainable"]:
        raise ValueError("replay needs the same tensors to be trainable (requires_grad=True) as in the run")
    groups, start = [], 0
    for size, wd in zip(h["group_sizes"], h["group_weight_decays"]):
        groups.append({"params": flat[start:start + size], "weight_decay": wd})
        start += size
    opt = MeZO(groups, lr=0.0, eps=1.0, betas=tuple(h["betas"]), record=False,
               **{k: h[k] for k in _RUN_DEFAULTS if k != "betas"})
    opt.replay(traj, on_step)


def get_scheduler(name: str, optimizer: torch.optim.Optimizer, total_steps: int | None = None):
    """A torch LR scheduler: ``"constant"`` or ``"linear"`` (decay to 0 over ``total_steps``).

    Call ``scheduler.step()`` after each ``opt.step(closure)``. The trajectory records the lr
    actually used at every step, so replay needs no scheduler.
    """
    if name == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    if name == "linear":
        if not (isinstance(total_steps, int) and total_steps > 0):
            raise ValueError(f"the linear schedule needs total_steps > 0, got {total_steps!r}")
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1.0 - step / total_steps))
    raise ValueError(f"unknown lr schedule {name!r}; choose {' or '.join(map(repr, SCHEDULERS))}")
