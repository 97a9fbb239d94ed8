"""User tasks without code: data files (JSONL/JSON/CSV/TSV) and Hugging Face datasets plus a template.

The dataset path is exercised offline through `datasets` on local directories (save_to_disk output and
a directory of data files), never the hub.
"""
from __future__ import annotations

import json

import pytest

from mezo_rl.errors import ConfigError, UserError
from mezo_rl.tasks import (MissingColumnError, TaskDataError, TaskFileNotFoundError, from_dataset, from_file, get_task,
                   register_task)
from mezo_rl.tasks.user import check_template_options

ROWS = [{"text": f"review {i}", "label": i % 2, "stars": "positive" if i % 2 else "negative"} for i in range(20)]


@pytest.fixture()
def review_file(tmp_path):
    path = tmp_path / "reviews.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def all_examples(task):
    return {s: task.load_split(s) for s in ("train", "validation", "test")}


def test_one_file_gives_disjoint_carved_splits(review_file):
    task = from_file(review_file, template="Review: {text} It was", label_column="label", candidates=["bad", "good"])
    assert task.name == "reviews" and task.kind == "classification" and task.metrics == ["accuracy"]
    splits = all_examples(task)
    assert [len(splits[s]) for s in ("train", "validation", "test")] == [16, 2, 2]  # 10% each, the rest trains
    prompts = [{e.prompt for e in exs} for exs in splits.values()]
    assert set.union(*prompts) == {f"Review: review {i} It was" for i in range(20)} and sum(map(len, prompts)) == 20
    ex = splits["train"][0]
    # candidates become continuations of the prompt; the label is the candidate index, read from the row
    assert ex.candidates == [" bad", " good"] and ex.label == ex.columns["label"]
    # the carving is a fixed shuffle: the same file always gives the same splits
    again = from_file(review_file, template="Review: {text} It was", label_column="label", candidates=["bad", "good"])
    assert again.load_split("test") == splits["test"]
    register_task("test-reviews")(task)
    assert get_task("test-reviews") is task


def test_label_as_candidate_text_and_separate_files(tmp_path):
    for name, rows in (("train", ROWS[:10]), ("dev", ROWS[10:14]), ("test", ROWS[14:])):
        header = "text\tstars\n" + "".join(f"{r['text']}\t{r['stars']}\n" for r in rows)
        (tmp_path / f"{name}.tsv").write_text(header)
    task = from_file({"train": tmp_path / "train.tsv", "validation": tmp_path / "dev.tsv", "test": tmp_path / "test.tsv"},
                     template="{text}\nSentiment:", label_column="stars", candidates=[" negative", " positive"])
    splits = all_examples(task)
    assert [len(splits[s]) for s in ("train", "validation", "test")] == [10, 4, 6]
    assert [e.label for e in splits["test"]] == [r["label"] for r in ROWS[14:]]
    assert splits["validation"][0].prompt == "review 10\nSentiment:"


def test_csv_and_json_generation_tasks(tmp_path):
    csv_path = tmp_path / "qa.csv"
    csv_path.write_text("question,answer\n" + "".join(f"what is {i}+{i}?,{2 * i}\n" for i in range(10)))
    task = from_file({"train": csv_path, "test": csv_path}, template="Q: {question}\nA:", target_column="answer")
    ex = task.load_split("test")[1]
    assert task.kind == "generation" and ex.prompt == "Q: what is 1+1?\nA:" and ex.answers == [" 2"]
    assert len(task.load_split("validation")) == 1 and len(task.load_split("train")) == 9  # validation carved
    # .json: a list of objects, an object holding one list, or JSON Lines under a .json name
    rows = [{"q": f"q{i}", "a": [f"x{i}", f"y{i}"]} for i in range(4)] + [{"q": "squad", "a": {"text": ["z", "z"]}}]
    for text in (json.dumps(rows), json.dumps({"data": rows}), "\n".join(map(json.dumps, rows))):
        (tmp_path / "qa.json").write_text(text)
        exs = from_file({"train": tmp_path / "qa.json", "validation": tmp_path / "qa.json", "test": tmp_path / "qa.json"},
                        template="{q} ->", target_column="a").load_split("test")
        assert [e.answers for e in exs] == [[f" x{i}", f" y{i}"] for i in range(4)] + [[" z"]]


def test_options_are_checked_before_any_data_is_read():
    assert check_template_options("{text} It was", label_column="label", candidates=["a", "b"]) == "classification"
    assert check_template_options("{q}", target_column="answer") == "generation"
    assert check_template_options("{t}") == check_template_options(None) == "prompts"
    cases = [
        (dict(template=None, target_column="a"), "needs a template"),
        (dict(template="{text", target_column="a"), "template '{text'"),
        (dict(template="{0} x", target_column="a"), "must be a column name"),
        (dict(template="{t}", candidates=["a", "b"]), "need --label-column"),
        (dict(template="{t}", prompt_column="p"), "not both"),
        (dict(template="{t}", target_column="a", prompt_column="p"), "--prompt-column is for prompt-only tasks"),
        (dict(template="{t}", label_column="label"), "needs two or more --candidates"),
        (dict(template="{t}", label_column="label", candidates=["a", " "]), "every candidate must have some text"),
        (dict(template="{t}", label_column="l", candidates=["a", "b"], target_column="a"), "not both"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            check_template_options(**kwargs)


def test_data_errors_are_one_line_user_errors_naming_the_culprit(review_file, tmp_path):
    def fails(error, message, **kwargs):
        kwargs = {"template": "{text}", "label_column": "label", "candidates": ["bad", "good"], **kwargs}
        with pytest.raises(error, match=message) as info:
            task = from_file(kwargs.pop("files", review_file), **kwargs)
            all_examples(task)
        assert isinstance(info.value, UserError) and "\n" not in str(info.value)

    fails(TaskFileNotFoundError, "task file '.*nope.jsonl' not found", files=tmp_path / "nope.jsonl")
    fails(MissingColumnError, r"missing column\(s\) \['review'\] \(used by the template\); the data has columns "
                              r"\['label', 'stars', 'text'\]", template="{review} It was")
    fails(MissingColumnError, r"missing column\(s\) \['rating'\] \(used by the options\)", label_column="rating")
    fails(TaskDataError, r"row \d+: label '(positive|negative)' is neither a candidate index 0..1 nor one of the candidates",
          label_column="stars", candidates=["terrible", "great"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a", "label": 0}\n{"text": oops}\n')
    fails(TaskDataError, "bad.jsonl: line 2 is not valid JSON", files=bad)
    (tmp_path / "notes.txt").write_text("x")
    fails(TaskDataError, "expected a .jsonl, .json, .csv, .tsv, .parquet or .arrow file", files=tmp_path / "notes.txt")
    (tmp_path / "empty.csv").write_text("text,label\n")
    fails(TaskDataError, "has no rows", files=tmp_path / "empty.csv")
    (tmp_path / "two.jsonl").write_text('{"text": "a", "label": 0}\n{"text": "b", "label": 1}\n')
    fails(TaskDataError, "has 2 labelled rows: too few to carve validation and test", files=tmp_path / "two.jsonl")


# ------------------------------------------------------------------------- Hugging Face datasets (offline)
datasets = pytest.importorskip("datasets")


@pytest.fixture()
def offline_cache(tmp_path, monkeypatch):
    """datasets' cache in tmp_path (nothing written under ~/.cache), offline."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    return tmp_path


def test_dataset_saved_to_disk_with_unlabelled_test_split(offline_cache):
    """A GLUE-like DatasetDict: labelled train and validation, a test split without labels (-1)."""
    data = datasets.DatasetDict({
        "train": datasets.Dataset.from_list([{"sentence": f"s{i}", "label": i % 2} for i in range(30)]),
        "validation": datasets.Dataset.from_list([{"sentence": f"v{i}", "label": i % 2} for i in range(6)]),
        "test": datasets.Dataset.from_list([{"sentence": f"t{i}", "label": -1} for i in range(5)]),
    })
    data.save_to_disk(offline_cache / "glue-like")
    task = from_dataset(str(offline_cache / "glue-like"), template="{sentence} It was", label_column="label",
                        candidates=["terrible", "great"])
    assert task.name == "glue-like" and task.kind == "classification"
    splits = all_examples(task)
    # validation is the dataset's own; the unlabelled test split is replaced by rows carved from train
    assert [e.prompt for e in splits["validation"]] == [f"v{i} It was" for i in range(6)]
    assert len(splits["test"]) == 3 and len(splits["train"]) == 27
    assert all(e.prompt.startswith("s") for e in splits["test"])
    assert {e.prompt for e in splits["test"]}.isdisjoint(e.prompt for e in splits["train"])
    assert all(e.label == int(e.prompt.split()[0][1:]) % 2 for e in splits["train"])


def test_dataset_directory_of_data_files_and_its_errors(offline_cache):
    folder = offline_cache / "qa"
    folder.mkdir()
    for split, n in (("train", 8), ("test", 3)):
        (folder / f"{split}.jsonl").write_text("".join(
            json.dumps({"question": f"{split} {i}?", "answers": {"text": [f"a{i}"], "answer_start": [0]}}) + "\n"
            for i in range(n)))
    task = from_dataset(str(folder), template="Question: {question}\nAnswer:", target_column="answers")
    assert task.kind == "generation"
    test = task.load_split("test")
    assert [e.prompt for e in test] == [f"Question: test {i}?\nAnswer:" for i in range(3)]
    assert [e.answers for e in test] == [[f" a{i}"] for i in range(3)]
    assert len(task.load_split("validation")) == 1 and len(task.load_split("train")) == 7

    with pytest.raises(MissingColumnError, match=r"dataset '.*qa' split 'train': missing column\(s\) \['context'\].*"
                                                 r"the data has columns \['answers', 'question'\]"):
        from_dataset(str(folder), template="{context} {question}", target_column="answers")
    with pytest.raises(TaskFileNotFoundError, match="Hugging Face dataset 'nobody/no-such-dataset' could not be loaded"):
        from_dataset("nobody/no-such-dataset", template="{q}", target_column="a")


def test_command_line_options_pick_and_check_a_data_task(review_file, tmp_path):
    from mezo_rl.tasks.user import check_data_task, data_task, is_data_task

    opts = {"template": "{text} It was", "label_column": "label", "candidates": ["bad", "good"]}
    registered = ["sst2"]
    assert is_data_task(str(review_file), {}, registered)  # a data file by its suffix, even without options
    assert is_data_task("someone/reviews", opts, registered)  # a hub id: not registered, options given
    assert not is_data_task("sst2", {}, registered) and not is_data_task("pkg.mod:make_task", opts, registered)
    check_data_task(str(review_file), opts, registered)
    task = data_task(str(review_file), opts)
    assert task.name == "reviews" and len(task.load_split("validation")) == 2
    with pytest.raises(ConfigError, match="--template describe a data file .* 'sst2' is a built-in or registered task"):
        check_data_task("sst2", {"template": "{x}"}, registered)
    with pytest.raises(ConfigError, match="needs a template"):
        check_data_task(str(review_file), {"label_column": "label"}, registered)
    with pytest.raises(TaskFileNotFoundError, match="--test-file: task file '.*nope.csv' not found"):
        check_data_task(str(review_file), {**opts, "test_file": str(tmp_path / "nope.csv")}, registered)
    with pytest.raises(ConfigError, match="--validation-file / --test-file apply to a data file task"):
        check_data_task("someone/reviews", {**opts, "test_file": str(review_file)}, registered)
