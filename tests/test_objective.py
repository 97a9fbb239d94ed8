"""Objectives: combining rewards into the loss MeZO minimises, and every documented bad input."""
from __future__ import annotations

import asyncio
import math

import pytest
import torch

from fake_scores import scores
from mezo_rl.errors import UserError
from mezo_rl.rewards import Objective, build_objective, normalize_answer
from mezo_rl.rewards.objective import RewardError


def length(prompts, completions, **kwargs):
    """Completion length in characters."""
    return [len(c) for c in completions]


def first_word_yes(prompts, completions, **kwargs):
    """1 if the completion starts with 'yes', None (no opinion) if it is empty, else 0."""
    return [None if not c else float(c.split()[0] == "yes") for c in completions]


def constant(value):
    def reward(prompts, completions, **kwargs):
        return [value for _ in completions]

    reward.__name__ = "constant"
    return reward


# ---- combination -------------------------------------------------------------------------------

def test_weighted_sum_with_none_left_out_of_the_mean():
    objective = build_objective([first_word_yes, length], weights=[2.0, 0.5])
    out = objective.evaluate(prompts=["p"] * 4, completions=["yes it is", "no", "", "yes"])
    # first_word_yes: [1, 0, None, 1] -> mean over the 3 opinions = 2/3; length: [9, 2, 0, 3] -> 3.5
    assert out.values["first_word_yes"] == [1.0, 0.0, None, 1.0]
    assert out.counts == {"first_word_yes": 3, "length": 4}
    assert out.components == {"first_word_yes": pytest.approx(2 / 3), "length": pytest.approx(3.5)}
    assert out.loss == pytest.approx(-(2.0 * 2 / 3 + 0.5 * 3.5))


def test_loss_like_rewards_are_flipped():
    objective = build_objective(["cross_entropy", "accuracy"], weights=[1.0, 0.0])
    out = objective.evaluate(prompts=["a", "b"], candidate_scores=scores([-1.0, -2.0], [-1.0, -2.0]), labels=[0, 1])
    ce = [math.log(1 + math.exp(-1)), math.log(1 + math.exp(1))]
    assert out.components["cross_entropy"] == pytest.approx(sum(ce) / 2)
    assert out.components["accuracy"] == pytest.approx(0.5)  # weight 0: reported, not optimised
    assert out.loss == pytest.approx(sum(ce) / 2)  # CE is minimised as is (higher_is_better=False)


def test_both_kinds_in_one_objective():
    objective = build_objective(["accuracy", "exact_match"])
    assert objective.needs == {"scores", "generation"}
    out = objective.evaluate(prompts=["a", "b"], completions=["Paris", "Rome"], candidate_scores=scores(
        [-1.0, -2.0], [-1.0, -2.0]), labels=[0, 1], columns={"answers": [["paris"], ["London"]]})
    assert out.components == {"accuracy": 0.5, "exact_match": 0.5}
    assert out.loss == pytest.approx(-1.0)


def test_split_batches_give_the_union_loss():
    """What a distributed trainer does: all-reduce sums and counts, then loss_from."""
    objective = build_objective([first_word_yes, length], weights=[1.0, 0.1])
    completions = ["yes", "", "", "yes sir", "maybe", "no"]  # 1 and 3 opinions on the two halves
    whole = objective.evaluate(prompts=["p"] * 6, completions=completions)
    halves = [objective.evaluate(prompts=["p"] * 3, completions=completions[i:i + 3]) for i in (0, 3)]
    sums = {k: sum(h.sums[k] for h in halves) for k in whole.sums}
    counts = {k: sum(h.counts[k] for h in halves) for k in whole.counts}
    assert objective.loss_from(sums, counts) == pytest.approx(whole.loss, abs=1e-12)
    # the per-half means differ from the union mean, so averaging per-rank losses would be wrong
    assert (halves[0].loss + halves[1].loss) / 2 != pytest.approx(whole.loss)


def test_trl_reward_gets_columns_and_partial_signatures_get_only_what_they_accept():
    seen = {}

    def with_kwargs(prompts, completions, **kwargs):
        seen.update(kwargs)
        return [1.0] * len(completions)

    def only_completions(completions):  # no **kwargs: extra keywords are not forced on it
        return [0.0] * len(completions)

    objective = build_objective([with_kwargs, only_completions], weights=[1.0, 1.0])
    objective.evaluate(prompts=["p"], completions=["c"], columns={"topic": ["cats"], "answers": [["x"]]})
    assert seen == {"topic": ["cats"], "answers": [["x"]]}


def test_async_rewards_run_with_or_without_a_running_loop():
    async def slow_len(prompts, completions, **kwargs):
        await asyncio.sleep(0)
        return [float(len(c)) for c in completions]

    objective = build_objective([slow_len, length], weights=[1.0, 1.0])
    out = objective.evaluate(prompts=["p", "p"], completions=["ab", "abcd"])
    assert out.components == {"slow_len": 3.0, "length": 3.0}

    async def inside_a_loop():  # e.g. a Jupyter notebook
        return objective.evaluate(prompts=["p"], completions=["abc"])

    assert asyncio.run(inside_a_loop()).components["slow_len"] == 3.0


def test_bool_and_tensor_values_are_numbers():
    def as_bools(prompts, completions, **kwargs):
        return [c == "yes" for c in completions]

    def as_tensor(prompts, completions, **kwargs):
        return torch.tensor([0.5] * len(completions))

    out = build_objective([as_bools, as_tensor]).evaluate(prompts=["p", "p"], completions=["yes", "no"])
    assert out.values == {"as_bools": [1.0, 0.0], "as_tensor": [0.5, 0.5]}


# ---- normalisation -----------------------------------------------------------------------------

def test_std_normalisation_is_fixed_after_the_first_batch():
    objective = build_objective([length], reward_scale="std")
    first = objective.evaluate(prompts=["p"] * 3, completions=["a", "abc", "abcde"])  # lengths 1, 3, 5: std 2
    assert first.loss == pytest.approx(-3.0 / 2.0)
    assert objective.scales == {"length": pytest.approx(2.0)}
    # a later batch with a different spread is divided by the same frozen scale, so the losses at
    # theta + eps*z and theta - eps*z (and at different steps) stay comparable
    later = objective.evaluate(prompts=["p"] * 2, completions=["abcdefghij", "abcdefghij"])
    assert later.loss == pytest.approx(-10.0 / 2.0)
    state = objective.state_dict()
    resumed = build_objective([length], reward_scale="std")
    resumed.load_state_dict(state)
    assert resumed.scales == objective.scales
    with pytest.raises(ValueError, match="objective state is for rewards"):
        build_objective(["exact_match"], reward_scale="std").load_state_dict(state)


def test_the_earlier_keyword_is_refused_and_a_state_recorded_under_it_loads():
    """``normalize`` was the objective's name for ``reward_scale``: the keyword is refused in one line naming it,
    and a checkpoint's objective state written under it (trainer_state.json) is read as ``reward_scale``."""
    with pytest.raises(TypeError, match=r"^build_objective\(\.\.\., normalize=\.\.\.\) is now "
                                        r"build_objective\(\.\.\., reward_scale=\.\.\.\)$"):
        build_objective([length], normalize="std")
    with pytest.raises(TypeError, match=r"^Objective\(\.\.\., normalize=\.\.\.\) is now Objective\(\.\.\., reward_scale"):
        Objective([], [], normalize="std")
    objective = build_objective([length], reward_scale="std")
    objective.evaluate(prompts=["p"] * 3, completions=["a", "abc", "abcde"])
    state = objective.state_dict()
    assert state["reward_scale"] == "std" and "normalize" not in state
    recorded = {("normalize" if k == "reward_scale" else k): v for k, v in state.items()}
    resumed = build_objective([length], reward_scale="std")
    resumed.load_state_dict(recorded)
    assert resumed.scales == objective.scales
    with pytest.raises(ValueError, match=r"reward_scale='std'\), this objective has \['length'\] \(reward_scale=None"):
        build_objective([length]).load_state_dict(recorded)


def test_std_normalisation_without_spread_falls_back_to_one():
    objective = build_objective([constant(3.0)], reward_scale="std")
    with pytest.warns(UserWarning, match="no spread on the first batch"):
        assert objective.evaluate(prompts=["p"] * 2, completions=["a", "b"]).loss == pytest.approx(-3.0)


def test_std_normalisation_needs_sq_sums_in_loss_from():
    objective = build_objective([length], reward_scale="std")
    out = objective.evaluate(prompts=["p"] * 2, completions=["a", "abc"])
    with pytest.raises(ValueError, match="needs sq_sums as well"):
        objective.loss_from(out.sums, out.counts)
    assert objective.loss_from(out.sums, out.counts, out.sq_sums) == pytest.approx(-2.0 / math.sqrt(2.0))


# ---- checks before training --------------------------------------------------------------------

def test_check_columns_names_the_missing_column():
    objective = build_objective(["squad_f1"])
    objective.check_columns(["answers", "title"], task_kind="generation")  # fine
    with pytest.raises(ValueError, match=r"reward 'squad_f1' needs column\(s\) \['answers'\].*provides columns \['label'\]"):
        objective.check_columns(["label"])


def test_check_columns_rejects_accuracy_on_generation_tasks():
    objective = build_objective(["accuracy"])
    objective.check_columns([], task_kind="classification")
    with pytest.raises(ValueError, match="reward 'accuracy' works on classification/multiple_choice tasks, not 'generation'"):
        objective.check_columns([], task_kind="generation")


def test_check_compatible_rejects_generation_rewards_when_only_scoring():
    build_objective(["cross_entropy", "accuracy"]).check_compatible(can_generate=False)
    build_objective(["squad_f1"]).check_compatible(can_generate=True)
    with pytest.raises(ValueError, match=r"reward\(s\) \['squad_f1'\] need generated completions.*cross_entropy"):
        build_objective(["cross_entropy", "squad_f1"], weights=[1, 1]).check_compatible(can_generate=False)
    with pytest.raises(TypeError, match="takes True/False"):
        build_objective(["squad_f1"]).check_compatible("yes")


# ---- bad reward values -------------------------------------------------------------------------

@pytest.mark.parametrize(
    "returned, error, message",
    [
        ([1.0], ValueError, "returned 1 values for a batch of 2; it must return one per example"),
        ([1.0, float("nan")], ValueError, r"returned nan for example 1 \(prompt 'p'\); values must be finite numbers or None"),
        ([float("inf"), 1.0], ValueError, r"returned inf for example 0 \(prompt 'p'\)"),
        (["high", 1.0], TypeError, r"returned 'high' \(str\) for example 0 \(prompt 'p'\); accepted values are real numbers"),
        ([1.0, 2j], TypeError, r"returned 2j \(complex\) for example 1 \(prompt 'p'\)"),
        (0.5, TypeError, "returned a float; it must return a list with one value per example"),
        ("11", TypeError, "returned a str"),
    ],
)
def test_bad_reward_values_are_rejected(returned, error, message):
    def bad(prompts, completions, **kwargs):
        return returned

    with pytest.raises(error, match=f"reward 'bad' {message}") as info:
        build_objective([bad]).evaluate(prompts=["p", "p"], completions=["a", "b"])
    assert isinstance(info.value, UserError)  # the command line prints it as one line


def test_a_user_reward_that_raises_is_named_with_the_example_it_raised_on():
    def picky(prompts, completions):
        return [1.0 / len(c) for c in completions]  # ZeroDivisionError on an empty completion

    with pytest.raises(RewardError, match=r"reward 'picky' \(callable\) raised ZeroDivisionError: (float )?division by zero "
                                          r"on example 2 \(prompt 'third'\)") as info:
        build_objective([picky]).evaluate(prompts=["first", "second", "third"], completions=["a", "bb", ""])
    assert isinstance(info.value.__cause__, ZeroDivisionError)  # --debug shows the original traceback


def test_all_none_is_an_error_only_for_weighted_rewards():
    objective = build_objective([first_word_yes, length], weights=[1.0, 1.0])
    out = objective.evaluate(prompts=["p", "p"], completions=["", ""])
    assert out.components["first_word_yes"] is None
    with pytest.raises(ValueError, match="reward 'first_word_yes' returned None .* for every example"):
        out.loss
    report_only = build_objective([first_word_yes, length], weights=[0.0, 1.0])
    assert report_only.evaluate(prompts=["p", "p"], completions=["", ""]).loss == 0.0


def test_evaluate_rejects_inconsistent_inputs():
    objective = build_objective(["squad_f1"])
    with pytest.raises(ValueError, match="'completions' has 1 entries but there are 2 prompts"):
        objective.evaluate(prompts=["a", "b"], completions=["x"], columns={"answers": [["x"], ["y"]]})
    with pytest.raises(ValueError, match="'answers' has 1 entries but there are 2 prompts"):
        objective.evaluate(prompts=["a", "b"], completions=["x", "y"], columns={"answers": [["x"]]})
    with pytest.raises(ValueError, match="reward 'squad_f1' needs completions"):
        objective.evaluate(prompts=["a"], columns={"answers": [["x"]]})
    with pytest.raises(ValueError, match=r"reward 'squad_f1' needs column\(s\) \['answers'\]"):
        objective.evaluate(prompts=["a"], completions=["x"])
    with pytest.raises(ValueError, match=r"clash with the reserved reward keywords"):
        objective.evaluate(prompts=["a"], completions=["x"], columns={"answers": [["x"]], "labels": [1]})
    with pytest.raises(ValueError, match="reward 'accuracy' needs candidate_scores and labels"):
        build_objective(["accuracy"]).evaluate(prompts=["a"], completions=["x"])


def test_reward_exceptions_name_the_reward():
    def crashes(prompts, completions, **kwargs):
        raise KeyError("oops")

    with pytest.raises(RewardError, match=r"reward 'crashes' \(callable\) raised KeyError: 'oops' on example 0 "
                                          r"\(prompt 'a'\)") as info:
        build_objective([crashes]).evaluate(prompts=["a"], completions=["x"])
    assert isinstance(info.value.__cause__, KeyError) and isinstance(info.value, UserError)


@pytest.mark.parametrize(
    "rewards, weights, reward_scale, message",
    [
        (["accuracy", "cross_entropy"], [1.0], None, r"got 1 weight\(s\) for 2 reward\(s\)"),
        (["accuracy"], [-1.0], None, "weights must be finite numbers >= 0.*higher_is_better=False"),
        (["accuracy"], [float("nan")], None, "weights must be finite"),
        (["accuracy"], [True], None, "weights must be finite"),
        (["accuracy"], [0.0], None, "all weights are 0"),
        (["accuracy", "accuracy"], None, None, "given more than once"),
        (["accuracy"], None, "zscore", r"reward_scale='zscore' is not one of \(None, 'std'\)"),
        ([], None, None, "at least one reward"),
    ],
)
def test_build_objective_rejects_bad_settings(rewards, weights, reward_scale, message):
    with pytest.raises(ValueError, match=message):
        build_objective(rewards, weights=weights, reward_scale=reward_scale)


# ---- with the real model layer -----------------------------------------------------------------

def test_objective_on_a_real_language_model(tiny_causal_lm):
    """The contract with mezo_rl.model.lm: CandidateScores and generate() output go straight in."""
    from mezo_rl.model.lm import LanguageModel

    lm = LanguageModel(*tiny_causal_lm)
    prompts = ["It was great . It was", "the movie was"]
    candidate_scores = lm.score(prompts, [[" great", " terrible"], [" good", " bad", " so"]])
    labels = [1, 2]
    out = build_objective(["cross_entropy", "accuracy"], weights=[1.0, 0.0]).evaluate(
        prompts=prompts, candidate_scores=candidate_scores, labels=labels)
    expected = [torch.nn.functional.cross_entropy(s.mean[None].double(), torch.tensor([y])).item()
                for s, y in zip(candidate_scores, labels)]
    # float32 log-softmax of k candidates vs a float64 reference on the same inputs: k exps summed, then the log,
    # the max added back and the gold one subtracted, each rounding at most u times the largest magnitude
    from conftest import float32_rounding_bound

    tols = [float32_rounding_bound(float(s.mean.detach().abs().max()) + ce, len(s.mean) + 3)
            for s, ce in zip(candidate_scores, expected)]
    for got, want, tol in zip(out.values["cross_entropy"], expected, tols):
        assert abs(got - want) <= tol
    assert abs(out.loss - sum(expected) / 2) <= sum(tols) / 2
    completions = lm.generate(prompts, max_new_tokens=3)
    gen = build_objective(["squad_f1"]).evaluate(prompts=prompts, completions=completions,
                                                  columns={"answers": [list(completions), ["zzz"]]})
    # a completion matches itself (F1 1) unless it normalises to nothing (F1 0 in SQuAD v1.1)
    assert gen.values["squad_f1"][0] == (1.0 if normalize_answer(completions[0]) else 0.0)
    assert gen.values["squad_f1"][1] == 0.0
