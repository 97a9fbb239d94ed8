"""SQuAD v1.1 generation rewards: ``squad_f1`` and ``exact_match`` (vendored official metric).

``squad_f1`` and ``exact_match`` follow the official SQuAD v1.1 evaluation script exactly
(``evaluate-v1.1.py``): both strings are normalised (lower-cased, punctuation removed, the articles
"a", "an", "the" removed, whitespace collapsed) and the best score over all gold answers is kept.
They are written here rather than loaded with ``evaluate.load("squad")``, which downloads the metric
script at run time and fails offline. Scores are in [0, 1] (the official script prints 100x).

Gold answers arrive in the dataset column ``answers``: one list of strings per example (a bare
string counts as a single answer; an empty list gives ``None``, "no opinion"). Completions may be
strings or TRL conversational completions (a list of ``{"role", "content"}`` messages).
"""
from __future__ import annotations

import re
import string
from collections import Counter

from .registry import register_reward

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """SQuAD v1.1 normalisation: lower case, drop punctuation, drop articles, collapse whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def f1_score(prediction: str, ground_truth: str) -> float:
    """Token-level F1 between the normalised prediction and one gold answer (official v1.1)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(ground_truth).split()
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match_score(prediction: str, ground_truth: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0 (official v1.1)."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def completion_text(completion) -> str:
    """A completion as text: strings pass through; TRL conversational completions give the last message's content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise TypeError(
        f"a completion must be a string or a list of {{'role', 'content'}} messages, got {type(completion).__name__}"
    )


def _gold_lists(answers, n: int) -> list[list[str]]:
    if len(answers) != n:
        raise ValueError(f"column 'answers' has {len(answers)} entries for {n} completions")
    out = []
    for i, a in enumerate(answers):
        if isinstance(a, str):
            a = [a]
        if not isinstance(a, (list, tuple)) or not all(isinstance(x, str) for x in a):
            raise TypeError(f"answers[{i}] must be a list of gold answer strings, got {a!r}")
        out.append(list(a))
    return out


def _best_over_gold(metric, completions, answers) -> list[float | None]:
    golds = _gold_lists(answers, len(completions))
    return [
        max(metric(completion_text(c), g) for g in gold) if gold else None for c, gold in zip(completions, golds)
    ]


@register_reward("squad_f1", higher_is_better=True, needs="generation")
def squad_f1(prompts, completions, answers, **columns):
    """SQuAD v1.1 token F1 (official normalisation), max over the gold answers in column 'answers'."""
    return _best_over_gold(f1_score, completions, answers)


@register_reward("exact_match", higher_is_better=True, needs="generation")
def exact_match(prompts, completions, answers, **columns):
    """SQuAD v1.1 exact match (official normalisation), max over the gold answers in column 'answers'."""
    return _best_over_gold(exact_match_score, completions, answers)
