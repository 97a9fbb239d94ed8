"""``--member-evaluation``: whether a run evaluates a step's members in place or in one batched pass.

With ``MeZO(..., member_evaluation=BatchedMembers(lm.model))`` a step's closure is called once with the
step's members and returns one value (or one object, for ``fitness``) per member
(:mod:`mezo_rl.engine.population`); :func:`mezo_rl.training.outputs.model_outputs` with ``members`` is the model side of such a
closure::

    def closure(members):
        outs = model_outputs(lm, examples, objective.needs, members)
        return [objective.evaluate(**o.as_kwargs()).loss for o in outs]

    opt.step(closure)

Here: what ``--member-evaluation batched`` cannot serve (:func:`check_member_evaluation`, before any model loads),
what ``auto`` means (:func:`resolve_member_evaluation`) and the optimizer options of a run
(:func:`member_evaluation_options`).
"""
from __future__ import annotations

from typing import Optional

from mezo_rl.engine.population import COPY_BUDGET, BatchedMembers
from mezo_rl.choices import check_member_evaluation
from mezo_rl.training.outputs import prompt_texts

__all__ = ["member_evaluation_options", "resolve_member_evaluation", "check_member_evaluation", "PROMPT_TOKENS_PER_NEW_TOKEN"]

#: on a CPU, ``auto`` batches a generating step's members when the prompts are at most this many times as long
#: as ``--max-completion-length``: batching the members pays where a step decodes more than it reads, and costs
#: where long prompts dominate the step (the measurements: benchmarks/README.md, "--member-evaluation auto")
PROMPT_TOKENS_PER_NEW_TOKEN = 4


# ---------------------------------------------------------------------------------- --member-evaluation
def resolve_member_evaluation(evaluation: str, needs, peft: str, noise: str, trainable: Optional[str] = None, *,
                              device_type: str = "cpu", prompt_tokens: Optional[float] = None,
                              max_new_tokens: Optional[int] = None, low_precision: bool = False,
                              copies_fit: bool = True) -> str:
    """``"inplace"`` or ``"batched"`` for ``--member-evaluation``; ``"auto"``: batched where it measured faster,
    and wherever the trainable weights are bf16 / fp16 (``low_precision``): the in-place sweeps round
    every perturbed weight and do not return it to where it was; the batched mode never perturbs it.

    Batching the members pays where the model reads its weights more than it computes: decoding.
    auto picks batched when the objective generates text, the batched mode can serve the setup, and
    either the model is on a GPU or the prompt is at most ``PROMPT_TOKENS_PER_NEW_TOKEN`` times as
    long as the decode (``prompt_tokens``, the mean prompt length in tokens, against
    ``max_new_tokens``). On a CPU a long prompt's forward pass is bound by arithmetic, which batching
    does not reduce, and scoring is such a forward pass: in place there (benchmarks/README.md,
    "``--member-evaluation auto``", has the measurements on both sides of the rule).
    """
    check_member_evaluation(evaluation, peft, noise, trainable)
    if evaluation != "auto":
        return evaluation
    # copies_fit: the members' copies of element-wise-perturbed matrices stay within the batched mode's budget
    # (mezo_rl.engine.population.COPY_BUDGET; LoRA on a tiny model can exceed it)
    servable = copies_fit and not (peft in ("full", "none") and trainable is None and noise != "lowrank")
    decode_bound = device_type == "cuda" or (prompt_tokens is not None and max_new_tokens is not None
                                             and prompt_tokens <= PROMPT_TOKENS_PER_NEW_TOKEN * max_new_tokens)
    if servable and low_precision:
        return "batched"
    return "batched" if servable and "generation" in needs and decode_bound else "inplace"


def member_evaluation_options(args, needs, lm, train=(), recorded: Optional[str] = None) -> dict:
    """The MeZO options of ``args.member_evaluation`` for a run: ``{}`` (in place) or
    ``{"member_evaluation": BatchedMembers(lm.model)}``. ``train``: the training examples (for ``auto``:
    their prompts' mean length in tokens, as the model reads them). ``recorded``: the mode a resumed
    run's checkpoint was written with, which the run keeps (the optimizer state and trajectory belong to that
    mode; ``args.member_evaluation`` was checked against it when the run directory was read:
    :func:`mezo_rl.training.rundir.resumed_member_evaluation`)."""
    evaluation = getattr(args, "member_evaluation", "inplace")
    if recorded is not None:
        mode = recorded
    else:
        tokens = None
        if evaluation == "auto" and "generation" in needs and train:
            prompts = prompt_texts(lm, train)
            tokens = sum(len(lm.tokenizer(p, add_special_tokens=True)["input_ids"]) for p in prompts) / len(prompts)
        params = list(lm.model.parameters())
        members = getattr(args, "n_spsa", 1) * (1 if getattr(args, "estimator", "two_point") in ("es", "one_point") else 2)
        copied = 0 if args.noise == "lowrank" else sum(p.numel() for p in params if p.requires_grad and p.dim() >= 2)
        mode = resolve_member_evaluation(evaluation, needs, args.peft, args.noise, getattr(args, "trainable", None),
                                         device_type=lm.device.type, prompt_tokens=tokens,
                                         max_new_tokens=getattr(args, "max_completion_length", None),
                                         low_precision=any(p.requires_grad and p.dtype.itemsize < 4 for p in params),
                                         copies_fit=members * copied <= COPY_BUDGET * sum(p.numel() for p in params))
    return {} if mode == "inplace" else {"member_evaluation": BatchedMembers(lm.model)}
