"""mezo-rl: fine-tune language models on any objective with MeZO (forward passes only).

Reference: Malladi et al., "Fine-Tuning Language Models with Just Forward Passes", NeurIPS 2023.

The package is layered; each layer imports only the layers above it in this list:

- :mod:`mezo_rl.errors`, :mod:`mezo_rl.registry`: leaf modules (``rewards`` and ``tasks`` import these two only);
- :mod:`mezo_rl.engine`: the optimizer (MeZO), its noise, trajectories and member populations;
- :mod:`mezo_rl.model`: the language model as a black box (scoring, generation), loading, adapters;
- :mod:`mezo_rl.training`: the trainer, its arguments, outputs, evaluation, checkpoints;
- :mod:`mezo_rl.cli`: the ``mezo-rl`` command, its checks, baselines, comparisons and reports.

Importing ``mezo_rl`` itself imports nothing: every public name below is loaded from its home on
first use, so ``import mezo_rl.errors`` (which runs this file) stays cheap.
"""
import importlib

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "UserError": "mezo_rl.errors", "ConfigError": "mezo_rl.errors", "UnknownNameError": "mezo_rl.errors",
    "Registry": "mezo_rl.registry",
    "MeZO": "mezo_rl.engine.optim", "StepResult": "mezo_rl.engine.optim",
    "get_scheduler": "mezo_rl.engine.optim", "replay_trajectory": "mezo_rl.engine.optim",
    "Trajectory": "mezo_rl.engine.trajectory",
    "LanguageModel": "mezo_rl.model.lm", "load_model": "mezo_rl.model.loading",
    "MeZOConfig": "mezo_rl.training.arguments", "MeZOTrainer": "mezo_rl.training.trainer",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mezo_rl' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
