"""HiZOO's diagonal curvature, kept in the form of low-rank noise: the perturbation-side preconditioner.

HiZOO (Zhao et al., ICLR 2025) keeps a diagonal estimate H of the loss's Hessian, starting at 1, perturbs
with ``Sigma^1/2 z`` (``Sigma = H^-1``, element-wise) instead of z, and after each step moves H towards the
curvature the step measured along its direction:

    dL = |l+ + l- - 2 l0| / (2 eps^2)             (l0: the loss at theta, one more member a step)
    H <- (1 - alpha) H + alpha dL (Sigma^-1/2 z z^T Sigma^-1/2)_diag = H ((1 - alpha) + alpha dL z^2)

With ``u = Sigma^1/2 z`` the two-point estimate ``(l+ - l-) / (2 eps) u`` has the mean ``Sigma grad``: a
step preconditioned by the inverse curvature. ``alpha`` is HiZOO's smoothing scale.

Here H is kept where the noise lives. A 1-D tensor's H is element-wise, as HiZOO's. A matrix's H is the
outer product of a row and a column vector, ``H_ij = R_i C_j`` (Adafactor's factoring of a second moment:
Shazeer & Stern 2018), so that the preconditioned noise of a rank-1 member stays rank 1:
``Sigma^1/2 (b a^T) = (R^-1/2 b)(C^-1/2 a)^T``, the same factors scaled, which the in-place sweeps and the
batched members apply as they apply any factors. Each update projects the new H back onto that form with
Adafactor's rule: ``R`` from the new H's row sums, ``C`` from its column sums, their product keeping the
total (``C`` normalised to a mean of 1 per matrix). The state is ``m + n`` numbers a matrix (HiZOO's is
``m n``), and an update is a fixed number of operations over two flat vectors, whatever the number of
tensors or samples.
"""
from __future__ import annotations

import math

import torch

__all__ = ["Curvature"]


class Curvature:
    """The factored diagonal curvature of the tensors of a rank-1 low-rank :class:`~mezo_rl.engine.noise.NoiseSpec`.

    ``hb``: float32, laid out as the spec's ``b`` draw (every matrix's row factor R, then every 1-D tensor's
    element-wise H); ``ha``: as its ``a`` draw (every matrix's column factor C). :meth:`scales` gives the
    draws' multipliers (``Sigma^1/2``); :meth:`update` the step's move of H."""

    def __init__(self, spec):
        if spec.kind != "lowrank" or spec.rank != 1:
            raise ValueError("HiZOO's curvature (hessian_smooth > 0) is kept for rank-1 low-rank noise "
                             f"(noise='lowrank', rank=1); got noise={spec.kind!r}, rank={spec.rank}")
        ms = [m for _, _, m, _ in spec._mats]
        ns = [n for _, _, _, n in spec._mats]
        vs = [numel for _, _, numel in spec._vecs]
        self.rows, self.vec = sum(ms), sum(vs)
        self.hb = torch.ones(self.rows + self.vec)
        self.ha = torch.ones(sum(ns))
        # the matrix each entry of R (of C) belongs to, and each matrix's columns
        self._row_of = torch.repeat_interleave(torch.arange(len(ms)), torch.tensor(ms, dtype=torch.long))
        self._col_of = torch.repeat_interleave(torch.arange(len(ns)), torch.tensor(ns, dtype=torch.long))
        self._ncols = torch.tensor(ns, dtype=torch.float32)
        self._mats = len(ms)

    def scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(H^-1/2 in b's layout, C^-1/2 in a's layout)``: what a draw's factors are multiplied by."""
        return self.hb.rsqrt(), self.ha.rsqrt()

    def _segment_sum(self, x: torch.Tensor, of: torch.Tensor) -> torch.Tensor:
        """[S, L] -> [S, matrices]: each matrix's sum of ``x`` over its entries (``of``: an entry's matrix)."""
        return torch.zeros(x.shape[0], self._mats, dtype=x.dtype).index_add_(1, of, x)

    def update(self, b: torch.Tensor, a: torch.Tensor, curvatures: torch.Tensor, alpha: float) -> None:
        """One step's move of H: ``b`` [S, len(hb)] and ``a`` [S, len(ha)] the S samples' unscaled draws (z's
        factors and 1-D noise), ``curvatures`` [S] their ``dL``; the S samples' terms averaged."""
        w = curvatures.to(torch.float32).view(-1, 1) * (alpha / len(curvatures))
        R, H, C = self.hb[: self.rows], self.hb[self.rows :], self.ha
        bm, z = b[:, : self.rows], b[:, self.rows :]
        # 1-D tensors, as HiZOO: H <- H ((1 - alpha) + alpha mean_s dL_s z_s^2)
        H.mul_((1.0 - alpha) + (w * z.square()).sum(0))
        if not self._mats:
            return
        # a matrix's new row sums, R_i ((1 - alpha) n + alpha mean_s dL_s b_si^2 sum_j C_j a_sj^2), and column sums,
        # C_j ((1 - alpha) sum_i R_i + alpha mean_s dL_s a_sj^2 sum_i R_i b_si^2)
        ca = self._segment_sum(C * a.square(), self._col_of)   # [S, matrices]
        rb = self._segment_sum(R * bm.square(), self._row_of)  # [S, matrices]
        rowsum = R * ((1.0 - alpha) * self._ncols[self._row_of] + (w * bm.square() * ca[:, self._row_of]).sum(0))
        rsum = self._segment_sum(R.view(1, -1), self._row_of)[0]
        colsum = C * ((1.0 - alpha) * rsum[self._col_of] + (w * a.square() * rb[:, self._col_of]).sum(0))
        # Adafactor's projection: R from the row sums, C from the column sums at a mean of 1 per matrix
        R.copy_(rowsum / self._ncols[self._row_of])
        cmean = self._segment_sum(colsum.view(1, -1), self._col_of)[0] / self._ncols
        C.copy_(colsum / cmean[self._col_of])

    def observe(self, noise, seeds: list[int], values: list[float], center: float, eps: float, alpha: float) -> None:
        """A two-point step's measurement: each sample's curvature along its direction, ``|l+ + l- - 2 l0| /
        (2 eps^2)`` (``values``: the members' losses in pairs, ``center``: the unperturbed weights' l0), moves H
        (:meth:`update`) at the rate ``alpha``, and ``noise`` (the run's NoiseSpec) draws the steps to come
        scaled by the new ``H^-1/2``."""
        raws = [noise.raw(s) for s in seeds]
        curv = torch.tensor([abs(values[2 * j] + values[2 * j + 1] - 2.0 * center) / (2.0 * eps * eps)
                             for j in range(len(seeds))], dtype=torch.float64)
        self.update(torch.stack([b for b, _ in raws]), torch.stack([a for _, a in raws]), curv, alpha)
        noise.precondition(*self.scales())

    def noise_scale(self) -> dict[str, float]:
        """What the preconditioner does to the noise, over every weight once (a matrix's ``H_ij = R_i C_j``):
        ``rms`` and ``geomean`` of the per-weight scale ``H^-1/2`` (1 at the start; ``rms`` is the factor of the
        step's length when the weights' noise is alike), and ``log_sd``, the standard deviation of its log over the
        weights (0 while every weight's H is the same: a decay of the noise, no per-weight preconditioning)."""
        R, H, C = (x.double() for x in (self.hb[: self.rows], self.hb[self.rows :], self.ha))
        def rows(x):  # each matrix's sum of x over its rows (x in R's layout); cols: over its columns
            return self._segment_sum(x.view(1, -1), self._row_of)[0]

        def cols(x):
            return self._segment_sum(x.view(1, -1), self._col_of)[0]

        n_of, m_of = self._ncols.double(), rows(torch.ones_like(R))
        log_r, log_c = R.log(), C.log()
        # per matrix: sums of 1/H, of log H and of (log H)^2 over its m x n entries, from its row and column factors
        sr, sc = rows(log_r), cols(log_c)
        inv = rows(1 / R) * cols(1 / C)
        log_sum = n_of * sr + m_of * sc
        log_sq = n_of * rows(log_r.square()) + m_of * cols(log_c.square()) + 2 * sr * sc
        count = float((m_of * n_of).sum()) + H.numel()
        inv_t, log_t = float(inv.sum() + (1 / H).sum()), float(log_sum.sum() + H.log().sum())
        sq_t = float(log_sq.sum() + H.log().square().sum())
        mean_log_h = log_t / count
        var_log_h = max(sq_t / count - mean_log_h ** 2, 0.0)
        return {"rms": (inv_t / count) ** 0.5, "geomean": math.exp(-0.5 * mean_log_h),
                "log_sd": 0.5 * var_log_h ** 0.5}

    def state_dict(self) -> dict:
        return {"hb": self.hb.clone(), "ha": self.ha.clone()}

    def load_state_dict(self, state: dict) -> None:
        for name in ("hb", "ha"):
            value = state[name]
            if tuple(value.shape) != tuple(getattr(self, name).shape):
                raise ValueError(f"the saved curvature's {name} has {tuple(value.shape)} entries, this run's "
                                 f"{tuple(getattr(self, name).shape)}: it was saved for other tensors")
            getattr(self, name).copy_(value)
