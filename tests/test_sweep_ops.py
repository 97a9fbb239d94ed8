"""Fused sweeps: a MeZO step with low-rank noise dispatches a number of aten operators that does not grow with the
number of trainable tensors (mezo_rl.opcount.OpCounter), so on a launch-bound device it costs its forwards; and
what the fused operators compute is the noise tensor by tensor (NoiseSpec.sample)."""
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import make_tiny_causal_lm
from mezo_rl.engine.noise import NoiseSpec, layout
from mezo_rl.engine.optim import MeZO
from mezo_rl.opcount import OpCounter

U32 = torch.finfo(torch.float32).eps / 2  # unit roundoff of float32


def _scoring(tokenizer, layers: int):
    model = make_tiny_causal_lm(tokenizer, num_hidden_layers=layers)
    ids = torch.randint(0, len(tokenizer), (4, 16), generator=torch.Generator().manual_seed(0))

    def loss():
        logits = model(input_ids=ids).logits
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    return model, loss


def _counts(tokenizer, layers: int, **options):
    """(ops of two forwards, ops of one in-place step) on the tiny Llama with ``layers`` layers."""
    model, loss = _scoring(tokenizer, layers)
    decayed = [p for p in model.parameters() if p.dim() >= 2]
    exempt = [p for p in model.parameters() if p.dim() < 2]
    opt = MeZO([{"params": decayed, "weight_decay": options.pop("weight_decay", 0.0)}, {"params": exempt}],
               lr=1e-3, eps=1e-3, **options)
    opt.step(loss)  # the first step resolves the backend and allocates any buffers
    with torch.no_grad(), OpCounter() as forwards:
        loss()
        loss()
    with OpCounter() as step:
        opt.step(loss)
    return forwards.total, step.total, len(list(model.parameters()))


def test_a_scoring_step_costs_its_two_forwards(tiny_tokenizer):
    """The default noise (low-rank r = 1): at most 1.2x the operators of two forward passes of the same batch."""
    forwards, step, _ = _counts(tiny_tokenizer, 2)
    assert step <= 1.2 * forwards, (step, forwards)


@pytest.mark.parametrize("options", [dict(), dict(weight_decay=0.1), dict(n_spsa=2), dict(rank=2, lowrank_interval=2),
                                     dict(momentum=0.9, weight_decay=0.1)],
                         ids=["default", "weight-decay", "n-spsa", "rank-2", "momentum"])
def test_what_a_step_adds_to_its_forwards_does_not_grow_with_the_tensors(tiny_tokenizer, options):
    """The same step on 2 and 8 layers (20 and 74 tensors): the operators beyond the forwards are the same number."""
    f2, s2, t2 = _counts(tiny_tokenizer, 2, **options)
    f8, s8, t8 = _counts(tiny_tokenizer, 8, **options)
    calls = 2 * options.get("n_spsa", 1)  # the closure's forwards: two per sample
    assert t8 > 3 * t2
    assert s8 - calls * f8 / 2 == s2 - calls * f2 / 2, (s2 - calls * f2 / 2, s8 - calls * f8 / 2)


def _tensors():
    g = torch.Generator().manual_seed(3)
    shapes = [(6, 5), (7,), (4, 3, 2), (6, 5), ()]  # two same-shape matrices, a 3-D tensor, a vector, a scalar
    return [torch.randn(s, generator=g) for s in shapes]


@pytest.mark.parametrize("rank", [1, 3])
def test_a_fused_sweep_is_every_tensor_s_own_noise(rank):
    """sweep_ over all tensors at once: p <- c p + (a c + b) z with z = NoiseSpec.sample of each tensor (B A^T / sqrt(r)
    for 2+ dimensions), to float32 rounding: each of the r products of the sweep (coefficient, B, A) rounds twice and
    the sum once, after c p rounds once; the reference's z = B A^T / sqrt(r) rounds r + 1 times: (4 r + 2) roundings
    of the terms' size bound the difference."""
    params = _tensors()
    spec = NoiseSpec("lowrank", "torch", rank=rank, layout=layout(enumerate(params)))
    seed, coefs = 2**32 + 5, [(1e-3, -0.2, 0.9), (1e-3, -0.2, 0.9), (-2e-3, 0.0, 1.0), (0.5, 0.1, 1.0), (1.0, 0.0, 0.5)]
    before = [p.clone() for p in params]
    spec.sweep_(list(enumerate(params)), seed, coefs)
    for i, (p, p0, (a, b, c)) in enumerate(zip(params, before, coefs)):
        z = spec.sample(p0, seed, i).double()
        s = a * c + b
        if p0.dim() >= 2:
            fb, fa = spec.factors(p0, seed, i)
            terms = (fb.abs() @ fa.abs().t()).double().view(p0.shape) / math.sqrt(rank)
        else:
            terms = z.abs()
        expected = c * p0.double() + s * z
        size = abs(c) * p0.double().abs() + abs(s) * terms
        assert ((p.double() - expected).abs() <= (4 * rank + 2) * U32 * size).all(), i


def test_the_sweep_of_a_layout_draws_once_per_sample_and_refuses_other_tensors():
    params = _tensors()
    spec = NoiseSpec("lowrank", "torch", layout=layout(enumerate(params)), keep=2)
    with OpCounter() as first:
        spec.sweep_(list(enumerate(params)), 7, [(1e-3, 0.0, 1.0)] * len(params))
    with OpCounter() as again:
        spec.sweep_(list(enumerate(params)), 7, [(-2e-3, 0.0, 1.0)] * len(params))
    assert first.counts["aten.randn"] == 2 and again.counts["aten.randn"] == 0
    assert again.total == 1  # one _foreach_addcmul_ for the five tensors
    with pytest.raises(ValueError, match="not in this noise's layout"):
        spec.sweep_([(0, torch.zeros(5, 6))], 7, [(1.0, 0.0, 1.0)])
    with pytest.raises(ValueError, match="layout"):
        NoiseSpec("lowrank", "torch").factors(torch.zeros(3, 2), 7, 0)


def test_lowrank_momentum_is_the_heavy_ball_on_every_tensor_s_noise():
    """The fused momentum update against its definition, m <- mu m + sum_j (g_j / n) z_j, p <- p (1 - lr wd) - lr m,
    with z from NoiseSpec.sample (float64 reference; bound: a few roundings of the terms' size per operation)."""
    params = [p.requires_grad_() for p in _tensors()[:4]]
    start = [p.detach().clone() for p in params]
    lr, wd, mu = 0.05, 0.1, 0.9
    opt = MeZO(params, lr=lr, eps=1e-3, weight_decay=wd, momentum=mu, n_spsa=2, seed=4)
    target = [torch.ones_like(p) for p in params]
    loss = lambda: sum(((p - t) ** 2).sum() for p, t in zip(params, target))  # noqa: E731
    m = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    ref = [p.double() for p in start]
    moved = [torch.zeros_like(r) for r in ref]  # the size of everything added to each weight so far
    for _ in range(3):
        res = opt.step(loss)
        for i, p in enumerate(params):
            zs = [opt._noise.sample(p, s, i).double() for s in res.seeds]
            m[i] = mu * m[i] + sum(g / 2 * z for g, z in zip(res.projected_grads, zs))
            ref[i] = ref[i] * (1 - lr * wd) - lr * m[i]
            moved[i] += sum(2e-3 * z.abs() for z in zs) + lr * m[i].abs()
    for p, r, size in zip(params, ref, moved):
        # per step: four sweeps of the weights (+eps, -2 eps, restore per sample), each rounding up to 3 times, the
        # decay and the update 3 more, the buffer's sweep and scaling 4; every rounding at most u of the sizes
        assert ((p.detach().double() - r).abs() <= 3 * 20 * U32 * (r.abs() + size)).all()


def test_a_sweep_is_the_same_bits_with_any_number_of_threads():
    """Every element of a sweep is computed on its own and the draw is sequential, so however the threads split the
    work (a matrix large enough to be split, a row length that leaves a remainder to every vector width), the
    weights come out bit for bit the same: a trajectory replays with another thread count."""
    out, threads = {}, torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            g = torch.Generator().manual_seed(0)
            params = [torch.randn(s, generator=g) for s in ((301, 1003), (1001,), (3, 7, 11))]
            spec = NoiseSpec("lowrank", "torch", rank=2, layout=layout(enumerate(params)))
            spec.sweep_(list(enumerate(params)), 5, [(1e-3, -0.3, 0.97)] * len(params))
            out[n] = params
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for n in (2, 3) for a, b in zip(out[1], out[n]))
