"""HiZOO's curvature (``MeZO(hessian_smooth=alpha)``, :mod:`mezo_rl.engine.curvature`): the factored update against
its dense definition, the preconditioned noise, what it learns on a quadratic, and the options it refuses."""
import math

import pytest
import torch

from mezo_rl.engine import noise
from mezo_rl.engine.curvature import Curvature
from mezo_rl.engine.optim import MeZO, replay_trajectory

SHAPES = [(3, 5), (7,), (4, 2, 3)]  # a matrix, a 1-D tensor, a 3-D tensor viewed as 4 x 6


def _spec():
    tensors = [(i, torch.zeros(s)) for i, s in enumerate(SHAPES)]
    return noise.NoiseSpec("lowrank", "torch", layout=noise.layout(tensors)), tensors


def test_the_factored_update_is_adafactors_projection_of_hizoos_dense_update():
    """Dense reference in float64: H_ij = R_i C_j; V = H ((1 - alpha) + alpha mean_s dL_s z_s^2); the new R is V's
    row sums over n, the new C its column sums over their mean; a 1-D tensor's H is V itself."""
    spec, tensors = _spec()
    curv = Curvature(spec)
    g = torch.Generator().manual_seed(0)
    curv.hb.uniform_(0.5, 2.0, generator=g)
    curv.ha.uniform_(0.5, 2.0, generator=g)
    # C at a mean of 1 per matrix, as the update keeps it
    cols = [math.prod(s[1:]) for s in SHAPES if len(s) >= 2]
    for start, n in zip([0, cols[0]], cols):
        curv.ha[start : start + n] /= curv.ha[start : start + n].mean()
    hb, ha = curv.hb.double().clone(), curv.ha.double().clone()
    seeds, alpha = [11, 12, 13], 0.2
    raws = [spec.raw(s) for s in seeds]
    dl = torch.tensor([3.0, 0.5, 7.0])
    curv.update(torch.stack([b for b, _ in raws]), torch.stack([a for _, a in raws]), dl, alpha)

    rows = [s[0] for s in SHAPES if len(s) >= 2]
    r_at, c_at, v_at = 0, 0, sum(rows)
    for shape in SHAPES:
        if len(shape) >= 2:
            m, n = shape[0], math.prod(shape[1:])
            R, C = hb[r_at : r_at + m], ha[c_at : c_at + n]
            H = torch.outer(R, C)
            z2 = [torch.outer(b[r_at : r_at + m].double(), a[c_at : c_at + n].double()) ** 2 for b, a in raws]
            V = H * ((1 - alpha) + alpha * sum(d * z for d, z in zip(dl.double(), z2)) / len(seeds))
            want_r, want_c = V.sum(1) / n, V.sum(0) / V.sum(0).mean()
            got_r, got_c = curv.hb[r_at : r_at + m].double(), curv.ha[c_at : c_at + n].double()
            # float32 sums of at most n + m terms of positive values: relative rounding below (n + m + 4) 2^-24
            tol = (n + m + 4) * 2.0**-24
            assert torch.allclose(got_r, want_r, rtol=tol, atol=0), (got_r, want_r)
            assert torch.allclose(got_c, want_c, rtol=tol, atol=0), (got_c, want_c)
            assert torch.allclose(torch.outer(got_r, got_c).sum(), V.sum(), rtol=2 * tol)  # the total is kept
            r_at, c_at = r_at + m, c_at + n
        else:
            k = shape[0]
            H = hb[v_at : v_at + k]
            z2 = [b[v_at : v_at + k].double() ** 2 for b, _ in raws]
            want = H * ((1 - alpha) + alpha * sum(d * z for d, z in zip(dl.double(), z2)) / len(seeds))
            assert torch.allclose(curv.hb[v_at : v_at + k].double(), want, rtol=8 * 2.0**-24, atol=0)
            v_at += k


def test_the_preconditioned_noise_is_the_curvatures_inverse_root_times_z():
    """After ``precondition``, every tensor's noise (in the sweeps, the batched factors and ``sample``) is
    z / sqrt(H) element by element, z the unscaled draw: for a matrix (R_i C_j)^-1/2 b_i a_j, still rank 1."""
    spec, tensors = _spec()
    curv = Curvature(spec)
    g = torch.Generator().manual_seed(1)
    curv.hb.uniform_(0.25, 4.0, generator=g)
    curv.ha.uniform_(0.25, 4.0, generator=g)
    plain = [spec.sample(p, 5, i) for i, p in tensors]
    spec.precondition(*curv.scales())
    r_at, c_at, v_at = 0, 0, 3 + 4
    for (i, p), z in zip(tensors, plain):
        got = spec.sample(p, 5, i)
        if p.dim() >= 2:
            m, n = p.shape[0], p[0].numel()
            want = z.view(m, n) * torch.outer(curv.hb[r_at : r_at + m], curv.ha[c_at : c_at + n]).rsqrt()
            r_at, c_at = r_at + m, c_at + n
            assert torch.linalg.matrix_rank(got.view(m, n)) == 1
        else:
            want = z * curv.hb[v_at : v_at + p.numel()].rsqrt()
        # two scaled factors and their product against the product scaled: a few float32 roundings
        assert torch.allclose(got.reshape(-1), want.reshape(-1), rtol=8 * 2.0**-24, atol=0), i
        # the in-place sweep adds the same noise
        q = torch.zeros_like(p)
        spec.sweep_([(i, q)], 5, [(1.0, 0.0, 1.0)])
        assert torch.allclose(q.reshape(-1), got.reshape(-1), rtol=8 * 2.0**-24, atol=0), i


def _quadratic_run(seed: int, steps: int):
    """MeZO with HiZOO on 0.5 sum h (x - 1)^2: a 1-D tensor with h = (100, 1, 1, 1) and a 3 x 4 matrix with
    h = r c^T, r = (30, 1, 1), c = (1, 1, 10, 1); lr 0, so that the curvature is measured at one point."""
    h, r, c = torch.tensor([100.0, 1, 1, 1]), torch.tensor([30.0, 1, 1]), torch.tensor([1.0, 1, 10, 1])
    w, W = torch.zeros(4, requires_grad=True), torch.zeros(3, 4, requires_grad=True)
    f = lambda: float(0.5 * (h * (w - 1) ** 2).sum() + 0.5 * (torch.outer(r, c) * (W - 1) ** 2).sum())  # noqa: E731
    opt = MeZO([w, W], lr=0.0, eps=1e-2, seed=seed, noise_backend="torch", hessian_smooth=0.01, n_spsa=2)
    for _ in range(steps):
        opt.step(f)
    return opt._curvature


def test_the_curvature_grows_where_the_loss_is_curved():
    """HiZOO's H has its fixed point where h_i / H_i is the same for every i (the step's dL z_i^2 then grows
    every entry alike), so H's ratios move towards h's. The stiff entries' H leads the others' by more
    than the square root of the true ratio (half of it in logs) after 1000 steps."""
    curv = _quadratic_run(seed=1, steps=1000)
    R, H, C = curv.hb[:3], curv.hb[3:], curv.ha
    assert H[0] / H[1:].max() > math.sqrt(100)
    assert R[0] / R[1:].max() > math.sqrt(30)
    assert C[2] / C[[0, 1, 3]].max() > math.sqrt(10)


@pytest.mark.parametrize("kw, what", [(dict(estimator="es", n_spsa=2), "two-point"), (dict(noise="gaussian"), "lowrank"),
                                      (dict(rank=2), "rank=1"), (dict(hessian_smooth=1.0), "[0, 1)"),
                                      (dict(hessian_smooth=-0.1), "[0, 1)")])
def test_options_hizoo_cannot_serve_are_refused_in_one_line(kw, what):
    with pytest.raises(ValueError, match=r"hessian_smooth") as err:
        MeZO([torch.zeros(3, 2, requires_grad=True)], **{"hessian_smooth": 0.1, **kw})
    assert what in str(err.value) and "\n" not in str(err.value)


def test_groups_with_two_eps_are_refused_before_any_member_runs():
    w = torch.zeros(3, requires_grad=True)
    opt = MeZO([{"params": [w]}, {"params": [torch.zeros(2, requires_grad=True)], "eps": 2e-3}], hessian_smooth=0.1)
    calls = []
    with pytest.raises(ValueError, match="one eps") as err:
        opt.step(lambda: calls.append(1) or 0.0)
    assert not calls and "\n" not in str(err.value) and torch.equal(w, torch.zeros(3))


def test_noise_scale_summarises_the_dense_per_weight_scale():
    """rms, geometric mean and log-SD of H^-1/2 over every weight once (a matrix's H_ij = R_i C_j), against the
    dense float64 H; 1, 1 and 0 at the start. The factored sums reorder float64 additions of a few hundred terms:
    relative error below 1e3 float64 epsilons."""
    spec, _ = _spec()
    curv = Curvature(spec)
    assert curv.noise_scale() == {"rms": 1.0, "geomean": 1.0, "log_sd": 0.0}
    g = torch.Generator().manual_seed(1)
    curv.hb.uniform_(0.2, 5.0, generator=g)
    curv.ha.uniform_(0.2, 5.0, generator=g)
    hb, ha = curv.hb.double(), curv.ha.double()
    dense, r_at, c_at = [], 0, 0
    v_at = sum(s[0] for s in SHAPES if len(s) >= 2)
    for shape in SHAPES:
        if len(shape) >= 2:
            m, n = shape[0], math.prod(shape[1:])
            dense.append(torch.outer(hb[r_at : r_at + m], ha[c_at : c_at + n]).flatten())
            r_at, c_at = r_at + m, c_at + n
        else:
            dense.append(hb[v_at : v_at + shape[0]])
            v_at += shape[0]
    scale = torch.cat(dense).rsqrt()
    assert scale.numel() == sum(math.prod(s) for s in SHAPES)
    want = {"rms": scale.square().mean().sqrt(), "geomean": scale.log().mean().exp(),
            "log_sd": scale.log().std(correction=0)}
    got = curv.noise_scale()
    for k, v in want.items():
        assert got[k] == pytest.approx(float(v), rel=1e3 * 2.0**-52), k


def test_replay_shows_every_steps_curvature_as_the_run_had_it():
    """replay_trajectory's on_step(t, optimizer) sees, after row t, the curvature the run had after step t + 1."""
    w = torch.randn(6, 4, generator=torch.Generator().manual_seed(0)).requires_grad_()
    start = w.detach().clone()
    opt = MeZO([w], lr=1e-2, eps=1e-2, hessian_smooth=0.1, estimator="two_point", noise="lowrank", rank=1, seed=3)
    seen = []
    for _ in range(4):
        opt.step(lambda: float((w.detach() ** 2 * torch.arange(1.0, 25.0).view(6, 4)).sum()))
        seen.append(opt.curvature.state_dict())
    replayed = []
    again = start.clone().requires_grad_()
    replay_trajectory([again], opt.trajectory, on_step=lambda t, o: replayed.append((t, o.curvature.state_dict())))
    assert [t for t, _ in replayed] == [0, 1, 2, 3]
    for (_, got), want in zip(replayed, seen):
        assert all(torch.equal(got[k], want[k]) for k in ("hb", "ha"))
    assert torch.equal(again, w) and seen[0]["hb"].ne(1).any()
