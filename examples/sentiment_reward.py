"""A reward the user writes: positivity of each completion, scored by VADER, a lexicon sentiment
scorer from PyPI (``pip install vaderSentiment``, or the ``rl`` extra). mezo-rl sees only the numbers
it returns: a black box.

TRL's signature: keyword arguments, one value per completion, ``None`` for "no opinion"::

    mezo-rl train --task prompts.jsonl --reward examples/sentiment_reward.py:positivity ...

``register_reward`` only names it: logs and reports say ``positivity`` rather than the file path; the
function is unchanged, so TRL's ``GRPOTrainer(reward_funcs=[positivity])`` takes it as it is.
"""
from functools import lru_cache

from rewards import register_reward


@lru_cache(maxsize=1)
def _analyzer():
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    return SentimentIntensityAnalyzer()


@register_reward("positivity", replace=True)
def positivity(completions, **kwargs):
    """VADER's compound score of each completion, in [-1, 1]; an empty completion scores 0 (neutral).
    Conversational completions (lists of messages) are scored on the assistant's text."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [_analyzer().polarity_scores(t)["compound"] for t in texts]
