"""Every field of transformers' TrainingArguments and TRL's GRPOConfig is handled by MeZOConfig: honoured (a
field of the same name, or a spelling mapped onto one), accepted and named in one warning line saying why it
has no meaning for MeZO, or refused where the run would silently lack what it asks for; never "unknown".
A script written for GRPOTrainer runs with two names changed."""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import pathlib

import pytest

from mezo_rl.errors import ConfigError
from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.training.config import NO_MEANING, REFUSED, TRL_MAPPED, handled

import transformers

#: GRPOConfig's own fields (beyond TrainingArguments'), as trl 1.x names them: trl is a benchmark-only extra, so
#: where it is not installed the field list comes from this snapshot (written from the installed trl, whose
#: version it names); where it is, from trl itself
GRPO_FIELDS = pathlib.Path(__file__).parent / "data" / "grpo_config_fields.json"


def _defaults(cls) -> dict:
    return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(cls) if f.init}


def _theirs() -> dict:
    trl = pytest.importorskip("trl")
    return {**_defaults(transformers.TrainingArguments), **_defaults(trl.GRPOConfig)}


def _their_names() -> set[str]:
    try:
        import trl
    except ImportError:
        return set(_defaults(transformers.TrainingArguments)) | set(json.loads(GRPO_FIELDS.read_text())["fields"])
    return set(_theirs())


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name == "mezo_rl"]


def test_every_field_of_training_arguments_and_grpo_config_is_handled():
    ours = {f.name for f in dataclasses.fields(MeZOConfig)}
    unhandled = sorted(k for k in _their_names() if handled(k, ours) is None)
    assert not unhandled
    # the table holds no stale entry: a field we honour is not also listed as meaningless or refused
    assert not (ours & (set(NO_MEANING) | set(REFUSED))) and not (set(TRL_MAPPED) & ours - {"log_completions"})


def test_their_defaults_all_at_once_build_with_one_warning_line(tmp_path, caplog):
    values = {**_theirs(), "output_dir": str(tmp_path / "out")}
    with caplog.at_level(logging.WARNING, logger="mezo_rl"):
        args = MeZOConfig(**values)
    warned = _warnings(caplog)
    assert len(warned) == 1 and "\n" not in warned[0]
    assert "optim" in warned[0] and "the optimizer is MeZO" in warned[0] and "loss_type" in warned[0]
    assert "use_vllm" not in warned[0]  # given at "off": nothing to say
    # what their defaults mean, honoured: max_steps=-1 leaves the run's length to the plan, from the epochs
    from mezo_rl.tasks import get_task
    from mezo_rl.training.plan import run_config

    assert args.max_steps is None
    args = run_config(args, get_task("sst2"))
    assert args.max_steps == math.ceil(3.0 * args.num_train / args.prompts_per_step)
    assert args.lr_scheduler_type == "linear" and args.learning_rate == 1e-6 and args.seed == 42
    assert args.num_generations == 8 and args.do_sample is True  # TRL samples its generations
    assert args.eval_strategy == "no" and args.load_best_model_at_end is False and args.log_completions == 0


def test_refused_fields_are_named_together_with_their_reasons():
    with pytest.raises(ConfigError) as err:
        MeZOConfig(fp16=True, lr_scheduler_kwargs={"num_cycles": 2})
    message = str(err.value)
    assert "fp16=True" in message and "bf16=True" in message and "lr_scheduler_kwargs" in message
    assert "\n" not in message


def test_unknown_fields_are_named_together_and_did_you_mean_is_close():
    with pytest.raises(ConfigError) as err:
        MeZOConfig(learning_rte=1e-3, zzz_frobnicate=1)
    message = str(err.value)
    assert "'learning_rte' (did you mean 'learning_rate'?)" in message and "'zzz_frobnicate'" in message
    assert "did you mean 'num_train'" not in message
    MeZOConfig(do_train=True)  # a script's switch, as in transformers: accepted, never "did you mean num_train"


def test_honoured_fields_change_the_config():
    assert MeZOConfig(warmup_ratio=0.1).warmup_steps == 0.1
    assert MeZOConfig(disable_tqdm=True).progress is False and MeZOConfig(bf16=True).autocast == "bfloat16"
    assert MeZOConfig(per_device_eval_batch_size=3).eval_batch_size == 3
    gas = MeZOConfig(per_device_train_batch_size=2, gradient_accumulation_steps=3, num_generations=3)
    assert gas.prompts_per_step == 2 and gas.do_sample is True
    with pytest.raises(ConfigError, match="must divide"):
        MeZOConfig(per_device_train_batch_size=1, gradient_accumulation_steps=1, num_generations=6)
    from mezo_rl.tasks import get_task
    from mezo_rl.training.plan import run_config
    sst2 = get_task("sst2")
    assert run_config(MeZOConfig(num_train=100, per_device_train_batch_size=4, num_train_epochs=2), sst2).max_steps == 50
    assert run_config(MeZOConfig(num_train=100, max_steps=7, num_train_epochs=2), sst2).max_steps == 7  # max_steps wins, as in transformers
    assert MeZOConfig(output_dir="runs/a", resume_from_checkpoint="runs/a/checkpoint").resume is True
    with pytest.raises(ConfigError, match="its own output_dir"):
        MeZOConfig(output_dir="runs/a", resume_from_checkpoint="runs/b")
    # TRL's sampling knobs are honoured (issue 68): the decode's Sampling holds them
    knobs = dict(top_p=0.9, top_k=50, min_p=0.05, repetition_penalty=1.1)
    sampling = MeZOConfig(do_sample=True, temperature=0.7, **knobs).sampling()
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p, sampling.repetition_penalty) == (
        0.7, 0.9, 50, 0.05, 1.1)
    for name in ("top_p", "top_k", "min_p"):  # they shape sampling: with greedy decoding, one line
        with pytest.raises(ConfigError, match=name.replace("_", "-") + " shape sampling"):
            MeZOConfig(**{name: knobs[name]})


def test_the_schedule_is_transformers_cosine_with_warmup(tmp_path, factory):  # noqa: F811
    from test_trainer import make_args, train

    args = make_args(tmp_path, max_steps=4, eval_steps=4, lr_scheduler_type="cosine", warmup_ratio=0.5)
    train(args, factory)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in records if "split" not in r]
    # 2 warmup steps (0, 1/2), then half a cosine over the last 2: 1, (1 + cos(pi / 2)) / 2
    assert lrs == pytest.approx([0.0, 0.5e-3, 1e-3, 0.5e-3])


def test_best_step_strategy_fields(tmp_path, factory):  # noqa: F811
    from test_trainer import make_args, train

    _, lowest = train(make_args(tmp_path, "low", max_steps=4, eval_steps=1, learning_rate=1e-1, metric_for_best_model="accuracy",
                                greater_is_better=False, load_best_model_at_end=True), factory)
    validations = [json.loads(line) for line in (tmp_path / "low" / "metrics.jsonl").read_text().splitlines()]
    accs = {r["step"]: r["metrics"]["accuracy"] for r in validations if r.get("split") == "validation"}
    assert lowest["validation"]["accuracy"] == min(accs.values())
    _, final = train(make_args(tmp_path, "final", max_steps=3, eval_steps=1, load_best_model_at_end=False), factory)
    assert final["best_step"] == 3
    _, none = train(make_args(tmp_path, "none", max_steps=2, eval_strategy="no"), factory)
    records = [json.loads(line) for line in (tmp_path / "none" / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in records if r.get("split") == "validation"] and none["best_step"] == 2


@pytest.fixture()
def factory(tiny_tokenizer):
    from conftest import make_tiny_causal_lm
    from mezo_rl.model.lm import LanguageModel

    return lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)


def test_a_grpo_notebook_config_runs_with_two_names_changed(tmp_path, tiny_tokenizer, caplog, capsys):
    """The GRPOConfig of the popular GRPO notebooks (23 fields), GRPOTrainer -> MeZOTrainer and GRPOConfig ->
    MeZOConfig, on a tiny model: it trains, with at most one warning line."""
    from datasets import Dataset

    from conftest import make_tiny_causal_lm
    from mezo_rl import MeZOConfig as GRPOConfig, MeZOTrainer as GRPOTrainer

    def reward_len(completions, **kwargs):
        return [-abs(20 - len(c)) for c in completions]

    def reward_has_a(completions, completion_ids, trainer_state, **kwargs):
        assert len(completion_ids) == len(completions) and trainer_state.global_step >= 0
        return [float("a" in c) for c in completions]

    training_args = GRPOConfig(
        use_vllm=False, learning_rate=5e-3, adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.1, warmup_ratio=0.1,
        lr_scheduler_type="cosine", optim="adamw_8bit", logging_steps=1, bf16=False, fp16=False,
        per_device_train_batch_size=2, gradient_accumulation_steps=1, num_generations=2, max_prompt_length=16,
        max_completion_length=6, num_train_epochs=1, max_steps=2, save_steps=250, max_grad_norm=0.1,
        report_to="none", output_dir=str(tmp_path / "outputs"), disable_tqdm=True, num_completions_to_print=2,
    )
    dataset = Dataset.from_dict({"prompt": [f"Tell me about the number {i} and" for i in range(12)]})
    model = make_tiny_causal_lm(tiny_tokenizer)
    with caplog.at_level(logging.WARNING, logger="mezo_rl"):
        trainer = GRPOTrainer(model=model, processing_class=tiny_tokenizer, reward_funcs=[reward_len, reward_has_a],
                              args=training_args, train_dataset=dataset)
        out = trainer.train()
    assert out.global_step == 2 and trainer.state.global_step == 2
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[validation step ")]
    steps = {line.split("]")[0] for line in printed}  # num_completions_to_print at each validation (0, 1, 2)
    assert steps == {"[validation step 0", "[validation step 1", "[validation step 2"} and " -> " in printed[0]
    assert len(_warnings(caplog)) <= 1
    assert {"adam_beta1", "optim", "max_grad_norm"} <= set(_warnings(caplog)[0].replace(",", " ").split())


def test_max_prompt_length_keeps_the_last_tokens_of_a_longer_prompt(tiny_tokenizer):
    from conftest import make_tiny_causal_lm
    from mezo_rl.model.lm import LanguageModel
    from mezo_rl.tasks import Example
    from mezo_rl.training.outputs import truncate_prompts

    lm = LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)
    long, short = Example(prompt="the movie was good and the acting was warm and bright . It was"), Example(prompt="fun")
    kept = truncate_prompts({"train": [long, short]}, lm, 4)["train"]
    ids = tiny_tokenizer(long.prompt, add_special_tokens=False)["input_ids"]
    assert tiny_tokenizer(kept[0].prompt, add_special_tokens=False)["input_ids"] == ids[-4:] and kept[1] is short
    assert truncate_prompts({"train": [long]}, lm, None)["train"][0] is long


def test_hub_token_is_used_but_never_written(tmp_path):
    from mezo_rl.tasks import get_task
    from mezo_rl.training.plan import run_config

    args = MeZOConfig(hub_token="hf_secret", output_dir=str(tmp_path))
    assert "hub_token" not in args.to_dict() and "hf_secret" not in json.dumps(args.to_dict())
    assert run_config(args, get_task("arithmetic")).hub_token == "hf_secret"  # re-resolved for a task: kept
