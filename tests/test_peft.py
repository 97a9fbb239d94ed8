"""LoRA and prefix-tuning adapters (mezo_rl.model.peft) on the tiny Llama-style model."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import assert_float32_close, make_tiny_causal_lm
from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.training.callbacks import TrainerCallback
from mezo_rl.model.lm import LanguageModel
from mezo_rl.training.defaults import MODE_DEFAULTS, mezo_options
from mezo_rl.model.peft import apply_peft, export_model, load_adapter, peft_config
from mezo_rl.training.rundir import load_run
from mezo_rl.training.trainer import MeZOTrainer
from mezo_rl.tasks import Example, get_task

METHODS = ("lora", "prefix")
TEXT = "the movie was good and the acting was bad ."


def lora_terms(model, r=8) -> int:
    """The reductions LoRA adds to each layer's chain (x A: hidden size terms, then B: r terms)."""
    return model.config.num_hidden_layers * (model.config.hidden_size + r)


def make_lm(tokenizer, seed=0, **overrides):
    return LanguageModel(make_tiny_causal_lm(tokenizer, seed=seed, **overrides), tokenizer)


def trainable(lm):
    return [p for p in lm.model.parameters() if p.requires_grad]


def logits(model, text, tokenizer):
    ids = torch.tensor([tokenizer.encode(text)])
    with torch.no_grad():
        return model(input_ids=ids).logits


def sampled_prefix_tokens(lm, m, seed):
    """The tokens apply_peft draws for the prefix (same rule, written out independently)."""
    special = set(lm.tokenizer.all_special_ids)
    allowed = torch.tensor([i for i in range(lm.model.config.vocab_size) if i not in special])
    return allowed[torch.randint(len(allowed), (1, m), generator=torch.Generator().manual_seed(seed))]


def loss_closure(lm, tokenizer):
    ids = torch.tensor([tokenizer.encode(TEXT)])

    def closure():
        return lm.model(input_ids=ids, labels=ids).loss

    return closure


# ------------------------------------------------------------------------------- what is trainable

def test_lora_wraps_query_and_value_only(tiny_tokenizer):
    lm = apply_peft(make_lm(tiny_tokenizer), "lora")
    names = [n for n, p in lm.model.named_parameters() if p.requires_grad]
    assert all(".lora_A." in n or ".lora_B." in n for n in names)
    assert {n.split(".self_attn.")[1].split(".")[0] for n in names} == {"q_proj", "v_proj"}
    # 2 layers x (q: A 8x32 + B 32x8, v: A 8x32 + B 16x8)
    assert sum(p.numel() for p in trainable(lm)) == 2 * ((8 * 32 + 32 * 8) + (8 * 32 + 16 * 8))
    assert peft_config(lm) == {"method": "lora", "r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"], "seed": 0}


def test_prefix_parameters_are_per_layer_key_values(tiny_tokenizer):
    lm = apply_peft(make_lm(tiny_tokenizer), "prefix", num_prefix_tokens=3)
    shapes = {n: tuple(p.shape) for n, p in lm.model.named_parameters() if p.requires_grad}
    # 2 layers x keys/values of [kv_heads=2, m=3, head_dim=8]
    assert shapes == {f"model.layers.{i}.self_attn.mezo_prefix.{kv}": (2, 3, 8) for i in (0, 1) for kv in ("keys", "values")}
    assert json.loads(json.dumps(peft_config(lm))) == {"method": "prefix", "num_prefix_tokens": 3, "seed": 0}


@pytest.mark.parametrize("method", METHODS)
def test_mezo_steps_change_only_adapter_parameters(tiny_tokenizer, method):
    from mezo_rl.engine.optim import MeZO

    lm = apply_peft(make_lm(tiny_tokenizer), method)
    before = {n: p.detach().clone() for n, p in lm.model.named_parameters()}
    opt = MeZO(trainable(lm), **mezo_options(MODE_DEFAULTS[method]), seed=1)
    closure = loss_closure(lm, tiny_tokenizer)
    with torch.no_grad():
        for _ in range(3):
            opt.step(closure)
    for name, p in lm.model.named_parameters():
        if p.requires_grad:
            if "lora_A" in name:  # B starts at zero, so A's first projected gradients may vanish
                continue
            assert not torch.equal(p, before[name]), f"adapter parameter {name} did not move"
        else:
            assert torch.equal(p, before[name]), f"frozen parameter {name} changed"


@pytest.mark.parametrize("method", METHODS)
def test_trajectory_replay_rebuilds_adapter_exactly(tiny_tokenizer, method, tmp_path):
    from mezo_rl.engine.optim import MeZO, replay_trajectory
    from mezo_rl.engine.trajectory import Trajectory

    lm = apply_peft(make_lm(tiny_tokenizer), method, seed=3)
    opt = MeZO(trainable(lm), **mezo_options(MODE_DEFAULTS[method]), seed=7)
    closure = loss_closure(lm, tiny_tokenizer)
    with torch.no_grad():
        for _ in range(4):
            opt.step(closure)
    opt.trajectory.save(tmp_path / "traj")
    cfg = json.loads(json.dumps(peft_config(lm)))  # what a checkpoint stores

    fresh = apply_peft(make_lm(tiny_tokenizer), **cfg)
    replay_trajectory(trainable(fresh), Trajectory.load(tmp_path / "traj"))
    for a, b in zip(lm.model.state_dict().values(), fresh.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_same_seed_same_adapter_other_seed_differs(tiny_tokenizer):
    for method in METHODS:
        a = trainable(apply_peft(make_lm(tiny_tokenizer), method, seed=5))
        b = trainable(apply_peft(make_lm(tiny_tokenizer), method, seed=5))
        c = trainable(apply_peft(make_lm(tiny_tokenizer), method, seed=6))
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        assert not all(torch.equal(x, y) for x, y in zip(a, c))


# ---------------------------------------------------------------------------- effect on the model

def test_lora_starts_as_identity_and_its_update_changes_output(tiny_tokenizer):
    lm = make_lm(tiny_tokenizer)
    base = logits(lm.model, TEXT, tiny_tokenizer)
    apply_peft(lm, "lora")
    assert torch.equal(logits(lm.model, TEXT, tiny_tokenizer), base)  # B = 0
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if "lora_B" in name:
                p.add_(0.1 * torch.randn_like(p))
    assert (logits(lm.model, TEXT, tiny_tokenizer) - base).abs().max() > 1e-3


def test_prefix_is_real_activations_of_sampled_tokens(tiny_tokenizer):
    """At init, the prefixed model on x computes what the plain model computes on [tokens] + x."""
    m = 5
    lm = make_lm(tiny_tokenizer)
    tokens = sampled_prefix_tokens(lm, m, seed=11)
    x = torch.tensor([tiny_tokenizer.encode(TEXT)])
    with torch.no_grad():
        plain = lm.model(input_ids=x).logits
        reference = lm.model(input_ids=torch.cat([tokens, x], dim=1)).logits[:, m:]
        # the keys/values the frozen model computes for those tokens (positions -m..-1, RoPE)
        cache = lm.model.model(input_ids=tokens, position_ids=torch.arange(-m, 0)[None], use_cache=True).past_key_values
    apply_peft(lm, "prefix", num_prefix_tokens=m, seed=11)
    for i, layer in enumerate(lm.model.model.layers):
        assert torch.equal(layer.self_attn.mezo_prefix.keys, cache.layers[i].keys[0])
        assert torch.equal(layer.self_attn.mezo_prefix.values, cache.layers[i].values[0])
    with torch.no_grad():
        adapted = lm.model(input_ids=x).logits
    assert_float32_close(adapted, reference, lm.model, m + x.shape[1])
    assert (adapted - plain).abs().max() > 1e-2  # the prefix matters
    # real activations are not noise: keys carry the k_proj structure (their scale), not N(0, 1)
    assert lm.model.model.layers[0].self_attn.mezo_prefix.keys.std() < 0.5


def test_prefix_works_through_the_bare_decoder_and_eager_attention(tiny_tokenizer):
    x = torch.tensor([tiny_tokenizer.encode(TEXT)])
    outs = []
    for impl in ("sdpa", "eager"):
        lm = make_lm(tiny_tokenizer, attn_implementation=impl)
        assert lm.model.config._attn_implementation == impl
        apply_peft(lm, "prefix")
        with torch.no_grad():
            full = lm.model(input_ids=x).logits
            bare = lm.model.lm_head(lm.model.model(input_ids=x).last_hidden_state)
        torch.testing.assert_close(bare, full)
        outs.append(full)
    assert_float32_close(outs[0], outs[1], lm.model, 5 + x.shape[1])  # 5: the default prefix length


# ------------------------------------------------------------------------ padding and generation

PROMPTS = ["It was", "the movie was good and the acting was bad . It was", "Does this mean"]
CANDIDATES = [[" great", " terrible"], [" good", " bad ."], [" Yes", " No"]]


@pytest.mark.parametrize("method", METHODS)
def test_batched_scores_equal_one_at_a_time(tiny_tokenizer, method):
    lm = apply_peft(make_lm(tiny_tokenizer), method, seed=2)
    with torch.no_grad():
        for p in trainable(lm):  # make LoRA non-trivial too
            p.add_(0.05 * torch.randn_like(p))
        batched = lm.score(PROMPTS, CANDIDATES)
        single = [lm.score([p], [c])[0] for p, c in zip(PROMPTS, CANDIDATES)]
    longest = max(len(tiny_tokenizer(p + c)["input_ids"]) for p, cs in zip(PROMPTS, CANDIDATES) for c in cs)
    for b, s in zip(batched, single):
        # + the prefix's 5 positions in the attention sums (prefix) or LoRA's extra products (lora)
        assert_float32_close(b.sum, s.sum, lm.model, longest + 5, extra_terms=int(s.n_tokens.max()) + lora_terms(lm.model))


def test_prefix_left_padding_without_position_ids(tiny_tokenizer):
    """A left-padded batch through the bare decoder (mask only) matches each row run alone."""
    lm = apply_peft(make_lm(tiny_tokenizer), "prefix")
    rows = [tiny_tokenizer.encode(t) for t in PROMPTS]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    with torch.no_grad():
        batched = lm.model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        for i, r in enumerate(rows):
            alone = lm.model.model(input_ids=torch.tensor([r])).last_hidden_state[0]
            assert_float32_close(batched[i, width - len(r):], alone, lm.model, width + 5)


def test_prefix_generation_with_kv_cache(tiny_tokenizer):
    """Cached, batched, left-padded greedy decoding == greedy decoding recomputed from scratch."""
    lm = apply_peft(make_lm(tiny_tokenizer), "prefix", seed=4)
    lm.model.config.use_cache = True
    prompts = PROMPTS[:2]
    got = lm.generate(prompts, max_new_tokens=6)
    for prompt, text in zip(prompts, got):
        ids = tiny_tokenizer.encode(prompt)
        new = []
        with torch.no_grad():
            for _ in range(6):
                nxt = int(lm.model(input_ids=torch.tensor([ids + new])).logits[0, -1].argmax())
                if nxt == tiny_tokenizer.eos_token_id:
                    break
                new.append(nxt)
        assert text == tiny_tokenizer.decode(new)


# ---------------------------------------------------------------------------------------- export

def test_lora_export_adapter_is_peft_format_and_merged_model_matches(tiny_tokenizer, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    lm = apply_peft(make_lm(tiny_tokenizer), "lora")
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if "lora_" in name:
                p.add_(0.1 * torch.randn_like(p))
    expected = logits(lm.model, TEXT, tiny_tokenizer)

    export_model(lm, tmp_path / "adapter")
    peft_loaded = PeftModel.from_pretrained(make_tiny_causal_lm(tiny_tokenizer), tmp_path / "adapter")
    n_text = len(tiny_tokenizer.encode(TEXT))
    assert_float32_close(logits(peft_loaded, TEXT, tiny_tokenizer), expected, lm.model, n_text, extra_terms=lora_terms(lm.model))
    ours = load_adapter(make_lm(tiny_tokenizer), tmp_path / "adapter")
    assert torch.equal(logits(ours.model, TEXT, tiny_tokenizer), expected)

    export_model(lm, tmp_path / "merged", merged=True)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    assert_float32_close(logits(merged, TEXT, tiny_tokenizer), expected, lm.model, n_text, extra_terms=lora_terms(lm.model))
    # exporting left the adapter in place
    assert torch.equal(logits(lm.model, TEXT, tiny_tokenizer), expected)


def test_prefix_export_roundtrip_and_no_merge(tiny_tokenizer, tmp_path):
    lm = apply_peft(make_lm(tiny_tokenizer), "prefix")
    with torch.no_grad():
        for p in trainable(lm):
            p.add_(0.1 * torch.randn_like(p))
    expected = logits(lm.model, TEXT, tiny_tokenizer)
    export_model(lm, tmp_path / "prefix")
    meta = json.loads((tmp_path / "prefix" / "mezo_peft.json").read_text())
    assert meta["peft_config"] == peft_config(lm) and meta["format"] == "mezo-prefix"
    loaded = load_adapter(make_lm(tiny_tokenizer), tmp_path / "prefix")
    assert torch.equal(logits(loaded.model, TEXT, tiny_tokenizer), expected)
    with pytest.raises(ValueError, match="cannot be merged"):
        export_model(lm, tmp_path / "merged", merged=True)


# ------------------------------------------------------------------------- trainer, replay, export

@pytest.mark.parametrize("method", METHODS)
def test_trainer_checkpoint_replays_and_exports_the_adapter(tiny_tokenizer, method, tmp_path):
    class KeepFinal(TrainerCallback):  # the weights after the last step (train() then restores the best)
        def on_step_end(self, args, state, control, model, **kwargs):
            self.state = {k: v.clone() for k, v in model.state_dict().items()}

    def examples(n, seed):
        g = torch.Generator().manual_seed(seed)
        labels = torch.randint(2, (n,), generator=g).tolist()
        return [Example(prompt=f"the movie was {'good' if y else 'bad'} . It was", candidates=[" terrible", " great"],
                        label=y, columns={}) for y in labels]

    factory = lambda: make_lm(tiny_tokenizer)  # noqa: E731
    args = MeZOConfig(model="tiny", task="sst2", reward=["cross_entropy"], peft=method, max_steps=4,
                             per_device_train_batch_size=4, eval_steps=2, autocast="none", progress=False, num_train=16,
                             num_eval=8, num_test=0, output_dir=str(tmp_path / "run"))
    splits = {"train": examples(16, 0), "validation": examples(8, 1), "test": []}
    final = KeepFinal()
    trainer = MeZOTrainer(args=args, lm=factory(), lm_factory=factory, task=get_task("sst2"), splits=splits, callbacks=[final])
    trainer.train()
    identity = json.loads((tmp_path / "run" / "checkpoint" / "model.json").read_text())
    assert identity["peft"] == peft_config(trainer.lm)

    rebuilt, _, n = load_run(tmp_path / "run", "final", lm=factory())
    assert n == 4
    initial = factory()
    apply_peft(initial, **identity["peft"])
    moved = [k for k, v in initial.model.state_dict().items() if not torch.equal(v, final.state[k])]
    assert moved and all("lora_" in k or "mezo_prefix" in k for k in moved)  # only the adapter trained
    for k, v in rebuilt.model.state_dict().items():
        assert torch.equal(v, final.state[k]), k
    export_model(rebuilt, tmp_path / "adapter")
    loaded = load_adapter(factory(), tmp_path / "adapter")
    assert torch.equal(logits(loaded.model, TEXT, tiny_tokenizer), logits(rebuilt.model, TEXT, tiny_tokenizer))


# ------------------------------------------------------------------------------------ bad input

def test_bad_input_errors(tiny_tokenizer, tiny_masked_lm):
    with pytest.raises(ValueError, match="accepted: lora, prefix"):
        apply_peft(make_lm(tiny_tokenizer), "adapter")
    with pytest.raises(ValueError, match="its linear layers are named"):
        apply_peft(make_lm(tiny_tokenizer), "lora", target_modules=("query",))
    lm = apply_peft(make_lm(tiny_tokenizer), "prefix")
    with pytest.raises(ValueError, match="already has a 'prefix' adapter"):
        apply_peft(lm, "lora")
    with pytest.raises(ValueError, match="num_prefix_tokens"):
        apply_peft(make_lm(tiny_tokenizer), "prefix", num_prefix_tokens=0)
    with pytest.raises(ValueError, match="decoder-only causal LM"):
        apply_peft(LanguageModel(*tiny_masked_lm), "prefix")


def test_lora_default_targets_map_to_other_architectures(tiny_masked_lm):
    lm = apply_peft(LanguageModel(*tiny_masked_lm), "lora")  # BERT names them query / value
    assert peft_config(lm)["target_modules"] == ["query", "value"]
    assert trainable(lm) and all("lora_" in n for n, p in lm.model.named_parameters() if p.requires_grad)


def test_paper_defaults():
    paper = dict(weight_decay=0.0, noise="gaussian", step_normalize="none", n_spsa=1)
    run = dict(max_steps=150, per_device_train_batch_size=32)
    # the full-parameter default, with the engine's default noise (low-rank r = 1; docs/engine.md)
    assert MODE_DEFAULTS["full"] == dict(learning_rate=2e-4, eps=1e-2, **run, **{**paper, "noise": "lowrank"})
    # LoRA: the paper's eps, an lr for runs of this CLI's length (the paper's 1e-4 is for 20,000 steps)
    assert MODE_DEFAULTS["lora"] == dict(learning_rate=3e-3, eps=1e-2, **run, **paper)
    assert MODE_DEFAULTS["prefix"] == dict(learning_rate=1e-2, eps=1e-1, **run, **paper)
    # the default mode: sign steps of length lr on the final norm's gains, two samples a step, many cheap steps
    assert MODE_DEFAULTS["norm"] == dict(max_steps=3000, per_device_train_batch_size=64, learning_rate=2e-2, eps=1e-1,
                                         weight_decay=0.0, noise="rademacher", step_normalize="std", n_spsa=2)


# ------------------------------------------------------------------------------- the real model

@pytest.mark.slow
def test_smollm2_prefix_and_lora(tmp_path):
    """SmolLM2-135M: the real-activation prefix equals literally prepending its tokens; scores batch
    exactly; a LoRA-merged export reproduces the adapted model."""
    from transformers import AutoModelForCausalLM

    from mezo_rl.model.loading import load_model

    lm = load_model("smollm2-135m")
    tokens = sampled_prefix_tokens(lm, 5, seed=0)
    x = torch.tensor([lm.tokenizer.encode("The movie was wonderful. It was")])
    with torch.no_grad():
        reference = lm.model(input_ids=torch.cat([tokens, x], dim=1)).logits[:, 5:]
    apply_peft(lm, "prefix")
    assert sum(p.numel() for p in trainable(lm)) == 30 * 2 * 3 * 5 * 64
    with torch.no_grad():
        assert_float32_close(lm.model(input_ids=x).logits, reference, lm.model, 5 + x.shape[1])
        batched = lm.score(PROMPTS, CANDIDATES)
        single = [lm.score([p], [c])[0] for p, c in zip(PROMPTS, CANDIDATES)]
    longest = max(len(lm.tokenizer(p + c)["input_ids"]) for p, cs in zip(PROMPTS, CANDIDATES) for c in cs)
    for b, s in zip(batched, single):
        assert_float32_close(b.sum, s.sum, lm.model, longest + 5, extra_terms=int(s.n_tokens.max()))

    lm = apply_peft(load_model("smollm2-135m"), "lora")
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    expected = lm.model(input_ids=x).logits.detach()
    export_model(lm, tmp_path / "merged", merged=True)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    with torch.no_grad():
        assert_float32_close(merged(input_ids=x).logits, expected, lm.model, x.shape[1], extra_terms=lora_terms(lm.model))
