"""More text metrics for generation rewards, through maintained packages installed as extras.

``rouge_l`` uses ``rouge-score`` (``pip install 'mezo-rl[rouge]'``) and ``bleu`` uses ``sacrebleu``
(``pip install 'mezo-rl[bleu]'``). Both are imported when the reward is first called, and a missing
package raises an ``ImportError`` naming the extra to install. Gold references come from the
``answers`` column, as for ``squad_f1``.
"""
from __future__ import annotations

import importlib

from .registry import register_reward
from .squad import _best_over_gold, _gold_lists, completion_text


def _require(module: str, package: str, extra: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"this reward needs the optional package {package!r}, which is not installed: "
            f"pip install 'mezo-rl[{extra}]' (or pip install {package})"
        ) from e


@register_reward("rouge_l", higher_is_better=True, needs="generation")
def rouge_l(prompts, completions, answers, **columns):
    """ROUGE-L F-measure (rouge-score, Porter stemming), max over the gold answers in column 'answers'; extra 'rouge'."""
    rouge_scorer = _require("rouge_score.rouge_scorer", "rouge-score", "rouge")
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return _best_over_gold(lambda p, g: scorer.score(g, p)["rougeL"].fmeasure, completions, answers)


@register_reward("bleu", higher_is_better=True, needs="generation")
def bleu(prompts, completions, answers, **columns):
    """Sentence BLEU / 100 (sacrebleu, all gold answers in column 'answers' as references); extra 'bleu'."""
    sacrebleu = _require("sacrebleu", "sacrebleu", "bleu")
    golds = _gold_lists(answers, len(completions))
    return [
        sacrebleu.sentence_bleu(completion_text(c), gold).score / 100 if gold else None
        for c, gold in zip(completions, golds)
    ]
