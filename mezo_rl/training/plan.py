"""The plan of a run: from what it was given to every decision its options leave to the task, the
objective and the model, taken once.

::

    plan = plan_run(config, task, objective)    # no data read, no model loaded; a resumed run's directory read once
    plan, lm, lm_factory = plan_given(config, model, reward_funcs, train_dataset, ...)   # as MeZOTrainer is given a run
    print(plan)                                 # the run, one decision a line
    plan.args                                   # the MeZOConfig the run records (training_args.json)

:func:`plan_run` is the one place a run is resolved, and :func:`plan_given` the one way there from what a run
is given: ``mezo-rl train`` (through ``mezo_rl.cli.checks``) and
:class:`~mezo_rl.training.trainer.MeZOTrainer` are adapters that call it, then build what the plan says
(:mod:`mezo_rl.training.setup`); nothing is added to it afterwards. A :class:`RunPlan` is frozen.

What a run is given, read here in one straight line (every mistake one line, before any model loads):

- the options (a :class:`~mezo_rl.training.arguments.MeZOConfig`);
- what ``trl.GRPOTrainer`` takes (:func:`resolve_inputs`), turned into option values (what
  ``training_args.json`` records) and the objects the run runs with:

  - ``model``: a short name, hub id or path (``args.model``), or a ``PreTrainedModel`` (wrapped with
    ``processing_class``, or the tokenizer saved beside it; ``args.model`` records its ``name_or_path``);
  - ``reward_funcs``: a callable, a registered name, a ``module:function`` / ``file.py:function`` path, a
    sequence-classification reward model (an object, a local directory or a hub id; its tokenizer from
    ``reward_processing_classes`` or beside it: :mod:`mezo_rl.training.trl_rewards`), or a list of these. A
    callable is recorded as ``module:qualname`` (a registered one by its name), so
    ``mezo-rl train --config RUN/training_args.json`` imports it again; one that cannot be imported (a lambda,
    a function defined inside another, or one in the running script) still trains, and the run says it
    cannot be replayed from its config alone (summary.json ``config_replayable: false`` and why);
  - ``train_dataset`` / ``eval_dataset``: ``datasets`` objects or a path (``mezo_rl.tasks.user``); the run's
    defaults follow the task's kind (a prompt task gets the prompt tasks' run length), and an
    ``IterableDataset`` needs ``max_steps``, since a stream has no length (as in TRL);
  - ``peft_config``: a ``peft.LoraConfig`` (``peft="lora"``, its ``r``, ``lora_alpha``, ``target_modules``,
    "all-linear" included, ``modules_to_save`` and ``lora_dropout``, drawn the same for every member of a step:
    :mod:`mezo_rl.model.dropout`) or a ``peft.PrefixTuningConfig`` (``peft="prefix"``, its
    ``num_virtual_tokens``);

- the task (:func:`resolve_task`: a registered name, ``module:function``, a data file or a dataset) and the
  rewards as one objective (:func:`build_objective`).

What it decides:

- ``args``: the configuration with every value left unset decided for the task it was given (the mode,
  the mode's row, the run length, the reward: :func:`mezo_rl.training.resolve.resolve_values`; a code task or
  a dataset object tells its kind only once built), and ``sources``: where each value came from;
- ``resumed``: with ``resume``, the run in the output directory, read once and checked against this one
  (:func:`mezo_rl.training.rundir.read_resumed`);
- the checks that need the task, the objective or the model, but no data: the rewards fit the
  task's kind and the model, ``beta`` needs a prompt task, ``metric_for_best_model`` is an evaluation
  metric;
- ``metric_for_best`` and ``greater_is_better``: how the best step is picked;
- ``fitness``: how a member's loss is formed (:class:`mezo_rl.training.fitness.Fitness`);
- ``reference``: whether the run keeps its starting weights (the KL of a prompt task on a causal model);
- ``dtype`` and ``max_memory``: what loading the model takes (``--dtype auto`` decided, a resumed run's
  dtype kept; ``--max-memory`` parsed), so the build reads them from the plan.
"""
from __future__ import annotations

import copy
import dataclasses
import pathlib
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, TypeVar

from mezo_rl import rewards
from mezo_rl.choices import (check_member_evaluation, check_report_to, parse_max_memory, serves_low_precision,
                             weights_dtype)
from mezo_rl.errors import ConfigError, UnknownNameError, UserError, first_line
from mezo_rl.model.lm import LanguageModel
from mezo_rl.rewards.registry import REGISTRY
from mezo_rl.training.arguments import DATA_TASK_FIELDS, MeZOConfig, TaskArguments, check_reward_weights
from mezo_rl.training.evaluation import OBJECTIVE, prompt_metrics
from mezo_rl.training.fitness import FitnessSpec
from mezo_rl.training.reporting import metric_key
from mezo_rl.training import rundir
from mezo_rl.training.resolve import USER, resolve_values
from mezo_rl.training.trl_rewards import HUB_ID, is_reward_model_ref, resolve_reward, reward_model_spec
from mezo_rl.tasks import completion_stops, get_task, list_tasks
from mezo_rl.tasks.user import (check_data_task, data_task, is_data_task, is_dataset_object,
                                is_iterable_dataset)

__all__ = ["RunPlan", "plan_run", "plan_given", "run_config", "resolved_config", "reward_refs", "default_metric_for_best",
           "greater_is_better", "best_metric_key", "resumed", "user_code", "resolve_task", "build_objective",
           "Inputs", "resolve_inputs", "reward_reference", "unreplayable_reason", "check_replayable_reward"]

T = TypeVar("T")
#: what a recorded reward reference cannot be imported from
_NOT_IMPORTABLE = ("<lambda>", "<locals>")


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
    #: each field of ``args`` -> where its value came from (:data:`mezo_rl.training.resolve.SOURCES`)
    sources: dict = field(default_factory=dict, repr=False, compare=False)
    #: what a resumed run keeps from its run directory (``mezo_rl.training.rundir.RecordedRun``), read once; or None
    resumed: Any = field(default=None, repr=False, compare=False)
    #: the weights' dtype (``--dtype auto`` decided; a resumed run's, which auto keeps)
    dtype: str = "float32"
    #: the per-device memory caps ``max_memory`` gives, as ``load_model`` takes them (or None)
    max_memory: Optional[dict] = None
    #: where metrics go besides metrics.jsonl: the integrations ``report_to`` names, checked (``all``: those installed)
    report_to: tuple = ()

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


# ---------------------------------------------------------------------- the task and the rewards it was given
def user_code(what: str, ref: str, load: Callable[[], T]) -> T:
    """``load()``, with any failure to find or import ``ref`` (a name, ``module:object`` or
    ``file.py:object``) turned into one :class:`~mezo_rl.errors.UnknownNameError` line naming ``what``."""
    try:
        return load()
    except UserError:
        raise
    except (ImportError, AttributeError, FileNotFoundError, ValueError, TypeError) as e:
        raise UnknownNameError(f"{what} {ref!r}: {first_line(e)}") from e
    except Exception as e:  # the user's module raised while being imported
        raise UnknownNameError(f"{what} {ref!r}: loading it raised {type(e).__name__}: {first_line(e)}") from e


def resolve_task(args):
    """The task ``args.task`` names, with the data options of ``args`` (any arguments object, or a dict of
    field values: ``template``, columns, files).

    Data files and datasets are built here (reading them checks their columns); a registered name,
    ``module:function`` or entry point comes from the task registry. Options that do not fit the
    task are refused before anything is read.
    """
    get = args.get if isinstance(args, dict) else lambda k, default=None: getattr(args, k, default)
    ref = get("task", TaskArguments.task)
    options = {k: get(k) for k in DATA_TASK_FIELDS if get(k) not in (None, [])}
    registered = list_tasks()
    check_data_task(ref, options, registered)
    if is_data_task(ref, options, registered):
        return data_task(ref, options)
    return user_code("--task", ref, lambda: get_task(ref))


def reward_reference(fn) -> str:
    """How ``training_args.json`` records the reward callable ``fn``: its registered name if it is registered, else
    ``module:qualname``."""

    spec = rewards.get_reward(fn)
    if spec.name in REGISTRY and REGISTRY[spec.name].fn is fn:
        return spec.name
    module = getattr(fn, "__module__", None) or type(fn).__module__
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}:{qualname}"


def unreplayable_reason(ref: str) -> Optional[str]:
    """Why the recorded reward reference ``ref`` cannot be imported again, or None when it can be tried."""
    if ":" not in ref:
        return None
    module, _, qualname = ref.rpartition(":")
    if any(part in qualname for part in _NOT_IMPORTABLE):
        kind = "a lambda" if "<lambda>" in qualname else "a function defined inside another"
        return f"reward {ref!r} is {kind}"
    if module == "__main__":
        return f"reward {ref!r} is defined in the script that ran the training"
    return None


def check_replayable_reward(ref: str) -> None:
    """One line for a recorded reward that cannot be imported again (a lambda, a local function, one from the
    training script), before anything loads."""
    reason = unreplayable_reason(ref)
    if reason is not None:
        raise ConfigError(f"--reward {ref!r}: {reason}, so it cannot be imported again; the reward must be importable "
                          f"to replay a run from its config: move it to a module (module:function or "
                          f"file.py:function) and give that")


def build_objective(refs, weights=None, reward_scale=None, trust_remote_code: bool = False, given: str = "--reward"):
    """The objective of the rewards ``refs`` (names, ``module:function`` paths, a reward model's path or hub id:
    ``mezo_rl.training.trl_rewards.resolve_reward``; or RewardSpecs already resolved) with ``reward_weights`` (one
    per reward, in order: a count mismatch is one line naming the rewards and where they were ``given``) and
    ``reward_scale``; a reference that cannot be resolved, or imported again to replay the run, is one line."""
    check_reward_weights(weights, [ref if isinstance(ref, str) else ref.name for ref in refs], given)
    specs = []
    for ref in refs:
        if isinstance(ref, str):
            check_replayable_reward(ref)
            ref = user_code("--reward", ref, lambda ref=ref: resolve_reward(ref, trust_remote_code=trust_remote_code))
        specs.append(ref)
    return rewards.build_objective(specs, weights=weights, reward_scale=reward_scale)


# ---------------------------------------------------------------------- what MeZOTrainer was given, TRL's way
@dataclass
class Inputs:
    """What :func:`resolve_inputs` read: the option values of the run (the fields of ``args``, None where unset, with what the
    TRL-shaped arguments stand for; None where none was given) and the objects it runs with (None: built from
    the options as usual). The plan (``mezo_rl.training.plan.plan_run``) resolves the configuration from them."""

    values: Optional[dict] = None
    lm: Any = None
    lm_factory: Optional[Callable] = None
    task: Any = None
    rewards: Optional[list] = None
    not_replayable: list[str] = field(default_factory=list)


def _is_pretrained_model(obj) -> bool:
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(obj, transformers.PreTrainedModel)


def _model(model, processing_class, values: dict, not_replayable: list) -> tuple:
    """``(lm, lm_factory)`` for a model object (None, None for a name), ``values["model"]`` set. The object is
    copied once, before training, so the best step's weights can be rebuilt from the starting ones."""
    if model is None:
        if processing_class is not None:
            raise ConfigError("processing_class goes with a model object; a model named by args.model brings its own tokenizer")
        return None, None
    if isinstance(model, str):
        if processing_class is not None:
            raise ConfigError(f"processing_class goes with a model object; model {model!r} is loaded with its own tokenizer")
        values["model"] = model
        return None, None
    if isinstance(model, LanguageModel):
        base, tokenizer = model.model, processing_class or model.tokenizer
    elif _is_pretrained_model(model):
        base, tokenizer = model, processing_class
    else:
        raise ConfigError(f"model: got a {type(model).__name__}; accepted: a short name, a hub id or path, or a "
                          f"transformers PreTrainedModel (with processing_class, its tokenizer)")
    name = getattr(getattr(base, "config", None), "name_or_path", None) or ""
    if tokenizer is None:
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(name)
        except Exception:  # noqa: BLE001 - any failure: the user must pass the tokenizer
            raise ConfigError(f"model: a {type(base).__name__} object whose tokenizer cannot be loaded from "
                              f"{name or 'its config'!r}; pass processing_class=tokenizer") from None
    if hasattr(tokenizer, "tokenizer") and not hasattr(tokenizer, "apply_chat_template"):
        tokenizer = tokenizer.tokenizer  # a processor: its text tokenizer
    values["model"] = name or type(base).__name__
    if not name:
        not_replayable.append(f"the model is a {type(base).__name__} object without a name_or_path (save it with "
                              f"save_pretrained and give the directory to replay the run)")
    pristine = copy.deepcopy(base)  # the base weights, to rebuild the best step after training

    def factory():
        return LanguageModel(copy.deepcopy(pristine), tokenizer)

    return LanguageModel(base, tokenizer), factory


def _peft(peft_config, values: dict) -> None:
    if peft_config is None:
        return
    kind = type(peft_config).__name__
    if kind == "LoraConfig":
        targets, keep = peft_config.target_modules, peft_config.modules_to_save
        values.update(peft="lora", lora_r=int(peft_config.r), lora_alpha=int(peft_config.lora_alpha),
                      lora_dropout=float(peft_config.lora_dropout),
                      lora_target_modules=None if targets is None else [targets] if isinstance(targets, str)
                      else sorted(targets),
                      lora_modules_to_save=None if not keep else [keep] if isinstance(keep, str) else list(keep))
    elif kind == "PrefixTuningConfig":
        values.update(peft="prefix", num_prefix_tokens=int(peft_config.num_virtual_tokens))
    else:
        raise ConfigError(f"peft_config: got a {kind}; accepted: a peft.LoraConfig or a peft.PrefixTuningConfig")


def _rewards(reward_funcs, values: dict, not_replayable: list, processing_classes=None) -> Optional[list]:
    """The objective's rewards (callables kept as objects so they run in this process), ``values["reward"]``
    set to what training_args.json records."""
    if reward_funcs is None:
        return None
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if not funcs:
        raise ConfigError("reward_funcs: give at least one reward (a function, a registered name or 'module:function')")
    classes = processing_classes if isinstance(processing_classes, (list, tuple)) else [processing_classes] * len(funcs)
    if len(classes) != len(funcs):
        raise ConfigError(f"reward_processing_classes: got {len(classes)} for {len(funcs)} reward_funcs; give one per "
                          f"reward (None for a function)")
    refs, specs = [], []
    for i, (fn, tokenizer) in enumerate(zip(funcs, classes)):
        if _is_pretrained_model(fn) or (isinstance(fn, str) and is_reward_model_ref(fn)):
            spec = reward_model_spec(fn, tokenizer, trust_remote_code=values.get("trust_remote_code", False))
            if not isinstance(fn, str) and not pathlib.Path(spec.name).is_dir() and not HUB_ID.match(spec.name):
                not_replayable.append(f"reward model {spec.name!r} is an object without a saved path")
            refs.append(spec.name)
            specs.append(spec)
        elif isinstance(fn, str):
            check_replayable_reward(fn)
            refs.append(fn)
            specs.append(fn)
        elif callable(fn):
            ref = reward_reference(fn)
            reason = unreplayable_reason(ref)
            if reason is not None:
                not_replayable.append(reason)
            refs.append(ref)
            specs.append(dataclasses.replace(rewards.get_reward(fn), name=ref))
        else:
            raise ConfigError(f"reward_funcs[{i}]: got a {type(fn).__name__}, which is not callable; accepted: a "
                              f"function (prompts, completions, **columns) -> list[float], a registered name or "
                              f"'module:function'")
    values["reward"] = refs
    return specs


def _task(train_dataset, eval_dataset, values: dict, not_replayable: list, max_rows: Optional[int]):
    """The task of the datasets (None when neither is given), ``values["task"]`` set to what training_args.json records."""
    if train_dataset is None:
        if eval_dataset is not None:
            raise ConfigError("eval_dataset needs a train_dataset")
        return None
    if isinstance(train_dataset, str) and eval_dataset is None:
        values["task"] = train_dataset
        return None
    if eval_dataset is not None and not is_dataset_object(eval_dataset):
        raise ConfigError(f"eval_dataset: got a {type(eval_dataset).__name__}; accepted: a datasets.Dataset (with a "
                          f"train_dataset object)")
    if not is_dataset_object(train_dataset):
        raise ConfigError(f"train_dataset: got a {type(train_dataset).__name__}; accepted: a datasets Dataset, "
                          f"DatasetDict or IterableDataset, or a path (a data file or a dataset directory)")
    source = train_dataset if eval_dataset is None else {"train": train_dataset, "validation": eval_dataset}
    options = {k: values[k] for k in DATA_TASK_FIELDS if values.get(k) not in (None, [])}
    task = data_task(source, options, max_rows=max_rows if is_iterable_dataset(source) else None)
    values["task"] = _dataset_reference(source, not_replayable)
    return task


def _dataset_reference(source, not_replayable: list) -> str:
    """A dataset object's train split as a file the config can name again (its one Arrow cache file), or a
    description of an in-memory dataset, which a config cannot replay."""
    data = source["train"] if isinstance(source, dict) and "train" in source else source
    files = getattr(data, "cache_files", None) or []
    if len(files) == 1 and not isinstance(source, dict):
        return files[0]["filename"]
    described = f"<{type(data).__name__} object>"
    not_replayable.append(f"the dataset is an in-memory {type(source).__name__} (save it with save_to_disk or to a "
                          f"file and give the path to replay the run)")
    return described


def resolve_inputs(args, model=None, reward_funcs=None, train_dataset=None, eval_dataset=None,
                   processing_class=None, peft_config=None, reward_processing_classes=None) -> Inputs:
    """The configuration and objects of a run given TRL's way (see the module docstring); every mistake is one
    :class:`~mezo_rl.errors.UserError` line, before any model loads."""
    if not isinstance(args, MeZOConfig):
        raise ConfigError(f"args: got a {type(args).__name__}; accepted: a MeZOConfig (TRL's GRPOConfig fields "
                          f"that mean something for MeZO have the same names; see docs/rl.md)")
    if all(x is None for x in (model, reward_funcs, train_dataset, eval_dataset, processing_class, peft_config,
                               reward_processing_classes)):
        return Inputs()  # everything comes from args
    values, not_replayable = dataclasses.asdict(args), []  # None: unset, left to the plan
    if is_iterable_dataset(train_dataset) and values["max_steps"] is None:
        raise ConfigError("train_dataset is an IterableDataset: a stream has no length, so give max_steps "
                          "(MeZOConfig(max_steps=...)), as TRL asks")
    lm, lm_factory = _model(model, processing_class, values, not_replayable)
    _peft(peft_config, values)
    specs = _rewards(reward_funcs, values, not_replayable, reward_processing_classes)
    rows = None
    if is_iterable_dataset(train_dataset):
        rows = values["num_train"] + values["num_eval"] + values["num_test"]
    task = _task(train_dataset, eval_dataset, values, not_replayable, rows)
    return Inputs(values, lm, lm_factory, task, specs, not_replayable)


# ---------------------------------------------------------------------- the plan
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
    """The configuration of a run on ``task`` (:func:`resolved_config`)."""
    return resolved_config(args, task, objective, given)[0]


def resolved_config(args: MeZOConfig, task, objective=None, given: Optional[dict] = None) -> tuple[MeZOConfig, dict]:
    """The configuration of a run on ``task`` and the source of each value
    (:func:`mezo_rl.training.resolve.resolve_values`): ``args``'s values (or the values ``given``, where a run
    was given TRL's way) with every one left unset decided for ``task``; ``objective``: the objective the run was
    given, whose rewards the configuration records where ``reward`` is unset."""
    values, sources = resolve_values(dataclasses.asdict(args) if given is None else given, task.kind,
                                     list(task.metrics), objective)
    if values["reward"] is None:
        reward_refs(None, task, values["task"])  # one line: a prompt task needs a reward
    return MeZOConfig(**values), sources


def default_metric_for_best(task, names) -> str:
    """The validation metric that picks the best step when ``metric_for_best_model`` is unset: a labelled task's
    first metric; a prompt task's own metric where the run's rewards (``names``) include it (arithmetic's
    ``exact_answer`` under its default reward), else the weighted ``objective`` of the rewards it was given."""
    first = task.metrics[0] if task.metrics else OBJECTIVE
    return first if task.kind != "prompts" or first in (names or ()) else OBJECTIVE


def best_metric_key(name: str, task, objective, ref=None) -> str:
    """The evaluation metric ``metric_for_best_model`` names, as ``evaluate()`` and the logs name it (TRL's names,
    with or without transformers' ``eval_`` prefix: ``eval_reward``, ``rewards/reward_len/mean``, ``accuracy``),
    as the run's files key it; one line naming the accepted names otherwise."""
    keys = prompt_metrics(objective) if task.kind == "prompts" else list(task.metrics)
    names = rewards.trl_names(objective.names)
    by_name = {metric_key(k, names): k for k in keys}
    short = name[len("eval_"):] if name.startswith("eval_") else name
    if short not in by_name:
        raise ConfigError(f"--metric-for-best-model {name!r} is not an evaluation metric of "
                          f"{'this prompt task' if task.kind == 'prompts' else f'task {ref!r}'}; accepted: "
                          f"{', '.join(f'eval_{k}' for k in by_name)} (eval_ may be left out)")
    return by_name[short]


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
    Reads no data and loads nothing; a resumed run's directory is read here, once
    (:func:`mezo_rl.training.rundir.read_resumed`). Every mistake it finds is one
    :class:`~mezo_rl.errors.ConfigError` line."""
    values = dataclasses.asdict(args) if given is None else dict(given)
    if values["beta"] and task.kind != "prompts":
        raise ConfigError(f"--beta penalises the KL of generated completions: it needs a prompt task, and task "
                          f"{values['task']!r} is {task.kind}; leave --beta at 0")
    objective.check_task_kind(task.kind)
    if model is not None:
        objective.check_compatible(bool(model.is_causal))
    metric = default_metric_for_best(task, objective.names)
    if values["metric_for_best_model"] is not None:
        metric = best_metric_key(values["metric_for_best_model"], task, objective, values["task"])
    better = greater_is_better(metric, values["greater_is_better"])
    args, sources = resolved_config(args, task, objective, given)  # every value decided, its combinations checked
    stops = completion_stops(task, args.stop)
    resumed = rundir.read_resumed(args.output_dir, args, task, objective, stops) if args.resume else None
    # --dtype auto: a resumed run's dtype; else bf16 where native, for a run whose members can be evaluated on it
    weights = weights_dtype(args.dtype, args.autocast, resumed.dtype if resumed is not None else None,
                            serves_low_precision(args.member_evaluation, args.peft, args.noise, args.trainable))
    check_member_evaluation(args.member_evaluation, args.peft, args.noise, args.trainable, weights)
    report_to, max_memory = tuple(check_report_to(args.report_to)), parse_max_memory(args.max_memory)
    return RunPlan(args=args, task=task, objective=objective, task_kind=task.kind, rewards=tuple(objective.names),
                   metric_for_best=metric, greater_is_better=better, fitness=FitnessSpec.of(args),
                   reference=task.kind == "prompts" and (model is None or bool(model.is_causal)),
                   not_replayable=tuple(not_replayable), sources=sources, resumed=resumed, dtype=weights,
                   max_memory=max_memory, report_to=report_to)


def plan_given(args, model=None, reward_funcs=None, train_dataset=None, eval_dataset=None, processing_class=None,
               peft_config=None, reward_processing_classes=None, *, lm=None, task=None, objective=None,
               lm_factory=None) -> tuple:
    """The plan of a run given as ``MeZOTrainer`` takes it (TRL's arguments, :func:`resolve_inputs`;
    or the objects already built: ``lm``, ``task``, ``objective``), with the task and the objective built where
    they were not given; returns ``(plan, lm, lm_factory)``, the model objects None where ``args.model`` names
    the model. Everything but the task's data and the model's weights is read here, so a mistake is one line
    before any model loads."""
    args = args if args is not None else MeZOConfig()
    front = resolve_inputs(args, model, reward_funcs, train_dataset, eval_dataset, processing_class, peft_config,
                           reward_processing_classes)
    lm, lm_factory = (lm, lm_factory) if lm is not None else (front.lm, lm_factory or front.lm_factory)
    values = front.values if front.values is not None else dataclasses.asdict(args)
    objective_of = lambda refs, given: build_objective(refs, values.get("reward_weights"),  # noqa: E731
                                                       values.get("reward_scale"), values.get("trust_remote_code", False),
                                                       given)
    if objective is None and (front.rewards or values.get("reward")):  # a bad reward fails first
        objective = objective_of(front.rewards or values["reward"], "reward_funcs" if front.rewards else "--reward")
    task = task if task is not None else front.task if front.task is not None else resolve_task(values)
    if objective is None:  # the task's own metric
        objective = objective_of(reward_refs(None, task, values.get("task")),
                                 "no --reward or reward_funcs: the task's own metric")
    plan = plan_run(args, task, objective, model=lm, given=front.values, not_replayable=front.not_replayable)
    return plan, lm, lm_factory


def resumed(plan: RunPlan) -> RunPlan:
    """``plan`` resuming the run in its output directory (``trainer.train(resume_from_checkpoint=...)``)."""
    args = dataclasses.replace(plan.args, resume=True)
    recorded = rundir.read_resumed(args.output_dir, args, plan.task, plan.objective, completion_stops(plan.task, args.stop))
    return dataclasses.replace(plan, args=args, resumed=recorded, sources={**plan.sources, "resume": USER})
