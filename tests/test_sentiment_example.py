"""The sentiment example's guard: the `repetition` reward beside VADER's positivity, and its weight's check."""
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
from sentiment_reward import repetition  # noqa: E402


def test_repetition_costs_a_loop_and_nothing_else():
    loop = "it is a great movie. it is a great movie."  # 9 bigrams, 4 of them repeats
    once = "it is a great movie, warm and funny too."
    assert repetition([loop, once]) == [pytest.approx(-4 / 9), 0.0]


def test_repetition_of_short_and_conversational_completions():
    # fewer than two words: no bigram to repeat; a chat completion is scored on the assistant's text
    chat = [{"role": "assistant", "content": "so good so good"}]  # (so good), (good so), (so good): 1 of 3
    assert repetition(["", "great", chat]) == [0.0, 0.0, pytest.approx(-1 / 3)]


@pytest.mark.parametrize("weight", ["-1", "nan"])
def test_a_bad_repetition_weight_is_one_line_before_any_work(weight, tmp_path):
    env = dict(os.environ, MEZO_RL_DATA=str(tmp_path / "missing"))
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "rl_sentiment.py"), "--repetition-weight", weight,
                           "--output-dir", str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith(f"--repetition-weight must be a number >= 0, got {float(weight)}")
    assert not (tmp_path / "out").exists()
