"""Every form a TRL user holds a dataset in becomes the same prompt task: Dataset, DatasetDict, a dict of
splits, IterableDataset (with max_rows), .parquet and .arrow files, save_to_disk directories."""
from __future__ import annotations

import pathlib

import pytest

from mezo_rl.errors import ConfigError, UserError
from mezo_rl.tasks import MissingColumnError, from_prompts
from mezo_rl.tasks.user import check_data_task, data_task, data_task_kind, is_data_task

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")

ROWS = [{"prompt": f"Write about topic {i}:", "topic": f"t{i}"} for i in range(30)]
CHAT = [{"prompt": [{"role": "user", "content": f"Tell me about {i}"}], "topic": f"t{i}"} for i in range(30)]


def prompts_of(task, split="train"):
    return sorted(ex.prompt for ex in task.load_split(split))


def all_prompts(task):
    return sorted(p for split in ("train", "validation", "test") for p in prompts_of(task, split))


def expected():
    return sorted(r["prompt"] for r in ROWS)


def test_a_dataset_object_is_its_train_rows_with_validation_and_test_carved():
    task = from_prompts(datasets.Dataset.from_list(ROWS))
    assert task.kind == "prompts"
    assert all_prompts(task) == expected()  # every row used once: the carved splits do not overlap train
    assert len(task.load_split("validation")) == len(task.load_split("test")) == 3
    ex = task.load_split("train")[0]
    assert set(ex.columns) == {"topic"}  # the other columns reach the rewards; the prompt column does not


def test_a_datasetdict_and_a_dict_of_splits_keep_their_splits():
    train, val = datasets.Dataset.from_list(ROWS[:20]), datasets.Dataset.from_list(ROWS[20:25])
    for source in (datasets.DatasetDict({"train": train, "validation": val}), {"train": train, "eval": val}):
        task = from_prompts(source)
        assert prompts_of(task, "validation") == sorted(r["prompt"] for r in ROWS[20:25])
        assert len(task.load_split("train")) + len(task.load_split("test")) == 20


def test_conversational_rows_in_a_dataset_object_become_chat_messages():
    ex = from_prompts(datasets.Dataset.from_list(CHAT)).load_split("train")[0]
    assert ex.messages is not None and ex.messages[0]["role"] == "user" and ex.prompt == ex.messages[-1]["content"]


def test_an_iterable_dataset_needs_max_rows_and_reads_only_that_many():
    stream = datasets.Dataset.from_list(ROWS).to_iterable_dataset()
    with pytest.raises(ConfigError, match="IterableDataset is a stream of unknown length: give max_rows"):
        from_prompts(stream)
    task = from_prompts(stream, max_rows=10)
    assert all_prompts(task) == sorted(r["prompt"] for r in ROWS[:10])


def test_a_dataset_without_a_prompt_column_says_which_columns_it_has():
    with pytest.raises(MissingColumnError, match=r"no 'prompt' column .*columns \['question', 'topic'\]") as info:
        from_prompts(datasets.Dataset.from_list([{"question": "q", "topic": "t"}] * 12))
    assert isinstance(info.value, UserError) and "\n" not in str(info.value)


def test_parquet_and_arrow_files_and_save_to_disk_directories(tmp_path):
    ds = datasets.Dataset.from_list(ROWS)
    parquet = tmp_path / "prompts.parquet"
    ds.to_parquet(str(parquet))
    ds.save_to_disk(str(tmp_path / "saved"))
    arrow = next(pathlib.Path(tmp_path / "saved").glob("*.arrow"))  # save_to_disk's shard: an Arrow IPC stream
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "saved_dict"))
    import pyarrow.ipc
    ipc_file = tmp_path / "file_format.arrow"  # the IPC *file* format, as pyarrow writes it
    table = pa.Table.from_pylist(ROWS)
    with pyarrow.ipc.new_file(str(ipc_file), table.schema) as writer:
        writer.write_table(table)
    for spec in (parquet, arrow, ipc_file, tmp_path / "saved", tmp_path / "saved_dict"):
        assert is_data_task(str(spec), {}, registered=()) and data_task_kind(str(spec), {}) == "prompts"
        check_data_task(str(spec), {})
        assert all_prompts(data_task(str(spec), {})) == expected(), spec


def test_a_damaged_table_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(UserError, match="bad.parquet.*not a readable parquet table") as info:
        from_prompts(str(bad))
    assert "\n" not in str(info.value)


def test_a_dataset_object_is_a_data_task_whatever_its_options():
    ds = datasets.Dataset.from_list(ROWS)
    assert is_data_task(ds, {}, registered=("sst2",)) and data_task_kind(ds, {}) == "prompts"
    with pytest.raises(ConfigError, match="do not apply to a dataset object"):
        check_data_task(ds, {"validation_file": "v.jsonl"})
    assert all_prompts(data_task(ds, {})) == expected()
