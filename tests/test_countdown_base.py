"""benchmarks/countdown_base.py's measured reasons a Countdown completion scores nothing (a pure function of the
completion's text)."""
from __future__ import annotations

import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))     # as `python benchmarks/countdown_base.py` sees it

import countdown_base  # noqa: E402


def test_a_completion_without_tags_has_no_answer_to_parse():
    d = countdown_base.diagnose("\n1. 3 + 8 = 11\n2. 8 - 3 = 5", [3, 8], tokens=20, max_new_tokens=256)
    assert (d["answer_tag"], d["parsable"], d["uses_numbers"], d["ended"]) == (0.0, 0.0, 0.0, 1.0)


def test_the_last_answer_is_parsed_and_its_numbers_checked():
    right_numbers = countdown_base.diagnose("x</think>\n<answer>3 * 8</answer>", [8, 3], tokens=9, max_new_tokens=9)
    assert (right_numbers["answer_tag"], right_numbers["parsable"], right_numbers["uses_numbers"]) == (1.0, 1.0, 1.0)
    assert right_numbers["ended"] == 0.0  # it reached the token limit
    a_number_twice = countdown_base.diagnose("<answer>3 * 3</answer>", [8, 3], tokens=5, max_new_tokens=9)
    assert (a_number_twice["parsable"], a_number_twice["uses_numbers"]) == (1.0, 0.0)
    # the last answer counts, as for the reward: a text after a right expression is what is parsed
    words = countdown_base.diagnose("<answer>3 * 8</answer> <answer>24</answer>", [8, 3], tokens=5, max_new_tokens=9)
    assert (words["parsable"], words["uses_numbers"]) == (1.0, 0.0)
    prose = countdown_base.diagnose("<answer>three times eight</answer>", [8, 3], tokens=5, max_new_tokens=9)
    assert (prose["answer_tag"], prose["parsable"]) == (1.0, 0.0)


def test_a_loop_is_counted():
    assert countdown_base.diagnose("1 + 2 = 3 " * 30, [1, 2], tokens=None, max_new_tokens=9)["loops"] == 1.0
    assert countdown_base.diagnose("3 * 8 gives 24, the target", [8, 3], None, 9)["loops"] == 0.0


def test_a_right_equation_without_tags_is_counted_apart():
    right = countdown_base.diagnose("10 + 11 = 21", [10, 11], tokens=8, max_new_tokens=256, target=21)
    assert (right["answer_tag"], right["bare_correct"]) == (0.0, 1.0)
    wrong_target = countdown_base.diagnose("10 + 8 = 18", [10, 8], tokens=8, max_new_tokens=256, target=80)
    assert wrong_target["bare_correct"] == 0.0
    a_number_missing = countdown_base.diagnose("11 = 11", [10, 11], tokens=8, max_new_tokens=256, target=11)
    assert a_number_missing["bare_correct"] == 0.0
    tagged = countdown_base.diagnose("<answer>10 + 11</answer>", [10, 11], tokens=8, max_new_tokens=256, target=21)
    assert tagged["bare_correct"] == 0.0  # tagged: the reward's own parse applies
