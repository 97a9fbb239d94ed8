"""Rewards and objectives: what MeZO optimises.

The registry (:mod:`mezo_rl.rewards.registry`) knows every reward by name; the built-ins are registered on
import. :func:`build_objective` turns one or more rewards (with weights) into an
:class:`Objective` whose ``evaluate(...).loss`` is the scalar the optimizer minimises.

Built-in rewards:

==============  ==========  ================  ===================================================
name            needs       higher_is_better  what
==============  ==========  ================  ===================================================
cross_entropy   scores      False             CE over candidates; teacher-forced NLL for generation
accuracy        scores      True              argmax candidate == label
squad_f1        generation  True              SQuAD v1.1 token F1, max over gold answers
exact_match     generation  True              SQuAD v1.1 exact match, max over gold answers
rouge_l         generation  True              ROUGE-L F (extra ``rouge``)
bleu            generation  True              sentence BLEU / 100 (extra ``bleu``)
exact_answer    generation  True              last number of the completion == column ``answer``
countdown       generation  True              ES-at-scale's Countdown reward: 0.1 x format + correct
countdown_...   generation  True              ``countdown_correct``: the correct part alone (0 or 1)
==============  ==========  ================  ===================================================

This package imports nothing from ``mezo_rl``: model outputs are duck-typed.
"""
from . import builtin, squad, text, verifiable  # noqa: F401  (registers the built-ins)
from .builtin import candidate_cross_entropy
from .objective import Objective, ObjectiveOutput, build_objective
from .registry import (
    ENTRY_POINT_GROUP,
    RewardInfo,
    RewardSpec,
    UnknownRewardError,
    describe,
    describe_rewards,
    get_reward,
    list_rewards,
    register_reward,
    trl_names,
    unregister_reward,
)
from .squad import exact_match_score, f1_score, normalize_answer
from .verifiable import ExpressionError, evaluate_expression

__all__ = [
    "ENTRY_POINT_GROUP",
    "ExpressionError",
    "Objective",
    "ObjectiveOutput",
    "RewardInfo",
    "RewardSpec",
    "UnknownRewardError",
    "build_objective",
    "candidate_cross_entropy",
    "describe",
    "describe_rewards",
    "evaluate_expression",
    "exact_match_score",
    "f1_score",
    "get_reward",
    "list_rewards",
    "normalize_answer",
    "register_reward",
    "trl_names",
    "unregister_reward",
]
