"""The trainer: task + LanguageModel + objective + MeZO, with evaluation, logging and checkpoints.

One training step (Algorithm 1 of Malladi et al., 2023):

1. sample a batch of training examples (a pure function of ``(seed, step)``, so a resumed run sees
   exactly the batches an uninterrupted one would);
2. the closure scores (or generates for) that batch and returns the objective's output for each
   member the engine hands it (:class:`mezo_rl.engine.population.Members`): one at a time, the parameters
   perturbed in place by ``+eps*z`` and ``-eps*z``, or all at once in a member-batched pass (same
   batch, and for sampled generation the same sampling seed); the engine then hands every member's output to
   the run's fitness (:mod:`mezo_rl.training.fitness`), which all-reduces their statistics and forms
   each member's loss; the engine applies ``-lr * projected_grad * z`` in place;
3. every ``eval_steps`` steps the model is evaluated on the validation examples and the best step
   is remembered (a tie goes to the later step). At the end the final weights, or with
   ``load_best_model_at_end`` the best step's (the first ``best_step`` steps of the trajectory, replayed
   from the base model), are evaluated on the test examples.

Arguments: :mod:`mezo_rl.training.arguments`; the run they describe, resolved once: :mod:`mezo_rl.training.plan`;
what the plan says to build: :mod:`mezo_rl.training.setup`; the run directory and checkpoint: :mod:`mezo_rl.training.rundir`;
examples -> model outputs -> objective: :mod:`mezo_rl.training.outputs`; hooks: :mod:`mezo_rl.training.callbacks`;
the trainer's checkpoint and resume: :mod:`mezo_rl.training.checkpointing`; its saving and publishing, transformers'
names: :mod:`mezo_rl.training.publishing`.
"""
from __future__ import annotations

import json
import math
import pathlib
import resource
import time
import warnings
from typing import Any, Callable, Optional

import numpy as np
import torch

from mezo_rl.model.dropout import step_dropout
from mezo_rl.errors import ConfigError
from mezo_rl.training import rundir
from mezo_rl.training.arguments import MeZOConfig, data_task_options
from mezo_rl.training.config import resume_path
from mezo_rl.training.checkpointing import Checkpointing
from mezo_rl.training.callbacks import CallbackHandler, ProgressCallback, TrainerCallback, TrainerControl
from mezo_rl.training.distributed import DistContext
from mezo_rl.training.evaluation import evaluate
from mezo_rl.training.fitness import RewardsSilentError
from mezo_rl.training.kl import completion_kl, member_kls
from mezo_rl.tasks import completion_stops
from mezo_rl.training.outputs import autocast, objective_outputs, prompt_texts
from mezo_rl.training.plan import RunPlan, plan_given, resumed
from mezo_rl.training.rundir import TrainerState
from mezo_rl.training.model_card import check_hub
from mezo_rl.training.publishing import Publishing
from mezo_rl.training.reporting import (completion_stats, completions_table, eval_logs, eval_metrics, log_table,
                                        reporters, train_logs, write_completions_table)
from mezo_rl.training.runguard import InterruptGuard, TrainingInterrupted
from mezo_rl.training.setup import build_optimizer, build_run, trainable_parameters
from mezo_rl.training.trl_rewards import RewardContext, with_trl_keywords
from mezo_rl.tasks.user import data_task, is_dataset_object

#: a run warns once when its low-precision weights kept less than KEPT_LOW of the intended update, on average over
#: KEPT_WINDOW steps (StepResult.update_kept)
KEPT_WINDOW, KEPT_LOW = 20, 0.5

__all__ = ["MeZOTrainer", "TrainingInterrupted", "RewardsSilentError", "sample_batch_indices", "primary_metric", "peak_rss_mb"]


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def sample_batch_indices(n_examples: int, batch_size: int, seed: int, step: int) -> list[int]:
    """The training batch of ``step`` (0-based): a pure function of (seed, step).

    Sampling without replacement inside a batch, with replacement across batches. Being a pure
    function is what makes ``--resume`` see the same data order as an uninterrupted run.
    """
    rng = np.random.default_rng([seed, step])
    return rng.choice(n_examples, size=min(batch_size, n_examples), replace=False).tolist()


def primary_metric(metrics: dict, name: str) -> str:
    """``name``, checked against an evaluation's metrics (one line naming those it has)."""
    if name not in metrics:
        raise ConfigError(f"metric_for_best_model={name!r} is not among the evaluation metrics {sorted(metrics)}")
    return name


def _num(x):
    """A float from a float / 0-d tensor / list (the engine reports lists per SPSA sample: their mean)."""
    if isinstance(x, (list, tuple)):
        vals = [_num(v) for v in x]
        return vals[0] if len(vals) == 1 else sum(vals) / len(vals)
    return None if x is None else float(x.float().mean()) if isinstance(x, torch.Tensor) else float(x)


class MeZOTrainer(Checkpointing, Publishing):
    """Fine-tunes a model against rewards with MeZO; shaped like TRL's ``GRPOTrainer`` and transformers' ``Trainer``::

        trainer = MeZOTrainer(model="smollm2-135m", reward_funcs=reward_len, train_dataset=dataset,
                              args=MeZOConfig(output_dir="out", learning_rate=1e-1))
        out = trainer.train()       # transformers' TrainOutput(global_step, training_loss, metrics)
        trainer.evaluate()          # {"eval_<metric>": ...}
        trainer.save_model()        # a from_pretrained directory with its model card, in args.output_dir

    ``model`` (a short name, hub id or path, or a ``PreTrainedModel`` with ``processing_class``, its
    tokenizer), ``reward_funcs`` (callables, registered names, ``module:function`` paths, or
    sequence-classification reward models with ``reward_processing_classes``), ``train_dataset`` /
    ``eval_dataset`` (``datasets`` objects or a path) and ``peft_config`` (a ``peft.LoraConfig``) are what
    ``GRPOTrainer`` takes (:func:`mezo_rl.training.plan.resolve_inputs`); each left out comes from ``args`` (a
    :class:`~mezo_rl.training.arguments.MeZOConfig`). ``callbacks``: Hugging Face callbacks
    (:mod:`mezo_rl.training.callbacks`); ``trainer.state`` is a
    :class:`~mezo_rl.training.rundir.TrainerState` (``global_step``, ``log_history``, ``best_metric``, ...).

    Keywords for what is already built: ``lm``, a :class:`mezo_rl.model.lm.LanguageModel` (the base model;
    the PEFT adapter, if any, is applied here); ``task``, a ``mezo_rl.tasks`` Task; ``objective``, a
    ``mezo_rl.rewards.Objective``; ``splits``, pre-loaded examples ``{"train": [...], "validation": [...],
    "test": [...]}``; ``lm_factory``, a zero-argument callable returning a fresh base model, used to rebuild
    the best weights at the end (default: ``load_model(args.model)``).
    """

    def __init__(self, model=None, reward_funcs=None, args: Optional[MeZOConfig] = None, train_dataset=None,
                 eval_dataset=None, processing_class=None, reward_processing_classes=None,
                 callbacks: Optional[list[TrainerCallback]] = None, optimizers=(None, None), quantization_config=None,
                 peft_config=None, *,
                 lm=None, task=None, objective=None, splits=None, lm_factory: Optional[Callable[[], Any]] = None,
                 dist=None, plan: Optional[RunPlan] = None):
        t_init = time.perf_counter()
        if isinstance(model, MeZOConfig):
            raise ConfigError("MeZOTrainer's first argument is the model; give the configuration as args=MeZOConfig(...)")
        if any(o is not None for o in optimizers):
            raise ConfigError("optimizers: MeZO is the optimizer (its variants are MeZOConfig fields: estimator, "
                              "momentum, adam; the schedule: lr_scheduler_type, warmup_steps); leave it out")
        if quantization_config is not None:
            raise ConfigError("quantization_config: MeZO perturbs the weights in place by eps * z, which quantised "
                              "weights cannot hold; load the model in float32 or bfloat16 (dtype)")
        if plan is None:  # the run resolved once, from what this constructor was given (mezo_rl.training.plan)
            plan, lm, lm_factory = plan_given(args, model, reward_funcs, train_dataset, eval_dataset, processing_class,
                                              peft_config, reward_processing_classes, lm=lm, task=task,
                                              objective=objective, lm_factory=lm_factory)
        self.plan, self.args, self.lm_factory = plan, plan.args, lm_factory
        args, self.task, self.objective = plan.args, plan.task, plan.objective
        self.not_replayable = list(plan.not_replayable)  # why config.json alone cannot repeat this run (if it cannot)
        self.metric_for_best, self.greater_is_better = plan.metric_for_best, plan.greater_is_better
        self.dist = dist if dist is not None else DistContext.from_env()
        self.output_dir = pathlib.Path(args.output_dir)
        # push_to_hub: the repository, the token and the network, before any data or model loads (one line)
        self.hub_repo_id = args.hub_model_id or self.output_dir.absolute().name  # as transformers names the repository
        self.hub_repo = check_hub(self.hub_repo_id, private=args.hub_private_repo, token=args.hub_token) \
            if args.push_to_hub and self.dist.is_main else None
        self.reward_context = RewardContext()  # TRL's reward keywords: completion_ids, trainer_state, log_*
        with_trl_keywords(self.objective, self.reward_context)
        # what the plan says, built in order, each once: the examples, the model, the reference of kl and --beta,
        # a member's loss
        self.splits, self.lm, self.start, self.fitness = build_run(plan, lm, splits, self.dist)
        # MeZO and its schedule: built on first use (create_optimizer_and_scheduler), as transformers' Trainer
        # builds its optimizer in train(), once a resume has told which member evaluation the run keeps
        self._optimizer = self._scheduler = None
        self._recent_kept, self._warned_kept = [], False  # the last steps' update_kept; warned once
        self._released = False  # the optimizer was let go for the best step's weights (_restore_best)
        self._best_loaded = False  # the weights in self.lm are the best step's (load_best_model_at_end), not the last
        self._step_table: list = []
        self.sampling = args.sampling()  # how a step's completions are decoded (temperature, top_p, top_k, ...)  # the last step's completions table (log_completions), logged at a logging step
        self.callback_handler = CallbackHandler(callbacks or [])
        if self.dist.is_main:  # the loggers and the progress bar on the main process only
            for reporter in reporters(plan.report_to):
                self.callback_handler.add(reporter)
            if args.progress:
                self.callback_handler.add(ProgressCallback())
        self.callbacks = self.callback_handler.callbacks
        self.control = TrainerControl()
        # as transformers' Trainer: the process's rank now, the run's step settings when training begins (train)
        self.state = TrainerState(is_local_process_zero=self.dist.is_main, is_world_process_zero=self.dist.is_main)
        self.trajectory = None  # the run's Trajectory, set when training ends (also opt.trajectory while training)
        self._t_start = time.perf_counter()
        self._guard = InterruptGuard()  # inactive (no signal handlers) outside train()
        # where this process's time goes (the summary's time_s): the setup (data, model, optimizer), the frozen
        # trunk (--peft norm), the steps and the evaluations
        self.seconds = {"load": time.perf_counter() - t_init, "trunk": 0.0, "steps": 0.0, "evaluations": 0.0}
        self.reward_context.trainer = self
        self._event("on_init_end")

    @property
    def step(self) -> int:
        return self.state.global_step

    def create_optimizer_and_scheduler(self, num_training_steps: Optional[int] = None) -> tuple:
        """MeZO over the trainable tensors with the plan's options, and its lr schedule over ``args.max_steps``
        (``num_training_steps`` is transformers' argument; the plan has decided it); built once, on first use.
        A resumed run keeps the member evaluation its checkpoint ran with."""
        if self._optimizer is None and not self._released:
            t0, recorded = time.perf_counter(), self.plan.resumed
            self._optimizer, self._scheduler = build_optimizer(self.args, self.lm, self.objective.needs, self.splits["train"],
                                                               recorded.member_evaluation if recorded is not None else None)
            self.seconds["load"] += time.perf_counter() - t0
        return self._optimizer, self._scheduler

    @property
    def optimizer(self):
        """The run's :class:`~mezo_rl.engine.optim.MeZO` (built on first use)."""
        return self.create_optimizer_and_scheduler()[0]

    @property
    def scheduler(self):
        """The lr schedule of :attr:`optimizer` (built with it)."""
        return self.create_optimizer_and_scheduler()[1]

    def _run_state(self, state: TrainerState) -> TrainerState:
        """``state`` (this trainer's, or a checkpoint's) with this run's step settings and this process's rank."""
        a = self.args
        state.max_steps, state.logging_steps, state.eval_steps = a.max_steps, a.logging_steps, a.eval_steps
        state.save_steps, state.train_batch_size = a.save_steps or a.eval_steps, a.per_device_train_batch_size
        state.num_train_epochs = a.num_train_epochs or 0
        state.is_world_process_zero = state.is_local_process_zero = self.dist.is_main
        if state.best_model_checkpoint:  # saved relative to the run directory
            state.best_model_checkpoint = str(self.output_dir / rundir.CHECKPOINT_DIR)
        return state

    @property
    def model(self):
        """The ``PreTrainedModel`` being trained (after :meth:`train`: the best step's weights)."""
        return self.lm.model

    @property
    def processing_class(self):
        return self.lm.tokenizer

    def add_callback(self, callback) -> None:
        """Add a callback (an instance, or a class to instantiate), as ``transformers.Trainer.add_callback``."""
        self.callback_handler.add(callback)

    def _event(self, event: str, **kwargs) -> TrainerControl:
        """Call every callback's ``event`` with (args, state, control) and the trainer's objects."""
        lm = getattr(self, "lm", None)
        self.control = self.callback_handler.call(
            event, self.args, self.state, self.control, trainer=self, model=lm.model if lm is not None else None,
            processing_class=lm.tokenizer if lm is not None else None, optimizer=getattr(self, "_optimizer", None),
            lr_scheduler=getattr(self, "_scheduler", None), **kwargs)
        return self.control

    # -------------------------------------------------------------- loss and step
    def member_losses(self, outcomes) -> tuple[list[float], dict]:
        """The fitness of a step: every member's loss from the members' outputs on this rank, and the step's
        reward statistics (:class:`mezo_rl.training.fitness.Fitness`, the one place a member's loss is formed)."""
        return self.fitness(outcomes, self.step)

    def member_outcomes(self, examples, members=None, sample_seed: Optional[int] = None,
                        written: Optional[dict] = None, dropout_seed: Optional[int] = None) -> list:
        """The members' evaluations: this rank's shard of ``examples`` through the model and the objective,
        ``--num-generations`` completions per prompt; one ``rewards.ObjectiveOutput`` per member (per-example
        values; sums, squares and counts for the all-reduce). ``members``: what the engine handed the step's
        closure (:class:`mezo_rl.engine.population.Members`): all of a step's members, from one member-batched
        pass (the weights stay in place), or the one member the weights in place are; None: the weights in place
        (a list of one). With ``--beta`` each output also carries ``kl``: the summed per-token KL to the starting
        model over the completions its sample's first member wrote (a pair's: the + member's; ``written``,
        {sample: texts}, keeps them across the step's calls). ``dropout_seed``: a training step's
        (``--lora-dropout``): the LoRA dropout masks, the same for every member
        (:func:`mezo_rl.model.dropout.step_dropout`); None: no dropout."""
        a, shard = self.args, self.dist.shard(examples)
        batched = members is not None and members.batched
        with self._guard.interruptible(), autocast(a.autocast, self.lm.device.type), \
                step_dropout(self.lm.model, dropout_seed, len(members) if batched else 1):
            outcomes = objective_outputs(self.lm, self.objective, shard, members if batched else None,
                                         sample_seed=sample_seed, max_new_tokens=a.max_completion_length,
                                         do_sample=a.do_sample, sampling=self.sampling,
                                         num_generations=a.num_generations, stop=completion_stops(self.task, a.stop))
            outcomes = outcomes if batched else [outcomes]
            if a.beta:
                # the two members of a pair (+s, -s) score their KL on the same texts, as they score the same batch:
                # the difference of a smooth function of the weights, where over each member's own completions it
                # would be that of two different texts (noise far above the KL's gradient near the start, zero there)
                samples = [0] if members is None else [m.sample for m in members]
                written = {} if written is None else written
                for k, out in zip(samples, outcomes):
                    written.setdefault(k, out.texts)
                prompts = prompt_texts(self.lm, [shard[g] for g in outcomes[0].groups])
                texts = [written[k] for k in samples]
                # batched: both models' logits read within the step's pass, the start's with the members paused
                kls = member_kls(self.lm, self.start, prompts, texts, unperturbed=members.paused) if batched \
                    else [completion_kl(self.lm, self.start, prompts, texts[0])]
                for out, kl in zip(outcomes, kls):
                    out.kl = kl
        return outcomes

    def training_step(self) -> dict:
        """One MeZO step on the batch of ``self.step``; returns the metrics.jsonl record."""
        a, train = self.args, self.splits["train"]
        batch = [train[i] for i in sample_batch_indices(len(train), a.prompts_per_step, a.seed, self.step)]
        sample_seed = int(np.random.default_rng([a.seed, self.step, 1]).integers(2**31 - 1))
        dropout_seed = int(np.random.default_rng([a.seed, self.step, 2]).integers(2**31 - 1))  # LoRA dropout's masks
        rewards_logged: dict = {}
        self.reward_context.take_metrics(), self.reward_context.take_extra()  # this step's logs only (log_extra:
        # a training batch's columns are not kept; an evaluation's go to its samples)

        def fitness(outcomes):
            losses, record = self.member_losses(outcomes)
            rewards_logged.update(record)
            rewards_logged.update(completion_stats(self.objective, outcomes, self.lm.tokenizer,  # TRL's step keys
                                                   a.max_completion_length))
            # TRL's completions table: the step's first member's (the +eps probe's) completions
            self._step_table = completions_table(self.objective, outcomes[0], self.step + 1, a.log_completions)
            rewards_logged.update(self.reward_context.take_metrics())  # what the rewards logged (log_metric)
            return losses

        bytes_before, lr, t0 = self.dist.bytes_communicated, self.optimizer.param_groups[0]["lr"], time.perf_counter()
        written: dict = {}  # each sample's first member's completions, this step (the KL's texts)

        def closure(members):  # the engine's members: one in place, all of the step batched
            return self.member_outcomes(batch, members, sample_seed, written, dropout_seed)
        res = self.optimizer.step(closure, fitness=fitness)
        self.scheduler.step()
        self.state.global_step += 1
        self.state.epoch = self.step * len(batch) / len(train)
        if "step_tokens" in rewards_logged:  # TRL's num_tokens: the prompt and completion tokens read so far
            self.state.num_input_tokens_seen += int(rewards_logged.pop("step_tokens"))
            rewards_logged["num_tokens"] = float(self.state.num_input_tokens_seen)
        # the step's losses as the engine reports them, or as the fitness's record has them before it normalised
        record = {"step": self.step, "loss": _num(res.loss), "loss_plus": _num(res.loss_plus),
                  "loss_minus": _num(res.loss_minus), "projected_grad": _num(res.projected_grads), "lr": lr,
                  "skipped": bool(res.skipped), **rewards_logged}
        self.state.loss_sum += record["loss"] if record["loss"] is not None and math.isfinite(record["loss"]) else 0.0
        if res.update_kept is not None:
            record["update_kept"] = res.update_kept
            self._watch_update_kept(res.update_kept)
        record.update(bytes_communicated=self.dist.bytes_communicated - bytes_before,
                      seconds=time.perf_counter() - t0, peak_rss_mb=peak_rss_mb())
        return record

    def _watch_update_kept(self, kept: float) -> None:
        """Sum the share of the update the low-precision weights kept, and warn once when its mean over the last
        :data:`KEPT_WINDOW` steps stays below :data:`KEPT_LOW`: rounding is eating the update."""
        self.state.update_kept_sum += kept
        self.state.update_kept_steps += 1
        self._recent_kept = [*self._recent_kept[-(KEPT_WINDOW - 1):], kept]
        mean = sum(self._recent_kept) / len(self._recent_kept)
        if len(self._recent_kept) == KEPT_WINDOW and mean < KEPT_LOW and not self._warned_kept:
            self._warned_kept = True
            dtype = str(next(self.lm.model.parameters()).dtype).removeprefix("torch.")
            warnings.warn(f"the {dtype} weights kept {mean:.2f} of the intended update over the last {KEPT_WINDOW} "
                          f"steps (--rounding {self.args.rounding}): rounding is eating it; use --rounding stochastic, "
                          "a larger --learning-rate or --dtype float32", stacklevel=2)

    # -------------------------------------------------------------- evaluation
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict:
        """The current weights' metrics on the validation examples, or on ``eval_dataset`` (a ``datasets``
        object read with the run's data options, or a list of ``Example``), as transformers' ``Trainer.evaluate``
        returns them: every key prefixed ``<metric_key_prefix>_`` (``eval_accuracy``), a prompt task's under TRL's
        names (``eval_reward``, ``eval_rewards/<function name>/mean``; ``mezo_rl.training.reporting.metric_key``),
        with ``<prefix>_runtime``; callbacks get ``on_evaluate``."""
        examples, split = self.splits["validation"], "validation"
        if eval_dataset is not None:
            examples, split = self._examples_of(eval_dataset), metric_key_prefix
        t0 = time.perf_counter()
        metrics = eval_metrics(self._metrics(examples, split), self.objective.names, metric_key_prefix)
        logs = {k: v for k, v in metrics.items() if k[len(metric_key_prefix) + 1:] not in (ignore_keys or ())}
        logs[f"{metric_key_prefix}_runtime"] = time.perf_counter() - t0
        self._event("on_evaluate", metrics=logs)
        return logs

    def _examples_of(self, dataset) -> list:
        if isinstance(dataset, (list, tuple)):
            return list(dataset)
        if not is_dataset_object(dataset):
            raise ConfigError(f"eval_dataset: got a {type(dataset).__name__}; accepted: a datasets Dataset or a list "
                              f"of mezo_rl.tasks.Example")
        task = data_task(dataset, data_task_options(self.args))
        return [ex for split in ("train", "validation", "test") for ex in task.examples(split)]

    def _metrics(self, examples, split: str) -> dict:
        """Task metrics of the current weights on ``examples`` (``mezo_rl.training.evaluation.evaluate``); a
        prompt task's are the run's rewards, and the first ``--log-completions`` completions are written to
        ``samples/<split>-step<N>.jsonl`` (``--num-completions-to-print`` of them printed)."""
        a = self.args
        samples: list[dict] = []
        keep_n = max(a.log_completions, a.num_completions_to_print or 0)

        def keep(examples, outputs, values):
            extra = self.reward_context.take_extra()  # the columns the rewards added (log_extra)
            for i in range(len(outputs.texts or [])):
                if len(samples) < keep_n:
                    samples.append({"step": self.step, "split": split, "prompt": outputs.prompts[i],
                                    "completion": outputs.texts[i], **{k: v[i] for k, v in values.items()},
                                    **{k: v[i] for k, v in extra.items() if i < len(v)}})

        prompts_task = self.task.kind == "prompts"
        with self._guard.interruptible(), autocast(a.autocast, self.lm.device.type):
            metrics = evaluate(self.lm, self.task, examples, batch_size=a.eval_batch_size,
                               max_new_tokens=a.max_completion_length, stop=a.stop,
                               progress=a.progress and self.dist.is_main,
                               desc=f"{split} (step {self.step})", objective=self.objective if prompts_task else None,
                               reference=self.start if prompts_task else None,
                               on_batch=keep if prompts_task and keep_n else None)
        if samples and self.dist.is_main:
            if a.log_completions:
                rundir.write_samples(self.output_dir, split, self.step, samples[:a.log_completions])
                write_completions_table(self.output_dir, split, self.step, samples[:a.log_completions])
            for sample in samples[:a.num_completions_to_print or 0]:
                print(f"[{split} step {self.step}] {json.dumps(sample['prompt'])} -> {json.dumps(sample['completion'])}")
        return {k: float(v) for k, v in metrics.items()}

    def _evaluate_and_log(self, split: str) -> dict:
        t0 = time.perf_counter()
        metrics = self._metrics(self.splits[split], split) if self.splits[split] else {}
        self.seconds["evaluations"] += time.perf_counter() - t0
        record = {"step": self.step, "split": split, "metrics": metrics, "seconds": time.perf_counter() - t0,
                  "wall_time_s": self.wall_time(), "peak_rss_mb": peak_rss_mb()}
        self._log(record)
        if metrics:
            self._event("on_evaluate", metrics=eval_logs(record, self.objective.names))
        return metrics

    def _log_completions(self) -> None:
        """TRL's ``log_completions`` at a logging step: the step's table of prompt, completion and each reward
        (the first ``log_completions`` rows) to ``completions/train-step<N>.parquet`` and to trackio / wandb, and
        the first ``num_completions_to_print`` printed."""
        rows, a = self._step_table, self.args
        self._step_table = []
        if not rows or not self.dist.is_main:
            return
        write_completions_table(self.output_dir, "train", self.step, rows)
        log_table(self.callbacks, "completions", rows, self.step)
        for row in rows[:a.num_completions_to_print or 0]:
            rewards_of = {k: v for k, v in row.items() if k not in ("step", "prompt", "completion")}
            print(f"[train step {self.step}] {json.dumps(row['prompt'])} -> {json.dumps(row['completion'])} "
                  f"{json.dumps(rewards_of)}")

    def _better(self, value: float) -> bool:
        """Whether ``value`` of the metric that picks the best step is at least as good as the best so far: a tie
        goes to the later step (the weights that trained longer for the same validation)."""
        best = self.state.best_metric
        return best is None or (value >= best if self.greater_is_better else value <= best)

    def _validate(self) -> dict:
        s = self.state
        s.last_validation = metrics = self._evaluate_and_log("validation")
        s.last_eval_step = self.step
        value = metrics[primary_metric(metrics, self.metric_for_best)]
        if self._better(value):
            s.best_metric, s.best_global_step, s.best_validation = value, self.step, metrics
            s.best_model_checkpoint = str(self.output_dir / rundir.CHECKPOINT_DIR)  # replays the best step
        return metrics

    # -------------------------------------------------------------- files
    def wall_time(self) -> float:
        return self.state.wall_time_s + (time.perf_counter() - self._t_start)

    def _log(self, record: dict) -> None:
        """A metrics.jsonl record, and the same under TRL's keys to the callbacks' ``on_log``."""
        if self.dist.is_main:
            rundir.append_jsonl(self.output_dir / rundir.METRICS_FILE, record)
        logs = eval_logs(record, self.objective.names) if "split" in record else train_logs(record)
        if logs:
            # the state's history without timings: a resumed run's checkpoint holds the bytes of an uninterrupted one's
            kept = {k: v for k, v in logs.items() if not k.endswith(("runtime", "_per_second", "seconds", "_time"))}
            self.state.log_history.append({**kept, "epoch": self.state.epoch, "step": self.step})
            self._event("on_log", logs=logs)

    # -------------------------------------------------------------- main loop
    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None):
        """Run the training loop, as transformers' ``Trainer.train``: returns a ``TrainOutput(global_step,
        training_loss, metrics)`` (``metrics``: ``train_runtime``, ``train_loss``, ..., the best step's
        validation as ``eval_<metric>``, its test as ``test_<metric>``) and writes summary.json (the same
        results, by split: ``trainer.summary``). ``resume_from_checkpoint``: True, or this run's output
        directory (or its checkpoint/), continues the run there bit for bit."""
        from transformers.trainer_utils import TrainOutput

        if trial is not None:
            raise ConfigError("train(trial=...): hyperparameter search is not offered; build one MeZOConfig per trial")
        if resume_from_checkpoint not in (None, False) and not self.args.resume:
            resume_path(resume_from_checkpoint, self.args.output_dir)  # this run's own directory, or one line
            self.plan = resumed(self.plan)  # the run directory, read once
            self.args = self.plan.args
            self._optimizer = self._scheduler = None  # built again below, in the member evaluation the run used
        a = self.args
        self.create_optimizer_and_scheduler()
        self._t_start = time.perf_counter()
        if self.dist.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
        if a.resume:
            self._resume()
        else:
            self.state = self._run_state(self.state)
            if self.dist.is_main:
                (self.output_dir / rundir.METRICS_FILE).write_text("")
        if self.dist.is_main:  # the run as it now goes on (a resume may change --max-steps and a few others)
            rundir.write_json(self.output_dir / rundir.CONFIG_FILE, dict(a.to_dict(), resume=False))
        # replicas must start from identical weights, all of them (with LoRA/prefix the frozen base too)
        self.dist.check_same_weights(list(self.lm.model.named_parameters()))
        self.dist.check_same_object(a.to_dict(), what="training arguments")
        self.control = TrainerControl()
        self._event("on_train_begin")
        try:
            with self._guard:
                self._train_loop()
                self.save_checkpoint()
                summary = self._finish()
        except KeyboardInterrupt:
            self._save_interrupted()
            raise TrainingInterrupted(self.step, a.max_steps, self.output_dir, self._guard.signal_name) from None
        return TrainOutput(self.step, summary["train_loss"], self.train_metrics(summary))

    def train_metrics(self, summary: dict) -> dict:
        """``TrainOutput.metrics`` from the summary: transformers' ``train_*`` keys, then each evaluation's
        metrics under its prefix (``eval_``: the best step's validation; ``test_``; ``initial_eval_``,
        ``initial_test_``, ``final_eval_``) and TRL's names (``mezo_rl.training.reporting.metric_key``)."""
        runtime = summary["wall_time_s"]
        samples = summary["steps"] * self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps
        metrics = {"train_runtime": runtime, "train_loss": summary["train_loss"],
                   "train_samples_per_second": samples / runtime if runtime else 0.0,
                   "train_steps_per_second": summary["steps"] / runtime if runtime else 0.0,
                   "total_flos": 0.0, "epoch": self.state.epoch, "best_global_step": summary["best_step"]}
        for split, prefix in (("validation", "eval"), ("test", "test"), ("initial_validation", "initial_eval"),
                              ("initial_test", "initial_test"), ("final_validation", "final_eval")):
            metrics.update(eval_metrics(summary[split] or {}, self.objective.names, prefix))
        return metrics

    def _finish(self) -> dict:
        """The best step's weights (``load_best_model_at_end``; else the final step's) on the test examples,
        and the summary."""
        a, s = self.args, self.state
        self.trajectory, final_step = self.optimizer.trajectory, self.step
        if a.load_best_model_at_end:
            self._restore_best()
            self._best_loaded = True
        tested = s.best_step if a.load_best_model_at_end else final_step
        test = self._evaluate_and_log("test")
        summary = {
            "initial_validation": s.initial_validation,
            "validation": s.best_validation if a.load_best_model_at_end else s.last_validation, "test": test,
            "initial_test": s.initial_test, "final_validation": s.last_validation, "best_step": tested,
            "steps": final_step, "wall_time_s": self.wall_time(), "peak_rss_mb": peak_rss_mb(),
            "train_loss": s.loss_sum / final_step if final_step else 0.0,
            # bf16 / fp16 weights: the mean share of an update that reached them (None for float32 weights)
            "update_kept": s.update_kept_sum / s.update_kept_steps if s.update_kept_steps else None,
            "time_s": {k: round(v, 3) for k, v in self.seconds.items()},  # this process's: load, trunk, steps, evaluations
            "metric_for_best": (primary_metric(s.initial_validation, self.metric_for_best)
                                if s.initial_validation else self.metric_for_best),
            "trainable_parameters": sum(p.numel() for p in trainable_parameters(self.lm.model)),
            "stopped_early": final_step < a.max_steps,  # a callback stopped training (control.should_training_stop)
            "config_replayable": not self.not_replayable,
        }
        if self.not_replayable:
            summary["config_not_replayable_because"] = list(self.not_replayable)
        summary["metrics"] = {f"{split}/{k}": v for split in ("initial_validation", "validation", "test",
                                                              "initial_test", "final_validation")
                              for k, v in (summary[split] or {}).items()}
        self.summary = summary
        if self.dist.is_main:
            with self._guard.deferred():
                rundir.write_json(self.output_dir / rundir.SUMMARY_FILE, summary)
            if a.push_to_hub:  # after summary.json: the model card reports the run's results
                self.push_to_hub()  # saves the model first
            elif a.save_model:
                self.save_model()
        self._event("on_train_end", summary=summary)
        return summary

    def _train_loop(self) -> None:
        """Initial evaluation, then steps with evaluations and checkpoints, up to ``args.max_steps``."""
        a, s = self.args, self.state
        self._warm_trunk_cache()
        validating = a.eval_strategy != "no"
        if s.initial_validation is None and validating:
            s.initial_validation = self._validate()
            if a.initial_test and self.splits["test"]:
                s.initial_test = self._evaluate_and_log("test")
            self.save_checkpoint()
        eval_steps = a.eval_steps
        due = (self.step % eval_steps == 0 or self.step == a.max_steps  # or a callback asks, at on_train_begin
               or self.control.should_evaluate or self.control.should_training_stop)
        if validating and self.step and s.last_eval_step not in (None, self.step) and due:
            self._validate()  # stopped during this step's evaluation: do it now, as an uninterrupted run did
            self.save_checkpoint()
        while self.step < a.max_steps and not self.control.should_training_stop:
            self._guard.check()  # a signal held since the last step stops the run here
            self.control._new_step()
            self._event("on_step_begin")
            record = self.training_step()
            self.seconds["steps"] += record["seconds"]
            if self.step % a.logging_steps == 0 or self.step == a.max_steps:
                self._log(record)
                self._log_completions()
            self._event("on_step_end", record=record)
            stop = self.control.should_training_stop  # a callback ends training here: validated and saved first
            if validating and (self.step % eval_steps == 0 or self.step == a.max_steps or stop
                               or self.control.should_evaluate):
                self._validate()
                self.save_checkpoint()
                self._saved()
            elif not validating and (self.step == a.max_steps or stop):  # eval_strategy "no": the final step is the best
                s.best_global_step = self.step
                self.save_checkpoint()
                self._saved()
            elif self.control.should_save or (a.save_steps and self.step % a.save_steps == 0):
                self.save_checkpoint()
                self._saved()
