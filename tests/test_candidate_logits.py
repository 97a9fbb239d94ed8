"""Scoring only what the objective needs: ``LanguageModel.score(..., log_softmax=False)``.

Where every candidate of an example is one token read at the same position, and the objective only
compares an example's candidates (accuracy, the cross-entropy over candidates), the model computes
those candidates' logits there and never the vocabulary-wide logits. The objective's values must equal
the full path's within a float32 bound derived below, the accuracy must be identical, and everything
else (one candidate, multi-token candidates) must still be scored as log-likelihoods.
"""
import pytest
import torch

from mezo_rl import rewards
from mezo_rl import tasks
from conftest import FLOAT32_UNIT_ROUNDOFF, float32_rounding_bound
from mezo_rl.model.lm import LanguageModel
from mezo_rl.model.scoring import MASK
from mezo_rl.training.outputs import model_outputs, objective_outputs, score_requests

SINGLE = [["Yes or No ?", [" Yes", " No"]], ["the sun rose early . It was", [" a", " b", " c"]],
          ["Suppose we can infer that the cat sat on the mat . Yes , No , or Maybe ?", [" Yes", " No", " Maybe"]]]
MULTI = [["the movie was good and the acting was bad . It was", [" great", " terrible"]],
         ["the sun rose early and the people", [" sat"]],  # one candidate: a teacher-forced NLL
         ["Yes or No ?", [" Yes"]]]  # one single-token candidate: its NLL needs the normaliser


def _freeze_all_but_final_norm(model):
    for name, p in model.named_parameters():
        p.requires_grad_(name == "model.norm.weight")


class head_calls:
    """Within the block, ``rows`` grows by the number of rows each time vocabulary-wide logits are computed.
    (It wraps the model's logits step rather than hooking the head: a hooked head is not a plain linear
    map any more, and the candidate path honours hooks by reading the full logits.)"""

    def __init__(self, lm):
        self.lm, self.rows = lm, []

    def __enter__(self):
        inner = self.lm._logits

        def counted(hidden):
            self.rows.append(hidden.reshape(-1, hidden.shape[-1]).shape[0])
            return inner(hidden)

        self.lm._logits = counted
        return self.rows

    def __exit__(self, *exc):
        del self.lm._logits


def candidate_bound(lm, prompt: str, cands: list[str]) -> float:
    """A worst-case bound on |relative score difference - log-probability difference| for one example.

    Both paths compute a candidate's logit l_c as a dot product of H float32 terms (the full path inside
    the head's matrix product, the candidate path as h . W[c]): each within gamma_H * S_c of the exact
    value, S_c = sum_i |h_i W_ci| (Higham eq. 3.5), hence within 2 gamma_H S_c of each other. The full
    path also subtracts the log-sum-exp (one computed value, the same for every candidate of the row, so
    its own error cancels in any difference), each subtraction rounding by at most u (|l_c| + |lse|).
    A difference of two candidates' scores thus differs between the paths by at most twice the largest
    per-candidate error. The scorer's position is the prompt's last token (single-token candidates of a
    causal LM), whose final hidden state is ``lm.features``."""
    h = lm.features([prompt])[0].double()
    ids = [lm.tokenizer(c, add_special_tokens=False)["input_ids"][0] for c in cands]
    w = lm._head.weight.detach().double()
    logits = w @ h
    S = (w[ids].abs() @ h.abs())
    lse = torch.logsumexp(logits, 0)
    H = h.numel()
    per_cand = [2 * float32_rounding_bound(s, H) + FLOAT32_UNIT_ROUNDOFF * float(abs(l) + abs(lse))
                for s, l in zip(S, logits[ids])]
    return 2 * max(per_cand)


def objective_bound(diff_bound: float, scores, n: int) -> float:
    """|cross-entropy over candidates (relative) - the same (full)| for one example whose candidate score
    differences agree within ``diff_bound``: -log_softmax(m)[y] is 1-Lipschitz in the max-norm of the
    differences m_c - m_y, and each computation of it (n candidates: a max, n subtractions, a sum of n
    exponentials, a log) rounds within gamma_{n+3} of the magnitudes it handles, in both paths."""
    magnitude = max(float(s.abs().max()) for s in scores) + 1.0
    return diff_bound + 2 * float32_rounding_bound(magnitude, n + 3)


@pytest.mark.parametrize("cached", [False, True], ids=["full forward", "trunk cache"])
@pytest.mark.parametrize("members", [None, 2])
def test_single_token_candidates_skip_the_vocabulary_logits_and_keep_every_difference(tiny_causal_lm, cached, members):
    model, tok = tiny_causal_lm
    lm = LanguageModel(model, tok)
    if cached:
        _freeze_all_but_final_norm(model)
        assert lm.enable_trunk_cache()
    prompts, cands = [p for p, _ in SINGLE], [c for _, c in SINGLE]
    assert all(len(tok(c, add_special_tokens=False)["input_ids"]) == 1 for cs in cands for c in cs)
    with torch.no_grad():
        full = lm.score(prompts, cands, members=members)
        with head_calls(lm) as rows:
            rel = lm.score(prompts, cands, members=members, log_softmax=False)
    assert rows == []  # no vocabulary-wide logits at all: only the candidates' rows of the head
    for f_member, r_member in zip(*(([x] if members is None else x) for x in (full, rel))):
        for p, cs, f, r in zip(prompts, cands, f_member, r_member):
            assert f.log_softmax and not r.log_softmax
            assert torch.equal(r.n_tokens, f.n_tokens) and torch.equal(r.sum, r.mean)
            bound = candidate_bound(lm, p, cs)
            torch.testing.assert_close(r.sum - r.sum[0], f.sum - f.sum[0], atol=bound, rtol=0)
            assert torch.equal(r.mean.argmax(), f.mean.argmax())
            # the shift is the log-sum-exp over the vocabulary: one constant for the example
            shift = (r.sum - f.sum)
            assert float(shift.max() - shift.min()) <= bound


def test_other_examples_still_take_the_full_path(tiny_causal_lm):
    model, tok = tiny_causal_lm
    lm = LanguageModel(model, tok)
    prompts, cands = [p for p, _ in SINGLE + MULTI], [c for _, c in SINGLE + MULTI]
    with torch.no_grad():
        full = lm.score(prompts, cands)
        with head_calls(lm) as rows:
            rel = lm.score(prompts, cands, log_softmax=False)
    # vocabulary logits only for the MULTI examples' distinct scored positions
    positions = {(tuple(ids), pos) for p, cs in MULTI for c in cs for ids, ps, _ in [lm.encode(p, c)] for pos in ps}
    assert sum(rows) == len(positions)
    for (p, cs), f, r in zip(SINGLE + MULTI, full, rel):
        relative = [p, cs] in SINGLE
        assert r.log_softmax is not relative
        if not relative:  # log-likelihoods: the full path's values, within the rounding of a dot product
            longest = max(len(tok(p + c)["input_ids"]) for c in cs)
            torch.testing.assert_close(r.sum, f.sum, atol=4 * float32_rounding_bound(
                float(f.sum.abs().max()) + 1.0, model.config.hidden_size + model.config.vocab_size + longest), rtol=0)
            assert bool((r.sum <= 0).all())


def test_masked_lm_single_token_candidates(tiny_masked_lm):
    model, tok = tiny_masked_lm
    lm = LanguageModel(model, tok)
    prompts = [f"Yes or No ? {MASK} .", f"the cat sat on the mat . {MASK}"]
    cands = [[" Yes", " No"], [" Yes", " No", " Maybe"]]
    with torch.no_grad():
        full, rel = lm.score(prompts, cands), lm.score(prompts, cands, log_softmax=False)
    for f, r in zip(full, rel):
        assert not r.log_softmax and torch.equal(r.mean.argmax(), f.mean.argmax())
        # the masked LM's head is not a plain linear map: the logits are read off its full output, so the
        # only difference is the subtraction of one log-sum-exp (one rounding per candidate)
        bound = 2 * FLOAT32_UNIT_ROUNDOFF * float(f.sum.abs().max() + r.sum.abs().max())
        torch.testing.assert_close(r.sum - r.sum[0], f.sum - f.sum[0], atol=bound, rtol=0)
    with pytest.raises(TypeError, match=r"^LanguageModel\.score\(\.\.\., normalised=\.\.\.\) is now "
                                        r"LanguageModel\.score\(\.\.\., log_softmax=\.\.\.\)$"):
        lm.score(prompts, cands, normalised=False)


def test_objective_declares_what_the_model_may_skip():
    assert rewards.get_reward("accuracy").shift_invariant
    with pytest.raises(TypeError, match=r"^register_reward\(\.\.\., normaliser_invariant=\.\.\.\) is now "
                                        r"register_reward\(\.\.\., shift_invariant=\.\.\.\)$"):
        rewards.register_reward("renamed_test", needs="scores", normaliser_invariant=True)
    assert rewards.get_reward("cross_entropy").shift_invariant
    assert rewards.build_objective(["accuracy", "cross_entropy"]).shift_invariant
    assert not rewards.build_objective("squad_f1").shift_invariant  # no score reward: nothing to skip

    @rewards.register_reward("gold_logprob_test", needs="scores")
    def gold_logprob(prompts, candidate_scores, labels, **columns):
        return [float(s.sum[y]) for s, y in zip(candidate_scores, labels)]

    try:  # a reward that reads true log-likelihoods keeps the normaliser, for the whole objective
        assert not rewards.get_reward("gold_logprob_test").shift_invariant
        assert not rewards.build_objective(["accuracy", "gold_logprob_test"]).shift_invariant
    finally:
        rewards.unregister_reward("gold_logprob_test")


SCORING_TASKS = [n for n in tasks.list_tasks() if tasks.get_task(n).kind in ("classification", "multiple_choice")]


@pytest.mark.slow
def test_every_scoring_task_objective_agrees_with_the_full_path(shared_data_dir):
    """SmolLM2-135M, 8 validation (else train) examples of every built-in scoring task, the norm mode's
    trunk cache: accuracy and cross-entropy through the training path (objective_outputs), relative vs full."""
    from mezo_rl.model.loading import load_model

    lm = load_model("smollm2-135m")
    _freeze_all_but_final_norm(lm.model)
    assert lm.enable_trunk_cache()
    objective = rewards.build_objective(["accuracy", "cross_entropy"])
    assert objective.shift_invariant
    n_relative = 0
    for name in SCORING_TASKS:
        task = tasks.get_task(name)
        try:
            examples = task.load_split("validation", data_dir=shared_data_dir, n=8, seed=0)
        except Exception:
            examples = task.load_split("train", data_dir=shared_data_dir, n=8, seed=0)
        with torch.no_grad():
            full = model_outputs(lm, examples, {"scores"})
            rel = model_outputs(lm, examples, {"scores"}, log_softmax=False)
            got = objective_outputs(lm, objective, examples)  # the training path: relative where it may
        want = objective.evaluate(**full.as_kwargs())
        assert got.values["accuracy"] == want.values["accuracy"], name  # identical, example by example
        prompts, cands, _ = score_requests(examples, lm.is_causal)
        for i, (f, r) in enumerate(zip(full.candidate_scores, rel.candidate_scores)):
            if r.log_softmax:  # multi-token or per-position candidates: the full path
                assert float((r.sum - f.sum).abs().max()) <= 4 * float32_rounding_bound(
                    float(f.sum.abs().max()) + 1.0, lm.model.config.hidden_size + lm.model.config.vocab_size), name
                continue
            n_relative += 1
            bound = objective_bound(candidate_bound(lm, prompts[i], cands[i]), [f.mean, r.mean], len(cands[i]))
            ce_got, ce_want = got.values["cross_entropy"][i], want.values["cross_entropy"][i]
            assert abs(ce_got - ce_want) <= bound, (name, i, ce_got, ce_want, bound)
    assert n_relative > 0  # SST-2's, SST-5's, ... single-token label words took the candidate path
