"""The frozen-trunk cache and threads (mezo_rl.model.trunk_cache): a hit runs on one thread (``one_thread``: the
small ops of the final norm and the candidates' logits), the trunk's batches on the thread count measured
faster (``ThreadChoice``), and neither changes a value."""
from __future__ import annotations

import contextlib
import random

import pytest
import torch

import mezo_rl.model.scoring as scoring
from mezo_rl.model.lm import LanguageModel
from conftest import make_tiny_causal_lm
from mezo_rl.model.trunk_cache import ThreadChoice, one_thread


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
            lm.score(prompts, cands, log_softmax=False)  # fills the cache (the trunk runs, stopped before the norm)
            seen.clear()
            one = lm.score(prompts, cands, members=members, log_softmax=False)
            assert seen and set(seen) == {1}  # the hit: the final norm ran on one thread
            assert torch.get_num_threads() == threads  # and the count is back after the call
            seen.clear()
            full = lm.score(prompts, cands, members=members)  # vocabulary-wide logits: the process's threads
            assert seen and set(seen) == {threads}
            monkeypatch.setattr(scoring, "one_thread", contextlib.nullcontext)
            seen.clear()
            several = lm.score(prompts, cands, members=members, log_softmax=False)
            assert seen and set(seen) == {threads}
    finally:
        hook.remove()
    for a_member, b_member in zip(one, several):
        for a, b in zip(a_member, b_member):
            assert torch.equal(a.sum, b.sum) and torch.equal(a.mean, b.mean)
    assert len(full) == members


class FakeClock:
    """A clock whose every batch takes the seconds ``cost[threads]`` say, the thread count read inside the batch."""

    def __init__(self, cost):
        self.cost, self.now, self.started = cost, 0.0, None

    def __call__(self):
        if self.started is None:
            self.started = torch.get_num_threads()
            return self.now
        self.now += self.cost[self.started]
        self.started = None
        return self.now


@pytest.mark.parametrize("faster", ["one", "several"])
def test_thread_choice_runs_the_trunk_with_the_faster_setting_and_tries_the_other_again(threads, faster):
    cost = {1: 1.0, threads: 3.0} if faster == "one" else {1: 3.0, threads: 1.0}
    best, other = (1, threads) if faster == "one" else (threads, 1)
    choice = ThreadChoice(every=4, clock=FakeClock(cost))
    used = []
    for _ in range(13):
        with choice.run(work=100) as n:
            assert torch.get_num_threads() == n
            used.append(n)
        assert torch.get_num_threads() == threads  # restored after every batch
    # untimed first batch, one try of each setting, then the faster with a retry of the other every 4th batch
    assert used[:3] == [threads, threads, 1]
    assert used[3:] == [other if b % 4 == 0 else best for b in range(3, 13)]
    assert choice.rate[best] < choice.rate[other]
    with pytest.raises(RuntimeError, match="boom"):
        with choice.run(work=100):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == threads


def test_the_trunk_gives_the_same_values_on_one_thread_and_several(tiny_tokenizer, threads):
    # wide enough that the trunk's ops are above torch's grain size and really split over the threads
    model = make_tiny_causal_lm(tiny_tokenizer, hidden_size=128, intermediate_size=512)
    _freeze_all_but_final_norm(model)
    prompts = _prompts(64, seed=1)
    cands = [[" No", " Yes"]] * len(prompts)
    caches = {}
    for n in (1, threads):
        lm = LanguageModel(model, tiny_tokenizer)
        assert lm.enable_trunk_cache()
        lm.trunk_cache.threads.pick = lambda many, n=n: n  # every batch on n threads
        seen = []
        hook = model.model.layers[0].register_forward_hook(lambda m, i, o: seen.append(torch.get_num_threads()))
        try:
            with torch.no_grad():
                lm.score(prompts, cands, log_softmax=False)
        finally:
            hook.remove()
        assert set(seen) == {n}
        caches[n] = lm.trunk_cache.entries
    one, several = caches[1], caches[threads]
    assert one.keys() == several.keys() and len(one) == len(set(prompts))
    assert all(torch.equal(one[k], several[k]) for k in one)
