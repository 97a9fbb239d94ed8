"""The results file: one JSON line per finished (or failed) cell, appended, never rewritten.

The latest line of a key wins; a torn last line (an interrupted write) is ignored.
"""
from __future__ import annotations

import json
import os
import pathlib

from .plan import Cell


def load_records(path) -> list[dict]:
    """Every record of the JSONL file (a torn last line, from an interrupted write, is ignored)."""
    path = pathlib.Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def append_record(path, record: dict) -> None:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torn = path.exists() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
    with open(path, "a") as f:
        # after an interrupted write, start a new line so the torn one does not swallow this record
        f.write(("\n" if torn else "") + json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def latest_by_key(records: list[dict]) -> dict:
    out = {}
    for r in records:
        if "key" in r:
            out[r["key"]] = r
    return out


def pending(cells: list[Cell], records: list[dict]) -> list[Cell]:
    """The cells without a successful record (never run, or failed last time)."""
    done = {k for k, r in latest_by_key(records).items() if r.get("status") == "ok"}
    return [c for c in cells if c.key not in done]

