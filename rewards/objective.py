"""The objective: several rewards combined into the one scalar MeZO minimises.

::

    objective = build_objective(["squad_f1", "mypkg.r:brevity"], weights=[1.0, 0.2])
    objective.check_columns(available_columns=["answers"], task_kind="generation")  # once, at start
    objective.check_compatible(can_generate=True)
    out = objective.evaluate(prompts=prompts, completions=completions, columns={"answers": answers})
    out.loss          # -(1.0 * mean F1 + 0.2 * mean brevity): the number to minimise
    out.components    # {"squad_f1": <mean F1>, "mypkg.r:brevity": <mean brevity>}: each reward's own mean

The loss is ``sum_k w_k * s_k * mean_k / scale_k`` with ``s_k = -1`` for rewards where higher is
better and ``+1`` for loss-like ones (``higher_is_better=False``, e.g. ``cross_entropy``). A reward
value of ``None`` means "no opinion on this example" and is left out of that reward's mean. A weight
of 0 keeps a reward in the report without letting it move the loss (e.g. train on ``cross_entropy``
and watch ``accuracy``).

Distributed training: every output carries per-component ``sums``, ``sq_sums`` and ``counts``.
All-reduce them (sum, in float64) across ranks and call ``objective.loss_from(sums, counts,
sq_sums)``: the result is the loss a single process would compute on the union of the batches
(up to floating-point summation order), and it is identical on every rank.

Scale (``reward_scale=``):

``None`` (default)
    raw means; the weights alone set the balance between rewards.
``"std"``
    each component is divided by the standard deviation of its per-example values, measured on the
    first batch whose loss is computed and then **frozen** (see ``objective.scales``; saved by
    ``state_dict``). It is automatic weighting for rewards on very different scales (F1 in [0, 1],
    a length penalty in characters).

Why no per-batch z-scoring: MeZO compares the loss at ``theta + eps*z`` with the loss at
``theta - eps*z`` on the same batch. Subtracting the batch mean makes every batch's mean exactly 0,
so the two losses are equal and the gradient estimate is always 0; dividing by a per-evaluation
std makes the two losses use different scales, so their difference mixes the change in reward
with the change in scale. Shifting by a constant cancels in the difference anyway, so only a scale
that is the same for both evaluations (and, for comparable steps, across steps) is meaningful.

Shaping that works spans the *whole population* of a step at once, never one evaluation (per-prompt
group shaping of :meth:`Objective.example_rewards`, centred ranks, the step's normalisation): that is
the trainer's fitness, :mod:`mezo_rl.training.fitness`, the one home of the rules that turn these
rewards into a member's loss; this module evaluates them.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
import numbers
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

from mezo_rl.errors import ConfigError, UserError, refuse_keywords
from mezo_rl.stats import Moments

from .registry import RESERVED_KEYWORDS, RewardSpec, get_reward

REWARD_SCALES = (None, "std")
#: earlier keywords of :class:`Objective` and :func:`build_objective` -> theirs (refused naming the new one)
RENAMED = {"normalize": "reward_scale"}


@dataclass
class ObjectiveOutput:
    """What :meth:`Objective.evaluate` returns.

    ``values``: per-example values of each reward (``None`` = no opinion); ``sums``/``sq_sums``/
    ``counts``: per-component sums of the non-None values, of their squares, and how many there are
    (what a distributed trainer all-reduces). ``components``: each reward's mean (``None`` when it
    had no opinion on any example). ``loss``: the scalar to minimise.
    """

    objective: "Objective" = field(repr=False)
    values: dict[str, list[float | None]]
    sums: dict[str, float]
    sq_sums: dict[str, float]
    counts: dict[str, int]
    groups: list[int] = field(default_factory=list)  # the prompt each row came from (set by the caller)

    @property
    def components(self) -> dict[str, float | None]:
        return {k: (self.sums[k] / self.counts[k] if self.counts[k] else None) for k in self.sums}

    @property
    def loss(self) -> float:
        """``objective.loss_from`` on this batch alone (in distributed runs use the all-reduced stats)."""
        return self.objective.loss_from(self.sums, self.counts, self.sq_sums)


class Objective:
    """Rewards with weights, turned into one loss; build it with :func:`build_objective`."""

    def __init__(self, rewards: Sequence[RewardSpec], weights: Sequence[float], reward_scale: str | None = None,
                 **renamed):
        refuse_keywords("Objective", renamed, RENAMED)
        self.rewards = list(rewards)
        self.weights = {r.name: float(w) for r, w in zip(self.rewards, weights)}
        self.reward_scale = reward_scale
        self.scales: dict[str, float] | None = None if reward_scale else {r.name: 1.0 for r in self.rewards}

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.rewards]

    @property
    def needs(self) -> set[str]:
        """What the model must provide: ``{"scores"}``, ``{"generation"}`` or both."""
        return {r.needs for r in self.rewards}

    @property
    def shift_invariant(self) -> bool:
        """Whether every score reward here is invariant to a shift common to an example's candidates
        (``RewardSpec.shift_invariant``), so the model may score candidates without the
        vocabulary-wide normaliser (``LanguageModel.score(..., log_softmax=False)``). False without score rewards."""
        scores = [r for r in self.rewards if r.needs == "scores"]
        return bool(scores) and all(r.shift_invariant for r in scores)

    def __repr__(self):
        parts = " + ".join(f"{self.weights[r.name]:g}*{r.name}" for r in self.rewards)
        return f"Objective({parts}, reward_scale={self.reward_scale!r})"

    # ---- checks done once, before training ---------------------------------------------------

    def check_columns(self, available_columns, task_kind: str | None = None) -> None:
        """Raise :class:`RewardConfigError` (a ``ValueError``) if a reward requires a dataset column
        the task does not provide, or (when ``task_kind`` is given) was declared for other task kinds.

        Required columns are read from each function's signature: parameters without a default
        other than ``prompts``, ``completions``, ``candidate_scores`` and ``labels``. The trainer
        passes the task's columns plus ``answers`` for generation tasks.
        """
        available = set(available_columns)
        problems = []
        for r in self.rewards:
            missing = [c for c in r.required_columns if c not in available]
            if missing:
                problems.append(f"reward {r.name!r} needs column(s) {missing}")
        problems += self._kind_problems(task_kind)
        if problems:
            raise RewardConfigError(
                "; ".join(problems)
                + f". The task provides columns {sorted(available)}"
                + (f" and is of kind {task_kind!r}" if task_kind else "")
                + ". Give the reward's extra parameters defaults, or choose rewards that fit the task."
            )

    def check_examples(self, examples, task_kind: str | None = None) -> None:
        """:meth:`check_columns` against the columns ``examples`` give the rewards (:func:`example_columns`)."""
        self.check_columns(example_columns(examples), task_kind=task_kind)

    def check_task_kind(self, task_kind: str) -> None:
        """Raise :class:`RewardConfigError` if a reward was declared for other task kinds than ``task_kind``
        (``accuracy`` on a generation task). Needs no data: the command line runs it before loading any."""
        problems = self._kind_problems(task_kind)
        if problems:
            raise RewardConfigError("; ".join(problems) + "; choose rewards that fit the task (see `mezo-rl rewards`)")

    def _kind_problems(self, task_kind: str | None) -> list[str]:
        if task_kind is None:
            return []
        problems = [f"reward {r.name!r} works on {'/'.join(r.task_kinds)} tasks, not {task_kind!r} ones"
                    for r in self.rewards if r.task_kinds is not None and task_kind not in r.task_kinds]
        if task_kind == "prompts":
            problems += [f"reward {r.name!r} scores gold candidates, and a prompt task has none (use rewards over "
                         f"completions)" for r in self.rewards if r.needs == "scores" and r.task_kinds is None]
        return problems

    def check_compatible(self, can_generate: bool) -> None:
        """Raise :class:`RewardConfigError` (a ``ValueError``) if a generation reward is used where the
        model can only score candidates.

        ``can_generate``: whether the model can produce completions (a causal LM: ``lm.is_causal``).
        """
        if not isinstance(can_generate, bool):
            raise TypeError(
                f"check_compatible(can_generate) takes True/False (whether the model can generate, e.g. "
                f"lm.is_causal), got a {type(can_generate).__name__}; check task fit with "
                f"check_columns(columns, task_kind=task.kind)"
            )
        if can_generate:
            return
        gen = [r.name for r in self.rewards if r.needs == "generation"]
        if gen:
            raise RewardConfigError(
                f"reward(s) {gen} need generated completions, but this setup can only score candidates "
                f"(e.g. a masked LM, or a task without free-form answers). Use score-based rewards here "
                f"(needs='scores', e.g. cross_entropy, accuracy)."
            )

    # ---- evaluation --------------------------------------------------------------------------

    def evaluate(
        self,
        prompts: Sequence[str],
        completions: Sequence[Any] | None = None,
        candidate_scores: Sequence[Any] | None = None,
        labels: Sequence[int | None] | None = None,
        columns: dict[str, Sequence[Any]] | None = None,
    ) -> ObjectiveOutput:
        """Call every reward on one batch, validate what they return, and summarise.

        ``columns`` maps each dataset column to one value per example; each arrives at the reward
        as a keyword. Async rewards run concurrently (in a worker thread if an event loop is
        already running, e.g. in Jupyter).
        """
        n = len(prompts)
        columns = dict(columns or {})
        clash = sorted(set(columns) & set(RESERVED_KEYWORDS))
        if clash:
            raise ValueError(f"dataset column(s) {clash} clash with the reserved reward keywords {RESERVED_KEYWORDS}")
        given = {"prompts": list(prompts), **columns}
        if completions is not None:
            given["completions"] = completions
        if candidate_scores is not None:
            given["candidate_scores"] = candidate_scores
        if labels is not None:
            given["labels"] = labels
        for key, value in given.items():
            if len(value) != n:
                raise ValueError(f"{key!r} has {len(value)} entries but there are {n} prompts; need one per example")
        for r in self.rewards:
            if r.needs == "generation" and completions is None:
                raise ValueError(f"reward {r.name!r} needs completions; evaluate(..., completions=...) was not given")
            if r.needs == "scores" and (candidate_scores is None or labels is None):
                raise ValueError(f"reward {r.name!r} needs candidate_scores and labels; evaluate() was not given both")
            missing = [c for c in r.required_columns if c not in given]
            if missing:
                raise ValueError(f"reward {r.name!r} needs column(s) {missing}; columns given: {sorted(columns)}")

        raw, pending = {}, {}
        for r in self.rewards:
            accepted = r.accepted_keywords
            kwargs = given if accepted is None else {k: v for k, v in given.items() if k in accepted}
            result = _call(r, kwargs, prompts, n)
            (pending if inspect.isawaitable(result) else raw)[r.name] = result
        if pending:
            results = _run_async(list(pending.items()))
            for name, result in zip(pending, results):
                if isinstance(result, Exception):
                    message = str(result).splitlines()[0] if str(result) else ""
                    raise RewardError(f"reward {name!r} raised {type(result).__name__}{': ' + message if message else ''} "
                                      f"on a batch of {n} examples") from result
            raw.update(zip(pending, results))

        values, sums, sq_sums, counts = {}, {}, {}, {}
        for r in self.rewards:
            vals = _validate(r.name, raw[r.name], n, prompts)
            kept = [v for v in vals if v is not None]
            values[r.name] = vals
            sums[r.name] = math.fsum(kept)
            sq_sums[r.name] = math.fsum(v * v for v in kept)
            counts[r.name] = len(kept)
        return ObjectiveOutput(self, values, sums, sq_sums, counts)

    def loss_from(self, sums: dict, counts: dict, sq_sums: dict | None = None) -> float:
        """The loss from (possibly all-reduced) per-component sums and counts.

        ``sq_sums`` is needed only the first time with ``reward_scale="std"`` (to fix the scales).
        Raises ``ValueError`` when a weighted reward had no opinion (only ``None``) on every example.
        """
        missing = [n for n in self.names if n not in sums or n not in counts]
        if missing:
            raise ValueError(f"loss_from: no sums/counts for reward(s) {missing}; expected keys {self.names}")
        sums = {k: float(v) for k, v in sums.items()}
        counts = {k: int(round(float(c))) for k, c in counts.items()}
        if self.scales is None:
            self._fix_scales(sums, counts, sq_sums)
        loss = 0.0
        for r in self.rewards:
            w = self.weights[r.name]
            if w == 0:
                continue
            if counts[r.name] == 0:
                raise ValueError(
                    f"reward {r.name!r} returned None ('no opinion') for every example in the batch, so it "
                    f"has no mean to optimise; use larger batches or give it weight 0 to only report it"
                )
            mean = sums[r.name] / counts[r.name]
            sign = -1.0 if r.higher_is_better else 1.0
            loss += w * sign * mean / self.scales[r.name]
        return loss

    def example_rewards(self, values: dict[str, Sequence[float | None]], weights: dict[str, float] | None = None,
                        scaled: bool = True) -> list[float | None]:
        """Each example's weighted reward, ``sum_k w_k * (-s_k) * value_k / scale_k`` (higher is better:
        minus the example's share of the loss), over the components with an opinion on it; None where
        no weighted component has one. ``weights``: other weights than the objective's (by reward name);
        ``scaled=False``: the rewards as they are, without the normalisation scales (a report of the
        weighted reward); otherwise the scales must be fixed (``loss_from`` fixes them)."""
        if scaled and self.scales is None:
            raise ValueError("example_rewards needs the normalisation scales: call loss_from on a batch first")
        weights = self.weights if weights is None else weights
        n = len(next(iter(values.values()))) if values else 0
        out: list[float | None] = []
        for i in range(n):
            total, seen = 0.0, False
            for r in self.rewards:
                v, w = values[r.name][i], weights[r.name]
                if v is None or w == 0:
                    continue
                total += w * (1.0 if r.higher_is_better else -1.0) * v / (self.scales[r.name] if scaled else 1.0)
                seen = True
            out.append(total if seen else None)
        return out

    def _fix_scales(self, sums, counts, sq_sums) -> None:
        if sq_sums is None:
            raise ValueError(
                "reward_scale='std' fixes its scales from the first batch and needs sq_sums as well: "
                "call loss_from(sums, counts, sq_sums) (all-reduce out.sq_sums with out.sums and out.counts)"
            )
        scales = {}
        for r in self.rewards:
            n = counts[r.name]
            var = Moments(sums[r.name], float(sq_sums[r.name]), n).variance(ddof=1) if n > 1 else 0.0
            if var > 0 and math.isfinite(var):
                scales[r.name] = math.sqrt(var)
            else:
                warnings.warn(
                    f"reward_scale='std': reward {r.name!r} has no spread on the first batch ({n} values); "
                    f"its scale is fixed at 1.0"
                )
                scales[r.name] = 1.0
        self.scales = scales

    def state_dict(self) -> dict:
        """What a checkpoint needs to resume with the same loss (the frozen scales)."""
        return {"names": self.names, "weights": dict(self.weights), "reward_scale": self.reward_scale,
                "scales": None if self.scales is None else dict(self.scales)}

    def load_state_dict(self, state: dict) -> None:
        """``state`` as :meth:`state_dict` wrote it; one written before the rename says ``normalize`` for
        ``reward_scale`` and is read as that."""
        scale = state["reward_scale"] if "reward_scale" in state else state.get("normalize")
        if state.get("names") != self.names or scale != self.reward_scale:
            raise ValueError(
                f"objective state is for rewards {state.get('names')} (reward_scale={scale!r}), "
                f"this objective has {self.names} (reward_scale={self.reward_scale!r})"
            )
        self.scales = None if state["scales"] is None else dict(state["scales"])


class RewardConfigError(ConfigError):
    """Rewards that do not fit the task or the model (a missing column, another task kind, generation
    rewards on a model that cannot generate): a bad combination of options, refused before training."""


class RewardError(UserError, ValueError):
    """A reward raised, or returned something unusable; the one-line message names the reward and the example."""


class RewardTypeError(RewardError, TypeError):
    """A reward returned a value of the wrong type."""


def _example(i: int, prompts) -> str:
    prompt = str(prompts[i]) if prompts is not None and 0 <= i < len(prompts) else ""
    short = prompt if len(prompt) <= 60 else prompt[:57] + "..."
    return f"example {i}" + (f" (prompt {short!r})" if prompt else "")


def _call(r: RewardSpec, kwargs: dict, prompts=None, n: int | None = None):
    """Call the reward; if it raises, find the first example it raises on (by calling it on each
    example alone) and raise a RewardError naming the reward, the example and the original error."""
    try:
        return r.fn(**kwargs)
    except RewardError:
        raise
    except Exception as e:
        where = f"a batch of {n} examples"
        if n and n > 1 and not inspect.iscoroutinefunction(r.fn):
            for i in range(n):
                one = {k: (v[i:i + 1] if isinstance(v, (list, tuple)) and len(v) == n else v) for k, v in kwargs.items()}
                try:
                    result = r.fn(**one)
                except Exception:
                    where = _example(i, prompts)
                    break
                if inspect.isawaitable(result):
                    result.close()
        elif n == 1:
            where = _example(0, prompts)
        message = str(e).splitlines()[0] if str(e) else ""
        raise RewardError(f"reward {r.name!r} ({r.source}) raised {type(e).__name__}"
                          f"{': ' + message if message else ''} on {where}") from e


def _run_async(items: list[tuple[str, Any]]) -> list[Any]:
    async def gather():
        return await asyncio.gather(*(aw for _, aw in items), return_exceptions=True)

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop running in this thread: the common case
        return asyncio.run(gather())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, gather()).result()


def _as_number(name: str, i: int, v, prompts=None) -> float | None:
    """One reward value as a float. Accepted: None, int, float, bool (as 1.0/0.0, as TRL accepts it),
    numpy real scalars and one-element real tensors/arrays."""
    if v is None:
        return None
    if not isinstance(v, numbers.Real) and hasattr(v, "item"):  # numpy scalar, one-element tensor/array
        try:
            v = v.item()
        except (ValueError, RuntimeError):
            pass
    if isinstance(v, numbers.Real):
        x = float(v)
        if not math.isfinite(x):
            raise RewardError(f"reward {name!r} returned {x} for {_example(i, prompts)}; values must be finite numbers or None")
        return x
    raise RewardTypeError(
        f"reward {name!r} returned {v!r} ({type(v).__name__}) for {_example(i, prompts)}; "
        f"accepted values are real numbers (int, float, bool) or None for 'no opinion'"
    )


def _validate(name: str, values, n: int, prompts=None) -> list[float | None]:
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise RewardTypeError(
            f"reward {name!r} returned a {type(values).__name__}; it must return a list with one value per example ({n})"
        )
    if hasattr(values, "tolist"):  # tensor / ndarray
        values = values.tolist()
    values = list(values)
    if len(values) != n:
        raise RewardError(f"reward {name!r} returned {len(values)} values for a batch of {n}; it must return one per example")
    return [_as_number(name, i, v, prompts) for i, v in enumerate(values)]


def example_columns(examples) -> dict[str, list]:
    """Per-example columns passed to rewards as keywords: every ``Example.columns`` key (``mezo_rl.tasks``'
    examples), plus ``answers`` (the gold answers, for generation tasks)."""
    keys: list[str] = []
    for ex in examples:
        for k in ex.columns or {}:
            if k not in keys:
                keys.append(k)
    cols = {k: [(ex.columns or {}).get(k) for ex in examples] for k in keys}
    if any(ex.answers is not None for ex in examples):
        cols["answers"] = [ex.answers for ex in examples]
    return cols


def build_objective(rewards, weights: Sequence[float] | None = None, reward_scale: str | None = None,
                    **renamed) -> Objective:
    """Combine rewards into an :class:`Objective`.

    ``rewards``: one reference or a list of them (registered names, entry-point names,
    ``"package.module:function"`` / ``"file.py:function"`` paths, callables). ``weights``: one
    non-negative number per reward (default all 1.0; 0 = report only). ``reward_scale``: ``None`` or
    ``"std"`` (see the module docstring for why the scale is frozen after the first batch).
    Bad weights or duplicates raise :class:`RewardConfigError` (a ``ValueError``).
    """
    refuse_keywords("build_objective", renamed, RENAMED)
    if isinstance(rewards, (str, RewardSpec)) or callable(rewards):
        rewards = [rewards]
    specs = [get_reward(r) for r in rewards]
    if not specs:
        raise RewardConfigError("build_objective needs at least one reward")
    names = [s.name for s in specs]
    dupes = sorted({x for x in names if names.count(x) > 1})
    if dupes:
        raise RewardConfigError(f"reward(s) {dupes} given more than once; combine their weights into one entry instead")
    if weights is None:
        weights = [1.0] * len(specs)
    weights = list(weights)
    if len(weights) != len(specs):
        raise RewardConfigError(f"got {len(weights)} weight(s) for {len(specs)} reward(s) {names}; give one weight per reward")
    for name, w in zip(names, weights):
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) or w < 0:
            raise RewardConfigError(
                f"weight {w!r} for reward {name!r} is invalid; weights must be finite numbers >= 0 "
                f"(0 = report only). To minimise a reward, register it with higher_is_better=False"
            )
    if all(w == 0 for w in weights):
        raise RewardConfigError(f"all weights are 0 for rewards {names}; at least one reward must drive the loss")
    if reward_scale not in REWARD_SCALES:
        raise RewardConfigError(f"reward_scale={reward_scale!r} is not one of {REWARD_SCALES}")
    return Objective(specs, weights, reward_scale)
