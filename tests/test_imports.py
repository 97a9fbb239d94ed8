"""The import graph, read from the source: layers import only downward, and nothing forms a cycle.

``mezo_rl`` is layered: the leaf modules (``errors``, ``registry``) <- ``engine`` <- ``model`` <- ``training``
<- ``cli``. A module may import its own layer and the layers before it, never a later one. The top-level folders
``rewards/`` and ``tasks/`` are installed as ``mezo_rl.rewards`` and ``mezo_rl.tasks`` (links inside ``mezo_rl/``,
so a user's ``rewards.py`` beside a script cannot shadow them); they import only the leaf modules of ``mezo_rl``,
and only ``training`` and ``cli`` import them.
"""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
LAYERS = ["leaf", "engine", "model", "training", "cli"]
LEAVES = {"mezo_rl", "mezo_rl.errors", "mezo_rl.registry", "mezo_rl.stats"}


SIDE = ("mezo_rl.rewards", "mezo_rl.tasks")  # the packages beside the layers: rewards/ and tasks/ in the tree


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] in ("rewards", "tasks"):
        parts.insert(0, "mezo_rl")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def project_modules() -> dict[str, pathlib.Path]:
    links = {ROOT / "mezo_rl" / "rewards", ROOT / "mezo_rl" / "tasks"}  # read once, through rewards/ and tasks/
    return {module_name(p): p for pkg in ("mezo_rl", "rewards", "tasks") for p in (ROOT / pkg).rglob("*.py")
            if not links & set(p.parents)}


def side(module: str) -> bool:
    return any(module == s or module.startswith(s + ".") for s in SIDE)


def imported(path: pathlib.Path, name: str, *, top_level_only: bool = False) -> set[str]:
    """Project modules ``path`` imports (anywhere in the file, or only at module level)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in out if m.split(".")[0] == "mezo_rl"}


def layer(module: str) -> str | None:
    if module in LEAVES or module == "mezo_rl.__main__":
        return "leaf" if module != "mezo_rl.__main__" else "cli"
    parts = module.split(".")
    if parts[0] != "mezo_rl":
        return None
    return parts[1] if parts[1] in LAYERS else "leaf"


def test_mezo_rl_layers_import_only_downward():
    modules = project_modules()
    wrong = []
    for name, path in modules.items():
        if side(name):
            continue
        mine = LAYERS.index(layer(name))
        for target in imported(path, name):
            if side(target):
                if mine < LAYERS.index("training"):
                    wrong.append(f"{name} imports {target}")
                continue
            if target not in modules:  # `from mezo_rl.x import Name`: the module is the prefix
                continue
            if LAYERS.index(layer(target)) > mine:
                wrong.append(f"{name} ({layer(name)}) imports {target} ({layer(target)})")
    assert not wrong, "\n".join(sorted(wrong))


def test_rewards_and_tasks_import_only_the_leaf_modules():
    modules = project_modules()
    wrong = [f"{name} imports {target}" for name, path in modules.items() if side(name)
             for target in imported(path, name) if target in modules and not side(target)
             and target not in LEAVES]
    assert not wrong, "\n".join(sorted(wrong))


def test_module_level_imports_have_no_cycle():
    modules = project_modules()
    graph = {name: {t for t in imported(path, name, top_level_only=True) if t in modules and t != name}
             for name, path in modules.items()}
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " -> ".join(trail[trail.index(nxt):] + [nxt]) if nxt in trail
                            else f"import cycle through {nxt}")
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])


def test_each_package_imports_on_its_own():
    # a fresh interpreter per package: nothing an earlier import loaded can hide a broken order
    packages = ["mezo_rl", "mezo_rl.rewards", "mezo_rl.tasks", "mezo_rl.engine.optim", "mezo_rl.model.lm", "mezo_rl.training.trainer",
                "mezo_rl.cli.main"]
    code = ("import importlib, subprocess, sys\n"
            f"for p in {packages!r}:\n"
            "    r = subprocess.run([sys.executable, '-c', f'import {p}'], capture_output=True, text=True)\n"
            "    assert r.returncode == 0, (p, r.stderr[-2000:])\n"
            "r = subprocess.run([sys.executable, '-c', 'import mezo_rl, sys; "
            "assert [m for m in sys.modules if m.startswith(\"mezo_rl.\")] == [], sorted(sys.modules)'], "
            "capture_output=True, text=True)\n"
            "assert r.returncode == 0, r.stderr[-2000:]\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


def test_the_package_names_what_it_exports():
    import mezo_rl

    assert all(getattr(mezo_rl, n) is not None for n in mezo_rl.__all__)
    with pytest.raises(AttributeError, match="nothing"):
        mezo_rl.nothing  # noqa: B018


def test_a_users_rewards_py_and_tasks_py_beside_a_script_do_not_shadow_the_package(tmp_path):
    # docs/rl.md names the user's file rewards.py: the script's folder comes first on sys.path
    (tmp_path / "rewards.py").write_text("def my_reward(completions, **kw):\n    return [1.0 for _ in completions]\n")
    (tmp_path / "tasks.py").write_text("TASKS = []\n")
    (tmp_path / "script.py").write_text(
        "import rewards, tasks\n"
        "from mezo_rl.rewards import build_objective, get_reward\n"
        "from mezo_rl.tasks import get_task\n"
        "from mezo_rl.training import trainer\n"
        "assert get_task('sst2').kind == 'classification'\n"
        "assert build_objective([rewards.my_reward]).needs == {'generation'}\n"
        "print('ok', tasks.TASKS)\n")
    res = subprocess.run([sys.executable, "script.py"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "ok []"


def test_nothing_imports_rewards_or_tasks_by_their_bare_names():
    # the bare names would load a second copy of each registry (and break beside a user's rewards.py)
    wrong = []
    for folder in ("mezo_rl", "rewards", "tasks", "tests", "benchmarks", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                wrong += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in ("rewards", "tasks")]
    assert not wrong, "\n".join(sorted(set(wrong)))
