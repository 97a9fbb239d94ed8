"""The trajectory of a MeZO run: a compact log from which the trained weights can be rebuilt.

Every MeZO step is determined by a handful of scalars: the seed(s) of its noise, the loss values
the closure returned (hence the projected gradient(s)), and the lr and eps of each param group.
:class:`Trajectory` logs exactly those, one :class:`Step` row per step, plus a header describing
the run (noise kind and backend, estimator, variant, parameter shapes). It is pure data: it knows
nothing of optimizers. :func:`mezo_rl.engine.optim.replay_trajectory` re-executes every sweep of every
step from the initial weights, in the same order and with the same floating-point operations, and
so ends at the very weights the run ended with (bit-identical on the same machine and torch
version; no data, no forward pass).

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
import zipfile
from typing import Iterator, NamedTuple

import numpy as np

__all__ = ["Trajectory", "Step", "STATUS", "COLUMNS"]

FORMAT = "mezo-rl-trajectory/1"
#: row status codes
STATUS = {"applied": 0, "skipped": 1, "aborted": 2}
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # every member of a saved .npz: the earliest time a zip can hold


class Step(NamedTuple):
    """One row of a trajectory: everything one ``MeZO.step`` used besides the weights."""

    seeds: tuple[int, ...]            #: the noise seed of each of the n SPSA samples
    values: tuple[float, ...]         #: what the closure returned, in call order (l+_1, l-_1, l+_2, ...)
    projected_grads: tuple[float, ...]  #: the scalar applied per sample (see MeZO's ``step_normalize``)
    lrs: tuple[float, ...]            #: lr of each param group at this step
    epss: tuple[float, ...]           #: eps of each param group at this step
    status: int                       #: STATUS code: applied, skipped or aborted
    calls: int                        #: how many closure calls returned a value


def _width_n(header: dict) -> int:
    return header.get("n_spsa", 1)


def _width_groups(header: dict) -> int:
    return len(header.get("group_sizes", [0]))


#: The one column list: (name, numpy dtype, width from the header or None for a scalar column),
#: in :class:`Step` field order. Ragged rows (fewer values than the width) are NaN/0-padded on save.
COLUMNS = (
    ("seeds", np.int64, _width_n),
    ("values", np.float64, lambda h: h.get("calls_per_step", 2)),
    ("projected_grads", np.float64, _width_n),
    ("lrs", np.float64, _width_groups),
    ("epss", np.float64, _width_groups),
    ("status", np.int8, None),
    ("calls", np.int16, None),
)
assert tuple(name for name, _, _ in COLUMNS) == Step._fields


def _column_property(name: str, doc: str) -> property:
    return property(lambda self: self.column(name), doc=doc)


class Trajectory:
    """Per-step log of a MeZO run: a header dict and a list of :class:`Step` rows.

    ``len(t)``, ``t[i]`` (a :class:`Step`), ``t[:n]`` (a Trajectory of the first n steps, same
    header), iteration over rows. Columns as numpy arrays [T] or [T, width]
    (:data:`COLUMNS`): ``seeds`` int64 [T, n]; ``values`` float64 [T, calls per step], NaN where
    not called; ``projected_grads`` float64 [T, n] (empty rows for skipped/aborted steps: NaN);
    ``lrs``, ``epss`` float64 [T, groups]; ``status`` int8 [T] (0 applied, 1 skipped, 2 aborted);
    ``calls`` int16 [T]. ``header`` is a JSON-serialisable dict describing the run (set by the
    optimizer).
    """

    def __init__(self, header: dict | None = None, steps=()):
        self.header: dict = dict(header or {})
        self._rows: list[Step] = list(steps)

    # -- building and access ---------------------------------------------------------------------
    def append(self, *, seeds, values, projected_grads, lrs, epss, status: int, calls: int) -> None:
        """Add one step (called by :class:`mezo_rl.engine.optim.MeZO`)."""
        self._rows.append(Step(tuple(int(s) for s in seeds), tuple(float(v) for v in values),
                               tuple(float(g) for g in projected_grads), tuple(float(x) for x in lrs),
                               tuple(float(x) for x in epss), int(status), int(calls)))

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[Step]:
        return iter(self._rows)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Trajectory(self.header, self._rows[index])
        return self._rows[index]

    def __repr__(self) -> str:
        return f"Trajectory(steps={len(self)}, header={self.header})"

    # -- columns ---------------------------------------------------------------------------------
    def column(self, name: str) -> np.ndarray:
        """The column ``name`` of :data:`COLUMNS` as a numpy array (ragged rows padded)."""
        i = Step._fields.index(name)
        _, dtype, width_of = COLUMNS[i]
        if width_of is None:
            return np.asarray([r[i] for r in self._rows], dtype=dtype)
        width = width_of(self.header)
        out = np.full((len(self._rows), width), np.nan if np.dtype(dtype).kind == "f" else 0, dtype=dtype)
        for t, row in enumerate(self._rows):
            out[t, : len(row[i])] = row[i]
        return out

    seeds = _column_property("seeds", "int64 [T, n]: noise seed of each sample")
    values = _column_property("values", "float64 [T, calls per step]: closure values in call order (NaN: not called)")
    projected_grads = _column_property("projected_grads", "float64 [T, n]: the scalar applied per sample")
    lrs = _column_property("lrs", "float64 [T, groups]: lr of each param group")
    epss = _column_property("epss", "float64 [T, groups]: eps of each param group")
    status = _column_property("status", "int8 [T]: 0 applied, 1 skipped, 2 aborted")
    calls = _column_property("calls", "int16 [T]: closure calls that returned a value")

    @property
    def losses(self) -> np.ndarray:
        """Mean closure value of each step (NaN for steps with no finite value)."""
        v = self.values
        with np.errstate(all="ignore"):
            return np.nanmean(np.where(np.isfinite(v), v, np.nan), axis=1) if len(v) else np.zeros(0)

    # -- (de)serialisation -----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Plain arrays + header; what :meth:`save` writes and :class:`MeZO` checkpoints."""
        return {"format": FORMAT, "header": json.dumps(self.header, sort_keys=True),
                **{name: self.column(name) for name, _, _ in COLUMNS}}

    @classmethod
    def from_state_dict(cls, state: dict) -> "Trajectory":
        fmt = str(np.asarray(state.get("format", "")))
        if fmt != FORMAT:
            raise ValueError(f"not a MeZO trajectory: format {fmt!r}, expected {FORMAT!r}")
        cols = {name: np.asarray(state[name]) for name, _, _ in COLUMNS}
        traj = cls(json.loads(str(np.asarray(state["header"]))))
        for t in range(len(cols["status"])):
            calls = int(cols["calls"][t])
            status = int(cols["status"][t])
            grads = cols["projected_grads"][t] if status == STATUS["applied"] else ()
            traj.append(seeds=cols["seeds"][t], values=cols["values"][t][:calls], projected_grads=grads,
                        lrs=cols["lrs"][t], epss=cols["epss"][t], status=status, calls=calls)
        return traj

    def save(self, path: str | os.PathLike) -> None:
        """Write a compressed ``.npz`` file at exactly ``path``.

        The bytes depend on the rows and the header only: the header's keys are sorted and every
        member of the zip archive carries the same fixed timestamp, so equal trajectories make equal
        files (a resumed run's file is the uninterrupted run's). No array holds Python objects, so
        :meth:`load` reads it with ``allow_pickle=False``.
        """
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for name, value in self.state_dict().items():
                member = zipfile.ZipInfo(name + ".npy", date_time=_ZIP_TIME)
                member.compress_type = zipfile.ZIP_DEFLATED
                member.external_attr = 0o644 << 16
                with archive.open(member, "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, np.asarray(value), allow_pickle=False)
        with open(path, "wb") as f:
            f.write(buf.getvalue())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Trajectory":
        with np.load(path, allow_pickle=False) as data:
            return cls.from_state_dict({k: data[k] for k in data.files})

