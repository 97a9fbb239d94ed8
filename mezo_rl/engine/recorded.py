"""A recorded run read by this version: its options (a trajectory header, a state dict) under today's names, the
noise format and the rounding it was made with (refused in one line where this version cannot repeat them), and its
steps re-executed (:meth:`mezo_rl.engine.optim.MeZO.replay`, :func:`mezo_rl.engine.optim.replay_trajectory`): each
logged row with its seeds, lrs and eps, the closure handing back the logged values.
"""
from __future__ import annotations

import torch

from mezo_rl.engine import noise as _noise
from mezo_rl.engine.trajectory import STATUS

__all__ = ["RENAMED", "ADDED_LATER", "recorded_options", "check_rounding_recorded", "with_noise_format", "replay_row",
           "replay_groups"]

#: earlier names of MeZO's options -> theirs: a keyword of an earlier name is refused naming its successor, and a run
#: recorded under them (trajectory header, state dict) is read under the new names (:func:`recorded_options`)
RENAMED = {"normalize": "step_normalize", "evaluation": "member_evaluation"}
#: options added after the first trajectory format, with the value that reproduces older runs (``rounding``: any
#: value reproduces a float32 run; :func:`check_rounding_recorded` refuses an older run of low-precision weights)
ADDED_LATER = dict(rank=1, lowrank_interval=1, step_normalize=None, member_evaluation="inplace", hessian_smooth=0.0,
                   rounding="stochastic")


def recorded_options(options: dict) -> dict:
    """A recorded run's options (a trajectory header, a state dict's config or param group) under this version's
    names: the keys of :data:`RENAMED` read as theirs; a run records the new names."""
    return {RENAMED.get(k, k): v for k, v in options.items()}


def check_rounding_recorded(recorded: dict, dtypes) -> None:
    """Refuse, in one line, to replay or resume a run of bf16 / fp16 weights recorded before ``rounding`` existed:
    its updates were rounded to nearest in the weights' dtype, operation by operation, which this version does
    not do again."""
    low = sorted({d for d in dtypes if d in ("bfloat16", "float16")})
    if "rounding" not in recorded and low:
        raise ValueError(f"this run's {'/'.join(low)} weights were updated by an earlier mezo-rl, which rounded every "
                         "operation of an update to nearest in their dtype; this version computes an update in float32 "
                         "and rounds it once, so it cannot replay or resume that run bit for bit: use the version that "
                         "recorded it")


def with_noise_format(header: dict) -> dict:
    """A recorded run's header with the noise format this version draws; a run whose noise this version
    cannot draw again (low-rank noise of another format) is refused in one line. Headers without the key
    predate it: format 1, whose element-wise noise is format 2's."""
    fmt = header.get("noise_format", 1)
    if fmt != _noise.FORMAT and (header.get("noise") == "lowrank" or fmt > _noise.FORMAT):
        raise ValueError(f"this run's {header.get('noise')} noise has format {fmt} "
                         f"({'factors drawn tensor by tensor' if fmt == 1 else 'from a newer mezo-rl'}); this version "
                         f"draws format {_noise.FORMAT} (every tensor of a noise sample in one draw) and cannot replay "
                         "or resume it: use the mezo-rl version that recorded it")
    return {**header, "noise_format": _noise.FORMAT}


class _ReplayAbort(Exception):
    """Raised by the replay closure where the recorded run's closure raised."""


def replay_row(opt, entries, row, t: int, batched: bool) -> None:
    """Row ``t`` of a log re-executed on ``opt`` (a :class:`~mezo_rl.engine.optim.MeZO`; its :meth:`replay`): its
    seeds, lrs and eps, the closure handing back the logged values; RuntimeError where it diverges from the log."""
    if batched and row.status != STATUS["applied"]:
        return  # a batched step that aborted or was skipped never touched the weights
    for g, lr, eps in zip(opt.param_groups, row.lrs, row.epss):
        g["lr"], g["eps"] = lr, eps
    recorded = iter(row.values[: row.calls])

    def closure(members):
        try:
            return [next(recorded) for _ in members]
        except StopIteration:
            raise _ReplayAbort() from None

    try:
        opt._replaying = True
        res = opt._step(entries, closure, list(row.seeds))
    except (_ReplayAbort, FloatingPointError):
        if row.status != STATUS["aborted"]:
            raise RuntimeError(f"replay diverged at step {t}: it aborted, the run did not") from None
        return
    finally:
        opt._replaying = False
    if row.status == STATUS["applied"] and res.projected_grads != list(row.projected_grads):
        raise RuntimeError(f"replay diverged at step {t}: projected gradients differ")


def _flat_params(params) -> list[torch.Tensor]:
    if isinstance(params, torch.nn.Module):
        return list(params.parameters())
    params = list(params)
    if params and isinstance(params[0], dict):
        return [p for g in params for p in g["params"]]
    return [p[1] if isinstance(p, tuple) else p for p in params]


def replay_groups(params, header: dict) -> list[dict]:
    """The param groups a replay of the run of ``header`` (read under today's names) is built with: ``params`` (the
    weights the run started from: a module, tensors, ``(name, tensor)`` pairs or param groups) in the groups the
    run had, each with its weight decay; one line where the tensors, their dtypes or which of them train differ
    from the run's."""
    h, flat = header, _flat_params(params)
    shapes = [list(p.shape) for p in flat]
    if shapes != h["param_shapes"]:
        first = next((i for i, (a, b) in enumerate(zip(shapes, h["param_shapes"])) if a != b),
                     min(len(shapes), len(h["param_shapes"])))
        raise ValueError(f"replay needs the {len(h['param_shapes'])} tensors the run was built with, in the same "
                         f"order and shapes; got {len(flat)} tensors (first mismatch at index {first})")
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
    return groups
