"""The language model as a black box: score candidates, generate text, extract features.

MeZO, the rewards and the baselines see a model only through three questions:

* ``score(prompts, candidates)``: how likely is each candidate continuation of each prompt?
  (log-likelihood summed and averaged over the candidate's tokens only)
* ``generate(prompts, ...)``: what does the model write after each prompt? (greedy or seeded sampling,
  stopping at a newline or EOS)
* ``features(prompts)``: one hidden vector per prompt (for the linear-probing baseline).

Scoring computes vocabulary logits only at the positions that are scored: the base transformer runs
over the whole sequence, the hidden states of the scored positions are gathered, and only those go
through the output head. On SmolLM2 (vocabulary 49,152) the head over every position is a large
share of a forward pass and of its peak memory, which is exactly what MeZO tries not to spend.

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
from dataclasses import dataclass

import torch
import torch.nn.functional as F

MASK = "[MASK]"  # the mask placeholder in masked-LM prompts (replaced by tokenizer.mask_token_id)
# the final normalisation layer of common decoder LMs (Llama/Gemma/Mistral/Qwen, GPT-2, OPT, Falcon):
# the boundary of the trunk cache below, and what ``--peft norm`` trains (mezo_rl.model.peft.FINAL_NORM)
FINAL_NORM_MODULES = ("model.norm", "transformer.ln_f", "model.decoder.final_layer_norm", "transformer.norm_f")


@dataclass
class CandidateScores:
    """Log-likelihoods of one prompt's candidates: ``sum`` and per-token ``mean``, float32 [n_candidates].

    ``n_tokens`` (int64 [n_candidates]) is how many tokens each candidate has.
    """

    sum: torch.Tensor
    mean: torch.Tensor
    n_tokens: torch.Tensor


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
        self._newline_ids = None
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
        positions of each (sequence, positions) it has seen and, on a hit, runs only the final norm and
        the output head. The scores are those of a full forward pass (the same computation on the same
        inputs); what changes is the cost: the norm and the head are a small part of a forward pass
        (docs/peft.md). This is what makes MeZO on the final norm (``--peft norm``) cheap.

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
        self._trunk = {"norm": norm, "params": trunk_params, "cache": {}, "encode": {}}
        return True

    def clear_trunk_cache(self) -> None:
        """Forget the cached trunk outputs (after changing frozen weights in place)."""
        if self._trunk is not None:
            self._trunk["cache"].clear()

    @property
    def trunk_cache_active(self) -> bool:
        """Whether ``score`` reads the trunk cache now (enabled, and every trunk weight frozen)."""
        return self._trunk_cache() is not None

    @property
    def trunk_cache_size(self) -> int:
        """Cached (sequence, positions) entries; 0 when the cache is off."""
        return 0 if self._trunk is None else len(self._trunk["cache"])

    def _trunk_cache(self):
        """The cache state if it may be used now (every trunk parameter frozen), else None."""
        t = self._trunk
        if t is None:
            return None
        if any(p.requires_grad for p in t["params"]):
            t["cache"].clear()  # the trunk may change: nothing cached can be trusted
            return None
        return t

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
    def score(self, prompts: list[str], candidates: list[list[str]], members: int | None = None):
        """Log-likelihood of each candidate continuation, over the candidate's tokens only.

        Args:
            prompts: B prompt strings. For a causal LM the candidate is appended to the prompt as text
                is (``prompt + candidate``; prompt and candidate are tokenised separately, so put the
                separating space at the start of the candidate: ``" great"``). For a masked LM each
                prompt must contain ``MASK`` (``"[MASK]"``) exactly once.
            candidates: for each prompt, a non-empty list of candidate strings.

        Returns:
            one ``CandidateScores`` per prompt, with ``sum`` and ``mean`` of shape [n_candidates]
            (float32, on the model's device, differentiable if grad is enabled).

        All (prompt, candidate) pairs are flattened into one list; pairs whose model input is the same
        (for a causal LM: prompt + all but the last candidate token, so every single-token label word
        of one prompt) share one sequence, and the distinct sequences run in length-sorted batches of
        ``self.batch_size``. Padding never changes a score (batched == one at a time).

        With ``members=M`` every forward runs on M copies of its batch in member-major layout and the
        result is a list of M such lists, one per member (see the module docstring).
        """
        M = _check_members(members)
        if len(prompts) != len(candidates):
            raise ValueError(f"score: got {len(prompts)} prompts but {len(candidates)} candidate lists")
        trunk = self._trunk_cache()
        encode = self._encode_causal if self.is_causal else self._encode_masked
        pairs = []
        for i, (p, cands) in enumerate(zip(prompts, candidates)):
            if isinstance(cands, str) or not cands:
                raise ValueError(f"score: candidates[{i}] must be a non-empty list of strings, got {cands!r}")
            for c in cands:
                if trunk is None:
                    pairs.append(encode(p, c))
                else:  # the same texts come back every step: tokenise each pair once
                    key = (p, c)
                    if key not in trunk["encode"]:
                        trunk["encode"][key] = encode(p, c)
                    pairs.append(trunk["encode"][key])
        if trunk is not None:
            per_member = [self._collect(t, pairs, candidates) for t in self._score_cached(pairs, trunk, M)]
            return per_member if members is not None else per_member[0]

        # Pairs with the same input share one row. A causal input is prompt + candidate[:-1] (the last
        # candidate token is a target only), so e.g. all single-token label words of a prompt share one.
        rows: dict[tuple, list[int]] = {}
        for j, (ids, _, _) in enumerate(pairs):
            rows.setdefault(tuple(ids), []).append(j)
        keys = sorted(rows, key=len)
        totals = [[None] * len(pairs) for _ in range(M)]
        for start in range(0, len(keys), self.batch_size):
            batch = keys[start : start + self.batch_size]
            sums = self._score_batch(batch * M, [[pairs[j] for j in rows[key]] for key in batch] * M)
            for k in range(M):  # member k's rows: the k-th copy of the batch
                for key, row_sums in zip(batch, sums[k * len(batch):(k + 1) * len(batch)]):
                    for j, s in zip(rows[key], row_sums):
                        totals[k][j] = s

        per_member = [self._collect(t, pairs, candidates) for t in totals]
        return per_member if members is not None else per_member[0]

    @staticmethod
    def _collect(totals, pairs, candidates) -> list[CandidateScores]:
        """Per-pair summed log-likelihoods -> one CandidateScores per prompt."""
        out, k = [], 0
        for cands in candidates:
            n = len(cands)
            s = torch.stack(totals[k : k + n])
            counts = torch.tensor([len(pairs[j][1]) for j in range(k, k + n)], device=s.device)
            out.append(CandidateScores(sum=s, mean=s / counts, n_tokens=counts))
            k += n
        return out

    def _score_cached(self, pairs, trunk, members: int = 1, chunk: int = 512) -> list[list[torch.Tensor]]:
        """Per member, the summed log-likelihood of each pair from the cached trunk outputs (filling the
        misses first).

        Pairs with the same cached entry (every single-token label word of one prompt) share its rows:
        the final norm and the head run once per distinct entry (and member), not once per pair."""
        cache, norm = trunk["cache"], trunk["norm"]
        keys = [(tuple(ids), tuple(pos)) for ids, pos, _ in pairs]
        missing = sorted({k for k in keys if k not in cache}, key=lambda k: len(k[0]))
        for start in range(0, len(missing), self.batch_size):  # the trunk, once per new sequence
            batch = missing[start : start + self.batch_size]
            with torch.no_grad():  # the trunk is frozen: one copy of the batch, stopped before the norm
                _, pre = self._base_with_norm_input(norm, *self._right_padded([ids for ids, _ in batch]), stop=True)
            for b, key in enumerate(batch):
                cache[key] = pre[b, list(key[1])].clone()
        totals = [[] for _ in range(members)]
        for start in range(0, len(pairs), chunk):  # final norm + head over every distinct scored token at once
            part = range(start, min(start + chunk, len(pairs)))
            first_row: dict[tuple, int] = {}  # cached entry -> its first row in this chunk's block
            n_rows = 0
            for j in part:
                if keys[j] not in first_row:
                    first_row[keys[j]], n_rows = n_rows, n_rows + len(keys[j][1])
            rows = [first_row[keys[j]] + t for j in part for t in range(len(pairs[j][2]))]
            targets = [t for j in part for t in pairs[j][2]]
            owner = [i for i, j in enumerate(part) for _ in pairs[j][2]]
            pre = torch.cat([cache[k] for k in first_row])
            all_logits = self._logits(norm(pre.repeat(members, 1) if members > 1 else pre))
            for k, logits in enumerate(all_logits.chunk(members)):
                dev = logits.device
                rows_t = torch.tensor(rows, device=dev)
                # log p(target) = logit(target) - logsumexp(logits): the same as log_softmax, without its
                # second [rows, vocab] tensor
                tok_lp = logits[rows_t, torch.tensor(targets, device=dev)] - torch.logsumexp(logits, dim=-1)[rows_t]
                sums = torch.zeros(len(part), device=dev, dtype=torch.float32).index_add(0, torch.tensor(owner, device=dev), tok_lp)
                totals[k] += list(sums.unbind(0))
        return totals

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

    def _score_batch(self, inputs, pairs_per_input):
        """Run the distinct input sequences ``inputs`` once; return, per input, the summed candidate
        log-likelihood of each of its (ids, positions, targets) pairs."""
        rows, cols, targets, owner = [], [], [], []
        n_pairs = 0
        for b, pairs in enumerate(pairs_per_input):
            for _, pos, tgt in pairs:
                rows += [b] * len(pos)
                cols += pos
                targets += tgt
                owner += [n_pairs] * len(pos)
                n_pairs += 1
        hidden, _ = self._hidden(*self._right_padded(inputs))
        hd = hidden.device  # with device_map="auto" the last layer may live elsewhere than the first
        h = hidden[torch.tensor(rows, device=hd), torch.tensor(cols, device=hd)]  # [N, H]: scored positions
        logp = F.log_softmax(self._logits(h), dim=-1)
        ld = logp.device
        tok_lp = logp.gather(1, torch.tensor(targets, device=ld)[:, None]).squeeze(1)
        sums = torch.zeros(n_pairs, device=ld, dtype=torch.float32).index_add(0, torch.tensor(owner, device=ld), tok_lp)
        out, k = [], 0
        for pairs in pairs_per_input:
            out.append(list(sums[k : k + len(pairs)].unbind(0)))
            k += len(pairs)
        return out

    # ------------------------------------------------------------------ generation
    def _newline_token_ids(self) -> torch.Tensor:
        """Ids of every vocabulary token whose text contains a newline (computed once)."""
        if self._newline_ids is None:
            V = len(self.tokenizer)
            texts = self.tokenizer.batch_decode([[i] for i in range(V)])
            self._newline_ids = torch.tensor([i for i, t in enumerate(texts) if "\n" in t], dtype=torch.long)
        return self._newline_ids

    @torch.no_grad()
    def generate(
        self,
        prompts: list[str],
        max_new_tokens: int = 50,
        do_sample: bool = False,
        seed: int | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        stop_at_newline: bool = True,
        members: int | None = None,
    ) -> list[str] | list[list[str]]:
        """Continue each prompt; return the new text only (without the stop newline / EOS).

        Batched decoding with the KV cache, ``self.batch_size`` prompts at a time, taken in order of
        their token length so that a chunk's left padding stays short. Greedy by default; with
        ``do_sample=True`` tokens are drawn from softmax(logits / temperature) (optionally the top_k
        most likely) with a ``torch.Generator`` seeded by ``seed``: two calls with the same seed and the
        same prompts return the same text, so +eps and -eps perturbations see common random numbers.
        A sequence stops at EOS, at a token containing a newline (``stop_at_newline``), or after
        ``max_new_tokens``; text before the newline inside that token is kept.

        With ``members=M`` every forward (prompt and decoding steps, KV cache included) runs on M copies
        of the batch in member-major layout, and the result is a list of M lists of texts. Sampling
        uses common random numbers: at every decoding step each member's block draws the same random
        numbers as block 0 (the generator is rewound before each block), which are the numbers a call
        without members would draw for the same prompts.
        """
        M = _check_members(members)
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
                                         stop_at_newline, M)
            for k in range(M):
                for i, text in zip(chunk, texts[k * len(chunk):(k + 1) * len(chunk)]):
                    out[k][i] = text
        return out if members is not None else out[0]

    def _generate_batch(self, enc, max_new_tokens, do_sample, gen, temperature, top_k, stop_at_newline,
                        members: int = 1):
        """Texts of ``members`` copies of the prompts whose token ids are ``enc`` (member-major), decoded
        as one batch."""
        tok, dev = self.tokenizer, self.device
        enc = list(enc) * members
        B, T = len(enc), max(len(e) for e in enc)
        input_ids = torch.full((B, T), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((B, T), dtype=torch.long)
        for b, e in enumerate(enc):  # left padding: every row's last prompt token is at column T - 1
            input_ids[b, T - len(e) :] = torch.tensor(e)
            mask[b, T - len(e) :] = 1
        input_ids, mask = input_ids.to(dev), mask.to(dev)
        stop = torch.zeros(self.model.config.vocab_size, dtype=torch.bool, device=dev)
        eos = self.model.config.eos_token_id if self.model.config.eos_token_id is not None else tok.eos_token_id
        for e in ([eos] if isinstance(eos, int) else list(eos or [])):
            stop[e] = True
        if stop_at_newline:
            nl = self._newline_token_ids()
            stop[nl[nl < stop.numel()].to(dev)] = True

        new = torch.zeros((B, 0), dtype=torch.long, device=dev)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        past, step_ids, cache_kw = None, input_ids, cache_keyword(self._base or self.model)
        for _ in range(max_new_tokens):
            positions = (mask.cumsum(1) - 1).clamp(min=0)[:, -step_ids.shape[1] :]
            hidden, o = self._hidden(step_ids, mask, position_ids=positions, use_cache=True,
                                     **{cache_kw: past})
            past = returned_cache(o)
            logits = self._logits(hidden[:, -1]).to(dev)
            if do_sample:
                logits = logits / temperature
                if top_k:
                    kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, -math.inf)
                probs = F.softmax(logits, dim=-1)
                if members == 1:
                    nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)
                else:  # common random numbers: every member's block draws what block 0 draws
                    state, parts = gen.get_state(), []
                    for block in probs.chunk(members):
                        gen.set_state(state)
                        parts.append(torch.multinomial(block, 1, generator=gen).squeeze(1))
                    nxt = torch.cat(parts)
            else:
                nxt = logits.argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, tok.pad_token_id), nxt)
            new = torch.cat([new, nxt[:, None]], 1)
            done = done | stop[nxt]
            if bool(done.all()):
                break
            step_ids = nxt[:, None]
            mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=dev)], 1)

        texts = []
        for b in range(B):
            ids = new[b].tolist()
            cut = next((i for i, t in enumerate(ids) if stop[t]), None)
            if cut is None:
                texts.append(tok.decode(ids, skip_special_tokens=True))
                continue
            last = tok.decode(ids[cut : cut + 1])
            head = tok.decode(ids[:cut], skip_special_tokens=True)
            texts.append(head + (last.split("\n")[0] if "\n" in last else ""))
        return texts

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


def _check_members(members) -> int:
    """The member count M of ``score`` / ``generate`` (1 without members)."""
    if members is None:
        return 1
    if isinstance(members, bool) or not isinstance(members, int) or members < 1:
        raise ValueError(f"members must be a positive integer (the number of member blocks), got {members!r}")
    return members


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
