"""A reward in a plain file that is not on sys.path: found as "path/to/my_file_rewards.py:word_count"."""


def word_count(completions, **kwargs):
    """Number of words in the completion (TRL-style: completions and **kwargs only)."""
    return [len(c.split()) for c in completions]
