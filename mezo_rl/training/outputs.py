"""The one path from examples to model outputs to objective values.

:func:`model_outputs` turns a batch of ``tasks.Example`` into what rewards read (the analogue of
lm-evaluation-harness's ``construct_requests``): candidate log-likelihoods (``lm.score``, with the
masked-LM prompt for a masked LM and the gold answer as the only candidate for generation tasks:
teacher forcing) and/or completions (``lm.generate``), plus the labels and every dataset column.
An ``rewards.Objective`` turns those into values (``process_results``): :func:`objective_outputs`.

Training (``Trainer.member_outcomes``), evaluation (``mezo_rl.training.evaluation.evaluate``: a report-only
objective summed over batches) and the backprop baseline (``mezo_rl.cli.baselines``) all go through
:func:`model_outputs`, so a metric that works as a training reward works as an evaluation metric.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from mezo_rl.errors import UserError
from mezo_rl import choices
from mezo_rl.model.decoding import GREEDY, Sampling
from mezo_rl.rewards.objective import example_columns


@dataclass
class ModelOutputs:
    """What the model produced for a batch, as ``Objective.evaluate`` takes it (``as_kwargs()``).

    Rows follow the examples, each repeated ``num_generations`` times in a row (prompt 0's
    completions, then prompt 1's, ...): ``groups[i]`` is the example row i came from. As in TRL, a
    conversational example's prompt is its list of messages and its completion a one-message list
    ``[{"role": "assistant", "content": text}]``; ``texts`` always holds the completions as plain text.
    """

    prompts: list[Any]
    completions: Optional[list[Any]] = None
    candidate_scores: Optional[list[Any]] = None
    labels: Optional[list[Optional[int]]] = None
    columns: dict[str, list] = field(default_factory=dict)
    texts: Optional[list[str]] = None
    groups: list[int] = field(default_factory=list)

    def as_kwargs(self) -> dict:
        return dict(prompts=self.prompts, completions=self.completions, candidate_scores=self.candidate_scores,
                    labels=self.labels, columns=self.columns)


def score_requests(examples, is_causal: bool, gold_only: bool = False) -> tuple[list[str], list[list[str]], list[int]]:
    """Prompts, candidates and labels to score.

    The task's candidates (the masked-LM prompt and label words for a masked LM), or the gold answer
    ``answers[0]`` as the only candidate (label 0) for generation tasks (teacher forcing). With
    ``gold_only`` every example contributes only its right candidate (label 0): the teacher-forced
    NLL the backprop baseline uses for multiple choice.
    """
    prompts, candidates, labels = [], [], []
    for ex in examples:
        if ex.candidates is not None:
            prompt, cands = ex.for_lm(is_causal)
            prompts.append(prompt)
            candidates.append([cands[ex.label]] if gold_only else list(cands))
            labels.append(0 if gold_only else ex.label)
        else:
            if not ex.answers:
                raise ValueError(f"example without candidates or answers cannot be scored: {ex.prompt[:80]!r}")
            if not is_causal:
                raise ValueError("generation examples can only be scored (teacher forcing) by a causal LM")
            prompts.append(ex.prompt)
            candidates.append([ex.answers[0]])
            labels.append(0)
    return prompts, candidates, labels


class ChatTemplateError(UserError, ValueError):
    """Conversational prompts for a model whose tokenizer has no chat template."""


def check_chat_template(tokenizer, examples, model_name: str = "the model") -> None:
    """Raise :class:`ChatTemplateError` if any example is conversational and ``tokenizer`` has no chat template."""
    if any(ex.messages is not None for ex in examples) and not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError(f"the prompts are chat messages but {model_name}'s tokenizer has no chat template; use "
                                f"a chat (instruct) model, or give the prompts as plain text")


def prompt_texts(lm, examples) -> list[str]:
    """Each example's prompt as the model reads it: the text, or the chat messages rendered through the
    tokenizer's chat template with the generation prompt added (TRL's conversational format)."""
    if any(ex.messages is not None for ex in examples):
        check_chat_template(lm.tokenizer, examples)
    return [ex.prompt if ex.messages is None else
            lm.tokenizer.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=False)
            for ex in examples]


def truncate_prompts(splits: dict, lm, max_prompt_length) -> dict:
    """Each example's prompt cut to its last ``max_prompt_length`` tokens (chat messages rendered with the
    chat template first, as the model reads them), as TRL truncates from the left; ``splits`` unchanged
    when it is None."""
    if max_prompt_length is None:
        return splits
    def cut(ex):
        if not lm.is_causal:
            return ex
        text = prompt_texts(lm, [ex])[0]
        ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= max_prompt_length:
            return ex
        return dataclasses.replace(ex, prompt=lm.tokenizer.decode(ids[-max_prompt_length:]), messages=None)

    return {split: [cut(ex) for ex in examples] for split, examples in splits.items()}


def model_outputs(lm, examples, needs, members=None, *, sample_seed: Optional[int] = None, max_new_tokens: int = 32,
                  do_sample: bool = False, sampling: Sampling = GREEDY, gold_only: bool = False,
                  num_generations: int = 1, log_softmax: bool = True, stop: Optional[list[str]] = None):
    """Run ``lm`` on ``examples`` for what ``needs`` asks: ``"scores"`` and/or ``"generation"``; a
    :class:`ModelOutputs`, or with ``members`` one per member of a batched MeZO step, in member order.

    Gradients follow the caller's mode (the engine calls closures under ``torch.no_grad()``; the
    backprop baseline needs them). Generation uses ``sample_seed``, so +eps and -eps see the same
    sampling randomness, and ends each completion at EOS and at the ``stop`` strings (the text ends with
    the stop string; :func:`mezo_rl.tasks.completion_stops` gives a run's); with ``num_generations`` G > 1 each example's row is repeated G times
    (sampled generation draws G different completions). An empty batch (a distributed rank's empty
    shard) gives empty lists. ``log_softmax=False``: the rewards only compare an example's candidates
    (``rewards.Objective.shift_invariant``), so ``lm.score`` may return logits where that saves work.

    ``members``: the step's members (a sequence) or their count M, evaluated in one pass: ``lm.score`` /
    ``lm.generate`` with ``members=M`` (every forward holds the M members' blocks of rows; see
    :mod:`mezo_rl.engine.population`). Sampled generation draws the same random numbers for every member
    (common random numbers). None: the weights in place are the one model.
    """
    groups = [i for i in range(len(examples)) for _ in range(num_generations)]
    examples = [examples[i] for i in groups]
    M = 1 if members is None else members if isinstance(members, int) else len(members)
    kw = {} if members is None else {"members": M}
    per_member = (lambda got: [got]) if members is None else (lambda got: got)
    outs = [ModelOutputs(prompts=[ex.prompt if ex.messages is None else ex.messages for ex in examples],
                         labels=[ex.label for ex in examples], columns=example_columns(examples), groups=groups)
            for _ in range(M)]
    if "scores" in needs:
        score_prompts, candidates, labels = score_requests(examples, lm.is_causal, gold_only)
        scores = (per_member(lm.score(score_prompts, candidates, log_softmax=log_softmax, **kw)) if examples
                  else [[] for _ in range(M)])
        for out, member_scores in zip(outs, scores):
            out.labels, out.candidate_scores = list(labels), member_scores
    if "generation" in needs:
        gen_kwargs = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, seed=sample_seed, stop=stop, **kw,
                          **dataclasses.asdict(sampling))
        texts = per_member(lm.generate(prompt_texts(lm, examples), **gen_kwargs)) if examples else [[] for _ in range(M)]
        for out, member_texts in zip(outs, texts):
            out.texts = member_texts
            out.completions = [text if ex.messages is None else [{"role": "assistant", "content": text}]
                               for ex, text in zip(examples, member_texts)]
    return outs[0] if members is None else outs


def objective_outputs(lm, objective, examples, members=None, *, sample_seed=None, max_new_tokens=32,
                      do_sample=False, sampling: Sampling = GREEDY, num_generations=1, stop=None):
    """Run the model on ``examples`` (:func:`model_outputs`) and score the result with ``objective``, no
    gradients: the objective's output (``.loss``, ``.components``, ``.values``, ``.sums``, ``.counts``;
    ``.groups``: the example each row came from, see :class:`ModelOutputs`), or with ``members`` one per
    member, in member order. Completions end at EOS and at ``stop``. Candidates are scored without the normaliser where the objective is
    invariant to it (``objective.shift_invariant``)."""
    with torch.no_grad():
        outs = model_outputs(lm, examples, objective.needs, members, sample_seed=sample_seed,
                             max_new_tokens=max_new_tokens, do_sample=do_sample, sampling=sampling,
                             num_generations=num_generations, stop=stop,
                             log_softmax=not getattr(objective, "shift_invariant", False))
    results = []
    for outputs in [outs] if members is None else outs:
        result = objective.evaluate(**outputs.as_kwargs())
        result.groups, result.prompts = outputs.groups, outputs.prompts
        result.texts = outputs.texts  # the completions as text (None where nothing was generated): their length is logged
        results.append(result)
    return results[0] if members is None else results


def autocast(mode: str, device_type: str):
    """The forward passes' autocast context: ``"bfloat16"``, ``"none"``, or ``"auto"`` (bf16 only where native)."""
    enabled = mode == "bfloat16" or (mode == "auto" and choices.bf16_is_native())
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=enabled)
