"""LanguageModel: scoring (batched == one at a time, equals a full forward), generation, features."""
import pytest
import torch
import torch.nn.functional as F

from conftest import assert_float32_close
from mezo_rl.model.lm import LanguageModel
from mezo_rl.model.scoring import MASK

PROMPTS = ["the movie was good and the acting was bad . It was", "Yes or No ?", "the sun rose early and the people"]
CANDS = [[" great", " terrible ."], [" Yes", " No", " Maybe so"], [" went outside to play", " sat"]]


def reference_causal_score(model, tok, prompt, cand):
    """Log-likelihood of cand after prompt from one unpadded full forward (logits at every position)."""
    p = tok(prompt)["input_ids"]
    c = tok(cand, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([p + c])
    logp = F.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    return sum(logp[len(p) - 1 + i, t].item() for i, t in enumerate(c)), len(c)


def test_causal_score_matches_full_forward_and_is_batch_invariant(tiny_causal_lm):
    model, tok = tiny_causal_lm
    lm = LanguageModel(model, tok, batch_size=16)
    assert lm.is_causal
    with torch.no_grad():
        batched = lm.score(PROMPTS, CANDS)
        lm.batch_size = 1
        single = [lm.score([p], [c])[0] for p, c in zip(PROMPTS, CANDS)]
        for p, cands, b, s in zip(PROMPTS, CANDS, batched, single):
            assert b.sum.shape == (len(cands),) and b.sum.dtype == torch.float32
            longest = max(len(tok(p + c)["input_ids"]) for c in cands)
            n_max = int(b.n_tokens.max())
            assert_float32_close(b.sum, s.sum, model, longest, extra_terms=n_max)
            assert_float32_close(b.mean, s.mean, model, longest, extra_terms=n_max)
            for j, c in enumerate(cands):
                ref, n = reference_causal_score(model, tok, p, c)
                assert b.n_tokens[j] == n
                assert_float32_close(b.sum[j], torch.tensor(ref), model, longest, extra_terms=n)
                assert_float32_close(b.mean[j], torch.tensor(ref / n), model, longest, extra_terms=n)


def test_score_is_differentiable(tiny_causal_lm):
    model, tok = tiny_causal_lm
    lm = LanguageModel(model, tok)
    s = lm.score(PROMPTS[:1], CANDS[:1])[0]
    (-s.mean[0]).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)


def test_score_only_computes_logits_at_scored_positions(tiny_causal_lm):
    model, tok = tiny_causal_lm
    lm = LanguageModel(model, tok)
    rows, seqs = [], []
    hook = lm._head.register_forward_hook(lambda m, i, o: rows.append(o.shape[0]))
    emb = model.model.embed_tokens.register_forward_hook(lambda m, i, o: seqs.append(o.shape[0]))
    with torch.no_grad():
        lm.score(["the movie was good and the acting was bad ."], [[" great", " terrible"]])
        n_scored = sum(len(tok(c, add_special_tokens=False)["input_ids"]) for c in [" great", " terrible"])
        assert rows == [n_scored]  # a 2-D [N, H] input: one row per scored token, no padding, no prompt
        single = [" a", " b", " c"]
        assert all(len(tok(c, add_special_tokens=False)["input_ids"]) == 1 for c in single)
        rows.clear(), seqs.clear()
        s = lm.score(["Yes or No ?"], [single])[0]
        assert seqs == [1] and rows == [1]  # single-token candidates of one prompt share one sequence and position
    hook.remove(), emb.remove()
    ref = [reference_causal_score(model, tok, "Yes or No ?", c)[0] for c in single]
    assert_float32_close(s.sum, torch.tensor(ref), model, len(tok("Yes or No ? a")["input_ids"]), extra_terms=1)


def test_score_bad_input(tiny_causal_lm):
    lm = LanguageModel(*tiny_causal_lm)
    with pytest.raises(ValueError, match="2 prompts but 1"):
        lm.score(["a", "b"], [["x"]])
    with pytest.raises(ValueError, match="non-empty list"):
        lm.score(["a"], [[]])
    with pytest.raises(ValueError, match="non-empty list"):
        lm.score(["a"], ["x"])


def test_empty_prompt_is_scored_from_a_start_token(tiny_causal_lm):
    lm = LanguageModel(*tiny_causal_lm)
    with torch.no_grad():
        s = lm.score([""], [["Description : what is the capital of France ?", "Human : what"]])[0]
    assert torch.isfinite(s.sum).all() and (s.sum < 0).all()


def test_masked_lm_scores_label_words_at_the_mask(tiny_masked_lm):
    model, tok = tiny_masked_lm
    lm = LanguageModel(model, tok)
    assert not lm.is_causal
    prompt = f"the movie was good . It was {MASK} ."
    words = [" was", " great"]  # one token and several tokens (scored at as many consecutive masks)
    with torch.no_grad():
        s = lm.score([prompt, prompt], [words, [" bad"]])
        for j, w in enumerate(words):
            c = tok(w, add_special_tokens=False)["input_ids"]
            ids = tok("the movie was good . It was", add_special_tokens=False)["input_ids"]
            m = len(ids)
            ids = ids + [tok.mask_token_id] * len(c) + tok(" .", add_special_tokens=False)["input_ids"]
            logp = F.log_softmax(model(input_ids=torch.tensor([ids])).logits[0], -1)
            ref = sum(logp[m + i, t].item() for i, t in enumerate(c))
            assert_float32_close(s[0].sum[j], torch.tensor(ref), model, len(ids), extra_terms=len(c))
            assert s[0].n_tokens[j] == len(c)
        single = lm.score([prompt], [words])[0]
    assert len(tok(" was", add_special_tokens=False)["input_ids"]) == 1
    assert len(tok(" great", add_special_tokens=False)["input_ids"]) > 1
    n_max = int(single.n_tokens.max())
    assert_float32_close(s[0].sum, single.sum, model, len(tok(prompt)["input_ids"]) + n_max, extra_terms=n_max)
    with pytest.raises(ValueError, match="exactly once"):
        lm.score(["no mask here"], [[" great"]])


def test_generation_is_batch_invariant(tiny_causal_lm):
    lm = LanguageModel(*tiny_causal_lm, batch_size=8)
    texts = lm.generate(PROMPTS, max_new_tokens=12)
    lm.batch_size = 1
    assert texts == [lm.generate([p], max_new_tokens=12)[0] for p in PROMPTS]
    assert all(isinstance(t, str) for t in texts)


def test_generation_chunks_prompts_of_similar_length(tiny_causal_lm):
    """Prompts are decoded in chunks of similar token length (less left padding), and every text comes
    back in its prompt's place: the same texts as one prompt at a time."""
    lm = LanguageModel(*tiny_causal_lm, batch_size=2)
    prompts = ["the sun rose early and the cat sat on the mat", "It", "once upon a time there was a cat who", "Yes"]
    widths = []
    hook = lm._base.register_forward_pre_hook(lambda m, a, kw: widths.append(tuple(kw["input_ids"].shape)),
                                              with_kwargs=True)
    try:
        texts = lm.generate(prompts, max_new_tokens=3)
    finally:
        hook.remove()
    lengths = sorted(len(lm.tokenizer(p)["input_ids"]) for p in prompts)
    assert [w for w in widths if w[1] > 1] == [(2, lengths[1]), (2, lengths[3])]  # each chunk's prefill
    lm.batch_size = 1
    assert texts == [lm.generate([p], max_new_tokens=3)[0] for p in prompts]


def test_generation_stops_at_newline_only_when_asked(tiny_causal_lm):
    model, tok = tiny_causal_lm
    nl = tok("\n", add_special_tokens=False)["input_ids"][0]
    lm = LanguageModel(model, tok)
    free = lm.generate(["the sun rose"], max_new_tokens=6)[0]
    assert len(tok(free, add_special_tokens=False)["input_ids"]) >= 1
    with torch.no_grad():  # force "\n" to win from the first step on
        model.lm_head.bias = torch.nn.Parameter(torch.zeros(len(tok)))
        model.lm_head.bias.data[nl] = 1e4
    assert lm.generate(["the sun rose", "Yes or No ?"], max_new_tokens=6, stop=["\n"]) == ["\n", "\n"]
    assert lm.generate(["the sun rose", "Yes or No ?"], max_new_tokens=3) == ["\n\n\n"] * 2


def test_decoding_preallocates_its_cache_and_matches_a_growing_cache(tiny_causal_lm, monkeypatch):
    """The preallocated key/value cache (transformers' StaticCache, written in place) decodes exactly what a
    cache that grows by a column a step decodes: greedy and sampled, with members, in float32."""
    import mezo_rl.model.decoding as decoding
    from transformers import StaticCache

    model, tok = tiny_causal_lm
    lm = LanguageModel(model, tok, batch_size=2)
    caches = []
    hook = lm._base.register_forward_pre_hook(lambda m, a, kw: caches.append(type(kw.get("cache"))), with_kwargs=True)
    prompts = PROMPTS + ["It", "the sun rose early and the cat sat on the mat"]
    runs = {}
    try:
        for devices in (("cpu",), ()):
            monkeypatch.setattr(decoding, "STATIC_CACHE_DEVICES", devices)
            runs[devices] = [lm.generate(prompts, max_new_tokens=9),
                             lm.generate(prompts, max_new_tokens=9, members=3),
                             lm.generate(prompts, max_new_tokens=9, do_sample=True, seed=2, members=2)]
    finally:
        hook.remove()
    assert runs[("cpu",)] == runs[()]
    assert StaticCache in caches and type(None) in caches  # each path ran


def test_only_cuda_records_the_decoding_step_as_a_graph(tiny_causal_lm, monkeypatch):
    """The CUDA-graph step is chosen for CUDA devices alone, with or without members; on a CPU decoding never
    touches CUDA graphs and reads "finished?" after every token."""
    from mezo_rl.model.decoding import DONE_CHECK_EVERY, decode_plan

    model, tok = tiny_causal_lm
    cpu, cuda = decode_plan(model, "cpu"), decode_plan(model, torch.device("cuda"))
    assert (cpu.static_cache, cpu.graphed, cpu.check_every) == (True, False, 1)
    assert cuda.static_cache and cuda.graphed and cuda.check_every == DONE_CHECK_EVERY > 1
    assert decode_plan(model, "cuda:0").graphed

    class NoStaticCache(torch.nn.Module):  # a model whose attention takes no preallocated cache
        _can_compile_fullgraph = False

    assert not decode_plan(NoStaticCache(), "cuda").static_cache and not decode_plan(NoStaticCache(), "cuda").graphed
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda *a, **k: pytest.fail("a CUDA graph was made on a CPU"))
    lm = LanguageModel(model, tok)
    assert lm.generate(PROMPTS, max_new_tokens=4) == LanguageModel(model, tok, batch_size=1).generate(PROMPTS, max_new_tokens=4)


def test_decoding_reads_from_the_device_only_at_its_finished_checks(tiny_causal_lm, monkeypatch):
    """With the preallocated cache, a decode's host reads (``aten._local_scalar_dense``: ``bool()``, ``.item()``)
    are its "finished?" checks, one every check_every tokens, stop strings included: none per token (a cache
    that grows reads its length back at every step)."""
    import mezo_rl.model.decoding as decoding
    from mezo_rl.opcount import OpCounter

    model, tok = tiny_causal_lm
    lm = LanguageModel(model, tok)
    assert all(lm.generate(PROMPTS, max_new_tokens=16))  # no row ends early: every check is made

    def reads(plan, n):
        monkeypatch.setattr(decoding, "decode_plan", lambda *a, **k: plan)
        lm.generate(PROMPTS, max_new_tokens=n, stop=["zq"])  # builds the stop check once
        with OpCounter() as ops:
            lm.generate(PROMPTS, max_new_tokens=n, stop=["zq"])
        return ops.counts["aten._local_scalar_dense"]

    every_4 = decoding.DecodePlan(static_cache=True, graphed=False, check_every=4)
    assert reads(every_4, 16) - reads(every_4, 8) == 2
    growing = decoding.DecodePlan(static_cache=False, graphed=False, check_every=4)
    assert reads(growing, 16) - reads(growing, 8) > 8


@pytest.mark.parametrize("members", [None, 2])
def test_a_decoding_step_that_cannot_be_recorded_falls_back_to_the_eager_step(tiny_causal_lm, monkeypatch, members):
    """Where the graph path is chosen (CUDA; forced here on a CPU, where recording a CUDA graph really fails),
    decoding warns once and runs eagerly, with the same texts (the cache advanced once per token: the
    failed recording ran nothing twice), and does not try again."""
    import mezo_rl.model.decoding as decoding

    model, tok = tiny_causal_lm
    want = LanguageModel(model, tok).generate(PROMPTS, max_new_tokens=6, members=members)
    plan = decoding.DecodePlan(static_cache=True, graphed=True, check_every=2)
    monkeypatch.setattr(decoding, "decode_plan", lambda *a, **k: plan)
    lm = LanguageModel(model, tok)
    with pytest.warns(UserWarning, match="recording the decoding step as a CUDA graph failed"):
        assert lm.generate(PROMPTS, max_new_tokens=6, members=members) == want
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert lm.generate(PROMPTS, max_new_tokens=6, members=members) == want


def test_finished_rows_are_read_back_every_k_tokens_where_the_plan_says(tiny_causal_lm, monkeypatch):
    """On an accelerator the host reads "has every row finished?" only every check_every tokens: a decode whose
    rows all end at the first token runs on to the next check, and the texts are those of checking every token."""
    import mezo_rl.model.decoding as decoding

    model, tok = tiny_causal_lm
    lm = LanguageModel(model, tok)
    with torch.no_grad():  # EOS wins from the first step on
        model.lm_head.bias = torch.nn.Parameter(torch.zeros(len(tok)))
        model.lm_head.bias.data[tok.eos_token_id] = 1e4
    every_4 = decoding.DecodePlan(static_cache=True, graphed=False, check_every=4)
    steps = []
    hook = lm._base.register_forward_pre_hook(lambda m, a: steps.append(1))
    try:
        assert lm.generate(PROMPTS, max_new_tokens=10) == [""] * 3
        assert len(steps) == 1
        monkeypatch.setattr(decoding, "decode_plan", lambda *a, **k: every_4)
        assert lm.generate(PROMPTS, max_new_tokens=10) == [""] * 3
        assert len(steps) == 1 + 4
    finally:
        hook.remove()


def test_greedy_matches_step_by_step_argmax(tiny_causal_lm):
    model, tok = tiny_causal_lm
    lm = LanguageModel(model, tok)
    prompt = "the movie was good and"
    out = lm.generate([prompt, "Yes"], max_new_tokens=5)[0]
    ids = tok(prompt)["input_ids"]
    with torch.no_grad():
        for _ in range(5):
            nxt = model(input_ids=torch.tensor([ids])).logits[0, -1].argmax().item()
            if nxt == tok.eos_token_id:
                break
            ids.append(nxt)
    assert out == tok.decode(ids[len(tok(prompt)["input_ids"]):], skip_special_tokens=True)


def test_seeded_sampling_is_reproducible(tiny_causal_lm):
    lm = LanguageModel(*tiny_causal_lm)
    kw = dict(max_new_tokens=10, do_sample=True)
    a = lm.generate(PROMPTS, seed=123, **kw)
    b = lm.generate(PROMPTS, seed=123, **kw)
    others = [lm.generate(PROMPTS, seed=s, **kw) for s in range(1, 4)]
    assert a == b
    assert any(o != a for o in others)


def test_features(tiny_causal_lm, tiny_masked_lm):
    lm = LanguageModel(*tiny_causal_lm, batch_size=2)
    f = lm.features(PROMPTS)
    assert f.shape == (3, 32) and f.dtype == torch.float32
    assert_float32_close(f[1], lm.features(PROMPTS[1:2])[0], lm.model, max(len(lm.tokenizer(p)["input_ids"]) for p in PROMPTS))
    assert LanguageModel(*tiny_masked_lm).features(PROMPTS).shape == (3, 32)


@pytest.mark.slow
def test_smollm2_scoring_and_generation():
    from mezo_rl.model.loading import load_model

    lm = load_model("smollm2-135m", batch_size=4)
    prompts = ["The film was a delight from start to finish. It was", "Paris is the capital of"]
    cands = [[" terrible", " great", " a waste of time"], [" France", " Germany"]]
    with torch.no_grad():
        batched = lm.score(prompts, cands)
        for p, c, b in zip(prompts, cands, batched):
            for j, cand in enumerate(c):
                ref, n = reference_causal_score(lm.model, lm.tokenizer, p, cand)
                assert b.n_tokens[j] == n
                assert_float32_close(b.sum[j], torch.tensor(ref), lm.model, len(lm.tokenizer(p + cand)["input_ids"]), extra_terms=n)
        assert batched[0].mean[1] > batched[0].mean[0] and batched[1].mean[0] > batched[1].mean[1]
    squad_style = "Title: France\nContext: Paris is the capital of France.\nQuestion: What is the capital of France?\nAnswer:"
    out = lm.generate([squad_style, "1, 2, 3, 4,"], max_new_tokens=8)
    assert "Paris" in out[0] and all("\n" not in o for o in out)
    assert lm.generate(["Once upon a time"], max_new_tokens=8, do_sample=True, seed=7) == \
        lm.generate(["Once upon a time"], max_new_tokens=8, do_sample=True, seed=7)


# ---------------------------------------------------------------------------- frozen-trunk cache
def _freeze_all_but_final_norm(model):
    for name, p in model.named_parameters():
        p.requires_grad_(name == "model.norm.weight")


def test_trunk_cache_scores_equal_full_forwards_and_follow_the_final_norm(tiny_causal_lm):
    model, tok = tiny_causal_lm
    _freeze_all_but_final_norm(model)
    plain, cached = LanguageModel(model, tok), LanguageModel(model, tok)
    assert cached.enable_trunk_cache()
    runs = []
    hook = model.model.layers[0].register_forward_hook(lambda m, i, o: runs.append(1))
    with torch.no_grad():
        for step in range(3):  # the final norm changes between calls, as under MeZO
            model.model.norm.weight.mul_(1.0 + 0.3 * (step + 1))
            runs.clear()
            got = cached.score(PROMPTS, CANDS)
            trunk_runs = len(runs)
            want = plain.score(PROMPTS, CANDS)
            for p, cands, g, w in zip(PROMPTS, CANDS, got, want):
                longest = max(len(tok(p + c)["input_ids"]) for c in cands)
                assert_float32_close(g.sum, w.sum, model, longest, extra_terms=int(w.n_tokens.max()))
                assert torch.equal(g.n_tokens, w.n_tokens)
            assert trunk_runs == (1 if step == 0 else 0)  # the trunk ran for the first call only
    hook.remove()
    distinct = {(tuple(ids), tuple(pos)) for p, cands in zip(PROMPTS, CANDS)
                for ids, pos, _ in (cached._encode_causal(p, c) for c in cands)}
    assert cached.trunk_cache_size == len(distinct) < sum(len(c) for c in CANDS)  # shared inputs share an entry


def test_trunk_cache_runs_the_head_once_per_distinct_scored_token(tiny_causal_lm):
    # the cost of a --peft norm step is the output head: label words that share an input share its rows
    model, tok = tiny_causal_lm
    _freeze_all_but_final_norm(model)
    lm = LanguageModel(model, tok)
    assert lm.enable_trunk_cache()
    with torch.no_grad():
        lm.score(PROMPTS, CANDS)  # fill the cache
        rows = []
        hook = model.lm_head.register_forward_hook(lambda m, i, o: rows.append(i[0].reshape(-1, i[0].shape[-1]).shape[0]))
        try:
            lm.score(PROMPTS, CANDS)
        finally:
            hook.remove()
    distinct = {(tuple(ids), tuple(pos)) for p, cands in zip(PROMPTS, CANDS)
                for ids, pos, _ in (lm._encode_causal(p, c) for c in cands)}
    scored = sum(len(lm._encode_causal(p, c)[2]) for p, cands in zip(PROMPTS, CANDS) for c in cands)
    assert sum(rows) == sum(len(pos) for _, pos in distinct) < scored


def test_trunk_cache_gives_gradients_for_the_final_norm(tiny_causal_lm):
    model, tok = tiny_causal_lm
    _freeze_all_but_final_norm(model)
    lm = LanguageModel(model, tok)
    lm.enable_trunk_cache()
    lm.score(PROMPTS[:1], CANDS[:1])  # fill the cache
    s = lm.score(PROMPTS[:1], CANDS[:1])[0]
    (-s.mean[0]).backward()
    assert model.model.norm.weight.grad is not None and model.model.norm.weight.grad.abs().sum() > 0


def test_trunk_cache_is_bypassed_while_a_trunk_weight_is_trainable(tiny_causal_lm):
    model, tok = tiny_causal_lm
    _freeze_all_but_final_norm(model)
    lm = LanguageModel(model, tok)
    lm.enable_trunk_cache()
    with torch.no_grad():
        lm.score(PROMPTS, CANDS)
        assert lm.trunk_cache_size > 0
        w = model.model.layers[1].mlp.down_proj.weight
        w.requires_grad_(True)  # the trunk may now change: the cache must not be trusted
        before = lm.score(PROMPTS[:1], CANDS[:1])[0].sum
        assert lm.trunk_cache_size == 0
        w.add_(0.5)
        after = lm.score(PROMPTS[:1], CANDS[:1])[0].sum
    assert not torch.equal(before, after)  # the change is seen: nothing stale was served


def test_trunk_cache_refuses_layouts_it_cannot_rebuild(tiny_causal_lm, tiny_masked_lm):
    model, tok = tiny_masked_lm
    assert not LanguageModel(model, tok).enable_trunk_cache()  # masked LM
    model, tok = tiny_causal_lm
    lm = LanguageModel(model, tok)
    def project(module, args, out):  # the base does more after its final norm (as OPT-350m's project_out)
        out.last_hidden_state = out.last_hidden_state * 2
        return out
    handle = model.model.register_forward_hook(project)
    assert not lm.enable_trunk_cache()
    handle.remove()
    assert lm.enable_trunk_cache()


def test_encode_is_the_sequence_score_runs(tiny_causal_lm, tiny_masked_lm):
    # causal: the prompt, then the candidate's tokens but the last, scored where each candidate token is predicted
    model, tok = tiny_causal_lm
    lm = LanguageModel(model, tok)
    p = tok(PROMPTS[2])["input_ids"]
    c = tok(CANDS[2][0], add_special_tokens=False)["input_ids"]
    assert len(c) > 1
    ids, positions, targets = lm.encode(PROMPTS[2], CANDS[2][0])
    assert ids == p + c[:-1] and targets == c and positions == list(range(len(p) - 1, len(p) - 1 + len(c)))
    # masked: the candidate's tokens are masks in the prompt, scored at the masks
    model, tok = tiny_masked_lm
    lm = LanguageModel(model, tok)
    ids, positions, targets = lm.encode(f"It was {MASK} .", " great")
    assert targets == tok(" great", add_special_tokens=False)["input_ids"]
    assert [ids[i] for i in positions] == [tok.mask_token_id] * len(targets)


def test_a_rebuilt_model_adopts_the_trunk_cache_and_never_reruns_the_trunk(tiny_tokenizer):
    # the best step's weights replayed onto a fresh copy: the frozen trunk is the same, so are its outputs
    from conftest import make_tiny_causal_lm

    first, again = make_tiny_causal_lm(tiny_tokenizer), make_tiny_causal_lm(tiny_tokenizer)
    for model in (first, again):
        _freeze_all_but_final_norm(model)
    old, new = LanguageModel(first, tiny_tokenizer), LanguageModel(again, tiny_tokenizer)
    assert old.enable_trunk_cache() and new.enable_trunk_cache()
    with torch.no_grad():
        want = old.score(PROMPTS, CANDS)
        kept = old.trunk_cache.values_only()
        assert kept.norm is None and kept.params == []  # nothing of the old model is kept alive
        assert new.adopt_trunk_cache(kept) and new.trunk_cache_size == old.trunk_cache_size
        runs = []
        hook = again.model.layers[0].register_forward_hook(lambda m, i, o: runs.append(1))
        got = new.score(PROMPTS, CANDS)
        hook.remove()
    assert runs == []  # every entry came from the adopted cache
    for g, w in zip(got, want):
        assert torch.equal(g.sum, w.sum)  # the same cached values through the same norm and head
    other = make_tiny_causal_lm(tiny_tokenizer, seed=1)  # another trunk: its outputs differ, nothing is taken
    _freeze_all_but_final_norm(other)
    stranger = LanguageModel(other, tiny_tokenizer)
    assert stranger.enable_trunk_cache() and not stranger.adopt_trunk_cache(old.trunk_cache)
    assert stranger.trunk_cache_size == 0
