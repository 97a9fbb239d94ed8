"""Module sizes: one concept per module, and a module short enough to read as one.

No module of the package (``mezo_rl/``, and ``rewards/`` and ``tasks/``, installed as ``mezo_rl.rewards`` and
``mezo_rl.tasks``) is over 600 lines, and none of the language model's parts under ``mezo_rl/model/`` over 400; the
adapters (``peft.py``, what a run trains and its adapters) are held to the package's 600.
"""
from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_LINES = 600
MAX_MODEL_LINES = 400
LONGER_MODEL = {"mezo_rl/model/peft.py"}


def lines(path: pathlib.Path) -> int:
    return len(path.read_text().splitlines())


def modules(*folders: str) -> dict[str, int]:
    """Lines per module (its path from the repository root) under ``folders``; the links mezo_rl/rewards and
    mezo_rl/tasks are read through rewards/ and tasks/."""
    links = {ROOT / "mezo_rl" / "rewards", ROOT / "mezo_rl" / "tasks"}
    return {p.relative_to(ROOT).as_posix(): lines(p) for folder in folders for p in (ROOT / folder).rglob("*.py")
            if not links & set(p.parents)}


def test_no_module_is_over_600_lines():
    sizes = modules("mezo_rl", "rewards", "tasks")
    assert "mezo_rl/model/lm.py" in sizes and "tasks/user.py" in sizes
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split them by concept): {over}"


def test_no_model_module_is_over_400_lines():
    sizes = modules("mezo_rl/model")
    assert {"mezo_rl/model/lm.py", "mezo_rl/model/scoring.py", "mezo_rl/model/decoding.py"} <= set(sizes)
    over = {name: n for name, n in sizes.items() if n > MAX_MODEL_LINES and name not in LONGER_MODEL}
    assert not over, f"mezo_rl/model/ modules over {MAX_MODEL_LINES} lines (split them by concept): {over}"
