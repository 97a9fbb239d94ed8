"""What a command checks before it loads any model or data, so a mistake costs a second, not a model load.

Order (``mezo-rl train``): the option values and their combinations (the argument dataclasses, on
construction); then the run's plan as ``MeZOTrainer`` builds it (``mezo_rl.training.plan.plan_given``:
the task, a registered name, ``module:function``, a data file or a dataset, with its options; the
rewards, names, ``module:function`` paths, entry points; every value for that task; whether the rewards fit
its kind; with ``--resume``, the run's directory, read once: a checkpoint of a run with the same
arguments), then :func:`check_run`: the data directory, the output directory (not a file; without
``--resume``, no unfinished run there), the model (found on disk or in the local cache, not loaded) and what
the run needs of it (generation rewards need a causal LM, chat prompts a chat template). Every failure is
a :class:`~mezo_rl.errors.UserError` with a one-line message naming the culprit and what is accepted.

Errors raised by a user's own task code while its data is read name the task and the split
(:func:`load_splits`); a user's reward that fails names the reward and the example
(``mezo_rl.rewards.objective.RewardError``).
"""
from __future__ import annotations

import os
import pathlib

from mezo_rl.errors import ConfigError
from mezo_rl.model.loading import check_model
from mezo_rl.training import rundir
from mezo_rl.training.outputs import ChatTemplateError
from mezo_rl.training.plan import plan_given, resolve_task, user_code
from mezo_rl.training.setup import TaskCodeError, load_splits
from mezo_rl.tasks import SPLITS
from mezo_rl.tasks.data import data_root

__all__ = ["TaskCodeError", "user_code", "resolve_task", "check_run",
           "check_output_dir", "check_output_path", "check_run_dir", "check_training", "load_splits"]


def check_data_dir(data_dir) -> None:
    if data_dir is not None:
        data_root(data_dir)  # TaskFileNotFoundError naming the directory


def check_output_dir(args) -> None:
    """``--output-dir`` is a directory or can be one (:func:`check_output_path`); with ``--resume`` it holds a
    checkpoint of this run (``mezo_rl.training.rundir.read_resumed``, which the plan of a resumed run calls)."""
    check_output_path(args)
    if args.resume:
        rundir.read_resumed(args.output_dir, args)  # no checkpoint, a damaged or unsafe file, other arguments: one line


def check_output_path(args) -> None:
    """``--output-dir`` is a directory or can be one; without ``--resume`` it holds no unfinished run (starting
    over would replace that run's checkpoint)."""
    out = pathlib.Path(args.output_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--output-dir {str(out)!r} is not a directory (a file is there); give a directory path")
    parent = next((p for p in out.absolute().parents if p.exists()), None)
    if not out.exists() and parent is not None and not (parent.is_dir() and os.access(parent, os.W_OK)):
        raise ConfigError(f"--output-dir {str(out)!r} cannot be created ({str(parent)!r} is not a writable directory)")
    if not (args.resume or args.overwrite_output_dir):
        unfinished = rundir.unfinished_step(out)
        if unfinished is not None:
            raise ConfigError(f"--output-dir {str(out)!r} holds an unfinished run (checkpoint at step {unfinished[0]} of "
                              f"{unfinished[1]}); add --resume to continue it, or --overwrite-output-dir to start over "
                              f"(its checkpoint and metrics are replaced)")


def check_run_dir(run_dir) -> pathlib.Path:
    """``run_dir`` holds a ``mezo-rl train`` run with a checkpoint (for eval --run-dir, export)."""
    run = pathlib.Path(run_dir)
    if not run.is_dir():
        raise ConfigError(f"run directory {str(run)!r} does not exist; give the --output-dir of a `mezo-rl train` run")
    missing = [f for f in (rundir.CONFIG_FILE, f"{rundir.CHECKPOINT_DIR}/{rundir.STATE_FILE}",
                           f"{rundir.CHECKPOINT_DIR}/{rundir.TRAJECTORY_FILE}") if not (run / f).is_file()]
    if missing:
        raise ConfigError(f"{str(run)!r} is not a mezo-rl run directory (missing {', '.join(missing)}); "
                          f"give the --output-dir of a `mezo-rl train` run")
    return run


def check_training(args, *, model: bool = True, output: bool = True):
    """Everything ``mezo-rl train`` checks before loading a model; returns the run's plan
    (``mezo_rl.training.plan.RunPlan``, built by ``plan_given`` as ``MeZOTrainer`` builds it), which the
    trainer then builds (``MeZOTrainer(args=plan.args, plan=plan)``).

    ``model=False`` skips the model check (a model object is given), ``output=False`` the output
    directory check (the caller writes elsewhere). The task's data is read only for data-file and
    dataset tasks (to check their columns); built-in tasks read theirs later.
    """
    plan, _, _ = plan_given(args)  # the task, the rewards, the configuration for that task: one line on a mistake
    check_run(plan, model, output)
    return plan


def check_run(plan, model: bool = True, output: bool = True) -> None:
    """What the plan's run needs, before anything loads: its data directory, its output directory (``output``:
    :func:`check_output_path`; a resumed run's directory is read and checked by the plan), its model (``model``:
    found on disk or in the local cache in the plan's dtype by :func:`~mezo_rl.model.loading.check_model`, no
    weights loaded), and what the run needs of the model where its files are at hand: generation rewards need a causal
    LM (its ``config.json``); a prompt task's prompts are well formed (reading every split checks each row) and,
    where they are chat messages, the tokenizer has a chat template. The task's kind is checked by the plan
    (``mezo_rl.training.plan.plan_run``), the rewards' dataset columns once the task's examples are read."""
    check_data_dir(plan.args.data_dir)
    if output:
        check_output_path(plan.args)
    model = check_model(plan.args.model, plan.dtype) if model else None
    archs = model.architectures() if model is not None else None
    if archs is not None:
        plan.objective.check_compatible(not any(a.endswith("ForMaskedLM") for a in archs))
    if plan.task_kind != "prompts":
        return
    chat = any(ex.messages is not None for split in SPLITS for ex in plan.task.examples(split))
    if chat and model is not None and model.has_chat_template() is False:
        raise ChatTemplateError(f"the prompts are chat messages but model {model.name!r} has no chat template; use a chat "
                                f"(instruct) model, or give the prompts as plain text")
