"""What :class:`~mezo_rl.training.trainer.MeZOTrainer`'s TRL-shaped arguments become.

``MeZOTrainer(model, reward_funcs, args, train_dataset, eval_dataset, processing_class,
reward_processing_classes, callbacks, optimizers, quantization_config, peft_config)`` takes what
``trl.GRPOTrainer`` takes. :func:`resolve_inputs` turns those into option values (what
``training_args.json`` records, resolved once by ``mezo_rl.training.plan.plan_run``) and the objects the
run runs with:

- ``model``: a short name, hub id or path (``args.model``), or a ``PreTrainedModel`` (wrapped with
  ``processing_class``, or the tokenizer saved beside it; ``args.model`` records its ``name_or_path``);
- ``reward_funcs``: a callable, a registered name, a ``module:function`` / ``file.py:function`` path, a
  sequence-classification reward model (an object, a local directory or a hub id; its tokenizer from
  ``reward_processing_classes`` or beside it), or a list of these; a function that names TRL's
  ``completion_ids``, ``trainer_state``, ``log_extra`` or ``log_metric`` gets them (:class:`TRLReward`). A callable is recorded as ``module:qualname`` (a registered one by its name), so
  ``mezo-rl train --config RUN/training_args.json`` imports it again; one that cannot be imported (a lambda, a
  function defined inside another, or one in the running script) still trains, and the run says it
  cannot be replayed from its config alone (summary.json ``config_replayable: false`` and why);
- ``train_dataset`` / ``eval_dataset``: ``datasets`` objects or a path (``mezo_rl.tasks.user``); the run's
  defaults follow the task's kind (a prompt task gets the prompt tasks' run length), and an
  ``IterableDataset`` needs ``max_steps``, since a stream has no length (as in TRL);
- ``peft_config``: a ``peft.LoraConfig`` (``peft="lora"``, its ``r``, ``lora_alpha``, ``target_modules``,
  "all-linear" included, and ``modules_to_save``; ``lora_dropout`` > 0 is refused: MeZO's +eps and -eps passes
  must see the same function) or a ``peft.PrefixTuningConfig`` (``peft="prefix"``, its ``num_virtual_tokens``).
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import pathlib
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from mezo_rl import rewards
from mezo_rl.errors import ConfigError
from mezo_rl.model.lm import LanguageModel
from mezo_rl.training.arguments import DATA_TASK_FIELDS, MeZOConfig
from mezo_rl.rewards.registry import REGISTRY
from mezo_rl.tasks.user import data_task, is_dataset_object, is_iterable_dataset

__all__ = ["Inputs", "resolve_inputs", "reward_reference", "unreplayable_reason", "check_replayable_reward",
           "TRL_REWARD_KEYWORDS", "RewardContext", "TRLReward", "with_trl_keywords", "RewardModel",
           "is_reward_model_ref", "reward_model_spec", "resolve_reward"]

#: what a recorded reward reference cannot be imported from
_NOT_IMPORTABLE = ("<lambda>", "<locals>")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


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


# ---------------------------------------------------------------------- TRL's reward keywords
#: the keywords TRL passes a reward function besides prompts, completions and the dataset's columns
TRL_REWARD_KEYWORDS = ("completion_ids", "trainer_state", "log_extra", "log_metric")


class RewardContext:
    """What TRL's extra reward keywords read and write: ``completion_ids`` (each completion's tokens under the
    policy's tokenizer), ``trainer_state`` (the trainer's :class:`~mezo_rl.training.rundir.TrainerState`),
    ``log_metric(name, value)`` (the step's record gets the mean of the values logged during the step) and
    ``log_extra(column, values)`` (an evaluation's samples get the column). The trainer binds it."""

    def __init__(self):
        self.trainer = None
        self.metrics: dict[str, list[float]] = {}
        self.extra: dict[str, list] = {}

    def keywords(self, completions) -> dict:
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions or []]
        tokenizer = self.trainer.processing_class if self.trainer is not None else None
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts] if tokenizer is not None else None
        return {"completion_ids": ids, "trainer_state": getattr(self.trainer, "state", None),
                "log_extra": self.log_extra, "log_metric": self.log_metric}

    def log_metric(self, name: str, value) -> None:
        self.metrics.setdefault(str(name), []).append(float(value))

    def log_extra(self, column: str, values) -> None:
        self.extra[str(column)] = list(values)

    def take_metrics(self) -> dict:
        """The means of what rewards logged since the last call, and forget them."""
        out = {k: sum(v) / len(v) for k, v in self.metrics.items() if v}
        self.metrics.clear()
        return out

    def take_extra(self) -> dict:
        out, self.extra = self.extra, {}
        return out


class TRLReward:
    """A reward function that names TRL's extra keywords (or takes ``**kwargs``), called with them: the objective
    sees its signature without those keywords, so they are never taken for dataset columns."""

    def __init__(self, fn, context: RewardContext):
        self.fn, self.context = fn, context
        params = list(inspect.signature(fn).parameters.values())
        self.wanted = None if any(p.kind is p.VAR_KEYWORD for p in params) else {
            p.name for p in params if p.name in TRL_REWARD_KEYWORDS}
        kept = [p for p in params if p.name not in TRL_REWARD_KEYWORDS]
        if not any(p.kind is p.VAR_KEYWORD for p in kept):
            kept.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
        self.__signature__ = inspect.signature(fn).replace(parameters=kept)
        for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
            if hasattr(fn, attr):
                setattr(self, attr, getattr(fn, attr))

    def __call__(self, **kwargs):
        extra = self.context.keywords(kwargs.get("completions"))
        return self.fn(**kwargs, **{k: v for k, v in extra.items() if self.wanted is None or k in self.wanted})


def with_trl_keywords(objective, context: RewardContext):
    """``objective`` with each reward that names TRL's extra keywords (or takes ``**kwargs``) called with them."""
    for i, spec in enumerate(objective.rewards):
        if isinstance(spec.fn, (TRLReward, RewardModel)):
            continue
        try:
            params = inspect.signature(spec.fn).parameters.values()
        except (TypeError, ValueError):
            continue
        if any(p.name in TRL_REWARD_KEYWORDS or p.kind is p.VAR_KEYWORD for p in params):
            objective.rewards[i] = dataclasses.replace(spec, fn=TRLReward(spec.fn, context))
    return objective


# ---------------------------------------------------------------------- reward models
class RewardModel:
    """A sequence-classification reward model as TRL scores with it: the ``logits[:, 0]`` of the model on each
    prompt + completion (chat messages rendered with the reward tokenizer's chat template), right-padded,
    in batches, without gradients."""

    def __init__(self, model, tokenizer, batch_size: int = 16):
        self.model, self.tokenizer, self.batch_size = model.eval(), tokenizer, batch_size
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model.config.pad_token_id = tokenizer.pad_token_id
        self.__name__ = self.__qualname__ = "RewardModel"
        self.__doc__ = f"the reward model {getattr(model.config, 'name_or_path', '') or type(model).__name__}"

    def __call__(self, prompts, completions, **kwargs):
        import torch

        texts = [self.tokenizer.apply_chat_template(p + c, tokenize=False) if not isinstance(p, str) else p + c
                 for p, c in zip(prompts, completions)]
        out = []
        with torch.no_grad():
            for i in range(0, len(texts), self.batch_size):
                enc = self.tokenizer(texts[i:i + self.batch_size], return_tensors="pt", padding=True,
                                     padding_side="right", add_special_tokens=False)
                enc = {k: v.to(self.model.device) for k, v in enc.items()}
                out += self.model(**enc).logits[:, 0].float().tolist()
        return out


def is_reward_model_ref(ref: str) -> bool:
    """A reward reference that names a model (a local directory with a config.json, or a hub id ``org/name``)
    rather than a registered reward or a ``module:function`` path."""
    if ":" in ref or ref in REGISTRY:
        return False
    path = pathlib.Path(ref).expanduser()
    return (path / "config.json").is_file() or (not path.exists() and _HUB_ID.match(ref) is not None)


def reward_model_spec(model, tokenizer=None, *, trust_remote_code: bool = False):
    """The reward of a sequence-classification model (an object, a local directory or a hub id) as a RewardSpec
    named by its path; a model that cannot be loaded is one line (ConfigError), before the policy loads."""
    name = model if isinstance(model, str) else getattr(model.config, "name_or_path", "") or type(model).__name__
    try:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if isinstance(model, str):
            model = AutoModelForSequenceClassification.from_pretrained(model, trust_remote_code=trust_remote_code)
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - a missing model, no network, not a classification model: one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(f"reward model {name!r} cannot be loaded ({type(e).__name__}: {first}); give a "
                          f"sequence-classification model (a local directory or a hub id in the cache), a "
                          f"registered reward or module:function") from None
    if not getattr(model.config, "num_labels", 1) >= 1:
        raise ConfigError(f"reward model {name!r} has no output logits to score with")
    return rewards.RewardSpec(name=name, fn=RewardModel(model, tokenizer), needs="generation",
                              source="reward model")


def resolve_reward(ref, *, trust_remote_code: bool = False):
    """A reward reference as a RewardSpec: a reward model's path or hub id (:func:`reward_model_spec`), else
    whatever ``mezo_rl.rewards.get_reward`` resolves."""
    if isinstance(ref, str) and is_reward_model_ref(ref):
        return reward_model_spec(ref, trust_remote_code=trust_remote_code)
    return rewards.get_reward(ref)


@dataclass
class Inputs:
    """What :func:`resolve_inputs` read: the option values of the run (``args.given_values()`` with what the
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
        if peft_config.lora_dropout:
            raise ConfigError(f"peft_config: lora_dropout={peft_config.lora_dropout!r}, accepted: 0 (MeZO compares the "
                              f"loss at +eps and -eps, and dropout would make the two passes different functions)")
        targets, keep = peft_config.target_modules, peft_config.modules_to_save
        values.update(peft="lora", lora_r=int(peft_config.r), lora_alpha=int(peft_config.lora_alpha),
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
            if not isinstance(fn, str) and not pathlib.Path(spec.name).is_dir() and not _HUB_ID.match(spec.name):
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
    values, not_replayable = args.given_values(), []
    if is_iterable_dataset(train_dataset) and "max_steps" not in values:
        raise ConfigError("train_dataset is an IterableDataset: a stream has no length, so give max_steps "
                          "(MeZOConfig(max_steps=...)), as TRL asks")
    lm, lm_factory = _model(model, processing_class, values, not_replayable)
    _peft(peft_config, values)
    specs = _rewards(reward_funcs, values, not_replayable, reward_processing_classes)
    rows = None
    if is_iterable_dataset(train_dataset):
        rows = values.get("num_train", args.num_train) + values.get("num_eval", args.num_eval) + values.get(
            "num_test", args.num_test)
    task = _task(train_dataset, eval_dataset, values, not_replayable, rows)
    return Inputs(values, lm, lm_factory, task, specs, not_replayable)
