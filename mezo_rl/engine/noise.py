"""Reproducible per-tensor noise for MeZO: z(seed, tensor), regenerated instead of stored.

MeZO never stores its random direction z. It regenerates it from a seed every time it needs it
(perturb +eps, perturb -2eps, restore and update), so z must be a pure function of

    (step seed, tensor identity)

and nothing else (not the global RNG, the order tensors are visited in, what ran before). The tensor identity is the tensor's position in the optimizer's flat parameter list
(param groups in order, then parameters in order) together with its shape; both are folded with
the step seed by splitmix64 into a 64-bit key (:func:`tensor_key`). Two tensors of one step get
independent noise; the same tensor at two steps gets independent noise.

Two generators ("backends") turn a key into z:

``"compiled"``
    A counter-based generator: element ``i`` of z is a hash of ``(i, key)`` written in integer
    torch ops (three rounds of a 32-bit multiply-xorshift mixer), turned into a Gaussian by
    Box-Muller or into a sign for Rademacher. :func:`torch.compile` fuses the counter, the hash,
    the transform and the parameter update ``p <- (p + a*z) * c + b*z`` into one kernel, so z is
    never materialised and every core is used. Compiled lazily on first use.
``"torch"``
    The CPU's ``torch.Generator`` seeded with the key, ``torch.randn`` / ``torch.randint``, copied to
    the parameter's device (a CUDA generator draws other numbers for the same seed: drawing on the CPU
    keeps a trajectory replayable on any device). Needs no compiler; materialises z for one tensor at
    a time (one temporary the size of the largest tensor) and is single-threaded, so it is slower.
``"auto"``
    ``"compiled"`` if compiling works here, else ``"torch"`` (with a warning).

The two backends draw *different* (equally valid) noise for the same key, so a run and its replay
must use the same backend; :class:`mezo_rl.engine.trajectory.Trajectory` records which one a run used.

Low-rank noise (:class:`NoiseSpec` with ``kind="lowrank"``) is drawn differently: for every tensor of the
optimizer's layout at once, from keys of the step seed, with ``torch.Generator`` (:class:`_Draw`), so that
a sweep of every tensor takes a number of operations that does not grow with the number of tensors. Its
numbers have a version, :data:`FORMAT`, which trajectories record.
Each backend draws the same numbers on every device (the compiled one's integer hash is exact; its
Box-Muller transform agrees to float rounding), so a run trained on a GPU replays on a CPU.
"""
from __future__ import annotations

import itertools
import math
import warnings
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property

import torch

from mezo_rl.choices import NOISES

__all__ = ["BACKENDS", "FORMAT", "KINDS", "NOISES", "NoiseSpec", "layout", "one_thread_on_cpu", "tensor_key",
           "generate", "axpy_", "resolve_backend"]

BACKENDS = ("torch", "compiled", "auto")
#: element-wise noise kinds (what :func:`generate` and :func:`axpy_` draw); NOISES adds low-rank matrices (:class:`NoiseSpec`)
KINDS = tuple(n for n in NOISES if n != "lowrank")

_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1


def _splitmix64(x: int) -> int:
    """One step of splitmix64 (Steele et al. 2014): a 64-bit bijective mixer on Python ints."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def tensor_key(seed: int, index: int, shape) -> int:
    """The 64-bit noise key of the tensor at position ``index`` (with ``shape``) at step ``seed``.

    >>> tensor_key(7, 0, (3, 4)) == tensor_key(7, 0, torch.Size([3, 4]))
    True
    >>> tensor_key(7, 0, (3, 4)) != tensor_key(7, 1, (3, 4)) != tensor_key(8, 0, (3, 4))
    True
    """
    h = _splitmix64(int(seed) & _M64)
    for v in (int(index), len(shape), *(int(s) for s in shape)):
        h = _splitmix64(h ^ (v & _M64))
    return h


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"noise kind must be one of {KINDS}, got {kind!r}")


# ----------------------------------------------------------------------------------------------
# "torch" backend: the CPU's torch.Generator seeded with the key, whatever the parameter's device.

_generator = torch.Generator()


def _torch_noise(key: int, numel: int, kind: str, device: torch.device) -> torch.Tensor:
    _generator.manual_seed(key)
    if kind == "gaussian":
        z = torch.randn(numel, generator=_generator, dtype=torch.float32)
    else:
        z = torch.randint(0, 2, (numel,), generator=_generator, dtype=torch.float32).mul_(2.0).sub_(1.0)
    return z.to(device)


# ----------------------------------------------------------------------------------------------
# "compiled" backend: a counter-based hash generator, fused into the update by torch.compile.

_MUL = 0x45D9F3B  # odd 27-bit multiplier of a well-mixing 32-bit xorshift-multiply hash


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int32 tensors (multiplication wraps modulo 2**32): the mixer of the
    compiled backend, z[i] = f(mix32(mix32(i ^ k1) ^ k2), ...) with ``hash_keys`` (public, so that other
    kernels can be built and timed on the same hash; benchmarks/engine_noise.py).

    int32 rather than int64 because AVX2 has a native 32-bit vector multiply and no 64-bit one.
    ``(x >> 16) & 0xFFFF`` is the logical shift (``>>`` on int32 is arithmetic).
    """
    x = (x ^ ((x >> 16) & 0xFFFF)) * _MUL
    x = (x ^ ((x >> 16) & 0xFFFF)) * _MUL
    return x ^ ((x >> 16) & 0xFFFF)


def _hash_noise(numel: int, keys: torch.Tensor, gaussian: bool, device) -> torch.Tensor:
    """z[i] for i < numel from keys = int32 tensor [k1, k2, k3]; float32."""
    i = torch.arange(numel, dtype=torch.int32, device=device)
    a = mix32(mix32(i ^ keys[0]) ^ keys[1])
    if not gaussian:
        return 1.0 - 2.0 * (a < 0).to(torch.float32)  # top bit -> -1, else +1
    b = mix32(a ^ keys[2])
    # Box-Muller on 24-bit uniforms: u1 in (0, 1), u2 in [0, 1)
    u1 = (((a >> 8) & 0xFFFFFF).to(torch.float32) + 0.5) * (2.0**-24)
    u2 = ((b >> 8) & 0xFFFFFF).to(torch.float32) * (2.0**-24)
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * math.pi) * u2)


def _hash_axpy(flat: torch.Tensor, keys: torch.Tensor, coef: torch.Tensor, gaussian: bool) -> None:
    """flat <- (flat + a*z) * c + b*z with coef = float32 [a, b, c], computed in float32."""
    z = _hash_noise(flat.numel(), keys, gaussian, flat.device)
    out = (flat.to(torch.float32) + coef[0] * z) * coef[2] + coef[1] * z
    flat.copy_(out.to(flat.dtype))


# One top-level function per (operation, kind): torch.compile keeps a cache of compiled variants per
# code object (dtypes, shapes of the viewed tensor), and separate code objects keep each cache small.
def _axpy_gaussian(flat, keys, coef):
    _hash_axpy(flat, keys, coef, True)


def _axpy_rademacher(flat, keys, coef):
    _hash_axpy(flat, keys, coef, False)


def _generate_gaussian(numel, keys, device):
    return _hash_noise(numel, keys, True, device)


def _generate_rademacher(numel, keys, device):
    return _hash_noise(numel, keys, False, device)


_IMPLS = {("axpy", "gaussian"): _axpy_gaussian, ("axpy", "rademacher"): _axpy_rademacher,
          ("generate", "gaussian"): _generate_gaussian, ("generate", "rademacher"): _generate_rademacher}
_compiled: dict[tuple[str, str], object] = {}


def _compiled_fn(name: str, kind: str):
    fn = _compiled.get((name, kind))
    if fn is None:
        # Each dtype (float32, bfloat16, float16) and each rank of the parameter behind the flat
        # view is a separately compiled variant; allow more than dynamo's default of 8.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        fn = _compiled[(name, kind)] = torch.compile(_IMPLS[(name, kind)], dynamic=True, fullgraph=True)
    return fn


def _key_words(key: int) -> list[int]:
    words = (key & _M32, key >> 32, _splitmix64(key) & _M32)
    return [w - (1 << 32) if w >= (1 << 31) else w for w in words]


def hash_keys(key: int, device) -> torch.Tensor:
    """The compiled backend's three 32-bit words [k1, k2, k3] of a noise key, as signed int32 (two's complement)."""
    return torch.tensor(_key_words(key), dtype=torch.int32, device=device)


_backend_ok: dict[str, bool] = {}


def resolve_backend(backend: str, noise: str = "gaussian") -> str:
    """Map ``"auto"`` to the backend for ``noise``: for element-wise noise ``"compiled"`` if
    torch.compile works here (tried once), else ``"torch"``; for ``"lowrank"`` always ``"torch"``
    (its random numbers are (m + n) r per matrix plus the 1-D tensors: a compiler would not pay)."""
    if backend not in BACKENDS:
        raise ValueError(f"noise backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "auto":
        return backend
    if noise == "lowrank":
        return "torch"
    if "compiled" not in _backend_ok:
        try:
            probe = torch.zeros(4096)
            axpy_(probe, 0, "gaussian", "compiled", a=1.0)
            axpy_(probe, 0, "rademacher", "compiled", a=1.0)
            generate(0, 4096, "gaussian", "compiled")
            _backend_ok["compiled"] = bool(torch.isfinite(probe).all())
        except Exception as err:  # any compiler/toolchain failure: fall back, loudly
            warnings.warn(f"torch.compile of the noise kernel failed ({type(err).__name__}: {err}); "
                          "using the plain torch.Generator noise backend instead")
            _backend_ok["compiled"] = False
    return "compiled" if _backend_ok["compiled"] else "torch"


# ----------------------------------------------------------------------------------------------
# Public entry points


def generate(key: int, numel: int, kind: str, backend: str, device="cpu") -> torch.Tensor:
    """Materialise z for a key as a flat float32 tensor of ``numel`` elements."""
    _check_kind(kind)
    device = torch.device(device)
    if backend == "torch":
        return _torch_noise(key, numel, kind, device)
    if backend == "compiled":
        with torch.no_grad():  # one grad mode: a change of grad mode would be another compiled variant
            return _compiled_fn("generate", kind)(numel, hash_keys(key, device), device)
    raise ValueError(f"noise backend must be 'torch' or 'compiled' here (resolve 'auto' first), got {backend!r}")


def _contiguous(p: torch.Tensor) -> torch.Tensor:
    """``p``, refused if not contiguous (the noise is laid out over its storage); checks only, dispatches nothing."""
    if not p.is_contiguous():
        raise ValueError("MeZO noise needs contiguous parameters (got a non-contiguous tensor)")
    return p


def axpy_(p: torch.Tensor, key: int, kind: str, backend: str, a: float, b: float = 0.0, c: float = 1.0) -> torch.Tensor:
    """In place: ``p <- (p + a*z) * c + b*z`` with z = noise(key), shaped like p.

    ``a`` alone perturbs (``+eps``, ``-2eps``). ``a=eps, b=-lr*g, c=1-lr*wd`` restores the weights
    from ``theta - eps*z`` and applies the SGD step with weight decay in the same pass.
    The compiled backend computes in float32 and rounds to p's dtype once; the torch backend
    uses p's dtype for each of its (up to three) in-place ops.
    """
    _check_kind(kind)
    flat = _contiguous(p).view(-1)
    if backend == "compiled":
        coef = torch.tensor([a, b, c], dtype=torch.float32, device=p.device)
        with torch.no_grad():
            _compiled_fn("axpy", kind)(flat, hash_keys(key, p.device), coef)
        return p
    if backend != "torch":
        raise ValueError(f"noise backend must be 'torch' or 'compiled' here (resolve 'auto' first), got {backend!r}")
    z = _torch_noise(key, flat.numel(), kind, p.device)
    if c == 1.0:
        flat.add_(z, alpha=a + b) if b != 0.0 else flat.add_(z, alpha=a)
    else:
        flat.add_(z, alpha=a).mul_(c).add_(z, alpha=b)
    return p


# ----------------------------------------------------------------------------------------------
# The noise of an optimizer's tensors: element-wise, or low-rank drawn for all tensors at once.

#: the version of the draws a trajectory records (header ``noise_format``). 1: every low-rank tensor's
#: factors drawn on their own (one generator seeding per tensor and sweep); 2: the factors of every tensor
#: of a noise sample in one draw. Element-wise noise is the same in both.
FORMAT = 2
_TAG_B = 0x6C6F7772616E6B42  # "lowrankB": the key of a sample's B factors and 1-D noise
_TAG_A = 0x6C6F7772616E6B41  # "lowrankA": the key of a block's A factors


def _draw_key(seed: int, tag: int) -> int:
    return _splitmix64(_splitmix64(int(seed) & _M64) ^ tag)


def layout(tensors) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """The layout a :class:`NoiseSpec` covers, from ``(index, tensor)`` pairs: ``((index, shape), ...)``."""
    return tuple((int(i), tuple(int(s) for s in p.shape)) for i, p in tensors)


class _Draw:
    """One noise sample's low-rank draw for a layout: two flat ``torch.Generator`` draws, split into views.

    ``b`` (key: the sample seed) holds, for q = 0 .. r-1, column q of every matrix's B (m values each, in
    layout order), then the element-wise Gaussian z of every other tensor; ``a`` (key: the sample's block
    seed, see ``interval``) holds, for q = 0 .. r-1, column q of every matrix's A (n values each)."""

    def __init__(self, spec: "NoiseSpec", seed: int):
        r, mats, vecs = spec.rank, spec._mats, spec._vecs
        k = int(seed) & _M32  # the sample counter within the run (seeds are run_seed * 2**32 + k)
        block_seed = int(seed) - k + (k // spec.interval) * spec.interval
        ms, ns = [m for _, _, m, _ in mats], [n for _, _, _, n in mats]
        vs = [numel for _, _, numel in vecs]
        self.spec = spec
        self.b = _torch_noise(_draw_key(seed, _TAG_B), r * sum(ms) + sum(vs), "gaussian", torch.device("cpu"))
        self.a = _torch_noise(_draw_key(block_seed, _TAG_A), r * sum(ns), "gaussian", torch.device("cpu"))
        self.raw = (self.b, self.a)  # the standard normal draws; ``b`` and ``a`` scaled where the spec is preconditioned
        scales = spec._scales.get("draw")
        if scales is not None:
            self.b, self.a = self.b * scales[0], self.a * scales[1]
        self._views: dict = {}

    def views(self, dtype: torch.dtype, device: torch.device):
        """(bs, as_, zs, one): per layout position, the factors' columns shaped to broadcast against the
        tensor (bs[q][i]: [m, 1, ...], as_[q][i]: [1, n...]), the 1-D noise (zs[j]: the tensor's shape) and a
        0-d one; in ``dtype`` on ``device``, made once per draw."""
        key = (dtype, device)
        if key not in self._views:
            spec, r = self.spec, self.spec.rank
            mats, vecs = spec._mats, spec._vecs
            b, a = self.b.to(device=device, dtype=dtype), self.a.to(device=device, dtype=dtype)
            nb = r * sum(m for _, _, m, _ in mats)
            bcols = b[:nb].view(-1, 1).split([m for _, _, m, _ in mats] * r) if mats else ()
            acols = a.view(1, -1).split([n for _, _, _, n in mats] * r, dim=1) if mats else ()
            zs = b[nb:].split([numel for _, _, numel in vecs]) if vecs else ()
            t = len(mats)
            bs = [[_shaped(bcols[q * t + i], (shape[0],) + (1,) * (len(shape) - 1))
                   for i, (_, shape, _, _) in enumerate(mats)] for q in range(r)]
            as_ = [[_shaped(acols[q * t + i], (1,) + shape[1:]) for i, (_, shape, _, _) in enumerate(mats)]
                   for q in range(r)]
            zs = [_shaped(z, shape) for z, (_, shape, _) in zip(zs, vecs)]
            self._views[key] = (bs, as_, zs, torch.ones((), dtype=dtype, device=device))
        return self._views[key]


class _Stacked:
    """Low-rank draws of several samples stacked over a leading member axis (:meth:`NoiseSpec.stacked`): ``b``
    [M, r * sum(m) + sum(numel of 1-D)] and ``a`` [M, r * sum(n)], float32 on one device (two copies from
    the host). :meth:`factors` and :meth:`vector` are views of them, each the numbers
    :meth:`NoiseSpec.factors` / :meth:`NoiseSpec.sample` give for one sample."""

    def __init__(self, spec: "NoiseSpec", seeds: list[int], device: torch.device):
        unique = list(dict.fromkeys(seeds))
        draws = [spec._draw(s) for s in unique]
        pick = torch.tensor([unique.index(s) for s in seeds])
        self.spec, self.members = spec, len(seeds)
        self.b = torch.stack([d.b for d in draws]).index_select(0, pick).to(device)
        self.a = torch.stack([d.a for d in draws]).index_select(0, pick).to(device)
        mats, vecs = spec._mats, spec._vecs
        self._m_at = [0, *itertools.accumulate(m for _, _, m, _ in mats)]
        self._n_at = [0, *itertools.accumulate(n for _, _, _, n in mats)]
        self._v_at = [0, *itertools.accumulate(numel for _, _, numel in vecs)]

    def factors(self, p: torch.Tensor, index: int, b=None, a=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B [M, m, r], A [M, n, r])`` of the matrix ``p`` at ``index`` for every member, as views of
        :attr:`b` and :attr:`a`, or of ``b`` / ``a`` given instead: tensors of their shapes made from them
        elementwise (cast, scaled per member)."""
        matrix, i = self.spec._position(index, p)
        if not matrix:
            raise ValueError(f"the tensor at index {index} has {p.dim()} dimension(s): low-rank factors are drawn "
                             "for tensors of 2 or more")
        M, r = self.members, self.spec.rank
        sm, sn = self._m_at[-1], self._n_at[-1]
        b = (self.b if b is None else b)[:, : r * sm].view(M, r, sm)[:, :, self._m_at[i] : self._m_at[i + 1]]
        a = (self.a if a is None else a).view(M, r, sn)[:, :, self._n_at[i] : self._n_at[i + 1]]
        return b.transpose(1, 2), a.transpose(1, 2)

    def vector(self, p: torch.Tensor, index: int) -> torch.Tensor:
        """[M, *shape]: the element-wise noise of the 1-D (or 0-D) tensor ``p`` at ``index`` for every member (a view)."""
        matrix, j = self.spec._position(index, p)
        if matrix:
            raise ValueError(f"the tensor at index {index} is a matrix: its noise is low-rank factors")
        start = self.spec.rank * self._m_at[-1]
        return self.b[:, start + self._v_at[j] : start + self._v_at[j + 1]].view(self.members, *p.shape)


@contextmanager
def one_thread_on_cpu(devices):
    """Within the block, torch's CPU operators run on one thread when any of ``devices`` is the CPU.

    A sweep reads and writes each weight once: memory bandwidth, not arithmetic, bounds it. Several threads
    would add a thread synchronisation to every tensor's operator, which waits for a scheduler time slice
    whenever another process holds a core."""
    n = torch.get_num_threads()
    serial = n > 1 and any(torch.device(d).type == "cpu" for d in devices)
    if serial:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if serial:
            torch.set_num_threads(n)


def _shaped(t: torch.Tensor, shape: tuple) -> torch.Tensor:
    return t if tuple(t.shape) == tuple(shape) else t.view(shape)


@dataclass(frozen=True)
class NoiseSpec:
    """The noise an optimizer draws for the tensor at position ``index`` at step ``seed``.

    ``kind="gaussian"`` / ``"rademacher"``: element-wise z from :func:`tensor_key` (``backend``
    resolved: ``"torch"`` or ``"compiled"``), one tensor at a time.

    ``kind="lowrank"`` (LOZO, Chen et al. ICLR 2025; SubZero, Yu et al. 2024): a tensor with 2 or
    more dimensions, viewed as an m x n matrix (n = the product of the other dimensions), gets
    ``z = B A^T / sqrt(r)`` with B [m, r] and A [n, r] of independent N(0, 1) entries, so
    ``E[z_ij z_kl] = (1/r) sum_q E[B_iq B_kq] E[A_jq A_lq] = [i=k][j=l]``: E[vec z vec z^T] = I,
    the same second moment as Gaussian z, hence an unbiased SPSA estimate. 1-D tensors (biases, norms)
    get element-wise Gaussian noise. With ``interval = k > 1`` the factor A is held for k consecutive
    noise samples (LOZO's lazy subspace: sample counter // k picks it), B is fresh every sample;
    E[z z^T] = I then holds over the run, not within one block.

    Low-rank noise covers a fixed ``layout`` (:func:`layout`: the ``(index, shape)`` of every tensor, in
    order): a noise sample draws the factors and 1-D noise of all of them in two flat ``torch.Generator``
    draws (:class:`_Draw`; keys from the sample seed and the block seed), kept for the ``keep`` most recent
    seeds, and :meth:`sweep_` applies them to every tensor in a number of ``torch._foreach_*`` operations
    that does not grow with the number of tensors: ``p <- c p + (a c + b) z`` as one ``_foreach_mul_``
    where some c != 1, then, per column q of the factors, one ``_foreach_addcmul_`` of the broadcast
    product ``B[:, q] A[:, q]^T`` (no temporary of a matrix's size). A tensor's noise is a pure function
    of (seed, layout, index). The sweep needs the layout; :meth:`factors` and :meth:`sample` give the
    same noise tensor by tensor.
    """

    kind: str
    backend: str
    rank: int = 1
    interval: int = 1
    layout: tuple = ()
    keep: int = 1
    _cache: OrderedDict = field(default_factory=OrderedDict, compare=False, repr=False)
    _scales: dict = field(default_factory=dict, compare=False, repr=False)

    def _lowrank(self, p: torch.Tensor) -> bool:
        return self.kind == "lowrank" and p.dim() >= 2

    # -- the low-rank layout ----------------------------------------------------------------------
    @cached_property
    def _positions(self) -> dict[int, tuple[bool, int, tuple]]:
        """index -> (low-rank matrix?, position among the matrices or among the other tensors, shape)."""
        out, nm, nv = {}, 0, 0
        for index, shape in self.layout:
            if len(shape) >= 2:
                out[index] = (True, nm, tuple(shape))
                nm += 1
            else:
                out[index] = (False, nv, tuple(shape))
                nv += 1
        return out

    @cached_property
    def _mats(self) -> list[tuple[int, tuple, int, int]]:
        return [(i, tuple(s), s[0], math.prod(s[1:])) for i, s in self.layout if len(s) >= 2]

    @cached_property
    def _vecs(self) -> list[tuple[int, tuple, int]]:
        return [(i, tuple(s), math.prod(s)) for i, s in self.layout if len(s) < 2]

    def _position(self, index: int, p: torch.Tensor) -> tuple[bool, int]:
        where = self._positions.get(int(index))
        if where is None or where[2] != tuple(p.shape):
            if not self.layout:
                raise ValueError("low-rank noise draws every tensor of a layout at once: build the NoiseSpec with "
                                 "layout=noise.layout((index, tensor) pairs)")
            raise ValueError(f"the tensor at index {index} with shape {tuple(p.shape)} is not in this noise's layout "
                             "(the tensors, indices and shapes it was built for)")
        return where[0], where[1]

    def _draw(self, seed: int) -> _Draw:
        seed = int(seed)
        draw = self._cache.get(seed)
        if draw is None:
            draw = self._cache[seed] = _Draw(self, seed)
            while len(self._cache) > max(1, self.keep):
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(seed)
        return draw

    def precondition(self, b_scale: torch.Tensor, a_scale: torch.Tensor) -> None:
        """From now on every low-rank draw's ``b`` (the B factors, then the 1-D tensors' noise) is multiplied by
        ``b_scale`` and its ``a`` (the A factors) by ``a_scale``, element by element (float32 on the CPU, the
        draws' lengths): a diagonal scale of the noise that keeps a matrix's noise low-rank
        (:class:`mezo_rl.engine.curvature.Curvature`). Draws made before are forgotten."""
        self._scales["draw"] = (b_scale, a_scale)
        self._cache.clear()

    def raw(self, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The sample's unscaled draws ``(b, a)``: standard normal, before :meth:`precondition`'s scales."""
        return self._draw(seed).raw

    # -- the noise, tensor by tensor ---------------------------------------------------------------
    def factors(self, p: torch.Tensor, seed: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(B [m, r], A [n, r]) float32 on p's device of the low-rank tensor ``p`` at ``index``."""
        matrix, i = self._position(index, p)
        if not matrix:
            raise ValueError(f"the tensor at index {index} has {p.dim()} dimension(s): low-rank factors are drawn "
                             "for tensors of 2 or more")
        bs, as_, _, _ = self._draw(seed).views(torch.float32, torch.device("cpu"))
        m = p.shape[0]
        b = torch.cat([bs[q][i].reshape(m, 1) for q in range(self.rank)], dim=1)
        a = torch.cat([as_[q][i].reshape(1, -1) for q in range(self.rank)], dim=0).t().contiguous()
        return b.to(p.device), a.to(p.device)

    def axpy_(self, p: torch.Tensor, seed: int, index: int, a: float, b: float = 0.0, c: float = 1.0) -> torch.Tensor:
        """In place: ``p <- (p + a z) c + b z`` (low-rank: computed as ``c p + (a c + b) z``, as :meth:`sweep_`)."""
        self.sweep_([(index, p)], seed, [(a, b, c)])
        return p

    def sample(self, p: torch.Tensor, seed: int, index: int) -> torch.Tensor:
        """z for ``p`` materialised as a float32 tensor of p's shape (momentum / Adam updates)."""
        if self.kind != "lowrank":
            return generate(tensor_key(seed, index, p.shape), p.numel(), self.kind, self.backend, p.device).view(p.shape)
        matrix, i = self._position(index, p)
        if not matrix:
            return self._draw(seed).views(torch.float32, torch.device("cpu"))[2][i].clone().view(p.shape).to(p.device)
        fb, fa = self.factors(p, seed, index)
        return (fb @ fa.t()).div_(math.sqrt(self.rank)).view(p.shape)

    def stacked(self, seeds, device) -> "_Stacked":
        """The low-rank noise of several samples at once, one per entry of ``seeds`` (seeds may repeat), stacked
        over a leading member axis on ``device``: :class:`_Stacked` (the population's per-member factors,
        made in a number of operations that does not grow with the number of tensors)."""
        if self.kind != "lowrank":
            raise ValueError(f"stacked draws are for low-rank noise, not {self.kind!r}")
        return _Stacked(self, [int(s) for s in seeds], torch.device(device))

    # -- every tensor at once -----------------------------------------------------------------------
    def sweep_(self, tensors, seed: int, coefs) -> None:
        """In place, for every ``(index, tensor)`` of ``tensors`` with its ``(a, b, c)`` of ``coefs``:
        ``p <- (p + a z) c + b z``. Element-wise noise: tensor by tensor (:func:`axpy_`). Low-rank noise:
        ``p <- c p + (a c + b) z`` for all of them in a number of operations that does not depend on how
        many there are (per dtype and device of the tensors: one ``_foreach_mul_`` if some c != 1, and one
        ``_foreach_addcmul_`` per column of the factors, the 1-D tensors' noise with the first)."""
        if self.kind != "lowrank":
            if self.backend == "compiled":
                self._compiled_sweep_(tensors, seed, coefs)
                return
            for (index, p), (a, b, c) in zip(tensors, coefs):
                axpy_(p, tensor_key(seed, index, p.shape), self.kind, self.backend, a=a, b=b, c=c)
            return
        draw, root_r = self._draw(seed), math.sqrt(self.rank)
        lists: dict = {}  # (dtype, device) -> (scaled tensors and their c, matrices, vectors)
        for (index, p), (a, b, c) in zip(tensors, coefs):
            _contiguous(p)
            matrix, i = self._position(index, p)
            scaled, mats, vecs = lists.setdefault((p.dtype, p.device), ([], [], []))
            if c != 1.0:
                scaled.append((p, c))
            s = a * c + b
            if s != 0.0:
                (mats.append((p, i, s / root_r, 0)) if matrix else vecs.append((p, i, s)))
        for (dtype, device), (scaled, mats, vecs) in lists.items():
            with one_thread_on_cpu([device]):
                self._apply(draw, dtype, device, scaled, mats, vecs)

    def add_(self, targets, seed: int) -> None:
        """In place, for every ``(index, p, start, view, s)``: ``view += s * z[start:start + len(view)]``, z the noise
        of ``p`` at ``index`` (low-rank: as :meth:`sweep_`, rows of B; element-wise: whole tensors, one at a time)."""
        if self.kind != "lowrank":
            for index, p, start, view, s in targets:
                if start != 0 or view.numel() != p.numel():  # mezo_rl.engine.rounding cuts low-rank matrices only
                    raise ValueError("element-wise noise is added to whole tensors only")
                axpy_(view, tensor_key(seed, index, p.shape), self.kind, self.backend, a=0.0, b=s)
            return
        mats, vecs, root_r = [], [], math.sqrt(self.rank)
        for index, p, start, view, s in targets:
            matrix, i = self._position(index, p)
            (mats.append((view, i, s / root_r, start)) if matrix else vecs.append((view, i, s)))
        if targets:  # the buffers' dtype and device: float32, where the first one is
            self._apply(self._draw(seed), torch.float32, targets[0][3].device, [], mats, vecs)

    def _compiled_sweep_(self, tensors, seed: int, coefs) -> None:
        """The compiled backend's sweep: :func:`axpy_`'s kernel on each tensor, with every tensor's keys and
        coefficients sent to its device as one table a sweep (a row each), so that on an accelerator no tensor's
        kernel waits on a host-to-device copy of its own (a synchronising copy per tensor on CUDA)."""
        rows: dict = {}  # device -> [(flat view, key words, (a, b, c))]
        for (index, p), abc in zip(tensors, coefs):
            key = _key_words(tensor_key(seed, index, p.shape))
            rows.setdefault(p.device, []).append((_contiguous(p).view(-1), key, abc))
        kernel = _compiled_fn("axpy", self.kind)
        for device, items in rows.items():
            keys = torch.tensor([k for _, k, _ in items], dtype=torch.int32).to(device)
            table = torch.tensor([abc for _, _, abc in items], dtype=torch.float32).to(device)
            with torch.no_grad():
                for j, (flat, _, _) in enumerate(items):
                    kernel(flat, keys[j], table[j])

    def _apply(self, draw: _Draw, dtype, device, scaled, mats, vecs) -> None:
        """The operators of :meth:`sweep_` for the tensors of one dtype and device."""
        if scaled:
            torch._foreach_mul_([p for p, _ in scaled], [c for _, c in scaled])
        if not (mats or vecs):
            return
        bs, as_, zs, one = draw.views(dtype, device)
        for q in range(self.rank if mats else 1):  # a matrix's rows [a, a + len(p)) of its B (all of it: a view only)
            selfs = [p for p, _, _, _ in mats]
            t1 = [bs[q][i] if a == 0 and len(p) == len(bs[q][i]) else bs[q][i][a: a + len(p)] for p, i, _, a in mats]
            t2 = [as_[q][i] for _, i, _, _ in mats]
            scalars = [s for _, _, s, _ in mats]
            if q == 0:
                selfs += [p for p, _, _ in vecs]
                t1 += [zs[i] for _, i, _ in vecs]
                t2 += [one] * len(vecs)
                scalars += [s for _, _, s in vecs]
            if selfs:
                torch._foreach_addcmul_(selfs, t1, t2, scalars)
