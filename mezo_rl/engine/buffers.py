"""Momentum and Adam on MeZO's estimate: the update that needs per-tensor float32 buffers.

``momentum=mu``: heavy-ball momentum on the ZO estimate, m <- mu m + g z, theta <- theta - lr m: one float32 buffer
per trainable tensor (+4 bytes per parameter). ``adam=True``: Adam on the ZO estimate: two float32 buffers (+8 bytes
per parameter). Both update after the restore, in a separate sweep; Adam materialises g z per tensor, momentum with
low-rank noise adds the factors to its buffers for every tensor at once (element-wise noise: z per tensor). (The
history could be recomputed from the logged seeds instead, as the paper notes, but that costs one sweep per
remembered step; buffers are the honest default.) Functions of a :class:`mezo_rl.engine.optim.MeZO` (``opt``): its
configuration, noise, state and update count.
"""
from __future__ import annotations

import torch

from mezo_rl.engine import noise as _noise
from mezo_rl.engine import rounding as _rounding

__all__ = ["buffered_update"]


def buffered_update(opt, entries, seeds, group_grads, rounded: bool = False) -> float | None:
    """Momentum / Adam: materialise z per tensor and update the per-tensor float32 buffers (momentum with
    low-rank noise on float32 weights: :func:`_lowrank_momentum_update`, every tensor at once). ``rounded``:
    bf16 / fp16 tensors, the step computed in float32 and rounded once (:mod:`mezo_rl.engine.rounding`);
    returns the share of it kept."""
    cfg = opt.config
    n, mu, (b1, b2) = cfg["n_spsa"], cfg["momentum"], cfg["betas"]
    if cfg["noise"] == "lowrank" and not cfg["adam"] and not rounded:
        return _lowrank_momentum_update(opt, entries, seeds, group_grads)
    t = opt._updates + 1

    def step_of(idx, p, group) -> tuple[torch.Tensor, float]:
        """``(d, alpha)``: the change of ``p`` after its weight decay is ``alpha * d`` (float32), its buffers moved."""
        est = None  # the ZO gradient estimate for this tensor: mean_j g_j z_j
        for j, s in enumerate(seeds):
            z = opt._noise.sample(p, s, idx).mul_(group_grads[id(group)][j] / n)
            est = z if est is None else est.add_(z)
        state, lr = opt.state[p], group["lr"]
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

def _lowrank_momentum_update(opt, entries, seeds, group_grads) -> None:
    """Heavy-ball momentum with low-rank noise, in operations that do not grow with the number of tensors:
    ``m <- mu m``, then ``m <- m + (g_j / n) z_j`` for each sample (a sweep of the buffers: the factors are
    added to them as to the weights, never materialised), then ``p <- p (1 - lr wd) - lr m``."""
    n, mu = opt.config["n_spsa"], opt.config["momentum"]
    bufs = []
    for _, p, _ in entries:
        state = opt.state[p]
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
        opt._noise.sweep_([(idx, buf) for (idx, _, _), buf in zip(entries, bufs)], s,
                           [(0.0, group_grads[id(group)][j] / n, 1.0) for _, _, group in entries])
    for device, items in by_device.items():
        decayed = [(p, 1.0 - group["lr"] * group["weight_decay"]) for p, _, group in items if group["weight_decay"]]
        one = torch.ones((), dtype=torch.float32, device=device)
        with _noise.one_thread_on_cpu([device]):
            if decayed:
                torch._foreach_mul_([p for p, _ in decayed], [c for _, c in decayed])
            torch._foreach_addcmul_([p for p, _, _ in items], [b for _, b, _ in items], [one] * len(items),
                                    [-group["lr"] for _, _, group in items])
