"""The language model as a black box: score candidates, generate text, extract features.

MeZO, the rewards and the baselines see a model only through three questions:

* ``score(prompts, candidates)``: how likely is each candidate continuation of each prompt?
  (log-likelihood summed and averaged over the candidate's tokens only; :mod:`mezo_rl.model.scoring`)
* ``generate(prompts, ...)``: what does the model write after each prompt? (greedy or seeded sampling,
  stopping at EOS or at the caller's stop strings; :mod:`mezo_rl.model.decoding`)
* ``features(prompts)``: one hidden vector per prompt (for the linear-probing baseline).

:class:`LanguageModel` is the facade: it holds the model split into its base and its output head, the
frozen-trunk cache (:mod:`mezo_rl.model.trunk_cache`) and what decoding keeps between calls; scoring
and decoding live in modules of their own.

    >>> lm = LanguageModel(model, tokenizer)
    >>> s = lm.score(["The movie was great. It was"], [[" terrible", " great"]])
    >>> s[0].mean.argmax()        # index of the more likely candidate

Members (the batched evaluation of :mod:`mezo_rl.engine.population`): ``score(..., members=M)`` and
``generate(..., members=M)`` run every forward pass on M copies of their batch in member-major
layout and return one result list per member (:mod:`mezo_rl.model.members`).
"""
from __future__ import annotations

import contextlib

import torch

from mezo_rl.errors import refuse_keywords
from mezo_rl.model import decoding, scoring
from mezo_rl.model.trunk_cache import TrunkCache

# the final normalisation layer of common decoder LMs (Llama/Gemma/Mistral/Qwen, GPT-2, OPT, Falcon):
# the boundary of the trunk cache below, and what ``--peft norm`` trains (mezo_rl.model.peft.FINAL_NORM)
FINAL_NORM_MODULES = ("model.norm", "transformer.ln_f", "model.decoder.final_layer_norm", "transformer.norm_f")


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
        self._decoding = decoding.DecodeState()  # what decoding keeps between calls (EOS mask, stops, KV cache)
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
              log_softmax: bool = True, **renamed):
        """Log-likelihood of each candidate continuation, over the candidate's tokens only.

        Args:
            prompts: B prompt strings. For a causal LM the candidate is appended to the prompt as text
                is (``prompt + candidate``; prompt and candidate are tokenised separately, so put the
                separating space at the start of the candidate: ``" great"``). For a masked LM each
                prompt must contain ``scoring.MASK`` (``"[MASK]"``) exactly once.
            candidates: for each prompt, a non-empty list of candidate strings.
            log_softmax: True (default): true log-likelihoods, the log-softmax over the vocabulary. False: the caller only compares an
                example's candidates with each other (a reward invariant to a shift common to them,
                such as accuracy or the cross-entropy over candidates), so where an example has two or
                more candidates that are each one token read at the same position, its scores are those
                tokens' logits there: log-probabilities plus one constant per example (minus the
                log-sum-exp over the vocabulary), and the vocabulary-wide logits are never computed
                (``hidden @ W[candidate ids]``). Such an example's ``CandidateScores.log_softmax`` is
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
        result is a list of M such lists, one per member (see the module docstring). ``normalised``, this
        flag's earlier name, is refused naming it.
        """
        refuse_keywords("LanguageModel.score", renamed, {"normalised": "log_softmax"})
        return scoring.score(self, prompts, candidates, members, log_softmax)

    def encode(self, prompt: str, candidate: str):
        """(input ids, scored positions, target ids) of one (prompt, candidate) pair: the sequence ``score``
        runs for it (causal: prompt + candidate[:-1], scored where each candidate token is predicted;
        masked: the prompt with the candidate's tokens masked, scored at the masks)."""
        return scoring.encode(self, prompt, candidate)

    def _encode_causal(self, prompt: str, candidate: str):
        """(input_ids, scored positions, target ids) for prompt + candidate."""
        return scoring.encode_causal(self, prompt, candidate)

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
        top_p: float = 1.0,
        min_p: float | None = None,
        repetition_penalty: float = 1.0,
    ) -> list[str] | list[list[str]]:
        """Continue each prompt; return the new text only, up to and including the first stop string it writes.

        Batched decoding with a key/value cache, ``self.batch_size`` prompts at a time, taken in order of
        their token length so that a chunk's left padding stays short. Greedy by default; with
        ``do_sample=True`` tokens are drawn from softmax(logits / temperature), kept to the ``top_k`` most
        likely, the ``top_p`` nucleus and the tokens of at least ``min_p`` times the top one's probability, as
        transformers' ``generate`` does (:class:`~mezo_rl.model.decoding.Sampling`), with a ``torch.Generator``
        seeded by ``seed``: two calls with the same seed and the same prompts return the same text, so +eps and
        -eps perturbations see common random numbers. ``repetition_penalty`` (greedy decoding too) lowers the
        logit of every token the row already holds, its prompt's included. A bad value is one ValueError line.

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
        finished?" (an accelerator), it asks only every ``decoding.DONE_CHECK_EVERY`` tokens; on a CPU
        after each one. The key/value cache is preallocated for the whole decode where the model supports
        it (:func:`~mezo_rl.model.decoding.decode_plan`), and on CUDA the one-token step is a CUDA graph,
        replayed (:class:`~mezo_rl.model.cuda_graph.DecodeGraph`).

        With ``members=M`` every forward (prompt and decoding steps, KV cache included) runs on M copies
        of the batch in member-major layout, and the result is a list of M lists of texts. Sampling
        uses common random numbers: at every decoding step each member's block draws the same random
        numbers as block 0 (the generator is rewound before each block), which are the numbers a call
        without members would draw for the same prompts.
        """
        sampling = decoding.Sampling(temperature if do_sample else 1.0, top_p, top_k, min_p, repetition_penalty)
        return decoding.generate(self, prompts, max_new_tokens, do_sample, seed, sampling, stop, members)

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
