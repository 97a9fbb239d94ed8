"""The language model as a black box: score candidates, generate text, extract features.

MeZO, the rewards and the baselines see a model only through three questions:

* ``score(prompts, candidates)``: how likely is each candidate continuation of each prompt?
  (log-likelihood summed and averaged over the candidate's tokens only)
* ``generate(prompts, ...)``: what does the model write after each prompt? (greedy or seeded sampling,
  stopping at EOS or at the caller's stop strings)
* ``features(prompts)``: one hidden vector per prompt (for the linear-probing baseline).

Scoring computes vocabulary logits only at the positions that are scored: the base transformer runs
over the whole sequence, the hidden states of the scored positions are gathered, and only those go
through the output head. A small model's head over every position is a large share of a forward pass
and of its peak memory, which is exactly what MeZO tries not to spend. Where the caller only compares
an example's candidates (``score(..., normalised=False)``) and they are single tokens read at one
position, only those tokens' logits are computed there: the vocabulary-wide normaliser cancels.

Masked LMs (BERT, RoBERTa) are scored the way the paper scores them (Table 13, after LM-BFF): the
prompt holds the placeholder ``[MASK]`` (``MASK`` below); each candidate is a label word whose
log-probability is read at the mask. A label word of n tokens is scored at n consecutive masks.

    >>> lm = LanguageModel(model, tokenizer)
    >>> s = lm.score(["The movie was great. It was"], [[" terrible", " great"]])
    >>> s[0].mean.argmax()        # index of the more likely candidate

Members (the batched evaluation of :mod:`mezo_rl.engine.population`): ``score(..., members=M)`` and
``generate(..., members=M)`` run every forward pass on M copies of their batch in member-major
layout (rows [k*b, (k+1)*b) are member k's; ``batch_size`` counts the sequences of one member, so a
forward holds M * batch_size rows) and return one result list per member. The model knows only M.
"""
from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mezo_rl.model.trunk_cache import TrunkCache, one_thread

MASK = "[MASK]"  # the mask placeholder in masked-LM prompts (replaced by tokenizer.mask_token_id)
# the final normalisation layer of common decoder LMs (Llama/Gemma/Mistral/Qwen, GPT-2, OPT, Falcon):
# the boundary of the trunk cache below, and what ``--peft norm`` trains (mezo_rl.model.peft.FINAL_NORM)
FINAL_NORM_MODULES = ("model.norm", "transformer.ln_f", "model.decoder.final_layer_norm", "transformer.norm_f")


@dataclass
class CandidateScores:
    """Log-likelihoods of one prompt's candidates: ``sum`` and per-token ``mean``, float32 [n_candidates].

    ``n_tokens`` (int64 [n_candidates]) is how many tokens each candidate has. ``normalised`` False: the
    scores are the candidates' logits, each log-likelihood plus one constant common to the example's
    candidates (``LanguageModel.score(..., normalised=False)``): differences between candidates and their
    ranking are those of the log-likelihoods; the values themselves are not log-likelihoods.
    """

    sum: torch.Tensor
    mean: torch.Tensor
    n_tokens: torch.Tensor
    normalised: bool = True


class LanguageModel:
    """A Hugging Face causal or masked LM plus its tokenizer, behind score / generate / features.

    Args:
        model: a ``transformers`` ``PreTrainedModel`` (``...ForCausalLM`` or ``...ForMaskedLM``).
        tokenizer: its tokenizer. A causal LM without a pad token gets EOS as pad (only used for padding).
        batch_size: how many (prompt, candidate) sequences go through the model at once in ``score``
            and how many prompts at once in ``generate``/``features``.
        max_length: longest sequence fed to the model; longer prompts lose tokens from the left (the
            candidate is always kept whole). Default: the model's ``max_position_embeddings`` (capped at 4096).

    The model is used as it is (its device and dtype, its train/eval mode). Nothing here switches
    gradients off: call ``score`` under ``torch.no_grad()`` unless you want to backpropagate through it.
    """

    def __init__(self, model, tokenizer, batch_size: int = 16, max_length: int | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = int(batch_size)
        cfg = model.config
        archs = getattr(cfg, "architectures", None) or [type(model).__name__]
        self.is_causal = not any(a.endswith("ForMaskedLM") for a in archs) and not type(model).__name__.endswith("ForMaskedLM")
        if max_length is None:
            max_length = min(getattr(cfg, "max_position_embeddings", 2048) or 2048, 4096)
        self.max_length = int(max_length)
        if tokenizer.pad_token_id is None:
            if tokenizer.eos_token_id is None:
                raise ValueError("the tokenizer has neither a pad nor an EOS token; set tokenizer.pad_token")
            tokenizer.pad_token = tokenizer.eos_token
        if not self.is_causal and tokenizer.mask_token_id is None:
            raise ValueError(f"{type(model).__name__} is a masked LM but its tokenizer has no mask token")
        self._base, self._head = _split_base_and_head(model)
        self._eos = None  # (device, vocabulary size) and the EOS mask over the vocabulary
        self._stop_checks = {}  # stop strings -> StopCheck
        self._kv = None  # the last preallocated key/value cache handed out: (shape key, cache)
        self._graphs = True  # False once recording a decoding step as a CUDA graph has failed here
        self._trunk = None  # the frozen-trunk cache, when enabled (enable_trunk_cache)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @contextlib.contextmanager
    def batches_of(self, batch_size: int):
        """Within the block, ``score``/``generate``/``features`` put ``batch_size`` sequences (per member)
        through the model at once; ``self.batch_size`` is restored after, even on an exception. Used by
        evaluation, whose batch size is its own option, so a forward pass holds what that option says."""
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        before, self.batch_size = self.batch_size, int(batch_size)
        try:
            yield self
        finally:
            self.batch_size = before

    def __repr__(self):
        kind = "causal" if self.is_causal else "masked"
        n = sum(p.numel() for p in self.model.parameters())
        return f"LanguageModel({type(self.model).__name__}, {kind}, {n:,} parameters, {self.device})"

    # ------------------------------------------------------------------ hidden states and logits
    def _hidden(self, input_ids, attention_mask, **kw):
        """Last hidden states [B, T, H] (after the final norm), and the base model's output."""
        if self._base is None:  # unknown layout: the full model, and its logits stand in for "hidden"
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, **kw)
            return out.logits, out
        out = self._base(input_ids=input_ids, attention_mask=attention_mask, **kw)
        return out[0], out

    def _logits(self, hidden):
        """Vocabulary logits (float32) for hidden states [..., H] at the gathered positions only."""
        if self._base is None:
            return hidden.float()
        logits = self._head(hidden).float()
        cap = getattr(self.model.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    # ------------------------------------------------------------------ frozen-trunk cache
    def enable_trunk_cache(self) -> bool:
        """Compute the trunk once per scored sequence while only the final norm (and head) can change.

        The trunk is everything before the final normalisation layer (``FINAL_NORM_MODULES``). While
        every trunk parameter is frozen (``requires_grad=False``), its output at a scored position is a
        function of the input tokens alone, so ``score`` keeps the final norm's *input* at the scored
        positions of each (sequence, positions) it has seen (a :class:`~mezo_rl.model.trunk_cache.TrunkCache`)
        and, on a hit, runs only the final norm and the output head. The scores are those of a full
        forward pass (the same computation on the same inputs); what changes is the cost: the norm and
        the head are a small part of a forward pass (docs/peft.md). This is what makes MeZO on the final
        norm (``--peft norm``) cheap.

        A forward pass's last bits depend on the batch it ran in (padding, matrix blocking), so an entry
        keeps the values of the call that filled it: fill it the same way in every run (the trainer
        scores each whole split once first) if runs must agree bit for bit.

        The cache is bypassed (and emptied) whenever a trunk parameter requires grad. It cannot see
        frozen weights changed in place (``load_state_dict``, a replay onto them): call
        ``clear_trunk_cache()`` after doing that. Memory: hidden-size floats per scored token.
        ``generate`` and ``features`` never use it.

        Returns whether the cache is on: False (and nothing changes) for a masked LM, a model without a
        final norm named in ``FINAL_NORM_MODULES``, or one whose base output is not that norm's output
        (checked on a probe input).
        """
        modules = dict(self.model.named_modules())
        name = next((n for n in FINAL_NORM_MODULES if n in modules), None)
        if not self.is_causal or self._base is None or name is None:
            return False
        norm = modules[name]
        own = {id(p) for p in norm.parameters()}
        trunk_params = [p for p in self._base.parameters() if id(p) not in own]
        ids = torch.tensor([self.tokenizer("a b", add_special_tokens=True)["input_ids"]], device=self.device)
        with torch.no_grad():
            hidden, pre = self._base_with_norm_input(norm, ids, torch.ones_like(ids))
            if not torch.equal(norm(pre), hidden):  # e.g. OPT-350m projects after its final norm
                return False
        self._trunk = TrunkCache(norm, trunk_params, fingerprint=pre.detach().clone())
        return True

    @property
    def trunk_cache(self) -> TrunkCache | None:
        """The trunk cache when it is on and usable now (every trunk weight frozen), else None."""
        return self._trunk_cache()

    def adopt_trunk_cache(self, cache: TrunkCache) -> bool:
        """Take the entries of another model's trunk cache (``other_lm.trunk_cache``) whose trunk is this
        one's (the same frozen weights: a model rebuilt from the same base, e.g. the best step's weights
        replayed onto a fresh copy), so the trunk does not run again for them. Whether the trunks are the
        same is checked on a probe input (bit for bit). Returns whether the entries were taken; False
        also when this model's cache is off."""
        mine = self._trunk_cache()
        return mine is not None and cache is not None and mine.adopt(cache)

    def clear_trunk_cache(self) -> None:
        """Forget the cached trunk outputs (after changing frozen weights in place)."""
        if self._trunk is not None:
            self._trunk.clear()

    @property
    def trunk_cache_active(self) -> bool:
        """Whether ``score`` reads the trunk cache now (enabled, and every trunk weight frozen)."""
        return self._trunk_cache() is not None

    @property
    def trunk_cache_size(self) -> int:
        """Cached (sequence, positions) entries; 0 when the cache is off."""
        return 0 if self._trunk is None else len(self._trunk)

    def _trunk_cache(self):
        """The cache if it may be used now (every trunk parameter frozen), else None."""
        return self._trunk if self._trunk is not None and self._trunk.usable() else None

    def _right_padded(self, seqs):
        """(input_ids, attention_mask) [B, T] on the model's device, right padding: every real token keeps
        its position, so padding never changes a sequence's hidden states."""
        T = max(len(ids) for ids in seqs)
        input_ids = torch.full((len(seqs), T), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), T), dtype=torch.long)
        for b, ids in enumerate(seqs):
            input_ids[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[b, : len(ids)] = 1
        return input_ids.to(self.device), mask.to(self.device)

    def _base_with_norm_input(self, norm, input_ids, attention_mask, stop: bool = False):
        """The base's output and its final norm's input, from one forward pass; with ``stop`` only the
        norm's input (the pass ends there: hidden is None)."""
        seen = []

        def hook(module, args):
            seen.append(args[0])
            if stop:
                raise _StopAtNorm()

        handle = norm.register_forward_pre_hook(hook)
        try:
            hidden, _ = self._hidden(input_ids, attention_mask)
        except _StopAtNorm:
            hidden = None
        finally:
            handle.remove()
        return hidden, seen[-1]

    # ------------------------------------------------------------------ scoring
    def score(self, prompts: list[str], candidates: list[list[str]], members: int | None = None,
              normalised: bool = True):
        """Log-likelihood of each candidate continuation, over the candidate's tokens only.

        Args:
            prompts: B prompt strings. For a causal LM the candidate is appended to the prompt as text
                is (``prompt + candidate``; prompt and candidate are tokenised separately, so put the
                separating space at the start of the candidate: ``" great"``). For a masked LM each
                prompt must contain ``MASK`` (``"[MASK]"``) exactly once.
            candidates: for each prompt, a non-empty list of candidate strings.
            normalised: True (default): true log-likelihoods. False: the caller only compares an
                example's candidates with each other (a reward invariant to a shift common to them,
                such as accuracy or the cross-entropy over candidates), so where an example has two or
                more candidates that are each one token read at the same position, its scores are those
                tokens' logits there: log-probabilities plus one constant per example (minus the
                log-sum-exp over the vocabulary), and the vocabulary-wide logits are never computed
                (``hidden @ W[candidate ids]``). Such an example's ``CandidateScores.normalised`` is
                False; every other example (one candidate, multi-token candidates, candidates read at
                different positions) is scored as with True.

        Returns:
            one ``CandidateScores`` per prompt, with ``sum`` and ``mean`` of shape [n_candidates]
            (float32, on the model's device, differentiable if grad is enabled).

        All (prompt, candidate) pairs are flattened into one list; pairs whose model input is the same
        (for a causal LM: prompt + all but the last candidate token, so every single-token label word
        of one prompt) share one sequence, and the distinct sequences run in length-sorted batches of
        ``self.batch_size``. A scored position shared by several pairs runs through the head once.
        Padding never changes a score (batched == one at a time).

        With ``members=M`` every forward runs on M copies of its batch in member-major layout and the
        result is a list of M such lists, one per member (see the module docstring).
        """
        M = _check_members(members)
        if len(prompts) != len(candidates):
            raise ValueError(f"score: got {len(prompts)} prompts but {len(candidates)} candidate lists")
        trunk = self._trunk_cache()
        encode = self._encode_causal if self.is_causal else self._encode_masked
        memo = trunk.encoded if trunk is not None else None  # the same texts come back every step
        pairs = []
        for i, (p, cands) in enumerate(zip(prompts, candidates)):
            if isinstance(cands, str) or not cands:
                raise ValueError(f"score: candidates[{i}] must be a non-empty list of strings, got {cands!r}")
            for c in cands:
                if memo is None:
                    pairs.append(encode(p, c))
                else:
                    got = memo.get((p, c))
                    if got is None:
                        ids, pos, tgt = encode(p, c)
                        got = memo[(p, c)] = (ids, pos, tgt, (tuple(ids), tuple(pos)))
                    pairs.append(got)
        relative = [False] * len(pairs) if normalised else _relative_pairs(pairs, candidates)
        if not pairs:
            totals = [torch.zeros(0, device=self.device) for _ in range(M)]
        elif trunk is not None:
            totals = self._score_cached(pairs, relative, trunk, M)
        else:
            totals = self._score_full(pairs, relative, M)
        per_member = [self._collect(t, pairs, candidates, relative) for t in totals]
        return per_member if members is not None else per_member[0]

    @staticmethod
    def _collect(totals, pairs, candidates, relative) -> list[CandidateScores]:
        """Per-pair summed scores [n_pairs] -> one CandidateScores per prompt (views of one tensor)."""
        sizes = [len(c) for c in candidates]
        counts = torch.tensor([len(p[2]) for p in pairs], device=totals.device)
        means = totals / counts
        out, k = [], 0
        for s, m, n, size in zip(totals.split(sizes), means.split(sizes), counts.split(sizes), sizes):
            out.append(CandidateScores(sum=s, mean=m, n_tokens=n, normalised=not relative[k]))
            k += size
        return out

    def _score_full(self, pairs, relative, members: int = 1) -> list[torch.Tensor]:
        """Per member, the summed score of each pair [n_pairs] from full forward passes.

        Pairs with the same input share one row. A causal input is prompt + candidate[:-1] (the last
        candidate token is a target only), so e.g. all single-token label words of a prompt share one."""
        by_input: dict[tuple, list[int]] = {}
        for j, pair in enumerate(pairs):
            by_input.setdefault(tuple(pair[0]), []).append(j)
        keys = sorted(by_input, key=len)
        done, parts = [], [[] for _ in range(members)]
        for start in range(0, len(keys), self.batch_size):
            batch = keys[start : start + self.batch_size]
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
            hidden, _ = self._hidden(*self._right_padded(list(batch) * members))
            hd = hidden.device  # with device_map="auto" the last layer may live elsewhere than the first
            rows = torch.tensor([b for b, _ in where], device=hd)
            cols = torch.tensor([p for _, p in where], device=hd)
            # member k's rows are the k-th copy of the batch; its scored positions form block k of h
            rows = (rows[None, :] + torch.arange(members, device=hd)[:, None] * len(batch)).reshape(-1)
            h = hidden[rows, cols.repeat(members)]
            for k, got in enumerate(self._pair_scores(h, tokens, len(js), members)):
                parts[k].append(got)
            done += js
        index = torch.tensor(done)
        out = []
        for k in range(members):
            got = torch.cat(parts[k]) if parts[k] else torch.zeros(0)
            out.append(torch.zeros(len(pairs), dtype=got.dtype, device=got.device).index_copy(0, index.to(got.device), got))
        return out

    def _score_cached(self, pairs, relative, trunk, members: int = 1, chunk: int = 512) -> list[torch.Tensor]:
        """Per member, the summed score of each pair [n_pairs] from the cached trunk outputs (filling the
        misses first).

        Pairs with the same cached entry (every single-token label word of one prompt) share its rows:
        the final norm and the head run once per distinct entry (and member), not once per pair."""
        keys = [pair[3] for pair in pairs]
        missing = trunk.missing(keys)
        cpu = self.device.type == "cpu"
        for start in range(0, len(missing), self.batch_size):  # the trunk, once per new sequence
            batch = missing[start : start + self.batch_size]
            work = len(batch) * max(len(ids) for ids, _ in batch)
            # the trunk is frozen: one copy of the batch, stopped before the norm, on the faster thread count
            with torch.no_grad(), trunk.threads.run(work) if cpu else contextlib.nullcontext():
                _, pre = self._base_with_norm_input(trunk.norm, *self._right_padded([ids for ids, _ in batch]), stop=True)
            trunk.store(batch, pre)
        parts = [[] for _ in range(members)]
        # with no vocabulary-wide logits (every pair a candidate logit) the rest is small ops: one thread
        small = all(relative) and self.device.type == "cpu"
        with one_thread() if small else contextlib.nullcontext():
            for start in range(0, len(pairs), chunk):  # final norm + head over every distinct scored token at once
                part = range(start, min(start + chunk, len(pairs)))
                pre, first = trunk.rows(keys[j] for j in part)
                tokens = [(first[keys[j]] + t, tgt, i, not relative[j])
                          for i, j in enumerate(part) for t, tgt in enumerate(pairs[j][2])]
                hidden = trunk.norm(pre.repeat(members, 1) if members > 1 else pre)
                for k, got in enumerate(self._pair_scores(hidden, tokens, len(part), members)):
                    parts[k].append(got)
        return [torch.cat(p) if len(p) > 1 else p[0] for p in parts]

    def _pair_scores(self, h, tokens, n_pairs: int, members: int = 1) -> list[torch.Tensor]:
        """Per member, the summed score of each pair [n_pairs] (float32) from the final hidden states ``h``
        [M * R, H] of the distinct scored positions (member-major: member k's R rows are block k, and the
        head sees every block in one call). ``tokens``: per scored token (row of a block, target id, its
        pair, whether it needs the normaliser): a log-probability where it does, else the target's logit."""
        dev, R = h.device, h.shape[0] // members
        offsets = torch.arange(members, device=dev)[:, None] * R
        rows = (torch.tensor([t[0] for t in tokens], device=dev)[None, :] + offsets).reshape(-1)
        targets = torch.tensor([t[1] for t in tokens], device=dev).repeat(members)
        full = [i for i, t in enumerate(tokens) if t[3]]
        if len(full) == len(tokens):  # every token normalised: logits of the scored rows, then log-softmax
            logits = self._logits(h)
            ld = logits.device
            rows, targets = rows.to(ld), targets.to(ld)
            # log p(target) = logit(target) - logsumexp(logits): the same as log_softmax, without its
            # second [rows, vocab] tensor
            vals = logits[rows, targets] - torch.logsumexp(logits, dim=-1)[rows]
        else:
            vals = self._target_logits(h, rows, targets)
            if full:  # the tokens that need it lose the log-sum-exp of their rows (the same rows in every block)
                need = sorted({tokens[i][0] for i in full})
                at = {r: n for n, r in enumerate(need)}
                picked = (torch.tensor(need, device=dev)[None, :] + offsets).reshape(-1)
                lse = torch.logsumexp(self._logits(h[picked]), dim=-1).to(vals.device).view(members, -1)
                which = torch.tensor([at[tokens[i][0]] for i in full], device=vals.device)
                vals = vals.view(members, -1).index_add(1, torch.tensor(full, device=vals.device), -lse[:, which])
        vals = vals.reshape(members, len(tokens))
        owner = [t[2] for t in tokens]
        if len(owner) != n_pairs or owner != list(range(n_pairs)):  # several tokens per pair: sum them
            vals = torch.zeros(members, n_pairs, device=vals.device, dtype=vals.dtype).index_add(
                1, torch.tensor(owner, device=vals.device), vals)
        return list(vals.unbind(0))

    def _target_logits(self, h, rows, targets) -> torch.Tensor:
        """The logit of each ``targets[i]`` at row ``rows[i]`` of ``h`` (index tensors; float32): a dot product
        with that token's row of the output head where the head is a plain linear map, else read off the
        full logits (a head with a transform, member corrections or hooks)."""
        head = self._head
        plain = (self._base is not None and isinstance(head, torch.nn.Linear)
                 and getattr(head.forward, "__func__", None) is torch.nn.Linear.forward
                 and not head._forward_hooks and not head._forward_pre_hooks)
        if not plain:
            logits = self._logits(h)
            return logits[rows.to(logits.device), targets.to(logits.device)]
        wd = head.weight.device
        tg = targets.to(wd)
        w = head.weight[tg].float()
        x = h[rows.to(h.device)].to(wd).float()
        logits = (x * w).sum(-1)
        if head.bias is not None:
            logits = logits + head.bias[tg].float()
        cap = getattr(self.model.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def encode(self, prompt: str, candidate: str):
        """(input ids, scored positions, target ids) of one (prompt, candidate) pair: the sequence ``score``
        runs for it (causal: prompt + candidate[:-1], scored where each candidate token is predicted;
        masked: the prompt with the candidate's tokens masked, scored at the masks)."""
        return self._encode_causal(prompt, candidate) if self.is_causal else self._encode_masked(prompt, candidate)

    def _encode_causal(self, prompt: str, candidate: str):
        """(input_ids, scored positions, target ids) for prompt + candidate."""
        tok = self.tokenizer
        p = tok(prompt, add_special_tokens=True)["input_ids"] if prompt else []
        if not p:  # nothing to condition on: start from BOS (or EOS, the usual document separator)
            start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
            p = [start]
        c = tok(candidate, add_special_tokens=False)["input_ids"]
        if not c:
            raise ValueError(f"score: candidate {candidate!r} tokenises to nothing")
        if len(c) >= self.max_length:
            raise ValueError(f"score: candidate of {len(c)} tokens does not fit max_length={self.max_length}")
        p = p[-(self.max_length - len(c)) :]
        ids = p + c
        positions = list(range(len(p) - 1, len(ids) - 1))  # hidden state at t predicts token t + 1
        return ids[:-1], positions, c  # the last candidate token is a target only, never an input

    def _encode_masked(self, prompt: str, candidate: str):
        tok = self.tokenizer
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
        prefix, suffix = self._special_tokens_around()
        budget = self.max_length - len(c) - len(prefix) - len(suffix)
        b = b[max(0, len(b) - max(0, budget - len(a))) :]  # truncate the text before the mask first
        a = a[: max(0, budget - len(b))]
        ids = prefix + b + [tok.mask_token_id] * len(c) + a + suffix
        first = len(prefix) + len(b)
        return ids, list(range(first, first + len(c))), c

    def _special_tokens_around(self):
        """The special tokens the tokenizer puts before and after one sequence ([CLS] ... [SEP])."""
        tok = self.tokenizer
        plain = tok("a", add_special_tokens=False)["input_ids"]
        full = tok("a", add_special_tokens=True)["input_ids"]
        for i in range(len(full) - len(plain) + 1):
            if full[i : i + len(plain)] == plain:
                return full[:i], full[i + len(plain) :]
        return [], []

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(
        self,
        prompts: list[str],
        max_new_tokens: int = 50,
        do_sample: bool = False,
        seed: int | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        stop: list[str] | None = None,
        members: int | None = None,
    ) -> list[str] | list[list[str]]:
        """Continue each prompt; return the new text only, up to and including the first stop string it writes.

        Batched decoding with a key/value cache, ``self.batch_size`` prompts at a time, taken in order of
        their token length so that a chunk's left padding stays short. Greedy by default; with
        ``do_sample=True`` tokens are drawn from softmax(logits / temperature) (optionally the top_k
        most likely) with a ``torch.Generator`` seeded by ``seed``: two calls with the same seed and the
        same prompts return the same text, so +eps and -eps perturbations see common random numbers.

        A completion ends at EOS (always; EOS is not part of the text), at the first of the ``stop``
        strings it writes, or after ``max_new_tokens``. The text keeps the stop string and ends with it,
        as transformers' ``generate(stop_strings=...)`` does, wherever it falls: across tokens, or starting
        or ending inside one; what the token that completes it carries beyond it is dropped (transformers
        keeps that token whole). Of several stop strings, the one written first ends the text
        (``stop=["\\n"]``: a completion ends with its first newline).
        ``stop``: a list of non-empty strings (one string is taken as a list of one); None or empty: EOS only.

        Stop checks run on the device: EOS is a lookup of each new token, a stop string is matched over
        the last tokens' ids (transformers' ``StopStringCriteria``), and a row that has finished gets
        padding from then on. Where the host has to wait for the device to read "has every row
        finished?" (an accelerator), it asks only every ``DONE_CHECK_EVERY`` tokens; on a CPU after each
        one. The key/value cache is preallocated for the whole decode where the model supports it
        (:func:`decode_plan`), and on CUDA the one-token step is a CUDA graph, replayed (:class:`DecodeGraph`).

        With ``members=M`` every forward (prompt and decoding steps, KV cache included) runs on M copies
        of the batch in member-major layout, and the result is a list of M lists of texts. Sampling
        uses common random numbers: at every decoding step each member's block draws the same random
        numbers as block 0 (the generator is rewound before each block), which are the numbers a call
        without members would draw for the same prompts.
        """
        M = _check_members(members)
        stops = stop_strings(stop)
        if not self.is_causal:
            raise ValueError("generate needs a causal LM; this is a masked LM")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if do_sample and not temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
        gen = None
        if do_sample:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(0 if seed is None else int(seed))
        tok = self.tokenizer
        start_id = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        enc = [(tok(p, add_special_tokens=True)["input_ids"] or [start_id])[-(self.max_length - max_new_tokens):]
               for p in prompts]
        # Chunks of prompts of similar length, so a chunk's left padding (computed, then masked) stays short;
        # each text goes back to its prompt's place. Greedy decoding does not depend on the chunking.
        order = sorted(range(len(enc)), key=lambda i: len(enc[i]))
        out = [[None] * len(prompts) for _ in range(M)]
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            texts = self._generate_batch([enc[i] for i in chunk], max_new_tokens, do_sample, gen, temperature, top_k,
                                         stops, M)
            for k in range(M):
                for i, text in zip(chunk, texts[k * len(chunk):(k + 1) * len(chunk)]):
                    out[k][i] = text
        return out if members is not None else out[0]

    def _generate_batch(self, enc, max_new_tokens, do_sample, gen, temperature, top_k, stops, members: int = 1):
        """Texts of ``members`` copies of the prompts whose token ids are ``enc`` (member-major), decoded
        as one batch: pad, decode, detokenise."""
        input_ids, mask = self._left_padded(list(enc) * members)
        new, ends = self._decode(input_ids, mask, self._stop_check(stops), max_new_tokens, do_sample, gen,
                                 temperature, top_k, members)
        return self._detokenise(new, ends, stops)

    def _left_padded(self, seqs):
        """(input_ids, attention_mask) [B, T] on the model's device, left padding: every row's last prompt
        token is at column T - 1, where decoding continues."""
        B, T = len(seqs), max(len(e) for e in seqs)
        input_ids = torch.full((B, T), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((B, T), dtype=torch.long)
        for b, e in enumerate(seqs):
            input_ids[b, T - len(e) :] = torch.tensor(e)
            mask[b, T - len(e) :] = 1
        return input_ids.to(self.device), mask.to(self.device)

    def _eos_tokens(self) -> torch.Tensor:
        """A bool mask over the vocabulary (the logits' width): the EOS token(s), where every completion ends."""
        tok, cfg = self.tokenizer, self.model.config
        key = (self.device, cfg.vocab_size)
        if self._eos is None or self._eos[0] != key:
            eos = cfg.eos_token_id if cfg.eos_token_id is not None else tok.eos_token_id
            mask = torch.zeros(cfg.vocab_size, dtype=torch.bool)
            for e in ([eos] if isinstance(eos, int) else list(eos or [])):
                mask[e] = True
            self._eos = (key, mask.to(self.device))
        return self._eos[1]

    def _stop_check(self, stops):
        """The device-side matcher of ``stops`` (built once per set of strings), or None without stops."""
        if not stops:
            return None
        if stops not in self._stop_checks:
            self._stop_checks[stops] = StopCheck(self.tokenizer, stops)
        return self._stop_checks[stops]

    def _decode(self, input_ids, mask, stop_check, max_new_tokens, do_sample, gen, temperature, top_k, members):
        """The new token ids [B, n <= max_new_tokens] of left-padded prompts and, per row, how many of them
        the text keeps (up to and including the token that completed a stop string; before EOS).

        The key/value cache and the attention mask are allocated for the whole decode once (or grow by a
        column a step where the model takes no preallocated cache); a finished row is continued with
        padding until every row has finished, and nothing here reads a value back from the device except
        the "every row finished?" check, every ``DONE_CHECK_EVERY`` tokens."""
        dev, pad = self.device, self.tokenizer.pad_token_id
        B, P = input_ids.shape
        plan = decode_plan(self.model, dev)
        length = P + max_new_tokens - 1  # the last new token is never fed back
        cache = self._decode_cache(B, length) if plan.static_cache else None
        full_mask = torch.zeros((B, length), dtype=mask.dtype, device=dev)
        full_mask[:, :P] = mask
        new = torch.full((B, max_new_tokens), pad, dtype=torch.long, device=dev)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        ends = torch.full((B,), max_new_tokens, dtype=torch.long, device=dev)
        eos = self._eos_tokens()
        positions = (mask.cumsum(1) - 1).clamp(min=0)  # the prompt's positions; each new token's is one more
        step_ids, every = input_ids, plan.check_every
        graph, n = None, 0
        for n in range(max_new_tokens):
            step_mask = full_mask if plan.static_cache else full_mask[:, : P + n]
            if graph is not None:
                logits = graph(step_ids, positions)
            elif plan.graphed and n == 1 and self._graphs:  # the first one-token step: recorded, then replayed
                logits, graph = self._record_step(step_ids, step_mask, positions, cache)
            else:
                logits, cache = self._decode_step(step_ids, step_mask, positions, cache)
            nxt = self._next_tokens(logits.to(dev), do_sample, gen, temperature, top_k, members)
            nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
            new[:, n] = nxt
            at_eos = eos[nxt]
            hit = at_eos if stop_check is None else at_eos | stop_check(new[:, : n + 1])
            ends = torch.where(hit & ~done, n + 1 - at_eos.long(), ends)
            done = done | hit
            if n + 1 == max_new_tokens or ((n + 1) % every == 0 and bool(done.all())):
                break
            full_mask[:, P + n] = 1
            step_ids = nxt[:, None]
            positions = positions[:, -1:] + 1
        return new[:, : n + 1], ends

    def _decode_step(self, ids, mask, positions, cache):
        """One forward pass of decoding: the last position's logits (float32) and the key/value cache."""
        hidden, out = self._hidden(ids, mask, position_ids=positions, use_cache=True,
                                   **{cache_keyword(self._base or self.model): cache})
        return self._logits(hidden[:, -1]), returned_cache(out)

    def _record_step(self, ids, mask, positions, cache):
        """This one-token step's logits, and the step recorded as a :class:`DecodeGraph` for the decode's later
        tokens; if recording fails here, None and the eager step from then on (with a warning)."""
        try:
            stream = DecodeGraph.stream(ids.device)
        except Exception as err:  # no CUDA here
            logits, graph, error = self._decode_step(ids, mask, positions, cache)[0], None, err
        else:
            logits, graph, error = DecodeGraph.record(self._decode_step, ids, mask, positions, cache, stream)
        if graph is None:
            warnings.warn(f"recording the decoding step as a CUDA graph failed ({type(error).__name__}: {error}); "
                          "decoding runs eagerly")
            self._graphs = False
        return logits, graph

    def _decode_cache(self, batch: int, length: int):
        """A preallocated key/value cache (transformers' ``StaticCache``) of ``length`` positions for
        ``batch`` rows, emptied. The same one is handed out again for the same shape, device, weight dtype
        and autocast state."""
        from transformers import StaticCache

        weight = next(self.model.parameters())
        key = (batch, length, weight.device, weight.dtype, torch.is_autocast_enabled(weight.device.type))
        if self._kv is not None and self._kv[0] == key:
            self._kv[1].reset()
            return self._kv[1]
        cache = StaticCache(config=self.model.config, max_cache_len=length)
        self._kv = (key, cache)
        return cache

    @staticmethod
    def _next_tokens(logits, do_sample, gen, temperature, top_k, members):
        """Greedy, or drawn from softmax(logits / temperature) (top_k most likely); with members, every
        member's block draws the numbers block 0 draws (common random numbers)."""
        if not do_sample:
            return logits.argmax(-1)
        logits = logits / temperature
        if top_k:
            kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, -math.inf)
        probs = F.softmax(logits, dim=-1)
        if members == 1:
            return torch.multinomial(probs, 1, generator=gen).squeeze(1)
        state, parts = gen.get_state(), []
        for block in probs.chunk(members):
            gen.set_state(state)
            parts.append(torch.multinomial(block, 1, generator=gen).squeeze(1))
        return torch.cat(parts)

    def _detokenise(self, new, ends, stops) -> list[str]:
        """Each row's text: its kept tokens (``ends``) decoded, then ended with the first stop string."""
        tok = self.tokenizer
        return [end_at_stop(tok.decode(ids[:end], skip_special_tokens=True), stops)
                for ids, end in zip(new.tolist(), ends.tolist())]

    # ------------------------------------------------------------------ features
    @torch.no_grad()
    def features(self, prompts: list[str]) -> torch.Tensor:
        """One float32 vector per prompt [B, hidden]: the last token's final hidden state for a causal
        LM, the first ([CLS]) token's for a masked LM (as in linear probing on RoBERTa)."""
        if self._base is None:
            raise ValueError(f"features: cannot find the base transformer of {type(self.model).__name__}")
        tok, dev, out = self.tokenizer, self.device, []
        for start in range(0, len(prompts), self.batch_size):
            enc = [tok(p, add_special_tokens=True)["input_ids"][-self.max_length :] for p in prompts[start : start + self.batch_size]]
            hidden, _ = self._hidden(*self._right_padded(enc))
            pick = torch.tensor([len(e) - 1 for e in enc], device=dev) if self.is_causal else torch.zeros(len(enc), dtype=torch.long, device=dev)
            out.append(hidden[torch.arange(len(enc), device=hidden.device), pick.to(hidden.device)].float())
        return torch.cat(out)


class _StopAtNorm(Exception):
    """Ends a trunk-cache fill at the final norm's input (the norm and the head are not needed)."""


def _relative_pairs(pairs, candidates) -> list[bool]:
    """Per pair, whether ``score(..., normalised=False)`` may give it a logit: its example has two or more
    candidates, each one token read at the same position of the same input."""
    out, k = [], 0
    for cands in candidates:
        group = pairs[k : k + len(cands)]
        ids, pos = group[0][0], group[0][1]
        ok = len(group) > 1 and all(len(p[2]) == 1 and p[1] == pos and p[0] == ids for p in group)
        out += [ok] * len(group)
        k += len(cands)
    return out


def _check_members(members) -> int:
    """The member count M of ``score`` / ``generate`` (1 without members)."""
    if members is None:
        return 1
    if isinstance(members, bool) or not isinstance(members, int) or members < 1:
        raise ValueError(f"members must be a positive integer (the number of member blocks), got {members!r}")
    return members


DONE_CHECK_EVERY = 8  # on an accelerator: new tokens between two host reads of "has every row finished?"
STATIC_CACHE_DEVICES = ("cpu", "cuda")  # device types whose decoding preallocates the key/value cache


@dataclass(frozen=True)
class DecodePlan:
    """How ``LanguageModel.generate`` decodes: ``static_cache``, a key/value cache preallocated for the whole
    decode (transformers' ``StaticCache``: written in place, no tensor grows); ``graphed``, the one-token
    step recorded once per decode as a CUDA graph and replayed (:class:`DecodeGraph`); ``check_every``,
    new tokens between two host reads of "has every row finished?"."""

    static_cache: bool
    graphed: bool
    check_every: int


def decode_plan(model, device) -> DecodePlan:
    """The :class:`DecodePlan` of ``model`` on ``device`` (a ``torch.device`` or its name).

    The cache is preallocated where the model's attention takes transformers' static cache (its class
    says ``_can_compile_fullgraph``) and the device type is in ``STATIC_CACHE_DEVICES``. On CUDA the
    one-token step is then a CUDA graph, with or without members (a member-batched decode records the
    population's batched corrections with the rest: the drawn factors stay put for the whole closure). A
    CPU reads "finished?" after every token (the read costs nothing there and ends the decode at once);
    elsewhere every ``DONE_CHECK_EVERY`` tokens, so the host does not wait on the device at each token.
    """
    kind = torch.device(device).type
    static = bool(getattr(model, "_can_compile_fullgraph", False)) and kind in STATIC_CACHE_DEVICES
    return DecodePlan(static_cache=static, graphed=static and kind == "cuda",
                      check_every=1 if kind == "cpu" else DONE_CHECK_EVERY)


class DecodeGraph:
    """The one-token decoding step recorded once as a CUDA graph and replayed for each later token of a decode.

    On a GPU a small model's decoding step is bound by kernel launches, one per dispatched op, each paid
    by the host; a replayed graph launches them all at once. :meth:`record` runs the step eagerly on a
    side stream (the warm-up a capture needs; its logits are this token's), then records it reading the
    token ids and positions from buffers of its own, and the attention mask and the preallocated key/value
    cache in place (the cache advances its own position on the device). Calling the graph copies the next
    token's ids and positions in and replays it: the logits come back in the same tensor each time. Within
    a decode everything the step reads stays at its address: the weights, a population's drawn factors,
    the mask and the cache."""

    def __init__(self, graph, ids, positions, logits):
        self.graph, self.ids, self.positions, self.logits = graph, ids, positions, logits

    @staticmethod
    def stream(device):
        """A side stream of ``device`` that has waited for its current stream (the stream a graph records on)."""
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        return side

    @classmethod
    def record(cls, step, ids, mask, positions, cache, stream):
        """``(logits, graph, error)``: ``step(ids, mask, positions, cache)`` run once on ``stream``, then recorded
        there. Where recording fails, ``graph`` is None and ``error`` says why: the step has run once either way
        (the cache advanced by this token), and a failed recording has run nothing."""
        dev = ids.device
        ids, positions = ids.clone(), positions.clone()
        graph, error = torch.cuda.CUDAGraph(), None
        with torch.cuda.stream(stream):
            first = step(ids, mask, positions, cache)[0].clone()
            try:
                graph.capture_begin()
                try:
                    logits = step(ids, mask, positions, cache)[0]
                finally:
                    graph.capture_end()
            except Exception as err:  # an op the step runs that a graph cannot hold (a host read, ...)
                error = err
        torch.cuda.current_stream(dev).wait_stream(stream)
        return first, (None if error else cls(graph, ids, positions, logits)), error

    def __call__(self, ids, positions):
        self.ids.copy_(ids)
        self.positions.copy_(positions)
        self.graph.replay()
        return self.logits


def stop_strings(stop) -> tuple[str, ...]:
    """``stop`` as ``LanguageModel.generate`` takes it, checked: its distinct strings in the order given
    (one string: a list of one; None: none). ValueError, naming what was given, for anything but
    non-empty strings."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise ValueError(f"stop: got {stop!r}; accepted: a list of non-empty strings (None: stop at EOS only)")
    return tuple(dict.fromkeys(stop))


def end_at_stop(text: str, stops) -> str:
    """``text`` up to and including the first of ``stops`` it holds (the occurrence that ends first: the one
    written first); all of it if none occurs."""
    ends = [i + len(s) for s in stops if (i := text.find(s)) >= 0]
    return text[: min(ends)] if ends else text


class StopCheck:
    """Which rows have just written one of the stop strings, as a bool tensor on the device, from the ids of
    their new tokens: transformers' ``StopStringCriteria``, which counts a stop string when the newest
    token completes it, whether it spans several tokens or starts or ends inside one (its tables are
    built once per tokenizer and strings). It sees the completion's tokens only, never the prompt's.

    Where the tokenizer's vocabulary holds no token that can end any of the strings, ``check`` is None:
    nothing stops a row early, and the text still ends with the first stop string it holds
    (``end_at_stop``)."""

    def __init__(self, tokenizer, stops: tuple[str, ...]):
        from transformers import StopStringCriteria

        self.stops = stops
        try:
            self.check = StopStringCriteria(tokenizer, list(stops))
        except ValueError:  # "unable to identify tokens matching" any of the strings
            self.check = None

    def __call__(self, new_ids: torch.Tensor) -> torch.Tensor:
        """``new_ids`` [B, n]: each row's new tokens so far; True where the last one completes a stop string."""
        if self.check is None:
            return torch.zeros(new_ids.shape[0], dtype=torch.bool, device=new_ids.device)
        return self.check(new_ids, None)


def cache_keyword(module) -> str:
    """The keyword ``module.forward`` takes its key/value cache by: ``cache`` in transformers releases that
    renamed it (``past_key_values`` is deprecated there), else ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def returned_cache(output):
    """The key/value cache a forward pass returned (``cache``, or ``past_key_values`` before the rename)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def _split_base_and_head(model):
    """(base transformer, output head) of a ``...ForCausalLM`` / ``...ForMaskedLM``.

    The base is ``model.base_model`` (``model.model`` for Llama, ``model.bert`` for BERT); the head is
    the one other child module (``lm_head``; ``cls`` for BERT, which includes its transform layer). For
    a layout that does not fit this pattern (None, None) is returned and the full model is run instead,
    computing logits at every position.
    """
    base = model.base_model
    if base is model:
        return None, None
    others = [m for name, m in model.named_children() if m is not base]
    if len(others) != 1:
        return None, None
    return base, others[0]
