"""The batched closure's model side: examples -> one ``ModelOutputs`` per member, from one pass.

With ``MeZO(..., evaluation="batched", module=lm.model)`` a step's closure is called once with the
step's members and must return one value per member (:mod:`mezo_rl.population`).
:func:`member_outputs` is :func:`mezo_rl.outputs.model_outputs` for that call: the same requests
(candidate scores and/or completions, labels, columns), run once with ``members=M`` so that every
forward pass holds the M members' row blocks, and split back into M ``ModelOutputs``. An objective
then scores each member's outputs separately::

    def closure(members):
        outs = member_outputs(lm, examples, objective.needs, len(members))
        return [objective.evaluate(**o.as_kwargs()).loss for o in outs]

    opt.step(closure)

:func:`evaluation_options` turns ``--evaluation`` into the optimizer's options for a run.
"""
from __future__ import annotations

from typing import Optional

from mezo_rl.errors import ConfigError
from mezo_rl.outputs import ModelOutputs, example_columns, score_requests

__all__ = ["member_outputs", "evaluation_options", "resolve_evaluation", "check_evaluation"]


def member_outputs(lm, examples, needs, members, *, sample_seed: Optional[int] = None, max_new_tokens: int = 32,
                   do_sample: bool = False, temperature: float = 1.0, gold_only: bool = False) -> list[ModelOutputs]:
    """``model_outputs`` for M members at once: one ``ModelOutputs`` per member, in member order.

    ``members``: the step's members (a sequence) or their count M. Sampled generation draws the same
    random numbers for every member (common random numbers; ``sample_seed`` as in ``model_outputs``).
    An empty batch (a distributed rank's empty shard) gives M empty outputs.
    """
    M = members if isinstance(members, int) else len(members)
    prompts = [ex.prompt for ex in examples]
    labels = [ex.label for ex in examples]
    columns = example_columns(examples)
    scores = completions = [None] * M
    if "scores" in needs:
        score_prompts, candidates, labels = score_requests(examples, lm.is_causal, gold_only)
        scores = lm.score(score_prompts, candidates, members=M) if examples else [[] for _ in range(M)]
    if "generation" in needs:
        gen_kwargs = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, seed=sample_seed)
        if do_sample:
            gen_kwargs["temperature"] = temperature
        completions = lm.generate(prompts, members=M, **gen_kwargs) if examples else [[] for _ in range(M)]
    return [ModelOutputs(prompts=list(prompts), completions=completions[k], candidate_scores=scores[k],
                         labels=list(labels), columns=columns) for k in range(M)]


# ---------------------------------------------------------------------------------- --evaluation
def check_evaluation(evaluation: str, peft: str, noise: str, trainable: Optional[str]) -> None:
    """Refuse, before any model loads, what the batched mode cannot serve (one line, ConfigError)."""
    if evaluation == "batched" and peft == "none" and trainable is None and noise != "lowrank":
        raise ConfigError(f"--evaluation batched perturbs the model's matrices activation-side, which needs "
                          f"--noise lowrank (the default of --peft none), got --noise {noise}; "
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
    servable = not (peft == "none" and trainable is None and noise != "lowrank")
    return "batched" if servable and "generation" in needs else "inplace"


def evaluation_options(args, needs, model) -> dict:
    """The MeZO options of ``args.evaluation`` for a run: ``{}`` (in place) or
    ``{"evaluation": "batched", "module": model}``."""
    h = args.hyperparameters()
    mode = resolve_evaluation(getattr(args, "evaluation", "inplace"), needs, args.peft, h["noise"],
                              getattr(args, "trainable", None))
    return {} if mode == "inplace" else {"evaluation": "batched", "module": model}
