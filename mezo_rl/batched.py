"""``--evaluation``: whether a run evaluates a step's members in place or in one batched pass.

With ``MeZO(..., evaluation="batched", module=lm.model)`` a step's closure is called once with the
step's members and returns one value (or one object, for ``fitness``) per member
(:mod:`mezo_rl.population`); :func:`mezo_rl.outputs.member_outputs` is the model side of such a
closure::

    def closure(members):
        outs = member_outputs(lm, examples, objective.needs, members)
        return [objective.evaluate(**o.as_kwargs()).loss for o in outs]

    opt.step(closure)

Here: what ``--evaluation batched`` cannot serve (:func:`check_evaluation`, before any model loads),
what ``auto`` means (:func:`resolve_evaluation`) and the optimizer options of a run
(:func:`evaluation_options`).
"""
from __future__ import annotations

from typing import Optional

from mezo_rl.errors import ConfigError

__all__ = ["evaluation_options", "resolve_evaluation", "check_evaluation"]


# ---------------------------------------------------------------------------------- --evaluation
def check_evaluation(evaluation: str, peft: str, noise: str, trainable: Optional[str]) -> None:
    """Refuse, before any model loads, what the batched mode cannot serve (one line, ConfigError)."""
    if evaluation == "batched" and peft in ("full", "none") and trainable is None and noise != "lowrank":
        raise ConfigError(f"--evaluation batched perturbs the model's matrices activation-side, which needs "
                          f"--noise lowrank (the default of --peft full), got --noise {noise}; "
                          "or use --evaluation inplace")


def resolve_evaluation(evaluation: str, needs, peft: str, noise: str, trainable: Optional[str] = None) -> str:
    """``"inplace"`` or ``"batched"`` for ``--evaluation`` (``"auto"``: batched where it measured faster).

    auto picks batched when the objective generates text (a decode reads the weights once per token,
    so one decode over all members costs much less than one decode per member; docs/engine.md,
    "Batched member evaluation") and the batched mode can serve the setup; in-place otherwise (a
    scoring step on a CPU is bound by arithmetic, which batching does not reduce).
    """
    check_evaluation(evaluation, peft, noise, trainable)
    if evaluation != "auto":
        return evaluation
    servable = not (peft in ("full", "none") and trainable is None and noise != "lowrank")
    return "batched" if servable and "generation" in needs else "inplace"


def evaluation_options(args, needs, model) -> dict:
    """The MeZO options of ``args.evaluation`` for a run: ``{}`` (in place) or
    ``{"evaluation": "batched", "module": model}``."""
    mode = resolve_evaluation(getattr(args, "evaluation", "inplace"), needs, args.peft, args.noise,
                              getattr(args, "trainable", None))
    return {} if mode == "inplace" else {"evaluation": "batched", "module": model}
