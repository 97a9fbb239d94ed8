"""Score-based built-in rewards: ``cross_entropy`` and ``accuracy``.

Both read, per example, the candidates' log-likelihoods (``candidate_scores[i].mean``: the mean
log-probability of each candidate's tokens given the prompt) and the gold index ``labels[i]``.
Following the paper (and its code), the *mean* per-token log-likelihood is the logit of each
candidate, so long and short verbalisers compete fairly.

``candidate_scores`` items are duck-typed: anything with a ``.mean`` of shape ``[n_candidates]``
(a torch tensor, numpy array or list) works; in practice they are ``mezo_rl.model.scoring.CandidateScores``.
"""
from __future__ import annotations

import operator

import torch

from .registry import register_reward


def _means(candidate_scores, labels) -> list[torch.Tensor]:
    if len(candidate_scores) != len(labels):
        raise ValueError(
            f"got {len(candidate_scores)} candidate_scores but {len(labels)} labels; need one of each per example"
        )
    means = []
    for i, cs in enumerate(candidate_scores):
        if not hasattr(cs, "mean"):
            raise TypeError(
                f"candidate_scores[{i}] is a {type(cs).__name__}; expected an object with .mean "
                f"(log-likelihood per candidate, shape [n_candidates]) such as mezo_rl.model.scoring.CandidateScores"
            )
        m = torch.as_tensor(cs.mean)
        if m.dim() != 1 or m.numel() == 0:
            raise ValueError(f"candidate_scores[{i}].mean must have shape [n_candidates], got {tuple(m.shape)}")
        means.append(m)
    return means


def _check_label(i: int, label, n: int) -> int:
    """The label as a Python int; anything but an integer index into the candidates is an error."""
    try:
        index = operator.index(label) if not isinstance(label, bool) else None
    except TypeError:
        index = None
    if index is None or not 0 <= index < n:
        raise ValueError(f"labels[{i}] = {label!r} is not a candidate index in 0..{n - 1} (or None for 'no label')")
    return index


def candidate_cross_entropy(candidate_scores, labels) -> list[torch.Tensor | None]:
    """Per-example cross-entropy as tensors (differentiable when the scores carry gradients).

    With several candidates: ``-log_softmax(mean log-likelihoods)[label]`` (the paper's
    classification loss). With a single candidate (a generation task whose gold answer was scored
    as the only candidate): the teacher-forced NLL ``-mean log-likelihood`` of the answer tokens.
    Examples with ``label=None`` give ``None``. The backprop baseline can average these directly.
    """
    out = []
    for i, (m, label) in enumerate(zip(_means(candidate_scores, labels), labels)):
        if label is None:
            out.append(None)
            continue
        label = _check_label(i, label, m.numel())
        m = m if m.is_floating_point() else m.to(torch.float64)
        out.append(-m[0] if m.numel() == 1 else -torch.log_softmax(m, dim=0)[label])
    return out


# Both compare an example's candidates with each other when it has several (a softmax over them, an argmax),
# so a shift common to its candidates changes nothing: shift_invariant. The one-candidate branch of
# cross_entropy (teacher-forced NLL) is not, and needs none: the model shifts only examples of two or more.
@register_reward("cross_entropy", higher_is_better=False, needs="scores", shift_invariant=True)
def cross_entropy(prompts, candidate_scores, labels, **columns):
    """Cross-entropy of the gold candidate (mean log-likelihoods as logits); teacher-forced NLL of the answer for generation."""
    return [None if v is None else float(v.detach()) for v in candidate_cross_entropy(candidate_scores, labels)]


@register_reward("accuracy", higher_is_better=True, needs="scores", task_kinds=("classification", "multiple_choice"),
                 shift_invariant=True)
def accuracy(prompts, candidate_scores, labels, **columns):
    """1.0 when the candidate with the highest mean log-likelihood is the gold one, else 0.0 (ties: first wins)."""
    out = []
    for i, (m, label) in enumerate(zip(_means(candidate_scores, labels), labels)):
        if label is None:
            out.append(None)
            continue
        if m.numel() < 2:
            raise ValueError(
                f"accuracy needs at least 2 candidates per example, example {i} has {m.numel()}; "
                f"for generation tasks use exact_match or squad_f1"
            )
        label = _check_label(i, label, m.numel())
        out.append(float(int(torch.argmax(m)) == label))
    return out
