"""A user's task code that raises while its examples are read is one line naming the task and split
(TaskCodeError); a built-in task that raises is a bug of ours and keeps its traceback."""
import pytest

from mezo_rl.tasks import get_task
from mezo_rl.training.setup import TaskCodeError, load_splits


class Broken:
    def load_split(self, split, **kw):
        raise KeyError("label")


def test_a_user_task_that_raises_is_one_line_naming_it():
    with pytest.raises(TaskCodeError, match=r"task 'my:Broken' raised KeyError: 'label' while reading its 'train'"):
        load_splits(Broken(), "my:Broken", {"train": 4}, None, 0)


def test_a_builtin_task_that_raises_is_not_blamed_on_the_user(monkeypatch):
    task = get_task("sst2")
    monkeypatch.setattr(type(task), "load_split", Broken.load_split)
    with pytest.raises(KeyError):
        load_splits(task, "sst2", {"train": 4}, None, 0)
