"""A reward the user writes: positivity of each completion, scored by VADER, a lexicon sentiment
scorer from PyPI (``pip install vaderSentiment``, or the ``rl`` extra). mezo-rl sees only the numbers
it returns: a black box.

TRL's signature: keyword arguments, one value per completion, ``None`` for "no opinion"::

    mezo-rl train --task prompts.jsonl --reward examples/sentiment_reward.py:positivity ...
"""
from functools import lru_cache


@lru_cache(maxsize=1)
def _analyzer():
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    return SentimentIntensityAnalyzer()


def positivity(completions, **kwargs):
    """VADER's compound score of each completion, in [-1, 1]; an empty completion scores 0 (neutral).
    Conversational completions (lists of messages) are scored on the assistant's text."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [_analyzer().polarity_scores(t)["compound"] for t in texts]
