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
``momentum=mu`` / ``adam=True``  heavy-ball momentum or Adam on the ZO estimate, with one or two float32 buffers per
                trainable tensor (+4 or +8 bytes per parameter): :mod:`mezo_rl.engine.buffers`.
``hessian_smooth=alpha``  HiZOO (Zhao et al., ICLR 2025): a diagonal curvature estimate H preconditions the
                perturbation, z -> H^-1/2 z; one more member a step (the unperturbed weights, last) measures the
                curvature, and H moves towards it at the rate alpha (:mod:`mezo_rl.engine.curvature`). Two-point,
                rank-1 low-rank noise, one eps.

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

Members and fitness: a step evaluates M *members*, each one noise seed and sign, in place (the closure called once
per member, its perturbation in the weights) or batched (``member_evaluation=BatchedMembers(model)``: one call for
all M, the weights untouched); ``step(closure, fitness=f)`` turns what the members returned into losses. How a
closure is called, and the batched mode: :mod:`mezo_rl.engine.step`.

Exception safety: if the closure raises (anything, KeyboardInterrupt included) the parameters are
restored before the exception propagates. If it returns a non-finite value the parameters are
restored and, with ``on_nonfinite="raise"`` (default), ``FloatingPointError`` is raised; with
``"skip"`` the step is skipped (no update) and ``StepResult.skipped`` is True. Restoring is exact
in the exact mode and within rounding (~1e-7 relative) otherwise; the trajectory logs skipped and
aborted steps so that replay repeats their sweeps too.

Reproducibility: step seeds are ``seed * 2**32 + k`` for the k-th noise sample of the run; the
global RNG is never used. ``opt.trajectory`` logs every step; :func:`replay_trajectory` (here, with
the optimizer that re-executes the steps; :meth:`MeZO.replay` takes the seeds from the log)
rebuilds the final weights from the initial ones; ``state_dict()`` resumes a run exactly. A recorded run is read
under this version's names, or refused in one line: :mod:`mezo_rl.engine.recorded`. A step's members and result:
:mod:`mezo_rl.engine.step`.
"""
from __future__ import annotations

import math
import os
from typing import Callable, Iterable

import torch

from mezo_rl.choices import ESTIMATORS, HIZOO_OPTIONS, MEMBER_EVALUATIONS, ON_NONFINITE
from mezo_rl.engine import noise as _noise
from mezo_rl.engine import rounding as _rounding
from mezo_rl.engine.buffers import buffered_update
from mezo_rl.engine.curvature import Curvature
from mezo_rl.engine.population import BatchedMembers, Member, Members
from mezo_rl.engine.recorded import (ADDED_LATER, RENAMED, check_rounding_recorded, recorded_options, replay_groups,
                                     replay_row, with_noise_format)
from mezo_rl.engine.step import MemberEvaluation, StepResult, append_checked, as_float, spread
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
        low = _rounding.low_precision_trainable(params) if self.config["member_evaluation"] == "inplace" else None
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
        run = MemberEvaluation(self, entries, closure, seeds, fitness is not None)
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
            append_checked(values, as_float(v), "member")
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
            buffered_update(self, entries, seeds, group_grads)
            kept = buffered_update(self, low, seeds, group_grads, rounded=True) if low else None
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
            self._curvature.observe(self._noise, seeds, values, center, epss[0], self.config["hessian_smooth"])
            values = [*values, center]
        self._log(seeds, values, grads, lrs, epss, STATUS["applied"])
        return StepResult(loss_plus=sum(plus) / len(plus), loss_minus=None if one_point or es else sum(minus) / len(minus),
                          projected_grads=grads, seeds=seeds, loss=sum(values) / len(values), lr=lrs[0],
                          values=values, spread=sigma, update_kept=kept)

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
        with_noise_format(trajectory.header)
        check_rounding_recorded(trajectory.header, trajectory.header.get("param_dtypes", ()))
        entries = self._prepare()
        batched = self.config["member_evaluation"] == "batched"
        for t, row in enumerate(trajectory):
            replay_row(self, entries, row, t, batched)
            if on_step is not None:
                on_step(t, self)

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
        check_rounding_recorded(extra["config"], [str(p.dtype).removeprefix("torch.") for _, p, _ in self._flat()
                                                   if p.requires_grad])
        saved = {**ADDED_LATER, **recorded_options(extra["config"])}
        if saved != self.config:
            diff = {k: (saved.get(k), v) for k, v in self.config.items() if saved.get(k) != v}
            raise ValueError(f"the state dict was saved by a MeZO with a different configuration (saved, here): {diff}")
        with_noise_format({"noise": saved["noise"], "noise_format": extra.get("noise_format", 1)})
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
                self.trajectory.header = with_noise_format({**ADDED_LATER, **recorded_options(self.trajectory.header)})


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
    check_rounding_recorded(h, h["param_dtypes"])
    h = with_noise_format({**ADDED_LATER, **recorded_options(h)})
    groups = replay_groups(params, h)
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
