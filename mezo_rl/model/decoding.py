"""Decoding: ``LanguageModel.generate``'s decode loop, its next-token choice and its stops.

A batch of prompts is left-padded and decoded with a key/value cache, preallocated for the whole decode
where the model takes one (:func:`decode_plan`); on CUDA the one-token step is recorded once per decode
as a CUDA graph and replayed (:mod:`mezo_rl.model.cuda_graph`). :func:`next_tokens` chooses each new
token from the logits (greedy, or drawn with common random numbers across members), shaped by a
:class:`Sampling` (TRL's and transformers' knobs: repetition penalty, temperature, top-k, top-p, min-p). A row ends at EOS
or at the first of the caller's stop strings it writes (:class:`StopCheck` on the device,
:func:`end_at_stop` on the text).

The functions here take the :class:`~mezo_rl.model.lm.LanguageModel` they decode with (``lm``), run
its model through ``lm._hidden`` / ``lm._logits`` and keep what outlives one decode in
``lm._decoding`` (a :class:`DecodeState`).
"""
from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mezo_rl.choices import Sampling
from mezo_rl.model.cuda_graph import DecodeGraph
from mezo_rl.model.dropout import dropout_active
from mezo_rl.model.members import check_members

DONE_CHECK_EVERY = 8  # on an accelerator: new tokens between two host reads of "has every row finished?"
STATIC_CACHE_DEVICES = ("cpu", "cuda")  # device types whose decoding preallocates the key/value cache


GREEDY = Sampling()


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


class DecodeState:
    """What a language model keeps from one decode to the next."""

    def __init__(self):
        self.eos = None  # (device, vocabulary size) and the EOS mask over the vocabulary
        self.stop_checks = {}  # stop strings -> StopCheck
        self.kv = None  # the last preallocated key/value cache handed out: (shape key, cache)
        self.graphs = True  # False once recording a decoding step as a CUDA graph has failed here


def generate(lm, prompts: list[str], max_new_tokens: int = 50, do_sample: bool = False, seed: int | None = None,
             sampling: Sampling = GREEDY, stop: list[str] | None = None,
             members: int | None = None) -> list[str] | list[list[str]]:
    """``lm.generate(...)`` (:meth:`mezo_rl.model.lm.LanguageModel.generate`), under ``torch.no_grad()``."""
    M = check_members(members)
    stops = stop_strings(stop)
    if not lm.is_causal:
        raise ValueError("generate needs a causal LM; this is a masked LM")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    gen = None
    if do_sample:
        gen = torch.Generator(device=lm.device)
        gen.manual_seed(0 if seed is None else int(seed))
    tok = lm.tokenizer
    start_id = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    enc = [(tok(p, add_special_tokens=True)["input_ids"] or [start_id])[-(lm.max_length - max_new_tokens):]
           for p in prompts]
    # Chunks of prompts of similar length, so a chunk's left padding (computed, then masked) stays short;
    # each text goes back to its prompt's place. Greedy decoding does not depend on the chunking.
    order = sorted(range(len(enc)), key=lambda i: len(enc[i]))
    out = [[None] * len(prompts) for _ in range(M)]
    for start in range(0, len(order), lm.batch_size):
        chunk = order[start : start + lm.batch_size]
        texts = _generate_batch(lm, [enc[i] for i in chunk], max_new_tokens, do_sample, gen, sampling, stops, M)
        for k in range(M):
            for i, text in zip(chunk, texts[k * len(chunk):(k + 1) * len(chunk)]):
                out[k][i] = text
    return out if members is not None else out[0]


def _generate_batch(lm, enc, max_new_tokens, do_sample, gen, sampling, stops, members: int = 1):
    """Texts of ``members`` copies of the prompts whose token ids are ``enc`` (member-major), decoded
    as one batch: pad, decode, detokenise."""
    input_ids, mask = _left_padded(lm, list(enc) * members)
    new, ends = _decode(lm, input_ids, mask, _stop_check(lm, stops), max_new_tokens, do_sample, gen, sampling,
                        members)
    return _detokenise(lm, new, ends, stops)


def _left_padded(lm, seqs):
    """(input_ids, attention_mask) [B, T] on the model's device, left padding: every row's last prompt
    token is at column T - 1, where decoding continues."""
    B, T = len(seqs), max(len(e) for e in seqs)
    input_ids = torch.full((B, T), lm.tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.long)
    for b, e in enumerate(seqs):
        input_ids[b, T - len(e) :] = torch.tensor(e)
        mask[b, T - len(e) :] = 1
    return input_ids.to(lm.device), mask.to(lm.device)


def _eos_tokens(lm) -> torch.Tensor:
    """A bool mask over the vocabulary (the logits' width): the EOS token(s), where every completion ends."""
    tok, cfg = lm.tokenizer, lm.model.config
    key = (lm.device, cfg.vocab_size)
    if lm._decoding.eos is None or lm._decoding.eos[0] != key:
        eos = cfg.eos_token_id if cfg.eos_token_id is not None else tok.eos_token_id
        mask = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        for e in ([eos] if isinstance(eos, int) else list(eos or [])):
            mask[e] = True
        lm._decoding.eos = (key, mask.to(lm.device))
    return lm._decoding.eos[1]


def _stop_check(lm, stops):
    """The device-side matcher of ``stops`` (built once per set of strings), or None without stops."""
    if not stops:
        return None
    if stops not in lm._decoding.stop_checks:
        lm._decoding.stop_checks[stops] = StopCheck(lm.tokenizer, stops)
    return lm._decoding.stop_checks[stops]


def _decode(lm, input_ids, mask, stop_check, max_new_tokens, do_sample, gen, sampling, members):
    """The new token ids [B, n <= max_new_tokens] of left-padded prompts and, per row, how many of them
    the text keeps (up to and including the token that completed a stop string; before EOS).

    The key/value cache and the attention mask are allocated for the whole decode once (or grow by a
    column a step where the model takes no preallocated cache); a finished row is continued with
    padding until every row has finished, and nothing here reads a value back from the device except
    the "every row finished?" check, every ``DONE_CHECK_EVERY`` tokens."""
    dev, pad = lm.device, lm.tokenizer.pad_token_id
    B, P = input_ids.shape
    plan = decode_plan(lm.model, dev)
    graphed = plan.graphed and lm._decoding.graphs and not dropout_active(lm.model)  # a graph would replay one mask
    length = P + max_new_tokens - 1  # the last new token is never fed back
    cache = _decode_cache(lm, B, length) if plan.static_cache else None
    full_mask = torch.zeros((B, length), dtype=mask.dtype, device=dev)
    full_mask[:, :P] = mask
    new = torch.full((B, max_new_tokens), pad, dtype=torch.long, device=dev)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    ends = torch.full((B,), max_new_tokens, dtype=torch.long, device=dev)
    eos = _eos_tokens(lm)
    positions = (mask.cumsum(1) - 1).clamp(min=0)  # the prompt's positions; each new token's is one more
    step_ids, every = input_ids, plan.check_every
    graph, n = None, 0
    seen = None  # with a repetition penalty: the tokens each row holds so far (its prompt's and its new ones)
    if sampling.penalises:
        vocab = lm.model.config.vocab_size
        seen = torch.zeros((B, vocab), dtype=torch.long, device=dev).scatter_add_(1, input_ids, mask.long()) > 0
    for n in range(max_new_tokens):
        step_mask = full_mask if plan.static_cache else full_mask[:, : P + n]
        if graph is not None:
            logits = graph(step_ids, positions)
        elif graphed and n == 1:  # the first one-token step: recorded, then replayed
            logits, graph = _record_step(lm, step_ids, step_mask, positions, cache)
        else:
            logits, cache = _decode_step(lm, step_ids, step_mask, positions, cache)
        nxt = next_tokens(logits.to(dev), do_sample, gen, sampling, members, seen)
        nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
        if seen is not None:
            seen[torch.arange(B, device=dev), nxt] = True
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


def _decode_step(lm, ids, mask, positions, cache):
    """One forward pass of decoding: the last position's logits (float32) and the key/value cache."""
    hidden, out = lm._hidden(ids, mask, position_ids=positions, use_cache=True,
                             **{cache_keyword(lm._base or lm.model): cache})
    return lm._logits(hidden[:, -1]), returned_cache(out)


def _record_step(lm, ids, mask, positions, cache):
    """This one-token step's logits, and the step recorded as a :class:`DecodeGraph` for the decode's later
    tokens; if recording fails here, None and the eager step from then on (with a warning)."""
    try:
        stream = DecodeGraph.stream(ids.device)
    except Exception as err:  # no CUDA here
        logits, graph, error = _decode_step(lm, ids, mask, positions, cache)[0], None, err
    else:
        step = functools.partial(_decode_step, lm)
        logits, graph, error = DecodeGraph.record(step, ids, mask, positions, cache, stream)
    if graph is None:
        warnings.warn(f"recording the decoding step as a CUDA graph failed ({type(error).__name__}: {error}); "
                      "decoding runs eagerly")
        lm._decoding.graphs = False
    return logits, graph


def _decode_cache(lm, batch: int, length: int):
    """A preallocated key/value cache (transformers' ``StaticCache``) of ``length`` positions for
    ``batch`` rows, emptied. The same one is handed out again for the same shape, device, weight dtype
    and autocast state."""
    from transformers import StaticCache

    weight = next(lm.model.parameters())
    key = (batch, length, weight.device, weight.dtype, torch.is_autocast_enabled(weight.device.type))
    if lm._decoding.kv is not None and lm._decoding.kv[0] == key:
        lm._decoding.kv[1].reset()
        return lm._decoding.kv[1]
    cache = StaticCache(config=lm.model.config, max_cache_len=length)
    lm._decoding.kv = (key, cache)
    return cache


def shaped_logits(logits, do_sample: bool, sampling: Sampling = GREEDY, seen=None):
    """The logits a next token is chosen from, as transformers' logits processors leave them (``-inf``: a token
    that cannot be drawn): the repetition penalty (``seen``: a bool [rows, vocabulary] mask of the tokens each
    row holds), then, when sampling, temperature, top-k, top-p and min-p (:class:`Sampling`)."""
    if seen is not None and sampling.penalises:
        seen = seen[:, :logits.shape[-1]]
        penalised = torch.where(logits > 0, logits / sampling.repetition_penalty, logits * sampling.repetition_penalty)
        logits = torch.where(seen, penalised, logits)
    if not do_sample:
        return logits
    logits = logits / sampling.temperature
    if sampling.top_k:
        kth = logits.topk(min(int(sampling.top_k), logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if sampling.top_p < 1.0:  # transformers' TopPLogitsWarper: drop the tail whose probability is <= 1 - top_p
        ordered, index = logits.sort(dim=-1)
        tail = ordered.softmax(-1).cumsum(-1) <= 1 - sampling.top_p
        tail[:, -1] = False  # the most likely token always stays
        logits = logits.masked_fill(tail.scatter(1, index, tail), -math.inf)
    if sampling.min_p:  # transformers' MinPLogitsWarper: below min_p times the top token's probability
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < sampling.min_p * probs.amax(-1, keepdim=True), -math.inf)
    return logits


def next_tokens(logits, do_sample, gen, sampling: Sampling = GREEDY, members: int = 1, seen=None):
    """Greedy, or drawn from the logits as ``sampling`` shapes them (:func:`shaped_logits`); with members,
    every member's block draws the numbers block 0 draws (common random numbers)."""
    logits = shaped_logits(logits, do_sample, sampling, seen)
    if not do_sample:
        return logits.argmax(-1)
    probs = F.softmax(logits, dim=-1)
    if members == 1:
        return torch.multinomial(probs, 1, generator=gen).squeeze(1)
    state, parts = gen.get_state(), []
    for block in probs.chunk(members):
        gen.set_state(state)
        parts.append(torch.multinomial(block, 1, generator=gen).squeeze(1))
    return torch.cat(parts)


def _detokenise(lm, new, ends, stops) -> list[str]:
    """Each row's text: its kept tokens (``ends``) decoded, then ended with the first stop string."""
    tok = lm.tokenizer
    return [end_at_stop(tok.decode(ids[:end], skip_special_tokens=True), stops)
            for ids, end in zip(new.tolist(), ends.tolist())]


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
