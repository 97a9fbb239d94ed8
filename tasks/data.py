"""Reading the local data directory (one folder per task, the files as their authors distribute them;
docs/tasks.md lists them).

The directory is found from the ``data_dir`` argument, else the ``MEZO_RL_DATA`` environment
variable. Files are read with the standard library only (jsonl, json, tsv, csv) and cached in memory
per process, so loading several splits of one task reads each file once. A user's data file
(``mezo_rl.tasks.user``) is read by :func:`read_rows`: JSONL, JSON, CSV, TSV, and Parquet or Arrow with pyarrow.
"""
from __future__ import annotations

import csv
import functools
import json
import logging
import os
import pathlib
import random

from mezo_rl.errors import UserError

log = logging.getLogger("mezo_rl.tasks")


class TaskFileNotFoundError(UserError, FileNotFoundError):
    """A task's data (directory, file or dataset) cannot be found; the one-line message says where it looked."""


class TaskDataError(UserError, ValueError):
    """Data that cannot be read or used as asked (bad JSON, a label that matches no candidate, ...)."""


DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet", ".arrow")
TABLE_SUFFIXES = (".parquet", ".arrow")  # read with pyarrow
ACCEPTED_FILES = "a .jsonl, .json, .csv, .tsv, .parquet or .arrow file"

CARVE_SEED = 0  # validation/test carved out of a train file always use this seed: splits never overlap


def data_root(data_dir=None) -> pathlib.Path | None:
    """The data directory: ``data_dir`` if given, else ``$MEZO_RL_DATA``; None when neither is set
    (the tasks then load the Hugging Face datasets); a clear error if the given one does not exist."""
    given = data_dir if data_dir is not None else os.environ.get("MEZO_RL_DATA")
    if given is None:
        return None
    root = pathlib.Path(given).expanduser()
    if not root.is_dir():
        raise TaskFileNotFoundError(f"data directory {str(root)!r} does not exist (given as {'--data-dir / data_dir=' if data_dir is not None else '$MEZO_RL_DATA'})")
    return root


def hub_rows(task: str, dataset: str, config: str | None, split: str) -> list[dict]:
    """Rows of a Hugging Face dataset split (online, or from the local HF cache)."""
    try:
        import datasets

        return list(datasets.load_dataset(dataset, config, split=split))
    except Exception as e:
        raise TaskFileNotFoundError(
            f"task {task!r}: no data directory given (data_dir=..., CLI --data-dir, or MEZO_RL_DATA pointing at a "
            f"directory with one folder per task, as docs/tasks.md lists them), and the Hugging Face dataset {dataset!r}"
            f"{f' ({config})' if config else ''} split {split!r} could not be loaded: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from e


def find(root: pathlib.Path, relative: str, task: str) -> pathlib.Path:
    path = root / relative
    if not path.is_file():
        raise TaskFileNotFoundError(f"task {task!r}: data file {str(path)!r} not found (expected under the data directory {str(root)!r})")
    return path


@functools.lru_cache(maxsize=64)
def _read(path: str, mtime: float):
    p = pathlib.Path(path)
    if p.suffix == ".jsonl":
        with open(p, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    if p.suffix == ".json":
        with open(p, encoding="utf-8") as f:
            return json.load(f)
    raise ValueError(f"cannot read {path!r}: expected .jsonl or .json (use read_table for .tsv/.csv)")


def read(path: pathlib.Path):
    """Rows of a .jsonl file (list of dicts) or the object in a .json file (cached per process)."""
    return _read(str(path), path.stat().st_mtime)


@functools.lru_cache(maxsize=64)
def _read_table(path: str, mtime: float, header: bool, delimiter: str):
    with open(path, encoding="utf-8", newline="") as f:
        quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
        reader = csv.reader(f, delimiter=delimiter, quoting=quoting)
        rows = [r for r in reader if r]
    if not header:
        return rows
    names = rows[0]
    return [dict(zip(names, r)) for r in rows[1:]]


def read_table(path: pathlib.Path, header: bool = True) -> list:
    """Rows of a .tsv (tab, no quoting) or .csv file: dicts by header name, or lists when ``header=False``."""
    return _read_table(str(path), path.stat().st_mtime, header, "\t" if path.suffix == ".tsv" else ",")


def carve(items: list, sizes: list[int]) -> list[list]:
    """Split ``items`` into consecutive parts of the given sizes after one fixed shuffle (``CARVE_SEED``);
    the last part gets the rest. The same items always give the same parts."""
    order = list(range(len(items)))
    random.Random(CARVE_SEED).shuffle(order)
    parts, start = [], 0
    for size in sizes:
        parts.append([items[i] for i in order[start : start + size]])
        start += size
    parts.append([items[i] for i in order[start:]])
    return parts


_warned: set = set()


def warn_once(message: str):
    """Log a data caveat (partial or stand-in files) once per process."""
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


# ---------------------------------------------------------------------------------------- a user's data file
def _table_rows(path: pathlib.Path) -> list[dict]:
    """The rows of a Parquet file or an Arrow file (IPC stream, as ``datasets`` writes them, or IPC file)."""
    try:
        import pyarrow as pa
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise UserError(f"task file {str(path)!r}: reading {path.suffix} files needs pyarrow: pip install pyarrow") from None
    try:
        if path.suffix == ".parquet":
            table = pyarrow.parquet.read_table(path)
        else:
            try:
                with pa.memory_map(str(path)) as source:
                    table = pyarrow.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                with pa.memory_map(str(path)) as source:
                    table = pyarrow.ipc.open_file(source).read_all()
    except (pa.ArrowException, OSError) as e:
        raise TaskDataError(f"task file {str(path)!r}: not a readable {path.suffix[1:]} table "
                            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    return table.to_pylist()


def read_rows(path: str | pathlib.Path) -> list[dict]:
    """The rows of a JSONL / JSON / CSV / TSV / Parquet / Arrow file as dicts (TaskDataError naming the
    file and line)."""
    path = pathlib.Path(path)
    if path.suffix.lower() not in DATA_SUFFIXES:
        raise TaskDataError(f"task file {str(path)!r}: expected {ACCEPTED_FILES}")
    if not path.is_file():
        raise TaskFileNotFoundError(f"task file {str(path)!r} not found")
    if path.suffix.lower() in TABLE_SUFFIXES:
        rows = _table_rows(path)
        if not rows:
            raise TaskDataError(f"task file {str(path)!r} has no rows")
        return rows
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".csv", ".tsv"):
        rows = list(csv.DictReader(text.splitlines(), delimiter="\t" if path.suffix == ".tsv" else ","))
    else:
        rows = None
        if path.suffix == ".json":
            try:
                rows = json.loads(text)
            except json.JSONDecodeError:
                rows = None  # JSON Lines under a .json name (common on the hub): read line by line below
            if isinstance(rows, dict):  # {"data": [...]}: one list of rows inside an object
                lists = [v for v in rows.values() if isinstance(v, list)]
                rows = lists[0] if len(lists) == 1 else rows
        if rows is None:
            rows = []
            for i, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise TaskDataError(f"{path}: line {i} is not valid JSON ({e.msg})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise TaskDataError(f"task file {str(path)!r}: expected one object (row) per line, or a list of objects")
    if not rows:
        raise TaskDataError(f"task file {str(path)!r} has no rows")
    return rows
