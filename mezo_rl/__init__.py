"""mezo-rl: fine-tune language models on any objective with MeZO (forward passes only).

Reference: Malladi et al., "Fine-Tuning Language Models with Just Forward Passes", NeurIPS 2023.

Importing the package loads the engine, the model wrapper and the arguments, none of which import
``rewards`` or ``tasks``. Those two packages import :mod:`mezo_rl.errors` and :mod:`mezo_rl.registry`
(which runs this file), so :class:`~mezo_rl.trainer.Trainer`, which wires them, is imported on first
use of ``mezo_rl.Trainer``: ``import rewards`` never loads the trainer.
"""
__version__ = "0.1.0"

from mezo_rl.errors import ConfigError, UnknownNameError, UserError
from mezo_rl.registry import Registry
from mezo_rl.trajectory import Trajectory
from mezo_rl.optim import MeZO, StepResult, get_scheduler, replay_trajectory
from mezo_rl.lm import LanguageModel
from mezo_rl.models import load_model
from mezo_rl.arguments import TrainingArguments

__all__ = ["MeZO", "StepResult", "get_scheduler", "Trajectory", "replay_trajectory", "load_model", "LanguageModel",
           "Trainer", "TrainingArguments", "UserError", "ConfigError", "UnknownNameError", "Registry"]


def __getattr__(name: str):
    if name == "Trainer":
        from mezo_rl.trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'mezo_rl' has no attribute {name!r}")
