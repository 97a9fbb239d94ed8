"""Every value of a run's configuration, decided once, with where it came from.

A :class:`~mezo_rl.training.arguments.MeZOConfig` holds what it was given; an option left unset is None, which
leaves it to the run. :func:`resolve_values` decides those, for the task the run has (its kind and metrics), in
one pass, and names the source of every value (:data:`SOURCES`):

- ``user``: given (an option, a config file's value, or what ``MeZOTrainer`` was given TRL's way);
- ``default``: the field's declared default (:mod:`mezo_rl.training.arguments`);
- ``task default``: what the task decides: the mode (``peft``: every weight for a prompt task), the reward (the
  task's first metric) and a prompt task's row (``mezo_rl.training.defaults.PROMPT_TASK_DEFAULTS``);
- ``mode default``: the mode's row (``mezo_rl.training.defaults.MODE_DEFAULTS``);
- ``derived``: from other values (``eval_steps`` from ``max_steps``; ``max_steps`` from ``num_train_epochs``;
  ``do_sample`` from ``num_generations``);
- ``resumed run``: what a resumed run keeps from its checkpoint (its member evaluation, its weights' dtype).

:func:`mezo_rl.training.plan.plan_run` calls it once; :func:`explain` prints a plan's values with their sources
(``mezo-rl train --dry-run``).
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Optional

from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.training.defaults import DEFAULT_MODE, MODE_DEFAULTS, PROMPT_TASK_DEFAULTS, PROMPT_TASK_MODE

__all__ = ["SOURCES", "USER", "DEFAULT", "TASK_DEFAULT", "MODE_DEFAULT", "DERIVED", "RESUMED", "SMALL_LR_FACTOR",
           "declared_defaults", "default_mode", "default_reward", "mode_defaults", "small_lr_warning", "resolve_values",
           "explain"]

logger = logging.getLogger("mezo_rl")
USER, DEFAULT, TASK_DEFAULT, MODE_DEFAULT, DERIVED, RESUMED = (
    "user", "default", "task default", "mode default", "derived", "resumed run")
SOURCES = (USER, DEFAULT, TASK_DEFAULT, MODE_DEFAULT, DERIVED, RESUMED)
#: never printed: a secret
_HIDDEN = ("hub_token",)


def declared_defaults() -> dict:
    """Each field of :class:`MeZOConfig` -> its declared default (None: left to the run)."""
    return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(MeZOConfig)}


def default_mode(task_kind: str | None) -> str:
    """The mode a run trains when ``--peft`` is not given: :data:`~mezo_rl.training.defaults.PROMPT_TASK_MODE` for a prompt task."""
    return PROMPT_TASK_MODE if task_kind == "prompts" else DEFAULT_MODE


def default_reward(task_metrics: list[str] | None) -> list[str] | None:
    """The reward a run optimises when ``--reward`` is not given: its task's first metric (accuracy for a
    classification task, ``squad_f1`` for SQuAD, ``exact_answer`` for arithmetic). None where there is none
    (a task of prompts only, which the run's own rewards judge) or the metrics are not known yet (a code
    task, until it is built): the run then needs ``--reward`` (:func:`mezo_rl.training.plan.reward_refs`)."""
    return list(task_metrics[:1]) if task_metrics else None


#: a learning rate this many times below its mode's default is a rate sized for backpropagated gradients
#: (GRPO's 1e-6, say): a MeZO step of that size hardly moves the weights in a run of the mode's length
SMALL_LR_FACTOR = 100


def small_lr_warning(lr: float, mode: str, task_kind: str | None = None) -> str | None:
    """One line when ``lr`` (given, not defaulted) is below 1/:data:`SMALL_LR_FACTOR` of ``mode``'s default for
    ``task_kind``, naming that default; None otherwise (an lr of 0 is taken as meant)."""
    default = mode_defaults(mode, task_kind)["learning_rate"]
    if not 0 < lr < default / SMALL_LR_FACTOR:
        return None
    task = "a prompt task" if task_kind == "prompts" else "this task"
    return (f"mezo-rl: learning_rate {lr:g} is below 1/{SMALL_LR_FACTOR} of the {mode} mode's default for {task} "
            f"({default:g}): a rate sized for backpropagated gradients (GRPO's) hardly moves a MeZO run; leave "
            f"learning_rate unset for the mode's default")


def mode_defaults(mode: str, task_kind: str | None = None) -> dict:
    """The defaults of ``mode`` (a row of ``defaults.MODE_DEFAULTS``), with ``defaults.PROMPT_TASK_DEFAULTS`` over
    them where ``task_kind`` is ``"prompts"``."""
    row = dict(MODE_DEFAULTS[mode])
    if task_kind == "prompts":
        row.update(PROMPT_TASK_DEFAULTS.get(mode, {}))
    return row


def resolve_values(values: dict, task_kind: Optional[str], task_metrics: Optional[list[str]],
                   objective=None) -> tuple[dict, dict]:
    """``(every field's value, its source)`` for a run of ``values`` (field values; a field left out or None is
    unset) on a task of ``task_kind`` with the metrics ``task_metrics``; ``objective``: the objective the run was
    given, whose rewards, weights and scale are recorded where ``reward`` is unset. A pure function, but for one
    warning line where a given learning rate is sized for backpropagation (:func:`small_lr_warning`)."""
    declared = declared_defaults()
    out = {**declared, **{k: v for k, v in values.items() if v is not None}}
    if out["max_steps"] == -1:  # transformers' "unset"
        out["max_steps"] = None
    sources = {k: USER if out[k] is not None and out[k] != declared[k] else DEFAULT for k in out}
    steps_given = out["max_steps"] is not None

    def fill(key: str, value, source: str) -> None:
        if out[key] is None and value is not None:
            out[key], sources[key] = value, source

    reward = default_reward(task_metrics)
    if objective is not None and out["reward"] is None:
        weights = [objective.weights[name] for name in objective.names]
        out.update(reward=list(objective.names), reward_weights=None if set(weights) == {1.0} else weights,
                   reward_scale=objective.reward_scale)
        sources.update({k: USER for k in ("reward", "reward_weights", "reward_scale") if out[k] is not None})
        if out["reward"] == reward and out["reward_weights"] is None:  # the objective of the task's own metric
            sources["reward"] = TASK_DEFAULT
    fill("peft", default_mode(task_kind), TASK_DEFAULT)
    # weights of another count are for the rewards a trainer is given (reward_funcs): the plan checks them
    if reward is not None and (out["reward_weights"] is None or len(out["reward_weights"]) == len(reward)):
        fill("reward", reward, TASK_DEFAULT)
    prompt_row = PROMPT_TASK_DEFAULTS.get(out["peft"], {}) if task_kind == "prompts" else {}
    for key, default in mode_defaults(out["peft"], task_kind).items():
        fill(key, default, TASK_DEFAULT if key in prompt_row else MODE_DEFAULT)
    if sources["learning_rate"] == USER and (warning := small_lr_warning(out["learning_rate"], out["peft"], task_kind)):
        logger.warning(warning)
    if out["num_train_epochs"] is not None and not steps_given:  # epochs over the training examples
        prompts = out["per_device_train_batch_size"] * out["gradient_accumulation_steps"] // out["num_generations"]
        out["max_steps"] = max(1, math.ceil(out["num_train_epochs"] * out["num_train"] / max(prompts, 1)))
        sources["max_steps"] = DERIVED
    fill("eval_steps", max(1, out["max_steps"] // 5), DERIVED)
    if out["do_sample"] == (out["num_generations"] > 1):  # the configuration's own rule: TRL samples its generations
        sources["do_sample"] = DERIVED
    return out, sources


def explain(plan) -> str:
    """Every value of ``plan`` (a :class:`~mezo_rl.training.plan.RunPlan`), one a line, with its source
    (:data:`SOURCES`); a resumed run's kept values after the field they resolve."""
    values, resumed = plan.args.to_dict(), plan.resumed
    kept = {"member_evaluation": resumed.member_evaluation, "dtype": resumed.dtype} if resumed is not None else {}
    width = max(map(len, values))
    lines = []
    for name, value in values.items():
        if name in _HIDDEN:
            continue
        source = plan.sources.get(name, USER)
        if kept.get(name) is not None and kept[name] != value:
            value, source = f"{value} -> {kept[name]}", RESUMED
        lines.append(f"{name:<{width}}  {value!s:<24}  {source}")
    return "\n".join(lines)
