"""A reward in a plain file that takes a moment per call (tests interrupt a run in the middle of a step)."""
import time


def pause(completions=None, **kwargs):
    """0.0 for every example, after 20 ms (report-only: give it weight 0)."""
    time.sleep(0.02)
    return [0.0] * len(kwargs["prompts"])
