"""The reward registry: register, look up and list rewards.

A *reward* is a plain function that scores a batch and returns one value per example::

    @register_reward("brevity", higher_is_better=True, needs="generation")
    def brevity(prompts, completions, **columns):
        "Shorter answers score higher: -len(completion) / 100."
        return [-len(c) / 100 for c in completions]

It is looked up by name (``get_reward("brevity")``), by an import path (``"mypkg.rewards:brevity"``
or ``"./my_rewards.py:brevity"``, imported on demand), or passed directly as a callable. Other
installed packages can make rewards known without being imported first by declaring them under the
entry-point group ``mezo_rl.rewards``::

    # their pyproject.toml
    [project.entry-points."mezo_rl.rewards"]
    brevity = "mypkg.rewards:brevity"

Two kinds of reward, by what they need from the model (``needs=``):

``"generation"`` (the default)
    TRL's reward-function signature, so TRL rewards work unchanged:
    ``fn(prompts, completions, **columns) -> list[float | None]``. ``completions`` are strings;
    every dataset column arrives as a keyword holding one value per example. May be ``async``.
``"scores"``
    ``fn(prompts, candidate_scores, labels, **columns) -> list[float | None]``. ``candidate_scores``
    holds, per example, an object with ``.sum`` and ``.mean`` tensors of shape ``[n_candidates]``
    (the log-likelihood of each candidate answer given the prompt); ``labels`` the gold indices.

Rewards are always called with keyword arguments. A parameter without a default (other than
``prompts``, ``completions``, ``candidate_scores``, ``labels``) is a dataset column the reward
requires; :meth:`rewards.Objective.check_columns` checks these once, before training starts.
"""
from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import inspect
import pathlib
import sys
from dataclasses import dataclass, replace
from typing import Callable, NamedTuple

ENTRY_POINT_GROUP = "mezo_rl.rewards"
NEEDS = ("scores", "generation")
# Keywords the objective supplies itself; every other parameter without a default is a dataset column.
RESERVED_KEYWORDS = ("prompts", "completions", "candidate_scores", "labels")


class UnknownRewardError(LookupError):
    """Raised by :func:`get_reward` for a name that is neither registered nor an entry point."""


@dataclass(frozen=True)
class RewardSpec:
    """A reward function plus what the objective needs to know about it.

    ``name`` is how it is reported; ``higher_is_better=False`` marks a loss-like reward (the
    objective flips its sign); ``needs`` is ``"scores"`` or ``"generation"``; ``task_kinds``, when
    set, lists the task kinds it makes sense for (e.g. ``accuracy`` needs several candidates);
    ``source`` says where it came from (shown by ``mezo-rl rewards``).
    """

    name: str
    fn: Callable
    higher_is_better: bool = True
    needs: str = "generation"
    task_kinds: tuple[str, ...] | None = None
    source: str = "registered"

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"reward name must be a non-empty string, got {self.name!r}")
        if not callable(self.fn):
            raise TypeError(f"reward {self.name!r}: expected a callable, got {type(self.fn).__name__}")
        if not isinstance(self.higher_is_better, bool):
            raise TypeError(
                f"reward {self.name!r}: higher_is_better must be True or False, got {self.higher_is_better!r}"
            )
        if self.needs not in NEEDS:
            raise ValueError(f"reward {self.name!r}: needs={self.needs!r} is not one of {NEEDS}")
        positional_only = [
            p.name for p in self._parameters() if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is p.empty
        ]
        if positional_only:
            raise TypeError(
                f"reward {self.name!r} has positional-only parameter(s) {positional_only}; rewards are called "
                f"with keyword arguments (prompts=..., completions=..., **columns), as TRL does"
            )

    def _parameters(self) -> list[inspect.Parameter]:
        try:
            return list(inspect.signature(self.fn).parameters.values())
        except (TypeError, ValueError):  # some builtins have no signature: assume fn(**kwargs)
            return [inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]

    @property
    def description(self) -> str:
        """The first line of the function's docstring (what ``mezo-rl rewards`` prints)."""
        doc = inspect.getdoc(self.fn) or ""
        return doc.strip().splitlines()[0] if doc.strip() else "(no description)"

    @property
    def required_columns(self) -> tuple[str, ...]:
        """Dataset columns the function cannot run without: keyword parameters with no default."""
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        return tuple(
            p.name
            for p in self._parameters()
            if p.kind in kinds and p.default is p.empty and p.name not in RESERVED_KEYWORDS
        )

    @property
    def accepted_keywords(self) -> frozenset[str] | None:
        """Keywords the function accepts, or None when it takes ``**kwargs`` (accepts anything)."""
        params = self._parameters()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return None
        return frozenset(p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL)


_REGISTRY: dict[str, RewardSpec] = {}


def _check_name(name) -> None:
    if not isinstance(name, str) or not name or name != name.strip() or any(c.isspace() for c in name):
        raise ValueError(f"reward name must be a non-empty string without spaces, got {name!r}")
    if ":" in name:
        raise ValueError(f"reward name {name!r} may not contain ':' (reserved for 'package.module:function' paths)")


def register_reward(
    name: str,
    *,
    higher_is_better: bool = True,
    needs: str = "generation",
    task_kinds: tuple[str, ...] | list[str] | None = None,
    replace: bool = False,
):
    """Decorator: register ``fn`` under ``name``; the function itself is returned unchanged.

    Registering a name that is taken raises ``ValueError`` unless ``replace=True`` (registering the
    very same function again is allowed, so re-running a module is harmless). The decorated
    function carries its spec as ``fn.__mezo_reward__``, so it keeps its settings when it is later
    found by import path or entry point.
    """
    _check_name(name)

    def decorator(fn):
        spec = RewardSpec(
            name=name,
            fn=fn,
            higher_is_better=higher_is_better,
            needs=needs,
            task_kinds=tuple(task_kinds) if task_kinds is not None else None,
            source=getattr(fn, "__module__", None) or "registered",
        )
        old = _REGISTRY.get(name)
        if old is not None and old.fn is not fn and not replace:
            raise ValueError(
                f"a reward named {name!r} is already registered (from {old.source}); pick another name "
                f"or pass register_reward({name!r}, ..., replace=True) to replace it"
            )
        _REGISTRY[name] = spec
        try:
            fn.__mezo_reward__ = spec
        except (AttributeError, TypeError):  # e.g. a builtin; lookup by name still works
            pass
        return fn

    return decorator


def unregister_reward(name: str) -> None:
    """Remove a registered reward (mainly for tests and notebooks). Unknown names raise."""
    if name not in _REGISTRY:
        raise UnknownRewardError(f"no reward named {name!r} is registered")
    del _REGISTRY[name]


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _spec_for(fn, name: str, source: str) -> RewardSpec:
    """A decorated function keeps its registered settings; a plain one is a TRL-style reward."""
    spec = getattr(fn, "__mezo_reward__", None)
    if isinstance(spec, RewardSpec) and spec.fn is fn:
        return spec
    return RewardSpec(name=name, fn=fn, higher_is_better=True, needs="generation", source=source)


def _load_entry_point(ep: importlib.metadata.EntryPoint) -> RewardSpec:
    dist = getattr(ep, "dist", None)
    where = f"entry point {ep.name} = {ep.value!r} (group {ENTRY_POINT_GROUP!r}"
    where += f", package {dist.name})" if dist is not None else ")"
    try:
        fn = ep.load()
    except Exception as e:
        raise ImportError(f"could not load reward from {where}: {type(e).__name__}: {e}") from e
    if not callable(fn):
        raise TypeError(f"{where} points at a {type(fn).__name__}, not a function")
    spec = _spec_for(fn, ep.name, source=where)
    return spec if spec.name == ep.name else replace(spec, name=ep.name)


def _import_module_from_file(path: pathlib.Path):
    path = path.resolve()
    if not path.is_file():
        raise FileNotFoundError(f"reward file {str(path)!r} does not exist")
    for module in list(sys.modules.values()):  # already imported (e.g. it is the running script)?
        if getattr(module, "__file__", None) and pathlib.Path(module.__file__).resolve() == path:
            return module
    module_name = f"_mezo_rl_user_rewards_{path.stem}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def _load_path(ref: str) -> RewardSpec:
    module_part, _, attr = ref.rpartition(":")
    if not module_part or not attr:
        raise ValueError(f"reward path {ref!r} must look like 'package.module:function' or 'path/to/file.py:function'")
    if module_part.endswith(".py") or "/" in module_part or "\\" in module_part:
        module = _import_module_from_file(pathlib.Path(module_part))
    else:
        try:
            module = importlib.import_module(module_part)
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(
                f"reward path {ref!r}: cannot import module {module_part!r} ({e}); is it installed or on sys.path?"
            ) from e
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise AttributeError(f"reward path {ref!r}: {module_part!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"reward path {ref!r} points at a {type(obj).__name__}, not a function")
    return _spec_for(obj, ref, source=f"path {ref!r}")


def get_reward(ref) -> RewardSpec:
    """Resolve a reward reference to its :class:`RewardSpec`.

    ``ref`` may be a registered name (``"squad_f1"``), the name of an entry point in the group
    ``mezo_rl.rewards``, an import path ``"package.module:function"`` or ``"file.py:function"``,
    a callable, or a ``RewardSpec``. A plain callable that was not decorated with
    :func:`register_reward` is treated as a TRL-style generation reward with ``higher_is_better=True``.
    Unknown names raise :class:`UnknownRewardError` suggesting close matches.
    """
    if isinstance(ref, RewardSpec):
        return ref
    if callable(ref):
        name = getattr(ref, "__name__", None) or type(ref).__name__
        return _spec_for(ref, name, source="callable")
    if not isinstance(ref, str):
        raise TypeError(
            f"a reward is given as a name, a 'package.module:function' path or a callable, got {type(ref).__name__}"
        )
    if ":" in ref:
        return _load_path(ref)
    if ref in _REGISTRY:
        return _REGISTRY[ref]
    eps = _entry_points()
    if ref in eps:
        return _load_entry_point(eps[ref])
    known = sorted(set(_REGISTRY) | set(eps))
    close = difflib.get_close_matches(ref, known, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    raise UnknownRewardError(
        f"unknown reward {ref!r}; {hint}known rewards: {', '.join(known)}. "
        f"A reward in your own code can be given as 'package.module:function' or 'file.py:function'."
    )


def list_rewards() -> list[str]:
    """Sorted names of all registered rewards and all entry-point rewards of installed packages."""
    return sorted(set(_REGISTRY) | set(_entry_points()))


class RewardInfo(NamedTuple):
    """One row of :func:`describe_rewards`."""

    name: str
    kind: str  # "scores" | "generation" | "?" when an entry point failed to load
    higher_is_better: bool | None
    description: str
    source: str


def describe_rewards() -> list[RewardInfo]:
    """One row per reward (registered first, then entry points), for ``mezo-rl rewards``.

    An entry point that fails to import is listed with the error as its description rather than
    breaking the listing.
    """
    rows = [
        RewardInfo(s.name, s.needs, s.higher_is_better, s.description, s.source)
        for s in (_REGISTRY[n] for n in sorted(_REGISTRY))
    ]
    for name, ep in sorted(_entry_points().items()):
        if name in _REGISTRY:
            continue
        try:
            s = _load_entry_point(ep)
            rows.append(RewardInfo(s.name, s.needs, s.higher_is_better, s.description, s.source))
        except Exception as e:  # keep listing the others
            rows.append(RewardInfo(name, "?", None, f"failed to load: {e}", f"entry point {ep.value!r}"))
    return rows


def describe(ref) -> str:
    """The one-line description of a reward (first docstring line)."""
    return get_reward(ref).description
