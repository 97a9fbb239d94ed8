"""Verifiable rewards: ``exact_answer`` (the last number of the completion) and ES-at-scale's ``countdown``.

``exact_answer`` reads the gold number from the column ``answer`` (``"85"``; a text gives its last
number, so GSM8K's ``"... #### 72"`` works) and scores 1.0 when the last number in the completion
equals it, else 0.0. Numbers may be negative (``-11``, also with the Unicode minus), carry thousands
commas (``1,234``) or decimals (``85.0`` equals ``85``); a full stop after a number is punctuation. A
minus right after a digit or a closing bracket is a subtraction, not a sign (``48-11`` ends in 11).

``countdown`` is the reward of ES-at-scale (Qiu et al. 2025, ``countdown/countdown_task.py`` in
VsonicV/es-fine-tuning-paper), ``0.1 * format + 1.0 * correct``:

* format: 1.0 when the text is exactly ``<think>...</think>\\n<answer>...</answer>``; otherwise
  0.1 for a ``<think>...</think>`` pair plus 0.5 for an ``<answer>...</answer>`` pair. As published,
  the text is ``"<think>" + completion`` when the prompt ends in ``<think>`` (their prompt opens the
  block); other prompts are scored on the completion as it is.
* correct: 1.0 when the last ``<answer>...</answer>`` holds an expression that uses the numbers of the
  column ``numbers`` each exactly once (as a multiset) and whose value is within 1e-5 of the column
  ``target``; else 0.0.

So a completion without tags scores 0, and one with tags around something that is not a right
expression keeps only its format credit, as in their code. ``countdown_correct`` is the correct part
alone (0 or 1: the fraction of puzzles solved).

``countdown_lenient`` is the curriculum's reward (issue 70: a small instruct model answers 2-number puzzles in
chat form without the tags): 1.0 for a right equation with or without ``<answer>`` tags, :data:`PARTIAL_CREDIT`
for a well-formed expression over the given numbers (each once) that misses the target, else 0
(:func:`lenient_countdown_score`); ``countdown_solved`` is its 0/1 part.

Where they call Python's ``eval``, the expression here goes through :func:`evaluate_expression`, a
small parser that accepts only what their character check lets through (digits, ``+ - * /``,
parentheses and spaces), reads numbers as decimal integers (no leading zeros, as Python), and
computes exactly with fractions. It is bounded: at most :data:`MAX_EXPRESSION_CHARS` characters,
:data:`MAX_DEPTH` nested parentheses or signs, and :data:`MAX_ABS_VALUE` for every value it meets.
``**`` and ``//`` (which ``eval`` would read as power and floor division) are refused before anything
is parsed, so ``2**99999999`` costs nothing, and division by zero fails; each of these scores 0.

Completions may be strings or TRL conversational completions (a list of ``{"role", "content"}``
messages: the last message's content is scored).
"""
from __future__ import annotations

import re
from collections import Counter
from fractions import Fraction

from .registry import register_reward
from .squad import completion_text

__all__ = ["ExpressionError", "evaluate_expression", "last_number", "exact_answer_score", "countdown_format_score",
           "countdown_answer_score", "answer_contents", "final_answer", "lenient_countdown_score", "PARTIAL_CREDIT",
           "MAX_EXPRESSION_CHARS", "MAX_DEPTH", "MAX_ABS_VALUE", "TOLERANCE"]

MAX_EXPRESSION_CHARS = 256
MAX_DEPTH = 32
MAX_ABS_VALUE = 10 ** 12
TOLERANCE = 1e-5  # |value - target|, as published

# ---------------------------------------------------------------------------------------- exact_answer
# A number: an optional sign (not right after a word character, a dot or a closing bracket, where the
# minus is a subtraction), thousands groups or plain digits, an optional decimal part.
_NUMBER = re.compile(r"(?:(?<![\w.)\]])-)?(?<![\w.])(?:\d{1,3}(?:,\d{3})+(?![\d,])|\d+)(?:\.\d+)?")


MAX_NUMBER_CHARS = 64  # a longer last number is read as none (it equals no gold answer, and int() would refuse it)


def last_number(text: str) -> Fraction | None:
    """The last number in ``text`` as an exact fraction (None when there is none, or it is absurdly long)."""
    text = str(text).replace("\u2212", "-")
    found = None
    for found in _NUMBER.finditer(text):
        pass
    if found is None or len(found.group()) > MAX_NUMBER_CHARS:
        return None
    return Fraction(found.group().replace(",", ""))


def _gold_number(value, i: int) -> Fraction | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise TypeError(f"exact_answer: answer[{i}] = {value!r} is not a number")
    if isinstance(value, (int, Fraction)):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(repr(value))
    number = last_number(str(value))
    if number is None:
        raise ValueError(f"exact_answer: answer[{i}] = {str(value)[:60]!r} holds no number")
    return number


def exact_answer_score(completion, answer) -> float:
    """1.0 when the last number of ``completion`` equals ``answer`` (a number, or a text whose last number counts)."""
    gold = _gold_number(answer, 0)
    got = last_number(completion_text(completion))
    return float(got is not None and gold is not None and got == gold)


@register_reward("exact_answer", higher_is_better=True, needs="generation", task_kinds=("generation", "prompts"))
def exact_answer(prompts, completions, answer, **columns):
    """1.0 when the last number in the completion equals the gold number in column 'answer' (e.g. arithmetic), else 0.0."""
    if len(answer) != len(completions):
        raise ValueError(f"column 'answer' has {len(answer)} entries for {len(completions)} completions")
    out = []
    for i, (completion, gold) in enumerate(zip(completions, answer)):
        gold = _gold_number(gold, i)
        if gold is None:
            out.append(None)
            continue
        got = last_number(completion_text(completion))
        out.append(float(got is not None and got == gold))
    return out


# ---------------------------------------------------------------------------------------- the safe parser
class ExpressionError(ValueError):
    """Text that is not an accepted arithmetic expression, or one that breaks a bound or divides by zero."""


_ALLOWED = frozenset("0123456789+-*/() ")
_TOKENS = re.compile(r"\d+|[-+*/()]| +")


def _tokens(text: str) -> list[str]:
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"longer than {MAX_EXPRESSION_CHARS} characters")
    if not text.strip():
        raise ExpressionError("empty")
    if not _ALLOWED.issuperset(text):
        raise ExpressionError("only digits, + - * /, parentheses and spaces are accepted")
    if "**" in text or "//" in text:
        raise ExpressionError("** and // are not accepted")
    tokens = [t for t in _TOKENS.findall(text) if not t.isspace()]
    for t in tokens:
        if t.isdigit() and len(t) > 1 and t[0] == "0":
            raise ExpressionError(f"{t!r}: a number with a leading zero")
        if t.isdigit() and len(t) > len(str(MAX_ABS_VALUE)):
            raise ExpressionError(f"a number longer than {len(str(MAX_ABS_VALUE))} digits")
    return tokens


class _Parser:
    """Recursive descent over ``expr := term (('+'|'-') term)*``, ``term := unary (('*'|'/') unary)*``,
    ``unary := ('+'|'-') unary | number | '(' expr ')'``, computing the value as it goes."""

    def __init__(self, tokens: list[str]):
        self.tokens, self.pos, self.depth, self.numbers = tokens, 0, 0, []

    def peek(self):
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self):
        token = self.peek()
        self.pos += 1
        return token

    def parse(self) -> Fraction:
        value = self.expr()
        if self.peek() is not None:
            raise ExpressionError(f"unexpected {self.peek()!r}")
        return value

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            value = _bounded(value + self.term() if op == "+" else value - self.term())
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek() in ("*", "/"):
            op = self.take()
            right = self.unary()
            if op == "/" and right == 0:
                raise ExpressionError("division by zero")
            value = _bounded(value * right if op == "*" else value / right)
        return value

    def unary(self) -> Fraction:
        token = self.take()
        if token in ("+", "-", "("):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise ExpressionError(f"nested deeper than {MAX_DEPTH}")
            if token == "(":
                value = self.expr()
                if self.take() != ")":
                    raise ExpressionError("unbalanced parentheses")
            else:
                value = self.unary()
                value = -value if token == "-" else value
            self.depth -= 1
            return value
        if token is not None and token.isdigit():
            self.numbers.append(int(token))
            return _bounded(Fraction(int(token)))
        raise ExpressionError("a number or '(' expected" if token is None else f"unexpected {token!r}")


def _bounded(value: Fraction) -> Fraction:
    if abs(value) > MAX_ABS_VALUE or value.denominator > MAX_ABS_VALUE:
        raise ExpressionError(f"a value beyond {MAX_ABS_VALUE:.0e}")
    return value


def evaluate_expression(text: str) -> tuple[Fraction, list[int]]:
    """The exact value of an arithmetic expression and the numbers it uses, in order.

    Accepts decimal integers, ``+ - * /`` (unary ``+``/``-`` too), parentheses and spaces, within the
    bounds of this module; raises :class:`ExpressionError` for anything else (never calls ``eval``).
    """
    tokens = _tokens(text)
    parser = _Parser(tokens)
    return parser.parse(), parser.numbers


# ---------------------------------------------------------------------------------------- countdown
# Their regular expressions, matched here with str.find in linear time (a lazy ``.*?`` pattern rescans the
# rest of the text from every opening tag, which a long completion full of tags makes slow):
# r"<think>.*?</think>", r"<answer>(.*?)</answer>" and r"^<think>.*?</think>\n<answer>.*?</answer>$" (DOTALL).
def _pair_present(text: str, open_tag: str, close_tag: str) -> bool:
    start = text.find(open_tag)
    return start >= 0 and text.find(close_tag, start + len(open_tag)) >= 0


def answer_contents(text: str) -> list[str]:
    r"""What ``re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)`` returns, in linear time."""
    out, pos = [], 0
    while True:
        start = text.find("<answer>", pos)
        if start < 0:
            return out
        end = text.find("</answer>", start + len("<answer>"))
        if end < 0:  # no later opening tag has a closing one either
            return out
        out.append(text[start + len("<answer>"):end])
        pos = end + len("</answer>")


def _full_format(text: str) -> bool:
    r"""``re.match(r"^<think>.*?</think>\n<answer>.*?</answer>$", text, re.DOTALL)``: ``$`` also matches
    before one final newline."""
    middle = "</think>\n<answer>"
    for body in (text, text[:-1] if text.endswith("\n") else None):
        if body is None or not (body.startswith("<think>") and body.endswith("</answer>")):
            continue
        split = body.find(middle, len("<think>"))
        if 0 <= split and split + len(middle) <= len(body) - len("</answer>"):
            return True
    return False


def countdown_format_score(text: str) -> float:
    """ES-at-scale's format score of ``text``: 1.0 for exactly ``<think>...</think>\\n<answer>...</answer>``,
    else 0.1 for a think pair plus 0.5 for an answer pair."""
    if _full_format(text):
        return 1.0
    return (0.1 if _pair_present(text, "<think>", "</think>") else 0.0) + \
        (0.5 if _pair_present(text, "<answer>", "</answer>") else 0.0)


def countdown_answer_score(text: str, numbers, target) -> float:
    """1.0 when the last ``<answer>...</answer>`` of ``text`` uses ``numbers`` each exactly once and equals ``target``."""
    found = answer_contents(text)
    if not found:
        return 0.0
    try:
        value, used = evaluate_expression(found[-1].strip())
    except ExpressionError:
        return 0.0
    if Counter(used) != Counter(int(n) for n in numbers):
        return 0.0
    return float(abs(float(value) - float(target)) < TOLERANCE)


def _numbers(value, i: int) -> list[int]:
    if isinstance(value, str):  # "[44 19 35]", "44,19,35" (a data file)
        return [int(n) for n in re.findall(r"\d+", value)]
    if isinstance(value, (list, tuple)) and all(isinstance(n, (int, float)) and float(n).is_integer() for n in value):
        return [int(n) for n in value]
    raise TypeError(f"countdown: numbers[{i}] = {value!r} must be a list of whole numbers")


def _target(value, i: int) -> float:
    try:
        target = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"countdown: target[{i}] = {value!r} must be a number") from None
    if target != target or target in (float("inf"), float("-inf")):
        raise ValueError(f"countdown: target[{i}] = {value!r} must be a finite number")
    return target


def _countdown_text(prompt, completion) -> tuple[str, str]:
    """(text for the format score, text for the answer): ``"<think>"`` opens the former where the prompt did."""
    text = completion_text(completion)
    opened = isinstance(prompt, str) and prompt.rstrip().endswith("<think>")
    return ("<think>" + text if opened else text), text


def _countdown_parts(prompts, completions, numbers, target):
    n = len(completions)
    for name, column in (("numbers", numbers), ("target", target)):
        if len(column) != n:
            raise ValueError(f"column {name!r} has {len(column)} entries for {n} completions")
    prompts = list(prompts) if prompts is not None else [None] * n
    for i, (prompt, completion, nums, tgt) in enumerate(zip(prompts, completions, numbers, target)):
        if nums is None or tgt is None:
            yield None, None
            continue
        format_text, text = _countdown_text(prompt, completion)
        yield countdown_format_score(format_text), countdown_answer_score(text, _numbers(nums, i), _target(tgt, i))


@register_reward("countdown", higher_is_better=True, needs="generation", task_kinds=("generation", "prompts"))
def countdown(prompts, completions, numbers, target, **columns):
    """ES-at-scale's Countdown reward: 0.1 x format + 1.0 x correct (last <answer> uses each of 'numbers' once, equals 'target')."""
    return [None if f is None else 0.1 * f + a for f, a in _countdown_parts(prompts, completions, numbers, target)]


@register_reward("countdown_correct", higher_is_better=True, needs="generation", task_kinds=("generation", "prompts"))
def countdown_correct(prompts, completions, numbers, target, **columns):
    """1.0 when the last <answer> uses each of 'numbers' once and equals 'target' (countdown's correct part), else 0.0."""
    return [a for _, a in _countdown_parts(prompts, completions, numbers, target)]


# ---------------------------------------------------------------------------------------- the curriculum's reward
#: the credit of a well-formed expression over the given numbers (each used exactly once) that misses the target
PARTIAL_CREDIT = 0.1
#: sides of the final equation that are read (``a = b`` has two); a longer chain of ``=`` is read as no equation
MAX_SIDES = 3
_EXPRESSION_CHARS = re.compile(r"[0-9+\-*/() ]+")
_LABEL = re.compile(r"^[A-Za-z][A-Za-z ]{0,19}:")  # "Answer:", "Equation:" before the expression


def final_answer(text: str) -> str | None:
    """The answer a completion gives: the last ``<answer>...</answer>`` where there is one, else the last line that
    holds a digit (a chat answer without tags, ``3 + 5 = 8``); None where there is none."""
    found = answer_contents(text)
    if found:
        return found[-1]
    for line in reversed(text.splitlines()):
        if any(c.isdigit() for c in line):
            return line
    return None


def lenient_countdown_score(text: str, numbers, target) -> float:
    """1.0 when the completion's final answer (:func:`final_answer`, tags or not) holds an expression that uses
    ``numbers`` each exactly once and equals ``target``; :data:`PARTIAL_CREDIT` when it holds such an expression
    that misses the target; else 0.0. The answer is read as an equation: each side of its ``=`` (at most
    :data:`MAX_SIDES`) goes through :func:`evaluate_expression` (never ``eval``), after a short label (``Answer:``)
    and a final full stop are taken off; a side with any other text (words, quotes, calls) counts for nothing."""
    answer = final_answer(text)
    if answer is None:
        return 0.0
    sides = answer.split("=")
    if len(sides) > MAX_SIDES:
        return 0.0
    wanted = Counter(int(n) for n in numbers)
    best = 0.0
    for side in sides:
        side = _LABEL.sub("", side.strip()).rstrip(".").strip()
        if not side or not _EXPRESSION_CHARS.fullmatch(side):
            continue
        try:
            value, used = evaluate_expression(side)
        except ExpressionError:
            continue
        if Counter(used) != wanted:
            continue
        if abs(float(value) - float(target)) < TOLERANCE:
            return 1.0
        best = PARTIAL_CREDIT
    return best


def _lenient_parts(completions, numbers, target):
    n = len(completions)
    for name, column in (("numbers", numbers), ("target", target)):
        if len(column) != n:
            raise ValueError(f"column {name!r} has {len(column)} entries for {n} completions")
    for i, (completion, nums, tgt) in enumerate(zip(completions, numbers, target)):
        if nums is None or tgt is None:
            yield None
            continue
        yield lenient_countdown_score(completion_text(completion), _numbers(nums, i), _target(tgt, i))


@register_reward("countdown_lenient", higher_is_better=True, needs="generation", task_kinds=("generation", "prompts"))
def countdown_lenient(prompts, completions, numbers, target, **columns):
    """Countdown for a curriculum: 1.0 for a right equation with or without <answer> tags, 0.1 for a well-formed one over 'numbers' (each once) that misses 'target'."""
    return list(_lenient_parts(completions, numbers, target))


@register_reward("countdown_solved", higher_is_better=True, needs="generation", task_kinds=("generation", "prompts"))
def countdown_solved(prompts, completions, numbers, target, **columns):
    """1.0 when the final answer, with or without <answer> tags, uses each of 'numbers' once and equals 'target', else 0.0."""
    return [None if s is None else float(s == 1.0) for s in _lenient_parts(completions, numbers, target)]
