"""Argument dataclasses: every option declared once, checked from its declared choices and minimum."""
from __future__ import annotations

import dataclasses

import pytest

from mezo_rl.arguments import (RUN_LENGTH, BaselineArguments, EvalRunArguments, TrainingArguments, parse_step)
from mezo_rl.errors import ConfigError
from mezo_rl.peft import PEFT_DEFAULTS


def _fields(cls) -> dict:
    return {f.name: f for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("cls", [TrainingArguments, BaselineArguments, EvalRunArguments])
def test_every_declared_choice_minimum_and_bound_is_checked(cls):
    for f in dataclasses.fields(cls):
        opt = "--" + f.name.replace("_", "-")  # the message names the option as the user typed it
        if "choices" in f.metadata:
            with pytest.raises(ValueError, match=f"{opt}: got 'bogus', accepted: " + ", ".join(f.metadata["choices"])):
                cls(**{f.name: "bogus"})
            for choice in f.metadata["choices"]:
                assert getattr(cls(**{f.name: choice}), f.name) == choice
        if "min" in f.metadata:
            with pytest.raises(ValueError, match=f"{opt}: got {f.metadata['min'] - 1}, accepted: an integer >= "):
                cls(**{f.name: f.metadata["min"] - 1})
            assert getattr(cls(**{f.name: f.metadata["min"]}), f.name) == f.metadata["min"]
        for key, outside, inside in (("gt", 0.0, 1e-9), ("ge", -1e-9, 0.0), ("lt", 0.0, -1e-9)):
            if key in f.metadata:
                bound = f.metadata[key]
                with pytest.raises(ConfigError, match=f"{opt}: got .*, accepted: a number"):
                    cls(**{f.name: bound + outside})
                assert getattr(cls(**{f.name: bound + inside}), f.name) == bound + inside
                with pytest.raises(ConfigError, match=f"{opt}: got nan"):
                    cls(**{f.name: float("nan")})


def test_the_issue_bad_values_and_combinations_are_refused():
    for kwargs, message in ((dict(eps=0), "--eps: got 0.0, accepted: a number > 0"),
                            (dict(lr=-1), "--lr: got -1.0, accepted: a number >= 0"),
                            (dict(reward_normalize="minmax"), "--reward-normalize: got 'minmax', accepted: std"),
                            (dict(max_new_tokens=0), "--max-new-tokens: got 0, accepted: an integer >= 1"),
                            (dict(do_sample=True, temperature=0.0), "--do-sample needs --temperature > 0"),
                            (dict(eps="1e-3"), r"--eps: got '1e-3' \(str\), expected a number"),  # a quoted YAML value
                            (dict(steps=True), r"--steps: got True \(bool\), expected an integer"),
                            (dict(reward=["accuracy"], reward_weights=[1, 2]), "--reward-weights: got 2 weights for 1 rewards")):
        with pytest.raises(ConfigError, match=message):
            TrainingArguments(**kwargs)
    assert TrainingArguments(temperature=0.0).temperature == 0.0  # unused without --do-sample
    assert TrainingArguments(lr=1, reward_weights=[2]).lr == 1.0 and TrainingArguments(reward_weights=[2]).reward_weights == [2.0]


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


def test_run_length_defaults_depend_on_the_mode_and_explicit_values_win():
    norm, full = TrainingArguments(), TrainingArguments(peft="none")
    assert (norm.steps, norm.batch_size) == (RUN_LENGTH["norm"]["steps"], RUN_LENGTH["norm"]["batch_size"])
    assert (full.steps, full.batch_size) == (RUN_LENGTH["other"]["steps"], RUN_LENGTH["other"]["batch_size"])
    assert norm.hyperparameters()["n_spsa"] == PEFT_DEFAULTS["norm"]["n_spsa"]
    mine = TrainingArguments(steps=7, batch_size=3, n_spsa=5)
    assert (mine.steps, mine.batch_size, mine.hyperparameters()["n_spsa"]) == (7, 3, 5)
    assert TrainingArguments(**mine.to_dict()).to_dict() == mine.to_dict()  # config.json round-trips
    # a variant in another mode takes that mode's run length, unless the run length was given
    prefix = norm.replace(peft="prefix")
    assert (prefix.steps, prefix.batch_size) == (RUN_LENGTH["other"]["steps"], RUN_LENGTH["other"]["batch_size"])
    assert mine.replace(peft="prefix").steps == 7
    assert norm.replace(steps=9).steps == 9


def test_step_references():
    assert [parse_step(s) for s in ("best", "final", "7", 3)] == ["best", "final", 7, 3]
    with pytest.raises(ValueError, match="best, final or a step number"):
        parse_step("last")
