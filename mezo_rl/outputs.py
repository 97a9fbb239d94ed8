"""The one path from examples to model outputs to objective values.

:func:`model_outputs` turns a batch of ``tasks.Example`` into what rewards read (the analogue of
lm-evaluation-harness's ``construct_requests``): candidate log-likelihoods (``lm.score``, with the
masked-LM prompt for a masked LM and the gold answer as the only candidate for generation tasks:
teacher forcing) and/or completions (``lm.generate``), plus the labels and every dataset column.
An ``rewards.Objective`` turns those into values (``process_results``): :func:`objective_outputs`.

Training (``Trainer.compute_loss``), evaluation (``mezo_rl.evaluation.evaluate``: a report-only
objective summed over batches) and the backprop baseline (``mezo_rl.baselines``) all go through
:func:`model_outputs`, so a metric that works as a training reward works as an evaluation metric.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch


@dataclass
class ModelOutputs:
    """What the model produced for a batch, as ``Objective.evaluate`` takes it (``**vars(outputs)``)."""

    prompts: list[str]
    completions: Optional[list[str]] = None
    candidate_scores: Optional[list[Any]] = None
    labels: Optional[list[Optional[int]]] = None
    columns: dict[str, list] = field(default_factory=dict)

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


def example_columns(examples) -> dict[str, list]:
    """Per-example columns passed to rewards as keywords: every ``Example.columns`` key, plus ``answers``
    (the gold answers, for generation tasks)."""
    keys: list[str] = []
    for ex in examples:
        for k in ex.columns or {}:
            if k not in keys:
                keys.append(k)
    cols = {k: [(ex.columns or {}).get(k) for ex in examples] for k in keys}
    if any(ex.answers is not None for ex in examples):
        cols["answers"] = [ex.answers for ex in examples]
    return cols


def model_outputs(lm, examples, needs, *, sample_seed: Optional[int] = None, max_new_tokens: int = 32,
                  do_sample: bool = False, temperature: float = 1.0, gold_only: bool = False) -> ModelOutputs:
    """Run ``lm`` on ``examples`` for what ``needs`` asks: ``"scores"`` and/or ``"generation"``.

    Gradients follow the caller's mode (the engine calls closures under ``torch.no_grad()``; the
    backprop baseline needs them). Generation uses ``sample_seed``, so +eps and -eps see the same
    sampling randomness. An empty batch (a distributed rank's empty shard) gives empty lists.
    """
    out = ModelOutputs(prompts=[ex.prompt for ex in examples], labels=[ex.label for ex in examples],
                       columns=example_columns(examples))
    if "scores" in needs:
        score_prompts, candidates, out.labels = score_requests(examples, lm.is_causal, gold_only)
        out.candidate_scores = lm.score(score_prompts, candidates) if examples else []
    if "generation" in needs:
        gen_kwargs = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, seed=sample_seed)
        if do_sample:
            gen_kwargs["temperature"] = temperature
        out.completions = lm.generate(out.prompts, **gen_kwargs) if examples else []
    return out


def objective_outputs(lm, objective, examples, *, sample_seed=None, max_new_tokens=32, do_sample=False,
                      temperature=1.0):
    """Run the model on ``examples`` and score the result with ``objective`` (no gradients).

    Returns the objective's output (``.loss``, ``.components``, ``.values``, ``.sums``, ``.counts``).
    """
    with torch.no_grad():
        outputs = model_outputs(lm, examples, objective.needs, sample_seed=sample_seed, max_new_tokens=max_new_tokens,
                                do_sample=do_sample, temperature=temperature)
    return objective.evaluate(**outputs.as_kwargs())


def bf16_is_native() -> bool:
    """True where bf16 matrix products run natively (CUDA, or a CPU with AVX512-BF16 or AMX)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    cpu = torch.cpu
    return any(getattr(cpu, name, lambda: False)() for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def autocast(mode: str, device_type: str):
    """The forward passes' autocast context: ``"bfloat16"``, ``"none"``, or ``"auto"`` (bf16 only where native)."""
    enabled = mode == "bfloat16" or (mode == "auto" and bf16_is_native())
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=enabled)
