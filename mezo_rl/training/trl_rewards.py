"""Rewards as TRL takes them: sequence-classification reward models, and TRL's extra reward keywords.

- :class:`RewardModel` / :func:`reward_model_spec`: a reward model (an object, a local directory or a hub
  id, with its tokenizer) scores each prompt + completion as TRL scores with it; :func:`resolve_reward` turns
  a reward reference into a ``RewardSpec`` (a reward model's path, else what ``mezo_rl.rewards.get_reward``
  resolves), as the plan (:mod:`mezo_rl.training.plan`) reads a run's rewards;
- :class:`RewardContext` / :class:`TRLReward` / :func:`with_trl_keywords`: a reward function that names TRL's
  ``completion_ids``, ``trainer_state``, ``log_extra`` or ``log_metric`` gets them; the trainer binds the context.
"""
from __future__ import annotations

import dataclasses
import inspect
import pathlib
import re

from mezo_rl import rewards
from mezo_rl.errors import ConfigError
from mezo_rl.rewards.registry import REGISTRY

__all__ = ["TRL_REWARD_KEYWORDS", "RewardContext", "TRLReward", "with_trl_keywords", "RewardModel",
           "is_reward_model_ref", "reward_model_spec", "resolve_reward", "HUB_ID"]

#: a hub id ``org/name``
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


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
    return (path / "config.json").is_file() or (not path.exists() and HUB_ID.match(ref) is not None)


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
