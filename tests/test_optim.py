"""MeZO on a synthetic objective with a known optimum (tests/engine_problems.py), its variants,
safety and resumption."""
import io

import pytest
import torch

from engine_problems import SHAPES, make_problem, run
from mezo_rl.engine.optim import ESTIMATORS, ON_NONFINITE, SCHEDULERS, MeZO, StepResult, get_scheduler

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("noise_kind", ["gaussian", "rademacher", "lowrank"])
def test_mezo_cuts_quadratic_loss_by_90_percent(noise_kind):
    params, loss_fn, _ = make_problem()
    start = loss_fn().item()
    run(params, loss_fn, 80, lr=0.15, eps=1e-3, noise=noise_kind, rank=2)
    assert loss_fn().item() < 0.1 * start


@pytest.mark.parametrize("variant", [
    dict(n_spsa=4, lr=0.3),
    dict(momentum=0.5, lr=0.07),
    dict(adam=True, lr=2e-2, betas=(0.9, 0.99)),
    dict(estimator="one_point", lr=1e-2, eps=1e-2, steps=300),  # one forward per step, noisier
    dict(lr=0.15, weight_decay=1e-3),
])
def test_variants_reduce_the_loss(variant):
    params, loss_fn, _ = make_problem()
    start = loss_fn().item()
    variant = dict(variant)
    run(params, loss_fn, variant.pop("steps", 100), **variant)
    assert loss_fn().item() < 0.5 * start, variant


def test_step_result_reports_what_happened():
    params, loss_fn, _ = make_problem()
    opt = MeZO(params, lr=0.1, eps=1e-3, n_spsa=2, noise_backend="torch", seed=3)
    res = opt.step(loss_fn)
    assert isinstance(res, StepResult) and not res.skipped
    assert res.seeds == [3 * 2**32, 3 * 2**32 + 1]
    lp, lm = res.values[0::2], res.values[1::2]
    assert res.projected_grads == [(lp[j] - lm[j]) / (2 * 1e-3) for j in range(2)]
    assert res.loss_plus == pytest.approx(sum(lp) / 2) and res.loss_minus == pytest.approx(sum(lm) / 2)
    assert res.loss == pytest.approx(sum(res.values) / 4)
    assert len(opt.trajectory) == 1


@pytest.mark.parametrize("noise_kind", ["gaussian", "rademacher", "lowrank"])
def test_frozen_tensors_never_change_and_global_rng_is_untouched(noise_kind):
    params, loss_fn, _ = make_problem()
    params[1].requires_grad_(False)
    frozen = params[1].clone()
    rng = torch.get_rng_state()
    run(params, loss_fn, 20, lr=0.1, noise=noise_kind)
    assert torch.equal(params[1], frozen)
    assert not torch.equal(params[0], torch.zeros(SHAPES[0]))
    assert torch.equal(torch.get_rng_state(), rng)


@pytest.mark.parametrize("noise_kind", ["gaussian", "rademacher", "lowrank"])
def test_closure_that_raises_on_second_call_leaves_weights_restored(noise_kind):
    params, loss_fn, _ = make_problem()
    opt = MeZO(params, lr=0.1, eps=1e-3, noise=noise_kind, noise_backend="torch")
    opt.step(loss_fn)
    before = [p.detach().clone() for p in params]
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("data loader died")
        return loss_fn()

    with pytest.raises(RuntimeError, match="data loader died"):
        opt.step(flaky)
    for p, b in zip(params, before):
        assert (p - b).abs().max().item() <= 1e-6
    assert opt.trajectory.status[-1] == 2  # logged as aborted, so replay repeats its sweeps


def test_exact_mode_restores_bit_exactly_after_an_exception():
    params = [torch.round(torch.randn(5000) * 64) / 64]
    params[0].requires_grad_()
    before = params[0].detach().clone()
    opt = MeZO(params, lr=0.1, eps=2**-10, noise="rademacher", noise_backend="torch")

    def boom():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        opt.step(boom)
    assert torch.equal(params[0], before)


def test_nonfinite_loss_raise_and_skip_policies():
    params, loss_fn, _ = make_problem()
    before = [p.detach().clone() for p in params]
    opt = MeZO(params, lr=0.1, noise_backend="torch")
    with pytest.raises(FloatingPointError, match="non-finite"):
        opt.step(lambda: float("nan"))
    opt = MeZO(params, lr=0.1, noise_backend="torch", on_nonfinite="skip")
    values = iter([1.0, float("inf")])
    res = opt.step(lambda: next(values))
    assert res.skipped and res.projected_grads == []
    for p, b in zip(params, before):
        assert (p - b).abs().max().item() <= 1e-6


@pytest.mark.parametrize("kw", [dict(), dict(momentum=0.5), dict(adam=True), dict(estimator="one_point", lr=5e-3, eps=1e-2)])
def test_resume_from_state_dict_matches_unbroken_run(kw):
    kw = dict(dict(lr=0.1, eps=1e-3, noise_backend="torch", seed=11), **kw)
    params_a, loss_a, _ = make_problem()
    run(params_a, loss_a, 20, **kw)

    params_b, loss_b, _ = make_problem()
    opt = run(params_b, loss_b, 10, **kw)
    buf = io.BytesIO()
    torch.save({"opt": opt.state_dict(), "params": [p.detach() for p in params_b]}, buf)
    del opt
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=False)
    params_c, loss_c, _ = make_problem()
    with torch.no_grad():
        for p, saved in zip(params_c, ckpt["params"]):
            p.copy_(saved)
    opt = MeZO(params_c, **kw)
    opt.load_state_dict(ckpt["opt"])
    for _ in range(10):
        opt.step(loss_c)
    for p, q in zip(params_a, params_c):
        assert torch.equal(p, q)
    assert len(opt.trajectory) == 20  # the log continues across the pause


def test_load_state_dict_rejects_other_configuration():
    params, loss_fn, _ = make_problem()
    sd = run(params, loss_fn, 1, lr=0.1).state_dict()
    with pytest.raises(ValueError, match="rademacher"):
        MeZO(params, noise="rademacher", noise_backend="torch").load_state_dict(sd)


@pytest.mark.parametrize("bad, match", [
    (dict(lr=-1.0), "lr"), (dict(eps=0.0), "eps"), (dict(noise="uniform"), "gaussian"),
    (dict(estimator="three_point"), "two_point"), (dict(n_spsa=0), "n_spsa"),
    (dict(momentum=0.5, adam=True), "either"), (dict(estimator="one_point", n_spsa=2), "n_spsa"),
    (dict(on_nonfinite="ignore"), "skip"), (dict(seed=-1), "seed"), (dict(noise_backend="cuda"), "auto"),
])
def test_bad_arguments_are_named(bad, match):
    with pytest.raises(ValueError, match=match):
        MeZO([torch.zeros(3, requires_grad=True)], **bad)


def test_declared_choices_are_exactly_what_the_engine_accepts():
    """ESTIMATORS / ON_NONFINITE / SCHEDULERS are the one declaration of those options' values."""
    t = [torch.zeros(3, requires_grad=True)]
    for estimator in ESTIMATORS:
        MeZO(t, estimator=estimator, n_spsa=2 if estimator == "es" else 1, noise_backend="torch")
    for policy in ON_NONFINITE:
        MeZO(t, on_nonfinite=policy, noise_backend="torch")
    for name in SCHEDULERS:
        assert get_scheduler(name, MeZO(t, noise_backend="torch"), total_steps=10) is not None
    with pytest.raises(ValueError, match="'constant' or 'linear'"):
        get_scheduler("cosine", MeZO(t, noise_backend="torch"), total_steps=10)


def test_bad_closures_are_named():
    opt = MeZO([torch.zeros(3, requires_grad=True)], noise_backend="torch")
    with pytest.raises(ValueError, match="closure"):
        opt.step(None)
    with pytest.raises(ValueError, match="0-d tensor"):
        opt.step(lambda: torch.ones(2))
    with pytest.raises(ValueError, match="no trainable"):
        MeZO([torch.zeros(3)], noise_backend="torch").step(lambda: 0.0)


def perturbation_of_first(params, **kw):
    seen = []
    opt = MeZO(params, lr=0.0, eps=1.0, noise_backend="torch", seed=5, **kw)
    opt.step(lambda: seen.append(params[0].detach().clone()) or 0.0)
    return seen[0]


@pytest.mark.parametrize("kind", ["gaussian", "rademacher"])
def test_elementwise_noise_of_a_tensor_depends_only_on_seed_and_its_identity(kind):
    """Tensor 0 sees the same z whatever the other tensors are; a frozen tensor keeps others' noise."""
    a1 = perturbation_of_first([torch.zeros(100, requires_grad=True), torch.zeros(7, requires_grad=True)], noise=kind)
    a2 = perturbation_of_first([torch.zeros(100, requires_grad=True), torch.zeros(3, 3, requires_grad=True)], noise=kind)
    a3 = perturbation_of_first([torch.zeros(100, requires_grad=True), torch.zeros(7)], noise=kind)  # second one frozen
    assert torch.equal(a1, a2) and torch.equal(a1, a3)
    b = perturbation_of_first([torch.zeros(7, requires_grad=True), torch.zeros(100, requires_grad=True)], noise=kind)
    assert not torch.equal(b, a1[:7])  # position is part of the identity


def test_lowrank_noise_of_a_tensor_depends_on_seed_layout_and_identity_only():
    """Low-rank noise draws every trainable tensor of a sample at once: a tensor's z is a function of the seed, the
    layout (indices and shapes of the trainable tensors) and its index; not of the values, the global RNG or what
    was drawn before; a frozen tensor is outside the layout and keeps its value."""
    def perturbations(params):
        seen = []
        opt = MeZO(params, lr=0.0, eps=1.0, seed=5)
        opt.step(lambda: seen.append([p.detach().clone() for p in params]) or 0.0)
        return seen[0]

    base = perturbations([torch.zeros(6, 5, requires_grad=True), torch.zeros(7, requires_grad=True)])
    torch.randn(50)
    shifted = perturbations([torch.zeros(6, 5, requires_grad=True), torch.full((7,), 3.0, requires_grad=True)])
    assert torch.equal(base[0], shifted[0]) and torch.equal(base[1] + 3.0, shifted[1])  # one rounding each
    assert torch.linalg.matrix_rank(base[0]).item() == 1
    with_frozen = perturbations([torch.zeros(6, 5, requires_grad=True), torch.zeros(7, requires_grad=True),
                                 torch.ones(3)])
    assert torch.equal(with_frozen[0], base[0]) and torch.equal(with_frozen[2], torch.ones(3))
    taller = perturbations([torch.zeros(8, 5, requires_grad=True), torch.zeros(7, requires_grad=True)])
    assert not torch.equal(taller[1], base[1])  # another layout: the 1-D tensor's noise is drawn elsewhere
