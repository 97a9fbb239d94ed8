"""The configuration is declarative: ``mezo_rl.training.arguments`` imports the values its fields accept from
small constant modules, never the machinery (the engine, the model, reporting, the member evaluation, the tasks),
and it has no task lookups or defaults of its own to fill in: the plan decides every value left unset."""
from __future__ import annotations

import ast
import dataclasses
import pathlib

from mezo_rl.training.arguments import MeZOConfig

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: what the configuration may import from mezo_rl: the leaves, the per-mode table (its help texts), TRL's names and
#: the fields' machinery
ALLOWED = {"mezo_rl.errors", "mezo_rl.choices", "mezo_rl.rewards", "mezo_rl.training.defaults",
           "mezo_rl.training.config", "mezo_rl.training.fields"}
#: what it must not reach, directly or through what it imports
MACHINERY = ("mezo_rl.engine", "mezo_rl.model", "mezo_rl.tasks", "mezo_rl.training.reporting",
             "mezo_rl.training.member_evaluation", "mezo_rl.training.outputs", "mezo_rl.training.plan")


def source(module: str) -> pathlib.Path:
    parts = module.split(".")
    if parts[1] in ("rewards", "tasks"):  # installed from the top-level folders
        parts = parts[1:]
    path = ROOT.joinpath(*parts)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def mezo_imports(module: str) -> set[str]:
    """Every mezo_rl module ``module`` imports, anywhere in its file (function-local imports included)."""
    found = set()
    for node in ast.walk(ast.parse(source(module).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n for n in names if n == "mezo_rl" or n.startswith("mezo_rl.")}
    return found


def test_the_configuration_imports_only_constants_and_leaves():
    direct = mezo_imports("mezo_rl.training.arguments")
    assert direct <= ALLOWED, f"arguments.py imports {sorted(direct - ALLOWED)}"
    seen, todo = set(), list(direct)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(mezo_imports(module))
    reached = sorted(m for m in seen if m.startswith(MACHINERY))
    assert not reached, f"the configuration reaches the machinery through {reached}"


def test_the_configuration_holds_what_it_was_given():
    args = MeZOConfig(task="prompts.jsonl")
    assert (args.peft, args.learning_rate, args.max_steps, args.reward, args.eval_steps) == (None,) * 5
    assert not hasattr(MeZOConfig, "filled") and not hasattr(MeZOConfig, "given_values")
    assert not hasattr(MeZOConfig, "task_kind") and "_defaulted" not in vars(args)
    assert dataclasses.asdict(MeZOConfig(learning_rate=0.5))["learning_rate"] == 0.5
