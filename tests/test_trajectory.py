"""The trajectory: a compact log of a run from which replay rebuilds the final weights exactly."""
import copy
import math

import pytest
import torch

from engine_problems import SMALL_SHAPES as SHAPES, make_problem as _make_problem, messy_run, run
from mezo_rl.engine.optim import MeZO, replay_trajectory
from mezo_rl.engine.trajectory import Trajectory


def make_problem():
    return _make_problem(SHAPES, rank=16)[:2]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("kw", [dict(n_spsa=2), dict(momentum=0.5), dict(adam=True),
                                dict(estimator="one_point", lr=0.01, eps=0.01)])
def test_replay_rebuilds_final_weights_bit_identically(kw, tmp_path):
    params, loss_fn = make_problem()
    initial = [p.detach().clone().requires_grad_() for p in params]
    opt = messy_run(params, loss_fn, **kw)
    assert sorted(set(opt.trajectory.status.tolist())) == [0, 1, 2]
    lrs = opt.trajectory.lrs
    assert lrs[0, 1] == 0.05 and lrs[29, 0] == pytest.approx(lrs[0, 0] * 11 / 40)
    opt.trajectory.save(tmp_path / "run.traj")
    replay_trajectory(initial, Trajectory.load(tmp_path / "run.traj"))
    for p, q in zip(params, initial):
        assert torch.equal(p, q)


def test_replay_rejects_mismatched_parameters():
    params, loss_fn = make_problem()
    opt = run(params, loss_fn, 2, lr=0.1)
    with pytest.raises(ValueError, match="shapes"):
        replay_trajectory([torch.zeros(3)], opt.trajectory)
    with pytest.raises(ValueError, match="dtypes"):
        replay_trajectory([torch.zeros(s, dtype=torch.float64) for s in SHAPES], opt.trajectory)


def test_trajectory_of_20000_steps_is_under_1_mb(tmp_path):
    params, loss_fn = make_problem()
    opt = MeZO(params, lr=0.1, noise_backend="torch")
    opt.step(loss_fn)  # fills the header
    traj = Trajectory(opt.trajectory.header)
    g = torch.Generator().manual_seed(0)
    losses = (torch.rand(20_000, 2, generator=g, dtype=torch.float64) + 1).tolist()
    for t in range(20_000):  # a linear schedule: a different lr every step
        traj.append(seeds=[t], values=losses[t], projected_grads=[(losses[t][0] - losses[t][1]) / 2e-3],
                    lrs=[1e-6 * (1 - t / 20_000)], epss=[1e-3], status=0, calls=2)
    traj.save(tmp_path / "t.npz")
    size = (tmp_path / "t.npz").stat().st_size
    assert size < 1_000_000, size
    back = Trajectory.load(tmp_path / "t.npz")
    assert (back.values == traj.values).all() and (back.lrs == traj.lrs).all() and back.header == traj.header



def test_tiny_language_model_step_and_replay(tiny_causal_lm):
    """A real transformers model: only trainable tensors move, and replay is bit-identical."""
    model, tok = tiny_causal_lm
    for name, p in model.named_parameters():
        p.requires_grad_("layers.1" in name)  # train one block, freeze the rest
    initial = copy.deepcopy(model)
    ids = torch.tensor([tok("It was great . It was terrible .")["input_ids"]])

    def closure():
        return model(input_ids=ids, labels=ids).loss

    opt = MeZO(model.parameters(), lr=1e-2, eps=1e-3, noise_backend="torch")
    first = closure().item()
    for _ in range(30):
        opt.step(closure)
    assert math.isfinite(closure().item()) and closure().item() != first
    for (name, p), q in zip(model.named_parameters(), initial.parameters()):
        assert torch.equal(p, q) == ("layers.1" not in name), name
    replay_trajectory(initial, opt.trajectory)
    for p, q in zip(model.parameters(), initial.parameters()):
        assert torch.equal(p, q)


def test_resumed_run_replays_from_its_checkpointed_trajectory():
    params, loss_fn = make_problem()
    initial = [p.detach().clone().requires_grad_() for p in params]
    opt = run(params, loss_fn, 10, lr=0.5, momentum=0.5)
    sd = copy.deepcopy(opt.state_dict())
    opt = MeZO(params, lr=0.5, momentum=0.5, noise_backend="torch")
    opt.load_state_dict(sd)
    for _ in range(10):
        opt.step(loss_fn)
    assert len(opt.trajectory) == 20
    replay_trajectory(initial, opt.trajectory)
    assert all(torch.equal(p, q) for p, q in zip(params, initial))


def test_trajectory_columns_and_header():
    params, loss_fn = make_problem()
    opt = run(params, loss_fn, 5, lr=0.5, n_spsa=3, seed=2)
    t = opt.trajectory
    assert t.seeds.shape == (5, 3) and t.seeds[4, 2] == 2 * 2**32 + 14
    assert t.values.shape == (5, 6) and t.projected_grads.shape == (5, 3)
    assert torch.allclose(torch.from_numpy(t.projected_grads),
                          torch.from_numpy((t.values[:, 0::2] - t.values[:, 1::2]) / 2e-3))
    assert t.header["noise_backend"] == "torch" and t.header["param_shapes"] == [list(s) for s in SHAPES]
    with pytest.raises(ValueError, match="not a MeZO trajectory"):
        Trajectory.from_state_dict({"format": "something else"})


@pytest.mark.slow  # compiles the noise kernels
def test_replay_with_compiled_noise_backend():
    params, loss_fn = make_problem()
    initial = [p.detach().clone().requires_grad_() for p in params]
    opt = run(params, loss_fn, 20, lr=0.5, noise_backend="compiled")
    assert opt.trajectory.header["noise_backend"] == "compiled"
    replay_trajectory(initial, opt.trajectory)
    assert all(torch.equal(p, q) for p, q in zip(params, initial))
