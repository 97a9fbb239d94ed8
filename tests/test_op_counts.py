"""Op counts: a MeZO step costs what its rows cost, counted in dispatched aten ops (mezo_rl.opcount).

On a GPU a small model's step is bound by kernel launches, one (at least) per dispatched op, so the ops of a
step next to the ops of plain inference on the same rows predict their time ratio there (docs/engine.md,
"How members are batched"); the count is the same on every device, so it is tested here on a CPU.

The population part: the members' forward passes (the closure of a batched step: the decode or the
scoring of M x B rows with every member's perturbation) against plain inference of the same M x B rows,
for both forms of the members' product (``PRODUCT_FORMS``: the CPU's and every other device's). What
these ratios cover: the forward passes only. The step's noise draw and update, a fixed cost per step
and trainable tensor (mezo_rl.engine.noise / optim), are counted apart and not bounded here.
"""
from __future__ import annotations

import pytest
import torch

from conftest import make_tiny_causal_lm
from mezo_rl.engine.optim import MeZO
from mezo_rl.engine.population import BatchedMembers, PRODUCT_FORMS
from mezo_rl.model.lm import LanguageModel
from mezo_rl.opcount import OpCounter

PROMPTS = ["It was great . the movie", "Does this mean that the", "the cat sat on the", "so because the sun rose"]
CANDIDATES = [[" good", " bad ."], [" Yes", " No"], [" mat", " park"], [" early", " went"]]
#: the issue's bound: a population's forward passes dispatch at most this many times plain inference's ops
POPULATION_BOUND = 1.3


@pytest.fixture(params=["cpu", "direct"])
def form(request, monkeypatch):
    """Each form of the members' product: the CPU's own, and the one every other device uses."""
    if request.param == "direct":
        monkeypatch.setitem(PRODUCT_FORMS, "cpu", "direct")
    return request.param


def counts(lm, M, what, distinct=True):
    """(plain ops on M x B rows, the members' ops in a batched step's closure, the whole step's ops).
    ``distinct``: plain inference's rows differ (score() would share one row among equal inputs)."""
    gen = dict(max_new_tokens=6)  # stops at EOS only
    lm.batch_size = M * len(PROMPTS)  # one forward per decoding step, as the members' pass
    rows = [f"{p} {k}" for k in range(M) for p in PROMPTS] if distinct else PROMPTS * M
    with torch.no_grad():  # what the model builds once and keeps (the decode's cached tensors) is not a step's cost
        lm.generate(PROMPTS, **gen) if what == "generate" else lm.score(PROMPTS, CANDIDATES)
    with OpCounter() as plain, torch.no_grad():
        if what == "generate":
            lm.generate(rows, **gen)
        else:
            lm.score(rows, CANDIDATES * M)
    lm.batch_size = len(PROMPTS)
    inner = OpCounter()

    def closure(members):
        inner.reset()
        with inner:
            if what == "generate":
                lm.generate(PROMPTS, members=len(members), **gen)
            else:
                lm.score(PROMPTS, CANDIDATES, members=len(members))
        return [0.0] * len(members)

    opt = MeZO(lm.model.parameters(), lr=0.0, eps=1e-3, n_spsa=M // 2, noise_backend="torch",
               member_evaluation=BatchedMembers(lm.model))
    opt.step(closure)
    with OpCounter() as step:
        opt.step(closure)
    counts.last = inner.counts.copy()
    return plain.total, inner.total, step.total


#: a noise sample's low-rank draw: two flat generator draws, B's and A's (mezo_rl.engine.noise._Draw)
DRAW_OPS_PER_SAMPLE = 2


def test_a_population_decode_costs_its_rows_flat_in_M(tiny_tokenizer, form):
    lm = LanguageModel(make_tiny_causal_lm(tiny_tokenizer, attention_bias=True), tiny_tokenizer)
    extra, fixed = {}, {}
    for M in (2, 8, 32):
        plain, members, step = counts(lm, M, "generate", distinct=False)
        assert members <= POPULATION_BOUND * plain, (M, members, plain)
        assert step > members  # the draw and the update are outside the closure
        extra[M], fixed[M] = members - plain, step - members
    # flat in M: the members add the same number of ops over plain inference of their rows at every M
    # (what grows with M, per-row work of building the batch, both sides do alike)
    assert extra[2] == extra[8] == extra[32] > 0
    # the step's own work (the members' factors, stacked once and viewed per tensor; the update) grows with M
    # only by each new sample's draw
    assert fixed[8] - fixed[2] <= DRAW_OPS_PER_SAMPLE * (8 - 2) // 2
    assert fixed[32] - fixed[8] <= DRAW_OPS_PER_SAMPLE * (32 - 8) // 2


#: score(..., members=M) returns one list of CandidateScores per member: per member, its values are split
#: out of the batch and indexed into place (mezo_rl.model.scoring), a few ops each, whatever the model
RESULT_OPS_PER_MEMBER = 8


def test_a_population_scoring_costs_its_rows(tiny_tokenizer, form):
    lm = LanguageModel(make_tiny_causal_lm(tiny_tokenizer, attention_bias=True), tiny_tokenizer)
    extra = {}
    for M in (2, 8, 32):
        plain, members, _ = counts(lm, M, "score")
        assert members <= POPULATION_BOUND * plain, (M, members, plain)
        extra[M] = members - plain
    # the forward pass adds a fixed number of ops; only the per-member results grow with M
    assert 0 < extra[32] - extra[2] <= RESULT_OPS_PER_MEMBER * (32 - 2)


def test_the_members_ops_grow_with_the_layers_as_plain_inference_does(tiny_tokenizer):
    """Twice the layers (twice the trainable tensors): one scoring pass's members add at most the bound
    times what plain inference adds, on every device's form; the CPU's form costs one view op more per
    linear layer (the transposed product's input), which is all that separates the two."""
    grow = {}
    for form in ("cpu", "direct"):
        PRODUCT_FORMS_BEFORE = dict(PRODUCT_FORMS)
        if form == "direct":
            PRODUCT_FORMS["cpu"] = "direct"
        try:
            got = {}
            for layers in (2, 4):
                lm = LanguageModel(make_tiny_causal_lm(tiny_tokenizer, num_hidden_layers=layers), tiny_tokenizer)
                got[layers] = (*counts(lm, 8, "score")[:2], counts.last["aten.bmm"])  # one bmm per linear call
        finally:
            PRODUCT_FORMS.clear()
            PRODUCT_FORMS.update(PRODUCT_FORMS_BEFORE)
        (p2, m2, calls2), (p4, m4, calls4) = got[2], got[4]
        grow[form] = (p4 - p2, m4 - m2, calls4 - calls2)
        assert m4 / p4 <= POPULATION_BOUND
    assert grow["direct"][1] <= POPULATION_BOUND * grow["direct"][0]
    assert grow["cpu"][0] == grow["direct"][0] and grow["cpu"][2] == grow["direct"][2] > 0
    assert grow["cpu"][1] - grow["direct"][1] == grow["cpu"][2]


#: what HiZOO adds to each noise sample's draw: its B and A scaled by the curvature's inverse root (two products)
SCALE_OPS_PER_SAMPLE = 2


def test_hizoo_adds_ops_that_grow_with_neither_the_tensors_nor_the_members_but_for_each_draws_scale(tiny_tokenizer):
    """HiZOO (``hessian_smooth``): one more member in the same batched pass (flat in M, as any member), the
    curvature's update over two flat vectors (a fixed count), and each sample's draw scaled (two products).
    Its step's ops over plain MeZO's are the same for 2 and 4 layers, and grow from 2 to 32 members only by
    the draws' scales."""
    added = {}
    for layers in (2, 4):
        lm = LanguageModel(make_tiny_causal_lm(tiny_tokenizer, num_hidden_layers=layers), tiny_tokenizer)
        for M in (2, 32):
            steps = {}
            for hs in (0.0, 0.01):
                def closure(members):
                    lm.generate(PROMPTS, members=len(members), max_new_tokens=4)
                    return [float(k) for k in range(len(members))]  # differing losses: the curvature moves

                opt = MeZO(lm.model.parameters(), lr=0.0, eps=1e-3, n_spsa=M // 2, noise_backend="torch",
                           member_evaluation=BatchedMembers(lm.model), hessian_smooth=hs)
                opt.step(closure)
                with OpCounter() as step:
                    opt.step(closure)
                steps[hs] = step.total
            added[layers, M] = steps[0.01] - steps[0.0]
    assert added[2, 2] == added[4, 2] > 0 and added[2, 32] == added[4, 32]
    assert added[2, 32] - added[2, 2] <= SCALE_OPS_PER_SAMPLE * (32 - 2) // 2

