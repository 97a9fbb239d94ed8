"""The run directory: where a run lives, its checkpoint, and rebuilding its weights.

::

    training_args.json   the resolved MeZOConfig
    metrics.jsonl        one JSON object per logged step and per evaluation
    summary.json         initial_validation, validation (best step), test, best_step, wall_time_s, metrics
    checkpoint/          model.json (base model identity + PEFT config; how completions end at a stop
                         string), trajectory.npz, optimizer.json (optimizer + scheduler state),
                         optimizer.safetensors (momentum / Adam buffers, only when the run has them),
                         trainer_state.json (TrainerState)
    samples/             prompt tasks: <split>-step<N>.jsonl, the first completions of each evaluation
    completions/         the same as <split>-step<N>.parquet tables (TRL's log_completions; needs pyarrow)
    config.json, model.safetensors, tokenizer files, README.md (the model card): the weights, with
                         ``save_model=True`` or ``trainer.save_model()``
    trainer_state.json   ``trainer.save_state()``; <split>_results.json, all_results.json: ``trainer.save_metrics``
    tensorboard/         only with ``report_to`` tensorboard

The checkpoint is tiny (a few bytes per step): the base model plus the step log is enough to
rebuild the weights bit for bit (:func:`mezo_rl.engine.optim.replay_trajectory`). Here: the files'
names, :class:`TrainerState`, writing and reading the checkpoint, :func:`load_run` (base model +
adapter from the arguments, :func:`mezo_rl.training.setup.build_model`, then the trajectory replayed) and
:func:`save_model` (used by ``--save-model`` and ``mezo-rl export``).

Nothing in a run directory is unpickled: the checkpoint is JSON (sorted keys), an ``.npz`` read with
``allow_pickle=False`` and safetensors, so a shared run directory cannot run code when it is resumed
or replayed. Its files depend only on the run's state: a resumed run writes the bytes an
uninterrupted one does. A checkpoint from before these formats (an ``optimizer.pt``) is refused
in one line. A file that cannot be read raises :class:`CheckpointError` naming it, and nothing in the
directory is changed.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import pathlib
import shutil
import zipfile
import zlib
from dataclasses import dataclass
from importlib.metadata import version
from typing import Optional

import numpy as np
import torch

from mezo_rl import rewards
from mezo_rl.choices import parse_max_memory, weights_dtype
from mezo_rl.engine.optim import recorded_options, replay_trajectory
from mezo_rl.engine.trajectory import Trajectory
from mezo_rl.errors import ConfigError, UserError, first_line
from mezo_rl.model.peft import PEFT_METHODS, export_model, peft_config
from mezo_rl.tasks import completion_stops
from mezo_rl.training.arguments import MeZOConfig, parse_step
from mezo_rl.training.resolve import resolve_values
from mezo_rl.training.setup import build_model, trainable_parameters

CONFIG_FILE = "training_args.json"  # the run's MeZOConfig (config.json is the saved model's, as transformers)
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CHECKPOINT_DIR = "checkpoint"
TRAJECTORY_FILE = "trajectory.npz"
MODEL_FILE = "model.json"
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.json"
OPTIMIZER_TENSORS_FILE = "optimizer.safetensors"
#: the name under which optimizer.safetensors holds HiZOO's curvature (``curvature/hb``, ``curvature/ha``)
CURVATURE = "curvature"
LEGACY_OPTIMIZER_FILE = "optimizer.pt"  # a checkpoint from before optimizer.json: refused, never unpickled
OPTIMIZER_FORMAT = "mezo-rl-optimizer/2"
SAMPLES_DIR = "samples"


class CheckpointError(UserError, ValueError):
    """A run-directory file that cannot be read (missing, damaged, truncated, or holding code);
    the message names the file and what to do. Reading never changes the directory."""


def _unreadable(path: pathlib.Path, problem: str) -> CheckpointError:
    return CheckpointError(f"{path}: {problem}; the run directory is left as it is: restore the file from a copy, "
                           f"or start the run over with --overwrite-output-dir")


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {first_line(e)}"


@dataclass
class TrainerState:
    """What the Trainer knows beyond the weights, with ``transformers.TrainerState``'s fields and JSON layout
    (``save_to_json`` / ``load_from_json``; ``checkpoint/trainer_state.json``), so callbacks written for
    transformers read it unchanged; then the run's own (the validations it keeps, the objective's frozen
    scales). One new field: one line here."""

    epoch: float = 0.0  # examples drawn / train examples (batches are drawn with replacement across steps)
    global_step: int = 0
    max_steps: int = 0
    logging_steps: int = 1
    eval_steps: int = 1
    save_steps: int = 1
    train_batch_size: Optional[int] = None
    num_train_epochs: float = 0
    num_input_tokens_seen: int = 0
    total_flos: float = 0.0  # not counted (transformers counts the backward pass's; MeZO has none)
    log_history: list = dataclasses.field(default_factory=list)
    best_metric: Optional[float] = None
    best_global_step: Optional[int] = None
    best_model_checkpoint: Optional[str] = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True
    is_hyper_param_search: bool = False
    trial_name: Optional[str] = None
    trial_params: Optional[dict] = None
    stateful_callbacks: dict = dataclasses.field(default_factory=dict)
    # the run's own (_OWN_FIELDS)
    best_validation: Optional[dict] = None
    initial_validation: Optional[dict] = None
    initial_test: Optional[dict] = None
    last_validation: Optional[dict] = None
    wall_time_s: float = 0.0  # up to the last save
    last_eval_step: Optional[int] = None  # the step of the last validation
    loss_sum: float = 0.0  # the training steps' losses summed (TrainOutput.training_loss: their mean)
    update_kept_sum: float = 0.0  # bf16 / fp16 weights: the share of each update kept (StepResult.update_kept), summed
    update_kept_steps: int = 0  # ... over this many steps
    objective: Optional[dict] = None  # Objective.state_dict(): the frozen normalisation scales

    @property
    def best_step(self) -> int:
        """The best step (0, the starting weights, until a validation beats them)."""
        return self.best_global_step or 0

    @classmethod
    def load_from_json(cls, path: str | os.PathLike) -> "TrainerState":
        """Read ``trainer_state.json``; :class:`CheckpointError` if it is missing or not a TrainerState."""
        path = pathlib.Path(path)
        saved = read_json(path)
        try:
            own = saved.get("stateful_callbacks", {}).pop(_OWN_KEY, {})
            return cls(**saved, **own)
        except (TypeError, AttributeError) as e:  # not a mapping, or fields this version does not know
            raise _unreadable(path, f"not a trainer state ({_one_line(e)})") from None

    def save_to_json(self, path: str | os.PathLike) -> None:
        """transformers' layout, which ``transformers.TrainerState.load_from_json`` reads: its fields at the top,
        the run's own under ``stateful_callbacks["MeZOTrainer"]``."""
        saved = dataclasses.asdict(self)
        own = {f.name: saved.pop(f.name) for f in dataclasses.fields(self) if f.name in _OWN_FIELDS}
        saved["stateful_callbacks"] = {**saved["stateful_callbacks"], _OWN_KEY: own}
        write_json(pathlib.Path(path), saved)


_OWN_KEY = "MeZOTrainer"
_OWN_FIELDS = ("best_validation", "initial_validation", "initial_test", "last_validation", "wall_time_s",
               "last_eval_step", "loss_sum", "update_kept_sum", "update_kept_steps", "objective")


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


def write_json(path: pathlib.Path, obj, *, exact: bool = False) -> None:
    """Write ``obj`` atomically (a temporary file renamed over ``path``), keys sorted, so the bytes
    depend on the content only. ``exact``: write floats as they are (non-finite ones as NaN /
    Infinity, which :func:`read_json` reads back) instead of as null (:func:`json_safe`)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj if exact else json_safe(obj), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_json(path: pathlib.Path):
    """The JSON in ``path``; :class:`CheckpointError` naming the file if it is missing or damaged."""
    try:
        return json.loads(pathlib.Path(path).read_text())
    except FileNotFoundError:
        raise _unreadable(path, "missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _unreadable(path, f"damaged: not valid JSON ({_one_line(e)})") from None


def append_jsonl(path: pathlib.Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(json_safe(record)) + "\n")


def read_args(run_dir: str | os.PathLike) -> MeZOConfig:
    config = pathlib.Path(run_dir) / CONFIG_FILE
    if not config.is_file():
        raise ConfigError(f"{str(run_dir)!r} is not a mezo-rl run directory (no {CONFIG_FILE}); "
                          f"give the --output-dir of a `mezo-rl train` run")
    return MeZOConfig.from_dict(read_json(config))


def model_identity(args: MeZOConfig, lm) -> dict:
    """What the checkpoint needs besides the trajectory: the base model and the adapter; and how its completions
    ended at a stop string (``stop_strings``: :data:`STOP_STRINGS`)."""
    return {"model": args.model, "dtype": str(next(lm.model.parameters()).dtype).removeprefix("torch."), "peft": peft_config(lm) if args.peft in PEFT_METHODS else None,
            "parameters": sum(p.numel() for p in trainable_parameters(lm.model)),
            "transformers": version("transformers"), "torch": torch.__version__, "stop_strings": STOP_STRINGS}


# How a completion ends at a stop string (model.json's "stop_strings"): "kept", the text ends with the stop string.
# A checkpoint without it was written by a version that cut the text just before the stop string.
STOP_STRINGS = "kept"
# Built-in rewards whose value ignores whitespace at the ends of a completion (they normalise or tokenise it away).
WHITESPACE_BLIND = frozenset({"squad_f1", "exact_match", "rouge_l", "bleu"})


def stops_changed(run_dir: str | os.PathLike, stop, task, objective=None) -> bool:
    """Whether the run in ``run_dir`` comes from a version that cut a completion before its stop string where this
    version's completions could differ (:func:`stops_cut`, for the task's stop strings and ``stop``)."""
    return stops_cut(completion_stops(task, stop), task, objective, lambda: read_json(checkpoint_dir(run_dir) / MODEL_FILE))


def stops_cut(stops, task, objective, identity) -> bool:
    """Whether a run whose completions end at ``stops`` comes from a version that cut a completion before its stop
    string where this version's could differ: it generates with stop strings and something reads its
    completions (:func:`completion_readers`), and its checkpoint's model.json (``identity``, or a callable that
    reads it, called only where it decides) does not say ``stop_strings: kept``. Nothing differs where every stop
    string is whitespace and the only readers are :data:`WHITESPACE_BLIND` metrics of a task with gold answers
    (SQuAD's and DROP's newline with their F1 and exact match; ``--beta``, a KL over the completions, is for
    prompt tasks only)."""
    readers = completion_readers(task, objective)
    if not stops or not readers:
        return False
    identity = identity() if callable(identity) else identity
    if isinstance(identity, dict) and identity.get("stop_strings") == STOP_STRINGS:
        return False
    return not (task.kind != "prompts" and all(not s.strip() for s in stops) and readers <= WHITESPACE_BLIND)


def check_stop_strings(run_dir: str | os.PathLike, args: MeZOConfig, task, objective) -> None:
    """Refuse, in one line, to resume a run whose completions this version could make go on differently
    (:func:`stops_changed`)."""
    if stops_changed(run_dir, args.stop, task, objective):
        raise _stops_refused(run_dir)


def _stops_refused(run_dir) -> ConfigError:
    return ConfigError(f"--resume: the run in {str(run_dir)!r} was made with stop strings cut before the string; "
                       "this version keeps them, so its completions would differ: start it over with "
                       "--overwrite-output-dir")


def completion_readers(task, objective=None) -> set[str]:
    """What reads a run's completions: the generation rewards of its objective (if given) and of its task's
    metrics; for a prompt task also its evaluations' ``distinct_2``, ``completion_chars`` and ``kl``."""
    specs = [*(objective.rewards if objective is not None else ()), *(rewards.get_reward(m) for m in task.metrics)]
    readers = {s.name for s in specs if s.needs == "generation"}
    return readers | ({"distinct_2", "completion_chars", "kl"} if task.kind == "prompts" else set())


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
    write_optimizer_state(tmp, optimizer_state if optimizer_state is not None else optimizer.state_dict(),
                          scheduler.state_dict())
    state.save_to_json(tmp / STATE_FILE)
    if ckpt.is_dir():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(ckpt, old)
    os.replace(tmp, ckpt)
    shutil.rmtree(old, ignore_errors=True)


def write_optimizer_state(ckpt: pathlib.Path, optimizer_state: dict, scheduler_state: dict) -> None:
    """``optimizer.json`` (the scalars: param groups, MeZO's counters and config, the scheduler, the
    names of the tensors) and, when there are buffers, ``optimizer.safetensors`` (tensor
    ``"{index}/{name}"``: the momentum / Adam buffer ``name`` of parameter ``index``; ``"curvature/{name}"``:
    HiZOO's curvature). The trajectory in ``optimizer_state`` is left out: ``trajectory.npz`` holds it."""
    mezo = optimizer_state["mezo"]
    tensors = {f"{CURVATURE}/{name}": value.detach().contiguous().cpu()
               for name, value in (mezo.get("curvature") or {}).items()}
    for index, buffers in optimizer_state["state"].items():
        for name, value in buffers.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"optimizer state {index}/{name} is a {type(value).__name__}; a checkpoint holds tensors only")
            tensors[f"{index}/{name}"] = value.detach().contiguous().cpu()
    if tensors:
        from safetensors.torch import save_file

        save_file(tensors, str(ckpt / OPTIMIZER_TENSORS_FILE))
    write_json(ckpt / OPTIMIZER_FILE, {
        "format": OPTIMIZER_FORMAT, "param_groups": optimizer_state["param_groups"],
        "mezo": {k: v for k, v in mezo.items() if k not in ("trajectory", "curvature")},
        "scheduler": scheduler_state, "tensors": sorted(tensors)}, exact=True)


def read_optimizer_state(ckpt: pathlib.Path, trajectory: Trajectory, *, tensors: bool = True) -> tuple[dict, dict]:
    """``(optimizer state dict, scheduler state dict)`` from ``ckpt``, with ``trajectory`` as the
    optimizer's. ``tensors=False`` checks the buffers' file without reading the buffers (``state`` is then empty)."""
    return optimizer_state_of(ckpt, read_optimizer_json(ckpt), trajectory, tensors=tensors)


def read_optimizer_json(ckpt: pathlib.Path) -> dict:
    """``optimizer.json``, checked (a checkpoint in the unsafe format before it is refused in one line)."""
    path = ckpt / OPTIMIZER_FILE
    if not path.is_file() and (ckpt / LEGACY_OPTIMIZER_FILE).is_file():
        raise CheckpointError(f"{ckpt}: a checkpoint from before mezo-rl's safe format ({LEGACY_OPTIMIZER_FILE}) is not "
                              f"supported; nothing was loaded: start the run over with --overwrite-output-dir")
    saved = read_json(path)
    if not (isinstance(saved, dict) and saved.get("format") == OPTIMIZER_FORMAT
            and {"param_groups", "mezo", "scheduler", "tensors"} <= saved.keys()):
        raise _unreadable(path, f"not a {OPTIMIZER_FORMAT} optimizer state")
    return saved


def optimizer_state_of(ckpt: pathlib.Path, saved: dict, trajectory: Trajectory, *, tensors: bool = True) -> tuple[dict, dict]:
    """``(optimizer state dict, scheduler state dict)`` from ``optimizer.json``'s values ``saved``, the buffers
    read from ``ckpt`` (``tensors=False``: their file checked only)."""
    state = read_optimizer_tensors(ckpt, saved["tensors"], load=tensors)
    curvature = state.pop(CURVATURE, None)
    optimizer_state = {"state": state, "param_groups": saved["param_groups"], "mezo": saved["mezo"]}
    scheduler_state = saved["scheduler"]
    optimizer_state["mezo"] = {**optimizer_state["mezo"], "trajectory": trajectory.state_dict(), "curvature": curvature}
    return optimizer_state, scheduler_state


def read_optimizer_tensors(ckpt: pathlib.Path, names: list, *, load: bool = True) -> dict:
    """The optimizer's per-parameter buffers ``{index: {name: tensor}}`` listed in ``names`` (HiZOO's curvature
    under the key ``"curvature"``)."""
    if not names:
        return {}
    from safetensors import SafetensorError, safe_open

    path = ckpt / OPTIMIZER_TENSORS_FILE
    if not path.is_file():
        raise _unreadable(path, f"missing (optimizer.json lists {len(names)} buffers)")
    try:
        with safe_open(str(path), framework="pt") as f:
            found = sorted(f.keys())
            tensors = {key: f.get_tensor(key) for key in names if load and key in found}
    except (SafetensorError, OSError, ValueError) as e:
        raise _unreadable(path, f"damaged ({_one_line(e)})") from None
    if found != sorted(names):
        raise _unreadable(path, f"damaged: it holds other tensors than the {len(names)} that {OPTIMIZER_FILE} lists")
    state: dict[int, dict] = {}
    for key, tensor in tensors.items():
        index, name = key.split("/", 1)
        state.setdefault(index if index == CURVATURE else int(index), {})[name] = tensor
    return state


def read_trajectory(path: pathlib.Path) -> Trajectory:
    """``Trajectory.load(path)``; :class:`CheckpointError` naming the file if it is missing or damaged
    (an ``.npz`` that holds Python objects is refused: it is read with ``allow_pickle=False``)."""
    try:
        return Trajectory.load(path)
    except FileNotFoundError:
        raise _unreadable(path, "missing") from None
    except (OSError, EOFError, ValueError, KeyError, TypeError, AttributeError, zipfile.BadZipFile, zlib.error) as e:
        raise _unreadable(path, f"damaged ({_one_line(e)})") from None


def read_checkpoint(run_dir: str | os.PathLike, *, tensors: bool = True) -> tuple[TrainerState, dict, dict]:
    """``(trainer state, optimizer state dict, scheduler state dict)`` from ``run_dir``'s checkpoint,
    each file checked; ``tensors=False`` checks the optimizer's buffers without reading them."""
    ckpt = checkpoint_dir(run_dir)
    state, trajectory = _state_and_trajectory(ckpt)
    optimizer_state, scheduler_state = read_optimizer_state(ckpt, trajectory, tensors=tensors)
    return state, optimizer_state, scheduler_state


def _state_and_trajectory(ckpt: pathlib.Path) -> tuple[TrainerState, Trajectory]:
    state = TrainerState.load_from_json(ckpt / STATE_FILE)
    trajectory = read_trajectory(ckpt / TRAJECTORY_FILE)
    if len(trajectory) != state.global_step:
        raise _unreadable(ckpt / TRAJECTORY_FILE, f"inconsistent: it has {len(trajectory)} steps, "
                                                  f"{STATE_FILE} says {state.global_step}")
    return state, trajectory


@dataclass(frozen=True)
class RecordedRun:
    """What a run directory holds for a resumed run, each file read once (:func:`read_resumed`): its
    ``training_args.json`` (``args``, the field values), its checkpoint's ``model.json`` (``identity``; None in
    a checkpoint without one), trainer state, trajectory and ``optimizer.json`` (``optimizer``, the scalars;
    the buffers are read when the optimizer is restored: :func:`load_checkpoint`); what the run keeps: how its
    steps evaluated their members (``member_evaluation``: :func:`member_evaluation_of`) and the weights' dtype its checkpoint
    was written with (``dtype``, which ``--dtype auto`` keeps; None where model.json does not say)."""

    run_dir: pathlib.Path
    args: dict
    identity: Optional[dict]
    state: TrainerState
    trajectory: Trajectory
    optimizer: dict
    member_evaluation: str
    dtype: Optional[str]


def member_evaluation_of(trajectory: Trajectory) -> str:
    """How the steps of ``trajectory`` evaluated their members (``"inplace"`` or ``"batched"``, from its header,
    where runs from before the rename recorded it as ``evaluation``; runs from before the option ran in place)."""
    return recorded_options(trajectory.header or {}).get("member_evaluation", "inplace")


def resumed_member_evaluation(evaluation: str, recorded: str) -> str:
    """The member evaluation of a resumed run: the one its checkpoint was written with (``recorded``), which
    ``auto`` keeps; asking for the other one is refused in one line (the optimizer state and trajectory belong
    to that mode)."""
    if evaluation not in ("auto", recorded):
        raise ConfigError(f"--resume: this run's steps were evaluated {recorded}; resume it with "
                          f"--member-evaluation {recorded} or auto, not --member-evaluation {evaluation}")
    return recorded


def recorded_member_evaluation(run_dir: str | os.PathLike) -> Optional[str]:
    """How the checkpointed steps of ``run_dir`` evaluated their members (:func:`member_evaluation_of`), or None without
    a checkpoint."""
    path = checkpoint_dir(run_dir) / TRAJECTORY_FILE
    return member_evaluation_of(read_trajectory(path)) if path.is_file() else None


# what may change when a run is resumed (everything else must match config.json)
RESUME_MAY_CHANGE = ("resume", "overwrite_output_dir", "max_steps", "progress", "report_to", "run_name", "save_model", "merge",
                     "save_steps", "eval_steps", "logging_steps", "eval_batch_size", "push_to_hub", "hub_model_id",
                     "hub_strategy", "hub_private_repo", "logging_dir", "num_completions_to_print", "save_total_limit",
                     "load_best_model_at_end")


def unfinished_step(run_dir: str | os.PathLike) -> Optional[tuple[int, int]]:
    """``(checkpoint step, steps)`` when ``run_dir`` holds a run stopped before its last step, else None
    (no run there, or one that reached its ``--max-steps``: starting over in it loses nothing unfinished)."""
    run = pathlib.Path(run_dir)
    state, config = checkpoint_dir(run) / STATE_FILE, run / CONFIG_FILE
    if not (state.is_file() and config.is_file()):
        return None
    try:
        step = int(json.loads(state.read_text())["global_step"])
        saved = json.loads(config.read_text())
        steps = int(saved["max_steps"] if "max_steps" in saved else saved["steps"])  # "steps": before the TRL names
    except (ValueError, KeyError, TypeError, OSError):   # unreadable: not ours to judge; the run itself will say
        return None
    return (step, steps) if step < steps else None


def read_resumed(run_dir: str | os.PathLike, args: MeZOConfig, task=None, objective=None, stops=()) -> RecordedRun:
    """The run in ``run_dir`` that ``args`` (resolved) resumes, each of its files read once and checked: one line
    where there is no checkpoint, a file is damaged or unsafe, the run's optimizer normalised its steps itself
    (``step_normalize="std"`` in its trajectory, recorded as ``normalize``: runs from before the fitness, ``mezo_rl.training.fitness``, took that
    over replay with ``load_run`` but do not resume), ``args.member_evaluation`` asks for the other member evaluation
    than the run's (``auto`` keeps it), an argument differs from the run's ``training_args.json`` (but those of
    :data:`RESUME_MAY_CHANGE`), or, with ``task`` and ``objective``, its completions, which end at ``stops``
    (``mezo_rl.tasks.completion_stops``), would end differently (:func:`stops_cut`). A value the run's configuration recorded unset is compared as it
    resolves for ``task`` (``mezo_rl.training.resolve.resolve_values``)."""
    run = pathlib.Path(run_dir)
    if not (checkpoint_dir(run) / STATE_FILE).is_file() or not (run / CONFIG_FILE).is_file():
        raise ConfigError(f"--resume: no checkpoint in {str(run)!r} (no {CHECKPOINT_DIR}/{STATE_FILE}); "
                          f"start the run without --resume")
    ckpt = checkpoint_dir(run)
    saved = MeZOConfig.from_dict(read_json(run / CONFIG_FILE)).to_dict()
    identity = read_json(ckpt / MODEL_FILE) if (ckpt / MODEL_FILE).is_file() else None
    state, trajectory = _state_and_trajectory(ckpt)
    optimizer = read_optimizer_json(ckpt)
    optimizer_state_of(ckpt, optimizer, trajectory, tensors=False)  # the buffers' file, checked
    if recorded_options(trajectory.header or {}).get("step_normalize") == "std":
        raise ConfigError(f"--resume: the run in {run} normalised its steps in the optimizer (its trajectory "
                          f"says step_normalize='std'), as runs did before the fitness took that over, so it cannot "
                          f"continue; its weights still load (mezo-rl export), and a new run trains on")
    if task is not None and stops_cut(stops, task, objective, identity):
        raise _stops_refused(run)
    dtype = identity.get("dtype") if isinstance(identity, dict) else None
    recorded = RecordedRun(run, saved, identity, state, trajectory, optimizer, member_evaluation_of(trajectory), dtype)
    resumed_member_evaluation(args.member_evaluation, recorded.member_evaluation)
    resolved = resolve_values(saved, task.kind, list(task.metrics))[0] if task is not None else saved
    mine = args.to_dict()
    differ = {k: (resolved.get(k), mine[k]) for k in mine if k not in RESUME_MAY_CHANGE and resolved.get(k) != mine[k]}
    if differ:
        raise ConfigError(f"--resume: the arguments differ from the run in {run}: "
                         + ", ".join(f"{k}: saved {s!r} vs now {m!r}" for k, (s, m) in differ.items()))
    return recorded


def truncate_metrics(run_dir: pathlib.Path, step: int) -> None:
    """Drop metrics.jsonl records beyond ``step`` (and the final test record), so a resumed run's log
    reads like an uninterrupted one."""
    path = run_dir / METRICS_FILE
    if path.is_file():
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        kept = [json.dumps(r) for r in records if r["step"] <= step and not (r.get("split") == "test" and r["step"] > 0)]
        path.write_text("".join(line + "\n" for line in kept))


def load_checkpoint(recorded: RecordedRun, optimizer, scheduler) -> TrainerState:
    """Restore the optimizer (its buffers read here) and scheduler of the run ``recorded``; returns a copy of
    its :class:`TrainerState`."""
    ckpt = checkpoint_dir(recorded.run_dir)
    optimizer_state, scheduler_state = optimizer_state_of(ckpt, recorded.optimizer, recorded.trajectory)
    optimizer.load_state_dict(optimizer_state)
    scheduler.load_state_dict(scheduler_state)
    return copy.deepcopy(recorded.state)


def replay_prefix(lm, trajectory: Trajectory, n_steps: int) -> None:
    """Apply the first ``n_steps`` steps of ``trajectory`` to ``lm``'s trainable parameters in place."""
    if n_steps:
        replay_trajectory(trainable_parameters(lm.model), trajectory[:n_steps])


def recorded_dtype(run_dir: str | os.PathLike) -> Optional[str]:
    """The weights' dtype a run's checkpoint was written with (model.json), or None without a checkpoint."""
    path = checkpoint_dir(run_dir) / MODEL_FILE
    identity = read_json(path) if path.is_file() else None
    return identity.get("dtype") if isinstance(identity, dict) else None


def load_run(run_dir: str | os.PathLike, step: str | int = "best", lm=None):
    """Rebuild a run's weights: base model (+ adapter) with the first ``step`` trajectory steps replayed.

    ``step`` is ``"best"`` (the best validation step, the default), ``"final"`` or a step number.
    ``lm`` may be a freshly loaded base model to use instead of loading ``model`` from the config
    (tests and in-memory models). Returns ``(lm, args, step_number)``.
    """
    run = pathlib.Path(run_dir)
    args = read_args(run)
    ckpt = checkpoint_dir(run)
    trajectory = read_trajectory(ckpt / TRAJECTORY_FILE)
    state = TrainerState.load_from_json(ckpt / STATE_FILE)
    step = parse_step(step)
    n = {"best": state.best_step, "final": state.global_step}.get(step, step)
    if not 0 <= n <= len(trajectory):
        raise ConfigError(f"step {step!r}: the checkpoint in {run} has steps 0..{len(trajectory)}")
    lm = build_model(args, lm, weights_dtype(args.dtype, args.autocast, recorded_dtype(run)),
                     max_memory=parse_max_memory(args.max_memory))
    replay_prefix(lm, trajectory, n)
    return lm, args, n


def save_model(lm, peft: str, out_dir: str | os.PathLike, merged: bool = False) -> None:
    """Write ``lm``'s weights to ``out_dir``: ``save_pretrained`` plus the tokenizer; with PEFT
    (``mezo_rl.model.peft.export_model``) the adapter folder (LoRA: peft's format, which
    ``peft.PeftModel.from_pretrained`` loads) with the tokenizer beside it, as transformers' ``Trainer.save_model``
    writes an adapter, or with ``merged`` a LoRA adapter folded into the weights."""
    out_dir = pathlib.Path(out_dir)
    if peft in PEFT_METHODS:
        export_model(lm, out_dir, merged=merged)  # merged: the tokenizer too
        if not merged and getattr(lm, "tokenizer", None) is not None:
            lm.tokenizer.save_pretrained(out_dir)
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
