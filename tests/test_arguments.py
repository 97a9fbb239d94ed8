"""Argument dataclasses: every option declared once, checked from its declared choices and minimum."""
from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from mezo_rl.training.arguments import BaselineArguments, EvalRunArguments, MeZOConfig, parse_step
from mezo_rl.training.fields import flag
from mezo_rl.training.defaults import (MODE_DEFAULTS, MODES, PROMPT_TASK_DEFAULTS, PROMPT_TASK_MODE,
                                       mezo_options)
from mezo_rl.errors import ConfigError
from mezo_rl.training.resolve import resolve_values


def resolved(args: MeZOConfig, kind="classification", metrics=("accuracy",)) -> MeZOConfig:
    """``args`` with every value it left unset decided by the plan's resolver, for a task of ``kind``."""
    return MeZOConfig(**resolve_values(dataclasses.asdict(args), kind, list(metrics) if metrics else None)[0])


def _fields(cls) -> dict:
    return {f.name: f for f in dataclasses.fields(cls)}


#: options whose values in bounds need another option beside them (HiZOO: the noise of --peft full)
COMPANIONS = {"hessian_smooth": dict(peft="full"), "top_p": dict(do_sample=True), "lora_dropout": dict(peft="lora")}


@pytest.mark.parametrize("cls", [MeZOConfig, BaselineArguments, EvalRunArguments])
def test_every_declared_choice_minimum_and_bound_is_checked(cls):
    for f in dataclasses.fields(cls):
        with_companion = functools.partial(cls, **COMPANIONS.get(f.name, {}))
        opt = flag(f.name)  # the message names the option as the user types it: --max-steps
        if "choices" in f.metadata:
            with pytest.raises(ValueError, match=f"{opt}: got 'bogus', accepted: " + ", ".join(f.metadata["choices"])):
                cls(**{f.name: "bogus"})
            for choice in f.metadata["choices"]:
                if (f.name, choice) == ("dtype", "float16") and not torch.cuda.is_available():
                    with pytest.raises(ConfigError, match="^--dtype float16 needs a CUDA device"):
                        cls(**{f.name: choice})
                    continue
                assert getattr(cls(**{f.name: choice}), f.name) == choice
        if "min" in f.metadata and (f.name, f.metadata["min"] - 1) != ("max_steps", -1):  # -1: transformers' "unset"
            with pytest.raises(ValueError, match=f"{opt}: got {f.metadata['min'] - 1}, accepted: an integer >= "):
                cls(**{f.name: f.metadata["min"] - 1})
            assert getattr(cls(**{f.name: f.metadata["min"]}), f.name) == f.metadata["min"]
        for key, outside, inside in (("gt", 0.0, 1e-9), ("ge", -1e-9, 0.0), ("lt", 0.0, -1e-9)):
            if key in f.metadata:
                bound = f.metadata[key]
                with pytest.raises(ConfigError, match=f"{opt}: got .*, accepted: a number"):
                    cls(**{f.name: bound + outside})
                assert getattr(with_companion(**{f.name: bound + inside}), f.name) == bound + inside
                with pytest.raises(ConfigError, match=f"{opt}: got nan"):
                    cls(**{f.name: float("nan")})


def test_the_issue_bad_values_and_combinations_are_refused():
    for kwargs, message in ((dict(eps=0), "--eps: got 0.0, accepted: a number > 0"),
                            (dict(learning_rate=-1), "--learning-rate: got -1.0, accepted: a number >= 0"),
                            (dict(reward_scale="minmax"), "--reward-scale: got 'minmax', accepted: std"),
                            (dict(max_completion_length=0), "--max-completion-length: got 0, accepted: an integer >= 1"),
                            (dict(do_sample=True, temperature=0.0), "--do-sample needs --temperature > 0"),
                            (dict(eps="1e-3"), r"--eps: got '1e-3' \(str\), expected a number"),  # a quoted YAML value
                            (dict(max_steps=True), r"--max-steps: got True \(bool\), expected an integer"),
                            (dict(reward=["accuracy"], reward_weights=[1, 2]), "--reward-weights: got 2 weights for 1 rewards")):
        with pytest.raises(ConfigError, match=message):
            MeZOConfig(**kwargs)
    assert MeZOConfig(temperature=0.0).temperature == 0.0  # unused without --do-sample
    assert MeZOConfig(learning_rate=1, reward_weights=[2]).learning_rate == 1.0 and MeZOConfig(reward_weights=[2]).reward_weights == [2.0]


def test_argument_errors_are_config_errors():
    with pytest.raises(ConfigError):
        MeZOConfig(noise="uniform")
    with pytest.raises(ConfigError, match="--max-memory"):
        MeZOConfig(max_memory="0=20GiB,oops")


@pytest.mark.parametrize("cls, names", [
    (BaselineArguments, {**{n: n for n in ("model", "task", "data_dir", "num_train", "num_test", "seed", "dtype",
                                           "eval_batch_size", "max_completion_length")}}),
    (EvalRunArguments, {"model": "model", "seed": "seed", "data_dir": "data_dir", "dtype": "dtype",
                        "eval_batch_size": "eval_batch_size"}),
])
def test_other_commands_share_the_training_options_defaults(cls, names):
    train, mine = _fields(MeZOConfig), _fields(cls)
    for name, train_name in names.items():
        assert mine[name].default == train[train_name].default, name
        assert mine[name].metadata.get("choices") == train[train_name].metadata.get("choices"), name
    # eval's completion length follows the run it evaluates (--run-dir), so it has no default of its own
    assert EvalRunArguments().max_completion_length is None


def test_per_mode_defaults_are_resolved_once_and_explicit_values_win():
    for mode in MODES:
        args = resolved(MeZOConfig(peft=mode))
        assert {k: getattr(args, k) for k in MODE_DEFAULTS[mode]} == MODE_DEFAULTS[mode]
        assert mezo_options(vars(args)) == mezo_options(MODE_DEFAULTS[mode])
        assert args.eval_steps == max(1, args.max_steps // 5)
    with pytest.raises(ConfigError, match="--peft: got 'none', accepted: norm, full, lora, prefix"):
        MeZOConfig(peft="none")  # one name per mode: full
    mine = resolved(MeZOConfig(max_steps=7, per_device_train_batch_size=3, n_spsa=5, learning_rate=1e-3, step_normalize="none"))
    assert (mine.max_steps, mine.per_device_train_batch_size, mine.n_spsa, mine.learning_rate, mine.eval_steps) == (7, 3, 5, 1e-3, 1)
    assert mezo_options(vars(mine))["step_normalize"] is None  # as MeZO takes it
    # what config.json records: no option left to a default that a later version could change
    assert None not in [mine.to_dict()[k] for k in (*MODE_DEFAULTS["norm"], "eval_steps")]
    assert MeZOConfig.from_dict(mine.to_dict()).to_dict() == mine.to_dict()
    # the values norm resolved stay with dataclasses.replace; a variant built from the given options gets its mode's
    assert dataclasses.replace(mine, peft="prefix").learning_rate == 1e-3
    assert resolved(MeZOConfig(peft="prefix", max_steps=7)).learning_rate == MODE_DEFAULTS["prefix"]["learning_rate"]
    assert MeZOConfig(peft="prefix").learning_rate is None  # the configuration holds what it was given


@pytest.mark.parametrize("task", [dict(task="prompts.jsonl"), dict(task="prompts.csv", prompt_column="question"),
                                  dict(task="rows.jsonl", template="Continue: {text}"),
                                  dict(task="user/prompt-dataset", prompt_column="messages")])
def test_a_prompt_file_or_dataset_takes_the_prompt_task_run_length(task):
    """A prompt task decodes every prompt per member: it trains PROMPT_TASK_MODE by default, with that mode's
    prompt-task row (not the scoring tasks' run length); every mode normalises the step (a reward on any
    scale); the other task kinds and explicit values are untouched (nothing is read to decide)."""
    args = resolved(MeZOConfig(**task), "prompts", None)
    assert args.peft == PROMPT_TASK_MODE
    expected = {**MODE_DEFAULTS[PROMPT_TASK_MODE], **PROMPT_TASK_DEFAULTS[PROMPT_TASK_MODE]}
    assert {k: getattr(args, k) for k in expected} == expected
    assert args.max_steps < MODE_DEFAULTS["norm"]["max_steps"] and args.eval_steps == max(1, args.max_steps // 5)
    norm = resolved(MeZOConfig(**task, peft="norm"), "prompts", None)  # the sentiment example's row
    assert {k: getattr(norm, k) for k in MODE_DEFAULTS["norm"]} == {
        **MODE_DEFAULTS["norm"], **PROMPT_TASK_DEFAULTS["norm"]}
    assert resolved(MeZOConfig(**task, max_steps=7, learning_rate=1e-3), "prompts", None).to_dict() | {
        "max_steps": args.max_steps, "learning_rate": args.learning_rate, "eval_steps": args.eval_steps} == args.to_dict()
    lora = resolved(MeZOConfig(**task, peft="lora"), "prompts", None)
    assert {k: getattr(lora, k) for k in MODE_DEFAULTS["lora"]} == {
        **MODE_DEFAULTS["lora"], **PROMPT_TASK_DEFAULTS["lora"]} and lora.step_normalize == "std"
    # config.json holds the resolved values: a resume or --config repeats them whatever the table later says
    assert MeZOConfig.from_dict(args.to_dict()).to_dict() == args.to_dict()


@pytest.mark.parametrize("task, kind", [(dict(task="sst2"), "classification"),
                                        (dict(task="rows.jsonl", template="{q}", target_column="a"), "generation"),
                                        (dict(task="rows.csv", template="{s} It was", label_column="l",
                                              candidates=["bad", "good"]), "classification"),
                                        (dict(task="my_tasks.py:build"), None)])
def test_scoring_generation_and_code_tasks_keep_the_mode_row(task, kind):
    args = resolved(MeZOConfig(**task), kind)
    assert args.peft == "norm"
    assert {k: getattr(args, k) for k in MODE_DEFAULTS["norm"]} == MODE_DEFAULTS["norm"]


def test_an_old_config_with_nulls_resolves_to_the_defaults():
    old = {**MeZOConfig().to_dict(), "peft": "full", "learning_rate": None, "eps": None, "noise": None,
           "step_normalize": None, "n_spsa": None, "weight_decay": None, "max_steps": None, "per_device_train_batch_size": None,
           "eval_steps": None}
    assert resolved(MeZOConfig.from_dict(old)).to_dict() == resolved(MeZOConfig(peft="full")).to_dict()


def test_step_references():
    assert [parse_step(s) for s in ("best", "final", "7", 3)] == ["best", "final", 7, 3]
    with pytest.raises(ValueError, match="best, final or a step number"):
        parse_step("last")


@pytest.mark.parametrize("task, reward", [("sst2", "accuracy"), ("copa", "accuracy"), ("squad", "squad_f1"),
                                          ("arithmetic", "exact_answer"), ("countdown", "countdown")])
def test_the_reward_defaults_to_the_task_own_metric(task, reward):
    """`mezo-rl train --task arithmetic` optimises exact_answer, as `--task sst2` optimises accuracy: a given
    --reward wins, and config.json records the resolved one (a resume or --config repeats it)."""
    from mezo_rl.tasks import get_task
    from mezo_rl.training.plan import run_config

    args = run_config(MeZOConfig(task=task), get_task(task))
    assert args.reward == [reward] and MeZOConfig(task=task).reward is None
    assert MeZOConfig.from_dict(args.to_dict()).reward == [reward]
    assert run_config(MeZOConfig(task=task, reward=["cross_entropy"]), get_task(task)).reward == ["cross_entropy"]
    assert MeZOConfig(task=task, reward_weights=[2]).reward_weights == [2.0]
    # weights of another count are for a trainer's reward_funcs: the plan checks them against the rewards it has,
    # here the task's own, in one line before any model loads
    from mezo_rl.training.plan import plan_given
    with pytest.raises(ConfigError, match=rf"--reward-weights: got 2 weights for 1 rewards \['{reward}'\]"):
        plan_given(MeZOConfig(task=task, reward_weights=[1, 2]))


def test_a_task_of_prompts_only_needs_a_reward_and_a_code_task_takes_its_metric_once_built():
    from mezo_rl.training.plan import reward_refs, run_config
    from mezo_rl.tasks import get_task

    prompts = MeZOConfig(task="prompts.jsonl")  # a config without a reward is fine: reward_funcs may come later
    assert prompts.reward is None
    with pytest.raises(ConfigError, match="--reward: task 'prompts.jsonl' has prompts only.*mezo-rl rewards"):
        reward_refs(prompts.reward, None, prompts.task)
    code = MeZOConfig(task="my_tasks.py:build")
    assert code.reward is None
    assert run_config(code, get_task("arithmetic")).reward == ["exact_answer"]
    assert run_config(code, get_task("sst2")).reward == ["accuracy"]
    assert run_config(MeZOConfig(task="my_tasks.py:build", reward=["positivity"]), get_task("sst2")).reward == ["positivity"]


def test_an_objective_given_as_an_object_is_what_the_configuration_records():
    """MeZOTrainer(args=args, task=..., objective=...) with --reward left to its default: config.json names the rewards
    the run optimised (their weights and normalisation), not the task's metric."""
    from mezo_rl.rewards import build_objective
    from mezo_rl.tasks import get_task
    from mezo_rl.training.plan import run_config

    objective = build_objective(["cross_entropy", "accuracy"], weights=[1.0, 0.5], reward_scale="std")
    args = run_config(MeZOConfig(task="sst2"), get_task("sst2"), objective)
    assert (args.reward, args.reward_weights, args.reward_scale) == (["cross_entropy", "accuracy"], [1.0, 0.5], "std")
    given = run_config(MeZOConfig(task="sst2", reward=["accuracy"]), get_task("sst2"), objective)
    assert given.reward == ["accuracy"]  # a reward the user named stays as named
