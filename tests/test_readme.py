"""README.md says only what the code does: every command in it parses, every option it names exists,
and its reward example is a working reward. Nothing here loads a model or reads data."""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import shlex
import shutil
import subprocess

import pytest

from fake_scores import scores
from mezo_rl.cli import main as cli
from mezo_rl.training.arguments import BaselineArguments, EvalRunArguments, MeZOConfig
from mezo_rl.rewards import build_objective

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
ARGUMENTS = {"train": MeZOConfig, "compare": MeZOConfig, "baseline": BaselineArguments,
             "eval": EvalRunArguments}
COMPARE_ONLY = ("objective", "variant", "runs", "report_dir")


def code_blocks(text: str, languages=("bash", "sh", "shell", "python")) -> list[tuple[str, str]]:
    """(language, body) of each fenced code block."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)
            if m.group(1) in languages]


def shell_lines(body: str) -> list[str]:
    """The logical lines of a shell block: continuation lines joined, a quoted string across lines kept whole."""
    out, pending = [], ""
    for line in body.replace("\\\n", " ").splitlines():
        pending += line + "\n"
        try:
            shlex.split(pending, comments=True)
        except ValueError:           # an open quote: the string goes on on the next line
            continue
        out.append(pending)
        pending = ""
    return out + ([pending] if pending else [])


def shell_commands(body: str) -> list[list[str]]:
    """The words of each command of a shell block: comments dropped, split at ``&&``, ``;`` and ``|``,
    leading ``VAR=value`` assignments removed."""
    out = []
    for line in shell_lines(body):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for token in list(lexer) + [";"]:
            if token and set(token) <= set(";&|"):
                while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
                    words.pop(0)
                if words:
                    out.append(words)
                words = []
            else:
                words.append(token)
    return out


def mezo_rl_argv(words: list[str]):
    """The arguments after ``mezo-rl`` / ``python -m mezo_rl`` / ``torchrun ... -m mezo_rl`` (a ``...``
    standing for "more options" left out), or None for another command."""
    if words[:1] == ["mezo-rl"]:
        rest = words[1:]
    elif words[:1] in (["python"], ["python3"], ["torchrun"]) and "mezo_rl" in words \
            and words[words.index("mezo_rl") - 1] == "-m":
        rest = words[words.index("mezo_rl") + 1:]
    else:
        return None
    return [w for w in rest if w != "..."]


def commands(text: str, languages=("bash", "sh", "shell")) -> list[list[str]]:
    """The ``mezo-rl`` command lines of a Markdown text's shell blocks (an unlabelled block that is not
    shell, such as --help output, is skipped)."""
    argvs = []
    for lang, body in code_blocks(text, languages):
        try:
            words = shell_commands(body)
        except ValueError:
            if lang:
                raise
            continue
        argvs += [a for a in map(mezo_rl_argv, words) if a is not None]
    return argvs


def subparsers(parser: argparse.ArgumentParser) -> dict:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def all_options() -> set:
    parser = cli.build_parser()
    names = {o for a in parser._actions for o in a.option_strings}
    for sub in subparsers(parser).values():
        names |= {o for a in sub._actions for o in a.option_strings}
    return names


def check_parses(argv: list[str]) -> None:
    """What the command line does before any model or data: argparse, then the arguments' own checks."""
    argv = [a for a in argv if a != "--debug"]
    ns = cli.build_parser().parse_args(argv)            # UsageError: an unknown option, a bad value or choice
    cls = ARGUMENTS.get(argv[0])
    if cls is not None:
        skip = COMPARE_ONLY if argv[0] == "compare" else ()
        cli.parse_into(cls, ns, None, skip=skip)           # ConfigError: a bad combination of values


COMMANDS = commands(README)
DOCS = [ROOT / "DEVELOPERS.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOC_COMMANDS = [(path.relative_to(ROOT), argv) for path in DOCS for argv in commands(path.read_text(), ("bash", "sh", "shell", ""))]


def test_the_readme_has_the_commands_a_user_needs():
    firsts = {argv[0] for argv in COMMANDS}
    assert {"train", "eval", "export", "report"} <= firsts
    blocks = [body for lang, body in code_blocks(README) if lang == "bash"]
    assert shell_commands(blocks[0]) == [["make", "train"], ["make", "test"]]   # the two commands, first
    assert "mezo-rl train" in blocks[1] and "python -m pytest" in blocks[1]      # then the same by hand


def test_make_train_and_make_test_run_the_commands_the_readme_shows_by_hand(tmp_path):
    """In a fresh environment both targets create it, run the manual block's installs in its order (pip of
    that environment), then its train or test command; ``make -n`` prints the commands without running them."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"

    def dry_run(target):
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}  # under make test too
        out = subprocess.run(["make", "-n", "--no-print-directory", target, f"VENV={venv}"], cwd=ROOT, env=env,
                             capture_output=True, text=True, check=True)
        return out.stdout.replace(f"{venv}/bin/", "").replace(str(venv), ".venv")

    by_hand = shell_commands([body for lang, body in code_blocks(README) if lang == "bash"][1])
    setup = [["python3", "-m", "venv", ".venv"]] + [["python", "-m", *w] for w in by_hand if w[:2] == ["pip", "install"]]
    assert len(setup) == 4
    for target, command in (("train", ["mezo-rl", "train"]), ("test", ["python", "-m", "pytest"])):
        text = dry_run(target)
        run = [w for w in shell_commands(text) if w[:2] != ["test", "-x"] and w[0] != "touch"]
        (manual,) = [w for w in by_hand if w[:len(command)] == command]
        assert run[:-1] == setup and run[-1][:len(manual)] == manual
    assert "HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1" in text.splitlines()[-1]  # make test runs offline


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(a)[:60] for a in COMMANDS])
def test_every_readme_command_parses(argv):
    check_parses(argv)


@pytest.mark.parametrize("path,argv", DOC_COMMANDS, ids=[f"{p}: {' '.join(a)[:50]}" for p, a in DOC_COMMANDS])
def test_every_command_in_the_docs_parses(path, argv):
    check_parses(argv)


def test_the_docs_commands_are_found():
    found = {str(path) for path, _ in DOC_COMMANDS}
    assert {"docs/tasks.md", "docs/peft.md", "docs/distributed.md"} <= found


@pytest.mark.parametrize("argv", [["train", "--no-such-option", "1"], ["export", "--run-dir", "r"],
                                  ["train", "--peft", "everything"], ["train", "--num-train", "many"]])
def test_a_command_that_does_not_parse_is_caught(argv):
    with pytest.raises(cli.UsageError):
        check_parses(argv)


def test_every_option_the_readme_names_exists():
    """Options in the prose too: an inline code span that starts with an option (`--peft lora`) or with
    `mezo-rl`; spans of other programs (`torchrun --nproc-per-node N`) are theirs."""
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", README, flags=re.M | re.S))
    named = {o for s in spans if s.startswith("--") or s.startswith("mezo-rl ")
             for o in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", s)}
    named |= {w for argv in COMMANDS for w in argv if w.startswith("--")}
    assert "--peft" in named and "--reward" in named
    assert not named - all_options(), f"README names options that no command has: {sorted(named - all_options())}"


def test_the_readme_reward_example_is_a_working_reward(tmp_path):
    (block,) = [body for lang, body in code_blocks(README, ("python",)) if body.startswith("# my_rewards.py")]
    path = tmp_path / "my_rewards.py"
    path.write_text(block)
    length = build_objective([f"{path}:reward_len"])
    assert length.needs == {"generation"}
    out = length.evaluate(prompts=["a", "b"], completions=["x" * 20, "x" * 25])
    assert list(out.values.values()) == [[0, -5]]
    margin = build_objective([f"{path}:gold_margin"])
    assert margin.needs == {"scores"}
    out = margin.evaluate(prompts=["a", "b"], candidate_scores=scores([-1.0, -3.0], [-2.0, -0.5, -1.0]), labels=[0, 2])
    (values,) = out.values.values()
    assert values == pytest.approx([2.0, -0.5])


def test_the_readme_is_a_first_page():
    """A new user's page: short, and with no measured figure (figures live behind its links, beside their
    commands: docs/results.md, docs/mezo-or-grpo.md, benchmarks/README.md)."""
    from test_no_figures import FIGURES

    assert len(README.splitlines()) <= 150
    prose = re.sub(r"^```.*?^```", "", README, flags=re.M | re.S)
    found = [(kind, line) for line in prose.splitlines() for kind, p in FIGURES.items() if p.search(line)]
    assert not found, f"README.md states figures; link to the page that has them instead: {found}"
    assert "docs/mezo-or-grpo.md" in README


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


LINKED = [ROOT / "README.md", ROOT / "DEVELOPERS.md", ROOT / "benchmarks" / "README.md",
          *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("path", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_in_the_docs_resolves(path):
    """Each `[text](target)` that is not a URL names a file of the repository, and its `#anchor` a heading."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", dest.read_text(), flags=re.M | re.S), re.M)
            if anchor not in {slug(h) for h in headings}:
                broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)} links to what does not exist: {broken}"
