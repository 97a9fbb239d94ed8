"""MeZOTrainer: the MeZO loop wired to a real (tiny) LanguageModel, real tasks and real objectives.

The tiny Llama-style model from conftest stands in for SmolLM2; examples are hand-made SST-2-style
prompts (the sst2 task supplies kind and metrics), so nothing here needs the real data or model.
"""
from __future__ import annotations

import json
import random

import pytest
import torch

from conftest import make_tiny_causal_lm
from mezo_rl.model.lm import LanguageModel
from mezo_rl.choices import parse_max_memory
from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.training.rundir import load_run
from mezo_rl.training.setup import param_groups, trainable_parameters
from mezo_rl.training.trainer import MeZOTrainer, sample_batch_indices
from mezo_rl.tasks import Example, get_task

WORDS_POS = ["good", "great", "fun", "warm", "bright"]
WORDS_NEG = ["bad", "terrible", "dull", "cold", "sad"]


def sst2_like(n: int, seed: int) -> list[Example]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        label = rng.randrange(2)
        word = rng.choice(WORDS_POS if label else WORDS_NEG)
        out.append(Example(prompt=f"the movie was {word} and the acting was {rng.choice(WORDS_POS + WORDS_NEG)} . It was",
                           candidates=[" terrible", " great"], label=label, columns={"sentence": word}))
    return out


def splits():
    return {"train": sst2_like(24, 0), "validation": sst2_like(12, 1), "test": sst2_like(12, 2)}


@pytest.fixture()
def factory(tiny_tokenizer):
    return lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)


def make_args(tmp_path, name="run", **kw):
    base = dict(model="tiny", task="sst2", reward=["cross_entropy"], peft="full", max_steps=6, per_device_train_batch_size=4, eval_steps=3,
                learning_rate=1e-3, eps=1e-2, autocast="none", progress=False, output_dir=str(tmp_path / name),
                num_train=24, num_eval=12, num_test=12)
    base.update(kw)
    return MeZOConfig(**base)


def train(args, factory, **kw):
    trainer = MeZOTrainer(args=args, lm=factory(), lm_factory=factory, task=get_task("sst2"), splits=splits(), **kw)
    trainer.train()
    return trainer, trainer.summary


def weights(lm):
    return [p.detach().clone() for p in lm.model.parameters()]


def test_outputs_metrics_summary_and_checkpoint(tmp_path, factory):
    args = make_args(tmp_path, reward=["cross_entropy", "accuracy"], reward_weights=[1.0, 0.0])
    trainer, summary = train(args, factory)
    out = tmp_path / "run"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "split" not in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    for r in steps:
        for key in ("loss", "loss_plus", "loss_minus", "projected_grad", "lr", "seconds", "peak_rss_mb",
                    "reward/cross_entropy", "reward/accuracy"):
            assert isinstance(r[key], float), key
        assert r["projected_grad"] == pytest.approx((r["loss_plus"] - r["loss_minus"]) / (2 * 1e-2))
        assert r["bytes_communicated"] == 0  # one process: nothing crosses the wire
    evals = [(r["split"], r["step"]) for r in records if "split" in r]
    assert evals == [("validation", 0), ("test", 0), ("validation", 3), ("validation", 6), ("test", 6)]

    saved = json.loads((out / "summary.json").read_text())
    assert saved == json.loads(json.dumps(summary))
    for key in ("initial_validation", "validation", "test", "best_step", "wall_time_s", "metrics"):
        assert key in saved
    last_eval = [r for r in records if r.get("split") == "validation"][-1]["metrics"]
    assert saved["final_validation"] == last_eval and set(saved["initial_test"]) == set(saved["test"])
    assert saved["best_step"] in (0, 3, 6) and saved["steps"] == 6
    assert saved["metrics"]["test/accuracy"] == saved["test"]["accuracy"]
    assert all(isinstance(v, (int, float)) for v in saved["metrics"].values())
    assert MeZOConfig.from_dict(json.loads((out / "training_args.json").read_text())) == trainer.args

    ckpt = out / "checkpoint"
    assert sum(f.stat().st_size for f in ckpt.iterdir()) < 1_000_000
    identity = json.loads((ckpt / "model.json").read_text())
    assert identity["model"] == "tiny" and identity["peft"] is None


def test_best_weights_are_the_replayed_trajectory_prefix(tmp_path, factory):
    args = make_args(tmp_path, eval_steps=2)
    trainer, summary = train(args, factory)
    start = weights(factory())
    assert any(not torch.equal(a, b) for a, b in zip(start, weights(trainer.lm))) or summary["best_step"] == 0
    for step in ("best", "final", 4):
        lm, _, n = load_run(tmp_path / "run", step, lm=factory())
        if step == "best":
            assert n == summary["best_step"]
            assert all(torch.equal(a, b) for a, b in zip(weights(lm), weights(trainer.lm)))
    final, _, n = load_run(tmp_path / "run", "final", lm=factory())
    assert n == 6
    # evaluating the rebuilt best weights reproduces the recorded validation metric
    trainer.lm = load_run(tmp_path / "run", "best", lm=factory())[0]
    got = trainer.evaluate()  # transformers' keys: eval_<metric>, and eval_runtime
    assert got.pop("eval_runtime") >= 0
    assert got == pytest.approx({f"eval_{k}": v for k, v in summary["validation"].items()})


def test_resume_ends_at_the_same_weights_as_an_uninterrupted_run(tmp_path, factory):
    full_trainer, _ = train(make_args(tmp_path, "full"), factory)
    train(make_args(tmp_path, "split", max_steps=3), factory)                  # "interrupted" after 3 steps
    resumed, _ = train(make_args(tmp_path, "split", max_steps=6, resume=True), factory)
    a, _, _ = load_run(tmp_path / "full", "final", lm=factory())
    b, _, _ = load_run(tmp_path / "split", "final", lm=factory())
    assert all(torch.equal(x, y) for x, y in zip(weights(a), weights(b)))
    losses = lambda run: [json.loads(l)["loss_plus"] for l in (tmp_path / run / "metrics.jsonl").read_text().splitlines()
                          if "split" not in json.loads(l)]
    assert losses("full") == losses("split")
    # the run directory describes the run as it ended: 6 steps, repeatable with --config
    config = lambda run: json.loads((tmp_path / run / "training_args.json").read_text())  # noqa: E731
    assert config("split")["max_steps"] == 6
    assert {k: v for k, v in config("split").items() if k != "output_dir"} == \
        {k: v for k, v in config("full").items() if k != "output_dir"}


def test_resume_refuses_changed_arguments(tmp_path, factory):
    train(make_args(tmp_path, max_steps=3), factory)
    with pytest.raises(ValueError, match="learning_rate: saved 0.001 vs now 0.002"):
        train(make_args(tmp_path, max_steps=6, learning_rate=2e-3, resume=True), factory)
    # how many examples share a forward pass changes the speed, not the run: a resume may change it
    train(make_args(tmp_path, max_steps=6, eval_batch_size=3, resume=True), factory)


def test_plus_and_minus_see_the_same_batch_and_sampling_seed(tmp_path, factory):
    from mezo_rl.rewards import register_reward, unregister_reward

    seen = []

    @register_reward("test_len_spy", higher_is_better=True, needs="generation")
    def spy(prompts, completions, **columns):
        seen.append(list(prompts))
        return [float(len(c)) for c in completions]

    lm = factory()
    seeds = []
    generate = lm.generate

    def recording_generate(prompts, **kw):
        seeds.append(kw.get("seed"))
        return generate(prompts, **kw)

    lm.generate = recording_generate
    try:
        args = make_args(tmp_path, reward=["test_len_spy"], max_steps=3, eval_steps=10, do_sample=True, max_completion_length=3,
                         member_evaluation="inplace")  # one closure call per member (batched: tests/test_batched_runs.py)
        MeZOTrainer(args=args, lm=lm, lm_factory=factory, task=get_task("sst2"), splits=splits()).train()
    finally:
        unregister_reward("test_len_spy")
    assert len(seen) == 6  # two closure calls per step
    for t in range(3):
        assert seen[2 * t] == seen[2 * t + 1] and len(seen[2 * t]) == 4
        assert seeds[2 * t] == seeds[2 * t + 1] is not None
    assert seen[0] != seen[2] and seeds[0] != seeds[2]


def test_weight_decay_groups_exempt_biases_and_norms(factory):
    lm = factory()
    decay, no_decay = param_groups(lm.model, 0.1)
    names = {id(p): n for n, p in lm.model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all("norm" in names[id(p)] or names[id(p)].endswith("bias") for p in no_decay["params"])
    assert any("norm" in names[id(p)] for p in no_decay["params"])
    assert len(trainable_parameters(lm.model)) == len(decay["params"]) + len(no_decay["params"])
    for p in lm.model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        param_groups(lm.model, 0.0)


def test_batches_are_a_pure_function_of_seed_and_step():
    a = [sample_batch_indices(20, 4, 0, t) for t in range(5)]
    assert a == [sample_batch_indices(20, 4, 0, t) for t in range(5)]
    assert all(len(set(b)) == 4 for b in a) and len({tuple(b) for b in a}) > 1
    assert sample_batch_indices(20, 4, 1, 0) != a[0]
    assert sorted(sample_batch_indices(3, 8, 0, 0)) == [0, 1, 2]


@pytest.mark.parametrize("bad, match", [
    (dict(reward=[]), "at least one reward"),
    (dict(reward=["accuracy"], reward_weights=[1.0, 2.0]), "one weight per --reward"),
    (dict(max_steps=-2), "--max-steps"),
    (dict(per_device_train_batch_size=0), "--per-device-train-batch-size"),
    (dict(peft="adapters"), "accepted: norm, full, lora, prefix"),
])
def test_bad_arguments_name_the_problem(bad, match):
    with pytest.raises(ValueError, match=match):
        MeZOConfig(**bad)


def test_reward_that_does_not_fit_the_task_fails_before_training(tmp_path, factory):
    args = make_args(tmp_path, reward=["squad_f1"])
    with pytest.raises(ValueError, match="answers"):
        MeZOTrainer(args=args, lm=factory(), task=get_task("sst2"), splits=splits())


def test_tensorboard_option_writes_event_files(tmp_path, factory):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(make_args(tmp_path, max_steps=2, eval_steps=2, report_to=["tensorboard"]), factory)
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    tags = acc.Tags()["scalars"]  # transformers' dashboard names: train/..., eval/... (validation), test/...
    assert {"train/loss", "train/projected_grad", "eval/accuracy", "test/accuracy"} <= set(tags)
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2]


def test_masked_lm_trains_on_the_mask_prompt(tmp_path, tiny_masked_lm):
    from conftest import make_tiny_masked_lm

    model, tok = tiny_masked_lm
    data = {k: [Example(prompt=ex.prompt, candidates=ex.candidates, label=ex.label,
                        mask_prompt=ex.prompt + " [MASK] .", mask_candidates=["terrible", "great"]) for ex in v]
            for k, v in splits().items()}
    factory = lambda: LanguageModel(make_tiny_masked_lm(tok), tok)
    args = make_args(tmp_path, max_steps=2, eval_steps=2)
    trainer = MeZOTrainer(args=args, lm=LanguageModel(model, tok), lm_factory=factory, task=get_task("sst2"), splits=data)
    trainer.train()
    summary = trainer.summary
    assert summary["steps"] == 2 and 0.0 <= summary["test"]["accuracy"] <= 1.0
    with pytest.raises(ValueError, match="completions"):
        MeZOTrainer(args=make_args(tmp_path, reward=["squad_f1"]), lm=factory(), task=get_task("squad"),
                splits={k: [Example(prompt="Q?", answers=[" a"])] * 4 for k in ("train", "validation", "test")})


def test_max_memory_spec_is_parsed_and_bad_specs_are_named():
    assert parse_max_memory("0=20GiB, 1=20GiB,cpu=60GiB") == {0: "20GiB", 1: "20GiB", "cpu": "60GiB"}
    assert parse_max_memory(None) is None
    with pytest.raises(ValueError, match="20GiB.*DEVICE=SIZE"):
        parse_max_memory("0=20GiB,20GiB")


def test_autocast_choice_is_validated():
    with pytest.raises(ValueError, match="autocast.*auto, none, bfloat16"):
        MeZOConfig(autocast="fp8")
