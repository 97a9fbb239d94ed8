"""Engine options added after the first trajectory format: the loss-scale-normalised step
(``step_normalize="std"``), low-rank noise (``noise="lowrank"``), and loading/replaying trajectories
written by the first format."""
import json
import math
import pathlib

import numpy as np
import pytest
import torch

from engine_problems import SMALL_SHAPES, make_problem, messy_run, run
from mezo_rl.engine.noise import NoiseSpec, layout
from mezo_rl.engine.optim import MeZO, get_scheduler, replay_trajectory
from mezo_rl.engine.trajectory import Trajectory

pytestmark = pytest.mark.usefixtures("one_thread")
DATA = pathlib.Path(__file__).parent / "data"


# -- step_normalize="std" (FZOO-style) ---------------------------------------------------------------
def test_normalised_projected_gradient_is_the_difference_over_twice_the_spread():
    params, loss_fn, _ = make_problem(SMALL_SHAPES)
    opt = MeZO(params, lr=0.1, eps=1e-3, n_spsa=3, step_normalize="std", noise_backend="torch")
    res = opt.step(loss_fn)
    sigma = float(np.std(res.values))  # population std of all 2n values
    assert res.spread == pytest.approx(sigma, rel=1e-12)
    expected = [(res.values[2 * j] - res.values[2 * j + 1]) / (2 * sigma) for j in range(3)]
    assert res.projected_grads == pytest.approx(expected, rel=1e-12)
    # n = 1: the spread of two values is |l+ - l-| / 2, so the step is a sign step of length lr
    res = MeZO(params, lr=0.1, step_normalize="std", noise_backend="torch").step(loss_fn)
    assert abs(res.projected_grads[0]) == 1.0


def test_normalised_step_does_not_depend_on_the_loss_scale():
    """Scaling the loss by 2**10 (exact in floating point) leaves every step bit-identical."""
    finals = []
    for scale in (1.0, 2.0**10):
        params, loss_fn, _ = make_problem(SMALL_SHAPES)
        run(params, lambda: scale * loss_fn(), 10, lr=0.05, n_spsa=2, step_normalize="std")
        finals.append([p.detach().clone() for p in params])
    assert all(torch.equal(a, b) for a, b in zip(*finals))


def test_equal_values_make_no_update():
    """Zero spread (every closure value equal, e.g. a flat accuracy): the weights do not move.
    Exact mode (Rademacher z, power-of-two eps, dyadic weights) makes 'do not move' bit-exact."""
    w = (torch.round(torch.randn(300, generator=torch.Generator().manual_seed(0)) * 64) / 64).requires_grad_()
    before = w.detach().clone()
    opt = MeZO([w], lr=0.1, eps=2**-10, noise="rademacher", step_normalize="std", noise_backend="torch")
    res = opt.step(lambda: 0.75)
    assert res.spread == 0.0 and res.projected_grads == [0.0]
    assert torch.equal(w, before)


@pytest.mark.parametrize("noise_kind", ["gaussian", "rademacher"])
@pytest.mark.parametrize("n_spsa", [1, 4])
def test_normalised_step_reduces_a_quadratic(noise_kind, n_spsa):
    params, loss_fn, _ = make_problem()
    start = loss_fn().item()
    opt = MeZO(params, lr=0.05, eps=1e-3, n_spsa=n_spsa, noise=noise_kind, step_normalize="std", noise_backend="torch")
    sched = get_scheduler("linear", opt, total_steps=100)
    for _ in range(100):
        opt.step(loss_fn)
        sched.step()
    assert loss_fn().item() < 0.1 * start


def _error_rate_problem():
    """A step-function objective: the error rate of a linear classifier (20 weights as a 4 x 5
    matrix) on 512 points labelled by a random teacher. Piecewise constant in the weights."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 20, generator=g)
    y = x @ torch.randn(20, generator=g) > 0
    w = torch.randn(4, 5, generator=g).requires_grad_()
    return w, lambda: ((x @ w.reshape(-1) > 0) != y).float().mean()


@pytest.mark.parametrize("n_spsa, below", [(1, 0.35), (4, 0.15)])
def test_normalised_rademacher_step_reduces_an_error_rate(n_spsa, below):
    w, error = _error_rate_problem()
    assert error().item() > 0.6
    run([w], error, 150, lr=0.1, eps=0.05, n_spsa=n_spsa, noise="rademacher", step_normalize="std")
    assert error().item() < below


def test_an_earlier_keyword_is_refused_naming_its_successor():
    with pytest.raises(TypeError, match=r"^MeZO\(\.\.\., normalize=\.\.\.\) is now MeZO\(\.\.\., step_normalize=\.\.\.\)$"):
        MeZO([torch.zeros(3, requires_grad=True)], normalize="std")
    with pytest.raises(TypeError, match=r"^MeZO\(\.\.\., evaluation=\.\.\.\) is now MeZO\(\.\.\., member_evaluation=\.\.\.\)$"):
        MeZO([torch.zeros(3, requires_grad=True)], evaluation="batched")
    with pytest.raises(TypeError, match="unexpected keyword argument 'normalise'"):
        MeZO([torch.zeros(3, requires_grad=True)], normalise="std")


def test_a_checkpoint_recorded_under_the_earlier_names_resumes_as_the_run_would_have():
    """A state dict whose config, param groups and trajectory header say ``normalize`` (MeZO's name for
    ``step_normalize`` before the rename) loads and continues bit for bit; the new ones record the new name."""
    def make():
        g = torch.Generator().manual_seed(5)
        return [torch.randn(4, 3, generator=g).requires_grad_(), torch.randn(5, generator=g).requires_grad_()]

    def loss(params):
        return lambda: sum((p.detach() - 0.5).pow(2).sum() for p in params)

    options = dict(lr=0.05, eps=1e-2, n_spsa=2, step_normalize="std", noise_backend="torch", seed=3)
    straight = make()
    opt = MeZO(straight, **options)
    for _ in range(4):
        opt.step(loss(straight))
    params = make()
    first = MeZO(params, **options)
    for _ in range(2):
        first.step(loss(params))
    sd = first.state_dict()
    old = lambda d: {("normalize" if k == "step_normalize" else k): v for k, v in d.items()}  # noqa: E731
    sd["mezo"]["config"] = old(sd["mezo"]["config"])
    sd["mezo"]["trajectory"]["header"] = json.dumps(old(json.loads(sd["mezo"]["trajectory"]["header"])))
    sd["param_groups"] = [old(g) for g in sd["param_groups"]]
    resumed = MeZO(params, **options)
    resumed.load_state_dict(sd)
    for _ in range(2):
        resumed.step(loss(params))
    assert all(torch.equal(a, b) for a, b in zip(params, straight))
    assert resumed.trajectory.header["step_normalize"] == "std" and "normalize" not in resumed.trajectory.header
    assert "normalize" not in resumed.param_groups[0] and resumed.state_dict()["mezo"]["config"]["step_normalize"] == "std"


def test_step_normalize_arguments_are_checked():
    with pytest.raises(ValueError, match="'std'"):
        MeZO([torch.zeros(3, requires_grad=True)], step_normalize="max")
    with pytest.raises(ValueError, match="two-point"):
        MeZO([torch.zeros(3, requires_grad=True)], step_normalize="std", estimator="one_point")


# -- replay of every new option, and of the first trajectory format -------------------------------
@pytest.mark.parametrize("kw", [
    dict(step_normalize="std", n_spsa=2), dict(step_normalize="std", noise="rademacher", momentum=0.5),
    dict(noise="lowrank", rank=2), dict(noise="lowrank", rank=3, lowrank_interval=4, n_spsa=2),
    dict(noise="lowrank", rank=1, adam=True), dict(noise="lowrank", rank=2, step_normalize="std"),
    dict(noise="lowrank", rank=1, n_spsa=2, hessian_smooth=0.3, second_eps=1e-3),
    dict(noise="lowrank", step_normalize="std", hessian_smooth=0.3, second_eps=1e-3),
])
def test_new_options_replay_bit_identically(kw, tmp_path):
    params, loss_fn, _ = make_problem(SMALL_SHAPES)
    initial = [p.detach().clone().requires_grad_() for p in params]
    opt = messy_run(params, loss_fn, steps=15, **kw)
    assert sorted(set(opt.trajectory.status.tolist())) == [0, 1, 2]
    opt.trajectory.save(tmp_path / "run.npz")
    replay_trajectory(initial, Trajectory.load(tmp_path / "run.npz"))
    assert all(torch.equal(p, q) for p, q in zip(params, initial))


def _v1_initial():
    g = torch.Generator().manual_seed(1234)
    return [torch.randn(6, 5, generator=g).requires_grad_(), torch.randn(7, generator=g).requires_grad_(),
            torch.randn(4, generator=g)]


@pytest.mark.parametrize("name", ["sgd", "momentum"])
def test_first_format_trajectory_loads_and_replays_bit_identically(name):
    """tests/data/trajectory_v1_*.npz were written by the first trajectory format (7-tuple rows,
    no normalize/rank in the header), with the final weights of the run next to them; the runs
    used groups, weight decay, a linear schedule, n-SPSA or momentum, a skipped and an aborted step."""
    traj = Trajectory.load(DATA / f"trajectory_v1_{name}.npz")
    assert "normalize" not in traj.header and len(traj) == 12
    params = _v1_initial()
    replay_trajectory(params, traj)
    with np.load(DATA / f"trajectory_v1_{name}_final.npz") as final:
        for i, p in enumerate(params):
            assert torch.equal(p.detach(), torch.from_numpy(final[f"arr_{i}"])), i


def test_first_format_checkpoint_resumes():
    """A state dict whose config and trajectory header predate the new options loads and continues."""
    params = _v1_initial()
    traj = Trajectory.load(DATA / "trajectory_v1_sgd.npz")
    h = traj.header
    groups = [{"params": params[:1], "weight_decay": 0.01}, {"params": params[1:], "lr": 0.05, "eps": 2e-3}]
    # the first-format run used Gaussian z (then the default)
    opt = MeZO(groups, lr=0.1, eps=1e-3, n_spsa=2, noise="gaussian", noise_backend="torch", on_nonfinite="skip", seed=7)
    sd = opt.state_dict()
    old_config = {k: v for k, v in sd["mezo"]["config"].items() if k not in ("step_normalize", "rank", "lowrank_interval", "member_evaluation",
                                                                                "hessian_smooth", "rounding")}
    assert old_config == {k: h[k] for k in old_config}
    sd["mezo"].update(config=old_config, samples=24, trajectory=traj.state_dict(), backend="torch")
    sd["param_groups"] = [{k: g[k] for k in ("lr", "eps", "weight_decay", "params")} for g in sd["param_groups"]]
    replay_trajectory(params, traj)
    opt.load_state_dict(sd)
    opt.step(lambda: sum(p.detach().pow(2).sum() for p in params))
    assert len(opt.trajectory) == 13 and opt.trajectory[-1].seeds == (7 * 2**32 + 24, 7 * 2**32 + 25)


# -- the noise format: runs recorded before the fused low-rank draws ------------------------------
def _noise1_initial():
    g = torch.Generator().manual_seed(4321)
    return [torch.randn(6, 5, generator=g).requires_grad_(), torch.randn(7, generator=g).requires_grad_(),
            torch.randn(4, 3, generator=g).requires_grad_()]


def test_an_elementwise_run_recorded_before_the_noise_format_replays_bit_identically():
    """tests/data/trajectory_noise1_gaussian.npz: 6 steps of Gaussian noise (torch backend, two groups, weight
    decay), recorded by the code before fused sweeps, with its final weights; element-wise noise is unchanged."""
    traj = Trajectory.load(DATA / "trajectory_noise1_gaussian.npz")
    assert "noise_format" not in traj.header and traj.header["noise"] == "gaussian"
    params = _noise1_initial()
    replay_trajectory(params, traj)
    with np.load(DATA / "trajectory_noise1_gaussian_final.npz") as final:
        assert all(torch.equal(p.detach(), torch.from_numpy(final[f"arr_{i}"])) for i, p in enumerate(params))


def test_a_lowrank_run_recorded_before_the_fused_draws_is_refused_in_one_line():
    """tests/data/trajectory_noise1_lowrank.npz: the same run with low-rank noise (then drawn tensor by tensor); this
    version draws other numbers, so replaying or resuming it is refused, naming the format, before any sweep."""
    traj = Trajectory.load(DATA / "trajectory_noise1_lowrank.npz")
    params = _noise1_initial()
    before = [p.detach().clone() for p in params]
    with pytest.raises(ValueError, match="format 1") as err:
        replay_trajectory(params, traj)
    assert "\n" not in str(err.value) and "format 2" in str(err.value)
    assert all(torch.equal(p, q) for p, q in zip(params, before))
    opt = MeZO([{"params": params[:2], "weight_decay": 0.01}, {"params": params[2:], "lr": 0.05}], lr=0.1, eps=1e-3,
               seed=3)
    sd = opt.state_dict()
    del sd["mezo"]["noise_format"]  # a checkpoint written before the key existed
    sd["mezo"].update(samples=6, trajectory=traj.state_dict(), backend="torch")
    with pytest.raises(ValueError, match="format 1"):
        opt.load_state_dict(sd)
    with pytest.raises(ValueError, match="format 1"):
        opt.replay(traj)


def test_new_runs_record_the_noise_format_and_replay_bit_identically():
    params = _noise1_initial()
    initial = [p.detach().clone().requires_grad_() for p in params]
    target = [torch.linspace(-1, 1, p.numel()).view(p.shape) for p in params]
    opt = MeZO([{"params": params[:2], "weight_decay": 0.01}, {"params": params[2:], "lr": 0.05}], lr=0.1, eps=1e-3,
               seed=3, n_spsa=2)
    for _ in range(6):
        opt.step(lambda: sum(((p - t) ** 2).sum() for p, t in zip(params, target)))
    assert opt.trajectory.header["noise_format"] == 2 and opt.trajectory.header["noise"] == "lowrank"
    replay_trajectory(initial, opt.trajectory)
    assert all(torch.equal(p, q) for p, q in zip(params, initial))
    resumed = MeZO([{"params": initial[:2], "weight_decay": 0.01}, {"params": initial[2:], "lr": 0.05}], lr=0.1,
                   eps=1e-3, seed=3, n_spsa=2)
    resumed.load_state_dict(opt.state_dict())  # a checkpoint of this format resumes


# -- the trajectory as data -----------------------------------------------------------------------
def test_trajectory_rows_and_slices():
    params, loss_fn, _ = make_problem(SMALL_SHAPES)
    initial = [p.detach().clone().requires_grad_() for p in params]
    opt = run(params, loss_fn, 6, lr=0.1, n_spsa=2)
    traj = opt.trajectory
    row = traj[3]
    assert row.seeds == (6, 7) and row.calls == 4 and row.status == 0 and len(row.values) == 4
    head = traj[:4]
    assert isinstance(head, Trajectory) and len(head) == 4 and head.header == traj.header
    assert np.array_equal(head.values, traj.values[:4]) and [r.seeds for r in head] == [r.seeds for r in traj][:4]
    # replaying a prefix gives the weights after those steps
    replay_trajectory(initial, head)
    params2, loss_fn2, _ = make_problem(SMALL_SHAPES)
    run(params2, loss_fn2, 4, lr=0.1, n_spsa=2)
    assert all(torch.equal(p, q) for p, q in zip(params2, initial))


# -- low-rank noise ------------------------------------------------------------------------------
@pytest.mark.parametrize("rank", [1, 4])
def test_lowrank_estimator_is_unbiased_on_a_quadratic(rank):
    """The mean of (l+ - l-)/(2 eps) z over N steps at fixed weights matches the exact gradient
    within 5 standard errors per coordinate (standard error = the sample std of the single-step
    estimates / sqrt(N)); float64 weights, so rounding is negligible next to that."""
    shapes = [(6, 5), (4, 3, 2), (7,)]  # a matrix, a 3-D tensor viewed as 4 x 6, a 1-D tensor
    params, loss_fn, grad_fn = make_problem(shapes, rank=6, dtype=torch.float64)
    with torch.no_grad():
        for p in params:
            p.add_(0.3)
    exact = torch.cat([g.reshape(-1) for g in grad_fn()])
    opt = MeZO(params, lr=0.0, eps=1e-4, noise="lowrank", rank=rank, noise_backend="torch", record=False)
    n = 4000
    estimates = torch.empty(n, exact.numel(), dtype=torch.float64)
    for t in range(n):
        res = opt.step(loss_fn)
        z = torch.cat([opt._noise.sample(p, res.seeds[0], i).reshape(-1) for i, p in enumerate(params)])
        estimates[t] = res.projected_grads[0] * z.double()
    mean, stderr = estimates.mean(0), estimates.std(0) / math.sqrt(n)
    assert ((mean - exact).abs() <= 5 * stderr).all(), ((mean - exact) / stderr).abs().max()
    # and it is low rank: the perturbation of the matrix has rank r
    z0 = opt._noise.sample(params[0], 123, 0)
    assert torch.linalg.matrix_rank(z0).item() == min(rank, 5)  # float32 tolerance


def test_default_noise_is_rank_one_lowrank_without_a_compiler():
    """The default (chosen by measured convergence and step cost, docs/engine.md): rank-1 low-rank z
    for matrices, Gaussian for 1-D tensors, drawn by torch.Generator, so the default step never loads
    the torch.compile runtime (the peak-memory target); and its update moves a matrix by a rank-1 matrix."""
    w, b = torch.zeros(6, 5, requires_grad=True), torch.zeros(5, requires_grad=True)
    opt = MeZO([w, b], lr=0.1, eps=1e-3)
    assert (opt.defaults["noise"], opt.defaults["rank"]) == ("lowrank", 1)
    target = torch.arange(30.0).reshape(6, 5)
    opt.step(lambda: ((w - target) ** 2).sum() + (b ** 2).sum())
    assert opt.noise_backend == "torch"
    assert w.abs().sum() > 0 and torch.linalg.matrix_rank(w.detach()).item() == 1


def test_lowrank_factor_a_is_held_for_the_interval():
    p = torch.zeros(8, 6)
    spec = NoiseSpec("lowrank", "torch", rank=2, interval=3, layout=layout([(0, p)]))
    a = [spec.factors(p, 5 * 2**32 + k, 0)[1] for k in range(7)]
    b = [spec.factors(p, 5 * 2**32 + k, 0)[0] for k in range(7)]
    assert torch.equal(a[0], a[1]) and torch.equal(a[0], a[2]) and torch.equal(a[3], a[5])
    assert not torch.equal(a[2], a[3]) and not torch.equal(a[5], a[6])
    assert not torch.equal(b[0], b[1])


def test_lowrank_arguments_are_checked():
    for bad in (dict(rank=0), dict(lowrank_interval=0), dict(rank=1.5)):
        with pytest.raises(ValueError, match=">= 1"):
            MeZO([torch.zeros(3, requires_grad=True)], noise="lowrank", **bad)
    with pytest.raises(ValueError, match="whole run"):
        MeZO([{"params": [torch.zeros(3, requires_grad=True)], "noise": "rademacher"}])
