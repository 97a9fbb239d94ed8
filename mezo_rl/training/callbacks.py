"""Hooks the Trainer calls at the start, after every step, after every evaluation and at the end."""
from __future__ import annotations

import math
import os

from tqdm.auto import tqdm


class TrainerCallback:
    """Hooks the Trainer calls; subclass and override what you need (all no-ops here)."""

    def on_train_begin(self, trainer) -> None: ...

    def on_step_end(self, trainer, record: dict) -> None: ...

    def on_evaluate(self, trainer, record: dict) -> None: ...

    def on_train_end(self, trainer, summary: dict) -> None: ...


class TensorBoardCallback(TrainerCallback):
    """Writes every numeric field of the step and eval records to TensorBoard."""

    def __init__(self, log_dir: str | os.PathLike):
        from torch.utils.tensorboard import SummaryWriter  # needs the optional `tensorboard` extra

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


class ProgressCallback(TrainerCallback):
    """A tqdm bar over the steps, showing the loss and a running mean of the first reward component."""

    def on_train_begin(self, trainer):
        self.bar = tqdm(total=trainer.args.max_steps, initial=trainer.step, desc="mezo", dynamic_ncols=True)
        self.running = None

    def on_step_end(self, trainer, record):
        reward = next((v for k, v in record.items() if k.startswith("reward/")), None)
        if reward is not None:
            self.running = reward if self.running is None else 0.9 * self.running + 0.1 * reward
        self.bar.set_postfix(loss=f"{record['loss']:.4f}", reward="-" if self.running is None else f"{self.running:.4f}")
        self.bar.update(1)

    def on_train_end(self, trainer, summary):
        self.bar.close()
