"""mezo-rl: fine-tune language models on any objective with MeZO (forward passes only).

Reference: Malladi et al., "Fine-Tuning Language Models with Just Forward Passes", NeurIPS 2023.
"""
__version__ = "0.1.0"

# Public names are imported lazily so `import mezo_rl` stays cheap and a missing optional part
# (e.g. while one layer is being developed) does not break the others.
_EXPORTS = {
    "MeZO": "mezo_rl.optim",
    "StepResult": "mezo_rl.optim",
    "get_scheduler": "mezo_rl.optim",
    "Trajectory": "mezo_rl.trajectory",
    "replay_trajectory": "mezo_rl.trajectory",
    "load_model": "mezo_rl.models",
    "LanguageModel": "mezo_rl.lm",
    "Trainer": "mezo_rl.trainer",
    "TrainingArguments": "mezo_rl.trainer",
}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'mezo_rl' has no attribute {name!r}")


__all__ = list(_EXPORTS)
