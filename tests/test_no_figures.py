"""The library states behaviour, never measurements.

Docstrings and comments in ``mezo_rl/``, ``rewards/`` and ``tasks/`` say what the code does and why.
Dated results and measured figures (accuracies, F1 points, timings, sample sizes of a result) go stale
with every new run, so they live in benchmarks/README.md and docs/, beside the command that produced
them. This test reads only comments (``tokenize``) and docstrings (``ast``): constants in code, such
as ``betas=(0.9, 0.999)``, are not looked at.
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
}


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
    source = '''"""Accuracy 0.516 -> 0.742 (n = 872), measured 2026-11-24."""
BETAS = (0.9, 0.999)  # constants in code are not prose
LR = 1e-3


def f():
    """SQuAD F1 32.2, 61.4 +- 6.0 over seeds; +22.6 points; a step takes ~21 s."""
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
'''
    assert figures(source) == []


@pytest.mark.parametrize("path", library_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_measurement_in_library_prose(path):
    found = figures(path.read_text())
    assert not found, (f"{path.relative_to(ROOT)} states measurements in comments/docstrings; move them to "
                       "benchmarks/README.md or docs/ with their command:\n"
                       + "\n".join(f"  line {line} ({kind}): {text}" for line, kind, text in found))
