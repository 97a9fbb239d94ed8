"""The import graph, read from the source: layers import only downward, and nothing forms a cycle.

``mezo_rl`` is layered: the leaf modules (``errors``, ``registry``) <- ``engine`` <- ``model`` <- ``training``
<- ``cli``. A module may import its own layer and the layers before it, never a later one. ``rewards`` and
``tasks`` import only the leaf modules of ``mezo_rl``; only ``training`` and ``cli`` import them.
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


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def project_modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for pkg in ("mezo_rl", "rewards", "tasks") for p in (ROOT / pkg).rglob("*.py")}


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
    roots = ("mezo_rl", "rewards", "tasks")
    return {m for m in out if m.split(".")[0] in roots}


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
        if not name.startswith("mezo_rl"):
            continue
        mine = LAYERS.index(layer(name))
        for target in imported(path, name):
            if target.split(".")[0] in ("rewards", "tasks"):
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
    wrong = [f"{name} imports {target}" for name, path in modules.items() if name.split(".")[0] in ("rewards", "tasks")
             for target in imported(path, name) if target.startswith("mezo_rl") and target in modules
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
    packages = ["mezo_rl", "rewards", "tasks", "mezo_rl.engine.optim", "mezo_rl.model.lm", "mezo_rl.training.trainer",
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
