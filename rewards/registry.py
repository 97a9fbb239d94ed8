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

import inspect
from dataclasses import dataclass, replace
from typing import Callable, NamedTuple

from mezo_rl.errors import UnknownNameError, refuse_keywords
from mezo_rl.registry import Registry

ENTRY_POINT_GROUP = "mezo_rl.rewards"
NEEDS = ("scores", "generation")
# Keywords the objective supplies itself; every other parameter without a default is a dataset column.
RESERVED_KEYWORDS = ("prompts", "completions", "candidate_scores", "labels")


class UnknownRewardError(UnknownNameError):
    """Raised by :func:`get_reward` for a name that is neither registered nor an entry point."""


@dataclass(frozen=True)
class RewardSpec:
    """A reward function plus what the objective needs to know about it.

    ``name`` is how it is reported; ``higher_is_better=False`` marks a loss-like reward (the
    objective flips its sign); ``needs`` is ``"scores"`` or ``"generation"``; ``task_kinds``, when
    set, lists the task kinds it makes sense for (e.g. ``accuracy`` needs several candidates);
    ``source`` says where it came from (shown by ``mezo-rl rewards``). ``shift_invariant`` (score
    rewards): the value depends only on differences between an example's candidates' scores when it has
    two or more (adding one constant to all of them changes nothing), so the model may give such an
    example its candidates' logits in place of log-likelihoods and skip the vocabulary-wide normaliser
    (``CandidateScores.log_softmax`` is then False).
    """

    name: str
    fn: Callable
    higher_is_better: bool = True
    needs: str = "generation"
    task_kinds: tuple[str, ...] | None = None
    source: str = "registered"
    shift_invariant: bool = False

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


def _check_name(name) -> None:
    if not isinstance(name, str) or not name or name != name.strip() or any(c.isspace() for c in name):
        raise ValueError(f"reward name must be a non-empty string without spaces, got {name!r}")
    if ":" in name:
        raise ValueError(f"reward name {name!r} may not contain ':' (reserved for 'package.module:function' paths)")


def _spec_for(fn, name: str, source: str) -> RewardSpec:
    """A decorated function keeps its registered settings (renamed to an entry point's name); a plain
    one is a TRL-style generation reward."""
    if not callable(fn):
        raise TypeError(f"{source} points at a {type(fn).__name__}, not a function")
    spec = getattr(fn, "__mezo_reward__", None)
    if isinstance(spec, RewardSpec) and spec.fn is fn:
        return replace(spec, name=name) if source.startswith("entry point") and spec.name != name else spec
    return RewardSpec(name=name, fn=fn, higher_is_better=True, needs="generation", source=source)


REGISTRY: Registry[RewardSpec] = Registry(
    "reward", ENTRY_POINT_GROUP, _spec_for, error=UnknownRewardError,
    hint="A reward in your own code can be given as 'package.module:function' or 'file.py:function'.")
_REGISTRY = REGISTRY._items  # name -> RewardSpec of the registered rewards


def register_reward(
    name: str,
    *,
    higher_is_better: bool = True,
    needs: str = "generation",
    task_kinds: tuple[str, ...] | list[str] | None = None,
    replace: bool = False,
    shift_invariant: bool = False,
    **renamed,
):
    """Decorator: register ``fn`` under ``name``; the function itself is returned unchanged.

    Registering a name that is taken raises ``ValueError`` unless ``replace=True`` (registering the
    very same function again is allowed, so re-running a module is harmless). The decorated
    function carries its spec as ``fn.__mezo_reward__``, so it keeps its settings when it is later
    found by import path or entry point. ``shift_invariant``: see :class:`RewardSpec` (its earlier name,
    ``normaliser_invariant``, is refused naming it).
    """
    refuse_keywords("register_reward", renamed, {"normaliser_invariant": "shift_invariant"})
    _check_name(name)

    def decorator(fn):
        spec = RewardSpec(
            name=name,
            fn=fn,
            higher_is_better=higher_is_better,
            needs=needs,
            task_kinds=tuple(task_kinds) if task_kinds is not None else None,
            source=getattr(fn, "__module__", None) or "registered",
            shift_invariant=bool(shift_invariant),
        )
        old = _REGISTRY.get(name)
        REGISTRY.register(name, spec, replace=replace, source=old.source if old else "",
                          same=lambda old, new: old.fn is new.fn)
        try:
            fn.__mezo_reward__ = spec
        except (AttributeError, TypeError):  # e.g. a builtin; lookup by name still works
            pass
        return fn

    return decorator


def unregister_reward(name: str) -> None:
    """Remove a registered reward (mainly for tests and notebooks). Unknown names raise."""
    REGISTRY.unregister(name)


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
    return REGISTRY.get(ref)


def list_rewards() -> list[str]:
    """Sorted names of all registered rewards and all entry-point rewards of installed packages."""
    return REGISTRY.names()


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
        for s in (REGISTRY[n] for n in REGISTRY)
    ]
    for name, ep in sorted(REGISTRY.entry_points().items()):
        if name in REGISTRY:
            continue
        try:
            s = REGISTRY.load_entry_point(ep)
            rows.append(RewardInfo(s.name, s.needs, s.higher_is_better, s.description, s.source))
        except Exception as e:  # keep listing the others
            rows.append(RewardInfo(name, "?", None, f"failed to load: {e}", f"entry point {ep.value!r}"))
    return rows


def describe(ref) -> str:
    """The one-line description of a reward (first docstring line)."""
    return get_reward(ref).description


def _short_name(name: str) -> str:
    """A reward reference as TRL names the reward: a function's ``__name__`` (``pkg.mod:reward_len`` and
    ``file.py:Cls.score`` -> ``reward_len``, ``score``), a reward model's last path part (``org/rm`` -> ``rm``);
    a registered name as it is."""
    if ":" in name and not name.startswith(("http:", "https:")):
        return name.rpartition(":")[2].rpartition(".")[2] or name
    return name.rstrip("/").rpartition("/")[2] or name


def trl_names(names) -> dict[str, str]:
    """Each reward reference of ``names`` -> its name in logs and metrics, as TRL names a reward (its function's
    ``__name__``, a model's name); where two references would share a name, the two keep their references (the
    module path breaks the tie)."""
    names = list(names)
    short = {name: _short_name(name) for name in names}
    counts: dict[str, int] = {}
    for s in short.values():
        counts[s] = counts.get(s, 0) + 1
    return {name: s if counts[s] == 1 else name for name, s in short.items()}
