"""Member rows: how ``score`` and ``generate`` lay out the members of a batched evaluation.

With ``members=M`` (the batched evaluation of :mod:`mezo_rl.engine.population`) every forward pass runs on
M copies of its batch in member-major layout: rows [k*b, (k+1)*b) are member k's (``batch_size`` counts
the sequences of one member, so a forward holds M * batch_size rows), and the result is one list per
member. The model knows only M. Here: the count's check and the row arithmetic of that layout.
"""
from __future__ import annotations

import torch


def check_members(members) -> int:
    """The member count M of ``score`` / ``generate`` (1 without members)."""
    if members is None:
        return 1
    if isinstance(members, bool) or not isinstance(members, int) or members < 1:
        raise ValueError(f"members must be a positive integer (the number of member blocks), got {members!r}")
    return members


def block_offsets(members: int, rows: int, device) -> torch.Tensor:
    """The first row of each member's block [M, 1] of a member-major batch of ``members`` blocks of ``rows``."""
    return torch.arange(members, device=device)[:, None] * rows


def member_rows(rows: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``rows`` (indices into one member's block) in every member's block, member-major [M * len(rows)];
    ``offsets``: :func:`block_offsets`."""
    return (rows[None, :] + offsets).reshape(-1)
