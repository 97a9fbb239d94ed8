"""Evaluate a LanguageModel on a task's examples: the paper's inference rules.

* classification / multiple choice: the prediction is the candidate with the highest average
  log-likelihood per token (paper, Table 14 caption); metric ``accuracy``.
* generation (SQuAD, DROP): greedy decoding up to and including a newline; metrics ``squad_f1`` and ``exact_match``
  (official SQuAD normalisation, max over the gold answers).
* prompts (no gold answer): greedy decoding to EOS (or a ``--stop`` string); the metrics are the run's own rewards, the weighted
  ``objective`` (``sum_k w_k * mean_k``, loss-like rewards negated; :data:`OBJECTIVE`) with its
  standard error, and two measures that expose reward hacking:
  ``distinct_2`` (distinct word bigrams over all bigrams of the completions) and ``completion_chars``
  (their mean length); given the starting model (``reference``), ``kl``: the mean per-token KL of the
  policy to it over the completions (exact over the vocabulary, :mod:`mezo_rl.training.kl`).

Every metric comes with its standard error over the examples (``<metric>/se``) and ``n``. The metric
functions are the rewards of the same names (``mezo_rl.rewards.get_reward``), so evaluation and
training objectives agree.

    >>> from mezo_rl.model.loading import load_model
    >>> from mezo_rl.training.evaluation import evaluate
    >>> from mezo_rl.tasks import get_task
    >>> task = get_task("sst2")
    >>> metrics = evaluate(load_model("smollm2-135m"), task, task.load_split("validation", n=200))
    >>> sorted(metrics)                  # the task's metrics (mean over the examples) and their count
    ['accuracy', 'n']
"""
from __future__ import annotations

import json

import torch
from tqdm.auto import tqdm

from mezo_rl import rewards
from mezo_rl import tasks
from mezo_rl.stats import Moments
from mezo_rl.training.kl import KL, KLSums, completion_kl
from mezo_rl.tasks import completion_stops
from mezo_rl.training.outputs import model_outputs, prompt_texts

PROGRESS_DELAY_S = 3.0  # an evaluation shorter than this shows no progress bar
# Examples per call to the model (at least batch_size): the model orders a call's prompts by length into
# forward passes of batch_size, so a call of several forward passes pads less; the progress bar and
# on_batch follow the calls.
EXAMPLES_PER_CALL = 64
OBJECTIVE = "objective"  # a prompt task's weighted reward: the metric that picks the best step by default


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
    objective=None,
    on_batch=None,
    reference=None,
    stop: list[str] | None = None,
) -> dict:
    """Metric name -> mean value over ``examples``, plus ``"n"`` (the number of examples).

    The metrics are rewards (``task.metrics`` by default, or any reward reference) gathered into a
    report-only objective; each batch goes through :func:`mezo_rl.training.outputs.model_outputs` exactly as
    in training, and each metric's sums and counts are added up over the batches (values of
    ``None``, "no opinion", are left out of the mean; a metric with no values is NaN).

    Args:
        lm: a ``mezo_rl.model.lm.LanguageModel``.
        task: the task the examples come from (its ``kind`` and columns are checked against the
            metrics; its ``demonstration`` renders in-context examples).
        examples: the examples to evaluate.
        batch_size: the most sequences one forward pass of the model holds (``lm.batches_of``; generation
            decodes that many prompts of similar length together). Each call to ``lm.score`` /
            ``lm.generate`` takes ``max(batch_size, EXAMPLES_PER_CALL)`` examples.
        demonstrations: in-context examples prepended to every prompt (the ICL baseline; causal LMs only).
        max_new_tokens: generation length limit (greedy decoding).
        stop: strings that end a completion (a run's ``--stop``), besides EOS and the task's own
            (``task.stop``; :func:`mezo_rl.tasks.completion_stops`).
        metrics: reward references to compute (default: ``task.metrics``).
        objective: a prompt task's ``rewards.Objective`` (the run's): its rewards are the metrics and
            its weights make ``objective``. Prompt tasks need it (or ``metrics``, weighted 1 each).
        on_batch: called as ``on_batch(examples, outputs, values)`` after each batch (``outputs``: the
            :class:`~mezo_rl.training.outputs.ModelOutputs`; ``values``: reward name -> per-example values), e.g.
            to keep sample completions.
        reference: a prompt task's starting model (a :class:`mezo_rl.training.kl.StartingPoint` of ``lm``'s
            trainable tensors): the metrics then include ``kl`` (and ``kl_tokens``, the tokens it covers).
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
    report, weights = _report_objective(lm, task, examples, metrics, objective)
    if demonstrations:
        examples = [tasks.with_demonstrations(task, ex, demonstrations) for ex in examples]
    # The same examples score the same in any order (a seed's shuffle, say): which examples share a call, and so
    # a forward pass's rows, its padding and its float32 rounding, follow from the examples alone.
    examples = sorted(examples, key=_input_key)
    totals = _Totals(report.names)
    bar = tqdm(total=len(examples), desc=desc, unit="ex", delay=PROGRESS_DELAY_S, leave=False, disable=not progress,
               dynamic_ncols=True)
    stop = completion_stops(task, stop)
    with torch.no_grad(), bar, lm.batches_of(batch_size):
        per_call = max(batch_size, EXAMPLES_PER_CALL)
        for start in range(0, len(examples), per_call):
            batch = examples[start : start + per_call]
            outputs = model_outputs(lm, batch, report.needs, max_new_tokens=max_new_tokens, stop=stop)
            out = report.evaluate(**outputs.as_kwargs())
            totals.add(out)
            if task.kind == "prompts":
                totals.add_completions(outputs.texts, report.example_rewards(out.values, weights, scaled=False))
                if reference is not None:
                    totals.kl = totals.kl + completion_kl(lm, reference, prompt_texts(lm, [batch[g] for g in outputs.groups]),
                                                          outputs.texts)
            if on_batch is not None:
                on_batch(batch, outputs, out.values)
            bar.update(len(batch))
    return totals.result(len(examples), prompts=task.kind == "prompts", kl=reference is not None)


def _report_objective(lm, task, examples, metrics, objective) -> tuple:
    """The metrics as a report-only objective (every weight 0: never a loss), checked against the task, the
    examples' columns and the model; and the weights of a prompt task's ``objective`` metric (else None)."""
    weights = None
    if task.kind == "prompts":
        metrics = metrics or task.metrics  # a task that names its rewards (arithmetic: exact_answer) needs no more
        if objective is None and not metrics:
            raise ValueError(f"task {task.name!r} has prompts only: evaluate it with the run's objective (or metrics)")
        specs = list(objective.rewards) if objective is not None else [rewards.get_reward(m) for m in metrics]
        weights = {s.name: (objective.weights[s.name] if objective is not None else 1.0) for s in specs}
    else:
        specs = [rewards.get_reward(m) for m in (metrics or task.metrics)]
    report = rewards.Objective(specs, weights=[0.0] * len(specs))
    for spec in report.rewards:
        if spec.needs == "generation" and task.kind not in ("generation", "prompts"):
            raise ValueError(f"metric {spec.name!r} needs generated text; task {task.name!r} is {task.kind}")
    report.check_examples(examples, task_kind=task.kind)
    report.check_compatible(bool(lm.is_causal))
    return report, weights


class _Totals:
    """What :func:`evaluate` adds up over its batches: each metric's moments and, for a prompt task, the
    weighted reward's, the completions and their KL to the starting model."""

    def __init__(self, names):
        self.metrics = {name: Moments() for name in names}
        self.weighted = Moments()
        self.texts: list[str] = []
        self.kl = KLSums()

    def add(self, out) -> None:
        for name in self.metrics:
            self.metrics[name] += Moments(out.sums[name], out.sq_sums[name], out.counts[name])

    def add_completions(self, texts: list[str], weighted: list) -> None:
        self.texts += texts
        self.weighted += Moments.of(v for v in weighted if v is not None)

    def result(self, n: int, *, prompts: bool, kl: bool) -> dict:
        result = {name: m.mean for name, m in self.metrics.items()}
        result.update({f"{name}/se": m.se for name, m in self.metrics.items()})
        if prompts:  # each reward's spread over the completions too, as TRL logs it (rewards/<name>/std)
            result.update({f"{name}/std": m.std() for name, m in self.metrics.items()})
            result[OBJECTIVE], result[f"{OBJECTIVE}/se"] = self.weighted.mean, self.weighted.se
            result[f"{OBJECTIVE}/std"] = self.weighted.std()
            result["distinct_2"] = distinct_n(self.texts, 2)
            result["completion_chars"] = sum(map(len, self.texts)) / len(self.texts)
            if kl:
                result[KL], result[f"{KL}_tokens"] = self.kl.mean, self.kl.tokens
        result["n"] = n
        return result


def _input_key(ex) -> tuple:
    """What the model reads of an example: the order :func:`evaluate` calls the model in."""
    return (ex.prompt, json.dumps(ex.messages, sort_keys=True) if ex.messages else "", tuple(ex.candidates or ()),
            ex.mask_prompt or "")


def distinct_n(texts: list[str], n: int = 2) -> float:
    """Distinct word n-grams over all word n-grams of ``texts`` (Li et al., 2016): low when completions
    repeat themselves or each other, as a reward-hacked policy's often do. NaN with no n-grams."""
    grams = [tuple(words[i:i + n]) for words in (t.split() for t in texts) for i in range(len(words) - n + 1)]
    return len(set(grams)) / len(grams) if grams else float("nan")


def prompt_metrics(objective) -> list[str]:
    """The metrics a prompt task is evaluated on, best-step candidates first: the weighted objective,
    then each reward's mean."""
    return [OBJECTIVE, *objective.names]
