"""Rewards with bugs a user could write (tests check the one-line errors that name them)."""


def not_a_number(completions=None, **kwargs):
    """NaN for the second example."""
    return [0.0 if i != 1 else float("nan") for i in range(len(kwargs["prompts"]))]


def one_short(completions=None, **kwargs):
    """One value fewer than there are examples."""
    return [0.0] * (len(kwargs["prompts"]) - 1)
