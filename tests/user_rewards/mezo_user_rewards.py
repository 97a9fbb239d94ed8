"""A stand-in for a user's own installed package of rewards (see the dist-info beside it).

`tests/test_rewards.py` puts this directory on sys.path, which makes the dist-info's entry points
(group "mezo_rl.rewards") visible to importlib.metadata exactly as for a pip-installed package.
"""
from mezo_rl.rewards import register_reward


def keyword_bonus(prompts, completions, keyword, **kwargs):
    """1.0 when the completion mentions the example's keyword column, else 0.0 (plain TRL-style function)."""
    return [float(k.lower() in c.lower()) for c, k in zip(completions, keyword)]


@register_reward("user_shouting", higher_is_better=False)
def shouting(prompts, completions, **kwargs):
    """Fraction of upper-case letters in the completion (lower is better)."""
    return [sum(ch.isupper() for ch in c) / max(1, sum(ch.isalpha() for ch in c)) for c in completions]
