"""SQuAD's validation split comes from articles no training question uses (issue 35), so the best step is
not picked by memorised answers; test stays the official dev file."""
from __future__ import annotations

import pytest

from mezo_rl.tasks import get_task


@pytest.mark.slow  # the real SQuAD files
def test_validation_and_train_share_no_article(shared_data_dir):
    task = get_task("squad")
    val, train = task.load_split("validation", data_dir=shared_data_dir), task.load_split("train", data_dir=shared_data_dir)
    titles_val, titles_train = ({ex.columns["title"] for ex in split} for split in (val, train))
    assert titles_val and titles_train and not titles_val & titles_train
    assert len(val) >= task.n_validation
    pool = {ex.columns["id"] for ex in val} | {ex.columns["id"] for ex in train}
    assert len(pool) == len(val) + len(train)  # every train-file question in exactly one of the two
    again = get_task("squad").load_split("validation", data_dir=shared_data_dir)
    assert [ex.columns["id"] for ex in again] == [ex.columns["id"] for ex in val]
    test_ids = {ex.columns["id"] for ex in task.load_split("test", data_dir=shared_data_dir)}
    assert not test_ids & pool
