"""MeZO: in-place zeroth-order SGD with seed-replayed noise (Malladi et al. 2023, Algorithm 1).

    opt = MeZO(model.parameters(), lr=1e-6, eps=1e-3)

    def closure():                       # called with the parameters perturbed in place
        with torch.no_grad():
            return loss_fn(model(batch))   # float or 0-d tensor, the loss to minimise

    res = opt.step(closure)              # StepResult(loss_plus, loss_minus, projected_grads, ...)

One step of the default two-point estimator (SPSA, n=1) makes three in-place sweeps over the
trainable tensors, each regenerating the same noise z from the step's seed (:mod:`mezo_rl.noise`):

    theta + eps z           -> l+ = closure()
    theta - eps z           -> l- = closure()          g = (l+ - l-) / (2 eps)
    (theta + eps z) restored and updated in one pass:  theta <- theta (1 - lr wd) - lr g z

No buffer the size of the model is ever allocated; at most one temporary the size of the largest
tensor (the plain "torch" noise backend materialises z for one tensor at a time; the compiled
backend materialises nothing). Only tensors with ``requires_grad=True`` are touched, so a frozen
base model with LoRA adapters works unchanged.

Variants (paper Appendix B), with their memory cost:

``n_spsa=n``    Algorithm 2: n samples of z per step, evaluated at the same theta, update with the
                mean of the n estimates. 2n scalars of state; 4n-1 sweeps and 2n closure calls.
``estimator="one_point"``  Zhang et al. (2022): one closure call per step,
                g_t = (l(theta_t + eps z_t) - l_{t-1}) / eps. One scalar of state (the previous
                loss); the first step has no previous loss and so makes no update.
``momentum=mu`` heavy-ball momentum on the ZO estimate, m <- mu m + g z, theta <- theta - lr m.
                Costs one float32 buffer per trainable tensor (+4 bytes per parameter).
``adam=True``   Adam on the ZO estimate. Two float32 buffers (+8 bytes per parameter).
                Both need the estimate g z as a tensor, so their update is a separate fourth
                sweep that materialises z per tensor. (The history could be recomputed from the
                logged seeds instead, as the paper notes, but that costs one sweep per remembered
                step; buffers are the honest default.)

Noise: ``noise="gaussian"`` (default) or ``"rademacher"`` (z_i = +-1). With Rademacher z and a
power-of-two eps (e.g. ``eps=2**-10``) the perturbation eps*z is exactly representable, and
``theta + eps z - 2 eps z + eps z`` returns theta exactly whenever ``theta +- eps`` is exactly
representable (see docs/engine.md for measured drift).

Exception safety: if the closure raises (anything, KeyboardInterrupt included) the parameters are
restored before the exception propagates. If it returns a non-finite value the parameters are
restored and, with ``on_nonfinite="raise"`` (default), ``FloatingPointError`` is raised; with
``"skip"`` the step is skipped (no update) and ``StepResult.skipped`` is True. Restoring is exact
in the exact mode and within rounding (~1e-7 relative) otherwise; the trajectory logs skipped and
aborted steps so that replay repeats their sweeps too.

Reproducibility: step seeds are ``seed * 2**32 + k`` for the k-th noise sample of the run; the
global RNG is never used. ``opt.trajectory`` logs every step; ``mezo_rl.replay_trajectory``
rebuilds the final weights from the initial ones; ``state_dict()`` resumes a run exactly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from mezo_rl import noise as _noise
from mezo_rl.trajectory import STATUS, Trajectory

__all__ = ["MeZO", "StepResult", "get_scheduler"]

_ESTIMATORS = ("two_point", "one_point")
_NONFINITE = ("raise", "skip")


@dataclass
class StepResult:
    """What one :meth:`MeZO.step` did.

    ``loss_plus`` / ``loss_minus``: closure values at theta + eps z and theta - eps z (means over
    the n samples of n-SPSA; ``loss_minus`` is None for the one-point estimator).
    ``projected_grads``: one scalar per sample, ``(l+ - l-) / (2 eps)`` with the first group's eps.
    ``seeds``: the noise seed of each sample. ``loss``: the mean of all closure values.
    ``skipped``: True when a non-finite loss made the step a no-op (``on_nonfinite="skip"``).
    ``lr``: the first group's learning rate used for the update.
    """

    loss_plus: float
    loss_minus: float | None
    projected_grads: list[float]
    seeds: list[int]
    loss: float
    skipped: bool = False
    lr: float = 0.0
    values: list[float] = field(default_factory=list)


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


class MeZO(torch.optim.Optimizer):
    """In-place zeroth-order SGD (MeZO) and its Appendix-B variants; see the module docstring.

    Args:
        params: tensors or param groups (dicts with ``params`` and optionally ``lr``, ``eps``,
            ``weight_decay``), as for any ``torch.optim`` optimizer. Tensors must be contiguous.
        lr: learning rate (per group). eps: perturbation scale (per group, > 0).
        weight_decay: decoupled decay ``theta <- theta (1 - lr wd)`` applied with the update.
        n_spsa: samples of z per step (Algorithm 2). noise: ``"gaussian"`` or ``"rademacher"``.
        estimator: ``"two_point"`` (SPSA, default) or ``"one_point"``.
        momentum: heavy-ball momentum in [0, 1) (0 = off). adam: use ZO-Adam with ``betas``
            and ``adam_eps``. momentum and adam are exclusive.
        seed: base seed of the run (0 <= seed < 2**31).
        on_nonfinite: ``"raise"`` or ``"skip"`` when the closure returns NaN/inf.
        noise_backend: ``"auto"`` (compiled if torch.compile works, else torch), ``"compiled"``
            or ``"torch"``; see :mod:`mezo_rl.noise`.
        record: keep ``opt.trajectory`` (default True).
    """

    def __init__(self, params, lr: float = 1e-6, eps: float = 1e-3, weight_decay: float = 0.0, *,
                 n_spsa: int = 1, noise: str = "gaussian", estimator: str = "two_point",
                 momentum: float = 0.0, adam: bool = False, betas=(0.9, 0.999), adam_eps: float = 1e-8,
                 seed: int = 0, on_nonfinite: str = "raise", noise_backend: str = "auto", record: bool = True):
        if noise not in _noise.KINDS:
            raise ValueError(f"noise must be one of {_noise.KINDS}, got {noise!r}")
        if estimator not in _ESTIMATORS:
            raise ValueError(f"estimator must be one of {_ESTIMATORS}, got {estimator!r}")
        if on_nonfinite not in _NONFINITE:
            raise ValueError(f"on_nonfinite must be one of {_NONFINITE}, got {on_nonfinite!r}")
        if noise_backend not in _noise.BACKENDS:
            raise ValueError(f"noise_backend must be one of {_noise.BACKENDS}, got {noise_backend!r}")
        if not (isinstance(n_spsa, int) and n_spsa >= 1):
            raise ValueError(f"n_spsa must be an integer >= 1, got {n_spsa!r}")
        if estimator == "one_point" and n_spsa != 1:
            raise ValueError("the one-point estimator uses one sample per step: n_spsa must be 1")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
        if adam and momentum:
            raise ValueError("choose either momentum or adam, not both")
        if not (len(betas) == 2 and all(0.0 <= b < 1.0 for b in betas)):
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
        if not (isinstance(seed, int) and 0 <= seed < 2**31):
            raise ValueError(f"seed must be an integer in [0, 2**31), got {seed!r}")
        super().__init__(params, dict(lr=lr, eps=eps, weight_decay=weight_decay))
        self.config = dict(n_spsa=n_spsa, noise=noise, estimator=estimator, momentum=float(momentum),
                           adam=bool(adam), betas=[float(b) for b in betas], adam_eps=float(adam_eps),
                           seed=seed, on_nonfinite=on_nonfinite, noise_backend=noise_backend)
        self._samples = 0          # noise samples drawn so far; the next seed is seed * 2**32 + _samples
        self._updates = 0          # applied updates (Adam bias correction)
        self._prev_loss = None     # one-point estimator: the previous step's loss
        self._backend = None       # resolved noise backend ("torch" | "compiled"), fixed at the first step
        self._record = record
        self.trajectory = Trajectory()

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        g = self.param_groups[-1]
        for name, ok, what in (("lr", g["lr"] >= 0, ">= 0"), ("eps", g["eps"] > 0, "> 0"),
                               ("weight_decay", g["weight_decay"] >= 0, ">= 0")):
            if not ok:
                raise ValueError(f"param group {name} must be {what}, got {g[name]!r}")
        for p in g["params"]:
            if not p.is_contiguous():
                raise ValueError("MeZO perturbs tensors in place through a flat view: every parameter must be contiguous")

    # ------------------------------------------------------------------------------------------
    @property
    def noise_backend(self) -> str | None:
        """The noise backend in use (None until the first step resolves ``"auto"``)."""
        return self._backend

    def _flat(self) -> list[tuple[int, torch.Tensor, dict]]:
        out, idx = [], 0
        for group in self.param_groups:
            for p in group["params"]:
                out.append((idx, p, group))
                idx += 1
        return out

    def _prepare(self) -> list[tuple[int, torch.Tensor, dict]]:
        """Resolve the backend, fill the trajectory header, and list the trainable tensors."""
        flat = self._flat()
        trainable = [e for e in flat if e[1].requires_grad]
        if not trainable:
            raise ValueError("MeZO has no trainable tensors: every parameter has requires_grad=False")
        if self._backend is None:
            self._backend = _noise.resolve_backend(self.config["noise_backend"])
        header = dict(self.config, noise_backend=self._backend,
                      calls_per_step=1 if self.config["estimator"] == "one_point" else 2 * self.config["n_spsa"],
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

    def _next_seed(self) -> int:
        if self._replay_seeds is not None:
            return self._replay_seeds.pop(0)
        seed = self.config["seed"] * 2**32 + self._samples
        self._samples += 1
        return seed

    _replay_seeds: list[int] | None = None

    def _sweep(self, entries, seed: int, a_mult: float, update=None) -> None:
        """For every trainable tensor: p <- (p + a_mult*eps*z) * c + b*z, (b, c) = update(group)."""
        kind, backend = self.config["noise"], self._backend
        for idx, p, group in entries:
            b, c = update(group) if update is not None else (0.0, 1.0)
            key = _noise.tensor_key(seed, idx, p.shape)
            _noise.axpy_(p, key, kind, backend, a=a_mult * group["eps"], b=b, c=c)

    def _grad(self, values: list[float], j: int, eps: float) -> float:
        """Projected gradient of sample j for a group with perturbation scale eps."""
        if self.config["estimator"] == "one_point":
            return 0.0 if self._prev_loss is None else (values[0] - self._prev_loss) / eps
        return (values[2 * j] - values[2 * j + 1]) / (2 * eps)

    # ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure) -> StepResult:
        """One MeZO step. ``closure()`` is called with the parameters perturbed in place
        (twice per sample for the two-point estimator, once for one-point) under torch.no_grad()
        and must return the loss to minimise. Returns a :class:`StepResult`."""
        if closure is None:
            raise ValueError("MeZO.step needs a closure: MeZO evaluates the loss itself (it has no gradients)")
        entries = self._prepare()
        cfg = self.config
        n, one_point = cfg["n_spsa"], cfg["estimator"] == "one_point"
        buffered = cfg["adam"] or cfg["momentum"] > 0
        lrs = [g["lr"] for g in self.param_groups]
        epss = [g["eps"] for g in self.param_groups]
        seeds = [self._next_seed() for _ in range(n)]
        values: list[float] = []
        offset = None  # (seed, mult): the parameters are currently theta + mult * eps * z(seed)

        def call():
            v = _as_float(closure())
            values.append(v)
            if not math.isfinite(v):
                raise FloatingPointError(f"the closure returned a non-finite loss ({v}) at call {len(values)} of the step")

        try:
            for j, s in enumerate(seeds):
                self._sweep(entries, s, +1.0)
                offset = (s, 1.0)
                call()
                if one_point:
                    break
                self._sweep(entries, s, -2.0)
                offset = (s, -1.0)
                call()
                if j < n - 1 or buffered:  # restore now; otherwise the restore is fused into the update
                    self._sweep(entries, s, +1.0)
                    offset = None
        except BaseException as err:
            if offset is not None:  # undo the perturbation we are in
                self._sweep(entries, offset[0], -offset[1])
            skip = isinstance(err, FloatingPointError) and cfg["on_nonfinite"] == "skip" and len(values) > 0 \
                and not math.isfinite(values[-1])
            self._log(seeds, values, [], lrs, epss, STATUS["skipped" if skip else "aborted"])
            if not skip:
                raise
            finite = [v for v in values if math.isfinite(v)]
            return StepResult(loss_plus=math.nan, loss_minus=None if one_point else math.nan,
                              projected_grads=[], seeds=seeds, loss=sum(finite) / len(finite) if finite else math.nan,
                              skipped=True, lr=lrs[0], values=values)

        if buffered and offset is not None:  # one-point + momentum/Adam: restore before the update
            self._sweep(entries, offset[0], -offset[1])
        # The update. Parameters are at theta + offset (buffered variants: at theta).
        grads = [self._grad(values, j, epss[0]) for j in range(n)]

        def sgd(j, decay):
            def coeffs(group):
                b = -group["lr"] * self._grad(values, j, group["eps"]) / n
                return b, (1.0 - group["lr"] * group["weight_decay"]) if decay else 1.0
            return coeffs

        if buffered:
            self._buffered_update(entries, seeds, values)
        else:
            last = seeds[-1]
            self._sweep(entries, last, -offset[1], update=sgd(n - 1, decay=True))  # restore + update, fused
            for j in range(n - 1):  # Algorithm 2: the other samples' updates
                self._sweep(entries, seeds[j], 0.0, update=sgd(j, decay=False))
        self._updates += 1
        if one_point:
            self._prev_loss = values[0]
        self._log(seeds, values, grads, lrs, epss, STATUS["applied"])
        plus = values[0::2] if not one_point else values
        minus = values[1::2]
        return StepResult(loss_plus=sum(plus) / len(plus), loss_minus=None if one_point else sum(minus) / len(minus),
                          projected_grads=grads, seeds=seeds, loss=sum(values) / len(values), lr=lrs[0], values=values)

    def _buffered_update(self, entries, seeds, values) -> None:
        """Momentum / Adam: materialise z per tensor and update the per-tensor float32 buffers."""
        cfg = self.config
        n, mu, (b1, b2) = cfg["n_spsa"], cfg["momentum"], cfg["betas"]
        t = self._updates + 1
        for idx, p, group in entries:
            lr = group["lr"]
            est = None  # the ZO gradient estimate for this tensor: mean_j g_j z_j
            for j, s in enumerate(seeds):
                z = _noise.generate(_noise.tensor_key(s, idx, p.shape), p.numel(), cfg["noise"], self._backend, p.device)
                z = z.view(p.shape).mul_(self._grad(values, j, group["eps"]) / n)
                est = z if est is None else est.add_(z)
            state = self.state[p]
            if group["weight_decay"]:
                p.mul_(1.0 - lr * group["weight_decay"])
            if cfg["adam"]:
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(est, alpha=1 - b1)
                v.mul_(b2).addcmul_(est, est, value=1 - b2)
                denom = (v / (1 - b2**t)).sqrt_().add_(cfg["adam_eps"])
                p.add_((m / denom).to(p.dtype), alpha=-lr / (1 - b1**t))
            else:
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p, dtype=torch.float32)
                buf = state["momentum_buffer"].mul_(mu).add_(est)
                p.add_(buf.to(p.dtype), alpha=-lr)

    def _log(self, seeds, values, grads, lrs, epss, status) -> None:
        if self._record:
            self.trajectory.append(seeds=seeds, values=values, projected_grads=grads, lrs=lrs, epss=epss,
                                   status=status, calls=len(values))

    # ------------------------------------------------------------------------------------------
    def _replay(self, traj: Trajectory) -> None:
        """Re-execute every logged step with the closure replaced by the logged values."""
        seeds, values, lrs, epss = traj.seeds, traj.values, traj.lrs, traj.epss
        status, calls, grads = traj.status, traj.calls, traj.projected_grads
        for t in range(len(traj)):
            for g, lr, eps in zip(self.param_groups, lrs[t], epss[t]):
                g["lr"], g["eps"] = float(lr), float(eps)
            self._replay_seeds = [int(s) for s in seeds[t]]
            recorded = [float(v) for v in values[t][: calls[t]]]
            it = iter(recorded)

            def closure():
                try:
                    return next(it)
                except StopIteration:
                    raise _ReplayAbort() from None

            try:
                res = self.step(closure)
            except (_ReplayAbort, FloatingPointError):
                if status[t] != STATUS["aborted"]:
                    raise RuntimeError(f"replay diverged at step {t}: it aborted, the run did not") from None
                continue
            if status[t] == STATUS["applied"] and res.projected_grads != [float(x) for x in grads[t]]:
                raise RuntimeError(f"replay diverged at step {t}: projected gradients differ")
        self._replay_seeds = None

    # ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The torch optimizer state plus MeZO's own: counters, one-point memory and the trajectory."""
        sd = super().state_dict()
        sd["mezo"] = {"config": dict(self.config), "samples": self._samples, "updates": self._updates,
                      "prev_loss": self._prev_loss, "backend": self._backend,
                      "trajectory": self.trajectory.state_dict() if self._record else None}
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        sd = dict(state_dict)
        extra = sd.pop("mezo", None)
        if extra is None:
            raise ValueError("not a MeZO state dict: the 'mezo' entry is missing")
        if extra["config"] != self.config:
            diff = {k: (extra["config"].get(k), v) for k, v in self.config.items() if extra["config"].get(k) != v}
            raise ValueError(f"the state dict was saved by a MeZO with a different configuration (saved, here): {diff}")
        super().load_state_dict(sd)
        # torch casts floating state to the parameter's dtype; MeZO's buffers stay float32
        for idx, p, _ in self._flat():
            for k, v in sd["state"].get(idx, {}).items():
                if isinstance(v, torch.Tensor):
                    self.state[p][k] = v.detach().clone().to(p.device)
        self._samples, self._updates = extra["samples"], extra["updates"]
        self._prev_loss, self._backend = extra["prev_loss"], extra["backend"]
        if extra["trajectory"] is not None:
            self.trajectory = Trajectory.from_state_dict(extra["trajectory"])


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
    raise ValueError(f"unknown lr schedule {name!r}; choose 'constant' or 'linear'")
