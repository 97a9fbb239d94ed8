"""Scoring: the log-likelihood of each candidate continuation of a prompt (``LanguageModel.score``).

Scoring computes vocabulary logits only at the positions that are scored: the base transformer runs
over the whole sequence, the hidden states of the scored positions are gathered, and only those go
through the output head. A small model's head over every position is a large share of a forward pass
and of its peak memory, which is exactly what MeZO tries not to spend. Where the caller only compares
an example's candidates (``score(..., log_softmax=False)``) and they are single tokens read at one
position, only those tokens' logits are computed there: the vocabulary-wide normaliser cancels.

Masked LMs (BERT, RoBERTa) are scored the way the paper scores them (Table 13, after LM-BFF): the
prompt holds the placeholder ``[MASK]`` (``MASK`` below); each candidate is a label word whose
log-probability is read at the mask. A label word of n tokens is scored at n consecutive masks.

The functions here take the :class:`~mezo_rl.model.lm.LanguageModel` they score with (``lm``) and run
its model through ``lm._hidden`` / ``lm._logits`` (the base and the head); with a trunk cache on
(:mod:`mezo_rl.model.trunk_cache`) they read the final norm's input from it.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from mezo_rl.model.members import block_offsets, check_members, member_rows
from mezo_rl.model.trunk_cache import one_thread

MASK = "[MASK]"  # the mask placeholder in masked-LM prompts (replaced by tokenizer.mask_token_id)


@dataclass
class CandidateScores:
    """Log-likelihoods of one prompt's candidates: ``sum`` and per-token ``mean``, float32 [n_candidates].

    ``n_tokens`` (int64 [n_candidates]) is how many tokens each candidate has. ``log_softmax`` False: the
    scores are the candidates' logits, each log-likelihood plus one constant common to the example's
    candidates (``LanguageModel.score(..., log_softmax=False)``): differences between candidates and their
    ranking are those of the log-likelihoods; the values themselves are not log-likelihoods.
    """

    sum: torch.Tensor
    mean: torch.Tensor
    n_tokens: torch.Tensor
    log_softmax: bool = True


def score(lm, prompts: list[str], candidates: list[list[str]], members: int | None = None,
          log_softmax: bool = True):
    """``lm.score(prompts, candidates, members, log_softmax)`` (:meth:`mezo_rl.model.lm.LanguageModel.score`)."""
    M = check_members(members)
    if len(prompts) != len(candidates):
        raise ValueError(f"score: got {len(prompts)} prompts but {len(candidates)} candidate lists")
    trunk = lm._trunk_cache()
    encode = encode_causal if lm.is_causal else encode_masked
    memo = trunk.encoded if trunk is not None else None  # the same texts come back every step
    pairs = []
    for i, (p, cands) in enumerate(zip(prompts, candidates)):
        if isinstance(cands, str) or not cands:
            raise ValueError(f"score: candidates[{i}] must be a non-empty list of strings, got {cands!r}")
        for c in cands:
            if memo is None:
                pairs.append(encode(lm, p, c))
            else:
                got = memo.get((p, c))
                if got is None:
                    ids, pos, tgt = encode(lm, p, c)
                    got = memo[(p, c)] = (ids, pos, tgt, (tuple(ids), tuple(pos)))
                pairs.append(got)
    relative = [False] * len(pairs) if log_softmax else _relative_pairs(pairs, candidates)
    if not pairs:
        totals = [torch.zeros(0, device=lm.device) for _ in range(M)]
    elif trunk is not None:
        totals = _score_cached(lm, pairs, relative, trunk, M)
    else:
        totals = _score_full(lm, pairs, relative, M)
    per_member = [_collect(t, pairs, candidates, relative) for t in totals]
    return per_member if members is not None else per_member[0]


def _collect(totals, pairs, candidates, relative) -> list[CandidateScores]:
    """Per-pair summed scores [n_pairs] -> one CandidateScores per prompt (views of one tensor)."""
    sizes = [len(c) for c in candidates]
    counts = torch.tensor([len(p[2]) for p in pairs], device=totals.device)
    means = totals / counts
    out, k = [], 0
    for s, m, n, size in zip(totals.split(sizes), means.split(sizes), counts.split(sizes), sizes):
        out.append(CandidateScores(sum=s, mean=m, n_tokens=n, log_softmax=not relative[k]))
        k += size
    return out


def _score_full(lm, pairs, relative, members: int = 1) -> list[torch.Tensor]:
    """Per member, the summed score of each pair [n_pairs] from full forward passes.

    Pairs with the same input share one row. A causal input is prompt + candidate[:-1] (the last
    candidate token is a target only), so e.g. all single-token label words of a prompt share one."""
    by_input: dict[tuple, list[int]] = {}
    for j, pair in enumerate(pairs):
        by_input.setdefault(tuple(pair[0]), []).append(j)
    keys = sorted(by_input, key=len)
    done, parts = [], [[] for _ in range(members)]
    for start in range(0, len(keys), lm.batch_size):
        batch = keys[start : start + lm.batch_size]
        js = [j for key in batch for j in by_input[key]]
        # distinct (row, position) of the batch: each runs through the head once
        where: dict[tuple[int, int], int] = {}
        tokens = []  # (distinct position, target, pair's index in js, needs the normaliser)
        i = 0
        for b, key in enumerate(batch):
            for j in by_input[key]:
                for pos, tgt in zip(pairs[j][1], pairs[j][2]):
                    tokens.append((where.setdefault((b, pos), len(where)), tgt, i, not relative[j]))
                i += 1
        hidden, _ = lm._hidden(*lm._right_padded(list(batch) * members))
        hd = hidden.device  # with device_map="auto" the last layer may live elsewhere than the first
        rows = torch.tensor([b for b, _ in where], device=hd)
        cols = torch.tensor([p for _, p in where], device=hd)
        # member k's rows are the k-th copy of the batch; its scored positions form block k of h
        rows = member_rows(rows, block_offsets(members, len(batch), hd))
        h = hidden[rows, cols.repeat(members)]
        for k, got in enumerate(_pair_scores(lm, h, tokens, len(js), members)):
            parts[k].append(got)
        done += js
    index = torch.tensor(done)
    out = []
    for k in range(members):
        got = torch.cat(parts[k]) if parts[k] else torch.zeros(0)
        out.append(torch.zeros(len(pairs), dtype=got.dtype, device=got.device).index_copy(0, index.to(got.device), got))
    return out


def _score_cached(lm, pairs, relative, trunk, members: int = 1, chunk: int = 512) -> list[torch.Tensor]:
    """Per member, the summed score of each pair [n_pairs] from the cached trunk outputs (filling the
    misses first).

    Pairs with the same cached entry (every single-token label word of one prompt) share its rows:
    the final norm and the head run once per distinct entry (and member), not once per pair."""
    keys = [pair[3] for pair in pairs]
    missing = trunk.missing(keys)
    cpu = lm.device.type == "cpu"
    for start in range(0, len(missing), lm.batch_size):  # the trunk, once per new sequence
        batch = missing[start : start + lm.batch_size]
        work = len(batch) * max(len(ids) for ids, _ in batch)
        # the trunk is frozen: one copy of the batch, stopped before the norm, on the faster thread count
        with torch.no_grad(), trunk.threads.run(work) if cpu else contextlib.nullcontext():
            _, pre = lm._base_with_norm_input(trunk.norm, *lm._right_padded([ids for ids, _ in batch]), stop=True)
        trunk.store(batch, pre)
    parts = [[] for _ in range(members)]
    # with no vocabulary-wide logits (every pair a candidate logit) the rest is small ops: one thread
    small = all(relative) and lm.device.type == "cpu"
    with one_thread() if small else contextlib.nullcontext():
        for start in range(0, len(pairs), chunk):  # final norm + head over every distinct scored token at once
            part = range(start, min(start + chunk, len(pairs)))
            pre, first = trunk.rows(keys[j] for j in part)
            tokens = [(first[keys[j]] + t, tgt, i, not relative[j])
                      for i, j in enumerate(part) for t, tgt in enumerate(pairs[j][2])]
            hidden = trunk.norm(pre.repeat(members, 1) if members > 1 else pre)
            for k, got in enumerate(_pair_scores(lm, hidden, tokens, len(part), members)):
                parts[k].append(got)
    return [torch.cat(p) if len(p) > 1 else p[0] for p in parts]


def _pair_scores(lm, h, tokens, n_pairs: int, members: int = 1) -> list[torch.Tensor]:
    """Per member, the summed score of each pair [n_pairs] (float32) from the final hidden states ``h``
    [M * R, H] of the distinct scored positions (member-major: member k's R rows are block k, and the
    head sees every block in one call). ``tokens``: per scored token (row of a block, target id, its
    pair, whether it needs the normaliser): a log-probability where it does, else the target's logit."""
    dev, R = h.device, h.shape[0] // members
    offsets = block_offsets(members, R, dev)
    rows = member_rows(torch.tensor([t[0] for t in tokens], device=dev), offsets)
    targets = torch.tensor([t[1] for t in tokens], device=dev).repeat(members)
    full = [i for i, t in enumerate(tokens) if t[3]]
    if len(full) == len(tokens):  # every token normalised: logits of the scored rows, then log-softmax
        logits = lm._logits(h)
        ld = logits.device
        rows, targets = rows.to(ld), targets.to(ld)
        # log p(target) = logit(target) - logsumexp(logits): the same as log_softmax, without its
        # second [rows, vocab] tensor
        vals = logits[rows, targets] - torch.logsumexp(logits, dim=-1)[rows]
    else:
        vals = _target_logits(lm, h, rows, targets)
        if full:  # the tokens that need it lose the log-sum-exp of their rows (the same rows in every block)
            need = sorted({tokens[i][0] for i in full})
            at = {r: n for n, r in enumerate(need)}
            picked = member_rows(torch.tensor(need, device=dev), offsets)
            lse = torch.logsumexp(lm._logits(h[picked]), dim=-1).to(vals.device).view(members, -1)
            which = torch.tensor([at[tokens[i][0]] for i in full], device=vals.device)
            vals = vals.view(members, -1).index_add(1, torch.tensor(full, device=vals.device), -lse[:, which])
    vals = vals.reshape(members, len(tokens))
    owner = [t[2] for t in tokens]
    if len(owner) != n_pairs or owner != list(range(n_pairs)):  # several tokens per pair: sum them
        vals = torch.zeros(members, n_pairs, device=vals.device, dtype=vals.dtype).index_add(
            1, torch.tensor(owner, device=vals.device), vals)
    return list(vals.unbind(0))


def _target_logits(lm, h, rows, targets) -> torch.Tensor:
    """The logit of each ``targets[i]`` at row ``rows[i]`` of ``h`` (index tensors; float32): a dot product
    with that token's row of the output head where the head is a plain linear map, else read off the
    full logits (a head with a transform, member corrections or hooks)."""
    head = lm._head
    plain = (lm._base is not None and isinstance(head, torch.nn.Linear)
             and getattr(head.forward, "__func__", None) is torch.nn.Linear.forward
             and not head._forward_hooks and not head._forward_pre_hooks)
    if not plain:
        logits = lm._logits(h)
        return logits[rows.to(logits.device), targets.to(logits.device)]
    wd = head.weight.device
    tg = targets.to(wd)
    w = head.weight[tg].float()
    x = h[rows.to(h.device)].to(wd).float()
    logits = (x * w).sum(-1)
    if head.bias is not None:
        logits = logits + head.bias[tg].float()
    cap = getattr(lm.model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def encode(lm, prompt: str, candidate: str):
    """(input ids, scored positions, target ids) of one (prompt, candidate) pair: the sequence ``score``
    runs for it (causal: prompt + candidate[:-1], scored where each candidate token is predicted;
    masked: the prompt with the candidate's tokens masked, scored at the masks)."""
    return (encode_causal if lm.is_causal else encode_masked)(lm, prompt, candidate)


def encode_causal(lm, prompt: str, candidate: str):
    """(input_ids, scored positions, target ids) for prompt + candidate."""
    tok = lm.tokenizer
    p = tok(prompt, add_special_tokens=True)["input_ids"] if prompt else []
    if not p:  # nothing to condition on: start from BOS (or EOS, the usual document separator)
        start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        p = [start]
    c = tok(candidate, add_special_tokens=False)["input_ids"]
    if not c:
        raise ValueError(f"score: candidate {candidate!r} tokenises to nothing")
    if len(c) >= lm.max_length:
        raise ValueError(f"score: candidate of {len(c)} tokens does not fit max_length={lm.max_length}")
    p = p[-(lm.max_length - len(c)) :]
    ids = p + c
    positions = list(range(len(p) - 1, len(ids) - 1))  # hidden state at t predicts token t + 1
    return ids[:-1], positions, c  # the last candidate token is a target only, never an input


def encode_masked(lm, prompt: str, candidate: str):
    tok = lm.tokenizer
    if prompt.count(MASK) != 1:
        raise ValueError(
            f"score: a masked-LM prompt must contain {MASK!r} exactly once, got {prompt!r} "
            "(tasks give such prompts in Example.mask_prompt)"
        )
    before, after = prompt.split(MASK)
    before = before.rstrip(" ")  # the space before the mask belongs to the label word (" great")
    c = tok(candidate, add_special_tokens=False)["input_ids"]
    if not c:
        raise ValueError(f"score: candidate {candidate!r} tokenises to nothing")
    b = tok(before, add_special_tokens=False)["input_ids"] if before else []
    a = tok(after, add_special_tokens=False)["input_ids"] if after else []
    prefix, suffix = _special_tokens_around(lm.tokenizer)
    budget = lm.max_length - len(c) - len(prefix) - len(suffix)
    b = b[max(0, len(b) - max(0, budget - len(a))) :]  # truncate the text before the mask first
    a = a[: max(0, budget - len(b))]
    ids = prefix + b + [tok.mask_token_id] * len(c) + a + suffix
    first = len(prefix) + len(b)
    return ids, list(range(first, first + len(c))), c


def _special_tokens_around(tok):
    """The special tokens ``tok`` puts before and after one sequence ([CLS] ... [SEP])."""
    plain = tok("a", add_special_tokens=False)["input_ids"]
    full = tok("a", add_special_tokens=True)["input_ids"]
    for i in range(len(full) - len(plain) + 1):
        if full[i : i + len(plain)] == plain:
            return full[:i], full[i + len(plain) :]
    return [], []


def _relative_pairs(pairs, candidates) -> list[bool]:
    """Per pair, whether ``score(..., log_softmax=False)`` may give it a logit: its example has two or more
    candidates, each one token read at the same position of the same input."""
    out, k = [], 0
    for cands in candidates:
        group = pairs[k : k + len(cands)]
        ids, pos = group[0][0], group[0][1]
        ok = len(group) > 1 and all(len(p[2]) == 1 and p[1] == pos and p[0] == ids for p in group)
        out += [ok] * len(group)
        k += len(cands)
    return out
