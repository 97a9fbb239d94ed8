"""The library states behaviour, never measurements.

What the library says to a reader or a user (the comments and docstrings of ``mezo_rl/``, ``rewards/``
and ``tasks/``, the ``--help`` text of every option and command, and the messages of the errors it
raises) says what the code does and why. Dated results and measured figures (accuracies, F1 points,
timings, speed ratios, sample sizes of a result) go stale with every new run, so they live in
benchmarks/README.md and docs/results.md, beside the command that produced them. Comments and
docstrings are read with ``tokenize`` / ``ast``, help texts from the parser, error messages from the
string literals of each ``raise SomethingError(...)``: constants in code, such as
``betas=(0.9, 0.999)``, are not looked at.

No user-facing text names the data directory of the developers' machines (``../shared/data``): a
user's clone has no such directory.
"""
from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("mezo_rl", "rewards", "tasks")

# Each pattern names one kind of measurement; a hit in prose is a figure that belongs in the docs.
FIGURES = {
    "date": re.compile(r"\b(?:19|20)\d\d-[01]\d(?:-[0-3]\d)?\b"),
    "fraction with 2+ decimals (an accuracy, a score)": re.compile(r"(?<![\w.])0\.\d{2,}\b"),
    "mean +- spread": re.compile(r"\d\s*(?:\+-|±)\s*\d"),
    "score in points or percent": re.compile(r"\b\d+(?:\.\d+)?\s*(?:points?\b|pp\b)|\b\d+\.\d+\s*%"),
    "metric with a value": re.compile(r"\b(?:accuracy|F1|EM|exact match)\s*(?:of|=|:)?\s*\d+\.\d"),
    "sample size of a result": re.compile(r"\(n\s?=\s?\d{2,}\b"),
    "timing": re.compile(r"(?:~|\babout\s|\bin\s)\s*\d+(?:\.\d+)?\s*(?:ms|s|sec|seconds|min|minutes|h|hours)\b"),
    "speed or size ratio": re.compile(r"~?\b\d+(?:\.\d+)?\s*x\s+(?:slower|faster|longer|shorter|cheaper|less|more|smaller|larger)\b"),
    # "(2.9x)", "(3x)", "1.05x": a ratio standing alone; not a product ("x W^T", "0.1 x format", "4x4", "2x the memory")
    "bare ratio": re.compile(r"\(\s*~?\d+(?:\.\d+)?[x\u00d7]\s*\)|(?<![\w.])~?\d+\.\d+[x\u00d7](?!\w)"),
    "a model's size": re.compile(r"\bvocabulary\s+(?:of\s+|size\s+)?\d[\d,]{2,}|\b\d{1,3}(?:,\d{3})+\s+(?:parameters|weights)\b"),
}
# the developers' data directory, which a user's clone does not have
SHARED = re.compile(r"\.\./shared|shared/data")


def prose(source: str):
    """(line number, text) of every comment and docstring line of a module's source."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                for offset, line in enumerate(first.value.value.splitlines()):
                    yield first.lineno + offset, line


def figures(source: str) -> list[tuple[int, str, str]]:
    """(line, kind, text) for each comment or docstring line that states a measurement."""
    return [(line, kind, text.strip()) for line, text in prose(source)
            for kind, pattern in FIGURES.items() if pattern.search(text)]


def library_files():
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def test_the_scanner_finds_figures_in_prose_only():
    source = '''"""Accuracy 0.516 -> 0.742 (n = 872), measured 2026-11-24; batched (2.9x)."""
BETAS = (0.9, 0.999)  # constants in code are not prose
LR = 1e-3


def f():
    """SQuAD F1 32.2, 61.4 +- 6.0 over seeds; +22.6 points; a step ~21 s, ~3x slower; vocabulary 49,152."""
    return (0.123, "0.456")  # lr 1e-3, eps 1e-2, 10% of the rows, the 2-core CPU, n=200, v1.1
'''
    found = figures(source)
    kinds = {kind for _, kind, _ in found}
    assert {line for line, _, _ in found} == {1, 7}
    assert kinds == set(FIGURES)


def test_the_scanner_leaves_behaviour_alone():
    source = '''"""Returns 1.0 when the answer matches, else 0.0; weights default to 1.0; 0.5*cross_entropy."""
# SQuAD v1.1 normalisation; lr 1e-2 / eps 1e-1; Table 16; NeurIPS 2023; sections 2.1 and 3.2
# 10% of the train rows each; a second or two; 130/143 interrupted; n=1: a sign step
# M x the tensor; 2x the memory of bf16 weights; (m + n) r numbers; 20,000 steps; 1,000 examples
# x W^T + (x A) B^T; a 4x4 grid; reward 0.1 x format + 1.0 x correct; the official script prints 100x
'''
    assert figures(source) == []


@pytest.mark.parametrize("text", ["faster at 47-token prompts (2.9x) in every mode", "a step 2.9x as long",
                                  "peak RSS 1.05-1.10x plain decoding's", "(3x)", "( ~1.5x )"])
def test_the_scanner_finds_a_bare_ratio(text):
    assert "bare ratio" in kinds_of(text)


@pytest.mark.parametrize("path", library_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_measurement_in_library_prose(path):
    found = figures(path.read_text())
    assert not found, (f"{path.relative_to(ROOT)} states measurements in comments/docstrings; move them to "
                       "benchmarks/README.md or docs/ with their command:\n"
                       + "\n".join(f"  line {line} ({kind}): {text}" for line, kind, text in found))


def error_messages(source: str) -> list[tuple[int, str]]:
    """(line, text) of the string literals of every ``raise X(...)`` whose exception's name ends in
    ``Error`` (an f-string's fields read as ``{}``)."""
    def text(node) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(text(v) if isinstance(v, ast.Constant) else "{}" for v in node.values)
        if isinstance(node, ast.BinOp):             # "a" + "b", "... %s" % x
            return text(node.left) + text(node.right)
        return ""

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            func = node.exc.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name.endswith("Error"):
                message = " ".join(text(a) for a in [*node.exc.args, *(k.value for k in node.exc.keywords)])
                if message.strip():
                    found.append((node.lineno, message))
    return sorted(found)


def help_texts() -> list[tuple[str, str]]:
    """(where, text) of every option's ``help`` metadata in the argument dataclasses and every help
    text and description of the ``mezo-rl`` parser and its commands."""
    import argparse
    import dataclasses

    from mezo_rl.cli import main as cli
    from mezo_rl.training import arguments

    out = []
    for name, cls in vars(arguments).items():
        if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == arguments.__name__:
            out += [(f"{name}.{f.name}", f.metadata.get("help", "")) for f in dataclasses.fields(cls)]
    parsers = [("mezo-rl", cli.build_parser())]
    while parsers:
        where, parser = parsers.pop()
        out.append((f"{where} (description)", parser.description or ""))
        for action in parser._actions:
            out.append((f"{where} {'/'.join(action.option_strings) or action.dest}", action.help or ""))
            if isinstance(action, argparse._SubParsersAction):
                parsers += [(f"{where} {name}", sub) for name, sub in action.choices.items()]
                out += [(f"{where} {c.dest}", c.help or "") for c in action._choices_actions]
    return [(where, text) for where, text in out if text and text is not argparse.SUPPRESS]


def kinds_of(text: str) -> list[str]:
    return [kind for kind, pattern in FIGURES.items() if pattern.search(text)]


def test_the_error_scanner_reads_raised_messages():
    source = '''
def f(n):
    if n:
        raise ConfigError(f"--steps must be >= 1, got {n}; it took ~3x longer in 2026-11-24")
    raise mezo_rl.errors.UserError("no data in ../shared/data/SST-2 " + "(measured: accuracy 0.742)")
    raise KeyboardInterrupt("not an error message")
'''
    (first, second) = error_messages(source)
    assert first == (4, "--steps must be >= 1, got {}; it took ~3x longer in 2026-11-24")
    assert set(kinds_of(first[1])) == {"date", "speed or size ratio"}
    assert SHARED.search(second[1]) and kinds_of(second[1]) == ["fraction with 2+ decimals (an accuracy, a score)",
                                                                "metric with a value"]


@pytest.mark.parametrize("path", library_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_measurement_in_error_messages(path):
    found = [(line, kind, text) for line, text in error_messages(path.read_text()) for kind in kinds_of(text)]
    assert not found, (f"{path.relative_to(ROOT)} raises errors whose messages state measurements:\n"
                       + "\n".join(f"  line {line} ({kind}): {text}" for line, kind, text in found))


def test_the_help_texts_are_read():
    where = {w for w, _ in help_texts()}
    assert {"MeZOConfig.autocast", "mezo-rl train --config", "mezo-rl export --run-dir",
            "mezo-rl train"} <= where


def test_no_measurement_in_help_texts():
    found = [(where, kind, text) for where, text in help_texts() for kind in kinds_of(text)]
    assert not found, ("help texts state measurements; say what the option does, and put the figure "
                       "in benchmarks/README.md:\n" + "\n".join(f"  {w} ({k}): {t}" for w, k, t in found))


def user_facing_texts():
    """(where, text) of everything a user reads: the library's prose, help texts and error messages,
    the README and the docs."""
    for path in library_files():
        source = path.read_text()
        rel = path.relative_to(ROOT)
        yield from ((f"{rel}:{line}", text) for line, text in prose(source))
        yield from ((f"{rel}:{line} (error)", text) for line, text in error_messages(source))
    yield from ((f"--help of {where}", text) for where, text in help_texts())
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        yield from ((f"{path.relative_to(ROOT)}:{i}", line)
                    for i, line in enumerate(path.read_text().splitlines(), 1))


def test_no_user_facing_text_names_the_developers_data_directory():
    found = [f"  {where}: {text.strip()}" for where, text in user_facing_texts() if SHARED.search(text)]
    assert not found, ("user-facing text names ../shared/data, which exists only on the developers' "
                       "machines; say `--data-dir DIR` or `MEZO_RL_DATA` instead:\n" + "\n".join(found))
