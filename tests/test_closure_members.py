"""The engine hands out members (issue 69): in both evaluation modes the closure is given the step's
:class:`~mezo_rl.engine.population.Members` (``Member(index, seed, sign, sample)`` descriptors), one at a time
in place and all at once batched, so one ``closure(members)`` serves both modes, and the trainer's one closure
needs nothing of the optimizer's configuration."""
from __future__ import annotations

import pathlib

import pytest
import torch

from conftest import make_tiny_causal_lm
from mezo_rl.engine.optim import MeZO, replay_trajectory
from mezo_rl.engine.population import BatchedMembers, Member, Members, step_members, takes_members
from mezo_rl.model.lm import LanguageModel
from test_population import CANDIDATES, PROMPTS, choice_loss, loss_tolerance
from test_beta import args_for, registered, trainer as prompt_trainer  # noqa: F401 (registered: a fixture)
from test_trainer import make_args, splits

OPTIONS = {"two-point n=2": dict(n_spsa=2), "es n=3": dict(n_spsa=3, estimator="es"),
           "one-point": dict(estimator="one_point"), "HiZOO n=2": dict(n_spsa=2, hessian_smooth=0.5),
           "momentum n=2": dict(n_spsa=2, momentum=0.5)}
pytestmark = pytest.mark.usefixtures("one_thread")


def scored(lm, seen, scores):
    """A closure written once for both modes: member k's loss from block k of ``lm.score(..., members=M)``."""
    def closure(members):
        seen.append(members)
        per_member = lm.score(PROMPTS, CANDIDATES, members=len(members))
        scores.extend(per_member)
        return [choice_loss(s) for s in per_member]
    return closure


def run(lm, evaluation, options, steps=2):
    opt = MeZO(lm.model.parameters(), lr=1e-2, eps=0.3, seed=4, noise_backend="torch", **options,
               member_evaluation=BatchedMembers(lm.model) if evaluation == "batched" else evaluation)
    seen, scores = [], []
    results = [opt.step(scored(lm, seen, scores)) for _ in range(steps)]
    return results, seen, scores, opt


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_one_closure_gets_the_same_members_in_both_modes(options, tiny_tokenizer):
    """The same step seeds give the same descriptors (seeds, signs, indices, samples) in the same order: in place
    one member a call, the weights perturbed for it; batched all of them in one call. The closure's losses agree
    within float32 rounding, and each run replays bit for bit."""
    lms = {mode: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer) for mode in ("inplace", "batched")}
    initial = [p.detach().clone() for p in lms["inplace"].model.parameters()]
    runs = {mode: run(lm, mode, options) for mode, lm in lms.items()}
    (inplace, calls, scores, opt), (batched, batches, _, _) = runs["inplace"], runs["batched"]
    M = opt.members_per_step
    assert len(calls) == 2 * M and len(batches) == 2
    assert all(isinstance(c, Members) and len(c) == 1 and not c.batched for c in calls)
    assert all(isinstance(b, Members) and len(b) == M and b.batched for b in batches)
    for step, (res_a, res_b) in enumerate(zip(inplace, batched)):
        one_by_one = [c[0] for c in calls[step * M:(step + 1) * M]]
        assert one_by_one == list(batches[step]) == step_members(res_a.seeds, opt.config["estimator"],
                                                                 center=bool(options.get("hessian_smooth")))
        assert [m.index for m in one_by_one] == list(range(M)) and res_a.seeds == res_b.seeds
        tol = loss_tolerance(lms["inplace"], PROMPTS, scores, 1)
        assert max(abs(x - y) for x, y in zip(res_a.values, res_b.values)) <= tol
    for mode, lm in lms.items():
        replayed = [p.clone().requires_grad_(q.requires_grad) for p, q in zip(initial, lm.model.parameters())]
        replay_trajectory(replayed, runs[mode][-1].trajectory)
        assert all(torch.equal(a, b) for a, b in zip(replayed, lm.model.parameters()))


def test_a_members_closure_in_place_follows_the_plain_closure_bit_for_bit(tiny_tokenizer):
    """In place, ``closure(members)`` (one member a call) and torch.optim's ``closure()`` step alike, bit for bit."""
    lm_a = LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)
    lm_b = LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)
    plain = MeZO(lm_a.model.parameters(), lr=1e-2, eps=0.3, seed=2, n_spsa=2, noise_backend="torch")
    members = MeZO(lm_b.model.parameters(), lr=1e-2, eps=0.3, seed=2, n_spsa=2, noise_backend="torch")
    for _ in range(2):
        res_a = plain.step(lambda: choice_loss(lm_a.score(PROMPTS, CANDIDATES)))
        res_b = members.step(lambda ms: [choice_loss(lm_b.score(PROMPTS, CANDIDATES))])
        assert res_a.values == res_b.values and res_a.projected_grads == res_b.projected_grads
    assert all(torch.equal(a, b) for a, b in zip(lm_a.model.parameters(), lm_b.model.parameters()))
    assert plain.trajectory.seeds.tolist() == members.trajectory.seeds.tolist()


def test_paused_reads_the_weights_in_place(tiny_tokenizer):
    """``members.paused()``: batched, the members' perturbations lifted (the scores at theta, whatever the member);
    in place a block that changes nothing (the member's perturbation is in the weights)."""
    lm = LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)
    for evaluation in ("inplace", "batched"):
        # read before each step: an in-place round trip on float32 weights may leave an ulp behind, by CPU
        with torch.no_grad():
            at_theta = choice_loss(lm.score(PROMPTS, CANDIDATES))
        opt = MeZO(lm.model.parameters(), lr=0.0, eps=0.3, noise_backend="torch",
                   member_evaluation=BatchedMembers(lm.model) if evaluation == "batched" else evaluation)
        got = []

        def closure(members):
            own = [choice_loss(s) for s in lm.score(PROMPTS, CANDIDATES, members=len(members))]
            with members.paused():
                got.append((own, choice_loss(lm.score(PROMPTS, CANDIDATES))))
            return own

        opt.step(closure)
        for own, paused in got:
            if evaluation == "batched":
                assert paused == at_theta and all(v != at_theta for v in own)
            else:
                assert paused == own[0] != at_theta


def test_which_closures_are_handed_members():
    assert takes_members(lambda members: 0.0) and takes_members(lambda ms, /: 0.0)
    assert not takes_members(lambda: 0.0) and not takes_members(lambda members=None: 0.0)
    assert not takes_members(lambda *args: 0.0) and not takes_members(print)  # print: a builtin, read as closure()
    m = Members([Member(0, 7, 1, 0)])
    assert m == (Member(0, 7, 1, 0),) and not m.batched
    with m.paused():
        pass


def test_an_in_place_members_closure_with_the_wrong_count_gets_one_line(tiny_tokenizer):
    model = make_tiny_causal_lm(tiny_tokenizer)
    before = [p.detach().clone() for p in model.parameters()]
    opt = MeZO(model.parameters(), eps=0.3, noise_backend="torch")
    with pytest.raises(ValueError, match=r"^the closure returned 2 values for 1 member; it must return one per "
                                         r"member \(1\)$"):
        opt.step(lambda members: [0.0, 1.0])
    with pytest.raises(ValueError, match=r"^the closure must return 1 value, one per member; got Tensor$"):
        opt.step(lambda members: torch.tensor(1.0))
    for p, q in zip(model.parameters(), before):  # restored (within the rounding of the perturbation's sweeps)
        torch.testing.assert_close(p.detach(), q, rtol=1e-6, atol=1e-6)
    assert opt.trajectory.status.tolist() == [2, 2]  # aborted


class _NoConfig:
    """The trainer's optimizer with its configuration and evaluation strategy out of reach."""

    def __init__(self, opt):
        self._opt = opt

    def __getattr__(self, name):
        if name in ("config", "defaults", "member_evaluation", "_members", "members_per_step"):
            raise AssertionError(f"the trainer read optimizer.{name}")
        return getattr(self._opt, name)


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_the_trainer_has_one_closure_and_reads_no_optimizer_config(tmp_path, tiny_tokenizer, registered, beta):
    """A training step in either mode with the optimizer's configuration hidden: the trainer's one closure
    evaluates the members the engine hands it (in place one per call, batched all in one), the same descriptors;
    with --beta (a prompt task, sampled completions) each member's KL included."""
    from mezo_rl.tasks import get_task
    from mezo_rl.training.trainer import MeZOTrainer

    factory = lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)  # noqa: E731
    seen, records = {}, {}
    for evaluation in ("inplace", "batched"):
        if beta:
            t = prompt_trainer(args_for(tmp_path, evaluation, beta=beta, do_sample=True, n_spsa=2, max_steps=1,
                                        member_evaluation=evaluation), tiny_tokenizer)
        else:
            t = MeZOTrainer(args=make_args(tmp_path, evaluation, member_evaluation=evaluation, n_spsa=2, max_steps=1),
                            lm=factory(), lm_factory=factory, task=get_task("sst2"), splits=splits())
        t.create_optimizer_and_scheduler()
        t._optimizer = _NoConfig(t._optimizer)
        calls = seen[evaluation] = []
        real = t.member_outcomes

        def spy(examples, members=None, *a, **kw):
            calls.append(members)
            return real(examples, members, *a, **kw)

        t.member_outcomes = spy
        records[evaluation] = t.training_step()
    assert [len(c) for c in seen["inplace"]] == [1, 1, 1, 1] and [len(c) for c in seen["batched"]] == [4]
    assert [c[0] for c in seen["inplace"]] == list(seen["batched"][0])
    assert [m.sign for m in seen["batched"][0]] == [1, -1, 1, -1]
    assert all(("kl" in r) == bool(beta) for r in records.values())


def test_the_trainer_source_reads_no_optimizer_config():
    """Alongside the behavioural test above: the trainer's source names none of the optimizer's internals."""
    source = (pathlib.Path(__file__).resolve().parent.parent / "mezo_rl/training/trainer.py").read_text()
    for internal in ("optimizer.config", "optimizer.member_evaluation", "optimizer.defaults", "len(written)"):
        assert internal not in source
