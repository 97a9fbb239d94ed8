"""Verifiable tasks (mezo_rl.tasks.verifiable) and their rewards (mezo_rl.rewards.verifiable): generators deterministic in the
seed, disjoint splits, solvable Countdown puzzles, the rewards on hand-written completions, hostile input,
bad options as one-line errors. No model needed."""

import random
import re
from collections import Counter
from fractions import Fraction

import pytest

from mezo_rl import rewards
from mezo_rl.errors import ConfigError, UserError
from mezo_rl.rewards import build_objective, get_reward
from mezo_rl.rewards.verifiable import (ExpressionError, answer_contents, countdown_format_score, evaluate_expression,
                                last_number)
from mezo_rl.tasks import KINDS, SPLITS, ArithmeticTask, CountdownTask, get_task, list_tasks
from mezo_rl.tasks.verifiable import PAPER_PROMPT, VARIANTS, countdown_prompt


def splits(task):
    return {s: task.examples(s) for s in SPLITS}


def questions(examples):
    return [ex.prompt for ex in examples]


def call(name, completions, prompts=None, **columns):
    """A reward called as the objective calls it: keywords only."""
    prompts = prompts if prompts is not None else ["p"] * len(completions)
    return get_reward(name).fn(prompts=prompts, completions=completions, **columns)


# ---------------------------------------------------------------------------------------- registry
def test_variants_are_registered_prompt_tasks_naming_their_reward():
    names = set(list_tasks())
    assert {"arithmetic", "countdown", "countdown-paper"} <= set(VARIANTS) <= names
    assert {"exact_answer", "countdown", "countdown_correct"} <= set(rewards.list_rewards())
    for name in VARIANTS:
        task = get_task(name)
        assert task.kind == "prompts" and task.kind in KINDS and task.name == name
        assert task.metrics and all(m in rewards.list_rewards() for m in task.metrics)
        assert task.description and "\n" not in task.description
        build_objective(task.metrics).check_task_kind(task.kind)  # the task's rewards fit its kind
    assert get_task("arithmetic").metrics == ["exact_answer"] and get_task("countdown").metrics[0] == "countdown"


def test_get_task_options_override_a_variant():
    task = get_task("arithmetic", operations="*", digits=1, sizes={"train": 10, "validation": 5, "test": 5})
    assert task.operations == ("*",) and task.digits == (1, 1) and task.name == "arithmetic"
    assert all(" * " in ex.columns["question"] for ex in task.examples("train"))


# ---------------------------------------------------------------------------------------- generators
@pytest.mark.parametrize("make", [
    lambda seed: ArithmeticTask(operations="+-*/", digits=2, seed=seed),
    lambda seed: CountdownTask(count=(3, 4), max_number=50, seed=seed),
], ids=["arithmetic", "countdown"])
def test_generators_are_deterministic_in_the_seed(make):
    a, b, c = splits(make(0)), splits(make(0)), splits(make(1))
    for s in SPLITS:
        assert questions(a[s]) == questions(b[s]) and [ex.columns for ex in a[s]] == [ex.columns for ex in b[s]]
        assert questions(a[s]) != questions(c[s])


@pytest.mark.parametrize("name", list(VARIANTS))
def test_splits_are_disjoint_and_sized(name):
    task = get_task(name)
    parts = splits(task)
    if name.startswith("countdown"):  # a puzzle is its numbers (as a multiset) and its target
        keys = {s: {(tuple(sorted(ex.columns["numbers"])), ex.columns["target"]) for ex in parts[s]} for s in SPLITS}
    else:
        keys = {s: {ex.columns["question"] for ex in parts[s]} for s in SPLITS}
    for s in SPLITS:
        assert len(keys[s]) == len(parts[s]) > 0  # no repeats inside a split
    assert not keys["train"] & keys["validation"] and not keys["train"] & keys["test"]
    assert not keys["validation"] & keys["test"]
    if name.startswith("countdown"):  # the curriculum's stages have sizes of their own
        from mezo_rl.tasks.verifiable import CURRICULUM, CURRICULUM_SIZES
        want = CURRICULUM_SIZES[task.count[0]] if name in CURRICULUM else {"train": 200, "validation": 200, "test": 2000}
        assert {s: len(parts[s]) for s in SPLITS} == want


def test_load_split_samples_like_any_task():
    task = get_task("arithmetic")
    assert [len(task.load_split(s)) for s in SPLITS] == [1000, 200, 500]
    a = task.load_split("test", n=50, seed=3)
    assert questions(a) == questions(task.load_split("test", n=50, seed=3)) and len(a) == 50
    assert questions(a) != questions(task.load_split("test", n=50, seed=4))
    assert set(questions(a)) <= set(questions(task.examples("test")))
    with pytest.raises(ValueError):
        task.load_split("dev")


def test_small_question_spaces_are_shared_between_the_splits():
    task = ArithmeticTask(operations="*", digits=1)  # 81 questions
    parts = splits(task)
    sizes = [len(parts[s]) for s in SPLITS]
    assert sum(sizes) == 81 and all(n > 0 for n in sizes)
    assert sizes[0] > sizes[2] > sizes[1]  # in proportion to 1000 / 200 / 500


def test_arithmetic_questions_answers_and_forms():
    for ex in ArithmeticTask(operations="+-*/", digits=(1, 2), sizes={"train": 300}).examples("train"):
        a, op, b = re.fullmatch(r"What is (\d+) ([-+*/]) (\d+)\?", ex.columns["question"]).groups()
        a, b = int(a), int(b)
        expected = {"+": a + b, "-": a - b, "*": a * b, "/": Fraction(a, b)}[op]
        assert Fraction(ex.columns["answer"]) == expected and expected >= 0
        if op == "/":
            assert expected.denominator == 1
        assert ex.messages == [{"role": "user", "content": ex.prompt}]
        assert ex.prompt == f"{ex.columns['question']} Reply with the number only."
        assert ex.candidates is None and ex.answers is None and ex.label is None
    plain = get_task("arithmetic-plain").examples("test")[0]
    assert plain.messages is None and plain.prompt == f"Question: {plain.columns['question']}\nAnswer:"
    two = ArithmeticTask(digits=2).examples("test")
    assert all(10 <= int(n) <= 99 for ex in two for n in re.findall(r"\d+", ex.columns["question"]))
    assert get_task("arithmetic").demonstration(plain) == f"{plain.prompt} {plain.columns['answer']}"


def test_every_countdown_puzzle_is_solvable_with_its_solution():
    for name in ("countdown", "countdown4", "countdown-paper"):
        task = get_task(name)
        for ex in task.examples("test") + task.examples("train"):
            numbers, target, solution = ex.columns["numbers"], ex.columns["target"], ex.columns["solution"]
            value, used = evaluate_expression(solution)
            assert value == target and Counter(used) == Counter(numbers)
            assert isinstance(target, int) and 1 <= target <= 1000
            assert task.count[0] <= len(numbers) <= task.count[1] and all(1 <= n <= task.max_number for n in numbers)
            completion = f"<answer> {solution} </answer>"
            assert call("countdown_correct", [completion], [ex.prompt], numbers=[numbers], target=[target]) == [1.0]


def test_countdown_forms():
    chat = get_task("countdown").examples("test")[0]
    n, t = chat.columns["numbers"], chat.columns["target"]
    assert chat.messages == [{"role": "user", "content": chat.prompt}]
    assert chat.prompt == countdown_prompt(n, t) and f"[{', '.join(map(str, n))}]" in chat.prompt
    assert f"equals {t}." in chat.prompt and "<answer>" in chat.prompt
    paper = get_task("countdown-paper").examples("test")[0]
    assert paper.messages is None and paper.prompt.endswith("Let me solve this step by step.\n<think>")
    n, t = paper.columns["numbers"], paper.columns["target"]
    assert paper.prompt == PAPER_PROMPT.format(numbers=" ".join(map(str, n)), target=t)
    # ES-at-scale's countdown.json, item 0, verbatim
    assert countdown_prompt([44, 19, 35], 98, chat=False) == (
        "You are a helpful assistant. You first think about the reasoning process in your mind and then provide the "
        "user with the answer.Using the numbers [44 19 35], create an equation that equals 98. You can use basic "
        "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in <think> </think> "
        "tags. And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>.Let "
        "me solve this step by step.\n<think>")


# ---------------------------------------------------------------------------------------- bad options
@pytest.mark.parametrize("make, named", [
    (lambda: ArithmeticTask(operations="+%"), "'%'"),
    (lambda: get_task("arithmetic", operations=["add", "pow"]), "'pow'"),
    (lambda: ArithmeticTask(operations=""), "''"),
    (lambda: ArithmeticTask(digits=0), "digits=0"),
    (lambda: ArithmeticTask(digits=7), "digits=7"),
    (lambda: ArithmeticTask(digits=(1, 9)), "digits=9"),
    (lambda: ArithmeticTask(digits="2"), "digits='2'"),
    (lambda: CountdownTask(count=1), "count=1"),
    (lambda: CountdownTask(count=(3, 9)), "count=9"),
    (lambda: CountdownTask(count=(4, 3)), "count=(4, 3)"),
    (lambda: get_task("countdown", max_number=1), "max_number=1"),
    (lambda: CountdownTask(max_number=5000), "max_number=5000"),
    (lambda: CountdownTask(sizes={"dev": 3}), "sizes="),
    (lambda: ArithmeticTask(sizes={"train": 0}), "sizes['train']=0"),
    (lambda: ArithmeticTask(chat="yes"), "chat='yes'"),
])
def test_bad_options_are_one_line_config_errors(make, named):
    with pytest.raises(ConfigError) as info:
        make()
    message = str(info.value)
    assert isinstance(info.value, UserError) and "\n" not in message
    assert named in message and "accepted" in message


# ---------------------------------------------------------------------------------------- exact_answer
@pytest.mark.parametrize("completion, answer, expected", [
    ("85", "85", 1.0),
    (" 85", "85", 1.0),
    ("The answer is 85.", "85", 1.0),
    ("37 + 48 = 85", "85", 1.0),
    ("**85**", "85", 1.0),
    ("85.0", "85", 1.0),
    ("1,234", "1234", 1.0),
    ("It is 1234.", "1,234", 1.0),
    ("-11", "-11", 1.0),
    ("37 - 48 = -11.", "-11", 1.0),
    ("\u221211", "-11", 1.0),
    ("48-11", "37", 0.0),
    ("48-11", "11", 1.0),
    ("85 or maybe 86", "85", 0.0),
    ("86", "85", 0.0),
    ("8", "85", 0.0),
    ("eighty-five", "85", 0.0),
    ("", "85", 0.0),
    ("x85", "85", 0.0),
    ("... #### 72", "Natalia sold 48/2 = 24 clips. #### 72", 1.0),
    ("3.5", "3.5", 1.0),
    ("12,34", "34", 1.0),
])
def test_exact_answer(completion, answer, expected):
    assert call("exact_answer", [completion], answer=[answer]) == [expected]


def test_exact_answer_columns_and_conversational_completions():
    chat = [[{"role": "assistant", "content": "37 + 48 = 85."}], [{"role": "assistant", "content": "84"}]]
    assert call("exact_answer", chat, answer=["85", 85]) == [1.0, 0.0]
    assert call("exact_answer", ["1", "2"], answer=[None, ""]) == [None, None]  # no gold: no opinion
    with pytest.raises(ValueError, match="holds no number"):
        call("exact_answer", ["1"], answer=["none"])
    spec = get_reward("exact_answer")
    assert spec.required_columns == ("answer",) and spec.needs == "generation" and spec.higher_is_better
    assert last_number("no digits") is None and last_number("a 1,000,000 b") == 1000000


def test_exact_answer_through_the_objective():
    task = get_task("arithmetic")
    exs = task.load_split("test", n=4, seed=0)
    objective = build_objective(task.metrics)
    objective.check_columns(set(exs[0].columns), task_kind=task.kind)
    completions = [[{"role": "assistant", "content": ex.columns["answer"]}] for ex in exs[:2]] + ["no idea", "0"]
    out = objective.evaluate(prompts=[ex.messages for ex in exs], completions=completions,
                             columns={"answer": [ex.columns["answer"] for ex in exs],
                                      "question": [ex.columns["question"] for ex in exs]})
    assert out.values["exact_answer"] == [1.0, 1.0, 0.0, 0.0] and out.components["exact_answer"] == 0.5


# ---------------------------------------------------------------------------------------- countdown
NUMBERS, TARGET = [44, 19, 35], 98


def countdown(completions, prompt="p", numbers=NUMBERS, target=TARGET, name="countdown"):
    return call(name, completions, [prompt] * len(completions), numbers=[numbers] * len(completions),
                target=[target] * len(completions))


def test_countdown_right_and_wrong():
    assert countdown(["<answer> 44 + 19 + 35 </answer>", "<answer>(35+19)+44</answer>"]) == [1.05, 1.05]
    assert countdown(["<answer> 44 + 19 - 35 </answer>"]) == [0.05]  # right numbers, wrong value: format only
    assert countdown(["44 + 19 + 35"]) == [0.0]  # no tags: no format, no answer
    assert countdown(["<answer> 44 + 19 + 35 = 98 </answer>"]) == [0.05]  # '=' is not accepted, as published
    assert countdown(["<answer>1</answer> then <answer>44+19+35</answer>"]) == [1.05]  # the last answer counts
    assert countdown(["<answer>44+19+35</answer> then <answer>1</answer>"]) == [0.05]
    assert countdown(["<answer> 44 + 19 + 35 </answer>"], name="countdown_correct") == [1.0]
    assert countdown(["<answer> 44 + 19 - 35 </answer>"], name="countdown_correct") == [0.0]


@pytest.mark.parametrize("expression", [
    "44 + 44 + 35",        # a number used twice, one missing
    "44 + 19",             # one missing
    "44 + 19 + 35 + 0",    # a number not given
    "44 + 19 + 35 * 1",
    "4 + 4 + 19 + 35",     # digits split
    "4419 + 35",           # digits joined
    "(44 + 19) + 35 - 0",
])
def test_countdown_wrong_use_of_numbers(expression):
    assert countdown([f"<answer>{expression}</answer>"], name="countdown_correct") == [0.0]


def test_countdown_numbers_may_repeat():
    assert countdown(["<answer>(6 + 6) * 2</answer>"], numbers=[6, 2, 6], target=24, name="countdown_correct") == [1.0]
    assert countdown(["<answer>6 * 2 * 2</answer>"], numbers=[6, 2, 6], target=24, name="countdown_correct") == [0.0]


def test_countdown_division():
    right = lambda expr, numbers, target: countdown([f"<answer>{expr}</answer>"], numbers=numbers, target=target,
                                                    name="countdown_correct")[0]
    assert right("84 / 4 + 1", [84, 4, 1], 22) == 1.0  # exact
    assert right("(7 / 2) * 4", [7, 2, 4], 14) == 1.0  # a non-integer intermediate, exact in fractions
    assert right("1 / 3 * 3", [1, 3, 3], 1) == 1.0
    assert right("7 / 2", [7, 2], 3) == 0.0 and right("7 / 2", [7, 2], 3.5) == 1.0
    assert right("5 / (3 - 3)", [5, 3, 3], 1) == 0.0  # division by zero
    assert right("8 // 3", [8, 3], 2) == 0.0  # floor division is not accepted


def test_countdown_format_as_published():
    # ES-at-scale's prompt ends in <think>: their reward scores "<think>" + completion
    paper = get_task("countdown-paper").examples("test")[0]
    n, t, solution = paper.columns["numbers"], paper.columns["target"], paper.columns["solution"]
    full = f" I add them.</think>\n<answer>{solution}</answer>"
    assert countdown([full], prompt=paper.prompt, numbers=n, target=t) == [1.1]
    one_line = f" I add them.</think> <answer>{solution}</answer>"
    assert countdown([one_line], prompt=paper.prompt, numbers=n, target=t) == [pytest.approx(1.06)]
    assert countdown([one_line], prompt="chat prompt", numbers=n, target=t) == [pytest.approx(1.05)]
    assert countdown(["</think>\n<answer>nothing</answer>"], prompt=paper.prompt, numbers=n, target=t) == [
        pytest.approx(0.1)]
    assert countdown_format_score("<think>a</think>\n<answer>b</answer>\n") == 1.0
    assert countdown_format_score("<think>a</think><answer>b</answer>") == pytest.approx(0.6)
    assert countdown_format_score("<answer>b</answer>") == 0.5 and countdown_format_score("<think>a") == 0.0


def test_countdown_matches_the_published_regular_expressions():
    think = re.compile(r"<think>.*?</think>", re.DOTALL)
    answer = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
    full = re.compile(r"^<think>.*?</think>\n<answer>.*?</answer>$", re.DOTALL)
    parts = ["<think>", "</think>", "<answer>", "</answer>", "\n", "1+2", " ", "x", "</think>\n<answer>"]
    rng = random.Random(0)
    for _ in range(20000):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 8)))
        assert answer_contents(text) == answer.findall(text)
        expected = 1.0 if full.match(text) else (0.1 if think.search(text) else 0.0) + (
            0.5 if answer.search(text) else 0.0)
        assert countdown_format_score(text) == expected


def test_countdown_columns_and_conversational_completions():
    chat = [[{"role": "assistant", "content": "<answer>44 + 19 + 35</answer>"}]]
    assert call("countdown", chat, [[{"role": "user", "content": "q"}]], numbers=[NUMBERS], target=[98]) == [1.05]
    # numbers from a data file may be text; targets may be text
    assert call("countdown_correct", ["<answer>44+19+35</answer>"], numbers=["[44 19 35]"], target=["98"]) == [1.0]
    assert call("countdown", ["x"], numbers=[None], target=[98]) == [None]
    assert get_reward("countdown").required_columns == ("numbers", "target")
    task = get_task("countdown")
    build_objective(task.metrics).check_columns(set(task.examples("test")[0].columns), task_kind=task.kind)


HOSTILE = [
    "2**99999999",
    "9**9**9",
    "2 ** 99999999",
    "(9)**(9)**(9)",
    "__import__('os').system('true')",
    "().__class__.__bases__[0]",
    "open('/etc/passwd').read()",
    "[44, 19, 35]",
    "44 + 19 + 35; 1",
    "lambda: 1",
    "1e999",
    "44 + 19 + 35 " + "+ 0 " * 3_000,
    "1" * 10_000,
    "+" * 10_000 + "1",
    "-" * 5_000 + "44 + 19 + 35",
    "(" * 5_000 + "44 + 19 + 35" + ")" * 5_000,
    "(" * 40 + "44 + 19 + 35" + ")" * 40,
    "99999999999999 * 99999999999999",
    "999999 * 999999 * 999999",
]


@pytest.mark.parametrize("expression", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_expressions_score_zero_at_once(expression):
    with pytest.raises(ExpressionError):
        evaluate_expression(expression)
    assert countdown([f"<answer>{expression}</answer>"], name="countdown_correct") == [0.0]
    assert countdown([f"<answer>{expression}</answer>"]) == [pytest.approx(0.05)]  # the format credit stays
    assert countdown([expression]) == [0.0]  # not in answer tags: nothing


def test_hostile_completions_return():
    long = ["x" * 10_000, "<answer>" * 5_000, "<think>" * 3_000 + "</think>\n<answer>" * 3_000,
            "<answer>" + "(" * 100_000 + "</answer>", "9" * 100_000]
    assert countdown(long, prompt="...<think>", name="countdown_correct") == [0.0] * len(long)
    assert call("exact_answer", long, answer=["1"] * len(long)) == [0.0] * len(long)


def test_the_parser():
    assert evaluate_expression("1 + 2 * 3") == (7, [1, 2, 3])
    assert evaluate_expression("(1 + 2) * 3") == (9, [1, 2, 3])
    assert evaluate_expression("8 / 4 / 2") == (1, [8, 4, 2])  # left to right
    assert evaluate_expression("10 - 4 - 3") == (3, [10, 4, 3])
    assert evaluate_expression("-(3 - 5)") == (2, [3, 5])  # a sign, as Python reads it
    assert evaluate_expression(" 7 ")[0] == 7 and evaluate_expression("0")[0] == 0
    for bad in ["", " ", "1 +", "(1", "1)", "()", "1 2", "2(3)", "05 + 1", "1.5", "1\n+ 2", "1 +\t2", "1 ^ 2", "1 % 2"]:
        with pytest.raises(ExpressionError):
            evaluate_expression(bad)



def test_a_verifiable_task_evaluates_with_its_own_reward(tiny_causal_lm):
    """`mezo-rl eval --task arithmetic` needs no --reward: the task names exact_answer (task.metrics)."""
    from mezo_rl.model.lm import LanguageModel
    from mezo_rl.training.evaluation import evaluate

    task = get_task("arithmetic-plain")
    examples = task.load_split("test", n=6, seed=0)
    metrics = evaluate(LanguageModel(*tiny_causal_lm), task, examples, max_new_tokens=4)
    assert metrics["n"] == 6 and 0.0 <= metrics["exact_answer"] <= 1.0 and "exact_answer/se" in metrics


def test_a_verifiable_task_trains_on_another_reward_and_picks_its_best_step_by_that_objective(tmp_path,
                                                                                           tiny_model_dir):
    """`--task arithmetic-plain --reward FILE:fn`: the task's own exact_answer is not evaluated then, so the best
    step is picked by the run's objective (it used to ask for exact_answer and stop with exit 2)."""
    import json

    from mezo_rl.cli.main import main

    (tmp_path / "rewards_file.py").write_text("def short(completions, **kwargs):\n"
                                              "    return [-len(c) for c in completions]\n")
    run = tmp_path / "run"
    assert main(["train", "--model", str(tiny_model_dir), "--task", "arithmetic-plain", "--reward",
                 f"{tmp_path / 'rewards_file.py'}:short", "--peft", "norm", "--max-steps", "1", "--eval-steps", "1",
                 "--per-device-train-batch-size", "2", "--num-train", "4", "--num-eval", "2", "--num-test", "2",
                 "--max-completion-length", "3", "--autocast", "none", "--no-progress", "--output-dir", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["metric_for_best"] == "objective" and "exact_answer" not in summary["test"]


# ---------------------------------------------------------------------------------------- the curriculum (issue 70)
def lenient(completions, numbers=(14, 3), target=17, name="countdown_lenient"):
    return call(name, list(completions), numbers=[list(numbers)] * len(completions), target=[target] * len(completions))


def test_lenient_countdown_accepts_a_two_number_answer_without_tags():
    from mezo_rl.rewards.verifiable import PARTIAL_CREDIT
    right = ["14 + 3", "14 + 3 = 17", "17 = 3 + 14", "<answer>14 + 3</answer>", "Answer: 14 + 3.",
             "Let me think.\n14 + 3 = 17", [{"role": "assistant", "content": "3 + 14 = 17"}]]
    assert lenient(right) == [1.0] * len(right)
    assert lenient(right, name="countdown_solved") == [1.0] * len(right)
    # well formed over the given numbers, each once, but another value: partial credit only
    assert lenient(["14 - 3 = 11", "14 * 3", "<answer>14 / 3</answer>"]) == [PARTIAL_CREDIT] * 3
    assert lenient(["14 - 3"], name="countdown_solved") == [0.0]
    # the final answer counts: a right equation followed by a wrong one is the wrong one
    assert lenient(["14 + 3 = 17\n14 - 3 = 11"]) == [PARTIAL_CREDIT]
    assert lenient(["17"]) == [0.0]  # the target alone is no equation over the numbers


LENIENT_HOSTILE = [
    "", " \n ", "no numbers here",
    "14 + 14 = 28", "3 + 3 + 14 = 20",              # a number used twice
    "14 + 4 = 18", "14 + 3 + 0 = 17", "14 + 3 + 1 - 1 = 17",   # a number not given
    "14", "3",                                       # a number missing
    "__import__('os').system('echo 14 + 3')", "eval('14 + 3')", "exec(\"print(14+3)\")",
    "(lambda: 14 + 3)()", "14 + 3 if True else 0", "14 .__add__(3)",
    "14 ** 3 ** 99999999", "9 ** 9 ** 9", "14 * 10 ** 9999 + 3", "1" * 5_000 + " + 3",
    "14 / (3 - 3)", "14 / 0 + 3", "(14 - 14) / 0",
    "14 + 3 " * 20_000,                              # the answer repeated on one line: not one expression
    "14 + 3 = 17 = 17 = 17 = 17",                    # an equation chain longer than a = b = c
    "<answer>" + "(" * 50_000 + "14 + 3" + ")" * 50_000 + "</answer>",
]


@pytest.mark.parametrize("completion", LENIENT_HOSTILE, ids=range(len(LENIENT_HOSTILE)))
def test_lenient_countdown_refuses_hostile_completions(completion):
    assert lenient([completion]) == [0.0]
    assert lenient([completion], name="countdown_solved") == [0.0]


def test_lenient_countdown_never_pays_more_than_one_answer_for_repeats():
    # the right answer on many lines (or in many tags): the final answer is read once, so at most 1.0
    many = ["14 + 3 = 17\n" * 50_000, "<answer>14 + 3</answer>" * 50_000, "14 + 3 = 17\n" * 1000 + "14 + 14"]
    assert lenient(many) == [1.0, 1.0, 0.0]


def test_lenient_countdown_columns():
    assert call("countdown_lenient", ["14 + 3", "x"], numbers=[[14, 3], None], target=[17, None]) == [1.0, None]
    assert call("countdown_lenient", ["14 + 3"], numbers=["[14 3]"], target=["17"]) == [1.0]
    with pytest.raises(ValueError, match="entries"):
        call("countdown_lenient", ["a", "b"], numbers=[[1, 2]], target=[3, 3])


def test_the_curriculum_stages_are_chat_countdown_with_the_lenient_reward():
    from mezo_rl.tasks.verifiable import CURRICULUM
    for count, name in enumerate(CURRICULUM, start=2):
        task = get_task(name)
        assert task.metrics == ["countdown_lenient", "countdown_solved"] and task.chat
        splits = {s: task.load_split(s) for s in SPLITS}
        assert all(len(ex.columns["numbers"]) == count and ex.messages for exs in splits.values() for ex in exs)
        keys = [{(tuple(sorted(ex.columns["numbers"])), ex.columns["target"]) for ex in exs} for exs in splits.values()]
        assert not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])  # the splits share no puzzle
        # every puzzle's own solution earns the full reward, without tags
        exs = splits["validation"][:20]
        assert call("countdown_lenient", [ex.columns["solution"] for ex in exs],
                    numbers=[ex.columns["numbers"] for ex in exs], target=[ex.columns["target"] for ex in exs]) \
            == [1.0] * len(exs)
