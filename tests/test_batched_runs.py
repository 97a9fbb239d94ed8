"""Batched member evaluation in runs: ``--member-evaluation``, the trainer's batched closure
(``MeZOTrainer.member_outcomes`` -> ``mezo_rl.training.outputs.objective_outputs``), resume, and data
parallelism on 2 gloo ranks (every rank evaluates its shard for all members; only scalars cross)."""
from __future__ import annotations

import json
import os

import pytest
import torch

from conftest import make_tiny_causal_lm
from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.training.member_evaluation import resolve_member_evaluation
from mezo_rl.training.distributed import DistContext
from mezo_rl.model.lm import LanguageModel
from mezo_rl.engine.optim import BatchedMembers, MeZO
from mezo_rl.training.outputs import model_outputs
from mezo_rl.training.rundir import load_run
from mezo_rl.engine.optim import replay_trajectory
from mezo_rl.engine.trajectory import Trajectory
from mezo_rl.tasks import get_task
from test_distributed import _join, _two_ranks
from test_population import CANDIDATES, PROMPTS, choice_loss, loss_tolerance
from test_trainer import make_args, splits, sst2_like, weights


@pytest.fixture()
def factory(tiny_tokenizer):
    return lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)


def test_evaluation_option_auto_and_refusals():
    gen, scores = {"generation"}, {"scores"}
    short, long = dict(prompt_tokens=12.0, max_new_tokens=32), dict(prompt_tokens=250.0, max_new_tokens=16)
    assert resolve_member_evaluation("auto", gen, "none", "lowrank", **short) == "batched"   # decode-bound
    assert resolve_member_evaluation("auto", gen, "lora", "gaussian", **short) == "batched"
    assert resolve_member_evaluation("auto", gen, "none", "lowrank", **long) == "inplace"    # prefill-bound on a CPU
    chat = dict(prompt_tokens=47.0, max_new_tokens=16)   # arithmetic's chat prompts: measured faster batched
    assert all(resolve_member_evaluation("auto", gen, mode, noise, **chat) == "batched"
               for mode, noise in (("none", "lowrank"), ("lora", "gaussian"), ("norm", "rademacher")))
    assert resolve_member_evaluation("auto", gen, "none", "lowrank", prompt_tokens=65.0, max_new_tokens=16) == "inplace"
    assert resolve_member_evaluation("auto", gen, "none", "lowrank", device_type="cuda", **long) == "batched"
    assert resolve_member_evaluation("auto", scores, "none", "lowrank", **short) == "inplace"
    assert resolve_member_evaluation("auto", gen, "none", "gaussian", **short) == "inplace"  # full model + element-wise noise
    assert resolve_member_evaluation("inplace", gen, "none", "lowrank", **short) == "inplace"
    assert resolve_member_evaluation("batched", scores, "norm", "rademacher") == "batched"
    # bf16 weights: batched wherever it can serve the setup (the in-place sweeps would round them)
    assert resolve_member_evaluation("auto", scores, "none", "lowrank", low_precision=True) == "batched"
    assert resolve_member_evaluation("auto", scores, "norm", "rademacher", low_precision=True) == "batched"
    assert resolve_member_evaluation("auto", scores, "none", "gaussian", low_precision=True) == "inplace"
    assert MeZOConfig().member_evaluation == "auto"
    with pytest.raises(ValueError, match=r"^--member-evaluation batched perturbs the model's matrices activation-side, which "
                                         r"needs --noise lowrank \(the default of --peft full\), got --noise gaussian; "
                                         r"or use --member-evaluation inplace$"):
        MeZOConfig(peft="full", noise="gaussian", member_evaluation="batched")
    MeZOConfig(peft="full", noise="gaussian", member_evaluation="batched", trainable="norm")  # 1-D tensors: fine
    with pytest.raises(ValueError, match="accepted: auto, inplace, batched"):
        MeZOConfig(member_evaluation="parallel")


def test_member_outputs_are_model_outputs_per_member(factory):
    lm = factory()
    examples = sst2_like(5, 0)
    for needs in ({"scores"}, {"generation"}):
        plain = model_outputs(lm, examples, needs, max_new_tokens=4, do_sample=True, sample_seed=3, num_generations=2)
        members = model_outputs(lm, examples, needs, 3, max_new_tokens=4, do_sample=True, sample_seed=3,
                                 num_generations=2)
        assert len(members) == 3
        for out in members:  # no perturbation: every member is the plain call (sampling: the same numbers)
            assert out.prompts == plain.prompts and out.groups == plain.groups and out.labels == plain.labels
            assert out.completions == plain.completions and out.texts == plain.texts
            if needs == {"scores"}:
                for s, ref in zip(out.candidate_scores, plain.candidate_scores):
                    torch.testing.assert_close(s.sum, ref.sum, atol=1e-5, rtol=0)
    assert model_outputs(lm, [], {"scores", "generation"}, 2)[1].completions == []


def test_auto_reads_the_training_prompts(tmp_path, factory):
    from mezo_rl.training.trainer import MeZOTrainer

    def mode(**kw):
        args = make_args(tmp_path, reward=["test_len_auto"], **kw)
        return MeZOTrainer(args=args, lm=factory(), task=get_task("sst2"), splits=splits()).optimizer.config["member_evaluation"]

    from mezo_rl.rewards import register_reward, unregister_reward

    register_reward("test_len_auto", needs="generation")(lambda prompts, completions, **c: [0.0] * len(completions))
    try:  # the SST-2-like prompts are 10-20 tokens long
        assert mode(max_completion_length=4) == "inplace" and mode(max_completion_length=64) == "batched"
        assert mode(max_completion_length=64, member_evaluation="inplace") == "inplace"
    finally:
        unregister_reward("test_len_auto")


def test_auto_is_batched_for_bf16_weights(tmp_path, factory):
    from mezo_rl.training.trainer import MeZOTrainer

    def mode(lm, **kw):
        return MeZOTrainer(args=make_args(tmp_path, **kw), lm=lm, task=get_task("sst2"), splits=splits()).optimizer.config["member_evaluation"]

    bf16 = factory()
    bf16.model.to(torch.bfloat16)
    assert mode(factory()) == "inplace" and mode(bf16, dtype="bfloat16") == "batched"


def test_a_resumed_run_keeps_the_evaluation_mode_it_ran_with(tmp_path, factory):
    """A run from before --member-evaluation (config.json without it: auto now) ran in place; auto would now
    pick batched for its short prompts and long decode, but its checkpoint resumes in place. Asking
    for the other mode is one line."""
    from mezo_rl.errors import ConfigError
    from mezo_rl.training.trainer import MeZOTrainer
    from mezo_rl.rewards import register_reward, unregister_reward

    register_reward("test_len_resume", needs="generation")(lambda prompts, completions, **c: [0.0] * len(completions))
    try:
        args = make_args(tmp_path, reward=["test_len_resume"], max_completion_length=64, max_steps=2, eval_steps=2,
                         member_evaluation="inplace")
        MeZOTrainer(args=args, lm=factory(), lm_factory=factory, task=get_task("sst2"), splits=splits()).train()
        config = tmp_path / "run" / "training_args.json"
        saved = json.loads(config.read_text())
        del saved["member_evaluation"]
        config.write_text(json.dumps(saved))
        auto = make_args(tmp_path, reward=["test_len_resume"], max_completion_length=64, max_steps=3, eval_steps=2, resume=True)
        trainer = MeZOTrainer(args=auto, lm=factory(), lm_factory=factory, task=get_task("sst2"), splits=splits())
        assert trainer.optimizer.config["member_evaluation"] == "inplace"
        trainer.train()
        assert trainer.summary["steps"] == 3
        # refused before any model loads: no lm is given, and the model args name ("tiny") cannot be loaded
        with pytest.raises(ConfigError, match=r"^--resume: this run's steps were evaluated inplace; resume it with "
                                              r"--member-evaluation inplace or auto, not --member-evaluation batched$"):
            MeZOTrainer(args=make_args(tmp_path, reward=["test_len_resume"], max_completion_length=64, max_steps=4, eval_steps=2,
                              resume=True, member_evaluation="batched"), task=get_task("sst2"), splits=splits())
    finally:
        unregister_reward("test_len_resume")


def _train(args, factory):
    from mezo_rl.training.trainer import MeZOTrainer

    trainer = MeZOTrainer(args=args, lm=factory(), lm_factory=factory, task=get_task("sst2"), splits=splits())
    trainer.train()
    return trainer, trainer.summary


def _steps(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if "split" not in json.loads(line)]


@pytest.mark.parametrize("shaping, hessian_smooth", [("none", 0.0), ("group", 0.0), ("group", 0.3)])
def test_a_generation_run_makes_one_batched_decode_per_step_and_matches_the_inplace_run(tmp_path, factory, shaping,
                                                                                       hessian_smooth):
    """Greedy completions are discrete: the batched run's members decode the same texts as the in-place
    run's (the perturbed logits agree to float32 rounding, far from any tie here), so every member's
    reward, every step's loss and every update are the same; the batched run decodes once per step.
    With HiZOO (``hessian_smooth``) one more member, the unperturbed weights, decodes in the same pass, and
    the steps after the first perturb with the curvature the members measured."""
    from mezo_rl.rewards import register_reward, unregister_reward

    @register_reward("test_len_batched", higher_is_better=True, needs="generation")
    def length(prompts, completions, **columns):
        return [float(len(c)) for c in completions]

    calls = []
    try:
        runs = {}
        for evaluation in ("inplace", "batched"):
            lm = factory()
            generate = lm.generate

            def spy(prompts, **kw):
                calls.append((evaluation, kw.get("members")))
                return generate(prompts, **kw)

            lm.generate = spy
            from mezo_rl.training.trainer import MeZOTrainer

            kw = dict(do_sample=True, num_generations=2) if shaping == "group" else {}
            args = make_args(tmp_path, evaluation, reward=["test_len_batched"], max_steps=3, eval_steps=10, max_completion_length=4,
                             learning_rate=1e-2, eps=0.1, member_evaluation=evaluation, reward_shaping=shaping,
                             hessian_smooth=hessian_smooth, **kw)
            trainer = MeZOTrainer(args=args, lm=lm, lm_factory=factory, task=get_task("sst2"), splits=splits())
            trainer.train()
            runs[evaluation] = trainer
    finally:
        unregister_reward("test_len_batched")
    members = 2 + (hessian_smooth > 0)
    assert [c for c in calls if c[0] == "batched" and c[1] is not None] == [("batched", members)] * 3
    assert runs["batched"].trajectory.values.shape[1] == members
    assert runs["batched"].trajectory.header["member_evaluation"] == "batched"
    a, b = (runs[e].trajectory for e in ("inplace", "batched"))
    assert a.values.tolist() == b.values.tolist() and a.projected_grads.tolist() == b.projected_grads.tolist()
    assert any(g != 0 for g in b.projected_grads.ravel())
    wa, wb = (weights(load_run(tmp_path / e, "final", lm=factory())[0]) for e in ("inplace", "batched"))
    # the same updates, from the same weights; the in-place run's sweeps round the weights 3 times a step
    assert all(torch.allclose(x, y, atol=1e-6, rtol=0) for x, y in zip(wa, wb))


def test_a_batched_run_resumes_and_replays_bit_identically(tmp_path, factory):
    kw = dict(member_evaluation="batched", reward=["cross_entropy"])
    _train(make_args(tmp_path, "full", **kw), factory)
    _train(make_args(tmp_path, "split", max_steps=3, **kw), factory)
    _train(make_args(tmp_path, "split", max_steps=6, resume=True, **kw), factory)
    a, _, _ = load_run(tmp_path / "full", "final", lm=factory())
    b, _, _ = load_run(tmp_path / "split", "final", lm=factory())
    assert all(torch.equal(x, y) for x, y in zip(weights(a), weights(b)))
    assert [r["loss_plus"] for r in _steps(tmp_path / "full")] == [r["loss_plus"] for r in _steps(tmp_path / "split")]
    start = weights(factory())
    assert any(not torch.equal(x, y) for x, y in zip(start, weights(a)))


# ---------------------------------------------------------------------------- data parallel
def _dp_batched(ctx, lm, steps, seed=0):
    """Every rank scores its shard for all members in one batched pass; per member (sum, count) of the
    choice cross-entropy, all members' scalars in one all-reduce."""
    opt = MeZO(lm.model.parameters(), lr=1e-2, eps=0.3, n_spsa=2, seed=seed, member_evaluation=BatchedMembers(lm.model))
    losses = []
    for _ in range(steps):
        shard = ctx.shard(list(range(len(PROMPTS))))

        def closure(members):
            per_member = lm.score([PROMPTS[i] for i in shard], [CANDIDATES[i] for i in shard], members=len(members))
            local = []
            for scores in per_member:
                local += [choice_loss(scores) * len(scores) if scores else 0.0, float(len(scores))]
            total = ctx.all_reduce_sum(local)
            losses.append([total[2 * k] / total[2 * k + 1] for k in range(len(members))])
            return losses[-1]

        opt.step(closure)
    return losses, opt


def _dp_worker(rank, world_size, port, model_dir, out_dir, steps):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _join(rank, world_size, port) as ctx:
        lm = LanguageModel(AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir))
        before = ctx.bytes_communicated
        losses, opt = _dp_batched(ctx, lm, steps)
        if ctx.is_main:
            opt.trajectory.save(os.path.join(out_dir, "trajectory.npz"))
        torch.save({"state": lm.model.state_dict(), "losses": losses,
                    "bytes_per_step": (ctx.bytes_communicated - before) / steps}, os.path.join(out_dir, f"rank{rank}.pt"))


def test_two_ranks_evaluate_their_shards_for_all_members_and_match_one_process(tmp_path, tiny_causal_lm):
    model, tokenizer = tiny_causal_lm
    steps = 3
    r0, r1, out_dir = _two_ranks(tmp_path, tiny_causal_lm, _dp_worker, steps)
    assert r0["losses"] == r1["losses"]
    assert all(torch.equal(t, r1["state"][k]) for k, t in r0["state"].items())
    assert r0["bytes_per_step"] == r1["bytes_per_step"] == 4 * 2 * 8  # 4 members x (sum, count), float64

    # one process, the whole batch in one shard: each member's loss within the float32 bound of scoring
    # the same prompts in other batch shapes (test_population.loss_tolerance)
    lm = LanguageModel(model, tokenizer)
    with torch.no_grad():
        scores = lm.score(PROMPTS, CANDIDATES)
    tol = loss_tolerance(lm, PROMPTS, [scores], rank=1)
    single, opt = _dp_batched(DistContext(), lm, steps)
    for two, one in zip(r0["losses"], single):
        assert max(abs(x - y) for x, y in zip(two, one)) <= tol
    traj = Trajectory.load(out_dir / "trajectory.npz")
    assert (traj.seeds == opt.trajectory.seeds).all()
    for x, y in zip(traj.projected_grads.ravel(), opt.trajectory.projected_grads.ravel()):
        assert abs(x - y) <= 2 * tol / 0.3
    fresh = make_tiny_causal_lm(tokenizer)
    replay_trajectory(list(fresh.parameters()), traj)
    assert all(torch.equal(t, r0["state"][k]) for k, t in fresh.state_dict().items())
