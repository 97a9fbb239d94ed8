"""A report-only reward in a plain file that presses Ctrl-C: at its Nth call, N read from
$MEZO_RL_TEST_SIGINT_AT_CALL, it sends SIGINT to this process, inside the training step that called it
(where a user's Ctrl-C lands, as a step is where a run spends its time). Without the variable it only
returns 0.0; the variable is removed when it fires, so a later run in the same process is not stopped.
It reads the candidates' scores, so a step generates nothing for it."""
import os
import signal

from mezo_rl.rewards import register_reward

VARIABLE = "MEZO_RL_TEST_SIGINT_AT_CALL"


@register_reward("test_sigint_at_call", needs="scores")
def sigint_at_call(prompts, candidate_scores, labels, **kwargs):
    """0.0 for every example (give it weight 0); SIGINT to this process at call $MEZO_RL_TEST_SIGINT_AT_CALL."""
    left = os.environ.get(VARIABLE)
    if left is not None:
        if int(left) <= 1:
            del os.environ[VARIABLE]
            signal.raise_signal(signal.SIGINT)
        else:
            os.environ[VARIABLE] = str(int(left) - 1)
    return [0.0] * len(prompts)
