"""Argument dataclasses: every option declared once, checked from its declared choices and minimum."""
from __future__ import annotations

import dataclasses

import pytest

from mezo_rl.arguments import (BaselineArguments, EvalRunArguments, TrainingArguments, parse_step)
from mezo_rl.errors import ConfigError
from mezo_rl.peft import PEFT_DEFAULTS


def _fields(cls) -> dict:
    return {f.name: f for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("cls", [TrainingArguments, BaselineArguments, EvalRunArguments])
def test_every_declared_choice_and_minimum_is_checked(cls):
    for f in dataclasses.fields(cls):
        if "choices" in f.metadata:
            with pytest.raises(ValueError, match=f"{cls.__name__}.{f.name}: got 'bogus', accepted: "
                                                 + ", ".join(f.metadata["choices"])):
                cls(**{f.name: "bogus"})
            for choice in f.metadata["choices"]:
                assert getattr(cls(**{f.name: choice}), f.name) == choice
        if "min" in f.metadata:
            with pytest.raises(ValueError, match=f"{cls.__name__}.{f.name}: expected a positive integer"):
                cls(**{f.name: f.metadata["min"] - 1})
            assert getattr(cls(**{f.name: f.metadata["min"]}), f.name) == f.metadata["min"]


def test_argument_errors_are_config_errors():
    with pytest.raises(ConfigError):
        TrainingArguments(noise="uniform")
    with pytest.raises(ConfigError, match="--max-memory"):
        TrainingArguments(max_memory="0=20GiB,oops")


@pytest.mark.parametrize("cls, names", [
    (BaselineArguments, {n: n for n in ("model", "task", "data_dir", "num_train", "num_test", "seed", "dtype",
                                        "eval_batch_size", "max_new_tokens")}),
    (EvalRunArguments, {"model": "model", "seed": "seed", "data_dir": "data_dir", "dtype": "dtype",
                        "batch_size": "eval_batch_size", "max_new_tokens": "max_new_tokens"}),
])
def test_other_commands_share_the_training_options_defaults(cls, names):
    train, mine = _fields(TrainingArguments), _fields(cls)
    for name, train_name in names.items():
        assert mine[name].default == train[train_name].default, name
        assert mine[name].metadata.get("choices") == train[train_name].metadata.get("choices"), name


def test_learning_rate_defaults_live_in_peft_defaults():
    for peft, mode in (("none", "full"), ("lora", "lora"), ("prefix", "prefix")):
        assert TrainingArguments(peft=peft).hyperparameters() == PEFT_DEFAULTS[mode]
    assert TrainingArguments(lr=1e-3).hyperparameters()["lr"] == 1e-3


def test_step_references():
    assert [parse_step(s) for s in ("best", "final", "7", 3)] == ["best", "final", 7, 3]
    with pytest.raises(ValueError, match="best, final or a step number"):
        parse_step("last")
