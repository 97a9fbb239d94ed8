"""Member-batched evaluation: every member of a MeZO step in one batched pass, the weights untouched.

A MeZO step evaluates M *members*, each a noise seed and a sign (:func:`step_members`): for the
two-point estimator (+s0, -s0, +s1, -s1, ...), for ``"es"`` (+s0, ..., +s_{n-1}), for one-point (+s0).
The in-place mode perturbs the weights before each member's evaluation. The batched mode
(``MeZO(..., evaluation=BatchedMembers(model))``) leaves the weights alone and evaluates all members
in one pass instead: every batch the model sees holds M*b rows in member-major layout (rows
[k*b, (k+1)*b) belong to member k), and every module that holds a trainable tensor adds member k's
perturbation to its own output rows of that block. What each module does (:class:`MemberPlan`):

``nn.Linear`` (and transformers' ``Conv1D``) weights and ``nn.Embedding`` weights with low-rank noise
    Activation side. For W [m, n] the weight-side noise is ``z = B A^T / sqrt(r)`` (exactly the factors
    :meth:`mezo_rl.engine.noise.NoiseSpec.factors` draws for that tensor, seed and index), so member k
    computes ``x W^T + sign_k eps / sqrt(r) * (x A) B^T``: one batched matmul over all members' rows
    reads W once, and each member adds a rank-r correction (two small batched matmuls, added in place
    to the layer's output). An embedding adds the rows of z gathered by token id,
    ``B[id] A^T * sign_k eps / sqrt(r)``. A tied output head shares its factors with the embedding.
``nn.Linear`` / ``Conv1D`` weights with element-wise noise (gaussian, rademacher)
    A dense per-member delta ``sign_k eps z`` of the weight's shape (M copies of the tensor: meant for
    adapters such as LoRA's A and B; refused where the copies would be a sizeable part of the model).
Linear / Conv1D biases
    The per-member delta ``sign_k eps z`` [M, out] added to each member's rows.
Modules that take per-member tensors themselves (``accepts_member_params = True``, e.g. the prefix)
    Get ``module.member_params = {name: [M, *shape] perturbed copies}`` for the duration of the pass.
Any other module with trainable tensors (norm gains, ...)
    Runs once per member block, with that member's perturbed copies swapped in for its own tensors.

The factors and deltas are drawn once per step (when the pass starts) and reused by every forward of
the closure (every decoding step). Within the closure, ``BatchedMembers.paused()`` gives a block where the
model computes as it does outside the pass (its own forwards, the weights in place, rows not split into
members): a closure that needs another model's view of the members' outputs (the trainer's KL to the
starting model) reads it there. The update after the evaluations is the same update the
weight-side noise applies (:mod:`mezo_rl.engine.optim`), so trajectories and replay are unchanged; only
the perturbation sweeps are gone, which is why nothing drifts in bf16.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["Member", "MemberPlan", "BatchedMembers", "step_members"]


@dataclass(frozen=True)
class Member:
    """One member of a step: ``index`` in the step (0..M-1), the noise ``seed``, the ``sign`` (+1 / -1)
    of its perturbation, and ``sample``, the SPSA sample (or population member) it belongs to."""

    index: int
    seed: int
    sign: int
    sample: int


def step_members(seeds: list[int], estimator: str) -> list[Member]:
    """The members of a step with these noise seeds, in the engine's order."""
    if estimator == "two_point":
        return [Member(2 * j + h, s, sign, j) for j, s in enumerate(seeds) for h, sign in enumerate((1, -1))]
    if estimator == "one_point":
        return [Member(0, seeds[0], 1, 0)]
    return [Member(j, s, 1, j) for j, s in enumerate(seeds)]


class BatchedMembers:
    """The batched member evaluation, as a strategy the optimizer is given:
    ``MeZO(params, evaluation=BatchedMembers(model))``. ``model`` is the module the parameters belong to;
    the optimizer hands it its trainable tensors (:meth:`prepare`) and, each step, the members and a
    closure (:meth:`evaluate`). The strategy builds its :class:`MemberPlan` once and again only when
    the trainable tensors change before the first step."""

    def __init__(self, module: nn.Module):
        if not isinstance(module, nn.Module):
            raise TypeError(f"BatchedMembers takes the model the parameters belong to (an nn.Module), "
                            f"got {type(module).__name__}")
        self.module = module
        self.plan = None

    def prepare(self, entries, noise: str, members: int) -> "MemberPlan":
        """The plan for these trainable tensors (ValueError, one line, for a tensor it cannot perturb)."""
        if self.plan is None or set(self.plan.entries) != {id(p) for _, p, _ in entries} or self.plan.members != members:
            self.plan = MemberPlan(self.module, entries, noise, members)
        return self.plan

    def paused(self):
        """Within a step's batched evaluation (the closure), a block where the model computes unperturbed, on
        the weights in place: :meth:`MemberPlan.paused`."""
        if self.plan is None:
            raise RuntimeError("paused() is for use within a batched evaluation; no step has been evaluated")
        return self.plan.paused()

    def evaluate(self, closure, members: list[Member], spec, entries) -> list:
        """``closure(members)`` once, every forward of the module evaluating every member; its M values."""
        plan = self.prepare(entries, spec.kind, len(members))
        with plan.applied(spec, members, entries):
            out = closure(members)
        if isinstance(out, (str, bytes)) or not hasattr(out, "__len__"):
            raise ValueError(f"the batched closure must return {len(members)} values, one per member; "
                             f"got {type(out).__name__}")
        if len(out) != len(members):
            raise ValueError(f"the batched closure returned {len(out)} values for {len(members)} members; "
                             f"it must return one per member ({len(members)})")
        return list(out)


def _is_conv1d(module) -> bool:  # transformers.pytorch_utils.Conv1D: weight [in, out], x @ W + b
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and isinstance(getattr(module, "weight", None), torch.Tensor)


def _linear_like(module) -> bool:
    return (isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward) or _is_conv1d(module)


def _embedding_like(module) -> bool:
    if not isinstance(module, nn.Embedding) or module.max_norm is not None:
        return False
    return type(module).forward is nn.Embedding.forward or isinstance(getattr(module, "embed_scale", None), (torch.Tensor, float))


# At most this share of the model's parameters may be copied (M copies in all). It refuses what the
# batched mode must not do, copy a whole model per member (full fine-tuning with element-wise noise:
# use low-rank noise there); an adapter's or a norm's copies are a small fraction of the model.
COPY_BUDGET = 0.25


class MemberPlan:
    """How a module tree evaluates a step's members in one batched pass (see the module docstring).

    ``entries`` are the optimizer's trainable tensors ``(index, tensor, group)``; ``noise`` is the
    noise kind (``"lowrank"``, ``"gaussian"``, ``"rademacher"``); ``members`` the count M per step.
    Raises ValueError (one line) for a tensor the batched mode cannot perturb.
    """

    def __init__(self, module: nn.Module, entries, noise: str, members: int):
        self.module, self.members = module, members
        self._rows = None
        self._live = None  # within applied(): (the step's drawn tensors, what _install patched)
        by_id = {id(p): (idx, p, group) for idx, p, group in entries}
        owners: dict[int, list[tuple[str, nn.Module, str]]] = {}
        for mod_name, mod in module.named_modules():
            for pname, p in mod._parameters.items():
                if p is not None and id(p) in by_id:
                    owners.setdefault(id(p), []).append((mod_name, mod, pname))
        missing = [idx for idx, p, _ in entries if id(p) not in owners]
        if missing:
            raise ValueError(f"evaluation='batched': trainable tensor {missing[0]} of the optimizer is not a parameter "
                             "of the module given; pass the model the parameters belong to (BatchedMembers(model))")
        # roles[module] = {its parameter name: kind}; kinds: lowrank, dense, bias, member, generic
        self.roles: dict[nn.Module, dict[str, str]] = {}
        self.names: dict[nn.Module, str] = {}
        for pid, own in owners.items():
            idx, p, _ = by_id[pid]
            known = [o for o in own if _linear_like(o[1]) or _embedding_like(o[1])
                     or getattr(o[1], "accepts_member_params", False)]
            if not known and len(own) > 1:
                raise ValueError(f"evaluation='batched': {own[0][0]}.{own[0][2]} is shared by several modules "
                                 f"({', '.join(o[0] for o in own)}); use evaluation='inplace'")
            for mod_name, mod, pname in known or own:  # a module that merely holds a tied tensor is left alone
                self.roles.setdefault(mod, {})[pname] = self._kind(mod_name, mod, pname, noise)
                self.names[mod] = mod_name or type(mod).__name__
        for mod, roles in self.roles.items():
            if "generic" in roles.values():
                inner = [n for n, child in mod.named_modules() if child is not mod and child in self.roles]
                if inner:
                    raise ValueError(f"evaluation='batched': {self.names[mod]} ({type(mod).__name__}) holds trainable "
                                     f"tensors and contains trainable modules ({inner[0]}); use evaluation='inplace'")
        self.entries = {id(p): (idx, p, group) for idx, p, group in entries}
        self.kinds = {pid: {roles[name] for mod, roles in self.roles.items() for name in roles
                            if mod._parameters[name] is p} for pid, (_, p, _) in self.entries.items()}
        copied = sum(p.numel() for pid, (_, p, _) in self.entries.items()
                     if p.dim() >= 2 and self.kinds[pid] & {"dense", "member", "generic"})
        total = sum(p.numel() for p in module.parameters())
        if members * copied > COPY_BUDGET * total:
            raise ValueError(f"evaluation='batched' with noise={noise!r} would keep {members} perturbed copies of "
                             f"{copied:,} weights ({members * copied / total:.0%} of the model): use noise='lowrank' "
                             "(activation-side, no copies) or evaluation='inplace'")

    @staticmethod
    def _kind(mod_name, mod, pname, noise) -> str:
        where = f"{mod_name or 'the model'}.{pname}"
        if getattr(mod, "accepts_member_params", False):
            return "member"
        if _linear_like(mod) and pname == "weight":
            return "lowrank" if noise == "lowrank" else "dense"
        if _linear_like(mod) and pname == "bias":
            return "bias"
        if _embedding_like(mod) and pname == "weight":
            if noise != "lowrank":
                raise ValueError(f"evaluation='batched' perturbs embeddings ({where}) activation-side, which needs "
                                 f"noise='lowrank' (got {noise!r}); or use evaluation='inplace'")
            return "lowrank"
        return "generic"

    # ------------------------------------------------------------------------------------------
    @contextmanager
    def applied(self, spec, members: list[Member], entries):
        """Within the block, every forward of the module evaluates ``members`` (member-major rows).

        ``spec``: the optimizer's :class:`mezo_rl.engine.noise.NoiseSpec`; ``entries``: its trainable tensors
        ``(index, tensor, group)`` now, each perturbed with its group's ``eps``.
        """
        if len(members) != self.members:
            raise ValueError(f"the plan was built for {self.members} members, got {len(members)}")
        tensors = self._draw(spec, members, entries)
        self._rows = None  # rows of the last member-batched input seen (for broadcast embedding lookups)
        self._live = (tensors, self._install(tensors))
        try:
            yield
        finally:
            self._uninstall(self._live[1])
            self._live = None

    @contextmanager
    def paused(self):
        """Within :meth:`applied`'s block, a block where the module computes as it does outside it: its own
        forwards on the weights in place, rows not split into members (e.g. to read another model's logits
        on the members' completions); the members' perturbations are back when the block ends."""
        if self._live is None:
            raise RuntimeError("paused() is for use within a batched evaluation (MemberPlan.applied)")
        tensors, installed = self._live
        self._uninstall(installed)
        try:
            yield
        finally:
            self._live = (tensors, self._install(tensors))

    def _install(self, tensors) -> tuple[list, list]:
        """Patch every module with trainable tensors to evaluate the members: (patched, taking)."""
        patched, taking = [], []  # (module, its own instance-level forward or None); modules given member_params
        try:
            for mod, roles in self.roles.items():
                kinds = set(roles.values())
                if kinds == {"member"}:
                    mod.member_params = {name: tensors[id(getattr(mod, name))]["copies"] for name in roles}
                    taking.append(mod)
                    continue
                if kinds & {"generic", "member"}:
                    fwd = self._generic_forward(mod, roles, tensors)
                elif _embedding_like(mod):
                    fwd = self._embedding_forward(mod, tensors[id(mod.weight)])
                else:
                    fwd = self._linear_forward(mod, roles, tensors)
                patched.append((mod, mod.__dict__.get("forward")))
                mod.forward = fwd
        except BaseException:
            self._uninstall((patched, taking))
            raise
        return patched, taking

    @staticmethod
    def _uninstall(installed) -> None:
        patched, taking = installed
        for mod in taking:
            mod.member_params = None
        for mod, previous in reversed(patched):
            if previous is None:
                del mod.forward
            else:
                mod.forward = previous

    def _draw(self, spec, members, entries) -> dict[int, dict]:
        """Per trainable tensor, this step's per-member factors (low-rank) or perturbations (others)."""
        seeds = sorted({m.seed for m in members})
        out = {}
        for idx, p, group in entries:
            kinds, entry = self.kinds[id(p)], {}
            coef = torch.tensor([m.sign * group["eps"] for m in members], dtype=torch.float32, device=p.device)
            if "lowrank" in kinds:
                drawn = {s: spec.factors(p, s, idx) for s in seeds}
                scale = (coef / math.sqrt(spec.rank))[:, None, None]
                entry["b"] = torch.stack([drawn[m.seed][0] for m in members]).to(p.dtype)         # [M, m, r]
                entry["a"] = (torch.stack([drawn[m.seed][1] for m in members]) * scale).to(p.dtype)  # [M, n, r]
            if kinds - {"lowrank"}:
                drawn = {s: spec.sample(p, s, idx) for s in seeds}
                delta = torch.stack([drawn[m.seed] for m in members]) * coef.view(-1, *([1] * p.dim()))
                entry["delta"] = delta.to(p.dtype)                                                # [M, *shape]
                if kinds & {"member", "generic"}:
                    entry["copies"] = p.detach().unsqueeze(0) + entry["delta"]
            out[id(p)] = entry
        return out

    def _blocks(self, mod, n: int) -> int:
        """Rows per member block of a batch of ``n`` rows."""
        if n % self.members:
            raise ValueError(f"evaluation='batched': {self.names[mod]} got {n} rows for {self.members} members; every "
                             f"forward pass of a batched closure must hold {self.members} equal blocks of rows in "
                             "member-major layout (LanguageModel.score / generate(..., members=M) build them)")
        self._rows = n
        return n // self.members

    def _linear_forward(self, mod, roles, tensors):
        orig, M, conv = mod.forward, self.members, _is_conv1d(mod)
        w = tensors.get(id(mod.weight)) if "weight" in roles else None
        bias = tensors[id(mod.bias)]["delta"] if "bias" in roles else None
        kind = roles.get("weight")
        cast = {}

        def as_(t, dtype, key):
            if t.dtype == dtype:
                return t
            if key not in cast:
                cast[key] = t.to(dtype)
            return cast[key]

        def forward(x, *args, **kwargs):
            out = orig(x, *args, **kwargs)
            self._blocks(mod, x.shape[0])
            out3 = out.reshape(M, -1, out.shape[-1])
            x3 = x.reshape(M, -1, x.shape[-1]).to(out.device, out.dtype)
            if kind == "lowrank":
                # Linear: W [out, in] = B A^T: x W^T gains (x A) B^T. Conv1D: W [in, out]: x W gains (x B) A^T.
                left, right = (w["b"], w["a"]) if conv else (w["a"], w["b"])
                _add_product_(out3, _per_member_mm(x3, as_(left, out.dtype, "left")), as_(right, out.dtype, "right"))
            elif kind == "dense":
                d = as_(w["delta"], out.dtype, "dense")
                out3.baddbmm_(x3, d if conv else d.transpose(1, 2))
            if bias is not None:
                out3.add_(as_(bias, out.dtype, "bias")[:, None, :])
            return out3.view(out.shape)

        return forward

    def _embedding_forward(self, mod, w):
        orig, M = mod.forward, self.members
        scale = getattr(mod, "embed_scale", None) if type(mod).forward is not nn.Embedding.forward else None

        def forward(ids, *args, **kwargs):
            out = orig(ids, *args, **kwargs)
            if ids.shape[0] == 1 and M > 1 and self._rows is not None:
                # one row of ids for the whole batch (learned positions, [1, T]): give every row its member's
                ids = ids.expand(self._rows, *ids.shape[1:])
                out = out.expand(self._rows, *out.shape[1:]).contiguous()
            self._blocks(mod, ids.shape[0])
            out3 = out.reshape(M, -1, out.shape[-1])
            b, a = w["b"].to(out.dtype), w["a"].to(out.dtype)  # z[id] = B[id] A^T
            rows = torch.gather(b, 1, ids.reshape(M, -1, 1).expand(-1, -1, b.shape[-1]).to(b.device))
            if scale is not None:
                rows = rows * scale.to(out.dtype) if isinstance(scale, torch.Tensor) else rows * scale
            _add_product_(out3, rows, a)
            return out3.view(out.shape)

        return forward

    def _generic_forward(self, mod, roles, tensors):
        orig, M = mod.forward, self.members
        copies = {name: tensors[id(getattr(mod, name))]["copies"] for name in roles}
        # An RMSNorm scales its normalised input by its gain, element-wise along the last dimension: it
        # runs once on a [M, rows/M, ..., H] view with gains of shape [M, 1, ..., 1, H], which broadcast
        # to every row of their member (instead of one call per member).
        rowwise = type(mod).__name__.endswith("RMSNorm") and all(c.dim() == 2 for c in copies.values())

        def forward(*args, **kwargs):
            first = next((t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)), None)
            if first is None:
                raise ValueError(f"evaluation='batched': {self.names[mod]} was called without a tensor argument")
            n = first.shape[0]
            b = self._blocks(mod, n)
            if rowwise and len(args) == 1 and not kwargs and first.shape[-1] == next(iter(copies.values())).shape[-1]:
                saved = {name: mod._parameters[name] for name in copies}
                try:
                    for name, c in copies.items():
                        mod._parameters[name] = c.view(M, *([1] * (first.dim() - 1)), c.shape[-1])
                    return orig(first.reshape(M, b, *first.shape[1:])).reshape(first.shape)
                finally:
                    mod._parameters.update(saved)
            cut = lambda t, k: t[k * b:(k + 1) * b] if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == n else t
            outs = []
            for k in range(M):
                saved = {name: mod._parameters[name] for name in copies}
                try:
                    for name, c in copies.items():
                        mod._parameters[name] = c[k]
                    outs.append(orig(*(cut(t, k) for t in args), **{key: cut(t, k) for key, t in kwargs.items()}))
                finally:
                    mod._parameters.update(saved)
            return _cat(outs, self.names[mod])

        return forward


def _per_member_mm(x3, left):
    """[x3[k] @ left[k] for each member k]: [M, N, r]. A matrix product per member: on CPUs torch.bmm with
    r = 1 columns is several times slower than M plain products (a GEMV each)."""
    return torch.stack([torch.mm(x3[k], left[k]) for k in range(x3.shape[0])])


def _add_product_(out3, xa, right) -> None:
    """``out3 += xa @ right^T`` in place, per member: out3 [M, N, out], xa [M, N, r], right [M, out, r].
    Rank 1 (the default) is an outer product: one broadcast multiply-add, cheaper than a batched matmul."""
    if xa.shape[-1] == 1:
        out3.addcmul_(xa, right.transpose(1, 2))
    else:
        out3.baddbmm_(xa, right.transpose(1, 2))


def _cat(outs, name):
    first = outs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(outs)
    if isinstance(first, (tuple, list)):
        return type(first)(_cat(list(parts), name) for parts in zip(*outs))
    if first is None:
        return None
    raise ValueError(f"evaluation='batched': cannot join the per-member outputs of {name} ({type(first).__name__})")
