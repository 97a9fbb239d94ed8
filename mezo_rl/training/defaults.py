"""The defaults of ``mezo-rl train`` that depend on what MeZO trains (``--peft``): one table.

The tables are declared here; the run's plan fills every one of these options left unset from its mode's row
(:func:`mezo_rl.training.resolve.resolve_values`, which also reads the task's default mode and reward), so the plan's configuration (and a run's
``training_args.json``) holds every value the run used, and ``mezo-rl train --config RUN/training_args.json``
repeats the run. Every other option has one
default, in its field's declaration (:mod:`mezo_rl.training.arguments`).

    MeZO(params, **mezo_options(MODE_DEFAULTS["prefix"]))   # a mode's optimizer settings, outside the CLI
"""
from __future__ import annotations

from typing import Mapping

__all__ = ["MODES", "MODE_DEFAULTS", "PROMPT_TASK_DEFAULTS", "DEFAULT_MODE", "PROMPT_TASK_MODE",
           "MEZO_OPTIONS", "mezo_options"]

#: what ``--peft`` accepts: the final normalisation layer's gains, every weight, or an adapter
MODES = ("norm", "full", "lora", "prefix")

# Why these values: prefix takes the paper's OPT grid (Table 16); full and LoRA take an lr (and full
# an eps) sized for a run of this CLI's length, as the paper's are meant for runs a hundred times longer.
# "norm" (the default) trains only the final normalisation layer's gains, where a sign step over a few
# hundred directions moves even a non-differentiable objective, and with the trunk frozen a step costs
# the final norm and the output head only, so it affords many more steps. The measurements behind each
# value, with their commands: benchmarks/README.md ("The default run", "Full, LoRA and prefix").
MODE_DEFAULTS = {
    "norm": dict(max_steps=3000, per_device_train_batch_size=64, learning_rate=2e-2, eps=1e-1, weight_decay=0.0,
                 noise="rademacher", step_normalize="std", n_spsa=2),
    "full": dict(max_steps=150, per_device_train_batch_size=32, learning_rate=2e-4, eps=1e-2, weight_decay=0.0,
                 noise="lowrank", step_normalize="none", n_spsa=1),
    "lora": dict(max_steps=150, per_device_train_batch_size=32, learning_rate=3e-3, eps=1e-2, weight_decay=0.0,
                 noise="gaussian", step_normalize="none", n_spsa=1),
    "prefix": dict(max_steps=150, per_device_train_batch_size=32, learning_rate=1e-2, eps=1e-1, weight_decay=0.0,
                   noise="gaussian", step_normalize="none", n_spsa=1),
}
assert tuple(MODE_DEFAULTS) == MODES

# A prompt task (prompts in, a reward over generated completions) costs a decode of every prompt of the
# batch per member, where a scoring task costs one forward pass, so the norm row's run length, sized for
# scoring, is far too long for it. These entries replace the mode's for such a task (a data file or
# dataset with a prompt column or a prompt template, or a registered prompt task): the settings of the
# worked RL example (examples/rl_sentiment.py), whose 4 SPSA samples' 8 members decode together as one
# batch (benchmarks/README.md, "The sentiment example", says how its values were chosen).
# Every mode normalises a prompt task's step (step_normalize="std": each loss difference over the spread of the
# step's member losses), as GRPO normalises its advantages and ES-at-scale z-scores its rewards: a user's
# reward comes on any scale (TRL's reward_len gives values around -20), and with the raw loss difference
# over 2 eps the step would grow with it; normalised, the same run with the reward times 100 makes the
# same weights. The scoring tasks keep their rows' settings (their losses have a known scale).
# The full and LoRA rows are cells of the study on the verifiable task `arithmetic` (benchmarks/rl.py --study
# arithmetic): 20 steps of 16 prompts, 4 SPSA samples (8 members decoded together), lr 1e-3 (full) / 3e-2
# (LoRA), the modes' eps. Full's row is chosen to keep the completions near the base model's, not for the
# largest gain; why these cells, and what the others did: benchmarks/README.md, "Prompt tasks: the defaults".
PROMPT_TASK_DEFAULTS = {
    "norm": dict(max_steps=90, per_device_train_batch_size=16, learning_rate=1e-1, n_spsa=4),
    "full": dict(max_steps=20, per_device_train_batch_size=16, learning_rate=1e-3, n_spsa=4, step_normalize="std"),
    "lora": dict(max_steps=20, per_device_train_batch_size=16, learning_rate=3e-2, n_spsa=4, step_normalize="std"),
    "prefix": dict(step_normalize="std"),
}
assert set(PROMPT_TASK_DEFAULTS) <= set(MODES) and all(
    set(row) <= set(MODE_DEFAULTS[mode]) for mode, row in PROMPT_TASK_DEFAULTS.items())

#: what ``--peft`` left unset trains: the final norm's gains (the scoring tasks' rows above), and for a prompt
#: task every weight (why: benchmarks/README.md, "Prompt tasks: the defaults"). Full fine-tuning needs no adapter
#: library, and its batched members perturb the matrices activation-side (no copy per member). Its one
#: parameter-sized buffer is the starting weights that every prompt-task evaluation's ``kl`` reads
#: (mezo_rl.training.kl).
DEFAULT_MODE, PROMPT_TASK_MODE = "norm", "full"


#: the :class:`~mezo_rl.engine.optim.MeZO` keyword arguments among the table's options -> the option that holds each
MEZO_OPTIONS = {"lr": "learning_rate", "eps": "eps", "weight_decay": "weight_decay", "noise": "noise",
                "step_normalize": "step_normalize", "n_spsa": "n_spsa"}


def mezo_options(values: Mapping) -> dict:
    """The MeZO keyword arguments of ``values`` (a row of :data:`MODE_DEFAULTS`, or the resolved training
    arguments as a dict), ``step_normalize`` as MeZO takes it (``"none"`` -> None)."""
    out = {keyword: values[option] for keyword, option in MEZO_OPTIONS.items()}
    out["step_normalize"] = None if out["step_normalize"] == "none" else out["step_normalize"]
    return out
