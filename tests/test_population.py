"""Batched member evaluation (``MeZO(..., member_evaluation=BatchedMembers(model))``): every member of a
step in one member-major batched pass, the weights untouched until the update.

The central check: on tiny models, for every kind of trainable tensor the batched mode perturbs
(low-rank matrices of Linear / Conv1D / Embedding / the tied head, Linear biases, norm gains through
the generic per-member path, LoRA with element-wise noise, prefix key/values), each member's loss
equals the weight-side mode's within a float32 tolerance derived below, and so do the projected
gradients; the perturbation's own effect on the loss is far larger than that tolerance, so a member
that saw the wrong perturbation (or none) would fail.
"""
from __future__ import annotations

import math
import re

import pytest
import torch

from conftest import FLOAT32_UNIT_ROUNDOFF, float32_rounding_bound, make_tiny_causal_lm, make_tiny_masked_lm, model_reduction_terms
from mezo_rl.model.lm import LanguageModel
from mezo_rl.engine.optim import MeZO, replay_trajectory
from mezo_rl.model.peft import FINAL_NORM, apply_peft
from mezo_rl.engine.population import BatchedMembers, Member, step_members

PROMPTS = ["It was great . the movie", "Does this mean that the", "the cat sat on the", "so because the sun rose"]
CANDIDATES = [[" good", " bad ."], [" Yes", " No"], [" mat", " park"], [" early", " went"]]


pytestmark = pytest.mark.usefixtures("one_thread")  # members compared across passes: one thread's reduction order


def tiny_gpt2(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=128,
                     pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                     bos_token_id=tokenizer.eos_token_id)
    return GPT2LMHeadModel(cfg).eval()


def choice_loss(scores) -> float:
    """Cross-entropy of the first candidate over each prompt's candidates (mean log-likelihoods)."""
    return -sum(float(s.mean[0] - torch.logsumexp(s.mean, 0)) for s in scores) / len(scores)


# name: (model builder (tokenizer, mlm tokenizer) -> (model, tokenizer), what is trainable, MeZO options).
# eps is large (0.3 - 1) so that each member's perturbation moves its loss by more than twice the
# tolerance: a member evaluated without its own perturbation could not pass.
CASES = {
    "full lowrank r=1, two-point n=2": (lambda t, m: (make_tiny_causal_lm(t), t), None,
                                        dict(noise="lowrank", n_spsa=2, eps=0.3)),
    "full lowrank r=2, es n=3": (lambda t, m: (make_tiny_causal_lm(t), t), None,
                                 dict(noise="lowrank", rank=2, n_spsa=3, estimator="es", eps=0.3)),
    "embedding (tied head) only": (lambda t, m: (make_tiny_causal_lm(t), t), "embed_tokens",
                                   dict(noise="lowrank", eps=0.3)),
    "linear weights and biases": (lambda t, m: (make_tiny_causal_lm(t, attention_bias=True, mlp_bias=True), t),
                                  r"layers\.1\.(self_attn|mlp)\.", dict(noise="lowrank", eps=0.3)),
    "biases only, gaussian": (lambda t, m: (make_tiny_causal_lm(t, attention_bias=True, mlp_bias=True), t),
                              r"\.bias$", dict(noise="gaussian", n_spsa=2, eps=1.0)),
    "final norm, rademacher, trunk cache": (lambda t, m: (make_tiny_causal_lm(t), t), "norm-cache",
                                            dict(noise="rademacher", step_normalize="std", n_spsa=2, eps=1.0)),
    "lora, gaussian (dense deltas)": (lambda t, m: (make_tiny_causal_lm(t), t), "lora",
                                      dict(noise="gaussian", eps=0.3)),
    "prefix, gaussian": (lambda t, m: (make_tiny_causal_lm(t), t), "prefix", dict(noise="gaussian", eps=1.0)),
    "masked LM, full lowrank": (lambda t, m: (make_tiny_masked_lm(m), m), None, dict(noise="lowrank", eps=0.3)),
    "GPT-2 Conv1D, full lowrank": (lambda t, m: (tiny_gpt2(t), t), None, dict(noise="lowrank", n_spsa=2, eps=1.0)),
    # the second step perturbs with the curvature the first moved; the last member is the unperturbed weights
    "full lowrank, HiZOO": (lambda t, m: (make_tiny_causal_lm(t), t), None,
                            dict(noise="lowrank", n_spsa=2, eps=0.3, hessian_smooth=0.5)),
}


def build(case, tokenizer, mlm_tokenizer):
    make, setup, options = CASES[case]
    model, tok = make(tokenizer, mlm_tokenizer)
    lm = LanguageModel(model, tok, batch_size=3)  # 4 prompts: two chunks, the second smaller
    if setup in ("lora", "prefix"):
        apply_peft(lm, setup)
    elif setup == "norm-cache":
        for name, p in model.named_parameters():
            p.requires_grad_(bool(re.search(FINAL_NORM, name)))
        assert lm.enable_trunk_cache()
    elif setup is not None:
        for name, p in model.named_parameters():
            p.requires_grad_(bool(re.search(setup, name)))
    prompts = [p + " [MASK] ." for p in PROMPTS] if not lm.is_causal else PROMPTS
    return lm, prompts, options


def run_steps(lm, prompts, options, evaluation, steps=2, lr=1e-2):
    params = [p for p in lm.model.parameters() if p.requires_grad]
    opt = MeZO(params, lr=lr, seed=3, noise_backend="torch", **options,
               member_evaluation=BatchedMembers(lm.model) if evaluation == "batched" else evaluation)
    scores_seen = []

    def inplace():
        scores_seen.append(lm.score(prompts, CANDIDATES))
        return choice_loss(scores_seen[-1])

    def batched(members):
        per_member = lm.score(prompts, CANDIDATES, members=len(members))
        scores_seen.extend(per_member)
        return [choice_loss(s) for s in per_member]

    results = [opt.step(batched if evaluation == "batched" else inplace) for _ in range(steps)]
    return results, scores_seen, opt


def loss_tolerance(lm, prompts, scores, rank: int) -> float:
    """Twice the float32 rounding bound of one member's loss, for two computations of it.

    A member's loss is a chain of reductions: the forward pass (``model_reduction_terms``), the
    candidate's token log-probabilities summed and averaged, the logsumexp over candidates and the
    mean over prompts. Both modes compute that chain; they differ in what is added to it:
    - weight-side: each perturbed weight is rounded once (p + a z: a product and a sum, 2 roundings),
      i.e. every product term of every reduction carries up to 2 more relative roundings;
    - batched: a perturbed matrix adds a second product chain (x A: the same length as x W^T, then
      r more terms through B^T) and one addition; a copied tensor is rounded once (p + delta).
    To first order this lengthens each reduction by at most max(2, r + 1) terms. A transformer layer
    has at most 12 reductions in its chain (q, k, v, o, scores, softmax, weighted sum, up, gate,
    down, two norms), and the embedding, final norm, head and log-softmax add 4.
    The magnitude: the loss is -(mean_0 - logsumexp(means)), so the rounding of two log-likelihoods
    of size |mean| enters it: 2 max|mean|.
    """
    cfg = lm.model.config
    layers = getattr(cfg, "num_hidden_layers", getattr(cfg, "n_layer", None))
    longest = max(len(lm.tokenizer(p + c)["input_ids"]) for p, cs in zip(prompts, CANDIDATES) for c in cs)
    if not hasattr(cfg, "hidden_size") or not hasattr(cfg, "num_attention_heads"):
        cfg.hidden_size, cfg.num_attention_heads = cfg.n_embd, cfg.n_head
    extra_per_reduction = max(2, rank + 1)
    extra = (12 * layers + 4) * extra_per_reduction + longest + max(map(len, CANDIDATES)) + len(prompts)
    magnitude = 2 * max(float(s.mean.abs().max()) for member in scores for s in member)
    return 2 * float32_rounding_bound(magnitude, model_reduction_terms(lm.model, longest) + extra)


@pytest.mark.parametrize("case", list(CASES))
def test_batched_members_compute_the_weight_side_estimator(case, tiny_tokenizer, tiny_mlm_tokenizer):
    lm_a, prompts, options = build(case, tiny_tokenizer, tiny_mlm_tokenizer)
    lm_b, _, _ = build(case, tiny_tokenizer, tiny_mlm_tokenizer)
    with torch.no_grad():
        unperturbed = choice_loss(lm_a.score(prompts, CANDIDATES))
    inplace, scores, _ = run_steps(lm_a, prompts, options, "inplace")
    batched, _, opt = run_steps(lm_b, prompts, options, "batched")
    tol = loss_tolerance(lm_a, prompts, scores, options.get("rank", 1))
    eps = options["eps"]
    perturbed = inplace[0].values[: 2 * options.get("n_spsa", 1)]  # HiZOO's last member is the unperturbed weights
    assert min(abs(v - unperturbed) for v in perturbed) > 2 * tol  # each member's perturbation shows
    for a, b in zip(inplace, batched):
        assert a.seeds == b.seeds and len(b.values) == opt.members_per_step
        for x, y in zip(a.values, b.values):
            assert abs(x - y) <= tol, (x, y, tol)
        if options.get("step_normalize") == "std":
            # g_j = d_j / (2 sigma): |d| moves by <= 2 tol, sigma (a population std) by <= tol,
            # so g moves by <= tol / sigma * (1 + |g|)
            for x, y in zip(a.projected_grads, b.projected_grads):
                assert abs(x - y) <= tol / a.spread * (1 + abs(x))
            continue
        # g = (l+ - l-) / (2 eps) (two-point) or (l_j - mean l) / eps (es): each moves by at most 2 tol / eps
        for x, y in zip(a.projected_grads, b.projected_grads):
            assert abs(x - y) <= 2 * tol / eps


def test_step_members_follow_the_engine_order():
    assert step_members([7, 8], "two_point") == [Member(0, 7, 1, 0), Member(1, 7, -1, 0), Member(2, 8, 1, 1),
                                                 Member(3, 8, -1, 1)]
    assert step_members([7, 8, 9], "es") == [Member(0, 7, 1, 0), Member(1, 8, 1, 1), Member(2, 9, 1, 2)]
    assert step_members([7], "one_point") == [Member(0, 7, 1, 0)]


def _scored_closure(lm, prompts):
    return lambda members: [choice_loss(s) for s in lm.score(prompts, CANDIDATES, members=len(members))]


@pytest.mark.parametrize("options", [dict(), dict(n_spsa=2, momentum=0.5), dict(n_spsa=3, estimator="es", adam=True),
                                     dict(estimator="one_point"), dict(weight_decay=0.1, n_spsa=2),
                                     dict(n_spsa=2, hessian_smooth=0.5)])
def test_batched_runs_replay_and_resume_bit_identically(options, tiny_tokenizer):
    def fresh():
        return LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)

    lm, ref, resumed = fresh(), fresh(), fresh()
    initial = [p.detach().clone() for p in lm.model.parameters()]
    make = lambda m: MeZO(m.model.parameters(), lr=1e-2, eps=1e-2, seed=5, member_evaluation=BatchedMembers(m.model), **options)
    opt = make(lm)
    for _ in range(6):
        opt.step(_scored_closure(lm, PROMPTS))
    moved = max(float((p - q).abs().max()) for p, q in zip(lm.model.parameters(), initial))
    assert moved > 1e-4
    assert opt.trajectory.header["member_evaluation"] == "batched"

    # replay from the initial weights: only the updates (no perturbation sweeps), bit for bit
    replay_trajectory(list(ref.model.parameters()), opt.trajectory)
    assert all(torch.equal(p, q) for p, q in zip(lm.model.parameters(), ref.model.parameters()))

    # pause after 3 steps, resume into a fresh optimizer: the same run
    first = make(resumed)
    for _ in range(3):
        first.step(_scored_closure(resumed, PROMPTS))
    state = first.state_dict()
    second = make(resumed)
    second.load_state_dict(state)
    for _ in range(3):
        second.step(_scored_closure(resumed, PROMPTS))
    assert all(torch.equal(p, q) for p, q in zip(lm.model.parameters(), resumed.model.parameters()))
    assert second.trajectory.values.tolist() == opt.trajectory.values.tolist()


def test_bf16_weights_stay_exact_in_the_batched_mode(tiny_tokenizer):
    """bf16 weights: a batched step at lr 0 leaves every weight as it was, bit for bit; the in-place sweeps,
    which would round them, are refused in one line; at lr > 0 the weights are the base plus the replayed
    updates, bit for bit."""
    def fresh():
        return LanguageModel(make_tiny_causal_lm(tiny_tokenizer).to(torch.bfloat16), tiny_tokenizer)

    base = fresh()
    before = [p.detach().clone() for p in base.model.parameters()]
    lm = fresh()
    with pytest.raises(ValueError, match="^MeZO cannot perturb bfloat16 weights in place: .*BatchedMembers"):
        MeZO(lm.model.parameters(), lr=0.0, eps=1e-3, n_spsa=2)
    opt = MeZO(lm.model.parameters(), lr=0.0, eps=1e-3, n_spsa=2, member_evaluation=BatchedMembers(lm.model))
    for _ in range(3):
        opt.step(_scored_closure(lm, PROMPTS))
    assert sum(int((p != q).sum()) for p, q in zip(lm.model.parameters(), before)) == 0

    for lr in (1e-3, 0.5):
        lm, ref = fresh(), fresh()
        opt = MeZO(lm.model.parameters(), lr=lr, eps=1e-2, n_spsa=2, member_evaluation=BatchedMembers(lm.model))
        for _ in range(4):
            opt.step(_scored_closure(lm, PROMPTS))
        assert any(not torch.equal(p, q) for p, q in zip(lm.model.parameters(), before))
        replay_trajectory(list(ref.model.parameters()), opt.trajectory)
        assert all(torch.equal(p, q) for p, q in zip(lm.model.parameters(), ref.model.parameters()))


def test_a_closure_with_the_wrong_count_gets_one_line_and_the_weights_are_untouched(tiny_causal_lm):
    model, tok = tiny_causal_lm
    lm = LanguageModel(model, tok)
    before = [p.detach().clone() for p in model.parameters()]
    opt = MeZO(model.parameters(), n_spsa=2, member_evaluation=BatchedMembers(model))
    with pytest.raises(ValueError, match=r"^the batched closure returned 3 values for 4 members; "
                                         r"it must return one per member \(4\)$"):
        opt.step(lambda members: [0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match=r"must return 4 values, one per member; got float$"):
        opt.step(lambda members: 1.0)
    with pytest.raises(ValueError, match="model.embed_tokens got 3 rows for 4 members; every forward pass"):
        opt.step(lambda members: [choice_loss(lm.score(PROMPTS[:2], CANDIDATES[:2]))] * 4)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert opt.trajectory.status.tolist() == [2, 2, 2]  # aborted, and a replay has nothing to repeat
    replay_trajectory([b.clone().requires_grad_() for b in before], opt.trajectory)


def test_fitness_turns_batched_objects_into_losses(tiny_causal_lm):
    model, tok = tiny_causal_lm
    lm = LanguageModel(model, tok)
    twin = make_tiny_causal_lm(tok)
    twin_lm = LanguageModel(twin, tok)
    seen = []

    def fitness(objects):
        seen.append(len(objects))
        return [choice_loss(s) for s in objects]

    opt = MeZO(model.parameters(), lr=1e-2, eps=1e-2, n_spsa=2, member_evaluation=BatchedMembers(model))
    ref = MeZO(twin.parameters(), lr=1e-2, eps=1e-2, n_spsa=2, member_evaluation=BatchedMembers(twin))
    res = opt.step(lambda members: lm.score(PROMPTS, CANDIDATES, members=len(members)), fitness=fitness)
    ref_res = ref.step(_scored_closure(twin_lm, PROMPTS))
    assert seen == [4] and res.values == ref_res.values
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))


def test_what_the_batched_mode_cannot_serve_is_refused_in_one_line(tiny_causal_lm):
    model, _ = tiny_causal_lm
    with pytest.raises(ValueError, match=r"perturbs embeddings \(model\.embed_tokens\.weight\) activation-side, "
                                         r"which needs noise='lowrank' \(got 'gaussian'\); or use member_evaluation='inplace'"):
        MeZO(model.parameters(), noise="gaussian", member_evaluation=BatchedMembers(model))
    for name, p in model.named_parameters():  # matrices only, element-wise noise: M full copies
        p.requires_grad_("proj" in name)
    with pytest.raises(ValueError, match=r"would keep 2 perturbed copies of .* use noise='lowrank'"):
        MeZO(model.parameters(), noise="gaussian", member_evaluation=BatchedMembers(model))
    with pytest.raises(ValueError, match="needs the model the parameters belong to"):
        MeZO(model.parameters(), member_evaluation="batched").step(lambda members: [0.0, 0.0])
    with pytest.raises(TypeError, match="an nn.Module"):
        BatchedMembers(model.parameters())
    other = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="is not a parameter of the module given"):
        MeZO([*model.parameters(), other], member_evaluation=BatchedMembers(model))


# ---------------------------------------------------------------------------- the model side
def test_members_replicate_the_batch_and_chunks_hold_whole_member_blocks(tiny_causal_lm):
    """Without a perturbation every member sees the plain model: each member's scores and texts are
    the plain call's, whatever the chunking; sampling uses common random numbers across members."""
    model, tok = tiny_causal_lm
    five = PROMPTS + ["the acting was"]
    cands = CANDIDATES + [[" bad", " good ."]]
    for batch_size in (2, 16):
        lm = LanguageModel(model, tok, batch_size=batch_size)
        with torch.no_grad():
            plain = lm.score(five, cands)
            members = lm.score(five, cands, members=3)
        assert len(members) == 3
        for member in members:
            for s, ref in zip(member, plain):
                torch.testing.assert_close(s.sum, ref.sum, atol=1e-5, rtol=0)
        for kw in (dict(), dict(do_sample=True, seed=11, temperature=2.0)):
            texts = lm.generate(five, max_new_tokens=6, members=3, **kw)
            assert texts == [lm.generate(five, max_new_tokens=6, **kw)] * 3
    with pytest.raises(ValueError, match="members must be a positive integer"):
        lm.generate(five, members=0)


def test_sampled_generation_of_members_equals_the_weight_side_members(tiny_tokenizer):
    """Each member's sampled completions in one batched decode (KV cache, member-major rows) are the
    completions the in-place mode samples for that member: same perturbation, same random numbers."""
    texts = {}
    for evaluation in ("inplace", "batched"):
        lm = LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer, batch_size=3)
        opt = MeZO(lm.model.parameters(), lr=0.0, eps=0.5, n_spsa=2, seed=1,
                   member_evaluation=BatchedMembers(lm.model) if evaluation == "batched" else evaluation)
        got = []
        gen = dict(max_new_tokens=8, do_sample=True, seed=4, temperature=1.5)
        if evaluation == "batched":
            opt.step(lambda members: (got.extend(lm.generate(PROMPTS, members=len(members), **gen)), [0.0] * 4)[1])
        else:
            opt.step(lambda: (got.append(lm.generate(PROMPTS, **gen)), 0.0)[1])
        texts[evaluation] = got
    assert texts["batched"] == texts["inplace"]
    assert len({tuple(t) for t in texts["batched"]}) > 1  # the members' perturbations changed the samples


# ---------------------------------------------------------------------------- M = 2, 8, 32; generic modules
@pytest.mark.parametrize("form", ["cpu", "direct"])
@pytest.mark.parametrize("n_spsa", [1, 4, 16])
def test_batched_members_match_the_weight_side_members_at_every_M(tiny_tokenizer, monkeypatch, form, n_spsa):
    """M = 2, 8, 32 members (low-rank matrices, biases, norm gains, the tied embedding), each product form:
    every member's loss within the float32 bound of the in-place member's (the central test's bound)."""
    from mezo_rl.engine.population import PRODUCT_FORMS

    if form == "direct":
        monkeypatch.setitem(PRODUCT_FORMS, "cpu", "direct")
    options = dict(noise="lowrank", n_spsa=n_spsa, eps=0.3)
    make = lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer, attention_bias=True), tiny_tokenizer, batch_size=3)
    lm_a, lm_b = make(), make()
    inplace, scores, _ = run_steps(lm_a, PROMPTS, options, "inplace", steps=1)
    batched, _, opt = run_steps(lm_b, PROMPTS, options, "batched", steps=1)
    tol = loss_tolerance(lm_a, PROMPTS, scores, 1)
    assert len(batched[0].values) == 2 * n_spsa == opt.members_per_step
    assert max(abs(x - y) for x, y in zip(inplace[0].values, batched[0].values)) <= tol
    assert len(set(batched[0].values)) == 2 * n_spsa  # every member saw its own perturbation


class Tilt(torch.nn.Module):
    """Not a norm: the final norm's output tilted by a trainable vector (batched under torch.func.vmap)."""

    def __init__(self, norm):
        super().__init__()
        self.norm = norm
        self.tilt = torch.nn.Parameter(torch.linspace(-0.5, 0.5, norm.weight.shape[0]))

    def forward(self, x):
        return self.norm(x) * (1 + torch.tanh(self.tilt))


class TiltItem(Tilt):
    """The same, reading a Python number off its tensor (what vmap cannot batch: one call per member)."""

    def forward(self, x):
        return self.norm(x) * (1 + torch.tanh(self.tilt) * float(self.tilt.abs().max() > 0))


@pytest.mark.parametrize("kind", [Tilt, TiltItem])
def test_other_modules_with_trainable_tensors_evaluate_every_member(tiny_tokenizer, kind):
    def make():
        model = make_tiny_causal_lm(tiny_tokenizer)
        model.model.norm = kind(model.model.norm)
        for name, p in model.named_parameters():
            p.requires_grad_(name.endswith("tilt"))
        return LanguageModel(model, tiny_tokenizer, batch_size=3)

    options = dict(noise="gaussian", n_spsa=2, eps=1.0)
    lm_a, lm_b = make(), make()
    inplace, scores, _ = run_steps(lm_a, PROMPTS, options, "inplace", steps=1)
    batched, _, opt = run_steps(lm_b, PROMPTS, options, "batched", steps=1)
    tol = loss_tolerance(lm_a, PROMPTS, scores, 1)
    assert max(abs(x - y) for x, y in zip(inplace[0].values, batched[0].values)) <= tol
    assert len(set(batched[0].values)) == 4
    plan = opt.member_evaluation.plan
    assert plan._vmappable.get(lm_b.model.model.norm, True) is (kind is Tilt)  # vmap, or per member where it cannot


def test_the_pass_assigns_module_attributes_and_puts_every_one_back(tiny_tokenizer):
    """One way in for every module kind (an attribute assigned for the pass: ``forward``, or ``member_params``
    for the prefix), and out again: after a step, inside ``members.paused()`` and after a closure that raised,
    each module holds the instance attributes it held before, nothing more."""
    lm = LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer, batch_size=3)
    apply_peft(lm, "prefix")
    for name, p in lm.model.named_parameters():  # the prefix (member_params), the final norm (generic), the head
        p.requires_grad_(p.requires_grad or bool(re.search(FINAL_NORM, name)) or name.endswith("q_proj.weight"))
    own = {m: dict(m.__dict__) for m in lm.model.modules()}

    def unchanged():
        return all(set(m.__dict__) == set(before) and all(m.__dict__[k] is before[k] for k in before
                                                          if k not in ("_parameters", "_buffers", "_modules"))
                   for m, before in own.items())

    seen = {}
    opt = MeZO([p for p in lm.model.parameters() if p.requires_grad], lr=1e-2, seed=3, noise="gaussian",
               member_evaluation=BatchedMembers(lm.model))

    def closure(members):
        seen["forward"] = sorted(type(m).__name__ for m in lm.model.modules() if "forward" in m.__dict__)
        seen["member_params"] = [type(m).__name__ for m in lm.model.modules() if getattr(m, "member_params", None)]
        with members.paused():
            seen["paused"] = unchanged()
        return [choice_loss(s) for s in lm.score(PROMPTS, CANDIDATES, members=len(members))]

    opt.step(closure)
    assert "Linear" in seen["forward"] and any(n.endswith("RMSNorm") for n in seen["forward"])
    assert set(seen["member_params"]) == {"PrefixKV"} and seen["paused"] and unchanged()

    def raising(members):
        lm.score(PROMPTS, CANDIDATES, members=len(members))
        raise RuntimeError("the reward failed")

    with pytest.raises(RuntimeError, match="the reward failed"):
        opt.step(raising)
    assert unchanged()
