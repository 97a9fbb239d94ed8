"""Test fixture: a user's tasks in code, found as "mezo_user_tasks:arithmetic" / "path/to/mezo_user_tasks.py:..."
or through the ``mezo_rl.tasks`` entry point this package declares (see the dist-info beside it)."""
from mezo_rl.tasks import Example, Task


class Arithmetic(Task):
    """Is a sum right? 'a + b = c' -> ' no' / ' yes' (generated, no data files)."""

    kind = "classification"

    def __init__(self, n: int = 40):
        self.n = n

    def examples(self, split, data_dir=None):
        offset = {"train": 0, "validation": 1000, "test": 2000}[split]
        out = []
        for i in range(offset, offset + self.n):
            a, b = i % 7, i % 5
            right = i % 2 == 0
            c = a + b if right else a + b + 1
            out.append(Example(f"{a} + {b} = {c} ? the answer is", [" no", " yes"], int(right), columns={"a": a, "b": b}))
        return out


def arithmetic(n: int = 40) -> Task:
    """A function returning a Task (what `--task module:function` calls)."""
    return Arithmetic(n)


def broken(n: int = 40) -> Task:
    """A user task whose code fails while loading its data."""
    class Broken(Arithmetic):
        def examples(self, split, data_dir=None):
            rows = [{"text": "fine"}, {"txt": "typo"}]
            return [Example(r["text"] + " It was", [" bad", " good"], 0) for r in rows]

    return Broken(n)
