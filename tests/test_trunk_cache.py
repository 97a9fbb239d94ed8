"""The frozen-trunk cache's hits run on one thread (mezo_rl.model.trunk_cache.one_thread): the small ops of
the final norm and the candidates' logits, whose values do not depend on the thread count."""
from __future__ import annotations

import contextlib
import random

import pytest
import torch

import mezo_rl.model.lm as lm_module
from mezo_rl.model.lm import LanguageModel
from mezo_rl.model.trunk_cache import one_thread


def _freeze_all_but_final_norm(model):
    for name, p in model.named_parameters():
        p.requires_grad_(name == "model.norm.weight")


def _prompts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = "the movie was good and the acting was bad so the sun rose early".split()
    return [" ".join(rng.sample(words, rng.randrange(2, 9))) + " . Yes or No ?" for _ in range(n)]


@pytest.fixture
def threads():
    """At least two intra-op threads for the test, the process's count restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(max(before, 2))
    yield torch.get_num_threads()
    torch.set_num_threads(before)


def test_one_thread_restores_the_thread_count_even_on_an_exception(threads):
    with one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == threads
    with pytest.raises(RuntimeError, match="boom"):
        with one_thread():
            raise RuntimeError("boom")
    assert torch.get_num_threads() == threads
    torch.set_num_threads(1)
    with one_thread():  # already one thread: nothing to change
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 1


def test_a_cache_hit_scores_candidates_on_one_thread_with_the_values_of_several(tiny_causal_lm, threads, monkeypatch):
    model, tok = tiny_causal_lm
    _freeze_all_but_final_norm(model)
    lm = LanguageModel(model, tok)
    assert lm.enable_trunk_cache()
    seen = []
    hook = model.model.norm.register_forward_hook(lambda m, i, o: seen.append(torch.get_num_threads()))
    # enough scored rows (x members) that the norm's and the head's ops are above torch's grain size, so that
    # several threads really split them
    prompts = _prompts(160)
    cands = [[" No", " Yes"]] * len(prompts)  # single tokens of the tiny tokenizer: candidate logits
    members = 8
    assert len(prompts) * members * model.config.hidden_size > 32768
    try:
        with torch.no_grad():
            lm.score(prompts, cands, normalised=False)  # fills the cache (the trunk runs, stopped before the norm)
            seen.clear()
            one = lm.score(prompts, cands, members=members, normalised=False)
            assert seen and set(seen) == {1}  # the hit: the final norm ran on one thread
            assert torch.get_num_threads() == threads  # and the count is back after the call
            seen.clear()
            full = lm.score(prompts, cands, members=members)  # vocabulary-wide logits: the process's threads
            assert seen and set(seen) == {threads}
            monkeypatch.setattr(lm_module, "one_thread", contextlib.nullcontext)
            seen.clear()
            several = lm.score(prompts, cands, members=members, normalised=False)
            assert seen and set(seen) == {threads}
    finally:
        hook.remove()
    for a_member, b_member in zip(one, several):
        for a, b in zip(a_member, b_member):
            assert torch.equal(a.sum, b.sum) and torch.equal(a.mean, b.mean)
    assert len(full) == members
