"""How an option is declared and checked: the machinery of the argument dataclasses
(:mod:`mezo_rl.training.arguments`), none of their fields.

- :func:`option`: a dataclass field with its ``--help`` text and what it accepts (``choices``, an integer ``min``,
  number bounds); :func:`shared`: the same field declared in another dataclass; :func:`flag`: its command-line
  spelling;
- :class:`Arguments`: the base class that checks every field against its type and what it accepts, in one loop,
  and reads a run's recorded ``training_args.json`` (:meth:`Arguments.from_dict`);
- :func:`canonical_options` / :func:`accepts_trl_options`: keywords under TRL's and transformers' names
  (:mod:`mezo_rl.training.config`), and the earlier names of :data:`RENAMED`, refused in one line naming their
  successor.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from mezo_rl.choices import check_dtype
from mezo_rl.errors import ConfigError
from mezo_rl.training.config import trl_options

__all__ = ["RENAMED", "option", "flag", "shared", "canonical_options", "accepts_trl_options", "unwrap_optional",
           "Arguments"]

#: earlier field names -> TRL's, named in the error that refuses them (they are not accepted); per command:
#: :data:`RENAMED_OPTIONS`
RENAMED = {"lr": "learning_rate", "steps": "max_steps", "batch_size": "per_device_train_batch_size",
           "max_new_tokens": "max_completion_length", "lr_scheduler": "lr_scheduler_type",
           "metric_for_best": "metric_for_best_model", "reward_normalize": "reward_scale", "normalize": "step_normalize",
           "evaluation": "member_evaluation"}


def option(default: Any = dataclasses.MISSING, help: str = "", *, choices=None, min: Optional[int] = None,
           gt: Optional[float] = None, ge: Optional[float] = None, lt: Optional[float] = None,
           le: Optional[float] = None,
           default_factory: Any = dataclasses.MISSING, verbatim: bool = False):
    """A dataclass field with its ``--help`` text and what it accepts in the metadata: ``choices``,
    an integer ``min``, or number bounds ``gt`` (>), ``ge`` (>=), ``lt`` (<), ``le`` (<=). ``verbatim`` (a list of strings):
    each ``--option`` on the command line is one item, commas and spaces kept, with the escapes ``\\n``,
    ``\\t`` and ``\\\\`` read as a newline, a tab and a backslash."""
    metadata: dict[str, Any] = {"help": help}
    if verbatim:
        metadata["verbatim"] = True
    if choices is not None:
        metadata["choices"] = list(choices)
    for key, bound in (("min", min), ("gt", gt), ("ge", ge), ("lt", lt), ("le", le)):
        if bound is not None:
            metadata[key] = bound
    return field(default=default, default_factory=default_factory, metadata=metadata)


def flag(name: str) -> str:
    """The command-line spelling of a field: ``eval_steps`` -> ``--eval-steps``."""
    return "--" + name.replace("_", "-")


_BOUNDS = {"gt": (lambda v, b: v > b, ">"), "ge": (lambda v, b: v >= b, ">="), "lt": (lambda v, b: v < b, "<"),
           "le": (lambda v, b: v <= b, "<=")}


def canonical_options(cls, values: dict) -> dict:
    """``values`` (keywords, or a config file's keys) under ``cls``'s field names: the fields of TRL's
    ``GRPOConfig`` and transformers' ``TrainingArguments`` that ``cls`` does not have are handled by
    :func:`mezo_rl.training.config.trl_options` (mapped onto a field, named in one warning line, or refused);
    names known to none of them are refused together, in one line."""
    fields = {f.name for f in dataclasses.fields(cls)}
    out = trl_options(values, fields)
    unknown = [k for k in out if k not in fields]
    if unknown:
        hints = [f"{k!r} (now {RENAMED[k]!r})" if RENAMED.get(k) in fields else
                 f"{k!r} (did you mean {close[0]!r}?)" if close else repr(k)
                 for k in unknown for close in [difflib.get_close_matches(k, sorted(fields), n=1, cutoff=0.8)]]
        raise ConfigError(f"unknown {cls.__name__} field{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; "
                          f"accepted: the fields of {cls.__name__}, GRPOConfig and TrainingArguments")
    return out


def accepts_trl_options(cls):
    """Class decorator (over ``@dataclass``): the constructor also takes the fields of TRL's ``GRPOConfig`` and
    transformers' ``TrainingArguments`` (:func:`canonical_options`)."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **canonical_options(type(self), kwargs))

    cls.__init__ = __init__
    return cls


def unwrap_optional(tp):
    """``Optional[X]`` -> ``X`` (other types unchanged)."""
    if typing.get_origin(tp) is typing.Union or type(tp).__name__ == "UnionType":
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _check_type(name: str, value, tp, shown: Optional[str] = None):
    """``value`` as the field's type (an int where a float is expected becomes a float); ConfigError otherwise
    (naming the option as ``shown``, default ``--name``)."""
    tp = unwrap_optional(tp)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, (list, tuple)):
            return [_check_type(name, v, item, shown) for v in value]
    elif tp in (int, float, str, bool) and isinstance(value, tp) and not (tp is int and isinstance(value, bool)):
        return value
    elif tp not in (int, float, str, bool):
        return value
    expected = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, f"a list of {tp}")
    raise ConfigError(f"{shown or flag(name)}: got {value!r} ({type(value).__name__}), expected {expected}")


def shared(cls, name: str, **metadata):
    """The field ``name`` of the dataclass ``cls``, to declare the same option in another dataclass
    (same default, help, choices; ``metadata`` overrides, e.g. a command-specific help text)."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    return field(default=f.default, default_factory=f.default_factory, metadata={**f.metadata, **metadata})


@dataclass
class Arguments:
    """Base of the argument dataclasses: checks every field against its declared ``choices`` and ``min``."""

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            value = _check_type(f.name, value, hints[f.name], flag(f.name))
            setattr(self, f.name, value)
            if "choices" in f.metadata and value not in f.metadata["choices"]:
                raise ConfigError(f"{flag(f.name)}: got {value!r}, accepted: {', '.join(map(str, f.metadata['choices']))}")
            if "min" in f.metadata and value < f.metadata["min"]:
                raise ConfigError(f"{flag(f.name)}: got {value!r}, accepted: an integer >= {f.metadata['min']}")
            bounds = [(ok, sign, f.metadata[key]) for key, (ok, sign) in _BOUNDS.items() if key in f.metadata]
            if bounds and not (math.isfinite(value) and all(ok(value, bound) for ok, _, bound in bounds)):
                raise ConfigError(f"{flag(f.name)}: got {value!r}, accepted: a number "
                                  f"{' and '.join(f'{sign} {bound:g}' for _, sign, bound in bounds)}")
        if hasattr(self, "dtype"):  # weights this machine cannot hold, or a pair that means nothing: one line now
            check_dtype(self.dtype, getattr(self, "autocast", "auto"))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        """``cls`` from a dict of field values (a run's ``training_args.json``): a record, so the earlier field names
        it may hold (:data:`RENAMED`, which a user's options are refused under) are read as theirs."""
        known = {f.name for f in dataclasses.fields(cls)}
        d = canonical_options(cls, {(RENAMED[k] if k in RENAMED and k not in known else k): v for k, v in d.items()})
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown {cls.__name__} field(s) {unknown}; accepted: {sorted(known)}")
        return cls(**d)
