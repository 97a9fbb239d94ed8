"""User tasks without code: a JSONL or CSV file plus a template.

    >>> from tasks import from_file, register_task
    >>> task = from_file("reviews.jsonl", template="Review: {text}\\nSentiment:",
    ...                  label_column="label", candidates=[" negative", " positive"])
    >>> task = from_file({"train": "qa_train.csv", "test": "qa_test.csv"},
    ...                  template="Question: {question}\\nAnswer:", target_column="answer")
    >>> register_task("reviews")(task)     # now get_task("reviews") and `--task reviews` find it

Classification: ``candidates`` are the continuations to score and ``label_column`` holds either the
index of the right candidate or its text (compared without surrounding whitespace). Generation:
``target_column`` holds the gold answer (a string, or a list of acceptable answers).
"""
from __future__ import annotations

import csv
import json
import pathlib
import string

from .base import SPLITS, Example, Task, continuation
from .data import warn_once


def _read_rows(path: pathlib.Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"task file {str(path)!r} not found")
    if path.suffix in (".jsonl", ".json"):
        with open(path, encoding="utf-8") as f:
            if path.suffix == ".json":
                rows = json.load(f)
            else:
                rows = []
                for i, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            rows.append(json.loads(line))
                        except json.JSONDecodeError as e:
                            raise ValueError(f"{path}: line {i} is not valid JSON ({e})") from None
    elif path.suffix in (".csv", ".tsv"):
        with open(path, encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t" if path.suffix == ".tsv" else ","))
    else:
        raise ValueError(f"task file {str(path)!r}: expected a .jsonl, .json, .csv or .tsv file")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"task file {str(path)!r}: expected one object (row) per line / a list of objects")
    if not rows:
        raise ValueError(f"task file {str(path)!r} has no rows")
    return rows


class FileTemplateTask(Task):
    """A task built from files and a ``{column}`` template (see ``from_file``)."""

    def __init__(self, files, template, label_column=None, candidates=None, target_column=None, name=None):
        self.files = {s: pathlib.Path(p) for s, p in (files.items() if isinstance(files, dict) else {s: files for s in SPLITS}.items())}
        bad = set(self.files) - set(SPLITS)
        if bad:
            raise ValueError(f"files: unknown split(s) {sorted(bad)}; accepted: {SPLITS}")
        self.shared_file = not isinstance(files, dict)
        self.template = template
        self.fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
        if any(not f or not f.isidentifier() for f in self.fields):
            raise ValueError(f"template {template!r}: every field must be a {{column}} name")
        if target_column is not None:
            if label_column is not None or candidates is not None:
                raise ValueError("give either target_column (generation) or label_column + candidates (classification), not both")
            self.kind = "generation"
        elif label_column is not None and candidates:
            self.kind = "classification"
        else:
            raise ValueError("a file task needs target_column (generation) or label_column and candidates (classification)")
        self.label_column, self.target_column = label_column, target_column
        self.candidates = list(candidates) if candidates else None
        self.name = name or next(iter(self.files.values())).stem
        for split, path in self.files.items():  # fail now, not in the middle of training
            self._check_columns(_read_rows(path)[0], path)

    def _check_columns(self, row, path):
        needed = self.fields + [c for c in (self.label_column, self.target_column) if c is not None]
        missing = [c for c in needed if c not in row]
        if missing:
            raise KeyError(f"task file {str(path)!r}: missing column(s) {missing}; the file has columns {sorted(row)}")

    def _label(self, value, path, i) -> int:
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            if 0 <= value < len(self.candidates):
                return value
        else:
            texts = [c.strip() for c in self.candidates]
            if str(value).strip() in texts:
                return texts.index(str(value).strip())
        raise ValueError(f"{path} row {i}: label {value!r} is neither a candidate index 0..{len(self.candidates) - 1} "
                         f"nor one of the candidates {self.candidates}")

    def examples(self, split, data_dir=None):
        if split not in self.files:
            raise ValueError(f"task {self.name!r} has no {split!r} file; it has {sorted(self.files)}")
        if self.shared_file and split != "train":
            warn_once(f"task {self.name!r}: one file serves every split; pass files={{'train': ..., 'test': ...}} to keep them apart")
        path = self.files[split]
        out = []
        for i, row in enumerate(_read_rows(path)):
            self._check_columns(row, path)
            prompt = self.template.format(**{f: row[f] for f in self.fields})
            if self.kind == "generation":
                gold = row[self.target_column]
                gold = gold if isinstance(gold, list) else [gold]
                out.append(Example(prompt, answers=[continuation(prompt, str(g)) for g in gold], columns=row))
            else:
                out.append(Example(prompt, list(self.candidates), self._label(row[self.label_column], path, i), columns=row))
        return out


def from_file(files, template: str, label_column: str | None = None, candidates: list[str] | None = None,
              target_column: str | None = None, name: str | None = None) -> Task:
    """A task from a JSONL/JSON/CSV/TSV file (or ``{"train": path, "validation": path, "test": path}``).

    Args:
        files: one path (used for every split, with a warning) or a dict of split -> path.
        template: the prompt, with ``{column}`` fields filled from each row.
        label_column, candidates: classification: the column with the right candidate's index or text,
            and the candidate continuations (with their leading space, e.g. ``[" no", " yes"]``).
        target_column: generation: the column with the gold answer (string or list of strings).
        name: the task's name (default: the file's stem).

    Missing files, missing columns and labels that match no candidate raise errors naming the problem.
    """
    return FileTemplateTask(files, template, label_column=label_column, candidates=candidates,
                            target_column=target_column, name=name)
