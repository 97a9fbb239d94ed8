"""Callbacks with the Hugging Face contract: ``on_<event>(args, state, control, **kwargs)``.

The trainer calls, in order: ``on_init_end`` (end of ``__init__``), ``on_train_begin``, then per step
``on_step_begin`` / ``on_step_end``, ``on_log`` (``logs=``: the step's metrics under TRL's keys,
:func:`mezo_rl.training.reporting.train_logs`), and after each evaluation ``on_evaluate``
(``metrics=``: ``eval_<metric>``) and ``on_log``; ``on_save`` after each checkpoint; ``on_train_end``.

``args`` is the run's :class:`~mezo_rl.training.arguments.MeZOConfig`; ``state`` the trainer's
:class:`~mezo_rl.training.rundir.TrainerState` (``transformers.TrainerState``'s fields: ``global_step``,
``max_steps``, ``best_metric``, ``best_global_step``, ``log_history``, ``is_world_process_zero``, ...);
``control`` a :class:`TrainerControl`.
The keywords are ``trainer`` (the :class:`~mezo_rl.training.trainer.MeZOTrainer`), ``model`` (the
``PreTrainedModel`` being trained), ``processing_class`` (its tokenizer), ``optimizer`` and
``lr_scheduler``, plus ``logs`` / ``metrics`` where the event has them.

A callback steers the run through ``control`` (set a flag, or return a control): at the end of a
step, ``should_training_stop`` ends training there (the checkpoint is written and the best step's
weights are tested, as at the last step), ``should_evaluate`` runs a validation now, ``should_save``
writes a checkpoint now. Subclasses of ``transformers.TrainerCallback`` work unchanged: an instance of
any class with these methods is called the same way (``transformers.EarlyStoppingCallback`` included:
:class:`~mezo_rl.training.arguments.MeZOConfig` answers ``metric_for_best_model``,
``greater_is_better`` and ``load_best_model_at_end`` for it). Callbacks may also be given as classes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from tqdm.auto import tqdm

__all__ = ["TrainerCallback", "TrainerControl", "CallbackHandler", "ProgressCallback",
           "EarlyStoppingCallback", "EVENTS"]

EVENTS = ("on_init_end", "on_train_begin", "on_step_begin", "on_step_end", "on_log", "on_evaluate", "on_save",
          "on_train_end")


@dataclass
class TrainerControl:
    """What callbacks ask of the training loop (``transformers.TrainerControl``'s fields). ``should_evaluate``,
    ``should_save`` and ``should_log`` are reset at the start of each step; ``should_training_stop`` stays."""

    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False

    def _new_step(self) -> None:
        self.should_save = self.should_evaluate = self.should_log = False


class TrainerCallback:
    """Base class of callbacks (every hook a no-op); ``transformers.TrainerCallback`` subclasses are accepted too."""

    def on_init_end(self, args, state, control, **kwargs): ...

    def on_train_begin(self, args, state, control, **kwargs): ...

    def on_step_begin(self, args, state, control, **kwargs): ...

    def on_step_end(self, args, state, control, **kwargs): ...

    def on_log(self, args, state, control, logs=None, **kwargs): ...

    def on_evaluate(self, args, state, control, metrics=None, **kwargs): ...

    def on_save(self, args, state, control, **kwargs): ...

    def on_train_end(self, args, state, control, **kwargs): ...


class CallbackHandler:
    """Calls every callback's hook of an event in order, passing one :class:`TrainerControl` along (a hook
    that returns a control replaces it), as ``transformers.trainer_callback.CallbackHandler`` does."""

    def __init__(self, callbacks=()):
        self.callbacks: list = []
        for cb in callbacks:
            self.add(cb)

    def add(self, callback) -> None:
        cb = callback() if isinstance(callback, type) else callback
        if not any(callable(getattr(cb, event, None)) for event in EVENTS):
            from mezo_rl.errors import ConfigError

            raise ConfigError(f"callback {type(cb).__name__}: has none of the hooks {', '.join(EVENTS)}; give a "
                              f"TrainerCallback (mezo_rl's or transformers')")
        self.callbacks.append(cb)

    def call(self, event: str, args, state, control, **kwargs) -> TrainerControl:
        for cb in self.callbacks:
            hook = getattr(cb, event, None)
            if hook is None:
                continue
            result = hook(args, state, control, **kwargs)
            if result is not None:
                control = result
        return control


class ProgressCallback(TrainerCallback):
    """A tqdm bar over the steps, showing the loss and a running mean of the weighted reward."""

    def __init__(self):
        self.bar, self.running = None, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc="mezo", dynamic_ncols=True)
        self.running = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if self.bar is None or "loss" not in logs:
            return
        reward = logs.get("reward", next((v for k, v in logs.items() if k.startswith("rewards/")), None))
        if reward is not None:
            self.running = reward if self.running is None else 0.9 * self.running + 0.1 * reward
        self.bar.set_postfix(loss=f"{logs['loss']:.4f}", reward="-" if self.running is None else f"{self.running:.4f}")

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class EarlyStoppingCallback(TrainerCallback):
    """Stop training when the validation metric that picks the best step (``metric_for_best_model``, or
    ``metric``) has not improved by more than ``threshold`` for ``patience`` evaluations in a row
    (``transformers.EarlyStoppingCallback``'s rule). The best step's weights are still the ones tested."""

    def __init__(self, early_stopping_patience: int = 1, early_stopping_threshold: float = 0.0,
                 metric: Optional[str] = None):
        if early_stopping_patience < 1:
            from mezo_rl.errors import ConfigError

            raise ConfigError(f"early_stopping_patience: got {early_stopping_patience!r}, accepted: an integer >= 1")
        self.patience, self.threshold, self.metric = early_stopping_patience, early_stopping_threshold, metric
        self.best: Optional[float] = None
        self.waited = 0

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        name = self.metric or args.metric_for_best_model
        key = name if name.startswith("eval_") else f"eval_{name}"
        value = (metrics or {}).get(key)
        if value is None:
            return
        better = (value > self.best + self.threshold if args.greater_is_better is not False
                  else value < self.best - self.threshold) if self.best is not None else True
        if better:
            self.best, self.waited = value, 0
        else:
            self.waited += 1
            if self.waited >= self.patience:
                control.should_training_stop = True

