"""Member-batched evaluation: every member of a MeZO step in one batched pass, the weights untouched.

A MeZO step evaluates M *members*, each a noise seed and a sign (:func:`step_members`): for the
two-point estimator (+s0, -s0, +s1, -s1, ...), for ``"es"`` (+s0, ..., +s_{n-1}), for one-point (+s0).
The in-place mode perturbs the weights before each member's evaluation. The batched mode
(``MeZO(..., member_evaluation=BatchedMembers(model))``) leaves the weights alone and evaluates all members
in one pass instead: every batch the model sees holds M*b rows in member-major layout (rows
[k*b, (k+1)*b) belong to member k), and every module that holds a trainable tensor adds member k's
perturbation to its own output rows of that block. What each module does (:class:`MemberPlan`):

Every module adds all M members' perturbations in a number of dispatched ops that does not depend on M
(no per-member Python loop): on a GPU every op is a kernel launch, and a population step of small
models is bound by launches, not arithmetic (docs/engine.md, "How members are batched").

``nn.Linear`` (and transformers' ``Conv1D``) weights and ``nn.Embedding`` weights with low-rank noise
    Activation side. For W [m, n] the weight-side noise is ``z = B A^T / sqrt(r)`` (exactly the factors
    :meth:`mezo_rl.engine.noise.NoiseSpec.factors` draws for that tensor, seed and index), so member k
    computes ``x W^T + sign_k eps / sqrt(r) * (x A) B^T``: one matrix product over all members' rows
    reads W once (``x W^T`` and the layer's own bias), and each member's rank-r correction is added in
    place by two batched operators over the member axis (``x A`` [M, N, r], then times ``B^T``); a
    perturbed bias adds each member's delta. The first product's form is chosen per device
    (:data:`PRODUCT_FORMS`). Layers reading the same input (q/k/v, gate/up) share its member and row
    views. An embedding adds the rows of z gathered by token id, ``B[id] A^T * sign_k eps / sqrt(r)``,
    for all members in one gather and one product. A tied output head shares its factors with the
    embedding.
``nn.Linear`` / ``Conv1D`` weights with element-wise noise (gaussian, rademacher)
    Each member's own weight ``W + sign_k eps z`` (M copies of the tensor: meant for adapters such as
    LoRA's A and B; refused where the copies would be a sizeable part of the model), one batched product.
Linear / Conv1D biases
    Each member's delta ``sign_k eps z`` [M, 1, out], added to its rows in one broadcast operator.
Modules that take per-member tensors themselves (``accepts_member_params = True``, e.g. the prefix)
    Get ``module.member_params = {name: [M, *shape] perturbed copies}`` for the duration of the pass.
Any other module with trainable tensors (norm gains, ...)
    RMSNorm-like and ``nn.LayerNorm`` modules run once, each row given its member's gain (and bias) as a
    broadcast [rows, 1, ..., H] tensor built once per pass and batch shape. Any other module runs once
    under ``torch.func.vmap`` over the members, its tensors swapped for their per-member copies; a module
    whose ops vmap cannot batch runs once per member block instead.

Each module is set up the same way for every kind: an attribute assigned for the pass (its ``forward``, or
``member_params``) and put back when the pass ends or raises. Not forward hooks: a hook cannot replace a layer's
own call, which dispatches more operators than the members' product (its weight transposed once per pass).

The factors and deltas are drawn once per step (when the pass starts) and reused by every forward of
the closure (every decoding step). Within the closure, ``members.paused()`` (:class:`Members`) gives a block where
the model computes as it does outside the pass (its own forwards, the weights in place, rows not split into
members): a closure that needs another model's view of the members' outputs (the trainer's KL to the
starting model) reads it there. The update after the evaluations is the same update the
weight-side noise applies (:mod:`mezo_rl.engine.optim`), so trajectories and replay are unchanged; only
the perturbation sweeps are gone, which is why nothing drifts in bf16.
"""
from __future__ import annotations

import inspect
import math
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["Member", "Members", "MemberPlan", "BatchedMembers", "step_members", "takes_members", "member_values",
           "PRODUCT_FORMS", "product_form"]


@dataclass(frozen=True)
class Member:
    """One member of a step: ``index`` in the step (0..M-1), the noise ``seed``, the ``sign`` (+1 / -1; 0: the
    unperturbed weights) of its perturbation, and ``sample``, the SPSA sample (or population member) it belongs to."""

    index: int
    seed: int
    sign: int
    sample: int


def step_members(seeds: list[int], estimator: str, center: bool = False) -> list[Member]:
    """The members of a step with these noise seeds, in the engine's order; with ``center`` (HiZOO's curvature,
    two-point only) one more at the end, the unperturbed weights (sign 0, a sample of its own)."""
    if estimator == "two_point":
        pairs = [Member(2 * j + h, s, sign, j) for j, s in enumerate(seeds) for h, sign in enumerate((1, -1))]
        return pairs + [Member(len(pairs), seeds[0], 0, len(seeds))] if center else pairs
    if estimator == "one_point":
        return [Member(0, seeds[0], 1, 0)]
    return [Member(j, s, 1, j) for j, s in enumerate(seeds)]


class Members(tuple):
    """What a closure is given: the members it evaluates, a tuple of :class:`Member` in the step's order, and how.

    ``batched`` True: the closure evaluates every member of the step at once, the weights untouched; every forward
    of the model within it holds ``len(members)`` equal blocks of rows, member-major, and member k's perturbation
    applies to block k. False: it evaluates one member, ``members[0]``, whose perturbation is in the weights in
    place (a forward with one block of rows is the plain forward). Either way the closure returns one value per
    member, in order. :meth:`paused` gives a block where the model computes plainly on the weights in place, its
    rows not split into members: batched, the members' perturbations are lifted for its duration (to read another
    model's view of the members' outputs); in place the block changes nothing."""

    def __new__(cls, members, batched: bool = False, paused=None):
        self = super().__new__(cls, members)
        self.batched, self._paused = batched, paused
        return self

    def paused(self):
        """A context: within it the model's forwards are its own, on the weights in place (see the class)."""
        return nullcontext() if self._paused is None else self._paused()


def takes_members(closure) -> bool:
    """Whether ``closure`` is called with the members it evaluates, ``closure(members)``: it has a positional
    parameter without a default. A closure that can be called with no argument is torch.optim's ``closure()``,
    called once per member in place and returning that member's value."""
    try:
        params = inspect.signature(closure).parameters.values()
    except (TypeError, ValueError):  # a callable whose signature Python cannot read: torch.optim's contract
        return False
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty for p in params)


def member_values(out, members: int, closure: str = "the closure") -> list:
    """What ``closure`` returned for ``members`` members, as a list of one value (or object) per member; anything
    without one per member is refused in one line."""
    scalar = isinstance(out, torch.Tensor) and out.dim() == 0
    if isinstance(out, (str, bytes)) or not hasattr(out, "__len__") or scalar:
        raise ValueError(f"{closure} must return {members} value{'s' * (members != 1)}, one per member; "
                         f"got {type(out).__name__}")
    if len(out) != members:
        raise ValueError(f"{closure} returned {len(out)} values for {members} member{'s' * (members != 1)}; "
                         f"it must return one per member ({members})")
    return list(out)


class BatchedMembers:
    """The batched member evaluation, as a strategy the optimizer is given:
    ``MeZO(params, member_evaluation=BatchedMembers(model))``. ``model`` is the module the parameters belong to;
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
        """``closure(members)`` once (:class:`Members`, ``batched``), every forward of the module evaluating every
        member; its M values."""
        plan = self.prepare(entries, spec.kind, len(members))
        with plan.applied(spec, members, entries):
            out = closure(Members(members, batched=True, paused=plan.paused))
        return member_values(out, len(members), "the batched closure")


def _assign(mod: nn.Module, name: str, value):
    """Set ``mod.name`` to ``value`` for a pass; returns what puts the module's own back (its instance attribute,
    or none: the class's)."""
    had, previous = name in mod.__dict__, mod.__dict__.get(name)
    mod.__dict__[name] = value

    def put_back():
        if had:
            mod.__dict__[name] = previous
        else:
            mod.__dict__.pop(name, None)
    return put_back


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
        self._input = None  # the last linear input seen and its member / row views (MemberPlan._views)
        self._vmappable: dict[nn.Module, bool] = {}  # generic modules torch.func.vmap could not batch
        by_id = {id(p): (idx, p, group) for idx, p, group in entries}
        owners: dict[int, list[tuple[str, nn.Module, str]]] = {}
        for mod_name, mod in module.named_modules():
            for pname, p in mod._parameters.items():
                if p is not None and id(p) in by_id:
                    owners.setdefault(id(p), []).append((mod_name, mod, pname))
        missing = [idx for idx, p, _ in entries if id(p) not in owners]
        if missing:
            raise ValueError(f"member_evaluation='batched': trainable tensor {missing[0]} of the optimizer is not a parameter "
                             "of the module given; pass the model the parameters belong to (BatchedMembers(model))")
        # roles[module] = {its parameter name: kind}; kinds: lowrank, dense, bias, member, generic
        self.roles: dict[nn.Module, dict[str, str]] = {}
        self.names: dict[nn.Module, str] = {}
        for pid, own in owners.items():
            idx, p, _ = by_id[pid]
            known = [o for o in own if _linear_like(o[1]) or _embedding_like(o[1])
                     or getattr(o[1], "accepts_member_params", False)]
            if not known and len(own) > 1:
                raise ValueError(f"member_evaluation='batched': {own[0][0]}.{own[0][2]} is shared by several modules "
                                 f"({', '.join(o[0] for o in own)}); use member_evaluation='inplace'")
            for mod_name, mod, pname in known or own:  # a module that merely holds a tied tensor is left alone
                self.roles.setdefault(mod, {})[pname] = self._kind(mod_name, mod, pname, noise)
                self.names[mod] = mod_name or type(mod).__name__
        for mod, roles in self.roles.items():
            if "generic" in roles.values():
                inner = [n for n, child in mod.named_modules() if child is not mod and child in self.roles]
                if inner:
                    raise ValueError(f"member_evaluation='batched': {self.names[mod]} ({type(mod).__name__}) holds trainable "
                                     f"tensors and contains trainable modules ({inner[0]}); use member_evaluation='inplace'")
        self.entries = {id(p): (idx, p, group) for idx, p, group in entries}
        self.kinds = {pid: {roles[name] for mod, roles in self.roles.items() for name in roles
                            if mod._parameters[name] is p} for pid, (_, p, _) in self.entries.items()}
        copied = sum(p.numel() for pid, (_, p, _) in self.entries.items()
                     if p.dim() >= 2 and self.kinds[pid] & {"dense", "member", "generic"})
        total = sum(p.numel() for p in module.parameters())
        if members * copied > COPY_BUDGET * total:
            raise ValueError(f"member_evaluation='batched' with noise={noise!r} would keep {members} perturbed copies of "
                             f"{copied:,} weights ({members * copied / total:.0%} of the model): use noise='lowrank' "
                             "(activation-side, no copies) or member_evaluation='inplace'")

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
                raise ValueError(f"member_evaluation='batched' perturbs embeddings ({where}) activation-side, which needs "
                                 f"noise='lowrank' (got {noise!r}); or use member_evaluation='inplace'")
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

    def _install(self, tensors) -> list:
        """Make every module with trainable tensors evaluate the members, one way for every kind: an attribute of
        the module assigned for the pass (``forward``: the kind's member forward; ``member_params``: for a module
        that takes per-member tensors itself). Returns the undo of each assignment, in order."""
        undo = []
        try:
            for mod, roles in self.roles.items():
                kinds = set(roles.values())
                if kinds == {"member"}:
                    copies = {name: tensors[id(getattr(mod, name))]["copies"] for name in roles}
                    undo.append(_assign(mod, "member_params", copies))
                    continue
                if kinds & {"generic", "member"}:
                    fwd = self._generic_forward(mod, roles, tensors)
                elif _embedding_like(mod):
                    fwd = self._embedding_forward(mod, tensors[id(mod.weight)])
                else:
                    fwd = self._linear_forward(mod, roles, tensors)
                undo.append(_assign(mod, "forward", fwd))
        except BaseException:
            self._uninstall(undo)
            raise
        return undo

    def _uninstall(self, undo) -> None:
        self._input = None
        for put_back in reversed(undo):
            put_back()

    def _draw(self, spec, members, entries) -> dict[int, dict]:
        """Per trainable tensor, this step's per-member factors (low-rank) or perturbations (others).

        Low-rank noise: every member's draws stacked once per device (:meth:`NoiseSpec.stacked`), A scaled by
        each member's ``sign * eps / sqrt(r)`` and both cast once per group and dtype; each tensor then takes
        views of them, so the ops do not grow with the number of members or of tensors. Element-wise noise:
        each member's sample, tensor by tensor."""
        seeds = sorted({m.seed for m in members})
        lowrank = spec.kind == "lowrank"
        # made once a step: each member's sign * eps per (eps, device); the stacked low-rank draws per device;
        # B and the scaled A in each (eps, device, dtype)
        coefs, stacks, factors, out = {}, {}, {}, {}
        for idx, p, group in entries:
            kinds, entry = self.kinds[id(p)], {}
            eps, dev, dtype = group["eps"], p.device, p.dtype
            if (eps, dev) not in coefs:
                coefs[(eps, dev)] = torch.tensor([m.sign * eps for m in members], dtype=torch.float32, device=dev)
            coef = coefs[(eps, dev)]
            if lowrank and dev not in stacks:
                stacks[dev] = spec.stacked([m.seed for m in members], dev)
            if "lowrank" in kinds:
                key = (eps, dev, dtype)
                if key not in factors:  # every member's A scaled by its sign * eps / sqrt(r), and B, in the dtype
                    stacked = stacks[dev]
                    factors[key] = (stacked.b.to(dtype), (stacked.a * (coef / math.sqrt(spec.rank))[:, None]).to(dtype))
                b_all, a_all = factors[key]
                entry["b"], entry["a"] = stacks[dev].factors(p, idx, b=b_all, a=a_all)  # [M, m, r], [M, n, r] views
            if kinds - {"lowrank"}:
                if lowrank:
                    z = stacks[dev].vector(p, idx)
                else:
                    drawn = {s: spec.sample(p, s, idx) for s in seeds}
                    z = torch.stack([drawn[m.seed] for m in members])
                delta = (z * coef.view(-1, *([1] * p.dim()))).to(dtype)
                if "bias" in kinds:
                    entry["delta"] = delta                                  # each member's perturbation [M, *shape]
                entry["copies"] = p.detach().unsqueeze(0) + delta          # each member's tensor [M, *shape]
            out[id(p)] = entry
        return out

    def _blocks(self, mod, n: int) -> int:
        """Rows per member block of a batch of ``n`` rows."""
        if n % self.members:
            raise ValueError(f"member_evaluation='batched': {self.names[mod]} got {n} rows for {self.members} members; every "
                             f"forward pass of a batched closure must hold {self.members} equal blocks of rows in "
                             "member-major layout (LanguageModel.score / generate(..., members=M) build them)")
        self._rows = n
        return n // self.members

    def _views(self, x, transposed: bool):
        """``(xm, x2)``: a linear layer's input by member (``x3`` [M, N, in], or its transpose [M, in, N] for
        the transposed product form) and by row (``x2`` [M*N, in]); shared by the layers that read the same
        tensor (q/k/v, gate/up) until it changes."""
        last = self._input
        if last is not None and last[0] is x and last[1] == x._version and last[2] == transposed:
            return last[3], last[4]
        M, n_in = self.members, x.shape[-1]
        if transposed and x.is_contiguous():
            xm = x.as_strided((M, n_in, x.numel() // (M * n_in)), (x.numel() // M, 1, n_in))
        else:
            xm = x.reshape(M, -1, n_in)
            xm = xm.transpose(1, 2) if transposed else xm
        x2 = x if x.dim() == 2 else x.reshape(-1, n_in)
        self._input = (x, x._version, transposed, xm, x2)
        return xm, x2

    def _linear_forward(self, mod, roles, tensors):
        """Every member's rows of a Linear / Conv1D in a fixed number of ops, whatever M (module docstring)."""
        M, conv, W = self.members, _is_conv1d(mod), mod.weight
        kind = roles.get("weight")
        n_out = W.shape[1] if conv else W.shape[0]
        wt = W if conv else W.t()  # [in, out], a view made once per pass
        bias = mod.bias  # the layer's own bias, added within the weight's product
        delta3 = tensors[id(bias)]["delta"][:, None, :] if "bias" in roles else None  # each member's [M, 1, out]
        transposed = False
        if kind == "lowrank":
            w = tensors[id(W)]
            left, right = (w["b"], w["a"]) if conv else (w["a"], w["b"])  # W^T = left right^T / x W^T gains (x left) right^T
            right_t = right.transpose(1, 2).contiguous()                    # [M, r, out]
            transposed = product_form(W.device) == "transposed"
            left = (left.transpose(1, 2) if transposed else left).contiguous()  # [M, r, in] or [M, in, r]
            rank1 = right_t.shape[1] == 1
            cast = {right_t.dtype: right_t}
        elif kind == "dense":
            copies = tensors[id(W)]["copies"]                               # each member's weight
            per_member = copies if conv else copies.transpose(1, 2)         # [M, in, out]
            dense_bias = None if bias is None else (bias.view(1, 1, -1) if delta3 is None else bias + delta3)

        def forward(x, *args, **kwargs):
            if args or kwargs:
                raise ValueError(f"member_evaluation='batched': {self.names[mod]} was called with more than its input")
            self._blocks(mod, x.shape[0])
            xm, x2 = self._views(x, transposed)
            shape = (*x.shape[:-1], n_out)
            if kind == "dense":  # each member's own (small) weight: one batched product
                out3 = torch.bmm(xm, per_member) if dense_bias is None else torch.baddbmm(dense_bias, xm, per_member)
                return out3.view(shape)
            # the weight's product over all members' rows at once (W read once, as plain inference reads it) ...
            out2 = _main(x2, W, wt, bias, conv, torch.is_autocast_enabled(x.device.type))
            out3 = out2.view(M, -1, n_out)
            if kind == "lowrank":  # ... plus each member's rank-r correction (x left) right^T, in place
                xa = _member_product(xm, left, transposed, rank1)
                if rank1:
                    out3.addcmul_(xa, right_t)
                else:
                    if out3.dtype not in cast:
                        cast[out3.dtype] = right_t.to(out3.dtype)
                    out3.baddbmm_(xa.to(out3.dtype), cast[out3.dtype])
            if delta3 is not None:
                out3.add_(delta3)
            return out2 if x.dim() == 2 else out2.view(shape)

        return forward

    def _embedding_forward(self, mod, w):
        orig, M = mod.forward, self.members
        scale = getattr(mod, "embed_scale", None) if type(mod).forward is not nn.Embedding.forward else None
        b, a_t = w["b"], w["a"].transpose(1, 2)  # z[id] = B[id] A^T: rows of B [M, V, r], A^T [M, r, H]
        if scale is not None:
            a_t = a_t * scale.to(a_t.dtype) if isinstance(scale, torch.Tensor) else a_t * scale
        a_t = a_t.contiguous()
        r = b.shape[-1]

        def forward(ids, *args, **kwargs):
            out = orig(ids, *args, **kwargs)
            if ids.shape[0] == 1 and M > 1 and self._rows is not None:
                # one row of ids for the whole batch (learned positions, [1, T]): give every row its member's
                ids = ids.expand(self._rows, *ids.shape[1:])
                out = out.expand(self._rows, *out.shape[1:]).contiguous()
            self._blocks(mod, ids.shape[0])
            out3 = out.view(M, -1, out.shape[-1])
            rows = torch.gather(b, 1, ids.reshape(M, -1, 1).expand(-1, -1, r))  # [M, N, r]
            rows, right = rows.to(out.dtype), a_t.to(out.dtype)
            out3.addcmul_(rows, right) if r == 1 else out3.baddbmm_(rows, right)
            return out

        return forward

    def _generic_forward(self, mod, roles, tensors):
        """A module holding other trainable tensors (norm gains, ...), every member in one pass."""
        orig, M = mod.forward, self.members
        copies = {name: tensors[id(getattr(mod, name))]["copies"] for name in roles}
        # Norms scale (and shift) each row's normalised input by a gain along the last dimension: given each
        # row its own member's gain ([rows, 1, ..., H], built once per pass and batch shape), the module
        # runs once as it always does. Any other module runs once under torch.func.vmap over the members.
        per_row: dict = {}
        last = {name: c.shape[-1] for name, c in copies.items()}
        if type(mod).__name__.endswith("RMSNorm") and all(c.dim() == 2 for c in copies.values()):
            how = "rmsnorm"
        elif (isinstance(mod, nn.LayerNorm) and type(mod).forward is nn.LayerNorm.forward
              and len(mod.normalized_shape) == 1):
            how = "layernorm"
        else:
            how = "vmap"

        def rows_of(name, value, n, ndim):
            key = (name, n, ndim)
            if key not in per_row:
                v = value if value.dim() == 2 else value.expand(M, -1)
                per_row[key] = v.repeat_interleave(n // M, 0).view(n, *([1] * (ndim - 2)), v.shape[-1])
            return per_row[key]

        def forward(*args, **kwargs):
            first = next((t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)), None)
            if first is None:
                raise ValueError(f"member_evaluation='batched': {self.names[mod]} was called without a tensor argument")
            n = first.shape[0]
            b = self._blocks(mod, n)
            simple = len(args) == 1 and not kwargs and first.dim() >= 2
            if how == "rmsnorm" and simple and all(first.shape[-1] == h for h in last.values()):
                saved = {name: mod._parameters[name] for name in copies}
                try:
                    for name, c in copies.items():
                        mod._parameters[name] = rows_of(name, c, n, first.dim())
                    return orig(first)
                finally:
                    mod._parameters.update(saved)
            if how == "layernorm" and simple and first.shape[-1] == mod.normalized_shape[0]:
                y = torch.nn.functional.layer_norm(first, mod.normalized_shape, None, None, mod.eps)
                weight = None if mod.weight is None else rows_of("weight", copies.get("weight", mod.weight), n, first.dim())
                bias = None if mod.bias is None else rows_of("bias", copies.get("bias", mod.bias), n, first.dim())
                if weight is None:
                    return y if bias is None else y + bias
                return y * weight if bias is None else torch.addcmul(bias, y, weight)
            if how == "vmap" and not kwargs and self._vmappable.get(mod, True):
                try:
                    return _vmapped(mod, orig, copies, args, M, b)
                except (RuntimeError, NotImplementedError, ValueError):
                    self._vmappable[mod] = False  # an op vmap cannot batch: one call per member, below
            return _per_member(mod, orig, copies, args, kwargs, M, b, self.names[mod])

        return forward


#: the form of the members' rank-r product ``x left`` per device type (benchmarks/README.md, "The engine at
#: device speed"): ``"direct"``, one batched product ``bmm(x, left)`` [M, N, in] x [M, in, r]; ``"transposed"``,
#: ``bmm(left^T, x^T)`` [M, r, in] x [M, in, N], the same numbers through a BLAS layout that CPUs run several
#: times faster for one column (one more view op).
PRODUCT_FORMS = {"cpu": "transposed"}


def product_form(device) -> str:
    """``"direct"`` or ``"transposed"``: the form of the members' rank-r product on ``device`` (:data:`PRODUCT_FORMS`)."""
    return PRODUCT_FORMS.get(torch.device(device).type, "direct")


def _member_product(xm, left, transposed: bool, rank1: bool):
    """``x3[k] @ left[k]`` for every member k, [M, N, r]: from ``xm = x3`` [M, N, in] and ``left`` [M, in, r], or
    (transposed) from ``xm = x3^T`` [M, in, N] and ``left^T`` [M, r, in]."""
    if not transposed:
        return torch.bmm(xm, left)
    xa_t = torch.bmm(left, xm)  # [M, r, N]
    return xa_t.view(xm.shape[0], -1, 1) if rank1 else xa_t.transpose(1, 2)


def _main(x2, W, wt, bias, conv: bool, autocast: bool):
    """``x2 W^T + bias`` over all rows (Conv1D: ``x2 W + bias``). Under autocast through ``F.linear``, whose cast
    of the weight autocast caches; otherwise one ``mm`` / ``addmm`` on the transposed view made once per pass."""
    if autocast and not conv:
        return torch.nn.functional.linear(x2, W, bias)
    return torch.mm(x2, wt) if bias is None else torch.addmm(bias, x2, wt)


def _vmapped(mod, orig, copies, args, M, b):
    """One call of ``orig`` under ``torch.func.vmap`` over the members: tensor arguments of ``M*b`` rows split
    into [M, b, ...], the module's tensors swapped for their per-member copies."""
    n = M * b
    dims = tuple(0 if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == n else None for t in args)
    split = [t.view(M, b, *t.shape[1:]) if d == 0 else t for t, d in zip(args, dims)]

    def one(params, *inputs):
        saved = {name: mod._parameters[name] for name in params}
        try:
            mod._parameters.update(params)
            return orig(*inputs)
        finally:
            mod._parameters.update(saved)

    out = torch.func.vmap(one, in_dims=(0, *dims))(copies, *split)
    return torch.utils._pytree.tree_map(lambda t: t.reshape(n, *t.shape[2:]) if isinstance(t, torch.Tensor) else t, out)


def _per_member(mod, orig, copies, args, kwargs, M, b, name):
    """One call of ``orig`` per member block, with that member's copies swapped in (modules vmap cannot batch)."""
    n = M * b
    cut = lambda t, k: t[k * b:(k + 1) * b] if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == n else t
    outs = []
    for k in range(M):
        saved = {pname: mod._parameters[pname] for pname in copies}
        try:
            for pname, c in copies.items():
                mod._parameters[pname] = c[k]
            outs.append(orig(*(cut(t, k) for t in args), **{key: cut(t, k) for key, t in kwargs.items()}))
        finally:
            mod._parameters.update(saved)
    return _cat(outs, name)


def _cat(outs, name):
    first = outs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(outs)
    if isinstance(first, (tuple, list)):
        return type(first)(_cat(list(parts), name) for parts in zip(*outs))
    if first is None:
        return None
    raise ValueError(f"member_evaluation='batched': cannot join the per-member outputs of {name} ({type(first).__name__})")
