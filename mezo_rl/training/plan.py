"""The plan of a run: what its options leave to the task, the objective and the model, decided once.

::

    plan = plan_run(config, task, objective)    # a pure function: no data read, no model loaded
    print(plan)                                 # the run, one decision a line
    plan.args                                   # the MeZOConfig the run records (training_args.json)

:func:`plan_run` is the one place a run is resolved. ``mezo-rl train`` (through ``mezo_rl.cli.checks``)
and :class:`~mezo_rl.training.trainer.MeZOTrainer` are adapters that build the plan from what they were
given (options, a task name or a dataset, reward names or callables, a model name or object) and then
build what it says; nothing is added to it afterwards. A :class:`RunPlan` is frozen.

What it decides:

- ``args``: the configuration with every default its task decides (the mode, the mode's row, the
  run length, the reward) filled in for the task it was given (:func:`run_config`; a code task or a
  dataset object tells its kind only once built);
- the checks that need the task, the objective or the model, but no data: the rewards fit the
  task's kind and the model, ``beta`` needs a prompt task, ``metric_for_best_model`` is an evaluation
  metric;
- ``metric_for_best`` and ``greater_is_better``: how the best step is picked;
- ``fitness``: how a member's loss is formed (:class:`mezo_rl.training.fitness.Fitness`);
- ``reference``: whether the run keeps its starting weights (the KL of a prompt task on a causal model).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from mezo_rl import rewards
from mezo_rl.errors import ConfigError
from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.training.evaluation import OBJECTIVE, prompt_metrics
from mezo_rl.training.fitness import FitnessSpec
from mezo_rl.training.setup import build_objective, resolve_task
from mezo_rl.training.trl_inputs import resolve_inputs

__all__ = ["RunPlan", "plan_run", "plan_given", "run_config", "reward_refs", "default_metric_for_best",
           "greater_is_better", "replace_args"]


@dataclass(frozen=True)
class RunPlan:
    """A run, resolved: its configuration and every decision taken from its task, objective and model."""

    args: MeZOConfig
    task: Any = field(repr=False, compare=False)
    objective: Any = field(repr=False, compare=False)
    task_kind: str
    rewards: tuple
    metric_for_best: str
    greater_is_better: bool
    fitness: FitnessSpec
    reference: bool
    not_replayable: tuple = ()

    def __str__(self) -> str:
        a = self.args
        lines = [f"task        {a.task} ({self.task_kind})",
                 f"model       {a.model} ({a.dtype}), trains {a.peft}",
                 f"objective   {self.objective!r}",
                 f"fitness     {self.fitness}",
                 f"steps       {a.max_steps} of {a.per_device_train_batch_size} completions, lr {a.learning_rate:g}, "
                 f"eps {a.eps:g}, {a.n_spsa} SPSA sample(s), {a.noise} noise, {a.estimator}",
                 f"best step   {'highest' if self.greater_is_better else 'lowest'} {self.metric_for_best}, "
                 f"evaluated every {a.eval_steps} steps ({a.eval_strategy})",
                 f"output      {a.output_dir}"]
        if self.not_replayable:
            lines.append(f"not replayable from its config: {'; '.join(self.not_replayable)}")
        return "\n".join(lines)


def reward_refs(reward, task, ref=None) -> list:
    """The rewards a run optimises: ``reward`` as given, else its task's own first metric; one line for a run that
    has neither (a task of prompts only, given no reward; ``ref``: how the run named the task)."""
    if reward is not None:
        return [reward] if isinstance(reward, str) else list(reward)
    if task is not None and task.metrics:
        return list(task.metrics[:1])
    name = ref if isinstance(ref, str) else "given"
    raise ConfigError(f"--reward: task {name!r} has prompts only, so no reward of its own; give one: a registered "
                      f"name (`mezo-rl rewards`), module:function or file.py:function (reward_funcs in Python)")


def run_config(args: MeZOConfig, task, objective=None, given: Optional[dict] = None) -> MeZOConfig:
    """The configuration of a run on ``task``: ``args`` itself where the defaults it filled in are the task's,
    else one MeZOConfig built once from the values given (``given``, default ``args.given_values()``) with the
    task's defaults (:meth:`MeZOConfig.filled`). ``objective``: the objective the run was given, whose rewards the
    configuration records where ``reward`` was left to its default."""
    values = dict(args.given_values() if given is None else given)
    if objective is not None and values.get("reward") is None:
        weights = [objective.weights[name] for name in objective.names]
        values.update(reward=list(objective.names), reward_weights=None if set(weights) == {1.0} else weights,
                      reward_scale=objective.normalize)
    filled = MeZOConfig.filled(values, task.kind, list(task.metrics))
    if filled["reward"] is None:
        reward_refs(None, task, filled["task"])  # one line: a prompt task needs a reward
    if given is None and filled == dataclasses.asdict(args):
        return args
    return MeZOConfig(**filled)


def default_metric_for_best(task, names) -> str:
    """The validation metric that picks the best step when ``metric_for_best_model`` is unset: a labelled task's
    first metric; a prompt task's own metric where the run's rewards (``names``) include it (arithmetic's
    ``exact_answer`` under its default reward), else the weighted ``objective`` of the rewards it was given."""
    first = task.metrics[0] if task.metrics else OBJECTIVE
    return first if task.kind != "prompts" or first in (names or ()) else OBJECTIVE


def greater_is_better(name: str, given: Optional[bool]) -> bool:
    """Whether a higher value of the validation metric ``name`` is better: ``given``, else (as transformers
    decides) not for a loss, nor for a reward registered as lower-is-better."""
    if given is not None:
        return given
    if name.endswith("loss"):
        return False
    try:
        return rewards.get_reward(name).higher_is_better is not False
    except Exception:  # noqa: BLE001 - not a reward name (objective, distinct_2, ...): higher is better
        return True


def plan_run(args: MeZOConfig, task, objective, model=None, given: Optional[dict] = None,
             not_replayable=()) -> RunPlan:
    """The plan of a run of ``args`` (or of the values ``given``, where a run was given TRL's way) on ``task`` with
    ``objective``; ``model``: the LanguageModel where it is already loaded (None: its checks wait for it).
    Reads no data and loads nothing; every mistake it finds is one :class:`~mezo_rl.errors.ConfigError` line."""
    args = run_config(args, task, objective, given)
    if args.beta and task.kind != "prompts":
        raise ConfigError(f"--beta penalises the KL of generated completions: it needs a prompt task, and task "
                          f"{args.task!r} is {task.kind}; leave --beta at 0")
    objective.check_task_kind(task.kind)
    if model is not None:
        objective.check_compatible(bool(model.is_causal))
    accepted = prompt_metrics(objective) if task.kind == "prompts" else list(task.metrics)
    if args.metric_for_best_model is not None and args.metric_for_best_model not in accepted:
        raise ConfigError(f"--metric-for-best-model {args.metric_for_best_model!r} is not an evaluation metric of "
                          f"{'this prompt task' if task.kind == 'prompts' else f'task {args.task!r}'}; accepted: "
                          f"{', '.join(accepted)}")
    metric = args.metric_for_best_model or default_metric_for_best(task, objective.names)
    return RunPlan(args=args, task=task, objective=objective, task_kind=task.kind, rewards=tuple(objective.names),
                   metric_for_best=metric, greater_is_better=greater_is_better(metric, args.greater_is_better),
                   fitness=FitnessSpec.of(args), reference=task.kind == "prompts" and (model is None or bool(model.is_causal)),
                   not_replayable=tuple(not_replayable))


def plan_given(args, model=None, reward_funcs=None, train_dataset=None, eval_dataset=None, processing_class=None,
               peft_config=None, reward_processing_classes=None, *, lm=None, task=None, objective=None,
               lm_factory=None) -> tuple:
    """The plan of a run given as ``MeZOTrainer`` takes it (TRL's arguments, :mod:`mezo_rl.training.trl_inputs`;
    or the objects already built: ``lm``, ``task``, ``objective``), with the task and the objective built where
    they were not given; returns ``(plan, lm, lm_factory)``, the model objects None where ``args.model`` names
    the model. Everything but the task's data and the model's weights is read here, so a mistake is one line
    before any model loads."""
    args = args if args is not None else MeZOConfig()
    front = resolve_inputs(args, model, reward_funcs, train_dataset, eval_dataset, processing_class, peft_config,
                           reward_processing_classes)
    lm, lm_factory = (lm, lm_factory) if lm is not None else (front.lm, lm_factory or front.lm_factory)
    values = front.values if front.values is not None else args.given_values()
    objective_of = lambda refs: build_objective(refs, values.get("reward_weights"),  # noqa: E731
                                                values.get("reward_scale"), values.get("trust_remote_code", False))
    if objective is None and (front.rewards or values.get("reward")):  # a bad reward fails first
        objective = objective_of(front.rewards or values["reward"])
    task = task if task is not None else front.task if front.task is not None else resolve_task(values)
    if objective is None:  # the task's own metric
        objective = objective_of(reward_refs(None, task, values.get("task")))
    plan = plan_run(args, task, objective, model=lm, given=front.values, not_replayable=front.not_replayable)
    return plan, lm, lm_factory


def replace_args(plan: RunPlan, **changes) -> RunPlan:
    """The plan with ``args`` changed where a run may change them (``resume``)."""
    return dataclasses.replace(plan, args=dataclasses.replace(plan.args, **changes))
