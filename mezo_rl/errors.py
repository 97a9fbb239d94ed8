"""Errors a user can cause and fix: the command line prints them as one line and exits with status 2.

Raise a subclass of :class:`UserError` for anything the user got wrong (a bad option value, an
unknown name, a missing file, a reward that returns the wrong thing). Its message names what was
wrong and what is accepted. Any other exception is a bug in mezo-rl and keeps its traceback.

The subclasses also derive from the matching built-in exception, so ``except ValueError`` and
``except LookupError`` keep working for code written against earlier versions.
"""
from __future__ import annotations

__all__ = ["UserError", "ConfigError", "UnknownNameError", "first_line", "refuse_keywords"]


class UserError(Exception):
    """A mistake the user can fix; ``str(error)`` is the whole explanation (one line)."""


class ConfigError(UserError, ValueError):
    """A bad option value or a bad combination of options."""


class UnknownNameError(UserError, LookupError):
    """A name (task, reward, model, metric) that no registry or path resolves."""

    def __str__(self) -> str:  # LookupError/KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def first_line(e: BaseException) -> str:
    """The first line of ``str(e)`` (its type's name when empty): an exception inside a one-line message."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def refuse_keywords(where: str, keywords: dict, renamed: dict) -> None:
    """Refuse keywords ``where`` (``"MeZO"``, ``"Objective"``) does not take, in one line: an earlier name
    (a key of ``renamed``) names its successor, as the configuration's renamed options do; no alias is kept."""
    if keywords:
        name = next(iter(keywords))
        if name in renamed:
            raise TypeError(f"{where}(..., {name}=...) is now {where}(..., {renamed[name]}=...)")
        raise TypeError(f"{where}() got an unexpected keyword argument {name!r}")
