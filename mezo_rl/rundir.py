"""The run directory: where a run lives, its checkpoint, and rebuilding its weights.

::

    config.json          the resolved TrainingArguments
    metrics.jsonl        one JSON object per logged step and per evaluation
    summary.json         initial_validation, validation (best step), test, best_step, wall_time_s, metrics
    checkpoint/          model.json (base model identity + PEFT config), trajectory.npz,
                         optimizer.pt (optimizer + scheduler state), trainer_state.json (TrainerState)
    samples/             prompt tasks: <split>-step<N>.jsonl, the first completions of each evaluation
    model/               full weights (save_pretrained), only with ``save_model=True``
    tensorboard/         only with ``tensorboard=True``

The checkpoint is tiny (a few bytes per step): the base model plus the step log is enough to
rebuild the weights bit for bit (:func:`mezo_rl.optim.replay_trajectory`). Here: the files'
names, :class:`TrainerState`, writing and reading the checkpoint, :func:`build_model` (base model +
adapter from the arguments), :func:`load_run` and :func:`save_model` (used by ``--save-model`` and
``mezo-rl export``).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import re
import shutil
from dataclasses import dataclass
from importlib.metadata import version
from typing import Optional

import numpy as np
import torch

from mezo_rl.arguments import TrainingArguments, parse_max_memory, parse_step
from mezo_rl.distributed import check_no_offload
from mezo_rl.errors import ConfigError
from mezo_rl.models import load_model
from mezo_rl.peft import FINAL_NORM, PEFT_METHODS, apply_peft, export_model, peft_config
from mezo_rl.optim import replay_trajectory
from mezo_rl.trajectory import Trajectory

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CHECKPOINT_DIR = "checkpoint"
TRAJECTORY_FILE = "trajectory.npz"
MODEL_FILE = "model.json"
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
SAMPLES_DIR = "samples"


@dataclass
class TrainerState:
    """What the Trainer knows beyond the weights, saved as ``checkpoint/trainer_state.json`` with
    :func:`dataclasses.asdict` (one new field: one line here)."""

    step: int = 0
    best_step: int = 0
    best_value: Optional[float] = None
    best_validation: Optional[dict] = None
    initial_validation: Optional[dict] = None
    initial_test: Optional[dict] = None
    last_validation: Optional[dict] = None
    wall_time_s: float = 0.0  # up to the last save
    last_eval_step: Optional[int] = None  # the step of the last validation (None in checkpoints older than it)
    objective: Optional[dict] = None  # Objective.state_dict(): the frozen normalisation scales

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TrainerState":
        return cls(**json.loads(pathlib.Path(path).read_text()))

    def save(self, path: str | os.PathLike) -> None:
        write_json(pathlib.Path(path), dataclasses.asdict(self))


# ---------------------------------------------------------------------- JSON
def json_safe(obj):
    """``obj`` with non-finite floats as None and tensors / numpy scalars as plain numbers."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return json_safe(obj.item() if obj.numel() == 1 else obj.tolist())
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    return obj


def write_json(path: pathlib.Path, obj) -> None:
    """Write ``obj`` atomically (a temporary file renamed over ``path``)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(json_safe(obj), indent=2) + "\n")
    os.replace(tmp, path)


def append_jsonl(path: pathlib.Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(json_safe(record)) + "\n")


def read_args(run_dir: str | os.PathLike) -> TrainingArguments:
    config = pathlib.Path(run_dir) / CONFIG_FILE
    if not config.is_file():
        raise ConfigError(f"{str(run_dir)!r} is not a mezo-rl run directory (no {CONFIG_FILE}); "
                          f"give the --output-dir of a `mezo-rl train` run")
    return TrainingArguments.from_dict(json.loads(config.read_text()))


# ---------------------------------------------------------------------- parameters and the model
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


def build_model(args: TrainingArguments, lm=None):
    """Load the base model (unless ``lm`` is given) and apply the PEFT adapter the arguments ask for."""
    if lm is None:
        lm = load_model(args.model, dtype=args.dtype, device_map=args.device_map,
                        max_memory=parse_max_memory(args.max_memory))
        if args.device_map is not None:
            check_no_offload(lm.model)  # weights offloaded to disk cannot be perturbed in place
    if args.peft == "norm":
        freeze_unmatched(lm.model, FINAL_NORM, what="--peft norm (the final normalisation layer)")
    elif args.peft != "none":
        lm = apply_peft(lm, args.peft, r=args.lora_r, alpha=args.lora_alpha,
                        num_prefix_tokens=args.num_prefix_tokens, seed=args.seed)
    if args.trainable is not None:
        freeze_unmatched(lm.model, args.trainable, what=f"--trainable {args.trainable!r}")
    # with the trunk frozen (--peft norm) each scored sequence runs through it once; used only while
    # every trunk weight is frozen, so the other modes are unaffected (LanguageModel.enable_trunk_cache)
    lm.enable_trunk_cache()
    return lm


def freeze_unmatched(model: torch.nn.Module, pattern: str, what: str) -> None:
    """Freeze every trainable parameter whose name does not match ``pattern`` (``re.search``).

    Deterministic in (model, pattern), so a replay rebuilds the same trainable set in the same order.
    """
    regex = re.compile(pattern)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not any(regex.search(n) for n, _ in trainable):
        names = ", ".join(n for n, _ in trainable[:4])
        raise ConfigError(f"{what}: {pattern!r} matches no trainable parameter; names look like: {names}, ...")
    for n, p in trainable:
        if not regex.search(n):
            p.requires_grad_(False)


def model_identity(args: TrainingArguments, lm) -> dict:
    """What the checkpoint needs besides the trajectory: the base model and the adapter."""
    return {"model": args.model, "dtype": args.dtype, "peft": peft_config(lm) if args.peft in PEFT_METHODS else None,
            "parameters": sum(p.numel() for p in trainable_parameters(lm.model)),
            "transformers": version("transformers"), "torch": torch.__version__}


# ---------------------------------------------------------------------- checkpoint
def checkpoint_dir(run_dir: str | os.PathLike) -> pathlib.Path:
    """``run_dir/checkpoint``; if a save was cut off between its two renames, the previous one
    (``checkpoint.old``), which is complete."""
    run = pathlib.Path(run_dir)
    ckpt, old = run / CHECKPOINT_DIR, run / (CHECKPOINT_DIR + ".old")
    return old if not ckpt.is_dir() and old.is_dir() else ckpt


def save_checkpoint(run_dir: pathlib.Path, state: TrainerState, identity: dict, optimizer, scheduler, *,
                    optimizer_state: Optional[dict] = None, trajectory: Optional[Trajectory] = None) -> None:
    """Write ``checkpoint/``: base identity, trajectory, optimizer + scheduler state, trainer state.

    All files are written to ``checkpoint.tmp/`` first and the directory is then swapped in, so a
    run stopped at any moment leaves one complete checkpoint (the new one, or the previous one).
    ``optimizer_state`` / ``trajectory`` replace ``optimizer.state_dict()`` / ``optimizer.trajectory``
    (an interrupted step is left out of both). The optimizer's counters and schedule are tiny for
    plain MeZO; momentum/Adam add their parameter-sized buffers, which is what resuming those costs.
    """
    run_dir = pathlib.Path(run_dir)
    ckpt, tmp, old = run_dir / CHECKPOINT_DIR, run_dir / (CHECKPOINT_DIR + ".tmp"), run_dir / (CHECKPOINT_DIR + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_json(tmp / MODEL_FILE, identity)
    (trajectory if trajectory is not None else optimizer.trajectory).save(tmp / TRAJECTORY_FILE)
    torch.save({"optimizer": optimizer_state if optimizer_state is not None else optimizer.state_dict(),
                "scheduler": scheduler.state_dict()}, tmp / OPTIMIZER_FILE)
    state.save(tmp / STATE_FILE)
    if ckpt.is_dir():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(ckpt, old)
    os.replace(tmp, ckpt)
    shutil.rmtree(old, ignore_errors=True)


# what may change when a run is resumed (everything else must match config.json)
RESUME_MAY_CHANGE = ("resume", "overwrite_output_dir", "steps", "progress", "tensorboard", "save_model", "eval_steps", "logging_steps")


def unfinished_step(run_dir: str | os.PathLike) -> Optional[tuple[int, int]]:
    """``(checkpoint step, steps)`` when ``run_dir`` holds a run stopped before its last step, else None
    (no run there, or one that reached its ``--steps``: starting over in it loses nothing unfinished)."""
    run = pathlib.Path(run_dir)
    state, config = checkpoint_dir(run) / STATE_FILE, run / CONFIG_FILE
    if not (state.is_file() and config.is_file()):
        return None
    try:
        step = int(json.loads(state.read_text())["step"])
        steps = int(json.loads(config.read_text())["steps"])
    except (ValueError, KeyError, TypeError):   # unreadable: not ours to judge; the run itself will say
        return None
    return (step, steps) if step < steps else None


def check_resumable(run_dir: pathlib.Path, args: TrainingArguments) -> None:
    """Raise ``ValueError`` naming every argument that differs from the run's ``config.json``."""
    saved, mine = read_args(run_dir).to_dict(), args.to_dict()
    differ = {k: (saved.get(k), mine[k]) for k in mine if k not in RESUME_MAY_CHANGE and saved.get(k) != mine[k]}
    if differ:
        raise ConfigError(f"--resume: the arguments differ from the run in {run_dir}: "
                         + ", ".join(f"{k}: saved {s!r} vs now {m!r}" for k, (s, m) in differ.items()))


def truncate_metrics(run_dir: pathlib.Path, step: int) -> None:
    """Drop metrics.jsonl records beyond ``step`` (and the final test record), so a resumed run's log
    reads like an uninterrupted one."""
    path = run_dir / METRICS_FILE
    if path.is_file():
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        kept = [json.dumps(r) for r in records if r["step"] <= step and not (r.get("split") == "test" and r["step"] > 0)]
        path.write_text("".join(line + "\n" for line in kept))


def load_checkpoint(run_dir: pathlib.Path, optimizer, scheduler) -> TrainerState:
    """Restore the optimizer and scheduler from ``checkpoint/``; returns the saved :class:`TrainerState`."""
    ckpt = checkpoint_dir(run_dir)
    if not (ckpt / STATE_FILE).is_file():
        raise ConfigError(f"--resume: no checkpoint in {ckpt} (start the run without --resume)")
    state = TrainerState.load(ckpt / STATE_FILE)
    saved = torch.load(ckpt / OPTIMIZER_FILE, weights_only=False)
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    if len(optimizer.trajectory) != state.step:
        raise ValueError(f"--resume: the checkpoint in {ckpt} is inconsistent (trajectory has "
                         f"{len(optimizer.trajectory)} steps, trainer state {state.step})")
    return state


def replay_prefix(lm, trajectory: Trajectory, n_steps: int) -> None:
    """Apply the first ``n_steps`` steps of ``trajectory`` to ``lm``'s trainable parameters in place."""
    if n_steps:
        replay_trajectory(trainable_parameters(lm.model), trajectory[:n_steps])


def load_run(run_dir: str | os.PathLike, step: str | int = "best", lm=None):
    """Rebuild a run's weights: base model (+ adapter) with the first ``step`` trajectory steps replayed.

    ``step`` is ``"best"`` (the best validation step, the default), ``"final"`` or a step number.
    ``lm`` may be a freshly loaded base model to use instead of loading ``model`` from the config
    (tests and in-memory models). Returns ``(lm, args, step_number)``.
    """
    run = pathlib.Path(run_dir)
    args = read_args(run)
    ckpt = checkpoint_dir(run)
    trajectory = Trajectory.load(ckpt / TRAJECTORY_FILE)
    state = TrainerState.load(ckpt / STATE_FILE)
    step = parse_step(step)
    n = {"best": state.best_step, "final": state.step}.get(step, step)
    if not 0 <= n <= len(trajectory):
        raise ConfigError(f"step {step!r}: the checkpoint in {run} has steps 0..{len(trajectory)}")
    lm = build_model(args, lm)
    replay_prefix(lm, trajectory, n)
    return lm, args, n


def save_model(lm, peft: str, out_dir: str | os.PathLike, merged: Optional[bool] = None) -> None:
    """Write ``lm``'s weights to ``out_dir``: ``save_pretrained`` plus the tokenizer; with PEFT
    (``mezo_rl.peft.export_model``) a LoRA adapter merged into the weights by default (``merged``),
    a prefix adapter as adapter files."""
    out_dir = pathlib.Path(out_dir)
    if peft in PEFT_METHODS:
        export_model(lm, out_dir, merged=(peft == "lora") if merged is None else merged)
    else:
        lm.model.save_pretrained(out_dir)
        lm.tokenizer.save_pretrained(out_dir)


def samples_file(run_dir, split: str, step: int) -> pathlib.Path:
    return pathlib.Path(run_dir) / SAMPLES_DIR / f"{split}-step{step:06d}.jsonl"


def write_samples(run_dir, split: str, step: int, records: list[dict]) -> None:
    """The completions kept from one evaluation: one JSON object per line (rewritten whole, so a resumed
    run that repeats an evaluation writes the same file)."""
    path = samples_file(run_dir, split, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(json_safe(r), sort_keys=True) + "\n" for r in records))
    tmp.replace(path)


def read_samples(run_dir, split: str, step: int) -> list[dict]:
    """The completions :func:`write_samples` kept, or [] when that evaluation kept none."""
    path = samples_file(run_dir, split, step)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
