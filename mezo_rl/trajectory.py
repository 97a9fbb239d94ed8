"""The trajectory of a MeZO run: a compact log from which the trained weights can be rebuilt.

Every MeZO step is determined by a handful of scalars: the seed(s) of its noise, the loss values
the closure returned (hence the projected gradient(s)), and the lr and eps of each param group.
:class:`Trajectory` logs exactly those, one row per step, plus a header describing the run
(noise kind and backend, estimator, variant, parameter shapes). With the initial weights,
:func:`replay_trajectory` re-executes every sweep of every step, in the same order and with the
same floating-point operations, and so ends at the very weights the run ended with
(bit-identical on the same machine and torch version; no data, no forward pass).

This is the paper's storage claim (section 2.1) made concrete: a fine-tuned model's checkpoint is
the base model plus its trajectory. A step costs about 50 bytes before compression; 20,000 steps
fit in well under 1 MB.

Rows are kept for every step the optimizer started, including steps that were skipped (a
non-finite loss under ``on_nonfinite="skip"``) or aborted (the closure raised): their perturb and
restore sweeps are not bit-exact inverses in general, so replay must repeat them too.
"""
from __future__ import annotations

import io
import json
import os
from typing import Iterable

import numpy as np
import torch

__all__ = ["Trajectory", "replay_trajectory", "STATUS"]

FORMAT = "mezo-rl-trajectory/1"
#: row status codes
STATUS = {"applied": 0, "skipped": 1, "aborted": 2}


class Trajectory:
    """Per-step log of a MeZO run.

    Columns (numpy arrays, one row per step; see the properties):

    - ``seeds`` int64 [T, n]: the noise seed of each of the n SPSA samples
    - ``values`` float64 [T, k]: what the closure returned, in call order
      (two-point: ``l+_1, l-_1, l+_2, l-_2, ...``; one-point: ``l_1``); NaN where not called
    - ``projected_grads`` float64 [T, n]: ``(l+ - l-) / (2 eps)`` of each sample, with the first
      param group's eps (one-point: ``(l - l_prev) / eps``)
    - ``lrs``, ``epss`` float64 [T, G]: the lr and eps of each param group at that step
    - ``status`` int8 [T]: 0 applied, 1 skipped (non-finite loss), 2 aborted (exception)
    - ``calls`` int16 [T]: how many closure calls returned a value

    ``header`` is a JSON-serialisable dict describing the run (set by the optimizer).
    """

    def __init__(self, header: dict | None = None):
        self.header: dict = dict(header or {})
        self._rows: list[tuple] = []

    # -- building ------------------------------------------------------------------------------
    def append(self, *, seeds, values, projected_grads, lrs, epss, status: int, calls: int) -> None:
        """Add one step (called by :class:`mezo_rl.MeZO`)."""
        self._rows.append((tuple(int(s) for s in seeds), tuple(float(v) for v in values),
                           tuple(float(g) for g in projected_grads), tuple(float(x) for x in lrs),
                           tuple(float(x) for x in epss), int(status), int(calls)))

    def __len__(self) -> int:
        return len(self._rows)

    def __repr__(self) -> str:
        return f"Trajectory(steps={len(self)}, header={self.header})"

    # -- columns -------------------------------------------------------------------------------
    def _column(self, i: int, dtype, width: int | None = None) -> np.ndarray:
        if not self._rows:
            return np.zeros((0, width or 0), dtype=dtype)
        col = [r[i] for r in self._rows]
        if width is None:
            return np.asarray(col, dtype=dtype)
        out = np.full((len(col), width), np.nan if np.dtype(dtype).kind == "f" else 0, dtype=dtype)
        for t, row in enumerate(col):
            out[t, : len(row)] = row
        return out

    @property
    def seeds(self) -> np.ndarray:
        return self._column(0, np.int64, self.header.get("n_spsa", 1))

    @property
    def values(self) -> np.ndarray:
        return self._column(1, np.float64, self.header.get("calls_per_step", 2))

    @property
    def projected_grads(self) -> np.ndarray:
        return self._column(2, np.float64, self.header.get("n_spsa", 1))

    @property
    def lrs(self) -> np.ndarray:
        return self._column(3, np.float64, len(self.header.get("group_sizes", [0])))

    @property
    def epss(self) -> np.ndarray:
        return self._column(4, np.float64, len(self.header.get("group_sizes", [0])))

    @property
    def status(self) -> np.ndarray:
        return self._column(5, np.int8)

    @property
    def calls(self) -> np.ndarray:
        return self._column(6, np.int16)

    @property
    def losses(self) -> np.ndarray:
        """Mean closure value of each step (NaN for steps with no finite value)."""
        v = self.values
        with np.errstate(all="ignore"):
            return np.nanmean(np.where(np.isfinite(v), v, np.nan), axis=1) if len(v) else np.zeros(0)

    # -- (de)serialisation ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Plain arrays + header; what :meth:`save` writes and :class:`MeZO` checkpoints."""
        return {"format": FORMAT, "header": json.dumps(self.header), "seeds": self.seeds,
                "values": self.values, "projected_grads": self.projected_grads, "lrs": self.lrs,
                "epss": self.epss, "status": self.status, "calls": self.calls}

    @classmethod
    def from_state_dict(cls, state: dict) -> "Trajectory":
        fmt = str(np.asarray(state.get("format", "")))
        if fmt != FORMAT:
            raise ValueError(f"not a MeZO trajectory: format {fmt!r}, expected {FORMAT!r}")
        traj = cls(json.loads(str(np.asarray(state["header"]))))
        cols = [np.asarray(state[k]) for k in ("seeds", "values", "projected_grads", "lrs", "epss", "status", "calls")]
        for t in range(len(cols[5])):
            calls = int(cols[6][t])
            traj._rows.append((tuple(int(s) for s in cols[0][t]), tuple(float(v) for v in cols[1][t][:calls]),
                               tuple(float(g) for g in cols[2][t]), tuple(float(x) for x in cols[3][t]),
                               tuple(float(x) for x in cols[4][t]), int(cols[5][t]), calls))
        return traj

    def save(self, path: str | os.PathLike) -> None:
        """Write a compressed ``.npz`` file at exactly ``path``."""
        buf = io.BytesIO()
        np.savez_compressed(buf, **{k: np.asarray(v) for k, v in self.state_dict().items()})
        with open(path, "wb") as f:
            f.write(buf.getvalue())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Trajectory":
        with np.load(path, allow_pickle=False) as data:
            return cls.from_state_dict({k: data[k] for k in data.files})


def _flat_params(params) -> tuple[list[torch.Tensor], list[dict] | None]:
    if isinstance(params, torch.nn.Module):
        return list(params.parameters()), None
    params = list(params)
    if params and isinstance(params[0], dict):
        return [p for g in params for p in g["params"]], params
    return [p[1] if isinstance(p, tuple) else p for p in params], None


def replay_trajectory(params: torch.nn.Module | Iterable, trajectory: Trajectory | str | os.PathLike) -> None:
    """Rebuild trained weights in place from the initial weights and the run's trajectory.

    ``params`` must hold the weights the run *started* from, in the optimizer's order: a module
    (its ``.parameters()``), an iterable of tensors or ``(name, tensor)`` pairs, or the param
    groups the optimizer was built with. Group structure (which tensors share an lr, eps and
    weight decay) is taken from the trajectory. Tensors with ``requires_grad=False`` are left
    alone, as in training. No data and no forward pass are needed; the result is bit-identical to
    the end of the run on the same machine and torch version, with the same noise backend.
    Momentum and Adam runs allocate their buffers again while replaying.
    """
    from mezo_rl.optim import MeZO  # the optimizer re-executes its own steps

    traj = trajectory if isinstance(trajectory, Trajectory) else Trajectory.load(trajectory)
    h = traj.header
    if not h:
        raise ValueError("the trajectory has no header: it was never filled by a MeZO run")
    flat, _ = _flat_params(params)
    shapes = [list(p.shape) for p in flat]
    if shapes != h["param_shapes"]:
        raise ValueError(f"replay needs the {len(h['param_shapes'])} tensors the run was built with, in the same "
                         f"order and shapes; got {len(flat)} tensors (first mismatch at index "
                         f"{next((i for i, (a, b) in enumerate(zip(shapes, h['param_shapes'])) if a != b), min(len(shapes), len(h['param_shapes'])))})")
    dtypes = [str(p.dtype).removeprefix("torch.") for p in flat]
    if dtypes != h["param_dtypes"]:
        raise ValueError(f"replay needs the same dtypes as the run ({sorted(set(h['param_dtypes']))}); got {sorted(set(dtypes))}")
    trainable = [i for i, p in enumerate(flat) if p.requires_grad]
    if trainable != h["trainable"]:
        raise ValueError("replay needs the same tensors to be trainable (requires_grad=True) as in the run")
    groups, start = [], 0
    for size, wd in zip(h["group_sizes"], h["group_weight_decays"]):
        groups.append({"params": flat[start:start + size], "weight_decay": wd})
        start += size
    opt = MeZO(groups, lr=0.0, eps=1.0, n_spsa=h["n_spsa"], noise=h["noise"], estimator=h["estimator"],
               momentum=h["momentum"], adam=h["adam"], betas=tuple(h["betas"]), adam_eps=h["adam_eps"],
               seed=h["seed"], on_nonfinite=h["on_nonfinite"], noise_backend=h["noise_backend"], record=False)
    opt._replay(traj)
