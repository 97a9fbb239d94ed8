"""The step's normalisation is the fitness's (issue 69, item 3): the trainer builds ``MeZO(step_normalize=None)`` and
:func:`mezo_rl.training.fitness.step_normalised` hands it losses whose differences carry the normalisation, so
the update is the one ``MeZO(step_normalize="std")`` makes from the raw losses; and a run made while the engine
normalised (its trajectory says ``step_normalize="std"``, or ``normalize="std"`` as runs recorded it before the rename) still replays bit for bit, and is refused a resume in one line.

Tolerances: the two paths compute the same projected gradient g in float64 in different orders. The engine's
normaliser rounds twice, ``fl(fl(l+ - l-) / 2 sigma)`` (2 sigma is exact): 2u|g|. The fitness writes
``l' = fl(o + fl(fl(l - mid) fl(eps / sigma)))``, ``mid`` the pair's midpoint and ``o`` 0 (HiZOO: ``mid - l0``):
the scaled deviation t carries 3 roundings (3u|t|, and |t+| + |t-| = 2 eps |g|), the sum one of u|l'| (none
when o is 0); ``mid`` and ``o`` are the same numbers in both members of a pair, so their own rounding cancels
in l'+ - l'-. The engine then rounds ``fl(fl(l'+ - l'-) / 2 eps)``: 2u|g|. In all:
``|g' - g| <= u (|l'+| + |l'-|) / (2 eps) + 7u |g|``, written with 8u for the second-order terms. For ``es``
the members' mean m (``sum / n``, recursive: (n - 1)u of the sum of magnitudes, and u) is rounded in both
paths, differently: ``|g' - g| <= (n + 2) u max|l'| / eps + n u max|l| / sigma + 10u max|g|``.
u = 2**-53, float64's unit roundoff.
"""
from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch

from mezo_rl.engine.optim import MeZO
from mezo_rl.engine.population import step_members
from mezo_rl.errors import ConfigError
from mezo_rl.training.fitness import FitnessSpec, step_normalised

U = 2.0 ** -53


def grads_and_weights(values, *, step_normalize, fitness=None, steps=1, **kw):
    """``steps`` MeZO steps on a 3 x 4 tensor whose closure returns ``values`` (one list per step) in member
    order; the projected gradients of each step and the final weights."""
    w = torch.linspace(-1.0, 1.0, 12).reshape(3, 4).contiguous().requires_grad_()
    opt = MeZO([w], lr=0.1, noise_backend="torch", step_normalize=step_normalize, **kw)
    out = []
    for step_values in values:
        it = iter(step_values)
        out.append(opt.step(lambda: next(it), fitness=fitness).projected_grads)
    return out, w.detach().clone()


def fitness_for(estimator, eps, centre=False):
    return lambda losses: step_normalised(losses, FitnessSpec(step_normalize=True, eps=eps, estimator=estimator,
                                                              centre=centre).members(len(losses)), eps)


CASES = [(estimator, n, offset, scale, eps)
         for estimator, n in (("two_point", 1), ("two_point", 3), ("es", 4))
         for offset in (0.0, 1e3) for scale in (1e-6, 1.0, 1e2) for eps in (1e-3, 0.1)]


@pytest.mark.parametrize("estimator, n, offset, scale, eps", CASES)
def test_the_fitness_normalised_losses_give_the_engines_normalised_update(estimator, n, offset, scale, eps):
    rng = random.Random(hash((estimator, n, offset, scale, eps)) % 2**32)
    members = n * (2 if estimator == "two_point" else 1)
    raw = [[offset + scale * rng.gauss(0.0, 1.0) for _ in range(members)] for _ in range(3)]
    common = dict(n_spsa=n, estimator=estimator, eps=eps, noise="rademacher")
    before, _ = grads_and_weights(raw, step_normalize="std", steps=3, **common)
    after, _ = grads_and_weights(raw, step_normalize=None, fitness=fitness_for(estimator, eps), **common)
    for values, g_old, g_new in zip(raw, before, after):
        new = fitness_for(estimator, eps)(values)
        if estimator == "two_point":
            for j, (a, b) in enumerate(zip(g_old, g_new)):
                bound = U * (abs(new[2 * j]) + abs(new[2 * j + 1])) / (2 * eps) + 8 * U * abs(a)
                assert abs(a - b) <= bound, (j, a, b, bound)
        else:
            sigma = torch.tensor(values, dtype=torch.float64).std(unbiased=False).item()
            bound = ((n + 2) * U * max(map(abs, new)) / eps + n * U * max(map(abs, values)) / sigma
                     + 10 * U * max(map(abs, g_old)))
            assert max(abs(a - b) for a, b in zip(g_old, g_new)) <= bound


@pytest.mark.parametrize("estimator, n", [("two_point", 2), ("es", 3)])
def test_no_spread_is_no_update_in_both(estimator, n):
    """sigma 0 (every member's loss equal): the engine's normaliser makes no update, and nor do the fitness's
    losses, exactly (weight decay 0: the weights do not move at all). (With ``es`` the losses are 0.25, whose
    mean the engine computes exactly; three losses of 0.1 have a rounded mean and a spread of about u, which
    the engine's normaliser turns into a whole step, within the es bound above: n u max|l| / sigma >= 1.)"""
    values = [[0.25] * (n * (2 if estimator == "two_point" else 1))]
    common = dict(n_spsa=n, estimator=estimator, eps=1e-2, noise="rademacher")
    before, w_before = grads_and_weights(values, step_normalize="std", **common)
    after, w_after = grads_and_weights(values, step_normalize=None, fitness=fitness_for(estimator, 1e-2), **common)
    assert before == after == [[0.0] * n]
    assert torch.equal(w_before, w_after)


def test_hizoos_unperturbed_member_keeps_the_curvature_and_stays_out_of_sigma():
    """With HiZOO one more member, the unperturbed weights, ends the step: sigma is the perturbed members' spread
    (as the engine's, which takes it after setting that member aside), and the second difference
    l+ + l- - 2 l0 that moves the curvature is what it was: l0 becomes 0 and each pair is offset by
    o = mid - l0. Rounding: u of each of l'+, l'-, 2u|o| (o and its double), 3u of each scaled deviation,
    and the midpoint's own u|l+ + l-| / 2, twice and once more scaled by eps / sigma in the deviations."""
    eps, rng = 1e-2, random.Random(7)
    raw = [[2.0 + rng.gauss(0.0, 0.3) for _ in range(5)] for _ in range(4)]  # n_spsa 2: +, -, +, -, unperturbed
    common = dict(n_spsa=2, eps=eps, noise="lowrank", rank=1, hessian_smooth=0.3)
    fitness = fitness_for("two_point", eps, centre=True)
    before, w_before = grads_and_weights(raw, step_normalize="std", **common)
    after, w_after = grads_and_weights(raw, step_normalize=None, fitness=fitness, **common)
    for values, g_old, g_new in zip(raw, before, after):
        new, c = fitness(values), values[4]
        assert new[4] == 0.0
        sigma = torch.tensor(values[:4], dtype=torch.float64).std(unbiased=False).item()
        for j in range(2):
            a, b, a2, b2 = values[2 * j], values[2 * j + 1], new[2 * j], new[2 * j + 1]
            o = (a + b) / 2 - c
            t = abs(a2 - o) + abs(b2 - o)
            bound = U * (abs(a2) + abs(b2) + 2 * abs(o) + 3 * t + (1 + eps / sigma) * abs(a + b))
            assert abs((a2 + b2 - 2 * new[4]) - (a + b - 2 * c)) <= bound
            bound = U * (abs(a2) + abs(b2)) / (2 * eps) + 8 * U * abs(g_old[j])
            assert abs(g_old[j] - g_new[j]) <= bound
    # the same curvature and gradients: float32 weights whose updates differ by far less than their rounding
    assert torch.equal(w_before, w_after)


def test_one_point_has_no_spread_to_normalise():
    with pytest.raises(ConfigError, match="one member a step has no spread"):
        FitnessSpec(step_normalize=True, estimator="one_point")
    assert FitnessSpec(estimator="one_point").members(1) == step_members([0], "one_point")


# ---------------------------------------------------------------------- a run, before and after
@pytest.fixture()
def factory(tiny_tokenizer):
    from conftest import make_tiny_causal_lm
    from mezo_rl.model.lm import LanguageModel

    return lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)


def _train(args, factory):
    from test_trainer import splits

    from mezo_rl.tasks import get_task
    from mezo_rl.training.trainer import MeZOTrainer

    trainer = MeZOTrainer(args=args, lm=factory(), lm_factory=factory, task=get_task("sst2"), splits=splits())
    trainer.train()
    return trainer


def test_a_run_normalised_by_the_engine_replays_and_matches_the_fitness_normalised_run(tmp_path, factory,
                                                                                      monkeypatch):
    """The same --peft norm run (its mode normalises the step: Rademacher z, n_spsa 2, eps 0.1) made as the
    trainer made it before (the engine's step_normalize="std", the fitness's losses raw) and as it makes it now. The
    old run's trajectory replays bit for bit; both runs end at the same weights (each coefficient agrees to the
    bound in the module docstring, some 1e-15 of it, far inside a float32 weight's rounding), with projected
    gradients within that bound; and the old run refuses --resume in one line, before it loads a model."""
    from mezo_rl.cli.checks import check_output_dir
    from mezo_rl.training import setup
    from mezo_rl.training.arguments import MeZOConfig
    from mezo_rl.training.rundir import CHECKPOINT_DIR, TRAJECTORY_FILE, load_run
    from mezo_rl.engine.trajectory import Trajectory

    def args(name, **kw):
        return MeZOConfig(model="tiny", task="sst2", reward=["cross_entropy"], peft="norm", max_steps=5,
                          per_device_train_batch_size=4, eval_steps=5, autocast="none", progress=False,
                          output_dir=str(tmp_path / name), num_train=24, num_eval=12, num_test=12,
                          load_best_model_at_end=False, **kw)

    new = _train(args("new"), factory)
    assert new.args.step_normalize == "std" and new.optimizer.config["step_normalize"] is None
    with monkeypatch.context() as m:  # the trainer as it was: the engine normalises, the fitness does not
        m.setattr(setup, "MeZO", lambda *a, **k: MeZO(*a, **{**k, "step_normalize": "std"}))
        m.setattr(FitnessSpec, "of", classmethod(lambda cls, a: cls(reward_shaping=a.reward_shaping, eps=a.eps)))
        old = _train(args("old"), factory)
    assert old.optimizer.config["step_normalize"] == "std"
    old_final = [p.detach().clone() for p in old.lm.model.parameters()]

    replayed, _, step = load_run(tmp_path / "old", "final", lm=factory())
    assert step == 5 and all(torch.equal(a, b) for a, b in zip(replayed.model.parameters(), old_final))
    assert all(torch.equal(a, b) for a, b in zip(new.lm.model.parameters(), old_final))

    t_old = Trajectory.load(tmp_path / "old" / CHECKPOINT_DIR / TRAJECTORY_FILE)
    t_new = Trajectory.load(tmp_path / "new" / CHECKPOINT_DIR / TRAJECTORY_FILE)
    assert t_old.header["step_normalize"] == "std" and t_new.header["step_normalize"] is None
    eps = 0.1
    for row_old, row_new in zip(t_old, t_new):
        raw, new_values = list(row_old.values[: row_old.calls]), list(row_new.values[: row_new.calls])
        assert new_values == step_normalised(raw, step_members([0, 1], "two_point"), eps)  # the same raw losses
        for j, (a, b) in enumerate(zip(row_old.projected_grads, row_new.projected_grads)):
            bound = U * (abs(new_values[2 * j]) + abs(new_values[2 * j + 1])) / (2 * eps) + 8 * U * abs(a)
            assert abs(a - b) <= bound

    resumed = dataclasses.replace(args("old"), max_steps=8, resume=True)
    with pytest.raises(ConfigError, match=r"normalize='std'") as refused:
        check_output_dir(resumed)  # the command line's check, before any model loads
    assert "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match=r"normalize='std'"):
        _train(resumed, factory)
    # the same run as recorded before MeZO's normalize became step_normalize: its header read under the new name
    path = tmp_path / "old" / CHECKPOINT_DIR / TRAJECTORY_FILE
    t_old.header = {("normalize" if k == "step_normalize" else k): v for k, v in t_old.header.items()}
    t_old.save(path)
    with pytest.raises(ConfigError, match=r"step_normalize='std'"):
        check_output_dir(resumed)
