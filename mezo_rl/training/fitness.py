"""A member's fitness: its loss, formed in one place: the trainer's every reward-to-loss rule lives here.

A MeZO step evaluates its members (``theta + eps z``, ``theta - eps z``, ...) on one batch; the engine's
``fitness`` hook hands every member's objective output here at once, and :class:`Fitness` returns one
loss per member:

1. **reward weights and scales**: each member's loss is the objective's (``objective.loss_from``: minus the
   weighted mean reward, each reward divided by its first-batch spread with ``reward_scale="std"``, a scale
   the objective keeps and checkpoints), from the members' statistics all-reduced across ranks in one
   collective;
2. **group shaping** (``reward_shaping="group"``): instead, each prompt's weighted rewards are centred and
   scaled across all of the step's completions of it, every member's (:func:`group_shape`), and a member's
   loss is minus its mean shaped reward; or **rank shaping** (``reward_shaping="rank"``): each member's loss
   becomes its centred rank among the step's members (:func:`centred_ranks`), so a step depends on the
   members' order alone;
3. **normalisation** (``step_normalize="std"``): each loss difference over the spread sigma of the step's
   member losses instead of over 2 eps (FZOO; ES-at-scale's z-scoring for ``estimator="es"``), a step whose
   length does not depend on the reward's scale. Here, never in the engine (the trainer builds
   ``MeZO(step_normalize=None)``): :func:`step_normalised` scales each member's deviation from its pair's
   midpoint (``es``: the members' mean) by eps / sigma, so the engine's ``(l+ - l-) / (2 eps)`` is the
   ``(l+ - l-) / (2 sigma)`` that ``MeZO(step_normalize="std")`` computes from the raw losses (up to float64
   rounding), sigma 0 no update, HiZOO's curvature unchanged; the step's record keeps the raw losses'
   means (:func:`member_means`);
4. **the KL penalty** (``beta``): each loss adds ``beta`` times its member's mean per-token KL to the
   starting model. With normalisation the reward part is normalised alone, centred on the step's mean, times
   eps, and the penalty added after it: the step is ``(r+ - r-) / (2 sigma_r) + beta (kl+ - kl-) / (2 eps)``;
5. **bounds**: there, where the total's spread exceeds the normalised reward's (eps), the losses are
   scaled down to it (:func:`bounded_losses`), so a step is never longer than a normalised step.

The step's reward statistics (``reward/<name>``: the mean over members; ``reward/<name>/std``: over every
completion; ``kl``) come back beside the losses, for the step's record.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from mezo_rl.engine.optim import spread
from mezo_rl.engine.population import Member, step_members
from mezo_rl.errors import ConfigError, UserError
from mezo_rl.stats import Moments
from mezo_rl.training.kl import KL, KLSums

__all__ = ["FitnessSpec", "Fitness", "RewardsSilentError", "bounded_losses", "centred_ranks", "group_shape",
           "member_means", "step_normalised"]


class RewardsSilentError(UserError, ValueError):
    """A reward had no opinion (``None``) on any completion of a training batch."""


def bounded_losses(losses: list[float], eps: float) -> list[float]:
    """The members' losses (a normalised reward part, times ``eps``, plus the KL penalty) scaled so that their
    spread is at most ``eps``, the normalised reward part's: unchanged while the penalty's differences are
    small, and a step as long as a normalised one where they would dominate (the KL's finite-difference
    gradient grows with the kl, without bound)."""
    s = spread(losses)
    return losses if s <= eps else [eps * x / s for x in losses]


def centred_ranks(losses: list[float]) -> list[float]:
    """Each loss replaced by its centred rank among ``losses``: ``rank / (M - 1) - 1/2``, from -1/2 (the lowest
    loss) to +1/2 (the highest), tied losses sharing their mean rank (Salimans et al. 2017's fitness shaping).
    A step then depends only on the members' order: the same for any increasing transform of the reward.
    One member: 0. A NaN loss (no reward scored) stays NaN."""
    if len(losses) < 2:
        return [x if math.isnan(x) else 0.0 for x in losses]
    finite = sorted((x, i) for i, x in enumerate(losses) if not math.isnan(x))
    out = [math.nan] * len(losses)
    k = 0
    while k < len(finite):
        j = k
        while j + 1 < len(finite) and finite[j + 1][0] == finite[k][0]:
            j += 1
        for _, i in finite[k : j + 1]:
            out[i] = (k + j) / 2 / (len(losses) - 1) - 0.5
        k = j + 1
    return out


def group_shape(members: Sequence[Sequence[float | None]], groups: Sequence[int]) -> list[list[float | None]]:
    """Per-prompt fitness shaping across a step's members (GRPO's group advantages, EGGROLL's per-question
    normalisation): easy and hard prompts then weigh the same.

    ``members[k][i]``: the reward of row i of member k (None: no opinion); ``groups[i]``: the prompt of
    row i (the same rows in every member). Every prompt's values over all members and rows form one
    group; each value becomes ``(v - mean) / std`` of its group (population std, float64), 0 where
    the group has no spread. None stays None. It shapes across the whole population of a step at once,
    never within one evaluation (the objective's module docstring says why a per-evaluation shaping fails).
    """
    buckets: dict[int, list[float]] = {}
    for vals in members:
        if len(vals) != len(groups):
            raise ValueError(f"group_shape: a member has {len(vals)} values for {len(groups)} rows")
        for g, v in zip(groups, vals):
            if v is not None:
                buckets.setdefault(g, []).append(float(v))
    stats = {g: (m.mean, m.std(ddof=0)) for g, m in ((g, Moments.of(vs)) for g, vs in buckets.items())}
    return [[None if v is None else (0.0 if stats[g][1] == 0 else (float(v) - stats[g][0]) / stats[g][1])
             for g, v in zip(groups, vals)] for vals in members]


def step_normalised(losses: Sequence[float], members: Sequence[Member], eps: float) -> list[float]:
    """The step's normalisation, as losses: ``MeZO(step_normalize=None)`` given these makes the update that
    ``MeZO(step_normalize="std")`` makes from ``losses`` (FZOO's ``(l+_j - l-_j) / (2 sigma)``; for ``es``,
    ES-at-scale's ``(l_j - mean) / sigma``), up to float64 rounding.

    ``members``: the step's members in the engine's order (:func:`mezo_rl.engine.population.step_members`);
    sigma: the spread of the perturbed members' losses (HiZOO's unperturbed member, sign 0, left out). Each
    member's deviation from its reference (a pair: its midpoint; ``es``: the members' mean) becomes
    ``eps / sigma`` times itself: numbers of the size of eps, so the differences the engine takes lose
    nothing to the losses' own size. With HiZOO's unperturbed member (its loss l0 becomes 0) each pair is
    offset by ``mid - l0``, so the second difference ``l+ + l- - 2 l0`` that moves the curvature is what it
    was. sigma 0: no update (every loss of a pair equal, or every ``es`` loss 0)."""
    losses = [float(x) for x in losses]
    if len(losses) != len(members):
        raise ValueError(f"step_normalised: {len(losses)} losses for {len(members)} members")
    sigma = spread([x for x, m in zip(losses, members) if m.sign])
    scale = eps / sigma if sigma else 0.0
    if not any(m.sign < 0 for m in members):  # es: one-sided members, centred on their mean
        mean = sum(losses) / len(losses)
        return [(x - mean) * scale for x in losses]
    centre = next((x for x, m in zip(losses, members) if m.sign == 0), None)
    out = [0.0] * len(losses)
    for j in sorted({m.sample for m in members if m.sign}):
        i, k = (m.index for m in sorted((m for m in members if m.sample == j), key=lambda m: -m.sign))
        mid = (losses[i] + losses[k]) / 2
        offset = 0.0 if centre is None else mid - centre
        out[i], out[k] = offset + (losses[i] - mid) * scale, offset + (losses[k] - mid) * scale
    return out


def member_means(losses: Sequence[float], members: Sequence[Member]) -> dict:
    """The step's ``loss`` (every member's), ``loss_plus`` (the + members') and ``loss_minus`` (the - members';
    None without them), as ``MeZO.step`` reports them: what the step's record logs of losses the fitness
    went on to normalise."""
    plus = [x for x, m in zip(losses, members) if m.sign > 0]
    minus = [x for x, m in zip(losses, members) if m.sign < 0]
    return {"loss": sum(losses) / len(losses), "loss_plus": sum(plus) / len(plus),
            "loss_minus": sum(minus) / len(minus) if minus else None}


@dataclass(frozen=True)
class FitnessSpec:
    """How a run forms a member's loss: the configuration's fitness knobs (the objective holds the rewards,
    their weights and their scales)."""

    reward_shaping: str = "none"
    step_normalize: bool = False
    beta: float = 0.0
    eps: float = 1e-3
    estimator: str = "two_point"
    centre: bool = False  # HiZOO: one more member, the unperturbed weights, last

    def __post_init__(self):
        if self.step_normalize and self.estimator == "one_point":
            raise ConfigError("--step-normalize std needs the two_point or es estimator: one member a step has no "
                              "spread (use --step-normalize none with --estimator one_point)")

    @classmethod
    def of(cls, args) -> "FitnessSpec":
        return cls(reward_shaping=args.reward_shaping, step_normalize=args.step_normalize == "std", beta=float(args.beta),
                   eps=float(args.eps), estimator=args.estimator, centre=float(args.hessian_smooth) > 0)

    def members(self, count: int) -> list[Member]:
        """A step's ``count`` members in the engine's order (their seeds stand for samples 0..n-1)."""
        pairs = self.estimator == "two_point"
        n = (count - self.centre) // 2 if pairs else count
        return step_members(list(range(n)), self.estimator, center=self.centre and pairs)

    def __str__(self) -> str:
        parts = [{"group": "group-shaped rewards", "rank": "members' centred ranks"}.get(self.reward_shaping,
                                                                                       "weighted mean reward")]
        if self.beta:
            parts.append(f"+ {self.beta:g} x KL to the start")
        parts.append("normalised by the members' spread" if self.step_normalize else "over 2 eps")
        if self.beta and self.step_normalize:
            parts.append("bounded to a normalised step")
        return ", ".join(parts)


class Fitness:
    """The engine's fitness hook for one run: ``fitness(outcomes) -> (losses, record)``, ``outcomes`` one
    ``rewards.ObjectiveOutput`` per member (this rank's shard; with ``beta`` each carries ``kl``). Every rank
    gets the same losses: statistics cross ranks in one collective per part (``dist``: a DistContext)."""

    def __init__(self, spec: FitnessSpec, objective, dist):
        self.spec, self.objective, self.dist = spec, objective, dist

    def __call__(self, outcomes, step: int = 0) -> tuple[list[float], dict]:
        spec, names, parts = self.spec, self.objective.names, ("sums", "sq_sums", "counts")
        local = {f"{m}/{part}/{k}": getattr(out, part)[k] for m, out in enumerate(outcomes) for part in parts for k in names}
        total = self.dist.all_reduce_sum_dict(local, keys=list(local))
        stats = [{part: {k: total[f"{m}/{part}/{k}"] for k in names} for part in parts} for m in range(len(outcomes))]
        for k in names:
            if not any(st["counts"][k] for st in stats):
                raise RewardsSilentError(f"reward {k!r} returned None ('no opinion') for every completion of the batch "
                                         f"of step {step + 1}; a reward must score at least some completions")
        losses = [float(self.objective.loss_from(st["sums"], st["counts"], st["sq_sums"])) for st in stats]
        if spec.reward_shaping == "group":
            losses = self._group_losses(outcomes)
        elif spec.reward_shaping == "rank":
            losses = centred_ranks(losses)
        record = {}
        if spec.beta:
            kls = self._kls(outcomes)
            if spec.step_normalize:  # the reward part normalised alone, times eps; the engine then divides by 2 eps
                mean, s = sum(losses) / len(losses), spread(losses)
                losses = [spec.eps * (x - mean) / s if s else 0.0 for x in losses]
                losses = bounded_losses([x + spec.beta * kl for x, kl in zip(losses, kls)], spec.eps)
            else:
                losses = [x + spec.beta * kl for x, kl in zip(losses, kls)]
            record[KL] = statistics.fmean(kls)
        elif spec.step_normalize:  # the engine's normaliser, as losses (the trainer's MeZO has step_normalize=None); the
            layout = spec.members(len(losses))  # record keeps the losses the normalisation started from
            if all(math.isfinite(x) for x in losses):  # else the engine skips the step, and reports it
                record.update(member_means(losses, layout))
            losses = step_normalised(losses, layout, spec.eps)
        for k in names:
            members = [Moments(st["sums"][k], st["sq_sums"][k], st["counts"][k]) for st in stats]
            record[f"reward/{k}"] = statistics.fmean(m.mean for m in members if m.count)
            record[f"reward/{k}/std"] = sum(members, Moments()).std(ddof=0)
        return losses, record

    def _group_losses(self, outcomes) -> list[float]:
        """Minus each member's mean group-shaped reward (every prompt's rewards centred and scaled across all of the
        step's completions of it), its sums crossing ranks in one collective."""
        shaped = group_shape([self.objective.example_rewards(out.values) for out in outcomes], outcomes[0].groups)
        local = {}
        for m, vals in enumerate(shaped):
            kept = [v for v in vals if v is not None]
            local[f"{m}/sum"], local[f"{m}/count"] = math.fsum(kept), len(kept)
        total = self.dist.all_reduce_sum_dict(local, keys=list(local))
        return [-total[f"{m}/sum"] / total[f"{m}/count"] if total[f"{m}/count"] else math.nan
                for m in range(len(outcomes))]

    def _kls(self, outcomes) -> list[float]:
        """Each member's mean per-token KL to the starting model, its sums crossing ranks in one collective."""
        local = {}
        for m, out in enumerate(outcomes):
            kl = getattr(out, "kl", None) or KLSums()
            local[f"{m}/kl"], local[f"{m}/kl_tokens"] = kl.total, kl.tokens
        total = self.dist.all_reduce_sum_dict(local, keys=list(local))
        return [total[f"{m}/kl"] / total[f"{m}/kl_tokens"] if total[f"{m}/kl_tokens"] else 0.0
                for m in range(len(outcomes))]
