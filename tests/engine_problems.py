"""Objectives with a known optimum for the engine's tests (test_optim, test_trajectory, test_engine_noise).

The quadratic is the paper's theory setting: L(theta) = 1/2 ||A (theta - theta*)||^2 with a Hessian
A^T A of low rank r, so ZO-SGD converges at a rate set by r, not by the dimension. theta is split
over tensors of different shapes so per-tensor noise (and low-rank noise on 2-D tensors) is exercised.
"""
from __future__ import annotations

import math

import pytest
import torch

from mezo_rl.engine.optim import MeZO, get_scheduler

SHAPES = [(200, 250), (30_000,), (20_000,)]  # 100,000 weights
SMALL_SHAPES = [(100, 120), (5_000,), (3_000,)]  # 20,000 weights


def make_problem(shapes=SHAPES, rank: int = 8, seed: int = 0, dtype=torch.float32):
    """(params, loss_fn, grad_fn): zero-initialised tensors of ``shapes`` and the quadratic above
    (Hessian eigenvalues 0.25..1); ``grad_fn()`` is its exact gradient, one tensor per param."""
    g = torch.Generator().manual_seed(seed)
    d = sum(math.prod(s) for s in shapes)
    q, _ = torch.linalg.qr(torch.randn(d, rank, generator=g))  # orthonormal columns
    a = (q * torch.linspace(0.5, 1.0, rank)).t().contiguous().to(dtype)  # [rank, d]
    target = torch.randn(d, generator=g).to(dtype)
    params = [torch.zeros(s, dtype=dtype).requires_grad_() for s in shapes]

    def residual():
        theta = torch.cat([p.detach().reshape(-1) for p in params])
        return a @ (theta - target)

    def loss_fn():
        return 0.5 * residual().pow(2).sum()

    def grad_fn():
        flat = a.t() @ residual()
        return [c.view(p.shape) for c, p in zip(flat.split([p.numel() for p in params]), params)]

    return params, loss_fn, grad_fn


def run(params, loss_fn, steps, **kw):
    """A MeZO (torch noise backend unless given) after ``steps`` steps on ``loss_fn``."""
    kw.setdefault("noise_backend", "torch")
    opt = MeZO(params, **kw)
    for _ in range(steps):
        opt.step(loss_fn)
    return opt


def messy_run(params, loss_fn, steps: int = 30, second_eps: float = 2e-3, **kw):
    """A run exercising groups, weight decay, a linear schedule, a skipped step (at steps // 3)
    and an aborted one (at 2 * steps // 3), on the torch noise backend unless given. The second group's
    eps is ``second_eps`` (HiZOO's one eps: the first group's, 1e-3)."""
    groups = [{"params": params[:2], "weight_decay": 0.01}, {"params": params[2:], "lr": 0.05, "eps": second_eps}]
    opt = MeZO(groups, **dict(dict(lr=0.1, eps=1e-3, noise_backend="torch", on_nonfinite="skip"), **kw))
    sched = get_scheduler("linear", opt, total_steps=steps * 4 // 3)
    for t in range(steps):
        if t == steps // 3:
            opt.step(lambda: float("nan"))
        elif t == 2 * steps // 3:
            with pytest.raises(ValueError):
                opt.step(lambda: (_ for _ in ()).throw(ValueError("bad batch")))
        else:
            opt.step(loss_fn)
        sched.step()
    return opt
