"""User tasks without code: a data file or a Hugging Face dataset, plus a template.

    >>> from mezo_rl.tasks import from_file, from_dataset, register_task
    >>> task = from_file("reviews.jsonl", template="Review: {text}\\nSentiment:",
    ...                  label_column="label", candidates=["negative", "positive"])
    >>> task = from_file({"train": "qa_train.csv", "test": "qa_test.csv"},
    ...                  template="Question: {question}\\nAnswer:", target_column="answer")
    >>> task = from_dataset("stanfordnlp/imdb", template="{text} It was", label_column="label",
    ...                     candidates=["terrible", "great"])       # a hub id, or a local dataset directory
    >>> register_task("reviews")(task)     # now get_task("reviews") and `--task reviews` find it

Files: JSONL, JSON (a list of objects; JSON Lines under a .json name also works), CSV or TSV with a
header row, Parquet (the format the Hugging Face Hub stores datasets in) or Arrow (a ``datasets``
cache or ``save_to_disk`` shard; read with pyarrow). Hugging Face datasets: a hub id (online, or already
in the local cache), a directory written by ``save_to_disk`` (read with ``datasets.load_from_disk``), a
directory of data files (``datasets.load_dataset``), or the objects themselves: a ``datasets.Dataset``
(the train rows), a ``DatasetDict`` (its splits), a dict of split -> ``Dataset``, or an
``IterableDataset`` / ``IterableDatasetDict`` (a stream: only its first ``max_rows`` rows are read).

Classification: ``candidates`` are the continuations to score; each becomes a continuation of the
prompt (a leading space is added where neither side has whitespace: ``"great"`` after ``"It was"``
is scored as ``" great"``). ``label_column`` holds the index of the right candidate or its text
(compared without surrounding whitespace); rows labelled ``None`` or ``-1`` (Hugging Face's
"no label", e.g. GLUE test splits) are left out. Generation: ``target_column`` holds the gold answer
(a string, a list of acceptable answers, or SQuAD's ``{"text": [...]}``).

Prompts only (TRL's "prompt-only" datasets): rows with a ``prompt`` column and no gold answer; the
run's rewards judge what the model writes. The prompt is plain text, or a list of chat messages
(``[{"role": "user", "content": ...}]``, TRL's "conversational" format) that the model renders with
its tokenizer's chat template, generation prompt added. Another column can hold the prompt
(``prompt_column``), or a ``{column}`` template can build it. Every other column reaches the rewards
as a keyword, as in TRL:

    >>> task = from_prompts("prompts.jsonl")                       # {"prompt": "...", "topic": "..."}
    >>> task = from_prompts("reviews.csv", template="Continue this review: {text}")

Splits: a file per split (``{"train": ..., "validation": ..., "test": ...}``); a split without a file
(or a dataset split that is missing or has no labels) is carved out of the train rows: 10% each (at
least one row) after a fixed shuffle, the rest stays train, so nothing is evaluated on training rows.

Mistakes raise :class:`~mezo_rl.errors.UserError` subclasses whose one-line message names the
problem: a missing file, a missing column (and the columns that exist), a label that matches no
candidate (and the row), a bad combination of options.
"""
from __future__ import annotations

import itertools
import pathlib
import string
import sys

from mezo_rl.errors import ConfigError, UserError

from .base import SPLITS, Example, Task, continuation
from .data import ACCEPTED_FILES, DATA_SUFFIXES, TaskDataError, TaskFileNotFoundError, carve, read_rows, warn_once

__all__ = ["DATA_SUFFIXES", "is_dataset_object", "is_iterable_dataset", "MissingColumnError", "TaskDataError", "TaskFileNotFoundError", "TemplateTask",
           "FileTemplateTask", "DatasetTemplateTask", "check_template_options", "check_messages", "from_file",
           "from_dataset", "from_prompts", "read_rows", "HELD_OUT_FRACTION", "PROMPT_COLUMN"]

HELD_OUT_FRACTION = 0.1  # of the train rows, for each split that has no file of its own
NO_LABEL = (None, -1, "", "-1")
PROMPT_COLUMN = "prompt"  # TRL's prompt-only convention


class MissingColumnError(UserError, KeyError):
    """A template field or label/target column that the data does not have."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


# ---------------------------------------------------------------------------------------- options
def template_fields(template: str) -> list[str]:
    """The ``{column}`` names in ``template`` (ConfigError for anything else inside braces)."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise ConfigError(f"template {template!r}: {e}; write columns as {{column}} and literal braces as {{{{ }}}}") from None
    bad = [f for f in fields if not f or not f.isidentifier()]
    if bad:
        raise ConfigError(f"template {template!r}: every {{field}} must be a column name, got {bad}")
    return fields


def check_template_options(template, label_column=None, candidates=None, target_column=None,
                           prompt_column=None) -> str:
    """Check the options of a file or dataset task without reading any data; returns its kind.

    Accepted: ``template`` plus either ``target_column`` (generation) or ``label_column`` with two
    or more ``candidates`` (classification); or neither, for a prompt-only task: the prompt from
    ``prompt_column`` (default ``prompt``) or from ``template``. Raises :class:`~mezo_rl.errors.ConfigError`.
    """
    if target_column is None and label_column is None and not candidates:
        if template and prompt_column:
            raise ConfigError("give either --prompt-column (the prompt is a column) or --template (the prompt is built "
                              "from columns), not both")
        if template:
            template_fields(template)
        return "prompts"
    if prompt_column:
        raise ConfigError("--prompt-column is for prompt-only tasks; with --target-column or --label-column the prompt "
                          "is built by --template")
    if not template:
        raise ConfigError("a file or dataset task with a target or label column needs a template (--template), e.g. '{text} It was'")
    template_fields(template)
    if target_column is not None:
        if label_column is not None or candidates:
            raise ConfigError("give either a target column (generation: --target-column) or a label column and "
                              "candidates (classification: --label-column with --candidates), not both")
        return "generation"
    if label_column is None:
        raise ConfigError(f"--candidates {list(candidates)} need --label-column (the column with the right candidate)")
    if not candidates or len(candidates) < 2:
        raise ConfigError(f"--label-column {label_column!r} needs two or more --candidates (the continuations "
                          f"to score, e.g. --candidates terrible,great); got {list(candidates or [])}")
    if any(not str(c).strip() for c in candidates):
        raise ConfigError(f"--candidates: every candidate must have some text; got {list(candidates)}")
    return "classification"


def check_messages(value, where: str) -> list[dict]:
    """A conversational prompt: a non-empty list of ``{"role": str, "content": str}`` (TaskDataError otherwise)."""
    ok = isinstance(value, (list, tuple)) and len(value) > 0 and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value)
    if not ok:
        shown = repr(value)
        raise TaskDataError(f"{where}: a prompt must be text or a list of chat messages {{'role': str, 'content': str}} "
                            f"(TRL's conversational format); got {shown[:80] + '...' if len(shown) > 80 else shown}")
    return [{"role": m["role"], "content": m["content"]} for m in value]


# ---------------------------------------------------------------------------------------- tasks
class TemplateTask(Task):
    """Rows rendered through a ``{column}`` template; subclasses say where each split's rows come from."""

    def __init__(self, template, label_column=None, candidates=None, target_column=None, name=None, prompt_column=None):
        self.kind = check_template_options(template, label_column, candidates, target_column, prompt_column)
        self.template, self.fields = template, template_fields(template) if template else []
        self.prompt_column = (prompt_column or PROMPT_COLUMN) if self.kind == "prompts" and not template else None
        self.label_column, self.target_column = label_column, target_column
        self.candidates = [str(c) for c in candidates] if candidates else None
        self.name = name or "user"

    # subclasses: _split_rows(split) -> (rows, source) or None when the split has no rows of its own
    def _split_rows(self, split):
        raise NotImplementedError

    def _needed_columns(self) -> list[str]:
        own = (self.label_column, self.target_column, self.prompt_column)
        return list(dict.fromkeys(self.fields + [c for c in own if c is not None]))

    def _check_columns(self, columns, source) -> None:
        missing = [c for c in self._needed_columns() if c not in columns]
        if missing and missing == [self.prompt_column]:
            raise MissingColumnError(f"{source}: no {self.prompt_column!r} column to take the prompts from; the data "
                                     f"has columns {sorted(columns)}: name the prompt column (--prompt-column) or build "
                                     f"the prompt from columns (--template '... {{column}} ...')")
        if missing:
            raise MissingColumnError(f"{source}: missing column(s) {missing} (used by "
                                     f"{'the template' if set(missing) <= set(self.fields) else 'the options'}); "
                                     f"the data has columns {sorted(columns)}")

    def _label(self, value, source, i) -> int:
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            if 0 <= value < len(self.candidates):
                return value
        else:
            texts = [c.strip() for c in self.candidates]
            if str(value).strip() in texts:
                return texts.index(str(value).strip())
        raise TaskDataError(f"{source} row {i + 1}: label {value!r} is neither a candidate index 0..{len(self.candidates) - 1} "
                            f"nor one of the candidates {self.candidates}")

    def _example(self, row, source, i) -> Example | None:
        self._check_columns(row, source)
        if self.kind == "prompts":
            return self._prompt_example(row, source, i)
        prompt = self.template.format(**{f: row[f] for f in self.fields})
        if self.kind == "generation":
            gold = row[self.target_column]
            if isinstance(gold, dict) and "text" in gold:  # SQuAD's {"text": [...], "answer_start": [...]}
                gold = gold["text"]
            gold = [str(g) for g in (gold if isinstance(gold, (list, tuple)) else [gold])
                    if g is not None and str(g).strip()]
            if not gold:
                return None
            return Example(prompt, answers=list(dict.fromkeys(continuation(prompt, g) for g in gold)), columns=dict(row))
        value = row[self.label_column]
        if value in NO_LABEL:
            return None
        return Example(prompt, [continuation(prompt, c) for c in self.candidates], self._label(value, source, i),
                       columns=dict(row))

    def _prompt_example(self, row, source, i) -> Example | None:
        """A prompt-only example: text or chat messages; the other columns go to the rewards (as in TRL,
        the prompt column itself does not)."""
        columns = {k: v for k, v in row.items() if k != self.prompt_column}
        if self.template:
            return Example(self.template.format(**{f: row[f] for f in self.fields}), columns=columns)
        value = row[self.prompt_column]
        if isinstance(value, str):
            return Example(value, columns=columns)
        messages = check_messages(value, f"{source} row {i + 1}")
        return Example(messages[-1]["content"], columns=columns, messages=messages)

    def _labelled(self, rows, source) -> list[tuple[dict, int]]:
        if self.kind == "prompts":  # every row is used; _example checks each prompt
            for row in rows[:1]:
                self._check_columns(row, source)
            return [(row, i) for i, row in enumerate(rows)]
        kept = []
        for i, row in enumerate(rows):
            self._check_columns(row, source)
            column = self.target_column if self.kind == "generation" else self.label_column
            if row[column] not in NO_LABEL:
                kept.append((row, i))
        return kept

    def _carved(self):
        """split -> (rows with their row numbers, source) for every split, carving the missing ones from train."""
        if getattr(self, "_splits", None) is None:
            own = {s: self._split_rows(s) for s in SPLITS}
            if own["train"] is None:
                raise TaskDataError(f"task {self.name!r} has no train rows")
            splits, missing = {}, []
            for split in SPLITS:
                if own[split] is None:
                    missing.append(split)
                    continue
                rows, source = own[split]
                labelled = self._labelled(rows, source)
                if not labelled and split != "train":
                    warn_once(f"task {self.name!r}: {source} has no labelled rows; its {split} rows are carved from train")
                    missing.append(split)
                    continue
                splits[split] = (labelled, source)
            train, source = splits["train"]
            if missing:
                n = max(1, round(HELD_OUT_FRACTION * len(train)))
                if len(train) < n * len(missing) + 1:
                    raise TaskDataError(f"{source} has {len(train)} labelled rows: too few to carve "
                                        f"{' and '.join(missing)} rows out of it; give separate files for them")
                parts = carve(train, [n] * len(missing))
                for split, part in zip(missing, parts):
                    splits[split] = (part, f"{source} (carved {split} rows)")
                splits["train"] = (parts[-1], source)
            self._splits = splits
        return self._splits

    def examples(self, split, data_dir=None):
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
        rows, source = self._carved()[split]
        out = [self._example(row, source, i) for row, i in rows]
        return [ex for ex in out if ex is not None]


class FileTemplateTask(TemplateTask):
    """A task from JSONL/JSON/CSV/TSV files and a ``{column}`` template (see :func:`from_file`)."""

    def __init__(self, files, template, label_column=None, candidates=None, target_column=None, name=None,
                 prompt_column=None):
        files = files if isinstance(files, dict) else {"train": files}
        bad = set(files) - set(SPLITS)
        if bad:
            raise ConfigError(f"files: unknown split(s) {sorted(bad)}; accepted: {SPLITS}")
        if "train" not in files:
            raise ConfigError(f"files: a train file is needed; got {sorted(files)}")
        self.files = {s: pathlib.Path(p) for s, p in files.items() if p is not None}
        super().__init__(template, label_column, candidates, target_column, name or self.files["train"].stem,
                         prompt_column)
        self._rows = {}
        for split, path in self.files.items():  # fail now, not in the middle of training
            self._check_columns(self._read(path)[0], repr(str(path)))

    def _read(self, path):
        if path not in self._rows:
            self._rows[path] = read_rows(path)
        return self._rows[path]

    def _split_rows(self, split):
        path = self.files.get(split)
        return None if path is None else (self._read(path), repr(str(path)))


def _datasets():
    try:
        import datasets
    except ImportError:
        raise UserError("Hugging Face dataset tasks need the datasets package: pip install datasets") from None
    return datasets


_DATASET_TYPES = ("Dataset", "DatasetDict", "IterableDataset", "IterableDatasetDict")


def is_dataset_object(obj) -> bool:
    """Whether ``obj`` is a ``datasets`` Dataset, DatasetDict, IterableDataset or IterableDatasetDict, or a
    non-empty dict of split name -> one of those (nothing is imported: such an object means ``datasets``
    is loaded already)."""
    if isinstance(obj, dict):
        return bool(obj) and all(is_dataset_object(v) for v in obj.values())
    datasets = sys.modules.get("datasets")
    return datasets is not None and isinstance(obj, tuple(getattr(datasets, t) for t in _DATASET_TYPES))


def is_iterable_dataset(obj) -> bool:
    """Whether ``obj`` is (or holds) a stream: an ``IterableDataset`` or ``IterableDatasetDict``."""
    if isinstance(obj, dict):
        return any(is_iterable_dataset(v) for v in obj.values())
    datasets = sys.modules.get("datasets")
    return datasets is not None and isinstance(obj, (datasets.IterableDataset, datasets.IterableDatasetDict))


def _columns(data) -> list[str]:
    """A Dataset's or IterableDataset's column names (an IterableDataset without known features: its first row's)."""
    names = getattr(data, "column_names", None)
    if names is None:
        first = next(iter(data), None)
        names = list(first) if isinstance(first, dict) else []
    return list(names)


class DatasetTemplateTask(TemplateTask):
    """A task from a Hugging Face dataset (hub id, local directory, or a Dataset / DatasetDict /
    IterableDataset object) and a template (see :func:`from_dataset`)."""

    SPLIT_NAMES = {"train": ("train",), "validation": ("validation", "valid", "dev", "val", "eval"),
                   "test": ("test",)}

    def __init__(self, dataset, template, label_column=None, candidates=None, target_column=None, name=None,
                 config=None, prompt_column=None, max_rows=None):
        obj = is_dataset_object(dataset)
        if name is None:
            info = getattr(next(iter(dataset.values())) if isinstance(dataset, dict) else dataset, "info", None)
            name = (getattr(info, "dataset_name", None) or "dataset") if obj else (pathlib.Path(str(dataset)).name or str(dataset))
        super().__init__(template, label_column, candidates, target_column, name, prompt_column)
        if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1):
            raise ConfigError(f"max_rows: got {max_rows!r}, accepted: an integer >= 1")
        self.config, self.max_rows = config, max_rows
        self.dataset = f"{type(dataset).__name__} object" if obj else str(dataset)
        if obj and config:
            raise ConfigError("config names a configuration of a dataset on the Hub or on disk; a dataset object has "
                              "its configuration already")
        if obj and is_iterable_dataset(dataset) and max_rows is None:
            raise ConfigError("an IterableDataset is a stream of unknown length: give max_rows (the first rows read "
                              "from each split; MeZOTrainer sets it from max_steps and the batch size)")
        self.data = self._from_object(dataset) if obj else self._load()
        for split in self.data:
            self._check_columns(set(_columns(self.data[split])), self._source(split))

    def _source(self, split=None) -> str:
        where = f"dataset {self.dataset!r}{f' ({self.config})' if self.config else ''}"
        return where if split is None else f"{where} split {split!r}"

    def _from_object(self, dataset) -> dict:
        datasets = _datasets()
        if isinstance(dataset, (datasets.Dataset, datasets.IterableDataset)):
            return {"train": dataset}
        data = dict(dataset)  # DatasetDict, IterableDatasetDict, or {split: Dataset}
        nested = [k for k, v in data.items() if not isinstance(v, (datasets.Dataset, datasets.IterableDataset))]
        if nested:
            raise ConfigError(f"dataset split(s) {nested}: each split must be a Dataset or IterableDataset")
        return data

    def _load(self) -> dict:
        datasets = _datasets()
        path = pathlib.Path(self.dataset).expanduser()
        try:
            if path.is_dir() and ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file()):
                data = datasets.load_from_disk(str(path))  # written by save_to_disk
            else:
                data = datasets.load_dataset(str(path) if path.is_dir() else self.dataset, self.config)
        except Exception as e:  # the library raises many types (offline, not found, bad config)
            where = "local dataset directory" if path.is_dir() else "Hugging Face dataset"
            raise TaskFileNotFoundError(f"{where} {self.dataset!r} could not be loaded "
                                        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); give a "
                                        f"hub id (online or in the local cache), a save_to_disk directory or a data file") from None
        if isinstance(data, datasets.Dataset):
            data = {"train": data}
        return dict(data)

    def _split_rows(self, split):
        name = next((n for n in self.SPLIT_NAMES[split] if n in self.data), None)
        if name is None:
            if split == "train":
                raise TaskDataError(f"{self._source()} has no train split; its splits are {sorted(self.data)}")
            return None
        data = self.data[name]
        rows = list(itertools.islice(data, self.max_rows)) if self.max_rows is not None else list(data)
        return rows, self._source(name)


def from_file(files, template: str | None = None, label_column: str | None = None, candidates: list[str] | None = None,
              target_column: str | None = None, name: str | None = None, prompt_column: str | None = None) -> Task:
    """A task from a JSONL/JSON/CSV/TSV file (or ``{"train": path, "validation": path, "test": path}``).

    Args:
        files: the train file, or a dict of split -> path; splits without a file are carved out of
            the train rows (10% each, at least one row, fixed shuffle).
        template: the prompt, with ``{column}`` fields filled from each row.
        label_column, candidates: classification: the column with the right candidate's index or text,
            and the candidate continuations (a leading space is added where needed).
        target_column: generation: the column with the gold answer (string or list of strings).
        name: the task's name (default: the train file's stem).
        prompt_column: with neither target nor label: a prompt-only task (:func:`from_prompts`).

    Missing files, missing columns and labels that match no candidate raise UserError subclasses
    naming the problem.
    """
    return FileTemplateTask(files, template, label_column=label_column, candidates=candidates,
                            target_column=target_column, name=name, prompt_column=prompt_column)


def from_dataset(dataset, template: str | None = None, label_column: str | None = None,
                 candidates: list[str] | None = None, target_column: str | None = None, name: str | None = None,
                 config: str | None = None, prompt_column: str | None = None, max_rows: int | None = None) -> Task:
    """A task from a Hugging Face dataset: a hub id, a ``save_to_disk`` directory, a directory of data files,
    or a ``datasets`` object: a ``Dataset`` (the train rows), a ``DatasetDict`` or a dict of split ->
    ``Dataset``, an ``IterableDataset`` or ``IterableDatasetDict`` (with ``max_rows``).

    The splits ``train``, ``validation`` (or ``valid``/``dev``/``val``/``eval``) and ``test`` are used; a
    missing or unlabelled one is carved out of train as in :func:`from_file`. ``config`` is the dataset's
    configuration name (e.g. ``"sst2"`` of ``"nyu-mll/glue"``). ``max_rows``: read at most this many rows
    of each split (needed for a stream, whose length is unknown). Other arguments as :func:`from_file`.
    """
    return DatasetTemplateTask(dataset, template, label_column=label_column, candidates=candidates,
                               target_column=target_column, name=name, config=config, prompt_column=prompt_column,
                               max_rows=max_rows)


def from_prompts(source, prompt_column: str | None = None, template: str | None = None, name: str | None = None,
                 config: str | None = None, max_rows: int | None = None) -> Task:
    """A prompt-only task (TRL's convention): no gold answers; the run's rewards judge the completions.

    Args:
        source: a JSONL/JSON/CSV/TSV/Parquet/Arrow file, a dict of split -> file (as :func:`from_file`), a
            Hugging Face dataset (hub id or local directory; ``config`` names its configuration), or a
            ``datasets`` object (as :func:`from_dataset`; a stream needs ``max_rows``).
        prompt_column: the column holding each prompt (default ``prompt``): text, or a list of chat
            messages rendered with the model's chat template.
        template: instead of a prompt column, build the prompt from columns, e.g. ``"Continue: {text}"``.
        name: the task's name (default: the train file's stem or the dataset's name).

    Every other column is passed to the rewards as a keyword. Splits without a file of their own are
    carved out of the train rows (10% each).
    """
    if is_dataset_object(source):
        return DatasetTemplateTask(source, template, name=name, config=config, prompt_column=prompt_column,
                                   max_rows=max_rows)
    if isinstance(source, dict) or pathlib.Path(str(source)).suffix.lower() in DATA_SUFFIXES:
        return FileTemplateTask(source, template, name=name, prompt_column=prompt_column)
    return DatasetTemplateTask(source, template, name=name, config=config, prompt_column=prompt_column,
                               max_rows=max_rows)


# ---------------------------------------------------------------------------------------- from options
def is_data_task(spec, options: dict, registered) -> bool:
    """Whether ``spec`` (with the data options ``options``) names a data file or a dataset rather than a
    registered task or code: a ``datasets`` object, a path ending in .jsonl/.json/.csv/.tsv/.parquet/.arrow,
    an existing directory, or any other name that is not registered and not ``module:object`` when data
    options are given."""
    if is_dataset_object(spec):
        return True
    path = pathlib.Path(str(spec)).expanduser()
    if path.suffix.lower() in DATA_SUFFIXES or path.is_dir():
        return True
    return bool(options) and ":" not in str(spec) and spec not in registered


def data_task_kind(spec: str, options: dict, registered=()) -> str | None:
    """The kind of the data task ``spec`` names with ``options`` (``"prompts"``, ``"generation"`` or
    ``"classification"``), from the options alone: nothing is read. None where ``spec`` is not a data file
    or dataset, or its options do not fit together (:func:`check_data_task` then says why)."""
    if not is_data_task(spec, options, registered):
        return None
    try:
        return _options_kind(options)
    except ConfigError:
        return None


def _options_kind(options: dict) -> str:
    """:func:`check_template_options` of a data task's options."""
    return check_template_options(options.get("template"), options.get("label_column"), options.get("candidates"),
                                  options.get("target_column"), options.get("prompt_column"))


def check_data_task(spec: str, options: dict, registered=()) -> None:
    """Check a data task's options and that its files exist, reading nothing (ConfigError / TaskFileNotFoundError).

    ``registered``: the registered task names; data options given with one of them are refused.
    """
    if not is_data_task(spec, options, registered):
        if options:
            flags = ", ".join("--" + k.replace("_", "-") for k in options)
            raise ConfigError(f"{flags} describe a data file or dataset task (--task FILE.jsonl/.json/.csv/.tsv/.parquet/.arrow, a "
                              f"dataset directory or hub id); {spec!r} is a {'built-in or registered' if spec in registered else 'code'} task")
        return
    _options_kind(options)
    if is_dataset_object(spec):
        if options.get("validation_file") or options.get("test_file") or options.get("dataset_config"):
            raise ConfigError("--validation-file / --test-file / --dataset-config do not apply to a dataset object: its "
                              "splits are its own (give eval_dataset for a validation split)")
        return
    path = pathlib.Path(str(spec)).expanduser()
    if path.suffix.lower() in DATA_SUFFIXES:
        for flag, p in (("--task", path), ("--validation-file", options.get("validation_file")),
                        ("--test-file", options.get("test_file"))):
            if p is not None and not pathlib.Path(p).expanduser().is_file():
                raise TaskFileNotFoundError(f"{flag}: task file {str(p)!r} not found")
            if p is not None and pathlib.Path(p).suffix.lower() not in DATA_SUFFIXES:
                raise ConfigError(f"{flag} {str(p)!r}: expected {ACCEPTED_FILES}")
        if options.get("dataset_config"):
            raise ConfigError("--dataset-config applies to a Hugging Face dataset, not to a data file")
    elif options.get("validation_file") or options.get("test_file"):
        raise ConfigError("--validation-file / --test-file apply to a data file task; a dataset's splits come from the "
                          "dataset (a missing or unlabelled one is carved from train)")


def data_task(spec, options: dict, max_rows: int | None = None) -> Task:
    """Build the data task that :func:`check_data_task` accepted (this reads the data and checks the columns).
    ``max_rows``: for a dataset, read at most this many rows of each split (a stream needs it)."""
    kw = dict(template=options.get("template"), label_column=options.get("label_column"),
              candidates=options.get("candidates"), target_column=options.get("target_column"),
              prompt_column=options.get("prompt_column"))
    if is_dataset_object(spec):
        return from_dataset(spec, max_rows=max_rows, **kw)
    path = pathlib.Path(str(spec)).expanduser()
    if path.suffix.lower() in DATA_SUFFIXES:
        files = {"train": path, "validation": options.get("validation_file"), "test": options.get("test_file")}
        return from_file({k: v for k, v in files.items() if v is not None}, **kw)
    return from_dataset(str(spec), config=options.get("dataset_config"), max_rows=max_rows, **kw)
