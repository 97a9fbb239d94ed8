"""KL to the starting model (mezo_rl.training.kl): exact per-token KL over the vocabulary, the starting
model as swapped-in trainable tensors."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from mezo_rl.model.lm import LanguageModel
from mezo_rl.training.kl import KLSums, StartingPoint, completion_kl
from tests.conftest import float32_rounding_bound, model_reduction_terms

PROMPTS = ["the movie was", "a story about", "I think that", "one two three four five"]
COMPLETIONS = [" great fun to watch", " a dog", "", " it is what it is and more"]


def _perturb(model, scale=0.05, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn(p.shape, generator=g))


def _reference(lm_now, lm_start, prompts, completions):
    """Per-token KL, one pair at a time, each model its own copy, full logits: (total, tokens, max |logp|)."""
    total, tokens, biggest = 0.0, 0, 0.0
    for p, c in zip(prompts, completions):
        if not c:
            continue
        ids, pos, _ = lm_now.encode(p, c)
        x = torch.tensor([ids])
        with torch.no_grad():
            lp = F.log_softmax(lm_now.model(input_ids=x).logits[0, pos].double(), -1)
            lq = F.log_softmax(lm_start.model(input_ids=x).logits[0, pos].double(), -1)
        total += float((lp.exp() * (lp - lq)).sum())
        tokens += len(pos)
        biggest = max(biggest, float(lp.abs().max()), float(lq.abs().max()))
    return total, tokens, biggest


def test_kl_is_exactly_zero_at_the_start(tiny_causal_lm):
    model, tok = tiny_causal_lm
    lm = LanguageModel(model, tok)
    start = StartingPoint(model)
    kl = completion_kl(lm, start, PROMPTS, COMPLETIONS)
    assert kl.tokens > 0 and kl.total == 0.0


def test_kl_matches_a_second_model_and_the_weights_come_back(tiny_causal_lm):
    model, tok = tiny_causal_lm
    lm = LanguageModel(model, tok)
    start_copy = LanguageModel(copy.deepcopy(model), tok)
    start = StartingPoint(model)
    assert start.nbytes == sum(p.numel() * 4 for p in model.parameters())
    _perturb(model)
    before = {n: (p.data_ptr(), p.detach().clone()) for n, p in model.named_parameters()}
    kl = completion_kl(lm, start, PROMPTS, COMPLETIONS, batch_size=2)
    for n, p in model.named_parameters():  # the trained tensors are back: the same storage, the same bits
        assert p.data_ptr() == before[n][0] and torch.equal(p.detach(), before[n][1])
    total, tokens, biggest = _reference(lm, start_copy, PROMPTS, COMPLETIONS)
    assert kl.tokens == tokens and total > 0
    seq_len = max(len(lm.encode(p, c)[0]) for p, c in zip(PROMPTS, COMPLETIONS) if c)
    # each of the two log-probabilities of a token is within the float32 bound of the float64 value
    # (padding and batching change only the summation order), and KL_t = sum_v p_v (lp_v - lq_v) with
    # sum_v p_v = 1 errs by at most their sum: two bounds per token, over every token
    bound = 2 * float32_rounding_bound(biggest, model_reduction_terms(model, seq_len))
    assert abs(kl.total - total) <= tokens * 2 * bound


def test_kl_with_only_some_tensors_trainable(tiny_causal_lm):
    """Frozen tensors are shared, not copied: the copy holds the trainable ones only."""
    model, tok = tiny_causal_lm
    for name, p in model.named_parameters():
        p.requires_grad_(name == "model.norm.weight")
    lm = LanguageModel(model, tok)
    start = StartingPoint(model)
    assert start.nbytes == model.model.norm.weight.numel() * 4
    kept = model.model.norm.weight.detach().clone()
    with torch.no_grad():
        model.model.norm.weight.mul_(1.5)
    assert completion_kl(lm, start, PROMPTS, COMPLETIONS).mean > 0
    with torch.no_grad():
        model.model.norm.weight.copy_(kept)
    assert completion_kl(lm, start, PROMPTS, COMPLETIONS).total == 0.0


def test_kl_sums():
    assert (KLSums(1.0, 2) + KLSums(2.0, 4)).mean == 0.5
    assert KLSums().mean != KLSums().mean  # NaN without tokens


def test_evaluate_reports_kl_on_a_prompt_task(tiny_causal_lm, tmp_path):
    import json

    from mezo_rl import rewards
    from mezo_rl.training.evaluation import evaluate
    from mezo_rl.tasks import from_prompts

    model, tok = tiny_causal_lm
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{p} {i}"}) + "\n" for i, p in enumerate(PROMPTS * 5)))
    task = from_prompts(path)
    examples = task.load_split("validation") + task.load_split("test")
    objective = rewards.build_objective([lambda completions, **kw: [float(len(c)) for c in completions]])
    lm = LanguageModel(model, tok)
    start = StartingPoint(model)
    at_start = evaluate(lm, task, examples, max_new_tokens=6, objective=objective, reference=start)
    assert at_start["kl"] == 0.0 and at_start["kl_tokens"] > 0
    _perturb(model)
    assert evaluate(lm, task, examples, max_new_tokens=6, objective=objective, reference=start)["kl"] > 0
    assert "kl" not in evaluate(lm, task, examples, max_new_tokens=6, objective=objective)


def test_the_starting_model_computes_as_itself_inside_one_bf16_autocast_region(tiny_causal_lm):
    """Autocast caches its bf16 copy of each trainable tensor per region: the swap must not be hidden by it
    (else a LoRA or full run's kl, and --beta, would read 0 under --autocast bfloat16)."""
    model, tok = tiny_causal_lm
    start_copy = copy.deepcopy(model)
    start = StartingPoint(model)
    _perturb(model)
    x = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        now = model(input_ids=x).logits
        expected_start = start_copy(input_ids=x).logits
        with start.active():
            at_start = model(input_ids=x).logits
        again = model(input_ids=x).logits
    # the same shapes and ops on the same values: the same bits
    assert not torch.equal(now, expected_start)
    assert torch.equal(at_start, expected_start)
    assert torch.equal(again, now)
