"""A TRL GRPO recipe runs as written (issue 68): reward weights over reward_funcs, one set of metric names, the
final weights by default, hub checks before the first step, PEFT adapters, completions while training."""
from __future__ import annotations

import pytest

from conftest import make_tiny_causal_lm
from test_cli_errors import assert_one_line_error, run_cli

from mezo_rl import MeZOConfig
from mezo_rl.errors import ConfigError
from mezo_rl.training.plan import plan_given

datasets = pytest.importorskip("datasets")
from datasets import Dataset  # noqa: E402

PROMPTS = [f"the movie was good and the acting was bad . {i}" for i in range(24)]


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def reward_words(completions, **kwargs):
    return [float(len(completion.split())) for completion in completions]


# ---------------------------------------------------------------------- 1. reward_weights weigh reward_funcs
def test_reward_weights_weigh_reward_funcs_in_order(tmp_path, tiny_tokenizer):
    args = MeZOConfig(output_dir=str(tmp_path / "out"), reward_weights=[1.0, 0.5])
    plan, _, _ = plan_given(args, make_tiny_causal_lm(tiny_tokenizer), [reward_len, reward_words],
                            Dataset.from_dict({"prompt": PROMPTS}), processing_class=tiny_tokenizer)
    weights = [plan.objective.weights[name] for name in plan.objective.names]
    assert [n.rpartition(":")[2] for n in plan.objective.names] == ["reward_len", "reward_words"]
    assert weights == [1.0, 0.5] and plan.args.reward_weights == [1.0, 0.5]


def test_a_count_mismatch_is_one_line_naming_the_functions_given(tmp_path, tiny_tokenizer):
    args = MeZOConfig(output_dir=str(tmp_path / "out"), reward_weights=[1.0, 0.5, 2.0])
    with pytest.raises(ConfigError) as err:
        plan_given(args, make_tiny_causal_lm(tiny_tokenizer), [reward_len, reward_words],
                   Dataset.from_dict({"prompt": PROMPTS}), processing_class=tiny_tokenizer)
    message = str(err.value)
    assert "\n" not in message and "got 3 weights for 2 rewards ['reward_len', 'reward_words']" in message
    assert "reward_funcs" in message


def test_the_cli_checks_weights_against_the_task_own_reward_before_anything_loads(tmp_path, capsys):
    rc, _, err = run_cli(["train", "--model", "/nonexistent/model-dir", "--task", "sst2", "--reward-weights", "1,2",
                          "--output-dir", tmp_path / "run"], capsys)
    assert_one_line_error(rc, err, "--reward-weights", "['accuracy']")
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------- 2. one name per metric, TRL's
def _trainer(tmp_path, tiny_tokenizer, name="out", reward_funcs=(reward_len, reward_words), model=None, **fields):
    from mezo_rl import MeZOTrainer

    values = dict(output_dir=str(tmp_path / name), max_steps=2, eval_steps=1, per_device_train_batch_size=4,
                  n_spsa=1, num_train=12, num_eval=4, num_test=4, max_completion_length=6, progress=False)
    values.update(fields)
    return MeZOTrainer(model=model if model is not None else make_tiny_causal_lm(tiny_tokenizer),
                       reward_funcs=list(reward_funcs), args=MeZOConfig(**values),
                       train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=tiny_tokenizer)


def test_evaluate_log_history_and_metric_for_best_model_share_trls_names(tmp_path, tiny_tokenizer):
    trainer = _trainer(tmp_path, tiny_tokenizer, metric_for_best_model="eval_rewards/reward_len/mean")
    trainer.train()
    metrics = trainer.evaluate()
    for key in ("eval_reward", "eval_reward_std", "eval_rewards/reward_len/mean", "eval_rewards/reward_len/std",
                "eval_rewards/reward_words/mean", "eval_rewards/reward_words/std", "eval_kl"):
        assert key in metrics, (key, sorted(metrics))
    assert not any(":" in key or "objective" in key for key in metrics)
    logged = [r for r in trainer.state.log_history if "eval_reward" in r]
    assert logged and {k for k in metrics if k != "eval_runtime"} <= set(logged[-1])
    # the best step was picked by the metric named as evaluate() names it
    best = max(logged, key=lambda r: (r["eval_rewards/reward_len/mean"], r["step"]))
    assert trainer.state.best_metric == best["eval_rewards/reward_len/mean"]
    assert trainer.train_metrics(trainer.summary).keys() >= {"eval_reward", "test_rewards/reward_words/mean"}


@pytest.mark.parametrize("name", ["eval_reward", "reward", "rewards/reward_words/mean", "eval_rewards/reward_len/mean"])
def test_metric_for_best_model_takes_trls_names(tmp_path, tiny_tokenizer, name):
    args = MeZOConfig(output_dir=str(tmp_path / "out"), metric_for_best_model=name)
    plan, _, _ = plan_given(args, make_tiny_causal_lm(tiny_tokenizer), [reward_len, reward_words],
                            Dataset.from_dict({"prompt": PROMPTS}), processing_class=tiny_tokenizer)
    assert plan.metric_for_best in ("objective", *plan.objective.names)


def test_metric_for_best_model_refuses_other_names_in_one_line_listing_trls(tmp_path, tiny_tokenizer):
    args = MeZOConfig(output_dir=str(tmp_path / "out"), metric_for_best_model="objective")
    with pytest.raises(ConfigError) as err:
        plan_given(args, make_tiny_causal_lm(tiny_tokenizer), [reward_len, reward_words],
                   Dataset.from_dict({"prompt": PROMPTS}), processing_class=tiny_tokenizer)
    assert "\n" not in str(err.value) and "eval_reward, eval_rewards/reward_len/mean" in str(err.value)


def test_a_reward_is_named_by_its_function_and_by_its_module_only_to_break_a_tie():
    from mezo_rl.rewards import trl_names

    assert trl_names(["a.b:reward_len", "accuracy", "org/my-rm"]) == {
        "a.b:reward_len": "reward_len", "accuracy": "accuracy", "org/my-rm": "my-rm"}
    assert trl_names(["a.b:score", "c.d:score"]) == {"a.b:score": "a.b:score", "c.d:score": "c.d:score"}


# ---------------------------------------------------------------------- 3. the final weights by default
def _saved_weights(path):
    from safetensors.torch import load_file

    return {k: v for f in sorted(path.glob("*.safetensors")) for k, v in load_file(f).items()}


def test_a_short_run_saves_its_final_weights_and_says_which_step(tmp_path, tiny_tokenizer, capsys):
    import torch

    model = make_tiny_causal_lm(tiny_tokenizer)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trainer = _trainer(tmp_path, tiny_tokenizer, model=model, learning_rate=1e-2, eps=1.0, num_generations=2,
                       save_model=True)
    assert trainer.args.load_best_model_at_end is False  # transformers' default
    trainer.train()
    assert trainer.summary["best_step"] == 2 == trainer.weights_step
    saved = _saved_weights(tmp_path / "out")
    assert any(not torch.equal(saved[k], start[k]) for k in saved if k in start)
    lines = [line for line in capsys.readouterr().out.splitlines() if "save_model" in line]
    assert lines == [f"mezo-rl: save_model wrote the weights of step 2 (the final step; load_best_model_at_end=True "
                     f"would write the best step's) to {tmp_path / 'out'}"]


def test_with_load_best_model_at_end_a_tie_goes_to_the_later_step(tmp_path, tiny_tokenizer, capsys):
    # lr 0: every evaluation ties step 0's; the later step wins each tie
    trainer = _trainer(tmp_path, tiny_tokenizer, learning_rate=0.0, load_best_model_at_end=True)
    trainer.train()
    assert trainer.state.best_global_step == 2 == trainer.weights_step
    trainer.save_model(str(tmp_path / "saved"))
    assert "weights of step 2 (the best step by eval_reward, load_best_model_at_end=True)" in capsys.readouterr().out


# ---------------------------------------------------------------------- 4. the Hub, checked before the first step
def test_an_offline_push_to_hub_fails_before_step_one(tmp_path, tiny_tokenizer, monkeypatch):
    from mezo_rl.training.model_card import HubPushError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubPushError) as err:
        _trainer(tmp_path, tiny_tokenizer, push_to_hub=True, hub_model_id="me/run")
    assert "\n" not in str(err.value) and "HF_HUB_OFFLINE" in str(err.value)
    assert not (tmp_path / "out").exists()  # nothing ran: no metrics, no checkpoint


def test_the_cli_refuses_an_offline_push_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import json

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = tmp_path / "config-only"  # found by the checks; loading it would fail differently
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    rc, _, err = run_cli(["train", "--model", model, "--task", "sst2", "--push-to-hub", "--hub-model-id", "me/run",
                          "--output-dir", tmp_path / "run"], capsys)
    assert_one_line_error(rc, err, "HF_HUB_OFFLINE", "push_to_hub")


def test_hub_strategy_unknown_is_one_line():
    with pytest.raises(ConfigError, match="--hub-strategy: got 'all_checkpoints', accepted: every_save, end, checkpoint"):
        MeZOConfig(hub_strategy="all_checkpoints")


class FakeHub:
    """huggingface_hub.HfApi as the Hub would answer a logged-in user, recording the uploads."""
    calls: list = []

    def __init__(self, token=None):
        self.token = token

    def whoami(self):
        return {"name": "me"}

    def create_repo(self, repo_id, private=None, exist_ok=False):
        FakeHub.calls.append(("create", repo_id))

    def upload_folder(self, folder_path, repo_id, path_in_repo=None, commit_message=None):
        FakeHub.calls.append(("upload", repo_id, path_in_repo))
        return type("Info", (), {"commit_url": f"https://hf.co/{repo_id}/commit/1"})()


@pytest.mark.parametrize("strategy, uploads", [("end", [None]), ("every_save", [None] * 3),
                                               ("checkpoint", [None, "last-checkpoint"] * 2 + [None])])
def test_hub_strategy_is_honoured(tmp_path, tiny_tokenizer, monkeypatch, strategy, uploads):
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHub)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_token")
    FakeHub.calls = []
    trainer = _trainer(tmp_path, tiny_tokenizer, push_to_hub=True, hub_model_id="run", hub_strategy=strategy)
    assert FakeHub.calls == [("create", "me/run")]  # checked, and the repository made, before the first step
    trainer.train()
    # saves after steps 1 and 2 (each evaluation's), then the upload at the end
    assert [c[2] for c in FakeHub.calls if c[0] == "upload"] == uploads
    assert all(c[1] == "me/run" for c in FakeHub.calls)


# ---------------------------------------------------------------------- 5. LoRA: the adapter folder peft loads
def test_a_lora_run_saves_an_adapter_that_peft_loads_with_the_same_logits(tmp_path, tiny_tokenizer):
    import torch
    from peft import LoraConfig, PeftModel

    from mezo_rl import MeZOTrainer

    args = MeZOConfig(output_dir=str(tmp_path / "lora"), max_steps=2, eval_steps=2, per_device_train_batch_size=8,
                      n_spsa=2, num_train=12, num_eval=4, num_test=4, max_completion_length=6, progress=False,
                      learning_rate=1.0, eps=20.0, num_generations=4)
    trainer = MeZOTrainer(model=make_tiny_causal_lm(tiny_tokenizer), reward_funcs=[reward_len], args=args,
                          train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=tiny_tokenizer,
                          peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    trainer.train()
    out = trainer.save_model()
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    assert not (out / "model.safetensors").exists() and (out / "tokenizer_config.json").is_file()
    loaded = PeftModel.from_pretrained(make_tiny_causal_lm(tiny_tokenizer), str(out)).eval()
    ids = torch.tensor([tiny_tokenizer("the movie was good and the acting was bad .")["input_ids"]])
    with torch.no_grad():
        expected, got = trainer.model(input_ids=ids).logits, loaded(input_ids=ids).logits
        start = make_tiny_causal_lm(tiny_tokenizer)(input_ids=ids).logits
    assert (got - expected).abs().max().item() <= 1e-5
    assert (expected - start).abs().max().item() > 1e-4  # the adapter moved: the comparison means something

    # merged where asked: a plain from_pretrained model with the same logits
    from transformers import AutoModelForCausalLM

    trainer.args = trainer.plan.args.__class__(**{**trainer.args.to_dict(), "merge": True})
    merged = trainer.save_model(str(tmp_path / "merged"))
    assert (merged / "model.safetensors").is_file() and not (merged / "adapter_config.json").exists()
    with torch.no_grad():
        folded = AutoModelForCausalLM.from_pretrained(str(merged))(input_ids=ids).logits
    assert (folded - expected).abs().max().item() <= 1e-4


def test_merge_needs_lora_and_export_takes_merge(tmp_path):
    with pytest.raises(ConfigError, match="--merge folds a LoRA adapter into the weights; --peft full"):
        MeZOConfig(peft="full", merge=True)


# ---------------------------------------------------------------------- 6. completions while training
def test_log_completions_writes_a_table_every_logging_step_with_trls_length_keys(tmp_path, tiny_tokenizer, capsys):
    import pyarrow.parquet as pq

    trainer = _trainer(tmp_path, tiny_tokenizer, log_completions=True, num_completions_to_print=2, max_steps=3,
                       eval_steps=3, logging_steps=1)
    trainer.train()
    out = tmp_path / "out" / "completions"
    for step in (1, 2, 3):
        table = pq.read_table(out / f"train-step{step:06d}.parquet").to_pylist()
        assert len(table) == 4 and {"step", "prompt", "completion", "reward_len", "reward_words"} <= set(table[0])
        assert all(r["step"] == step for r in table)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[train step")]
    assert len(printed) == 6 and '"reward_len"' in printed[0]
    logged = [h for h in trainer.state.log_history if "loss" in h]
    for key in ("completions/mean_length", "completions/min_length", "completions/max_length",
                "completions/clipped_ratio", "num_tokens"):
        assert all(key in h for h in logged), key
    h = logged[-1]
    assert h["completions/min_length"] <= h["completions/mean_length"] <= h["completions/max_length"] <= 6
    assert 0 <= h["completions/clipped_ratio"] <= 1
    tokens = [h["num_tokens"] for h in logged]
    assert tokens == sorted(tokens) and tokens[0] > 0 and len(set(tokens)) == 3  # a running count, as TRL's


def test_the_completions_table_goes_to_trackio(tmp_path, tiny_tokenizer, monkeypatch):
    import trackio

    tables = []
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    real_log = trackio.log
    monkeypatch.setattr(trackio, "log", lambda logs, step=None: tables.extend(
        v for v in logs.values() if isinstance(v, trackio.Table)) or real_log(
        {k: v for k, v in logs.items() if not isinstance(v, trackio.Table)}, step=step))
    trainer = _trainer(tmp_path, tiny_tokenizer, log_completions=2, report_to="trackio")
    trainer.train()
    assert len(tables) == 2  # one per logging step


# ---------------------------------------------------------------------- 7. the nearest flag for a mistyped one
def test_a_mistyped_flag_gets_the_nearest_one_in_one_line(tmp_path, capsys):
    rc, _, err = run_cli(["train", "--lernin-rate", "1e-3", "--output-dir", tmp_path / "run"], capsys)
    assert_one_line_error(rc, err, "--lernin-rate", "did you mean --learning-rate?")
    rc, _, err = run_cli(["export", "--run-dir", tmp_path, "--output", tmp_path / "x", "--merged"], capsys)
    assert_one_line_error(rc, err, "did you mean --merge?")
    rc, _, err = run_cli(["train", "--zzzz"], capsys)
    assert_one_line_error(rc, err, "unrecognized arguments: --zzzz")
    assert "did you mean" not in err


# ---------------------------------------------------------------------- 8. a GRPO-sized learning rate
def test_a_grpo_sized_learning_rate_gets_one_warning_line_naming_the_mode_default(tmp_path, tiny_tokenizer, caplog):
    import logging

    from mezo_rl.training.resolve import SMALL_LR_FACTOR, mode_defaults

    def warned(**fields):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="mezo_rl"):
            plan_given(MeZOConfig(output_dir=str(tmp_path / "out"), **fields), make_tiny_causal_lm(tiny_tokenizer),
                       [reward_len], Dataset.from_dict({"prompt": PROMPTS}), processing_class=tiny_tokenizer)
        return [r.getMessage() for r in caplog.records if "learning_rate" in r.getMessage()]

    default = mode_defaults("full", "prompts")["learning_rate"]
    (line,) = warned(learning_rate=1e-6)
    assert "\n" not in line and f"full mode's default for a prompt task ({default:g})" in line
    assert warned(learning_rate=default / SMALL_LR_FACTOR) == []  # the rule: below 1/100 of the default
    assert warned() == [] and warned(learning_rate=0.0) == []  # the default, and an lr of 0 (meant), say nothing
    (line,) = warned(learning_rate=1e-6, peft="lora")
    assert f"lora mode's default for a prompt task ({mode_defaults('lora', 'prompts')['learning_rate']:g})" in line


# ---------------------------------------------------------------------- 10. the docs say what the code does
DOCS = __import__("pathlib").Path(__file__).resolve().parents[1] / "docs"


def _bullet(text: str, label: str) -> set[str]:
    import re

    start = text.index(f"- **{label}**")
    end = text.find("\n- **", start + 1)
    body = text[start:end if end != -1 else text.index("\n\n", start)]
    body = re.sub(r"\[[^\]]*\]\([^)]*\)", "", body)  # links
    return set(re.findall(r"`([a-z0-9_]+\*?)`", body))


def test_api_md_lists_the_refused_and_ignored_fields_the_code_has():
    from mezo_rl.training.config import ACCEPTED_ONLY, NO_MEANING, NO_MEANING_PREFIXES, REFUSED

    text = (DOCS / "api.md").read_text()
    section = text[text.index("### Refused and ignored fields"):]
    assert _bullet(section, "Refused") == set(REFUSED)
    assert _bullet(section, "Accepted at some values only") == set(ACCEPTED_ONLY)
    assert _bullet(section, "No meaning for MeZO") == set(NO_MEANING) | {p + "*" for p in NO_MEANING_PREFIXES}


def test_rl_md_gives_a_reason_for_every_ignored_field_the_code_has():
    import re

    from mezo_rl.training.config import NO_MEANING, NO_MEANING_PREFIXES, no_meaning

    text = (DOCS / "rl.md").read_text()
    table = text[text.index("| GRPOConfig / TrainingArguments | why it has no meaning here |"):]
    table = table[:table.index("\n\n")]
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    named = {name: why.rstrip(" |") for names, why in rows for name in re.findall(r"`([a-z0-9_]+\*?)`", names)}
    assert set(named) == set(NO_MEANING) | {p + "*" for p in NO_MEANING_PREFIXES}
    for name, why in named.items():
        assert why == no_meaning(name.rstrip("*") + ("x" if name.endswith("*") else "")), name


@pytest.mark.parametrize("field", sorted(__import__("mezo_rl.training.config", fromlist=["x"]).ACCEPTED_ONLY))
def test_each_field_accepted_at_some_values_only_refuses_another_in_one_line(field):
    from mezo_rl.training.config import ACCEPTED_ONLY

    with pytest.raises(ConfigError) as err:
        MeZOConfig(**{field: ACCEPTED_ONLY[field][0]})
    assert "\n" not in str(err.value) and field.replace("_", "-") in str(err.value).replace("_", "-")


def test_the_sentiment_example_without_its_data_ends_in_one_line(tmp_path):
    import subprocess
    import sys

    example = DOCS.parent / "examples" / "rl_sentiment.py"
    env = {**__import__("os").environ, "MEZO_RL_DATA": str(tmp_path / "missing")}
    proc = subprocess.run([sys.executable, str(example), "--output-dir", str(tmp_path / "out")], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "SST-2" in proc.stderr and "MEZO_RL_DATA" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_arithmetic_example_describes_itself_in_whole_sentences():
    import subprocess
    import sys

    example = DOCS.parent / "examples" / "rl_arithmetic.py"
    out = subprocess.run([sys.executable, str(example), "--help"], capture_output=True, text=True, timeout=120).stdout
    description = " ".join(out.split("\n\n")[1].split())
    assert description.endswith("cannot be faked.") and description.startswith("RL on a verifiable task")


# ---------------------------------------------------------------------- 9. TRL's sampling knobs, honoured
def test_the_sampling_knobs_shape_the_logits_as_transformers_processors_do():
    import torch
    from transformers.generation.logits_process import (LogitsProcessorList, MinPLogitsWarper,
                                                        RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    from mezo_rl.model.decoding import Sampling, shaped_logits

    g = torch.Generator().manual_seed(0)
    logits, ids = torch.randn(4, 50, generator=g) * 3, torch.randint(0, 50, (4, 7), generator=g)
    seen = torch.zeros(4, 50, dtype=torch.bool).scatter_(1, ids, True)
    for s in (Sampling(0.7, 0.9, 20, 0.05, 1.3), Sampling(1.3, 0.5, None, None, 1.0), Sampling(1.0, 1.0, 5, 0.2, 2.0)):
        theirs = LogitsProcessorList(
            ([RepetitionPenaltyLogitsProcessor(s.repetition_penalty)] if s.repetition_penalty != 1 else [])
            + [TemperatureLogitsWarper(s.temperature)] + ([TopKLogitsWarper(s.top_k)] if s.top_k else [])
            + ([TopPLogitsWarper(s.top_p)] if s.top_p < 1 else []) + ([MinPLogitsWarper(s.min_p)] if s.min_p else []))
        expected = theirs(ids, logits.clone())
        got = shaped_logits(logits.clone(), True, s, seen)
        assert torch.equal(torch.isinf(got), torch.isinf(expected)), s
        assert torch.allclose(got[~torch.isinf(got)], expected[~torch.isinf(expected)]), s


def test_sampling_knobs_same_seed_same_text_and_every_member_of_a_batch_alike(tiny_tokenizer):
    from mezo_rl.model.lm import LanguageModel

    lm = LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)
    prompts = PROMPTS[:5]
    knobs = dict(do_sample=True, temperature=0.9, top_p=0.95, top_k=50, min_p=0.02, repetition_penalty=1.3)
    a = lm.generate(prompts, max_new_tokens=8, seed=3, **knobs)
    assert a == lm.generate(prompts, max_new_tokens=8, seed=3, **knobs)  # the same seed, the same text
    members = lm.generate(prompts, max_new_tokens=8, seed=3, members=3, **knobs)  # one batched pass, same weights
    assert members == [a, a, a]
    assert a != lm.generate(prompts, max_new_tokens=8, seed=4, **knobs)
    # the knobs act: a single allowed token is greedy decoding; a repetition penalty changes greedy text
    greedy = lm.generate(prompts, max_new_tokens=8)
    assert lm.generate(prompts, max_new_tokens=8, do_sample=True, seed=5, top_k=1) == greedy
    assert lm.generate(prompts, max_new_tokens=8, do_sample=True, seed=5, top_p=1e-6) == greedy
    assert lm.generate(prompts, max_new_tokens=8, do_sample=True, seed=5, min_p=1.0) == greedy
    assert lm.generate(prompts, max_new_tokens=8, repetition_penalty=50.0) != greedy


def test_a_run_decodes_its_completions_with_trls_knobs_in_both_member_evaluations(tmp_path, tiny_tokenizer):
    from unittest import mock

    from mezo_rl.model import decoding

    seen = []
    real = decoding._decode

    def spy(lm, input_ids, mask, stop_check, max_new_tokens, do_sample, gen, sampling, members):
        seen.append((do_sample, sampling, members))
        return real(lm, input_ids, mask, stop_check, max_new_tokens, do_sample, gen, sampling, members)

    for evaluation, name in (("inplace", "in"), ("batched", "ba")):
        seen.clear()
        trainer = _trainer(tmp_path, tiny_tokenizer, name=name, num_generations=2, temperature=0.9, top_p=0.95,
                           top_k=50, min_p=0.02, repetition_penalty=1.1, member_evaluation=evaluation, peft="lora",
                           max_steps=1, eval_strategy="no")
        with mock.patch.object(decoding, "_decode", spy):
            trainer.train()
        sampled = [s for s in seen if s[0]]
        assert sampled and all(s[1] == decoding.Sampling(0.9, 0.95, 50, 0.02, 1.1) for s in sampled)
        assert any(s[2] > 1 for s in sampled) == (evaluation == "batched")


@pytest.mark.parametrize("field, value, accepted", [("top_p", 1.5, "> 0 and <= 1"), ("top_p", 0.0, "> 0 and <= 1"),
                                                     ("top_k", -1, "an integer >= 0"),
                                                     ("repetition_penalty", 0.0, "a number > 0"),
                                                     ("repetition_penalty", -1.0, "a number > 0")])
def test_bad_sampling_values_are_one_line_before_any_model_loads(tmp_path, capsys, field, value, accepted):
    rc, _, err = run_cli(["train", "--model", "/nonexistent/model-dir", "--num-generations", "2",
                          f"--{field.replace('_', '-')}", str(value), "--output-dir", tmp_path / "run"], capsys)
    assert_one_line_error(rc, err, f"--{field.replace('_', '-')}: got", accepted)


def test_generation_kwargs_override_the_knobs_and_take_only_theirs():
    args = MeZOConfig(num_generations=2, per_device_train_batch_size=4, top_p=0.9,
                      generation_kwargs={"top_p": 0.5, "repetition_penalty": 1.2})
    assert (args.sampling().top_p, args.sampling().repetition_penalty) == (0.5, 1.2)
    with pytest.raises(ConfigError, match="--generation-kwargs: num_beams not honoured; accepted keys: temperature"):
        MeZOConfig(generation_kwargs={"num_beams": 4})
    with pytest.raises(ConfigError, match="--generation-kwargs: top_p: got 2"):
        MeZOConfig(num_generations=2, per_device_train_batch_size=4, generation_kwargs={"top_p": 2})


# ---------------------------------------------------------------------- the ported recipe, every field at once
def test_the_ported_grpo_recipe_runs_as_written_on_the_tiny_model(tmp_path, tiny_tokenizer, caplog):
    """examples/trl_grpo_recipe.py's fields and rewards (two weighted functions with a dataset column, TRL's
    sampling knobs, LoRA with dropout, log_completions, the hub off), a tiny model and 2 steps in place of
    SmolLM2 and 40: one warning line for the fields with no meaning, TRL's metric names, an adapter folder."""
    import copy
    import importlib.util
    import json
    import logging
    import pathlib

    from peft import LoraConfig

    from mezo_rl import MeZOTrainer

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "trl_grpo_recipe.py"
    spec = importlib.util.spec_from_file_location("trl_grpo_recipe", path)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}assistant:{% endif %}")
    with caplog.at_level(logging.WARNING, logger="mezo_rl"):
        trainer = MeZOTrainer(model=make_tiny_causal_lm(tokenizer), reward_funcs=[recipe.correct_answer, recipe.short_reply],
                              args=recipe.config(str(tmp_path / "out"), 2, max_completion_length=6, progress=False),
                              train_dataset=recipe.dataset("train", 32), eval_dataset=recipe.dataset("validation", 8),
                              processing_class=tokenizer,
                              peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.05, target_modules="all-linear",
                                                     task_type="CAUSAL_LM"))
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name == "mezo_rl"]
    assert len(warned) == 1 and "gradient_checkpointing" in warned[0] and "\n" not in warned[0]
    a = trainer.args
    assert (a.peft, a.lora_dropout, a.reward_weights, a.do_sample) == ("lora", 0.05, [1.0, 0.5], True)
    assert (a.temperature, a.top_p, a.top_k, a.beta, a.num_generations) == (0.9, 0.95, 50, 0.04, 4)
    trainer.train()
    metrics = trainer.evaluate()
    assert {"eval_reward", "eval_rewards/correct_answer/mean", "eval_rewards/short_reply/mean", "eval_kl"} <= set(metrics)
    assert metrics["eval_reward"] == pytest.approx(metrics["eval_rewards/correct_answer/mean"]
                                                   + 0.5 * metrics["eval_rewards/short_reply/mean"])
    assert sorted(p.name for p in (tmp_path / "out" / "completions").glob("train-step*.parquet")) == [
        "train-step000001.parquet", "train-step000002.parquet"]  # a table every logging step
    out = trainer.save_model()
    assert json.loads((out / "adapter_config.json").read_text())["lora_dropout"] == 0.05
