"""Verifiable tasks generated from a seed: ``arithmetic`` and ``countdown`` (no download, no data directory).

Both are prompt tasks (kind ``"prompts"``): no candidates and no teacher-forcing answer; the gold
answer sits in the example's columns, which reach the rewards as keywords. A completion is either
right or wrong, so a gain on them cannot come from gaming a scorer.

``arithmetic``: questions such as ``What is 37 + 48? Reply with the number only.``; the column
``answer`` holds the result as text (``"85"``), which the reward ``exact_answer`` compares with the
last number of the completion.

``countdown``: the task of ES-at-scale (Qiu et al., "Evolution Strategies at Scale", 2025), from
TinyZero: given numbers and a target, write one expression that uses every number once and equals the
target. The columns ``numbers`` (a list of int) and ``target`` (an int) feed the reward ``countdown``
(their published reward: 0.1 x format + 1.0 x correct; see :mod:`mezo_rl.rewards.verifiable`), and
``solution`` holds one expression that reaches the target (every puzzle is built from one, so every
puzzle can be solved).

    >>> from mezo_rl.tasks import get_task
    >>> task = get_task("arithmetic")                        # two-digit addition, chat form
    >>> task = get_task("arithmetic", operations="+-*", digits=(1, 2))
    >>> from mezo_rl.tasks.verifiable import CountdownTask
    >>> task = CountdownTask(count=4, max_number=50, chat=False)

Options reach the tasks through their constructors (``get_task(name, **options)``, or a
``file.py:function`` task that builds one); the command line has no per-task options, so the useful
settings are also registered under their own names (:data:`VARIANTS`, listed by ``mezo-rl tasks``).

Generation: each task draws its questions from one ``random.Random`` stream seeded with its ``seed``
option (and its settings), skips a question it has already drawn, and deals each new one to the split
that is least full relative to its size: test, validation and train never share a question, and the
same seed always gives the same splits. Where the settings allow fewer distinct questions than the
sizes ask for (one-digit multiplication), every split gets its share of what exists, and a warning says
so. ``load_split(split, n=..., seed=...)`` then samples from a split as for any task.

Forms: ``chat=True`` puts the question in one user message (``Example.messages``), which the model
renders with its chat template (an instruct model); ``chat=False`` gives plain text for any model.
Completions end at EOS and at the run's ``--stop`` strings, not at a newline (as TRL's). The chat forms
ask for a short answer; Countdown's plain form is ES-at-scale's prompt as published (it opens a
``<think>`` block and asks for the answer in ``<answer>`` tags after it).
"""
from __future__ import annotations

import random
from fractions import Fraction

from mezo_rl.errors import ConfigError

from .base import SPLITS, Example, Task, register_task
from .data import warn_once

__all__ = ["ArithmeticTask", "CountdownTask", "OPERATIONS", "DIGITS", "COUNTS", "MAX_NUMBERS", "TARGET_MAX",
           "ARITHMETIC_SIZES", "COUNTDOWN_SIZES", "COUNTDOWN_REWARDS",
           "CURRICULUM", "VARIANTS", "parse_operations", "countdown_prompt"]

OPERATIONS = {"+": "add", "-": "sub", "*": "mul", "/": "div"}
DIGITS = (1, 6)        # accepted digits per operand (inclusive)
COUNTS = (2, 6)        # accepted count of Countdown numbers (inclusive)
MAX_NUMBERS = (2, 999)  # accepted largest Countdown number (numbers are drawn from 1..max_number)
TARGET_MAX = 1000      # Countdown targets are integers in 1..TARGET_MAX
ARITHMETIC_SIZES = {"train": 1000, "validation": 200, "test": 500}
COUNTDOWN_SIZES = {"train": 200, "validation": 200, "test": 2000}  # ES-at-scale: 200 train, 2,000 test
#: Countdown's rewards -> the metric that reports their 0/1 part (the share of puzzles solved)
COUNTDOWN_REWARDS = {"countdown": "countdown_correct", "countdown_lenient": "countdown_solved"}
#: issue 70's curriculum: 2-number puzzles in chat form (where a small instruct model sometimes answers right,
#: without tags), then 3, then 4, each scored by ``countdown_lenient``; a stage starts from the previous stage's pick
CURRICULUM = ("countdown-curriculum2", "countdown-curriculum3", "countdown-curriculum4")
CURRICULUM_SIZES = {2: {"train": 250, "validation": 200, "test": 200},
                    3: {"train": 1000, "validation": 200, "test": 500},
                    4: {"train": 1000, "validation": 200, "test": 500}}
MAX_MISSES = 5000  # draws in a row that find no new question: the settings allow no more

# ES-at-scale's Countdown prompt, verbatim (countdown/data/countdown.json in VsonicV/es-fine-tuning-paper:
# the sentences are joined without spaces and the numbers are printed as a numpy array, "[44 19 35]").
PAPER_PROMPT = ("You are a helpful assistant. You first think about the reasoning process in your mind and then "
                "provide the user with the answer.Using the numbers [{numbers}], create an equation that equals "
                "{target}. You can use basic arithmetic operations (+, -, *, /) and each number can only be used "
                "once. Show your work in <think> </think> tags. And return the final answer in <answer> </answer> "
                "tags, for example <answer> (1 + 2) / 3 </answer>.Let me solve this step by step.\n<think>")
# The chat form: the same task, answered with the equation alone. It
# gives no example equation: a small instruct model copies one ("1 + 2 = 3") instead of trying the puzzle.
CHAT_PROMPT = ("Using the numbers [{numbers}], create an equation that equals {target}. You can use basic "
               "arithmetic operations (+, -, *, /) and each number can only be used once. Reply with the "
               "equation only, inside <answer> </answer> tags.")


def countdown_prompt(numbers, target, chat: bool = True) -> str:
    """The text of a Countdown question: the chat form's user message, or ES-at-scale's prompt (``chat=False``)."""
    if chat:
        return CHAT_PROMPT.format(numbers=", ".join(map(str, numbers)), target=target)
    return PAPER_PROMPT.format(numbers=" ".join(map(str, numbers)), target=target)


# ---------------------------------------------------------------------------------------- options
def parse_operations(operations) -> tuple[str, ...]:
    """``"+-"``, ``"+,-"``, ``["add", "mul"]`` ... -> the operation symbols, in the order of :data:`OPERATIONS`."""
    if isinstance(operations, str):
        parts = [p for p in operations.replace(",", " ").split() if p]
        if len(parts) == 1 and parts[0] not in OPERATIONS.values():
            parts = list(parts[0])  # "+-*"
    elif isinstance(operations, (list, tuple, set, frozenset)):
        parts = [str(p).strip() for p in operations]
    else:
        parts = [repr(operations)]
    names = {v: k for k, v in OPERATIONS.items()}
    symbols = []
    for p in parts:
        symbol = names.get(p.lower(), p)
        if symbol not in OPERATIONS:
            raise ConfigError(f"arithmetic: unknown operation {p!r} in operations={operations!r}; accepted: "
                              f"{' '.join(OPERATIONS)} (or {', '.join(OPERATIONS.values())}), e.g. operations='+-'")
        symbols.append(symbol)
    if not symbols:
        raise ConfigError(f"arithmetic: operations={operations!r} names no operation; accepted: {' '.join(OPERATIONS)}")
    return tuple(s for s in OPERATIONS if s in symbols)


def _int_in(value, bounds, what: str, accepted: str) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and bounds[0] <= value <= bounds[1]
    if not ok:
        raise ConfigError(f"{what}={value!r} is out of range; accepted: {accepted}")
    return value


def _pair(value, bounds, what: str, accepted: str) -> tuple[int, int]:
    """An int, or a pair of ints, each within ``bounds``: as a pair."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return tuple(_int_in(v, bounds, what, accepted) for v in value)
    v = _int_in(value, bounds, what, accepted)
    return v, v


def _sizes(sizes, default: dict, name: str) -> dict:
    if sizes is None:
        return dict(default)
    if not isinstance(sizes, dict) or set(sizes) - set(SPLITS):
        raise ConfigError(f"{name}: sizes={sizes!r}; accepted: a dict of split -> count, splits {', '.join(SPLITS)}")
    out = dict(default, **sizes)
    for split, n in out.items():
        if not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
            raise ConfigError(f"{name}: sizes[{split!r}]={n!r}; accepted: an integer >= 1")
    return out


def _seed(seed, name: str) -> int:
    if not (isinstance(seed, int) and not isinstance(seed, bool)):
        raise ConfigError(f"{name}: seed={seed!r}; accepted: an integer")
    return seed


def deal(draw, sizes: dict, rng: random.Random, name: str) -> dict:
    """Split -> items: ``draw(rng)`` gives ``(key, item)`` or None (rejected); each new key goes to the
    split least full relative to its size (test, then validation, then train on ties). Stops when every
    split is full or :data:`MAX_MISSES` draws in a row bring nothing new."""
    out = {s: [] for s in SPLITS}
    order = ("test", "validation", "train")
    seen, misses = set(), 0
    while misses < MAX_MISSES:
        open_splits = [s for s in order if len(out[s]) < sizes[s]]
        if not open_splits:
            break
        got = draw(rng)
        if got is None or got[0] in seen:
            misses += 1
            continue
        misses = 0
        seen.add(got[0])
        split = min(open_splits, key=lambda s: len(out[s]) / sizes[s])
        out[split].append(got[1])
    if any(len(out[s]) < sizes[s] for s in SPLITS):
        got = ", ".join(f"{s} {len(out[s])}" for s in SPLITS)
        warn_once(f"task {name!r}: its settings give only {len(seen)} distinct questions, fewer than the sizes ask "
                  f"for ({', '.join(f'{s} {sizes[s]}' for s in SPLITS)}); the splits have {got}")
    return out


class GeneratedTask(Task):
    """A prompt task whose splits are generated from a seed (subclasses: ``_draw(rng) -> (key, Example) | None``)."""

    kind = "prompts"

    def _settings(self) -> str:
        """Everything that shapes the questions, for the generator's seed."""
        raise NotImplementedError

    def _draw(self, rng: random.Random):
        raise NotImplementedError

    def examples(self, split: str, data_dir=None) -> list[Example]:
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
        if getattr(self, "_splits", None) is None:
            rng = random.Random(f"{type(self).__name__}/{self._settings()}/seed={self.seed}")
            self._splits = deal(self._draw, self.sizes, rng, self.name)
        return list(self._splits[split])


# ---------------------------------------------------------------------------------------- arithmetic
def _operand_range(digits: int) -> tuple[int, int]:
    return 10 ** (digits - 1), 10 ** digits - 1


class ArithmeticTask(GeneratedTask):
    """Arithmetic questions ("What is 37 + 48? Reply with the number only."), generated from a seed; reward ``exact_answer``.

    Args:
        operations: the operations to draw from: symbols ``+ - * /`` (``"+-"``, ``"+,-"``) or names
            ``add sub mul div``. Subtraction puts the larger operand first (answers are never
            negative); division asks ``a / b`` only where the quotient is a whole number (``b`` and the
            quotient have the given digits).
        digits: digits of each operand (1 means 1..9, 2 means 10..99, ...), or a pair, one per operand.
        chat: a chat message (``Example.messages``, for instruct models) or plain text
            (``Question: What is 37 + 48?\\nAnswer:``, for any model).
        sizes: split -> number of questions (default :data:`ARITHMETIC_SIZES`).
        seed: the generator's seed (``load_split``'s seed only samples from the generated split).
        name: the task's name.

    Columns: ``question`` (``"What is 37 + 48?"``) and ``answer`` (``"85"``).
    """

    def __init__(self, operations="+", digits=2, chat: bool = True, sizes: dict | None = None, seed: int = 0,
                 name: str = "arithmetic"):
        self.name = name
        self.operations = parse_operations(operations)
        self.digits = _pair(digits, DIGITS, "arithmetic: digits",
                            f"an integer from {DIGITS[0]} to {DIGITS[1]} (digits of each operand), or a pair of them")
        if not isinstance(chat, bool):
            raise ConfigError(f"arithmetic: chat={chat!r}; accepted: True or False")
        self.chat = chat
        self.sizes = _sizes(sizes, ARITHMETIC_SIZES, "arithmetic")
        self.seed = _seed(seed, "arithmetic")
        self._splits = None

    @property
    def metrics(self) -> list[str]:
        return ["exact_answer"]

    @property
    def description(self) -> str:
        ops = "".join(self.operations)
        d = self.digits[0] if self.digits[0] == self.digits[1] else f"{self.digits[0]}x{self.digits[1]}"
        return (f"verifiable arithmetic ({ops}, {d}-digit operands, {'chat' if self.chat else 'plain'}), "
                f"generated from a seed; reward exact_answer")

    def _settings(self) -> str:
        return f"ops={''.join(self.operations)},digits={self.digits}"

    def _draw(self, rng):
        op = rng.choice(self.operations)
        (lo_a, hi_a), (lo_b, hi_b) = _operand_range(self.digits[0]), _operand_range(self.digits[1])
        a, b = rng.randint(lo_a, hi_a), rng.randint(lo_b, hi_b)
        if op == "-" and a < b:
            a, b = b, a
        if op == "/":  # a / b with b and the quotient of the given digits: a = b * quotient
            a = a * b
        result = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
        question = f"What is {a} {op} {b}?"
        return question, self.make_example(question, result)

    def make_example(self, question: str, answer) -> Example:
        """The example of ``question`` (``"What is 37 + 48?"``) in this task's form, gold ``answer`` in column ``answer``."""
        columns = {"question": question, "answer": str(answer)}
        if self.chat:
            text = f"{question} Reply with the number only."
            return Example(text, columns=columns, messages=[{"role": "user", "content": text}])
        return Example(f"Question: {question}\nAnswer:", columns=columns)

    def demonstration(self, example: Example) -> str:
        return f"{example.prompt} {example.columns['answer']}"


# ---------------------------------------------------------------------------------------- countdown
def _random_solution(numbers: list[int], rng: random.Random):
    """A random expression over ``numbers`` (each once, random tree and operations) and its exact value;
    None where it divides by zero."""
    items = [(Fraction(n), str(n)) for n in numbers]
    while len(items) > 1:
        i = rng.randrange(len(items) - 1)
        (x, sx), (y, sy) = items[i], items[i + 1]
        op = rng.choice("+-*/")
        if op == "/" and y == 0:
            return None
        value = {"+": x + y, "-": x - y, "*": x * y, "/": x / y if y else 0}[op]
        items[i : i + 2] = [(value, f"({sx} {op} {sy})")]
    value, text = items[0]
    return value, text[1:-1] if text.startswith("(") else text


class CountdownTask(GeneratedTask):
    """Countdown (ES-at-scale, TinyZero): reach a target with the given numbers, each used once; reward ``countdown``.

    Args:
        count: how many numbers a puzzle gives, or a ``(fewest, most)`` pair (ES-at-scale: 3 to 4).
        max_number: the numbers are drawn from 1..max_number, with repeats (ES-at-scale: 99).
        chat: a chat message asking for the equation alone in ``<answer>`` tags (instruct models),
            or ES-at-scale's prompt as published, plain text that ends in ``<think>``.
        sizes: split -> number of puzzles (default :data:`COUNTDOWN_SIZES`: ES-at-scale's 200 train and
            2,000 test, plus a validation split of its own).
        seed: the generator's seed (``load_split``'s seed only samples from the generated split).
        name: the task's name.
        reward: the task's reward, ``countdown`` (ES-at-scale's: the answer in tags) or ``countdown_lenient``
            (the curriculum's: tags or not, partial credit for a well-formed expression over the numbers); the
            second metric is its 0/1 part (:data:`COUNTDOWN_REWARDS`).

    Each puzzle is built backwards: draw the numbers, combine them in random order with random
    operations, and keep the value as the target when it is a whole number in 1..TARGET_MAX. Columns:
    ``numbers`` (list of int, in the order the prompt shows them), ``target`` (int) and ``solution``
    (that expression).
    """

    def __init__(self, count=3, max_number: int = 20, chat: bool = True, sizes: dict | None = None, seed: int = 0,
                 name: str = "countdown", reward: str = "countdown"):
        self.name = name
        if reward not in COUNTDOWN_REWARDS:
            raise ConfigError(f"countdown: reward={reward!r}; accepted: {', '.join(COUNTDOWN_REWARDS)}")
        self.reward = reward
        self.count = _pair(count, COUNTS, "countdown: count",
                           f"an integer from {COUNTS[0]} to {COUNTS[1]} (numbers per puzzle), or a (fewest, most) pair")
        if self.count[0] > self.count[1]:
            raise ConfigError(f"countdown: count={count!r} has fewest > most; accepted: a (fewest, most) pair")
        self.max_number = _int_in(max_number, MAX_NUMBERS, "countdown: max_number",
                                  f"an integer from {MAX_NUMBERS[0]} to {MAX_NUMBERS[1]} (numbers are drawn from 1..max_number)")
        if not isinstance(chat, bool):
            raise ConfigError(f"countdown: chat={chat!r}; accepted: True or False")
        self.chat = chat
        self.sizes = _sizes(sizes, COUNTDOWN_SIZES, "countdown")
        self.seed = _seed(seed, "countdown")
        self._splits = None

    @property
    def metrics(self) -> list[str]:
        return [self.reward, COUNTDOWN_REWARDS[self.reward]]

    @property
    def description(self) -> str:
        c = self.count[0] if self.count[0] == self.count[1] else f"{self.count[0]}-{self.count[1]}"
        form = "chat, the equation in answer tags" if self.chat else "ES-at-scale's plain prompt"
        return f"Countdown ({c} numbers from 1..{self.max_number}, {form}), generated from a seed; reward {self.reward}"

    def _settings(self) -> str:
        return f"count={self.count},max={self.max_number}"

    def _draw(self, rng):
        numbers = [rng.randint(1, self.max_number) for _ in range(rng.randint(*self.count))]
        found = _random_solution(numbers, rng)
        if found is None:
            return None
        value, solution = found
        if value.denominator != 1 or not 1 <= value <= TARGET_MAX:
            return None
        target = int(value)
        return (tuple(sorted(numbers)), target), self.make_example(numbers, target, solution)

    def make_example(self, numbers, target: int, solution: str | None = None) -> Example:
        """The example of one puzzle in this task's form."""
        columns = {"numbers": list(numbers), "target": int(target), "solution": solution}
        text = countdown_prompt(numbers, target, chat=self.chat)
        if self.chat:
            return Example(text, columns=columns, messages=[{"role": "user", "content": text}])
        return Example(text, columns=columns)

    def demonstration(self, example: Example) -> str:
        return f"{example.prompt} <answer> {example.columns['solution']} </answer>"


# ---------------------------------------------------------------------------------------- registry
def _variant(name: str, cls, description: str, **defaults):
    """Register ``name``: ``cls`` with ``defaults`` (keyword arguments of ``get_task`` override them)."""

    def make(**options):
        return cls(**{**defaults, "name": name, **options})

    make.__name__ = make.__qualname__ = name.replace("-", "_")
    make.__doc__ = description
    register_task(name)(make)
    return make


#: name -> (class, options): the settings registered under their own names (the command line has no per-task options)
VARIANTS = {
    "arithmetic": (ArithmeticTask, dict(operations="+", digits=2, chat=True)),
    "arithmetic-plain": (ArithmeticTask, dict(operations="+", digits=2, chat=False)),
    "arithmetic-mul": (ArithmeticTask, dict(operations="*", digits=(1, 2), chat=True,  # 810 questions in all
                                            sizes={"train": 500, "validation": 100, "test": 200})),
    "arithmetic-mixed": (ArithmeticTask, dict(operations="+-*/", digits=2, chat=True)),
    "countdown": (CountdownTask, dict(count=3, max_number=20, chat=True)),
    "countdown4": (CountdownTask, dict(count=4, max_number=20, chat=True)),
    "countdown-paper": (CountdownTask, dict(count=(3, 4), max_number=99, chat=False)),
    # the curriculum's stages: 2-number puzzles from 1..20 number 654 in all (sizes within them), then 3 and 4
    **{name: (CountdownTask, dict(count=count, max_number=20, chat=True, reward="countdown_lenient",
                                  sizes=CURRICULUM_SIZES[count]))
       for count, name in enumerate(CURRICULUM, start=2)},
}
for _name, (_cls, _options) in VARIANTS.items():
    _variant(_name, _cls, _cls.__doc__.splitlines()[0], **_options)
