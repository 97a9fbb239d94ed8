"""mezo-rl: fine-tune language models on any objective with MeZO (forward passes only).

Reference: Malladi et al., "Fine-Tuning Language Models with Just Forward Passes", NeurIPS 2023.
"""
__version__ = "0.1.0"

# errors and registry first: `rewards` and `tasks` import them, and importing them runs this file.
from mezo_rl.errors import ConfigError, UnknownNameError, UserError
from mezo_rl.registry import Registry
from mezo_rl.optim import MeZO, StepResult, get_scheduler
from mezo_rl.trajectory import Trajectory, replay_trajectory
from mezo_rl.lm import LanguageModel
from mezo_rl.models import load_model
from mezo_rl.arguments import TrainingArguments
from mezo_rl.trainer import Trainer

__all__ = ["MeZO", "StepResult", "get_scheduler", "Trajectory", "replay_trajectory", "load_model", "LanguageModel",
           "Trainer", "TrainingArguments", "UserError", "ConfigError", "UnknownNameError", "Registry"]
