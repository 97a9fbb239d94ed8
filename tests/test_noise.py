"""Noise z(seed, tensor): a pure function of its key, independent across tensors and steps."""
import pytest
import torch
from scipy import stats

from mezo_rl.engine import noise


def test_tensor_key_depends_on_seed_position_and_shape_only():
    k = noise.tensor_key(3, 5, (4, 6))
    assert k == noise.tensor_key(3, 5, torch.Size([4, 6]))
    others = {noise.tensor_key(4, 5, (4, 6)), noise.tensor_key(3, 6, (4, 6)), noise.tensor_key(3, 5, (6, 4)),
              noise.tensor_key(3, 5, (24,))}
    assert k not in others and len(others) == 4
    assert 0 <= k < 2**64


@pytest.mark.parametrize("kind", ["gaussian", "rademacher"])
def test_torch_backend_is_a_pure_function_of_the_key(kind):
    rng_before = torch.get_rng_state()
    a = noise.generate(123, 10_000, kind, "torch")
    torch.randn(1000)  # unrelated use of the global RNG in between changes nothing
    b = noise.generate(123, 10_000, kind, "torch")
    c = noise.generate(124, 10_000, kind, "torch")
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    torch.set_rng_state(rng_before)
    noise.generate(999, 100, kind, "torch")
    assert torch.equal(torch.get_rng_state(), rng_before), "noise must not touch the global RNG"


Z_REJECT = 5.33  # two-sided normal quantile of p = 1e-7: a correct generator fails one check in ~10 million runs


def _check_distribution(z, kind):
    """Moments against their sampling error (standard error * Z_REJECT, from the n draws) and, for
    Gaussian noise, a Kolmogorov-Smirnov test against N(0, 1) rejected only at p < 1e-6."""
    n = z.numel()
    z = z.double()
    assert abs(z.mean().item()) < Z_REJECT / n**0.5  # sd of the mean of a unit-variance variable
    if kind == "rademacher":
        assert set(z.unique().tolist()) == {-1.0, 1.0}
        return
    # Var(z^2) = E z^4 - 1 = 2 and Var(z^4) = E z^8 - (E z^4)^2 = 105 - 9 = 96 for a standard normal
    assert abs((z**2).mean().item() - 1.0) < Z_REJECT * (2 / n) ** 0.5
    assert abs((z**4).mean().item() - 3.0) < Z_REJECT * (96 / n) ** 0.5
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-6


@pytest.mark.parametrize("kind", ["gaussian", "rademacher"])
def test_torch_backend_distribution(kind):
    _check_distribution(noise.generate(7, 200_000, kind, "torch"), kind)


def test_axpy_perturb_restore_and_fused_update_torch_backend():
    torch.manual_seed(0)
    p = torch.randn(1000)
    p0 = p.clone()
    key = 42
    z = noise.generate(key, 1000, "gaussian", "torch")
    u = torch.finfo(torch.float32).eps / 2
    # float32 rounding, elementwise: every intermediate is at most M = |p0| + (|a| + |a| + |b|) |z| in size (c <= 1),
    # and each rounding (a coefficient to float32, a product, a sum) errs by at most u M. Count them on both sides.
    noise.axpy_(p, key, "gaussian", "torch", a=1e-3)
    m = p0.abs() + 1e-3 * z.abs()
    assert ((p - (p0 + 1e-3 * z)).abs() <= (3 + 3) * u * m).all()  # alpha, product, sum on each side
    noise.axpy_(p, key, "gaussian", "torch", a=-1e-3, b=-0.1, c=0.9)  # restore, decay, update
    m = p0.abs() + (2e-3 + 0.1) * z.abs()
    # ours: 3 (first call) + 3 (add) + 2 (mul) + 3 (add); the reference: 0.9 and its product, 0.1 and its product, the sum
    assert ((p - (p0 * 0.9 - 0.1 * z)).abs() <= (11 + 5) * u * m).all()


def test_exact_mode_round_trip_is_bit_exact_on_dyadic_weights():
    # weights with few significant bits (like dequantised GGUF weights): +eps, -2eps, +eps is exact
    torch.manual_seed(0)
    p = torch.round(torch.randn(10_000) * 256) / 256
    p0 = p.clone()
    for seed in range(20):
        for a in (2**-10, -2 * 2**-10, 2**-10):
            noise.axpy_(p, seed, "rademacher", "torch", a=a)
    assert torch.equal(p, p0)


def test_errors_name_what_is_accepted():
    with pytest.raises(ValueError, match="gaussian"):
        noise.generate(0, 10, "uniform", "torch")
    with pytest.raises(ValueError, match="auto"):
        noise.resolve_backend("numpy")
    with pytest.raises(ValueError, match="contiguous"):
        noise.axpy_(torch.zeros(4, 4).t(), 0, "gaussian", "torch", a=1.0)


@pytest.mark.slow  # compiling the two kernels takes ~10-30 s on 2 cores
@pytest.mark.parametrize("kind", ["gaussian", "rademacher"])
def test_compiled_backend(kind):
    a = noise.generate(5, 300_001, kind, "compiled")
    assert torch.equal(a, noise.generate(5, 300_001, kind, "compiled"))
    assert not torch.equal(a[:1000], noise.generate(6, 1000, kind, "compiled"))
    _check_distribution(a, kind)
    # independent tensors: noise of two keys is uncorrelated
    b = noise.generate(noise.tensor_key(5, 1, (300_001,)), 300_001, kind, "compiled")
    assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1].item()) < 0.01
    # the fused in-place kernel uses the same z as generate()
    p = torch.zeros(300_001)
    noise.axpy_(p, 5, kind, "compiled", a=0.5, b=0.25, c=1.0)
    # 0.5 z and 0.25 z are exact (powers of two); their sum and 0.75 * z each round once: u * 0.75 |z| per side
    assert ((p - 0.75 * a).abs() <= 2 * (torch.finfo(torch.float32).eps / 2) * 0.75 * a.abs()).all()
    p16 = torch.zeros(1000, dtype=torch.bfloat16)
    noise.axpy_(p16, 5, kind, "compiled", a=1.0)
    assert torch.equal(p16, noise.generate(5, 1000, kind, "compiled").to(torch.bfloat16))


@pytest.mark.slow  # compiles the kernel for two dtypes and two ranks
def test_a_compiled_sweep_is_the_per_tensor_kernel_bit_for_bit():
    """NoiseSpec.sweep_ on the compiled backend (one key and coefficient table a sweep) gives every tensor what
    axpy_ alone gives it, bit for bit, in float32 and bfloat16, with the restore-and-update coefficients."""
    g = torch.Generator().manual_seed(0)
    ps = [torch.randn(17, 9, generator=g), torch.randn(9, generator=g), torch.randn(17, 9, generator=g).bfloat16(),
          torch.randn(33, generator=g).bfloat16()]
    coefs = [(1e-3, 0.0, 1.0), (-2e-3, 0.0, 1.0), (1e-3, -0.05, 0.99), (0.5, 0.25, 1.0)]
    for kind in ("gaussian", "rademacher"):
        spec = noise.NoiseSpec(kind=kind, backend="compiled")
        swept, alone = [p.clone() for p in ps], [p.clone() for p in ps]
        spec.sweep_(list(enumerate(swept)), 7, coefs)
        for i, (p, (a, b, c)) in enumerate(zip(alone, coefs)):
            noise.axpy_(p, noise.tensor_key(7, i, p.shape), kind, "compiled", a=a, b=b, c=c)
        assert all(torch.equal(x, y) for x, y in zip(swept, alone))
        assert not torch.equal(swept[0], ps[0])
