"""Data-parallel MeZO with torch.distributed: agree on a few scalars, never send weights.

A MeZO step perturbs the weights with noise drawn from a *step seed*, evaluates the loss at
``theta + eps*z`` and ``theta - eps*z``, and moves every weight along ``z`` by
``-lr * (L+ - L-) / (2 eps)``. If every worker holds the same weights and uses the same step seed,
the only thing the workers must agree on is the two losses. So data-parallel MeZO is:

1. every rank samples the SAME global batch (same data seed) and keeps its contiguous shard
   (:meth:`DistContext.shard`);
2. inside the closure each rank evaluates its shard and produces *sums and counts* (e.g. the sum of
   per-example losses and the number of examples), not a mean;
3. the sums and counts are all-reduced (:meth:`DistContext.all_reduce_sum`, a handful of float64
   values), and every rank forms the same global loss = global sum / global count;
4. every rank applies the same update, so the replicas stay bit-identical without exchanging a
   single weight.

Weighting by counts (rather than averaging per-rank means) makes the result independent of how the
batch is split, including uneven shards and empty shards when the batch is smaller than the world.

``DistContext.from_env()`` is the entry point. Under ``torchrun`` (``WORLD_SIZE > 1``) it joins the
process group (gloo on CPU, NCCL on CUDA). Otherwise it is a single-process context whose methods
are cheap no-ops, so the same training loop runs unchanged with or without torchrun::

    ctx = DistContext.from_env()
    ctx.check_same_weights(model.named_parameters())   # cheap checksum; raises if replicas differ
    for step in range(steps):
        batch = ctx.shard(sample_global_batch(step))    # same global batch on every rank
        def closure():
            total, n = shard_loss_sum(batch)            # this rank's part
            total, n = ctx.all_reduce_sum([total, n])
            return total / n
        opt.step(closure)                                # same seed on every rank -> same update
        if ctx.is_main:
            log(...)                                     # only rank 0 writes files
    ctx.close()                                          # or: with DistContext.from_env() as ctx: ...

:attr:`DistContext.bytes_communicated` counts the payload bytes this rank handed to collectives,
so a trainer can report the communication volume per step (typically 2 all-reduces of a few float64
values: tens of bytes, whatever the model size).

Models larger than one device are a different axis (model sharding, not data parallelism): load
them with ``device_map="auto"`` and every parameter stays on its own device; the engine perturbs each
parameter where it lives. :func:`mezo_rl.model.peft.check_no_offload` rejects the one layout MeZO cannot
train in place: trainable weights offloaded to CPU/disk by accelerate hooks. See docs/distributed.md.
"""
from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["DistContext", "WeightMismatchError", "weight_checksums"]


class WeightMismatchError(RuntimeError):
    """Raised (on every rank) when the replicas do not hold identical weights."""


# Elements per chunk when checksumming, so no parameter-sized temporary is ever allocated.
_CHUNK = 1 << 20
# Position weights within a chunk cycle through 1..65521 (a prime).
_WEIGHT_PERIOD = 65521
_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def weight_checksums(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """Exact, order-independent checksums of each tensor's bits: an int64 tensor of shape [n, 3].

    Row ``i`` holds ``(numel, sum of bits, position-weighted sum of bits)`` of the i-th tensor, where
    "bits" are the elements reinterpreted as integers of the same width (float32 -> int32, bfloat16 ->
    int16, ...). Integer sums are exact (modulo 2**64) and do not depend on reduction order, so
    bit-identical tensors always get the same row, on any device. A change in one element always
    changes the plain sum; swapped or shifted elements change the weighted sum (element ``j`` of
    chunk ``k`` weighs ``(k + 1) * (j % 65521 + 1)``); only a contrived multi-element difference
    could cancel in both. The work is done on each tensor's own device in chunks of 2**20 elements,
    so nothing parameter-sized is allocated. The result lives on the CPU.
    """
    rows, position_weights = [], {}
    for t in tensors:
        t = t.detach()
        if t.device.type == "meta":
            raise ValueError(
                "cannot checksum a tensor on the 'meta' device: the weights are not materialised "
                "(offloaded by accelerate?). See mezo_rl.model.peft.check_no_offload."
            )
        if t.dtype.is_complex:
            raise TypeError(f"weight_checksums does not handle complex tensors (got {t.dtype})")
        flat = t.reshape(-1)  # a view for contiguous parameters (the usual case)
        if t.dtype.is_floating_point:
            flat = flat.view(_INT_VIEW[t.element_size()])  # same bits, read as integers
        total = torch.zeros((), dtype=torch.int64, device=t.device)
        weighted = torch.zeros((), dtype=torch.int64, device=t.device)
        if t.device not in position_weights:
            position_weights[t.device] = torch.arange(_CHUNK, device=t.device) % _WEIGHT_PERIOD + 1
        w = position_weights[t.device]
        for k, start in enumerate(range(0, flat.numel(), _CHUNK)):
            chunk = flat[start : start + _CHUNK].to(torch.int64)
            total += chunk.sum()
            weighted += (k + 1) * (chunk * w[: chunk.numel()]).sum()
        rows.append(torch.stack([torch.tensor(t.numel(), device=t.device), total, weighted]).cpu())
    if not rows:
        return torch.zeros((0, 3), dtype=torch.int64)
    return torch.stack(rows)


def _json_bytes(obj: Any, what: str) -> bytes:
    """``obj`` as JSON text (keys sorted); TypeError naming ``what`` if it is not a JSON value."""
    try:
        return json.dumps(obj, sort_keys=True).encode()
    except (TypeError, ValueError) as e:
        raise TypeError(f"{what} must be a JSON value (dict, list, str, int, float, bool or None) to be "
                        f"compared across ranks: {e}") from None


class DistContext:
    """Where this process stands in a data-parallel run, and the few collectives MeZO needs.

    Attributes:
        rank: this process's index in ``[0, world_size)``.
        world_size: number of processes (1 without torchrun).
        local_rank: index on this machine (selects the GPU under NCCL).
        device: where this rank computes (``cuda:<local_rank>`` under NCCL, else ``cpu``).
        backend: "gloo", "nccl", or None for a single process.
        bytes_communicated: payload bytes this rank has handed to collectives so far (float64 values
            count 8 bytes each; a compared object its JSON bytes, padded to the longest rank's, and 8 for
            its length). A single process communicates nothing and stays at 0. Read it before and after
            a step for bytes/step.

    Build it with :meth:`from_env`; the constructor is for tests and for callers that manage the
    process group themselves.
    """

    def __init__(self, rank: int = 0, world_size: int = 1, local_rank: int = 0,
                 device: torch.device | str = "cpu", backend: str | None = None,
                 owns_group: bool = False):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"invalid rank {rank} for world_size {world_size}: need 0 <= rank < world_size")
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.device = torch.device(device)
        self.backend = backend
        self.bytes_communicated = 0
        self._owns_group = owns_group

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_env(cls, backend: str | None = None, timeout_s: float = 600.0) -> "DistContext":
        """Join the torchrun process group if there is one, else return a single-process context.

        Reads the variables torchrun sets (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``,
        ``MASTER_PORT``). With ``WORLD_SIZE > 1`` it calls ``init_process_group`` unless a group is
        already initialised (then it adopts that group and leaves it open on :meth:`close`).

        Args:
            backend: "gloo" or "nccl"; default NCCL when CUDA is available, else gloo.
            timeout_s: how long a collective may wait for the other ranks before failing.
        """
        if dist.is_available() and dist.is_initialized():
            backend = dist.get_backend()
            local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
            return cls(dist.get_rank(), dist.get_world_size(), local_rank,
                       cls._device_for(backend, local_rank), backend, owns_group=False)

        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size <= 1:
            return cls()
        if not dist.is_available():
            raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed support")
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"unknown backend {backend!r}: use 'gloo' (CPU) or 'nccl' (CUDA)")
        if backend == "nccl" and not torch.cuda.is_available():
            raise ValueError("backend 'nccl' needs CUDA, which is not available here; use 'gloo'")
        for var in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
            if var not in os.environ:
                raise RuntimeError(
                    f"WORLD_SIZE={world_size} but {var} is not set: launch with "
                    "`torchrun --nproc-per-node N ...`, which sets RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT"
                )
        rank = int(os.environ["RANK"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        device = cls._device_for(backend, local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        return cls(rank, world_size, local_rank, device, backend, owns_group=True)

    @staticmethod
    def _device_for(backend: str, local_rank: int) -> torch.device:
        return torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")

    # ------------------------------------------------------------------ queries
    @property
    def is_main(self) -> bool:
        """True on rank 0, the only rank that should write logs, summaries and trajectories."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def __repr__(self) -> str:
        return (f"DistContext(rank={self.rank}, world_size={self.world_size}, device={self.device}, "
                f"backend={self.backend})")

    # ------------------------------------------------------------------ data
    def shard_bounds(self, n: int) -> tuple[int, int]:
        """``(start, stop)`` of this rank's contiguous share of ``n`` items.

        Shares differ by at most one item: the first ``n % world_size`` ranks get one extra. When
        ``n < world_size`` the last ranks get an empty share; that is fine as long as losses are
        combined as all-reduced sums and counts (an empty share contributes zeros).
        """
        if n < 0:
            raise ValueError(f"number of items must be >= 0, got {n}")
        base, extra = divmod(n, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return start, start + base + (1 if self.rank < extra else 0)

    def shard(self, items: Sequence) -> list:
        """This rank's contiguous share of the global batch ``items`` (see :meth:`shard_bounds`).

        Every rank must pass the same global batch (sample it with the same seed); the shares of all
        ranks, concatenated in rank order, are exactly ``items``.
        """
        start, stop = self.shard_bounds(len(items))
        return list(items[start:stop])

    # ------------------------------------------------------------------ collectives
    def all_reduce_sum(self, values: Sequence[float] | torch.Tensor) -> list[float] | torch.Tensor:
        """Sum ``values`` element-wise across ranks, in float64.

        A list (or tuple) of numbers gives back a list of Python floats; a tensor gives back a float64
        tensor of the same shape on the same device. All ranks must pass the same number of values.
        float64 keeps sums of per-example losses exact to ~1e-16 relative, far below float32 noise.
        One collective per call, so pack everything a step needs (e.g. several reward components'
        sums and counts) into one call.
        """
        is_tensor = isinstance(values, torch.Tensor)
        if not is_tensor and not isinstance(values, (list, tuple)):
            raise TypeError(f"all_reduce_sum takes a list of floats or a tensor, got {type(values).__name__}")
        if is_tensor:
            buf = values.detach().to(dtype=torch.float64)
        else:
            try:
                buf = torch.tensor([float(v) for v in values], dtype=torch.float64)
            except (TypeError, ValueError) as e:
                raise TypeError(f"all_reduce_sum: every value must be a number, got {list(values)!r}") from e
        if self.is_distributed:
            home = buf.device
            buf = buf.to(self.device)
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            self.bytes_communicated += buf.numel() * buf.element_size()
            buf = buf.to(home)
        return buf if is_tensor else buf.tolist()

    def all_reduce_sum_dict(self, mapping: Mapping[str, float], keys: Sequence[str]) -> dict[str, float]:
        """Sum a name -> number mapping across ranks in one collective.

        ``keys`` fixes the order (it must be the same on every rank); a key missing from ``mapping``
        counts as 0, so a rank with an empty shard (no values for some component) can still take part.
        Keys in ``mapping`` but not in ``keys`` are an error, so nothing is dropped silently.
        """
        unknown = set(mapping) - set(keys)
        if unknown:
            raise KeyError(f"all_reduce_sum_dict: keys {sorted(unknown)} are not in the agreed keys {list(keys)}")
        summed = self.all_reduce_sum([float(mapping.get(k, 0.0)) for k in keys])
        return dict(zip(keys, summed))

    def check_same_weights(self, params: Iterable[torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
                           | Mapping[str, torch.Tensor]) -> None:
        """Verify that every rank holds bit-identical weights; raise :class:`WeightMismatchError` if not.

        ``params`` is ``model.named_parameters()`` (best: errors name the tensor), a state dict, or a
        plain iterable of tensors. Each rank computes :func:`weight_checksums` (exact integer sums of
        the weights' bits, chunked on each tensor's device) and the ranks all-gather them: 3 int64
        per tensor, a few KB for a whole LLM. Every rank checks and raises the same error, so no rank
        is left waiting. A single process returns at once.
        """
        if not self.is_distributed:
            return
        if isinstance(params, Mapping):
            named = list(params.items())
        else:
            named = [p if isinstance(p, tuple) else (f"tensor[{i}]", p) for i, p in enumerate(params)]
        local = weight_checksums(t for _, t in named).to(self.device)

        counts = self._all_gather(torch.tensor([local.shape[0]], dtype=torch.int64, device=self.device))
        if len(set(counts.view(-1).tolist())) > 1:
            raise WeightMismatchError(
                "ranks hold different numbers of tensors (per rank: "
                f"{counts.view(-1).tolist()}): every rank must load the same model with the same adapters"
            )
        gathered = self._all_gather(local).cpu()  # [world, n, 3]
        problems = []
        for r in range(1, self.world_size):
            differing = (gathered[r] != gathered[0]).any(dim=1).nonzero().view(-1).tolist()
            if differing:
                names = [named[i][0] for i in differing]
                shown = ", ".join(names[:5]) + (f" (and {len(names) - 5} more)" if len(names) > 5 else "")
                problems.append(f"rank {r} differs from rank 0 in {len(names)} tensor(s): {shown}")
        if problems:
            raise WeightMismatchError(
                "replicas do not start from identical weights: " + "; ".join(problems) + ". Every rank "
                "must load the same checkpoint and initialise any new weights (heads, adapters) from the "
                "same seed; data-parallel MeZO never sends weights, so a difference would persist."
            )

    def check_same_object(self, obj: Any, what: str = "value") -> None:
        """Raise :class:`WeightMismatchError` on every rank unless all ranks pass an equal ``obj``.

        For the settings the replicas must share besides the weights, e.g. the training arguments,
        the step seed, or the resolved noise backend: a rank that silently fell back to another noise
        generator would draw different perturbations and drift away from the others. ``what`` names
        the value in the error. ``obj`` is a JSON value (dicts, lists, strings, numbers, booleans,
        None): the ranks all-gather its JSON text (keys sorted) and compare the parsed values with
        ``==``; nothing a peer sends is unpickled.
        """
        data = _json_bytes(obj, what)  # refused on one process as on many
        if not self.is_distributed:
            return
        gathered = self._all_gather_bytes(data)
        differing = [r for r in range(1, self.world_size) if gathered[r] != gathered[0]]
        if differing:
            shown = "; ".join(f"rank {r}: {gathered[r]!r}" for r in differing[:3])
            raise WeightMismatchError(f"ranks disagree on {what}: rank 0: {gathered[0]!r}; {shown}")

    def _all_gather_bytes(self, data: bytes) -> list:
        """Every rank's JSON ``data``, parsed: two all-gathers (the lengths, then the bytes padded to the longest)."""
        sizes = self._all_gather(torch.tensor([len(data)], dtype=torch.int64, device=self.device))[:, 0].tolist()
        buf = torch.zeros(max(sizes), dtype=torch.uint8)
        buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        rows = self._all_gather(buf.to(self.device)).cpu()
        return [json.loads(rows[r, :n].numpy().tobytes()) for r, n in enumerate(sizes)]

    def _all_gather(self, t: torch.Tensor) -> torch.Tensor:
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(out, t.contiguous())
        self.bytes_communicated += t.numel() * t.element_size()
        return torch.stack(out)

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        if self.is_distributed:
            dist.barrier()

    def close(self, *, wait: bool = True) -> None:
        """Leave the process group if this context created it (idempotent).

        With ``wait`` (a normal end) every rank first waits for the others (a barrier), so no rank
        tears its connections down, or exits, while another still uses them. On an error path pass
        ``wait=False``: the other ranks may be blocked in a collective that this rank never reaches.
        """
        if self._owns_group and dist.is_initialized():
            if wait:
                dist.barrier()
            dist.destroy_process_group()
        self._owns_group = False

    def __enter__(self) -> "DistContext":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Close on leaving a ``with`` block: waiting for the other ranks only if the block ended normally."""
        self.close(wait=exc_type is None)
