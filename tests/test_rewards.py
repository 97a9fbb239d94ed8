"""The reward registry and the built-in rewards, against hand-computed values."""
from __future__ import annotations

import math
import pathlib
import sys

import pytest
import torch

from mezo_rl import rewards
from fake_scores import Scores, scores
from mezo_rl.rewards import (
    UnknownRewardError,
    describe,
    describe_rewards,
    exact_match_score,
    f1_score,
    get_reward,
    list_rewards,
    normalize_answer,
    register_reward,
    unregister_reward,
)

USER_DIR = pathlib.Path(__file__).parent / "user_rewards"


def call(name, **kwargs):
    return get_reward(name).fn(**kwargs)


@pytest.fixture
def user_package(monkeypatch):
    """The user package in tests/user_rewards, visible on sys.path as if pip-installed."""
    monkeypatch.syspath_prepend(str(USER_DIR))
    yield
    sys.modules.pop("mezo_user_rewards", None)
    for name in ("user_shouting",):
        if name in rewards.registry._REGISTRY:
            unregister_reward(name)


@pytest.fixture
def scratch_names():
    """Names registered by a test are removed afterwards."""
    names = []
    yield names
    for n in names:
        if n in rewards.registry._REGISTRY:
            unregister_reward(n)


# ---- SQuAD normalisation and metrics -----------------------------------------------------------

@pytest.mark.parametrize(
    "raw, normalised",
    [
        ("The Eiffel Tower", "eiffel tower"),  # case + leading article
        ("an apple a day", "apple day"),  # all three articles
        ("Theatre and another", "theatre and another"),  # articles only as whole words
        ("Denver Broncos!", "denver broncos"),  # punctuation
        ("U.S. state-of-the-art", "us stateoftheart"),  # punctuation removed inside words, not split
        ("  lots   of\tspace \n", "lots of space"),  # whitespace collapsed
        ("A", ""),
    ],
)
def test_normalize_answer(raw, normalised):
    assert normalize_answer(raw) == normalised


def test_f1_hand_computed():
    # pred tokens [cat, sat, on, mat], gold [cat, on, mat]: 3 shared -> P=3/4, R=1, F1=6/7
    assert f1_score("The cat sat on the mat.", "a cat on a mat") == pytest.approx(6 / 7)
    # repeated tokens count with multiplicity: pred [paris, paris], gold [paris] -> P=1/2, R=1
    assert f1_score("Paris Paris", "paris") == pytest.approx(2 / 3)
    assert f1_score("London", "Paris") == 0.0
    assert f1_score("", "Paris") == 0.0  # v1.1: an empty prediction scores 0
    assert f1_score("the", "a") == 0.0  # both normalise to nothing: 0 in v1.1


def test_exact_match_hand_computed():
    assert exact_match_score("The Denver Broncos!", "denver broncos") == 1.0
    assert exact_match_score("Denver", "Denver Broncos") == 0.0


def test_squad_rewards_take_max_over_gold_answers():
    completions = ["Denver Broncos", " the broncos", "Carolina", "anything", "Broncos"]
    answers = [
        ["Denver Broncos", "Broncos"],
        ["Denver Broncos", "Broncos"],
        ["Denver Broncos"],
        [],  # no gold answer: no opinion
        "Broncos",  # a bare string is one answer
    ]
    prompts = ["q"] * 5
    f1 = call("squad_f1", prompts=prompts, completions=completions, answers=answers)
    em = call("exact_match", prompts=prompts, completions=completions, answers=answers)
    assert f1 == [1.0, 1.0, 0.0, None, 1.0]
    assert em == [1.0, 1.0, 0.0, None, 1.0]
    # partial overlap: best of F1("Denver", "Denver Broncos") = 2/3 and F1("Denver", "Broncos") = 0
    assert call("squad_f1", prompts=["q"], completions=["Denver"], answers=[["Denver Broncos", "Broncos"]]) == [
        pytest.approx(2 / 3)
    ]


def test_squad_accepts_trl_conversational_completions():
    completions = [[{"role": "assistant", "content": "The Broncos."}]]
    assert call("exact_match", prompts=["q"], completions=completions, answers=[["Broncos"]]) == [1.0]


def test_squad_rejects_malformed_answers():
    with pytest.raises(TypeError, match=r"answers\[0\] must be a list of gold answer strings"):
        call("squad_f1", prompts=["q"], completions=["a"], answers=[[1, 2]])
    with pytest.raises(ValueError, match="column 'answers' has 2 entries for 1 completions"):
        call("squad_f1", prompts=["q"], completions=["a"], answers=[["a"], ["b"]])


# ---- other text metrics ------------------------------------------------------------------------

def test_rouge_l_hand_computed():
    # LCS("the cat sat", "the cat ate") = "the cat": P = R = 2/3
    assert call("rouge_l", prompts=["q"], completions=["the cat sat"], answers=[["the cat ate"]]) == [
        pytest.approx(2 / 3)
    ]
    # best of the gold answers; stemming makes "cats" match "cat"
    assert call("rouge_l", prompts=["q"], completions=["cats"], answers=[["dog", "cat"]]) == [pytest.approx(1.0)]


def test_bleu_bounds():
    out = call(
        "bleu",
        prompts=["q", "q"],
        completions=["the quick brown fox jumps over the lazy dog", "xyz"],
        answers=[["the quick brown fox jumps over the lazy dog"], ["the quick brown fox"]],
    )
    assert out[0] == pytest.approx(1.0)
    assert out[1] == pytest.approx(0.0)


def test_missing_extra_names_pip_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "rouge_score", None)
    monkeypatch.setitem(sys.modules, "rouge_score.rouge_scorer", None)
    with pytest.raises(ImportError, match=r"pip install 'mezo-rl\[rouge\]'"):
        call("rouge_l", prompts=["q"], completions=["a"], answers=[["a"]])
    monkeypatch.setitem(sys.modules, "sacrebleu", None)
    with pytest.raises(ImportError, match=r"pip install 'mezo-rl\[bleu\]'"):
        call("bleu", prompts=["q"], completions=["a"], answers=[["a"]])


# ---- score-based rewards -----------------------------------------------------------------------

def test_cross_entropy_over_candidates_hand_computed():
    # means [-1, -2], label 0: -log(e^-1 / (e^-1 + e^-2)) = log(1 + e^-1)
    # means [-1, -2, -3], label 2: log(e^-1 + e^-2 + e^-3) + 3
    out = call("cross_entropy", prompts=["a", "b"], candidate_scores=scores([-1.0, -2.0], [-1.0, -2.0, -3.0]),
               labels=[0, 2])
    assert out[0] == pytest.approx(math.log(1 + math.exp(-1)))
    assert out[1] == pytest.approx(math.log(math.exp(-1) + math.exp(-2) + math.exp(-3)) + 3)


def test_cross_entropy_single_candidate_is_teacher_forced_nll():
    # a generation task: the gold answer is the only candidate; CE = -mean log-likelihood per token
    out = call("cross_entropy", prompts=["a", "b"], candidate_scores=scores([-1.5], [-0.25]), labels=[0, 0])
    assert out == [pytest.approx(1.5), pytest.approx(0.25)]


def test_cross_entropy_uses_mean_not_sum():
    # sums favour candidate 1, means favour candidate 0: the paper scores candidates by mean log-likelihood
    s = [Scores(sum=torch.tensor([-6.0, -2.0]), mean=torch.tensor([-1.0, -2.0]))]
    assert call("accuracy", prompts=["a"], candidate_scores=s, labels=[0]) == [1.0]


def test_candidate_cross_entropy_is_differentiable():
    logits = torch.tensor([-1.0, -2.0], requires_grad=True)
    (ce,) = rewards.candidate_cross_entropy([Scores(sum=logits, mean=logits)], [1])
    ce.backward()
    p = torch.softmax(logits.detach(), 0)
    assert torch.allclose(logits.grad, p - torch.tensor([0.0, 1.0]))


def test_accuracy_hand_computed_and_none_labels():
    out = call("accuracy", prompts=["a"] * 4, candidate_scores=scores([-1.0, -2.0], [-3.0, -0.5, -1.0],
                                                                     [-1.0, -1.0], [-1.0, -2.0]),
               labels=[0, 0, 1, None])
    assert out == [1.0, 0.0, 0.0, None]  # ties go to the first candidate; no label -> no opinion


def test_score_rewards_reject_bad_labels_and_scores():
    with pytest.raises(ValueError, match=r"labels\[0\] = 2 is not a candidate index in 0..1"):
        call("cross_entropy", prompts=["a"], candidate_scores=scores([-1.0, -2.0]), labels=[2])
    with pytest.raises(ValueError, match=r"labels\[0\] = True is not a candidate index"):
        call("accuracy", prompts=["a"], candidate_scores=scores([-1.0, -2.0]), labels=[True])
    with pytest.raises(ValueError, match="accuracy needs at least 2 candidates per example, example 0 has 1"):
        call("accuracy", prompts=["a"], candidate_scores=scores([-1.0]), labels=[0])
    with pytest.raises(TypeError, match=r"candidate_scores\[0\] is a float; expected an object with .mean"):
        call("accuracy", prompts=["a"], candidate_scores=[0.5], labels=[0])
    with pytest.raises(ValueError, match="got 1 candidate_scores but 2 labels"):
        call("accuracy", prompts=["a"], candidate_scores=scores([-1.0, -2.0]), labels=[0, 1])


# ---- the registry ------------------------------------------------------------------------------

def test_builtins_are_listed_with_descriptions():
    names = list_rewards()
    for name in ("cross_entropy", "accuracy", "squad_f1", "exact_match", "rouge_l", "bleu"):
        assert name in names
    rows = {r.name: r for r in describe_rewards()}
    assert rows["cross_entropy"].kind == "scores" and rows["cross_entropy"].higher_is_better is False
    assert rows["squad_f1"].kind == "generation" and rows["squad_f1"].higher_is_better is True
    assert "\n" not in describe("squad_f1") and "F1" in describe("squad_f1")


def test_unknown_name_suggests_close_matches():
    with pytest.raises(UnknownRewardError, match=r"unknown reward 'squad_f2'; did you mean 'squad_f1'"):
        get_reward("squad_f2")
    with pytest.raises(UnknownRewardError, match="package.module:function"):
        get_reward("zzzz")


def test_register_twice_is_an_error_unless_replace(scratch_names):
    scratch_names.append("scratch_len")

    @register_reward("scratch_len")
    def first(prompts, completions, **kw):
        """Length."""
        return [len(c) for c in completions]

    register_reward("scratch_len")(first)  # the same function again is harmless

    def second(prompts, completions, **kw):
        return [0.0 for _ in completions]

    with pytest.raises(ValueError, match="a reward named 'scratch_len' is already registered.*replace=True"):
        register_reward("scratch_len")(second)
    with pytest.raises(ValueError, match="already registered"):
        register_reward("accuracy")(second)  # built-ins are protected too
    register_reward("scratch_len", higher_is_better=False, replace=True)(second)
    spec = get_reward("scratch_len")
    assert spec.fn is second and spec.higher_is_better is False
    assert second.__mezo_reward__ is spec  # the function is returned unchanged, carrying its spec


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(name="has space"), ValueError, "without spaces"),
        (dict(name="pkg:fn"), ValueError, "may not contain ':'"),
        (dict(name="ok", needs="logits"), ValueError, r"needs='logits' is not one of \('scores', 'generation'\)"),
        (dict(name="ok", higher_is_better="yes"), TypeError, "higher_is_better must be True or False"),
    ],
)
def test_register_rejects_bad_settings(kwargs, error, message):
    name = kwargs.pop("name")
    with pytest.raises(error, match=message):
        register_reward(name, **kwargs)(lambda prompts, completions, **kw: [])
    assert "ok" not in rewards.registry._REGISTRY


def test_positional_only_parameters_are_rejected():
    def f(prompts, completions, /):
        return []

    with pytest.raises(TypeError, match="positional-only parameter.*called with keyword arguments"):
        get_reward(f)


def test_reward_in_user_module_found_by_path(user_package):
    spec = get_reward("mezo_user_rewards:keyword_bonus")
    assert spec.name == "mezo_user_rewards:keyword_bonus" and spec.needs == "generation"
    assert spec.required_columns == ("keyword",)
    assert spec.fn(prompts=["p", "p"], completions=["I love Paris", "no"], keyword=["paris", "x"]) == [1.0, 0.0]
    # a decorated function keeps its registered name and settings when found by path
    shouting = get_reward("mezo_user_rewards:shouting")
    assert shouting.name == "user_shouting" and shouting.higher_is_better is False


def test_reward_in_user_file_found_by_file_path():
    spec = get_reward(f"{USER_DIR / 'my_file_rewards.py'}:word_count")
    assert spec.fn(completions=["a b c", ""]) == [3, 0]
    # importing the same file twice gives the same function (no duplicate module)
    assert get_reward(f"{USER_DIR / 'my_file_rewards.py'}:word_count").fn is spec.fn


def test_bad_paths_say_what_is_wrong(user_package):
    with pytest.raises(ModuleNotFoundError, match="cannot import module 'no_such_module_xyz'"):
        get_reward("no_such_module_xyz:f")
    with pytest.raises(AttributeError, match="'mezo_user_rewards' has no attribute 'nope'"):
        get_reward("mezo_user_rewards:nope")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        get_reward("/nonexistent/dir/r.py:f")
    with pytest.raises(TypeError, match="a name, a 'package.module:function' path or a callable"):
        get_reward(42)


def test_reward_found_by_entry_point(user_package):
    assert {"keyword_bonus", "shouty", "user_broken"} <= set(list_rewards())
    spec = get_reward("keyword_bonus")  # never imported by name: found through the entry point
    assert spec.name == "keyword_bonus" and spec.needs == "generation" and spec.higher_is_better
    assert "mezo-user-rewards" in spec.source
    shouty = get_reward("shouty")  # an entry point onto a decorated function: its settings, the entry's name
    assert shouty.name == "shouty" and shouty.higher_is_better is False
    assert shouty.fn(prompts=["p"], completions=["ABcd"]) == [0.5]


def test_broken_entry_point(user_package):
    rows = {r.name: r for r in describe_rewards()}  # the listing survives a broken entry point
    assert rows["user_broken"].kind == "?" and "failed to load" in rows["user_broken"].description
    assert rows["keyword_bonus"].description.startswith("1.0 when the completion mentions")
    with pytest.raises(ImportError, match="could not load reward from entry point user_broken"):
        get_reward("user_broken")


def test_trl_reward_function_used_as_is():
    # verbatim from TRL's documentation: no decorator, completions + **kwargs
    def reward_len(completions, **kwargs):
        return [-abs(20 - len(completion)) for completion in completions]

    spec = get_reward(reward_len)
    assert spec.name == "reward_len" and spec.needs == "generation" and spec.higher_is_better
    objective = rewards.build_objective([reward_len])
    out = objective.evaluate(prompts=["p", "p"], completions=["x" * 20, "x" * 10], columns={"other": [1, 2]})
    assert out.values["reward_len"] == [0.0, -10.0]
    assert out.loss == pytest.approx(5.0)


def test_a_reward_can_wrap_a_hugging_face_evaluate_metric_script_offline(monkeypatch):
    """Why pyproject declares `evaluate` (mezo-rl itself never imports it): a user reward may wrap an
    `evaluate` metric, and one loaded from a local script needs no network."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_EVALUATE_OFFLINE", "1")
    import evaluate  # the declared dependency; imported here only, to keep the other tests' start-up light

    metric = evaluate.load(str(USER_DIR / "word_overlap"), keep_in_memory=True)

    @register_reward("test_word_overlap", needs="generation")
    def word_overlap(prompts, completions, answers):
        return [metric.compute(predictions=[c], references=[a[0]])["overlap"] for c, a in zip(completions, answers)]

    try:
        objective = rewards.build_objective(["test_word_overlap"])
        objective.check_columns(["answers"], task_kind="generation")
        out = objective.evaluate(prompts=["q", "q", "q"], completions=[" Denver Broncos", " Paris", " the Rhine"],
                                 columns={"answers": [[" Denver Broncos"], [" Rome"], [" the river Rhine"]]})
        assert out.values["test_word_overlap"] == [1.0, 0.0, pytest.approx(2 / 3)]
    finally:
        unregister_reward("test_word_overlap")
