"""Evaluate a LanguageModel on a task's examples: the paper's inference rules.

* classification / multiple choice: the prediction is the candidate with the highest average
  log-likelihood per token (paper, Table 14 caption); metric ``accuracy``.
* generation (SQuAD, DROP): greedy decoding up to a newline; metrics ``squad_f1`` and ``exact_match``
  (official SQuAD normalisation, max over the gold answers).

The metric functions are the rewards of the same names (``rewards.get_reward``), so evaluation and
training objectives agree.

    >>> from mezo_rl.models import load_model
    >>> from mezo_rl.evaluation import evaluate
    >>> from tasks import get_task
    >>> task = get_task("sst2")
    >>> evaluate(load_model("smollm2-135m"), task, task.load_split("validation", n=200))
    {'accuracy': 0.72, 'n': 200}
"""
from __future__ import annotations

import torch

from tasks import Example, Task, with_demonstrations


def evaluate(
    lm,
    task: Task,
    examples: list[Example],
    batch_size: int = 16,
    demonstrations: list[Example] | None = None,
    max_new_tokens: int = 50,
    metrics: list[str] | None = None,
) -> dict:
    """Metric name -> mean value over ``examples``, plus ``"n"`` (the number of examples).

    Args:
        lm: a ``mezo_rl.lm.LanguageModel``.
        task: the task the examples come from (its ``kind`` picks scoring or generation; its
            ``demonstration`` renders in-context examples).
        examples: the examples to evaluate.
        batch_size: examples per call to ``lm.score`` / ``lm.generate``.
        demonstrations: in-context examples prepended to every prompt (the ICL baseline; causal LMs only).
        max_new_tokens: generation length limit (generation tasks).
        metrics: reward names to compute (default: ``task.metrics``).
    """
    from rewards import get_reward

    if not examples:
        raise ValueError(f"evaluate: no examples given for task {task.name!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if demonstrations and not lm.is_causal:
        raise ValueError("in-context demonstrations are supported for causal LMs only")
    specs = [get_reward(m) for m in (metrics or task.metrics)]
    if demonstrations:
        examples = [with_demonstrations(task, ex, demonstrations) for ex in examples]

    values = {s.name: [] for s in specs}
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            batch = examples[start : start + batch_size]
            if task.kind == "generation":
                prompts = [ex.prompt for ex in batch]
                completions = lm.generate(prompts, max_new_tokens=max_new_tokens)
                kw = dict(completions=completions, answers=[ex.answers for ex in batch])
            else:
                prompts, candidates = zip(*(ex.for_lm(lm.is_causal) for ex in batch))
                scores = lm.score(list(prompts), list(candidates))
                kw = dict(completions=None, candidate_scores=scores, labels=[ex.label for ex in batch])
            for s in specs:
                if s.needs == "generation" and task.kind != "generation":
                    raise ValueError(f"metric {s.name!r} needs generated text; task {task.name!r} is {task.kind}")
                values[s.name] += s.fn(list(prompts), **kw)
    out = {}
    for name, vals in values.items():
        vals = [v for v in vals if v is not None]
        out[name] = float(sum(vals) / len(vals)) if vals else float("nan")
    out["n"] = len(examples)
    return out
