"""LoRA dropout (``--lora-dropout``, peft's ``lora_dropout``; mezo_rl.model.dropout): drawn only while a training step
evaluates its members, the same masks for every member of the step, in place and batched; a function of the step's
seed (resume is exact); the identity everywhere else; recorded in the adapter folder peft loads."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from conftest import make_tiny_causal_lm
from mezo_rl.engine.optim import BatchedMembers, MeZO
from mezo_rl.errors import ConfigError
from mezo_rl.model.dropout import StepDropout, dropout_paused, step_dropout
from mezo_rl.model.lm import LanguageModel
from mezo_rl.model.peft import apply_peft, export_model, load_adapter, peft_config
from mezo_rl.tasks import get_task
from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.training.rundir import load_run
from mezo_rl.training.trainer import MeZOTrainer
from test_population import CANDIDATES, PROMPTS, choice_loss, loss_tolerance
from test_trainer import make_args, splits, weights

P = 0.3


pytestmark = pytest.mark.usefixtures("one_thread")  # members compared across passes: one thread's reduction order


def lora_lm(tokenizer, dropout=P, moved=True):
    """The tiny model with a LoRA adapter whose B is away from zero (so the adapter, and its dropout, shows)."""
    lm = apply_peft(LanguageModel(make_tiny_causal_lm(tokenizer), tokenizer, batch_size=3), "lora", dropout=dropout)
    if moved:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in lm.model.named_parameters():
                if "lora_B" in name:
                    p.add_(0.2 * torch.randn(p.shape, generator=g))
    return lm


def scored(lm):
    with torch.no_grad():
        return choice_loss(lm.score(PROMPTS, CANDIDATES))


# ------------------------------------------------------------------------------------------- the masks

def test_a_batched_pass_tiles_one_members_mask_over_the_member_blocks(tiny_tokenizer):
    lm = lora_lm(tiny_tokenizer)
    ids = torch.tensor([tiny_tokenizer.encode("the movie was good and the acting was bad .")] * 2)
    model = lm.model
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with step_dropout(model, 7):
            one = model(input_ids=ids).logits
            again = model(input_ids=ids).logits  # the layer's second input of that shape: another mask
        with step_dropout(model, 7):  # a member entering the block afresh: the same masks as the first
            member = model(input_ids=ids).logits
            with dropout_paused(model):
                paused = model(input_ids=ids).logits
        with step_dropout(model, 8):
            other_step = model(input_ids=ids).logits
        with step_dropout(model, 7, members=3):
            batched = model(input_ids=ids.repeat(3, 1)).logits
    assert not torch.allclose(one, plain, atol=1e-3) and not torch.allclose(again, one, atol=1e-3)
    assert torch.equal(member, one) and torch.equal(paused, plain)
    assert not torch.allclose(other_step, one, atol=1e-3)   # another step's seed: other masks
    for k in range(3):
        assert torch.equal(batched[2 * k: 2 * k + 2], one)
    with pytest.raises(ValueError, match="7 rows for 3 members"), step_dropout(model, 7, members=3):
        model(input_ids=ids[:1].repeat(7, 1))


def test_a_members_later_inputs_get_the_same_masks_however_long_it_decoded_before(tiny_tokenizer):
    """In place, the members of a pair can write completions of different lengths before they score (the KL
    penalty's pass reads the + member's texts in both): a mask is keyed on the input's shape and how many inputs of
    that shape the layer read, so the scoring pass after 2 decoding steps reads the masks it reads after 5."""
    lm = lora_lm(tiny_tokenizer)
    with torch.no_grad():
        outs = []
        for new_tokens in (2, 5):
            with step_dropout(lm.model, 7):
                lm.generate(PROMPTS, max_new_tokens=new_tokens)
                outs.append(choice_loss(lm.score(PROMPTS, CANDIDATES)))
        with step_dropout(lm.model, 7):
            first = choice_loss(lm.score(PROMPTS, CANDIDATES))
    assert outs[0] == outs[1] == first and first != scored(lm)


def test_every_member_of_a_step_sees_the_same_masks_in_place_and_batched(tiny_tokenizer):
    """Each step's members evaluated in place (the block entered once per member) and in one batched pass (once,
    the mask of one member's rows tiled over the blocks): each member's loss agrees within the float32 tolerance of
    test_population, while the dropout itself moves the members' losses by several times it."""
    options = dict(noise="gaussian", n_spsa=2, eps=0.3)

    def run(evaluation):
        lm = lora_lm(tiny_tokenizer)
        opt = MeZO([p for p in lm.model.parameters() if p.requires_grad], lr=1e-2, seed=3, noise_backend="torch",
                   member_evaluation=BatchedMembers(lm.model) if evaluation == "batched" else evaluation, **options)
        seen, undropped, results = [], [], []
        for step_seed in (11, 12):
            def inplace():
                with step_dropout(lm.model, step_seed):
                    seen.append(lm.score(PROMPTS, CANDIDATES))
                undropped.append(choice_loss(lm.score(PROMPTS, CANDIDATES)))
                return choice_loss(seen[-1])

            def batched(members):
                with step_dropout(lm.model, step_seed, len(members)):
                    return [choice_loss(s) for s in lm.score(PROMPTS, CANDIDATES, members=len(members))]

            results.append(opt.step(batched if evaluation == "batched" else inplace))
        return lm, results, seen, undropped

    lm, inplace, scores, undropped = run("inplace")
    _, batched, _, _ = run("batched")
    tol = loss_tolerance(lm, PROMPTS, scores, 1)
    values = [v for r in inplace for v in r.values]
    assert max(abs(v - u) for v, u in zip(values, undropped)) > 4 * tol   # the dropout shows, far above the tolerance
    for a, b in zip(inplace, batched):
        assert a.seeds == b.seeds
        for x, y in zip(a.values, b.values):
            assert abs(x - y) <= tol, (x, y, tol)


def test_each_step_draws_its_own_masks_from_its_seed_and_every_member_of_it_the_same(tmp_path, tiny_tokenizer,
                                                                                     monkeypatch):
    import mezo_rl.training.trainer as trainer_module

    entered, running = [], {}
    real = trainer_module.step_dropout

    def spy(model, seed, members=1):  # (the step being evaluated, its dropout seed, the member blocks)
        entered.append((running["trainer"].step, seed, members))
        return real(model, seed, members)

    monkeypatch.setattr(trainer_module, "step_dropout", spy)
    factory = lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)  # noqa: E731
    for evaluation in ("inplace", "batched"):
        entered.clear()
        args = make_args(tmp_path, evaluation, peft="lora", lora_dropout=P, noise="gaussian", max_steps=3, eval_steps=10,
                         member_evaluation=evaluation)
        running["trainer"] = MeZOTrainer(args=args, lm=factory(), lm_factory=factory, task=get_task("sst2"),
                                         splits=splits())
        running["trainer"].train()
        assert [step for step, _, _ in entered] == ([0, 0, 1, 1, 2, 2] if evaluation == "inplace" else [0, 1, 2])
        assert [m for _, _, m in entered] == ([1] * 6 if evaluation == "inplace" else [2] * 3)
        seeds = {step: {seed for t, seed, _ in entered if t == step} for step in (0, 1, 2)}
        assert all(len(s) == 1 and None not in s for s in seeds.values())   # one seed for every member of a step
        assert len({min(s) for s in seeds.values()}) == 3                    # another for each step
        if evaluation == "inplace":
            first = seeds
    assert seeds == first   # a function of (seed, step), whichever the evaluation


# ------------------------------------------------------------------------------------------- in a run

def test_dropout_changes_the_trajectory_but_not_what_the_trained_weights_compute(tmp_path, tiny_tokenizer):
    factory = lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)  # noqa: E731
    runs = {}
    for p in (0.0, P):
        args = make_args(tmp_path, f"p{p}", peft="lora", lora_dropout=p, noise="gaussian", max_steps=4, eval_steps=2,
                         eps=0.3, learning_rate=1e-2, member_evaluation="inplace")
        runs[p] = MeZOTrainer(args=args, lm=factory(), lm_factory=factory, task=get_task("sst2"), splits=splits())
        runs[p].train()
    a, b = runs[0.0].trajectory, runs[P].trajectory
    assert (a.seeds == b.seeds).all() and a.values.tolist() != b.values.tolist()
    assert runs[0.0].summary["initial_validation"] == runs[P].summary["initial_validation"]

    # outside a step the adapter computes without dropout: the trained weights in a model without dropout agree
    # bit for bit, in scoring, generation and evaluate()
    trained = runs[P].lm
    plain = apply_peft(factory(), "lora")
    plain.model.load_state_dict(trained.model.state_dict())
    assert scored(trained) == scored(plain)
    assert trained.generate(PROMPTS, max_new_tokens=4) == plain.generate(PROMPTS, max_new_tokens=4)
    undropped = MeZOTrainer(args=dataclasses.replace(runs[P].args, lora_dropout=0.0, output_dir=str(tmp_path / "e")),
                            lm=factory(), task=get_task("sst2"), splits=splits())
    undropped.lm.model.load_state_dict(trained.model.state_dict())
    examples = splits()["validation"]
    timeless = lambda metrics: {k: v for k, v in metrics.items() if "runtime" not in k and "per_second" not in k}  # noqa: E731
    assert timeless(runs[P].evaluate(examples)) == timeless(undropped.evaluate(examples))


def test_a_generation_run_with_dropout_is_the_same_in_place_and_batched(tmp_path, tiny_tokenizer):
    """Greedy completions under dropout: the members of a pair decode different lengths in place, and the masks
    are keyed on the input's shape and its count, so the batched run's members read the in-place run's masks:
    the same texts, rewards and updates."""
    from mezo_rl.rewards import register_reward, unregister_reward

    @register_reward("test_len_dropout", higher_is_better=True, needs="generation")
    def length(prompts, completions, **columns):
        return [float(len(c)) for c in completions]

    factory = lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)  # noqa: E731
    runs = {}
    try:
        for name, evaluation, p in (("inplace", "inplace", P), ("batched", "batched", P), ("none", "batched", 0.0)):
            args = make_args(tmp_path, name, peft="lora", lora_dropout=p, noise="gaussian", reward=["test_len_dropout"],
                             max_steps=3, eval_steps=10, max_completion_length=6, learning_rate=1.0, eps=1.0,
                             member_evaluation=evaluation)
            runs[name] = MeZOTrainer(args=args, lm=factory(), lm_factory=factory, task=get_task("sst2"), splits=splits())
            runs[name].train()
    finally:
        unregister_reward("test_len_dropout")
    a, b, none = (runs[n].trajectory for n in ("inplace", "batched", "none"))
    assert a.values.tolist() == b.values.tolist() and a.projected_grads.tolist() == b.projected_grads.tolist()
    assert b.values.tolist() != none.values.tolist()   # the dropout changed what the members wrote


def test_a_run_with_dropout_resumes_and_replays_bit_identically(tmp_path, tiny_tokenizer):
    factory = lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)  # noqa: E731
    kw = dict(peft="lora", lora_dropout=P, noise="gaussian", eps=0.3, learning_rate=1e-2, member_evaluation="inplace",
              eval_steps=3)

    def train(name, **more):
        trainer = MeZOTrainer(args=make_args(tmp_path, name, **kw, **more), lm=factory(), lm_factory=factory,
                              task=get_task("sst2"), splits=splits())
        trainer.train()
        return trainer

    full = train("full", max_steps=6)
    train("split", max_steps=3)
    train("split", max_steps=6, resume=True)
    losses = [[json.loads(line)["loss_plus"] for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
               if "split" not in json.loads(line)] for name in ("full", "split")]
    assert losses[0] == losses[1] and len(losses[0]) == 6
    a, _, _ = load_run(tmp_path / "full", "final", lm=factory())
    b, _, _ = load_run(tmp_path / "split", "final", lm=factory())
    assert all(torch.equal(x, y) for x, y in zip(weights(a), weights(b)))
    assert peft_config(a)["dropout"] == P
    final = {k: v for k, v in full.lm.model.state_dict().items()}
    assert all(torch.equal(v, final[k]) for k, v in a.model.state_dict().items())  # replayed: the run's weights


def test_no_dropout_is_the_adapter_without_it(tiny_tokenizer):
    from torch import nn

    lm = lora_lm(tiny_tokenizer, dropout=0.0)
    assert peft_config(lm) == {"method": "lora", "r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"], "seed": 0}
    assert not any(isinstance(m, StepDropout) for m in lm.model.modules())
    assert all(isinstance(d, nn.Identity) for m in lm.model.modules() if hasattr(m, "lora_dropout")
               for d in m.lora_dropout.values())
    outside = scored(lm)
    with step_dropout(lm.model, 7):
        assert scored(lm) == outside
    dropped = lora_lm(tiny_tokenizer)
    assert scored(dropped) == outside   # the same adapter: with dropout, only a step's members differ


# ------------------------------------------------------------------------------------ refusals, export

@pytest.mark.parametrize("kw, message", [
    (dict(peft="lora", lora_dropout=1.0), "--lora-dropout: got 1.0, accepted: a number >= 0 and < 1"),
    (dict(peft="lora", lora_dropout=-0.1), "--lora-dropout: got -0.1, accepted: a number >= 0 and < 1"),
    (dict(peft="prefix", lora_dropout=0.05), "--lora-dropout 0.05 is a LoRA adapter's dropout; --peft prefix has no "
                                             "LoRA adapter (use --peft lora, or leave out --lora-dropout)"),
    (dict(lora_dropout=0.05), "--peft norm has no LoRA adapter"),
])
def test_bad_dropout_is_refused_in_one_line(kw, message):
    from mezo_rl.tasks import get_task
    from mezo_rl.training.plan import run_config

    with pytest.raises(ConfigError) as err:  # given values refused as the config is built; --peft unset: by the plan
        run_config(MeZOConfig(task="sst2", **kw), get_task("sst2"))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_apply_peft_refuses_bad_dropout(tiny_tokenizer):
    with pytest.raises(ValueError, match=r"probability in \[0, 1\), got 1.0"):
        lora_lm(tiny_tokenizer, dropout=1.0)
    with pytest.raises(ValueError, match="dropout is LoRA's"):
        apply_peft(LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer), "prefix", dropout=0.1)


def test_the_adapter_folder_records_the_dropout(tiny_tokenizer, tmp_path):
    from peft import PeftModel

    lm = lora_lm(tiny_tokenizer, dropout=0.05)
    export_model(lm, tmp_path / "adapter")
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["lora_dropout"] == 0.05
    loaded = PeftModel.from_pretrained(make_tiny_causal_lm(tiny_tokenizer), tmp_path / "adapter")
    assert {m.p for m in loaded.modules() if isinstance(m, torch.nn.Dropout)} == {0.05}
    ours = load_adapter(LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer), tmp_path / "adapter")
    assert peft_config(ours) == peft_config(lm) and {m.p for m in ours.model.modules() if isinstance(m, StepDropout)} == {0.05}
    assert scored(ours) == scored(lm)


def test_the_kl_reference_pass_reads_the_starting_model_without_dropout(tiny_tokenizer, monkeypatch):
    import mezo_rl.training.kl as kl
    from mezo_rl.model.dropout import dropout_active

    lm = lora_lm(tiny_tokenizer)
    start = kl.StartingPoint(lm.model)
    active, real = [], kl._position_logprobs

    def spy(lm_, rows, keep):
        active.append(dropout_active(lm_.model))
        return real(lm_, rows, keep)

    monkeypatch.setattr(kl, "_position_logprobs", spy)
    with step_dropout(lm.model, 7):
        inside = kl.completion_kl(lm, start, PROMPTS[:2], [" good", " the cat"])
    assert active == [True, False]   # the policy's pass with the step's masks, the start's without
    assert inside.mean > 0 and kl.completion_kl(lm, start, PROMPTS[:2], [" good", " the cat"]).mean == 0
