"""Tasks: the paper's 15 tasks with its prompts, user tasks from files, and the task registry.

    >>> from mezo_rl.tasks import get_task, list_tasks
    >>> task = get_task("sst2")
    >>> train = task.load_split("train", n=1000, seed=0)     # data from --data-dir / $MEZO_RL_DATA

Verifiable tasks generated from a seed (no data): ``arithmetic`` and ``countdown`` (mezo_rl.tasks.verifiable).
See docs/tasks.md for the prompts, the splits and what is missing from the local data.
"""
from .base import (KINDS, MASK, PAPER_SIZES, SPLITS, Example, Task, UnknownTaskError, completion_stops, continuation,
                   get_task, list_tasks, metrics_of_kind, register_task, sample, sample_per_class, with_demonstrations)
from . import builtin  # noqa: F401  (registers the built-in tasks)
from .builtin import PAPER_TASKS, FileTask
from .user import MissingColumnError, TaskDataError, TaskFileNotFoundError, from_dataset, from_file, from_prompts
from . import verifiable  # noqa: F401  (registers arithmetic and countdown)
from .verifiable import ArithmeticTask, CountdownTask

__all__ = ["Example", "Task", "FileTask", "ArithmeticTask", "CountdownTask", "KINDS", "MASK", "PAPER_SIZES", "PAPER_TASKS", "SPLITS",
           "UnknownTaskError", "MissingColumnError", "TaskDataError", "TaskFileNotFoundError", "completion_stops", "continuation",
           "from_dataset", "from_file", "from_prompts", "get_task", "list_tasks", "metrics_of_kind", "register_task",
           "sample", "sample_per_class", "with_demonstrations"]
