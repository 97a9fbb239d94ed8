"""The packages import in one direction: ``rewards`` and ``tasks`` use ``mezo_rl.errors`` / ``mezo_rl.registry``
only, and importing them (which runs ``mezo_rl/__init__``) loads neither the trainer nor the wiring.

Each check runs in a fresh interpreter, so what an earlier test imported cannot hide a cycle.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


@pytest.mark.parametrize("package", ["rewards", "tasks"])
def test_rewards_and_tasks_do_not_import_the_trainer(package):
    res = python(f"import {package}, sys; "
                 f"loaded = [m for m in ('mezo_rl.trainer', 'mezo_rl.checks', 'mezo_rl.evaluation') if m in sys.modules]; "
                 f"assert not loaded, loaded")
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("first", ["import rewards", "import tasks", "import mezo_rl.trainer", "import mezo_rl.checks",
                                   "import mezo_rl.evaluation", "import mezo_rl.cli"])
def test_any_import_order_works(first):
    # every module that wires rewards and tasks imports their names at top level: a cycle would fail here
    res = python(f"{first}\nfrom mezo_rl import Trainer, MeZO, TrainingArguments, load_model\n"
                 "from mezo_rl.trainer import Trainer as T\nassert Trainer is T\nimport rewards, tasks\n"
                 "assert rewards.build_objective and tasks.get_task")
    assert res.returncode == 0, res.stderr


def test_the_package_names_what_it_exports():
    res = python("import mezo_rl\nfrom mezo_rl import *\nassert all(hasattr(mezo_rl, n) for n in mezo_rl.__all__)\n"
                 "try:\n    mezo_rl.nothing\nexcept AttributeError as e:\n    assert 'nothing' in str(e)\n"
                 "else:\n    raise SystemExit('no AttributeError')")
    assert res.returncode == 0, res.stderr
