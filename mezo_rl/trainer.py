"""The trainer: task + LanguageModel + objective + MeZO, with evaluation, logging and checkpoints.

One training step (Algorithm 1 of Malladi et al., 2023):

1. sample a batch of training examples (a pure function of ``(seed, step)``, so a resumed run sees
   exactly the batches an uninterrupted one would);
2. the closure scores (or generates for) that batch and returns the objective's loss; the engine
   calls it with the parameters perturbed by ``+eps*z`` and ``-eps*z`` (same batch, and for
   sampled generation the same sampling seed), then applies ``-lr * projected_grad * z`` in place;
3. every ``eval_steps`` steps the model is evaluated on the validation examples and the best step
   is remembered. At the end the best weights (the first ``best_step`` steps of the trajectory,
   replayed from the base model) are evaluated on the test examples.

The output directory holds::

    config.json          the resolved TrainingArguments
    metrics.jsonl        one JSON object per logged step and per evaluation
    summary.json         initial_validation, validation (best step), test, best_step, wall_time_s, metrics
    checkpoint/          model.json (base model identity + PEFT config) + trajectory + trainer_state.json
    model/               full weights (save_pretrained), only with ``save_model=True``
    tensorboard/         only with ``tensorboard=True``

The checkpoint is tiny (a few bytes per step): the base model plus the step log is enough to
rebuild the weights bit for bit (:func:`mezo_rl.trajectory.replay_trajectory`).
"""
from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import pathlib
import resource
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import torch

CHECKPOINT_DIR = "checkpoint"
TRAJECTORY_FILE = "trajectory.npz"
MODEL_FILE = "model.json"
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"


@dataclass
class TrainingArguments:
    """Everything a training run needs. Each field is also a ``mezo-rl train`` option (``--field-name``).

    Defaults are chosen so that ``mezo-rl train`` (SmolLM2-135M, SST-2, accuracy reward) finishes in
    minutes on a 2-core CPU and visibly moves validation accuracy. The paper's OPT settings
    (Table 16) are batch 16, lr 1e-6 or 1e-7, eps 1e-3, 20,000 steps, evaluation every 1/5 of the run,
    on 1,000 train / 500 validation / 1,000 test examples: pass them explicitly to reproduce it.
    """

    # what to train
    model: str = field(default="smollm2-135m", metadata={"help": "short name (smollm2-135m), hub id, local directory or .gguf file"})
    task: str = field(default="sst2", metadata={"help": "task name (see `mezo-rl tasks`)"})
    reward: list[str] = field(default_factory=lambda: ["accuracy"], metadata={"help": "reward/objective name (see `mezo-rl rewards`); repeat to combine several"})
    reward_weights: Optional[list[float]] = field(default=None, metadata={"help": "one weight per --reward (default: all 1)"})
    reward_normalize: Optional[str] = field(default=None, metadata={"help": "'std': scale each reward by its spread on the first batch before weighting (default: no scaling)"})
    peft: str = field(default="none", metadata={"help": "none (full fine-tuning), lora or prefix", "choices": ["none", "lora", "prefix"]})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank (paper: 8)"})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha (paper: 16)"})
    num_prefix_tokens: int = field(default=5, metadata={"help": "prefix-tuning length (paper: 5)"})
    # data
    data_dir: Optional[str] = field(default=None, metadata={"help": "directory with the datasets (default: $MEZO_RL_DATA)"})
    num_train: int = field(default=1000, metadata={"help": "training examples sampled from the train split (paper: 1000)"})
    num_eval: int = field(default=100, metadata={"help": "validation examples (paper: 500)"})
    num_test: int = field(default=200, metadata={"help": "test examples (paper: 1000)"})
    # MeZO
    steps: int = field(default=50, metadata={"help": "training steps (paper: 20000)"})
    batch_size: int = field(default=32, metadata={"help": "examples per step (paper: 16)"})
    lr: Optional[float] = field(default=None, metadata={"help": "learning rate (default: 2e-4 full, PEFT_DEFAULTS for lora/prefix)"})
    eps: Optional[float] = field(default=None, metadata={"help": "perturbation scale (default: 1e-2 full: with 1e-3 the accuracy of a 16-example batch is the same at +eps and -eps; PEFT_DEFAULTS for lora/prefix)"})
    weight_decay: Optional[float] = field(default=None, metadata={"help": "decoupled weight decay, biases and norm weights exempt (default 0)"})
    lr_scheduler: str = field(default="constant", metadata={"help": "constant (paper) or linear", "choices": ["constant", "linear"]})
    n_spsa: int = field(default=1, metadata={"help": "SPSA samples per step (Appendix B.1)"})
    noise: str = field(default="gaussian", metadata={"help": "perturbation distribution", "choices": ["gaussian", "rademacher"]})
    estimator: str = field(default="two_point", metadata={"help": "two_point (+/-eps) or one_point", "choices": ["two_point", "one_point"]})
    momentum: float = field(default=0.0, metadata={"help": "ZO-SGD momentum (Appendix B.2)"})
    adam: bool = field(default=False, metadata={"help": "ZO-Adam (Appendix B.2)"})
    on_nonfinite: str = field(default="raise", metadata={"help": "what a non-finite loss does", "choices": ["raise", "skip"]})
    seed: int = field(default=0, metadata={"help": "seed for data sampling, perturbations and generation"})
    # compute
    dtype: str = field(default="float32", metadata={"help": "weights dtype", "choices": ["float32", "bfloat16"]})
    autocast: str = field(default="auto", metadata={"help": "bf16 autocast of the forward passes with fp32 master weights: auto (only where the CPU has native bf16: AVX512-BF16/AMX; on AVX2-only CPUs it is ~3x slower than fp32), bfloat16 or none", "choices": ["auto", "none", "bfloat16"]})
    device_map: Optional[str] = field(default=None, metadata={"help": "spread a model larger than one device over several (passed to from_pretrained, e.g. auto); offloading to disk is rejected"})
    max_memory: Optional[str] = field(default=None, metadata={"help": "per-device memory caps with --device-map, e.g. '0=20GiB,1=20GiB,cpu=60GiB'"})
    # generation (rewards that need completions)
    max_new_tokens: int = field(default=32, metadata={"help": "generation length for generation-based rewards and evaluation"})
    do_sample: bool = field(default=False, metadata={"help": "sample completions during training (same seed at +eps and -eps) instead of greedy decoding"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature when --do-sample"})
    # evaluation and logging
    eval_steps: Optional[int] = field(default=None, metadata={"help": "evaluate on validation every N steps (default: steps/5, as in the paper)"})
    metric_for_best: Optional[str] = field(default=None, metadata={"help": "validation metric that picks the best step (default: the task's first metric)"})
    initial_test: bool = field(default=True, metadata={"help": "also evaluate the untrained model on the test examples (summary.json: initial_test)"})
    eval_batch_size: int = field(default=32, metadata={"help": "examples per forward pass during evaluation"})
    logging_steps: int = field(default=1, metadata={"help": "write a metrics.jsonl record every N steps"})
    output_dir: str = field(default="runs/mezo", metadata={"help": "where config, metrics, summary and checkpoint go"})
    resume: bool = field(default=False, metadata={"help": "continue the run in --output-dir from its checkpoint"})
    save_model: bool = field(default=False, metadata={"help": "also write the best weights with save_pretrained into OUTPUT_DIR/model"})
    tensorboard: bool = field(default=False, metadata={"help": "also log to OUTPUT_DIR/tensorboard"})
    progress: bool = field(default=True, metadata={"help": "show a tqdm progress bar"})

    def __post_init__(self):
        if isinstance(self.reward, str):
            self.reward = [self.reward]
        if not self.reward:
            raise ValueError("TrainingArguments.reward: give at least one reward name (see `mezo-rl rewards`)")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward):
            raise ValueError(
                f"TrainingArguments.reward_weights: got {len(self.reward_weights)} weights for "
                f"{len(self.reward)} rewards {self.reward}; give one weight per reward"
            )
        for name in ("steps", "batch_size", "num_train", "num_eval", "num_test", "n_spsa", "eval_batch_size", "logging_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < (0 if name in ("steps", "num_test") else 1):
                raise ValueError(f"TrainingArguments.{name}: expected a positive integer, got {value!r}")
        if self.eval_steps is not None and self.eval_steps < 1:
            raise ValueError(f"TrainingArguments.eval_steps: expected a positive integer, got {self.eval_steps!r}")
        checks = {
            "peft": ("none", "lora", "prefix"),
            "lr_scheduler": ("constant", "linear"),
            "noise": ("gaussian", "rademacher"),
            "estimator": ("two_point", "one_point"),
            "on_nonfinite": ("raise", "skip"),
            "dtype": ("float32", "bfloat16"),
            "autocast": ("auto", "none", "bfloat16"),
        }
        for name, accepted in checks.items():
            if getattr(self, name) not in accepted:
                raise ValueError(f"TrainingArguments.{name}: got {getattr(self, name)!r}, accepted: {', '.join(accepted)}")

    # ------------------------------------------------------------------ resolved values
    def hyperparameters(self) -> dict:
        """lr / eps / weight_decay with the per-mode defaults filled in (explicit values win)."""
        defaults = {"lr": 2e-4, "eps": 1e-2, "weight_decay": 0.0}
        if self.peft != "none":
            from mezo_rl.peft import PEFT_DEFAULTS

            defaults.update({k: v for k, v in PEFT_DEFAULTS[self.peft].items() if k in defaults})
        return {k: (getattr(self, k) if getattr(self, k) is not None else v) for k, v in defaults.items()}

    def resolved_eval_steps(self) -> int:
        return self.eval_steps or max(1, self.steps // 5)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainingArguments":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown TrainingArguments field(s) {unknown}; accepted: {sorted(known)}")
        return cls(**d)


# ---------------------------------------------------------------------- callbacks
class TrainerCallback:
    """Hooks the Trainer calls; subclass and override what you need (all no-ops here)."""

    def on_train_begin(self, trainer: "Trainer") -> None: ...

    def on_step_end(self, trainer: "Trainer", record: dict) -> None: ...

    def on_evaluate(self, trainer: "Trainer", record: dict) -> None: ...

    def on_train_end(self, trainer: "Trainer", summary: dict) -> None: ...


class TensorBoardCallback(TrainerCallback):
    """Writes every numeric field of the step and eval records to TensorBoard."""

    def __init__(self, log_dir: str | os.PathLike):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(log_dir))

    def _write(self, prefix: str, record: dict) -> None:
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(f"{prefix}/{key}", value, record["step"])

    def on_step_end(self, trainer, record):
        self._write("train", record)

    def on_evaluate(self, trainer, record):
        self._write(record["split"], record["metrics"] | {"step": record["step"]})

    def on_train_end(self, trainer, summary):
        self.writer.close()


# ---------------------------------------------------------------------- helpers
def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


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


def sample_batch_indices(n_examples: int, batch_size: int, seed: int, step: int) -> list[int]:
    """The training batch of ``step`` (0-based): a pure function of (seed, step).

    Sampling without replacement inside a batch, with replacement across batches. Being a pure
    function is what makes ``--resume`` see the same data order as an uninterrupted run.
    """
    rng = np.random.default_rng([seed, step])
    size = min(batch_size, n_examples)
    return rng.choice(n_examples, size=size, replace=False).tolist()


def _score_inputs(examples, is_causal: bool) -> tuple[list[str], list[list[str]], list[int]]:
    """Prompts, candidates and labels to score: the task's candidates (the masked-LM prompt and
    label words for a masked LM), or the gold answer ``answers[0]`` as the only candidate (label 0)
    for generation tasks (teacher forcing)."""
    prompts, candidates, labels = [], [], []
    for ex in examples:
        if ex.candidates is not None:
            prompt, cands = ex.for_lm(is_causal)
            prompts.append(prompt)
            candidates.append(list(cands))
            labels.append(ex.label)
        else:
            if not ex.answers:
                raise ValueError(f"example without candidates or answers cannot be scored: {ex.prompt[:80]!r}")
            if not is_causal:
                raise ValueError("generation examples can only be scored (teacher forcing) by a causal LM")
            prompts.append(ex.prompt)
            candidates.append([ex.answers[0]])
            labels.append(0)
    return prompts, candidates, labels


def _columns(examples) -> dict[str, list]:
    """Per-example columns passed to rewards as keywords: every Example.columns key, plus ``answers``
    (the gold answers, for generation tasks)."""
    keys: list[str] = []
    for ex in examples:
        for k in ex.columns or {}:
            if k not in keys:
                keys.append(k)
    cols = {k: [(ex.columns or {}).get(k) for ex in examples] for k in keys}
    if any(ex.answers is not None for ex in examples):
        cols["answers"] = [ex.answers for ex in examples]
    return cols


def objective_outputs(lm, objective, examples, *, sample_seed=None, max_new_tokens=32,
                      do_sample=False, temperature=1.0):
    """Run the model on ``examples`` and score the result with ``objective`` (no gradients).

    Score-based rewards get the candidates' log-likelihoods (``lm.score``); generation-based ones
    get completions from ``lm.generate`` with ``sample_seed`` (so +eps and -eps see the same
    sampling randomness). Returns the objective's output (``.loss``, ``.components``, ``.sums``,
    ``.counts``).
    """
    prompts = [ex.prompt for ex in examples]
    scores = labels = completions = None
    with torch.no_grad():
        if "scores" in objective.needs and examples:
            score_prompts, candidates, labels = _score_inputs(examples, lm.is_causal)
            scores = lm.score(score_prompts, candidates)
        if "generation" in objective.needs and examples:
            gen_kwargs = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, seed=sample_seed)
            if do_sample:
                gen_kwargs["temperature"] = temperature
            completions = lm.generate(prompts, **gen_kwargs)
    if "scores" in objective.needs and not examples:  # an empty shard (distributed, tiny batch)
        scores, labels = [], []
    if "generation" in objective.needs and not examples:
        completions = []
    if labels is None:
        labels = [ex.label for ex in examples]
    return objective.evaluate(prompts=prompts, completions=completions, candidate_scores=scores,
                              labels=labels, columns=_columns(examples))


def _json_safe(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return _json_safe(obj.item() if obj.numel() == 1 else obj.tolist())
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    return obj


def _write_json(path: pathlib.Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_json_safe(obj), indent=2) + "\n")
    os.replace(tmp, path)


def primary_metric(task, metrics: dict, requested: Optional[str] = None) -> str:
    """The validation metric that picks the best step: ``requested``, else the task's first metric."""
    name = requested or task.metrics[0]
    if name not in metrics:
        raise ValueError(f"metric_for_best={name!r} is not among the evaluation metrics {sorted(metrics)}")
    return name


# ---------------------------------------------------------------------- model building
def parse_max_memory(spec: Optional[str]) -> Optional[dict]:
    """``"0=20GiB,cpu=60GiB"`` -> ``{0: "20GiB", "cpu": "60GiB"}`` (the form accelerate expects)."""
    if not spec:
        return None
    out = {}
    for part in spec.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"--max-memory: cannot read {part!r}; expected DEVICE=SIZE pairs such as '0=20GiB,cpu=60GiB'")
        key = key.strip()
        out[int(key) if key.isdigit() else key] = value.strip()
    return out


def bf16_is_native() -> bool:
    """True where bf16 matrix products run natively (CUDA, or a CPU with AVX512-BF16 or AMX)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    cpu = torch.cpu
    return any(getattr(cpu, name, lambda: False)() for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def build_model(args: TrainingArguments, lm=None):
    """Load the base model (unless ``lm`` is given) and apply the PEFT adapter the arguments ask for."""
    if lm is None:
        from mezo_rl.models import load_model

        lm = load_model(args.model, dtype=args.dtype, device_map=args.device_map,
                        max_memory=parse_max_memory(args.max_memory))
        if args.device_map is not None:
            from mezo_rl.distributed import check_no_offload

            check_no_offload(lm.model)  # weights offloaded to disk cannot be perturbed in place
    if args.peft != "none":
        from mezo_rl.peft import apply_peft

        lm = apply_peft(lm, args.peft, r=args.lora_r, alpha=args.lora_alpha,
                        num_prefix_tokens=args.num_prefix_tokens, seed=args.seed)
    return lm


def load_run(run_dir: str | os.PathLike, step: str | int = "best", lm=None):
    """Rebuild a run's weights: base model (+ adapter) with the first ``step`` trajectory steps replayed.

    ``step`` is ``"best"`` (the best validation step, the default), ``"final"`` or a step number.
    ``lm`` may be a freshly loaded base model to use instead of loading ``model`` from the config
    (tests and in-memory models). Returns ``(lm, args, step_number)``.
    """
    from mezo_rl.trajectory import Trajectory

    run = pathlib.Path(run_dir)
    config_path = run / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{run} is not a mezo-rl run directory (no config.json)")
    args = TrainingArguments.from_dict(json.loads(config_path.read_text()))
    ckpt = run / CHECKPOINT_DIR
    trajectory = Trajectory.load(ckpt / TRAJECTORY_FILE)
    state = json.loads((ckpt / STATE_FILE).read_text())
    if step == "best":
        n = int(state["best_step"])
    elif step == "final":
        n = int(state["step"])
    else:
        n = int(step)
    if not 0 <= n <= len(trajectory):
        raise ValueError(f"step {step!r}: the checkpoint in {run} has steps 0..{len(trajectory)}")
    lm = build_model(args, lm)
    replay_prefix(lm, trajectory, n)
    return lm, args, n


def trajectory_prefix(trajectory, n_steps: int):
    """The first ``n_steps`` rows of a :class:`~mezo_rl.trajectory.Trajectory` (same header)."""
    from mezo_rl.trajectory import Trajectory

    if n_steps == len(trajectory):
        return trajectory
    state = trajectory.state_dict()
    for key in ("seeds", "values", "projected_grads", "lrs", "epss", "status", "calls"):
        state[key] = state[key][:n_steps]
    return Trajectory.from_state_dict(state)


def replay_prefix(lm, trajectory, n_steps: int) -> None:
    """Apply the first ``n_steps`` steps of ``trajectory`` to ``lm``'s trainable parameters in place."""
    from mezo_rl.trajectory import replay_trajectory

    if n_steps == 0:
        return
    replay_trajectory(trainable_parameters(lm.model), trajectory_prefix(trajectory, n_steps))


# ---------------------------------------------------------------------- the trainer
class Trainer:
    """Fine-tunes ``lm`` on ``task`` against ``objective`` with MeZO.

    Everything but ``args`` is optional and built from the arguments when left out::

        args = TrainingArguments(model="smollm2-135m", task="sst2", reward=["accuracy"], steps=200)
        summary = Trainer(args).train()
        print(summary["initial_validation"], summary["validation"], summary["test"])

    ``lm``: a :class:`mezo_rl.lm.LanguageModel` (the base model; the PEFT adapter, if any, is applied
    here). ``task``: a ``tasks`` Task. ``objective``: a ``rewards.Objective`` (default: built from
    ``args.reward`` / ``reward_weights`` / ``reward_normalize``). ``splits``: pre-loaded examples
    ``{"train": [...], "validation": [...], "test": [...]}`` instead of loading them from the task.
    ``lm_factory``: a zero-argument callable returning a fresh base model; used to rebuild the
    best weights at the end (default: ``load_model(args.model)``).
    """

    def __init__(self, args: TrainingArguments, *, lm=None, task=None, objective=None, splits=None,
                 lm_factory: Optional[Callable[[], Any]] = None, callbacks: Optional[list[TrainerCallback]] = None,
                 dist=None):
        from mezo_rl.distributed import DistContext

        self.args = args
        self.dist = dist if dist is not None else DistContext.from_env()
        self.hparams = args.hyperparameters()
        self.output_dir = pathlib.Path(args.output_dir)
        self.lm_factory = lm_factory
        if task is None:
            from tasks import get_task

            task = get_task(args.task)
        self.task = task
        if objective is None:
            from rewards import build_objective

            objective = build_objective(list(args.reward), weights=args.reward_weights, normalize=args.reward_normalize)
        self.objective = objective
        self.splits = splits if splits is not None else self._load_splits()
        for split in ("train", "validation", "test"):
            if split not in self.splits:
                raise ValueError(f"splits must hold 'train', 'validation' and 'test'; missing {split!r}")
        if not self.splits["train"]:
            raise ValueError(f"task {args.task!r}: the train split is empty")
        self.lm = build_model(args, lm)
        self._check_objective()
        self.callbacks = list(callbacks or [])
        if args.tensorboard and self.dist.is_main:
            self.callbacks.append(TensorBoardCallback(self.output_dir / "tensorboard"))
        self.optimizer = self._make_optimizer()
        from mezo_rl.optim import get_scheduler

        self.scheduler = get_scheduler(args.lr_scheduler, self.optimizer, max(args.steps, 1))
        self.step = 0
        self.best_step = 0
        self.best_value: Optional[float] = None
        self.best_validation: Optional[dict] = None
        self.initial_validation: Optional[dict] = None
        self.initial_test: Optional[dict] = None
        self.last_validation: Optional[dict] = None
        self.elapsed_before_resume = 0.0
        self.trajectory = None  # the run's Trajectory, set when training ends (also opt.trajectory while training)
        self._components: list = []

    # -------------------------------------------------------------- setup
    def _load_splits(self) -> dict:
        a = self.args
        data_dir = a.data_dir or os.environ.get("MEZO_RL_DATA")
        return {
            "train": self.task.load_split("train", data_dir=data_dir, n=a.num_train, seed=a.seed),
            "validation": self.task.load_split("validation", data_dir=data_dir, n=a.num_eval, seed=a.seed),
            "test": self.task.load_split("test", data_dir=data_dir, n=a.num_test, seed=a.seed),
        }

    def _check_objective(self) -> None:
        """Fail before training if the rewards do not fit the task's columns/kind or the model."""
        self.objective.check_columns(_columns(self.splits["train"]), task_kind=self.task.kind)
        self.objective.check_compatible(bool(self.lm.is_causal))

    def _make_optimizer(self):
        from mezo_rl.optim import MeZO

        a, h = self.args, self.hparams
        return MeZO(param_groups(self.lm.model, h["weight_decay"]), lr=h["lr"], eps=h["eps"],
                    weight_decay=h["weight_decay"], n_spsa=a.n_spsa, noise=a.noise, estimator=a.estimator,
                    momentum=a.momentum, adam=a.adam, seed=a.seed, on_nonfinite=a.on_nonfinite)

    def _autocast(self):
        mode = self.args.autocast
        enabled = mode == "bfloat16" or (mode == "auto" and bf16_is_native())
        return torch.autocast(self.lm.device.type, dtype=torch.bfloat16, enabled=enabled)

    # -------------------------------------------------------------- loss
    def compute_loss(self, examples, sample_seed: Optional[int] = None):
        """The objective's loss on ``examples`` (this rank's shard, all-reduced across ranks).

        Returns ``(loss, out)`` where ``out`` is this rank's objective output. Every rank gets the
        same loss, hence the same update.
        """
        a = self.args
        local = self.dist.shard(examples)
        with self._autocast():
            out = objective_outputs(self.lm, self.objective, local, sample_seed=sample_seed,
                                    max_new_tokens=a.max_new_tokens, do_sample=a.do_sample,
                                    temperature=a.temperature)
        keys = self.objective.names  # the same order on every rank
        n = len(keys)
        local_stats = [out.sums[k] for k in keys] + [out.sq_sums[k] for k in keys] + [out.counts[k] for k in keys]
        total = [float(x) for x in self.dist.all_reduce_sum(local_stats)]
        sums, sq_sums, counts = (dict(zip(keys, total[i * n:(i + 1) * n])) for i in range(3))
        self._components.append({k: sums[k] / counts[k] for k in keys if counts[k]})
        return float(self.objective.loss_from(sums, counts, sq_sums)), out

    def training_step(self) -> dict:
        """One MeZO step on the batch of ``self.step``; returns the metrics.jsonl record."""
        a = self.args
        train = self.splits["train"]
        batch = [train[i] for i in sample_batch_indices(len(train), a.batch_size, a.seed, self.step)]
        sample_seed = int(np.random.default_rng([a.seed, self.step, 1]).integers(2**31 - 1))
        self._components = []  # global (all-reduced) component means of each closure call
        bytes_before = self.dist.bytes_communicated

        def closure():
            return self.compute_loss(batch, sample_seed)[0]

        lr = self.optimizer.param_groups[0]["lr"]
        t0 = time.perf_counter()
        res = self.optimizer.step(closure)
        self.scheduler.step()
        self.step += 1
        record = {
            "step": self.step,
            "loss": _num(res.loss),
            "loss_plus": _num(res.loss_plus),
            "loss_minus": _num(res.loss_minus),
            "projected_grad": _num(res.projected_grads),
            "lr": lr,
            "skipped": bool(getattr(res, "skipped", False)),
        }
        # reward components averaged over the closure calls of this step (+eps and -eps), all ranks
        comps: dict[str, list[float]] = {}
        for means in self._components:
            for k, v in means.items():
                comps.setdefault(k, []).append(v)
        record.update({f"reward/{k}": sum(v) / len(v) for k, v in comps.items()})
        record["bytes_communicated"] = self.dist.bytes_communicated - bytes_before
        record["seconds"] = time.perf_counter() - t0
        record["peak_rss_mb"] = peak_rss_mb()
        return record

    # -------------------------------------------------------------- evaluation
    def evaluate(self, split: str = "validation") -> dict:
        """Task metrics of the current weights on ``split`` (``mezo_rl.evaluation.evaluate``)."""
        from mezo_rl.evaluation import evaluate

        with self._autocast():
            metrics = evaluate(self.lm, self.task, self.splits[split], batch_size=self.args.eval_batch_size,
                               max_new_tokens=self.args.max_new_tokens)
        return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}

    def _record_eval(self, split: str, metrics: dict, seconds: float) -> dict:
        record = {"step": self.step, "split": split, "metrics": metrics, "seconds": seconds,
                  "wall_time_s": self.wall_time(), "peak_rss_mb": peak_rss_mb()}
        self._log(record)
        for cb in self.callbacks:
            cb.on_evaluate(self, record)
        return record

    def _validate(self) -> dict:
        t0 = time.perf_counter()
        metrics = self.evaluate("validation")
        name = primary_metric(self.task, metrics, self.args.metric_for_best)
        value = metrics[name]
        self.last_validation = metrics
        if self.best_value is None or value > self.best_value:
            self.best_value, self.best_step, self.best_validation = value, self.step, metrics
        self._record_eval("validation", metrics, time.perf_counter() - t0)
        return metrics

    # -------------------------------------------------------------- files
    def wall_time(self) -> float:
        return self.elapsed_before_resume + (time.perf_counter() - self._t_start)

    def _log(self, record: dict) -> None:
        if self.dist.is_main:
            with open(self.output_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(_json_safe(record)) + "\n")

    def model_identity(self) -> dict:
        """What the checkpoint needs besides the trajectory: the base model and the adapter."""
        from importlib.metadata import version

        identity = {"model": self.args.model, "dtype": self.args.dtype, "peft": None,
                    "parameters": sum(p.numel() for p in trainable_parameters(self.lm.model)),
                    "transformers": version("transformers"), "torch": torch.__version__}
        if self.args.peft != "none":
            from mezo_rl.peft import peft_config

            identity["peft"] = peft_config(self.lm)
        return identity

    def save_checkpoint(self) -> None:
        """Write checkpoint/ (base identity + trajectory + trainer state); main rank only."""
        if not self.dist.is_main:
            return
        ckpt = self.output_dir / CHECKPOINT_DIR
        ckpt.mkdir(parents=True, exist_ok=True)
        _write_json(ckpt / MODEL_FILE, self.model_identity())
        tmp = ckpt / (TRAJECTORY_FILE + ".tmp")
        self.optimizer.trajectory.save(tmp)
        os.replace(tmp, ckpt / TRAJECTORY_FILE)
        # the optimizer's counters and schedule (tiny for plain MeZO; momentum/Adam add their
        # parameter-sized buffers here, which is what resuming those variants costs)
        tmp = ckpt / (OPTIMIZER_FILE + ".tmp")
        torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}, tmp)
        os.replace(tmp, ckpt / OPTIMIZER_FILE)
        _write_json(ckpt / STATE_FILE, {
            "step": self.step, "best_step": self.best_step, "best_value": self.best_value,
            "best_validation": self.best_validation, "initial_validation": self.initial_validation,
            "initial_test": self.initial_test, "last_validation": self.last_validation,
            "wall_time_s": self.wall_time(), "objective": self.objective.state_dict(),
        })

    def _resume(self) -> None:
        """Restore a run from its checkpoint: replay the trajectory, restore optimizer and best step."""
        ckpt = self.output_dir / CHECKPOINT_DIR
        if not (ckpt / STATE_FILE).is_file():
            raise FileNotFoundError(f"--resume: no checkpoint in {ckpt} (start the run without --resume)")
        saved = json.loads((self.output_dir / "config.json").read_text())
        mine = self.args.to_dict()
        ignore = {"resume", "steps", "progress", "tensorboard", "save_model", "eval_steps", "logging_steps"}
        differ = {k: (saved.get(k), mine[k]) for k in mine if k not in ignore and saved.get(k) != mine[k]}
        if differ:
            raise ValueError(f"--resume: the arguments differ from the run in {self.output_dir}: "
                             + ", ".join(f"{k}: saved {s!r} vs now {m!r}" for k, (s, m) in differ.items()))
        state = json.loads((ckpt / STATE_FILE).read_text())
        saved_opt = torch.load(ckpt / OPTIMIZER_FILE, weights_only=False)
        self.optimizer.load_state_dict(saved_opt["optimizer"])
        self.scheduler.load_state_dict(saved_opt["scheduler"])
        if len(self.optimizer.trajectory) != state["step"]:
            raise ValueError(f"--resume: the checkpoint in {ckpt} is inconsistent (trajectory has "
                             f"{len(self.optimizer.trajectory)} steps, trainer state {state['step']})")
        replay_prefix(self.lm, self.optimizer.trajectory, state["step"])
        self.step = state["step"]
        self.best_step, self.best_value = state["best_step"], state["best_value"]
        self.best_validation, self.initial_validation = state["best_validation"], state["initial_validation"]
        self.initial_test, self.last_validation = state["initial_test"], state["last_validation"]
        self.elapsed_before_resume = state["wall_time_s"]
        self.objective.load_state_dict(state["objective"])
        # drop log records beyond the checkpoint so metrics.jsonl reads like an uninterrupted run
        path = self.output_dir / "metrics.jsonl"
        if path.is_file() and self.dist.is_main:
            records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            kept = [json.dumps(r) for r in records
                    if r["step"] <= self.step and not (r.get("split") == "test" and r["step"] > 0)]
            path.write_text("".join(line + "\n" for line in kept))

    def _restore_best(self) -> None:
        """Put the best step's weights in ``self.lm`` (replay of the trajectory prefix on a fresh base)."""
        if self.best_step == self.step:
            return
        # free the trained model first (the optimizer holds its parameters): never two models at once
        self.optimizer = self.scheduler = None
        del self.lm
        gc.collect()
        fresh = self.lm_factory() if self.lm_factory is not None else None
        self.lm = build_model(self.args, fresh)
        replay_prefix(self.lm, self.trajectory, self.best_step)

    # -------------------------------------------------------------- main loop
    def train(self) -> dict:
        """Run the training loop; returns (and writes) the summary."""
        from tqdm.auto import tqdm

        a = self.args
        self._t_start = time.perf_counter()
        if self.dist.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
        if a.resume:
            self._resume()
        else:
            if self.dist.is_main:
                (self.output_dir / "metrics.jsonl").write_text("")
                _write_json(self.output_dir / "config.json", a.to_dict())
        # replicas must start from identical weights (a cheap checksum; a no-op in one process)
        # (all of them: with LoRA/prefix the frozen base must match too)
        self.dist.check_same_weights(list(self.lm.model.named_parameters()))
        for cb in self.callbacks:
            cb.on_train_begin(self)
        if self.initial_validation is None:
            self.initial_validation = self._validate()
            if a.initial_test and self.splits["test"]:
                t0 = time.perf_counter()
                self.initial_test = self.evaluate("test")
                self._record_eval("test", self.initial_test, time.perf_counter() - t0)
            self.save_checkpoint()
        eval_steps = a.resolved_eval_steps()
        bar = tqdm(total=a.steps, initial=self.step, disable=not (a.progress and self.dist.is_main),
                   desc="mezo", dynamic_ncols=True)
        running = None
        try:
            while self.step < a.steps:
                record = self.training_step()
                if self.step % a.logging_steps == 0 or self.step == a.steps:
                    self._log(record)
                for cb in self.callbacks:
                    cb.on_step_end(self, record)
                reward = next((v for k, v in record.items() if k.startswith("reward/")), None)
                if reward is not None:
                    running = reward if running is None else 0.9 * running + 0.1 * reward
                bar.set_postfix(loss=f"{record['loss']:.4f}", reward=f"{running:.4f}" if running is not None else "-")
                bar.update(1)
                if self.step % eval_steps == 0 or self.step == a.steps:
                    self._validate()
                    self.save_checkpoint()
        finally:
            bar.close()
        self.save_checkpoint()
        self.trajectory = self.optimizer.trajectory
        final_step = self.step
        self._restore_best()
        t0 = time.perf_counter()
        test = self.evaluate("test") if self.splits["test"] else {}
        self._record_eval("test", test, time.perf_counter() - t0)
        if a.save_model and self.dist.is_main:
            self.save_model(self.output_dir / "model")
        summary = {
            "initial_validation": self.initial_validation,
            "validation": self.best_validation,
            "test": test,
            "initial_test": self.initial_test,
            "final_validation": self.last_validation,
            "best_step": self.best_step,
            "steps": final_step,
            "wall_time_s": self.wall_time(),
            "peak_rss_mb": peak_rss_mb(),
            "metric_for_best": primary_metric(self.task, self.initial_validation, a.metric_for_best),
            "trainable_parameters": sum(p.numel() for p in trainable_parameters(self.lm.model)),
        }
        summary["metrics"] = {f"{split}/{k}": v for split in ("initial_validation", "validation", "test",
                                                              "initial_test", "final_validation")
                              for k, v in (summary[split] or {}).items()}
        if self.dist.is_main:
            _write_json(self.output_dir / "summary.json", summary)
        for cb in self.callbacks:
            cb.on_train_end(self, summary)
        return summary

    def save_model(self, out_dir: str | os.PathLike) -> None:
        """Write the current weights with ``save_pretrained`` (plus the tokenizer); with PEFT, a LoRA
        adapter merged into the weights, a prefix adapter as adapter files (``mezo_rl.peft.export_model``)."""
        out_dir = pathlib.Path(out_dir)
        if self.args.peft != "none":
            from mezo_rl.peft import export_model

            export_model(self.lm, out_dir, merged=self.args.peft == "lora")
        else:
            self.lm.model.save_pretrained(out_dir)
            self.lm.tokenizer.save_pretrained(out_dir)


def _num(x):
    """A float from a float / 0-d tensor / one-element list (the engine reports lists per SPSA sample)."""
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        vals = [_num(v) for v in x]
        return vals[0] if len(vals) == 1 else sum(vals) / len(vals)
    if isinstance(x, torch.Tensor):
        return float(x.float().mean())
    return float(x)
