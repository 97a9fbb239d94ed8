"""Stand-ins for mezo_rl.model.scoring.CandidateScores in the reward and objective tests (test_rewards, test_objective)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Scores:
    """Candidate log-likelihoods shaped like mezo_rl.model.scoring.CandidateScores (rewards duck-type it)."""

    sum: torch.Tensor
    mean: torch.Tensor


def scores(*means):
    """One ``Scores`` per example from its candidates' mean log-likelihoods; ``sum`` is twice the mean
    (two tokens per candidate), so a reward that reads ``.sum`` where it should read ``.mean`` is caught."""
    return [Scores(sum=torch.tensor(m) * 2, mean=torch.tensor(m)) for m in means]
