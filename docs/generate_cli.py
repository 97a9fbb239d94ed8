"""Regenerate docs/cli.md from the parser: a table of the `mezo-rl train` options, then every command's --help.

    python docs/generate_cli.py          # rewrite docs/cli.md
    python docs/generate_cli.py --check  # exit 1 if it is out of date (tests/test_cli.py runs this check)

The help text is rendered 108 columns wide (argparse's width for COLUMNS=110).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
WIDTH_COLUMNS = "110"
HEADER = """# `mezo-rl` command reference

Generated from the parser by `python docs/generate_cli.py` (`mezo-rl COMMAND --help`). Options of
`train`, `eval`, `compare` and `baseline` are dataclass fields (`mezo_rl.training.arguments`: `MeZOConfig`,
`EvalRunArguments`, `BaselineArguments`); each is also accepted with underscores (`--num_train`), and in a
`--config` YAML/JSON file (the command line wins). Booleans take `--flag` / `--no-flag`; `--reward` and
`--candidates` are repeatable or comma-separated. `python -m mezo_rl` is the same command as `mezo-rl`.
What a run writes, resuming, interrupting and errors: [runs.md](runs.md). What runs gave, with their
commands: [results.md](results.md).
"""
TABLE_HEAD = "| option | default | meaning |"


@contextlib.contextmanager
def _columns():
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH_COLUMNS
    try:
        yield
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def cli_markdown() -> str:
    """docs/cli.md: the table of `mezo-rl train` options, the top-level help, then each subcommand's help,
    in the parser's order."""
    from mezo_rl.cli.main import build_parser

    with _columns():
        parser = build_parser()
        parts = [HEADER, "## `mezo-rl train` options\n", train_table() + "\n",
                 "## mezo-rl\n", "```\n" + parser.format_help().rstrip() + "\n```\n"]
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        for name, p in sub.choices.items():
            parts += [f"## mezo-rl {name}\n", "```\n" + p.format_help().rstrip() + "\n```\n"]
    return "\n".join(parts)


def train_table() -> str:
    """The table of `mezo-rl train` options: one row per MeZOConfig field."""
    from mezo_rl.training.arguments import MeZOConfig

    rows = [TABLE_HEAD, "|---|---|---|"]
    for f in dataclasses.fields(MeZOConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        meaning = f.metadata.get("help", "")
        if "choices" in f.metadata and not all(str(c) in meaning for c in f.metadata["choices"]):
            meaning += f" ({' / '.join(map(str, f.metadata['choices']))})"
        rows.append(f"| `--{f.name.replace('_', '-')}` | `{default}` | {meaning.replace('|', '/')} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    targets = {ROOT / "docs" / "cli.md": cli_markdown()}
    stale = [p for p, text in targets.items() if p.read_text() != text]
    if check:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is out of date: run python docs/generate_cli.py", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.write_text(targets[p])
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
