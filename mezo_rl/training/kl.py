"""KL to the starting model: how far a trained policy's next-token distributions have moved.

``kl`` (a prompt task's evaluation key, and ``--beta``'s penalty) is the mean per-token KL divergence
``KL(pi_theta || pi_start)`` between the policy being trained and the model the run started from, over
completions the policy wrote. The estimator is exact over the vocabulary: at every completion token
position t,

    kl_t = sum_v pi_theta(v | x, y_<t) * (log pi_theta(v | x, y_<t) - log pi_start(v | x, y_<t))

from both models' full logits (not TRL's sampled k3 estimate, which needs no second set of logits but
is noisier). The mean is over tokens: every completion's tokens count once (TRL's masked mean), a
completion that tokenises to nothing adds none. Each (prompt, completion) pair is read as
:meth:`mezo_rl.model.lm.LanguageModel.encode` reads it for scoring: the prompt and the completion are
tokenised separately and concatenated (for a chat prompt, the prompt text as the chat template rendered
it).

The starting model is never a second model in memory: :class:`StartingPoint` keeps a copy of the
*trainable* tensors as they were at the start and swaps it in for the second forward pass (the tensors'
storage is exchanged, nothing is copied per call, and the trained tensors are back, bit for bit, when
the block ends). Its cost is the trainable tensors' bytes once (``StartingPoint.nbytes``): the final
norm's gains with ``--peft norm``, the adapter with ``--peft lora`` / ``prefix`` (small), and the
whole model's weights once more with ``--peft full``.

    start = StartingPoint(lm.model)             # before the first step
    ...                                         # train
    kl = completion_kl(lm, start, prompts, completions)   # KLSums(total, tokens)
    kl.mean
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mezo_rl.model.dropout import dropout_paused

__all__ = ["StartingPoint", "starting_point", "KLSums", "completion_kl", "member_kls", "KL", "KL_BATCH"]

KL = "kl"  #: the evaluation and log key
#: (prompt, completion) pairs a forward pass of :func:`completion_kl` reads: it holds both models'
#: full-vocabulary log-probabilities at every completion position of the chunk (about 4 x pairs x positions x
#: vocabulary x 4 bytes), which at an evaluation's batch size set a prompt-task run's peak memory
#: (benchmarks/kl_memory.py; benchmarks/README.md, "Prompt tasks: the defaults")
KL_BATCH = 8


class StartingPoint:
    """The trainable tensors of ``model`` as they are now: the starting model of a run, kept as a copy of
    those tensors only (the frozen ones are shared with the model being trained)."""

    def __init__(self, model):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.start = [p.detach().clone() for p in self.params]

    @property
    def nbytes(self) -> int:
        """Memory the copy holds, in bytes."""
        return sum(t.numel() * t.element_size() for t in self.start)

    @contextlib.contextmanager
    def active(self):
        """Within the block the model computes as the starting model; after it, the tensors it had
        before (the same storage, so any view of them stays valid)."""
        held = [p.data for p in self.params]
        # autocast caches its low-precision copy of each leaf tensor that requires grad, keyed on the tensor
        # and not its storage: after a swap inside one autocast region the cached copy would be the other
        # weights' (and the two passes would compute alike). Clear it at both swaps.
        torch.clear_autocast_cache()
        for p, s in zip(self.params, self.start):
            p.data = s
        try:
            yield self
        finally:
            for p, h in zip(self.params, held):
                p.data = h
            torch.clear_autocast_cache()


def starting_point(lm, reference: bool) -> "StartingPoint | None":
    """The run's starting point where its plan keeps one (``reference``: a prompt task,
    ``mezo_rl.training.plan.RunPlan.reference``) and the model writes completions (a causal LM): the reference
    of ``kl`` and of ``--beta``. None otherwise."""
    return StartingPoint(lm.model) if reference and lm.is_causal else None


@dataclass
class KLSums:
    """Summed per-token KL and the number of tokens it covers (``mean``: NaN with no tokens)."""

    total: float = 0.0
    tokens: int = 0

    @property
    def mean(self) -> float:
        return self.total / self.tokens if self.tokens else float("nan")

    def __add__(self, other: "KLSums") -> "KLSums":
        return KLSums(self.total + other.total, self.tokens + other.tokens)


def _position_logprobs(lm, rows, keep: torch.Tensor) -> torch.Tensor:
    """log-softmax of the model's logits at the positions ``keep`` of the right-padded ``rows`` [B, K, V]."""
    T = max(len(ids) for ids in rows)
    pad = lm.tokenizer.pad_token_id
    input_ids = torch.full((len(rows), T), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for b, ids in enumerate(rows):
        input_ids[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[b, : len(ids)] = 1
    device = lm.device
    logits = lm.model(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                      logits_to_keep=keep.to(device)).logits
    return F.log_softmax(logits.float(), dim=-1)


def completion_kl(lm, start: StartingPoint, prompts: list[str], completions: list[str],
                  batch_size: int = KL_BATCH) -> KLSums:
    """Exact per-token ``KL(pi_theta || pi_start)`` summed over the tokens of ``completions`` (each given its
    prompt, as plain text: chat prompts already rendered), at the weights in place against ``start``.

    ``batch_size`` pairs per forward pass; each pass keeps the logits of completion positions only. Runs
    without gradients. Needs a causal LM.
    """
    return member_kls(lm, start, prompts, [completions], batch_size=batch_size)[0]


def member_kls(lm, start: StartingPoint, prompts: list[str], completions: list[list[str]],
               unperturbed=contextlib.nullcontext, batch_size: int = KL_BATCH) -> list[KLSums]:
    """:func:`completion_kl` of each of M members at once, for a member-batched pass
    (:class:`mezo_rl.engine.population.BatchedMembers`): ``completions[k]`` are member k's texts for
    ``prompts``. Every policy forward holds M equal blocks of rows in member-major layout (member k's
    perturbation applies to block k); the starting model's forward of the same rows runs within
    ``unperturbed()`` (the strategy's ``paused``), where the model computes without the members, once for each
    distinct row (the two members of a pair read the same texts). With one member and no strategy this is
    :func:`completion_kl`. A completion that tokenises to nothing keeps its row (the blocks stay equal) and
    adds no token."""
    if not lm.is_causal:
        raise ValueError("completion_kl needs a causal LM (the completions are its continuations)")
    for texts in completions:
        if len(texts) != len(prompts):
            raise ValueError(f"completion_kl: {len(prompts)} prompts but {len(texts)} completions")
    M = len(completions)
    filler = lm.tokenizer.eos_token_id if lm.tokenizer.eos_token_id is not None else lm.tokenizer.pad_token_id

    def pair(prompt, text):  # (input ids, scored positions)
        if text and lm.tokenizer(text, add_special_tokens=False)["input_ids"]:
            ids, pos, _ = lm.encode(prompt, text)
            return ids, pos
        return [filler], []

    encoded = [[pair(p, c) for p, c in zip(prompts, texts)] for texts in completions]
    per = max(1, batch_size // M)  # prompts a pass: M rows each
    sums = [KLSums() for _ in range(M)]
    with torch.no_grad():
        for lo in range(0, len(prompts), per):
            chunk = [encoded[k][i] for k in range(M) for i in range(lo, min(len(prompts), lo + per))]
            if not any(pos for _, pos in chunk):
                continue
            rows = [ids for ids, _ in chunk]
            keep = torch.tensor(sorted({p for _, pos in chunk for p in pos}), dtype=torch.long)
            index = {int(p): k for k, p in enumerate(keep)}
            sel_b = torch.tensor([b for b, (_, pos) in enumerate(chunk) for _ in pos])
            sel_k = torch.tensor([index[p] for _, pos in chunk for p in pos])
            logp = _position_logprobs(lm, rows, keep)
            if M == 1:  # the same rows: at the start's own weights the two passes agree bit for bit (kl 0 at lr 0)
                start_rows, sel_q = rows, sel_b
            else:  # each distinct row once: a pair's two members read the same texts
                where: dict[tuple, int] = {}
                for r in map(tuple, rows):
                    where.setdefault(r, len(where))
                start_rows = [list(r) for r in where]
                sel_q = torch.tensor([where[tuple(rows[b])] for b in sel_b.tolist()])
            with unperturbed(), start.active(), dropout_paused(lm.model):  # the start: no perturbation, no dropout
                logq = _position_logprobs(lm, start_rows, keep)
            d = logp.device
            lp, lq = logp[sel_b.to(d), sel_k.to(d)], logq[sel_q.to(d), sel_k.to(d)]  # [N, V]
            per_token = (lp.exp() * (lp - lq)).sum(-1).double().cpu()
            member = sel_b // (len(chunk) // M)
            for k in range(M):
                mine = per_token[member == k]
                sums[k] = sums[k] + KLSums(float(mine.sum()), int(mine.numel()))
    return sums
