"""The plan of a run (mezo_rl.training.plan) and its fitness (mezo_rl.training.fitness): a run is resolved once,
by a pure function, into a frozen plan that both front doors build and nothing changes afterwards; a member's
loss is formed in one object, with one knob per idea."""
from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import make_tiny_causal_lm
from mezo_rl.errors import ConfigError
from mezo_rl.model.lm import LanguageModel
from mezo_rl.rewards import build_objective
from mezo_rl.tasks import Example, get_task
from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.training.defaults import MODE_DEFAULTS, PROMPT_TASK_DEFAULTS, mezo_options
from mezo_rl.training.fitness import Fitness, FitnessSpec
from mezo_rl.training.plan import RunPlan, plan_given, plan_run, run_config
from mezo_rl.training.resolve import resolve_values
from mezo_rl.training.trainer import MeZOTrainer


class PromptTask:
    """A task object whose kind only the object tells (as a code task or a dataset object does)."""

    kind, metrics, stop, name = "prompts", [], (), "code"

    def load_split(self, split, data_dir=None, n=None, seed=0):
        return [Example(prompt=f"say {w}", candidates=None, label=None, columns={}) for w in ("a", "b", "c", "d")]


def brevity(prompts, completions, **columns):
    return [-len(c) for c in completions]


def test_the_plan_is_frozen_printable_and_decided_once_from_the_task_it_was_given():
    args = MeZOConfig(task="my_tasks.py:build", output_dir="out")
    assert args.peft is None and args.max_steps is None  # left to the plan, which knows the task
    plan = plan_run(args, PromptTask(), build_objective([brevity]))
    # the task's kind decides the defaults the options left: a prompt task trains every weight, in its row
    assert (plan.args.peft, plan.args.max_steps) == ("full", PROMPT_TASK_DEFAULTS["full"]["max_steps"])
    assert plan.args.step_normalize == "std" and plan.task_kind == "prompts" and plan.metric_for_best == "objective"
    assert plan.greater_is_better and plan.reference and list(plan.rewards) == plan.args.reward  # recorded
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.args = args
    text = str(plan)
    assert "trains full" in text and "highest objective" in text and len(text.splitlines()) >= 6
    # nothing is planted on a configuration, and the old second resolve is gone
    for config in (args, plan.args):
        assert not {"_task_kind", "_task_metrics", "_metric_for_best"} & set(vars(config))
    assert not hasattr(MeZOConfig, "for_task") and not hasattr(MeZOConfig, "resolve")
    # a pure function: the same inputs give the same plan, and the input configuration is unchanged
    before = args.to_dict()
    assert plan_run(args, PromptTask(), build_objective([brevity])).args == plan.args
    assert args.to_dict() == before


def test_a_configuration_whose_values_are_resolved_already_is_resolved_to_itself():
    args = run_config(MeZOConfig(task="sst2"), get_task("sst2"))
    assert run_config(args, get_task("sst2")) == args
    values = {"task": "sst2", "num_train": 8}
    filled, sources = resolve_values(values, "classification", ["accuracy"])
    assert values == {"task": "sst2", "num_train": 8}  # not changed
    assert filled["reward"] == ["accuracy"] and filled["peft"] == "norm"
    assert (sources["num_train"], sources["reward"], sources["learning_rate"]) == ("user", "task default", "mode default")
    assert MeZOConfig(**filled).to_dict() == run_config(MeZOConfig(task="sst2", num_train=8), get_task("sst2")).to_dict()


def test_the_plan_refuses_in_one_line_what_needs_the_task_but_no_data():
    objective = build_objective(["accuracy"])
    with pytest.raises(ConfigError, match="--beta .* needs a prompt task"):
        plan_run(MeZOConfig(task="sst2", beta=0.1), get_task("sst2"), objective)
    with pytest.raises(ConfigError, match="--metric-for-best-model 'f1' is not an evaluation metric of task 'sst2'"):
        plan_run(MeZOConfig(task="sst2", metric_for_best_model="f1"), get_task("sst2"), objective)
    with pytest.raises(ConfigError, match="--reward: task 'my_tasks.py:build' has prompts only"):
        plan_given(MeZOConfig(task="my_tasks.py:build"), task=PromptTask())


def test_the_command_line_hands_its_plan_to_the_trainer(tmp_path, tiny_tokenizer, monkeypatch):
    from mezo_rl.cli import checks

    args = MeZOConfig(model="tiny", task="sst2", reward=["accuracy"], max_steps=2, eval_steps=1, learning_rate=1e-3,
                      autocast="none", progress=False, num_train=8, num_eval=4, num_test=4,
                      output_dir=str(tmp_path / "run"))
    plan = checks.check_training(args, model=False)
    assert isinstance(plan, RunPlan) and plan.args == run_config(args, get_task("sst2"))
    monkeypatch.setattr("mezo_rl.training.plan.plan_run", lambda *a, **k: pytest.fail("planned twice"))
    lm = LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)
    example = Example(prompt="it was", candidates=[" bad", " good"], label=1, columns={})
    trainer = MeZOTrainer(args=plan.args, plan=plan, lm=lm,
                          splits={"train": [example] * 8, "validation": [example] * 4, "test": [example] * 4})
    assert trainer.plan is plan and trainer.args is plan.args and trainer.objective is plan.objective
    assert trainer._optimizer is None  # MeZO is built on first use, once
    assert trainer.optimizer is trainer.optimizer
    # the mode's --step-normalize std is the fitness's: the trainer never sets the engine's step_normalize
    assert trainer.fitness.spec.step_normalize and trainer.optimizer.config["step_normalize"] is None


class Outcome:
    def __init__(self, rewards, kl=None):
        n = len(rewards)
        self.values = {"r": rewards}
        self.sums, self.sq_sums, self.counts = {"r": sum(rewards)}, {"r": sum(v * v for v in rewards)}, {"r": n}
        self.groups, self.kl = list(range(n)), kl


class OneProcess:
    def all_reduce_sum_dict(self, local, keys):
        return dict(local)


def test_one_fitness_forms_every_members_loss_and_normalises_the_step():
    from mezo_rl.rewards import RewardSpec
    from mezo_rl.rewards.objective import Objective

    objective = Objective([RewardSpec(name="r", fn=lambda **k: None, needs="generation")], [2.0])
    members = [Outcome([1.0, 0.0]), Outcome([0.0, 0.0])]
    plain = Fitness(FitnessSpec(), objective, OneProcess())
    losses, record = plain(members)
    assert losses == [-1.0, 0.0] and record["reward/r"] == 0.25  # minus the weighted mean reward
    shaped, _ = Fitness(FitnessSpec(reward_shaping="group"), objective, OneProcess())(members)
    assert shaped[0] < shaped[1]  # the member that did better on its prompt has the lower loss
    # the step's normaliser is the fitness's, with or without beta: one pair's losses -1 and 0 (sigma 1/2) become
    # their deviations from the midpoint times eps / sigma, so the engine's (l+ - l-) / (2 eps) is FZOO's
    # (l+ - l-) / (2 sigma); the record keeps the losses' means from before
    eps = 2.0 ** -10  # a power of two: every operation below is exact
    normalised, record = Fitness(FitnessSpec(step_normalize=True, eps=eps), objective, OneProcess())(members)
    assert normalised == [-eps, eps] and (normalised[0] - normalised[1]) / (2 * eps) == -1.0
    assert (record["loss"], record["loss_plus"], record["loss_minus"]) == (-0.5, -1.0, 0.0)
    args = run_config(MeZOConfig(task="arithmetic", beta=0.5), get_task("arithmetic"))
    assert args.step_normalize == "std" and FitnessSpec.of(args).step_normalize
    assert mezo_options(vars(args))["step_normalize"] == "std"  # the table's value, for a MeZO built by hand
    with pytest.raises(ConfigError, match="one member a step has no spread"):
        FitnessSpec(step_normalize=True, estimator="one_point")


@pytest.mark.parametrize("old, new, value", [("normalize", "step_normalize", "std"),
                                             ("reward_normalize", "reward_scale", "std"),
                                             ("evaluation", "member_evaluation", "batched")])
def test_old_knob_names_are_refused_naming_the_new(old, new, value, capsys, tmp_path):
    from mezo_rl.cli.main import main

    with pytest.raises(ConfigError, match=f"'{old}' \\(now '{new}'\\)"):
        MeZOConfig(**{old: value})
    (tmp_path / "c.json").write_text(json.dumps({old: value}))
    assert main(["train", "--config", str(tmp_path / "c.json")]) == 2
    assert f"now '{new}'" in capsys.readouterr().err
    flag, new_flag = "--" + old.replace("_", "-"), "--" + new.replace("_", "-")
    assert main(["train", flag, value]) == 2
    assert capsys.readouterr().err == f"mezo-rl: error: {flag} is now {new_flag} (see `mezo-rl train --help`)\n"
