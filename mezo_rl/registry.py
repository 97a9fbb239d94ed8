"""One small registry for everything looked up by name: rewards and tasks (the lm-evaluation-harness pattern).

A :class:`Registry` resolves a reference in this order:

1. ``"package.module:object"`` or ``"path/to/file.py:object"``: imported on demand;
2. a name registered in this process (``registry.register(name, obj)``);
3. an entry point of installed packages in the registry's group (e.g. ``mezo_rl.rewards``).

An unknown name raises the registry's error type (a subclass of
:class:`mezo_rl.errors.UnknownNameError`) naming close matches and every known name. What a loaded
object becomes (a ``RewardSpec``, a ``Task``) is up to the owner, through ``convert``.

This module imports nothing from the project but :mod:`mezo_rl.errors`, so ``rewards`` and ``tasks``
can use it without depending on the rest of ``mezo_rl``.
"""
from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import pathlib
import sys
from typing import Any, Callable, Generic, Iterator, TypeVar

from mezo_rl.errors import UnknownNameError

T = TypeVar("T")


def import_module_from_file(path: pathlib.Path, kind: str = "object"):
    """Import a ``.py`` file as a module (once: a file already imported, e.g. the running script, is reused)."""
    path = pathlib.Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"{kind} file {str(path)!r} does not exist")
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) and pathlib.Path(module.__file__).resolve() == path:
            return module
    module_name = f"_mezo_rl_user_{kind}s_{path.stem}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def load_object(ref: str, kind: str = "object") -> Any:
    """The object a ``"package.module:attr"`` or ``"file.py:attr"`` reference points at (``attr`` may be dotted)."""
    module_part, _, attr = ref.rpartition(":")
    if not module_part or not attr:
        raise ValueError(f"{kind} path {ref!r} must look like 'package.module:name' or 'path/to/file.py:name'")
    if module_part.endswith(".py") or "/" in module_part or "\\" in module_part:
        module = import_module_from_file(pathlib.Path(module_part), kind)
    else:
        try:
            module = importlib.import_module(module_part)
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(
                f"{kind} path {ref!r}: cannot import module {module_part!r} ({e}); is it installed or on sys.path?"
            ) from e
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise AttributeError(f"{kind} path {ref!r}: {module_part!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


class Registry(Generic[T]):
    """Name -> ``T``, with ``module:object`` paths and entry points.

    Args:
        kind: what it holds, for messages ("reward", "task").
        group: the entry-point group (``[project.entry-points."<group>"]`` in other packages).
        convert: ``convert(obj, name, source) -> T`` for objects found by path or entry point.
        error: the exception raised for unknown names (a subclass of ``UnknownNameError``).
        hint: a sentence appended to the unknown-name message (how to point at your own object).
    """

    def __init__(self, kind: str, group: str, convert: Callable[[Any, str, str], T],
                 error: type[UnknownNameError] = UnknownNameError, hint: str = ""):
        self.kind, self.group, self.convert, self.error, self.hint = kind, group, convert, error, hint
        self._items: dict[str, T] = {}

    # ---- registered names
    def register(self, name: str, obj: T, *, replace: bool = False, source: str = "",
                 same: Callable[[T, T], bool] = lambda old, new: False) -> T:
        """Store ``obj`` under ``name``; a taken name raises ``ValueError`` unless ``replace`` or ``same(old, obj)``."""
        old = self._items.get(name)
        if old is not None and not replace and not same(old, obj):
            where = f" (from {source})" if source else ""
            raise ValueError(f"a {self.kind} named {name!r} is already registered{where}; pick another name "
                             f"or pass replace=True to replace it")
        self._items[name] = obj
        return obj

    def unregister(self, name: str) -> None:
        if name not in self._items:
            raise self.error(f"no {self.kind} named {name!r} is registered")
        del self._items[name]

    def __contains__(self, name) -> bool:
        return name in self._items

    def __getitem__(self, name: str) -> T:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    # ---- entry points
    def entry_points(self) -> dict[str, importlib.metadata.EntryPoint]:
        return {ep.name: ep for ep in importlib.metadata.entry_points(group=self.group)}

    def load_entry_point(self, ep: importlib.metadata.EntryPoint) -> T:
        dist = getattr(ep, "dist", None)
        where = f"entry point {ep.name} = {ep.value!r} (group {self.group!r}"
        where += f", package {dist.name})" if dist is not None else ")"
        try:
            obj = ep.load()
        except Exception as e:
            raise ImportError(f"could not load {self.kind} from {where}: {type(e).__name__}: {e}") from e
        return self.convert(obj, ep.name, where)

    # ---- lookup
    def names(self) -> list[str]:
        """Every registered and entry-point name, sorted."""
        return sorted(set(self._items) | set(self.entry_points()))

    def get(self, ref: str) -> T:
        """Resolve ``ref``: a ``module:object`` / ``file.py:object`` path, a registered name, or an entry point."""
        if ":" in ref:
            return self.convert(load_object(ref, self.kind), ref, f"path {ref!r}")
        if ref in self._items:
            return self._items[ref]
        eps = self.entry_points()
        if ref in eps:
            return self.load_entry_point(eps[ref])
        known = sorted(set(self._items) | set(eps))
        close = difflib.get_close_matches(ref, known, n=3, cutoff=0.6) or \
            difflib.get_close_matches(ref.lower(), known, n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise self.error(f"unknown {self.kind} {ref!r}; {hint}known {self.kind}s: {', '.join(known)}. {self.hint}".rstrip())
