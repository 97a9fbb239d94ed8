"""A reward the user writes: positivity of each completion, scored by VADER, a lexicon sentiment
scorer from PyPI (``pip install vaderSentiment``, or the ``rl`` extra). mezo-rl sees only the numbers
it returns: a black box.

TRL's signature: keyword arguments, one value per completion, ``None`` for "no opinion"::

    mezo-rl train --task prompts.jsonl --reward examples/sentiment_reward.py:positivity ...

``register_reward`` only names it: logs and reports say ``positivity`` rather than the file path; the
function is unchanged, so TRL's ``GRPOTrainer(reward_funcs=[positivity])`` takes it as it is.

A lexicon rewards positive words however they are strung together, so a policy can raise it by
repeating them. ``repetition`` is a guard to add beside it: minus the share of a completion's word
bigrams that repeat an earlier bigram of the same completion, so a loop costs reward::

    mezo-rl train ... --reward examples/sentiment_reward.py:positivity --reward examples/sentiment_reward.py:repetition
"""
from functools import lru_cache

from mezo_rl.rewards import register_reward


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


@register_reward("repetition", replace=True)
def repetition(completions, **kwargs):
    """Minus the share of each completion's word bigrams that repeat an earlier bigram of the same
    completion, in (-1, 0]: 0 for text that never repeats itself (and for fewer than two words), -0.5
    where half the bigrams are repeats ("it is great. it is great." scores -0.4)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    scores = []
    for text in texts:
        words = text.split()
        grams = list(zip(words, words[1:]))
        scores.append(-(len(grams) - len(set(grams))) / len(grams) if grams else 0.0)
    return scores
