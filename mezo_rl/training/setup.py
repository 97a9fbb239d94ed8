"""Building what a run's plan says, each thing once: the task's examples, the model with what it trains,
the optimizer.

What a run is, is decided once, by :mod:`mezo_rl.training.plan` (the task, the objective, the configuration);
the examples, the model and the optimizer are then built here from the plan. ``mezo-rl`` plans while it
checks a command (before any model loads) and hands the plan to the trainer.

- :func:`build_run`: what a plan says, in order, each once: the examples, the model, the starting point, the
  fitness.
- :func:`load_splits` / :func:`run_splits`: the task's train / validation / test examples; a user's task
  code that raises is named in one line.
- :func:`build_model`: the base model, set up for what ``--peft`` trains
  (:func:`mezo_rl.model.peft.set_trainable`); :func:`param_groups` and :func:`trainable_parameters`: the
  order the engine and replay see the trainable tensors in.
- :func:`build_optimizer`: MeZO over those tensors with the run's options, and its lr schedule.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from mezo_rl.engine.optim import MeZO
from mezo_rl import tasks
from mezo_rl.errors import ConfigError, UserError, first_line
from mezo_rl.model.loading import load_model
from mezo_rl.model.peft import set_trainable
from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.training.defaults import mezo_options
from mezo_rl.training.distributed import DistContext
from mezo_rl.training.fitness import Fitness
from mezo_rl.training.kl import starting_point
from mezo_rl.training.member_evaluation import member_evaluation_options
from mezo_rl.training.outputs import truncate_prompts

__all__ = ["build_run", "TaskCodeError", "load_splits", "run_splits", "build_model", "param_groups", "trainable_parameters",
           "build_optimizer", "lr_scheduler"]


def build_run(plan, lm=None, splits=None, dist=None) -> tuple:
    """What ``plan`` (a :class:`~mezo_rl.training.plan.RunPlan`) says to build, in order, each once; returns
    ``(splits, lm, start, fitness)``:

    - the task's examples (``splits``: given), checked, and against the columns the rewards read, before any
      model loads;
    - the model (``lm``: the base model, given), set up for what the run trains (:func:`build_model`), checked
      against the rewards (generation rewards need a causal LM);
    - the prompts cut to ``max_prompt_length`` tokens, as the model reads them;
    - the starting point a prompt task keeps (the reference of ``kl`` and ``beta``), or None;
    - the run's fitness: how a member's loss is formed, its statistics all-reduced over ``dist``
      (a :class:`~mezo_rl.training.distributed.DistContext`; None: this process alone).

    The weights get the plan's dtype (``--dtype auto`` decided; a resumed run's, which auto keeps) and its
    per-device memory caps (``max_memory``, parsed).
    """
    args, objective = plan.args, plan.objective
    splits = run_splits(args, plan.task, splits)
    objective.check_examples(splits["train"], task_kind=plan.task_kind)
    lm = build_model(args, lm, plan.dtype, max_memory=plan.max_memory)
    objective.check_compatible(bool(lm.is_causal))
    splits = truncate_prompts(splits, lm, args.max_prompt_length)
    return splits, lm, starting_point(lm, plan.reference), Fitness(plan.fitness, objective, dist or DistContext())


# ---------------------------------------------------------------------- the task and its examples
class TaskCodeError(UserError):
    """A user's task code raised while its examples were read."""


def _is_user_code(task) -> bool:
    """Whether ``task`` is a user's: its class is defined outside the built-in tasks' package."""
    return not type(task).__module__.startswith(tasks.__name__ + ".")


def load_splits(task, task_ref: str, sizes: dict, data_dir, seed: int) -> dict:
    """``task.load_split`` for each split; a user's task code that raises becomes a
    :class:`TaskCodeError` naming the task and the split (``--debug`` shows the traceback)."""
    out = {}
    for split, n in sizes.items():
        try:
            out[split] = task.load_split(split, data_dir=data_dir, n=n, seed=seed)
        except UserError:
            raise
        except Exception as e:
            if not _is_user_code(task):
                raise
            raise TaskCodeError(f"task {task_ref!r} raised {type(e).__name__}: {first_line(e)} while reading its "
                                f"{split!r} examples") from e
    return out


def run_splits(args: MeZOConfig, task, splits=None) -> dict:
    """``task``'s train / validation / test examples as the run samples them (or ``splits``, given), checked."""
    if splits is None:
        sizes = {"train": args.num_train, "validation": args.num_eval, "test": args.num_test}
        splits = load_splits(task, args.task, sizes, args.data_dir, args.seed)
    for split in ("train", "validation", "test"):
        if split not in splits:
            raise ValueError(f"splits must hold 'train', 'validation' and 'test'; missing {split!r}")
    if not splits["train"]:
        raise ConfigError(f"task {args.task!r}: the train split is empty")
    return splits


# ---------------------------------------------------------------------- the model and its trainable tensors
def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """The trainable parameters (``requires_grad``), in ``named_parameters`` order, as param groups.

    Weight decay applies to matrices only: biases and norm weights (1-D tensors) are exempt.
    """
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    if not decay and not no_decay:
        raise ValueError("the model has no trainable parameters (every parameter has requires_grad=False)")
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": weight_decay})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def trainable_parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    """The order the engine (and replay) sees the parameters in: groups as built by :func:`param_groups`."""
    return [p for g in param_groups(model, 0.0) for p in g["params"]]


def build_model(args: MeZOConfig, lm=None, dtype: Optional[str] = None, *, max_memory: Optional[dict] = None):
    """Load the base model (unless ``lm`` is given) in ``dtype``, the weights' dtype with ``--dtype auto``
    decided (a plan's ``RunPlan.dtype``, or :func:`mezo_rl.choices.weights_dtype`; None: ``args.dtype``,
    which is then not ``auto``), within ``max_memory``, the per-device caps ``args.max_memory`` gives (a plan's
    ``RunPlan.max_memory``, or :func:`mezo_rl.choices.parse_max_memory`), and set it up for what ``args.peft`` trains
    (:func:`mezo_rl.model.peft.set_trainable`: the final norm with its trunk cache, an adapter, or every
    weight; then ``args.trainable``'s pattern; a trainable weight offloaded by the device map is refused)."""
    if lm is None:
        remote = {"trust_remote_code": True} if args.trust_remote_code else {}
        lm = load_model(args.model, dtype=dtype or args.dtype, device_map=args.device_map,
                        max_memory=max_memory, batch_size=args.eval_batch_size, **remote)
    return set_trainable(lm, args.peft, trainable=args.trainable, modules_to_save=args.lora_modules_to_save,
                         r=args.lora_r, alpha=args.lora_alpha, target_modules=args.lora_target_modules,
                         dropout=args.lora_dropout, num_prefix_tokens=args.num_prefix_tokens, seed=args.seed)


# ---------------------------------------------------------------------- the optimizer
def build_optimizer(args: MeZOConfig, lm, needs, train=(), recorded: Optional[str] = None) -> tuple:
    """MeZO over ``lm``'s trainable tensors with the run's options (every value resolved in ``args``), and
    its lr schedule. ``needs``: what the objective asks of the model; with ``train``, the training
    examples, ``--member-evaluation auto`` also weighs their prompts' length; ``recorded``: the mode a resumed
    run's checkpoint ran with, which it keeps. The engine's own ``step_normalize`` stays off: ``--step-normalize``
    is the fitness's (``mezo_rl.training.fitness.step_normalised``)."""
    options = {**mezo_options(vars(args)), "step_normalize": None}
    optimizer = MeZO(param_groups(lm.model, options["weight_decay"]), **options, rank=args.rank,
                     lowrank_interval=args.lowrank_interval, estimator=args.estimator, momentum=args.momentum,
                     adam=args.adam, hessian_smooth=args.hessian_smooth, seed=args.seed, on_nonfinite=args.on_nonfinite,
                     rounding=args.rounding,
                     **member_evaluation_options(args, needs, lm, train, recorded))
    return optimizer, lr_scheduler(args, optimizer)


def lr_scheduler(args: MeZOConfig, optimizer):
    """``args.lr_scheduler_type`` over ``args.max_steps`` steps with ``args.warmup_steps`` of warmup (a fraction of
    the run when < 1), built by ``transformers.get_scheduler``, as a ``Trainer`` builds it. The trajectory
    records the lr of every step, so a replay needs no scheduler."""
    from transformers import get_scheduler

    total = max(args.max_steps, 1)
    warmup = math.ceil(args.warmup_steps * total) if args.warmup_steps < 1 else int(args.warmup_steps)
    return get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=warmup, num_training_steps=total)
