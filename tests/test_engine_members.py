"""The step's members: the ES population estimator (``estimator="es"``) and the ``fitness`` hook that
turns whatever the closure returned per member into the members' losses."""
import numpy as np
import pytest
import torch

from engine_problems import SMALL_SHAPES, make_problem, messy_run, run
from mezo_rl.engine.optim import MeZO, replay_trajectory

pytestmark = pytest.mark.usefixtures("one_thread")


def test_es_members_are_one_sided_and_centred():
    params, loss_fn, _ = make_problem(SMALL_SHAPES)
    opt = MeZO(params, lr=0.1, eps=1e-3, n_spsa=4, estimator="es", noise_backend="torch")
    assert opt.members_per_step == 4
    res = opt.step(loss_fn)
    assert len(res.values) == 4 and res.loss_minus is None
    mean = sum(res.values) / 4
    assert res.projected_grads == pytest.approx([(v - mean) / 1e-3 for v in res.values], rel=1e-12)


def test_es_with_normalize_is_the_z_score_of_the_population():
    params, loss_fn, _ = make_problem(SMALL_SHAPES)
    res = MeZO(params, lr=0.1, n_spsa=5, estimator="es", step_normalize="std", noise_backend="torch").step(loss_fn)
    z = (np.array(res.values) - np.mean(res.values)) / np.std(res.values)
    assert res.projected_grads == pytest.approx(z.tolist(), rel=1e-9)


@pytest.mark.parametrize("step_normalize", [None, "std"])
def test_es_reduces_a_quadratic(step_normalize):
    params, loss_fn, _ = make_problem()
    start = loss_fn().item()
    lr = 0.1 if step_normalize is None else 0.02
    run(params, loss_fn, 150, lr=lr, eps=1e-3, n_spsa=4, estimator="es", step_normalize=step_normalize)
    assert loss_fn().item() < 0.5 * start


def test_es_needs_a_population():
    params, _, _ = make_problem(SMALL_SHAPES)
    with pytest.raises(ValueError, match="n_spsa must be >= 2"):
        MeZO(params, estimator="es")


@pytest.mark.parametrize("kw", [dict(estimator="es", n_spsa=3), dict(estimator="es", n_spsa=2, momentum=0.5),
                                dict(estimator="es", n_spsa=3, step_normalize="std", noise="gaussian")])
def test_es_runs_replay_bit_identically(kw):
    params, loss_fn, _ = make_problem(SMALL_SHAPES)
    initial = [p.detach().clone().requires_grad_() for p in params]
    opt = messy_run(params, loss_fn, steps=12, **kw)
    replay_trajectory(initial, opt.trajectory)
    assert all(torch.equal(p, q) for p, q in zip(params, initial))


def test_fitness_sees_every_member_and_its_losses_drive_the_step():
    """A closure returning per-example vectors, turned into losses by a fitness over the whole
    population, steps exactly as a plain closure returning those losses (same problem, same seeds)."""
    params, loss_fn, _ = make_problem(SMALL_SHAPES)
    twin, twin_loss, _ = make_problem(SMALL_SHAPES)
    seen = []

    def fitness(outcomes):
        seen.append(len(outcomes))
        return [float(o.sum()) for o in outcomes]

    opt = MeZO(params, lr=0.05, n_spsa=2, noise_backend="torch")
    ref = MeZO(twin, lr=0.05, n_spsa=2, noise_backend="torch")
    for _ in range(3):
        res = opt.step(lambda: torch.stack([loss_fn(), torch.tensor(1.0)]), fitness=fitness)
        ref_res = ref.step(lambda: twin_loss().item() + 1.0)
        assert res.values == ref_res.values
    assert seen == [4, 4, 4]
    assert all(torch.equal(p, q) for p, q in zip(params, twin))


def test_fitness_with_the_wrong_count_is_one_line_and_restores_the_weights():
    params, loss_fn, _ = make_problem(SMALL_SHAPES)
    before = [p.detach().clone() for p in params]
    opt = MeZO(params, lr=0.05, n_spsa=2, noise="rademacher", eps=2**-10, noise_backend="torch")
    with pytest.raises(ValueError, match=r"fitness returned 3 losses for 4 members; it must return one per member \(4\)"):
        opt.step(loss_fn, fitness=lambda outcomes: [0.0, 1.0, 2.0])
    assert all(torch.allclose(p, b, atol=1e-6, rtol=0) for p, b in zip(params, before))
    assert opt.trajectory.status.tolist() == [2]  # logged as aborted: a replay repeats its sweeps


def test_non_finite_fitness_is_skipped_like_a_non_finite_loss():
    params, loss_fn, _ = make_problem(SMALL_SHAPES)
    opt = MeZO(params, lr=0.05, on_nonfinite="skip", noise_backend="torch")
    res = opt.step(loss_fn, fitness=lambda outcomes: [float("nan")] * len(outcomes))
    assert res.skipped
