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
    >>> metrics = evaluate(load_model("smollm2-135m"), task, task.load_split("validation", n=200))
    >>> sorted(metrics)                  # the task's metrics (mean over the examples) and their count
    ['accuracy', 'n']
"""
from __future__ import annotations

import torch
from tqdm.auto import tqdm

import rewards
import tasks
from mezo_rl.outputs import example_columns, model_outputs

PROGRESS_DELAY_S = 3.0  # an evaluation shorter than this shows no progress bar

# ``rewards`` and ``tasks`` are imported as modules (names looked up at call time): they import
# ``mezo_rl.errors`` / ``mezo_rl.registry``, which runs ``mezo_rl/__init__`` and so this module, possibly
# while they are still half-imported.


def evaluate(
    lm,
    task,
    examples: list,
    batch_size: int = 16,
    demonstrations: list | None = None,
    max_new_tokens: int = 50,
    metrics: list[str] | None = None,
    progress: bool = False,
    desc: str = "evaluating",
) -> dict:
    """Metric name -> mean value over ``examples``, plus ``"n"`` (the number of examples).

    The metrics are rewards (``task.metrics`` by default, or any reward reference) gathered into a
    report-only objective; each batch goes through :func:`mezo_rl.outputs.model_outputs` exactly as
    in training, and each metric's sums and counts are added up over the batches (values of
    ``None``, "no opinion", are left out of the mean; a metric with no values is NaN).

    Args:
        lm: a ``mezo_rl.lm.LanguageModel``.
        task: the task the examples come from (its ``kind`` and columns are checked against the
            metrics; its ``demonstration`` renders in-context examples).
        examples: the examples to evaluate.
        batch_size: examples per call to ``lm.score`` / ``lm.generate``.
        demonstrations: in-context examples prepended to every prompt (the ICL baseline; causal LMs only).
        max_new_tokens: generation length limit (greedy decoding).
        metrics: reward references to compute (default: ``task.metrics``).
        progress: show a tqdm progress bar (on stderr) once the evaluation has taken more than
            ``PROGRESS_DELAY_S`` seconds (generation on a few hundred examples does; scoring a
            hundred examples usually does not); ``desc`` labels it.
    """
    if not examples:
        raise ValueError(f"evaluate: no examples given for task {task.name!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if demonstrations and not lm.is_causal:
        raise ValueError("in-context demonstrations are supported for causal LMs only")
    specs = [rewards.get_reward(m) for m in (metrics or task.metrics)]
    report = rewards.Objective(specs, weights=[0.0] * len(specs))  # weight 0: report only, never a loss
    for spec in report.rewards:
        if spec.needs == "generation" and task.kind != "generation":
            raise ValueError(f"metric {spec.name!r} needs generated text; task {task.name!r} is {task.kind}")
    report.check_columns(example_columns(examples), task_kind=task.kind)
    report.check_compatible(bool(lm.is_causal))
    if demonstrations:
        examples = [tasks.with_demonstrations(task, ex, demonstrations) for ex in examples]

    sums = dict.fromkeys(report.names, 0.0)
    counts = dict.fromkeys(report.names, 0)
    bar = tqdm(total=len(examples), desc=desc, unit="ex", delay=PROGRESS_DELAY_S, leave=False, disable=not progress,
               dynamic_ncols=True)
    with torch.no_grad(), bar:
        for start in range(0, len(examples), batch_size):
            batch = examples[start : start + batch_size]
            out = report.evaluate(**model_outputs(lm, batch, report.needs, max_new_tokens=max_new_tokens).as_kwargs())
            for name in report.names:
                sums[name] += out.sums[name]
                counts[name] += out.counts[name]
            bar.update(len(batch))
    result = {name: sums[name] / counts[name] if counts[name] else float("nan") for name in report.names}
    result["n"] = len(examples)
    return result
