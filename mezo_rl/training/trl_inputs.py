"""What :class:`~mezo_rl.training.trainer.MeZOTrainer`'s TRL-shaped arguments become.

``MeZOTrainer(model, reward_funcs, args, train_dataset, eval_dataset, processing_class, callbacks,
peft_config)`` takes what ``trl.GRPOTrainer`` takes. :func:`resolve_inputs` turns those into the one
configuration the run records (``config.json``) and the objects it runs with:

- ``model``: a short name, hub id or path (``args.model``), or a ``PreTrainedModel`` (wrapped with
  ``processing_class``, or the tokenizer saved beside it; ``args.model`` records its ``name_or_path``);
- ``reward_funcs``: a callable, a registered name, a ``module:function`` / ``file.py:function`` path, or a
  list of these. A callable is recorded as ``module:qualname`` (a registered one by its name), so
  ``mezo-rl train --config RUN/config.json`` imports it again; one that cannot be imported (a lambda, a
  function defined inside another, or one in the running script) still trains, and the run says it
  cannot be replayed from its config alone (summary.json ``config_replayable: false`` and why);
- ``train_dataset`` / ``eval_dataset``: ``datasets`` objects or a path (``mezo_rl.tasks.user``); the run's
  defaults follow the task's kind (a prompt task gets the prompt tasks' run length), and an
  ``IterableDataset`` needs ``max_steps``, since a stream has no length (as in TRL);
- ``peft_config``: a ``peft.LoraConfig`` (``peft="lora"``, its ``r`` and ``lora_alpha``) or a
  ``peft.PrefixTuningConfig`` (``peft="prefix"``, its ``num_virtual_tokens``).
"""
from __future__ import annotations

import copy
import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from mezo_rl import rewards
from mezo_rl.errors import ConfigError
from mezo_rl.model.lm import LanguageModel
from mezo_rl.training.arguments import DATA_TASK_FIELDS, MeZOConfig
from mezo_rl.rewards.registry import REGISTRY
from mezo_rl.tasks.user import data_task, is_dataset_object, is_iterable_dataset

__all__ = ["Inputs", "resolve_inputs", "reward_reference", "unreplayable_reason", "check_replayable_reward"]

#: what a recorded reward reference cannot be imported from
_NOT_IMPORTABLE = ("<lambda>", "<locals>")


def reward_reference(fn) -> str:
    """How ``config.json`` records the reward callable ``fn``: its registered name if it is registered, else
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


@dataclass
class Inputs:
    """What :func:`resolve_inputs` built: the run's configuration and the objects the trainer runs with
    (None: built from ``args`` as usual)."""

    args: Any
    lm: Any = None
    lm_factory: Optional[Callable] = None
    task: Any = None
    objective: Any = None
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
        targets = peft_config.target_modules
        if targets not in (None, "all-linear") and set(targets) != {"q_proj", "v_proj"}:
            raise ConfigError(f"peft_config: LoRA on {sorted(targets)}; MeZO's LoRA wraps the attention's q_proj and "
                              f"v_proj (the paper's choice): leave target_modules unset")
        values.update(peft="lora", lora_r=int(peft_config.r), lora_alpha=int(peft_config.lora_alpha))
    elif kind == "PrefixTuningConfig":
        values.update(peft="prefix", num_prefix_tokens=int(peft_config.num_virtual_tokens))
    else:
        raise ConfigError(f"peft_config: got a {kind}; accepted: a peft.LoraConfig or a peft.PrefixTuningConfig")


def _rewards(reward_funcs, values: dict, not_replayable: list) -> Optional[list]:
    """The objective's rewards (callables kept as objects so they run in this process), ``values["reward"]``
    set to what config.json records."""
    if reward_funcs is None:
        return None
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if not funcs:
        raise ConfigError("reward_funcs: give at least one reward (a function, a registered name or 'module:function')")
    refs, specs = [], []
    for i, fn in enumerate(funcs):
        if isinstance(fn, str):
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
    """The task of the datasets (None when neither is given), ``values["task"]`` set to what config.json records."""
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
                   processing_class=None, peft_config=None) -> Inputs:
    """The configuration and objects of a run given TRL's way (see the module docstring); every mistake is one
    :class:`~mezo_rl.errors.UserError` line, before any model loads."""
    if not isinstance(args, MeZOConfig):
        raise ConfigError(f"args: got a {type(args).__name__}; accepted: a MeZOConfig (TRL's GRPOConfig fields "
                          f"that mean something for MeZO have the same names; see docs/rl.md)")
    if all(x is None for x in (model, reward_funcs, train_dataset, eval_dataset, processing_class, peft_config)):
        return Inputs(args)  # everything comes from args
    values, not_replayable = args.given_values(), []
    if is_iterable_dataset(train_dataset) and "max_steps" not in values:
        raise ConfigError("train_dataset is an IterableDataset: a stream has no length, so give max_steps "
                          "(MeZOConfig(max_steps=...)), as TRL asks")
    lm, lm_factory = _model(model, processing_class, values, not_replayable)
    _peft(peft_config, values)
    specs = _rewards(reward_funcs, values, not_replayable)
    rows = None
    if is_iterable_dataset(train_dataset):
        rows = values.get("num_train", args.num_train) + values.get("num_eval", args.num_eval) + values.get(
            "num_test", args.num_test)
    task = _task(train_dataset, eval_dataset, values, not_replayable, rows)
    if task is not None:
        values["_task_kind"] = task.kind
    new_args = MeZOConfig.resolve(values)
    objective = None
    if specs is not None:
            objective = rewards.build_objective(specs, weights=new_args.reward_weights,
                                            normalize=new_args.reward_normalize)
    return Inputs(new_args, lm, lm_factory, task, objective, not_replayable)
