"""RL on prompts: TRL-style prompt datasets (plain and chat), rewards over completions as the metric,
G completions per prompt with common random numbers, per-prompt group shaping, logged samples, and
the one-line refusals of bad input."""
from __future__ import annotations

import copy
import json
import math

import pytest

from mezo_rl import rewards
from conftest import make_tiny_causal_lm
from mezo_rl.model.decoding import Sampling
from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.errors import ConfigError, UserError
from mezo_rl.stats import Moments
from mezo_rl.training.evaluation import distinct_n
from mezo_rl.training.fitness import group_shape
from mezo_rl.model.lm import LanguageModel
from mezo_rl.training.outputs import ChatTemplateError, model_outputs
from mezo_rl.training.rundir import read_samples
from mezo_rl.training.trainer import RewardsSilentError, MeZOTrainer
from mezo_rl.tasks import from_prompts
from mezo_rl.tasks.user import MissingColumnError, TaskDataError

WORDS = ["the movie was", "a film about", "the acting is", "this story has", "the plot was", "an ending that"]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def plain_rows(n=30):
    return [{"prompt": f"{WORDS[i % len(WORDS)]} {i}", "topic": f"t{i % 3}"} for i in range(n)]


@pytest.fixture()
def factory(tiny_tokenizer):
    return lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)


SEEN = {}


def reward_len(completions, **kwargs):
    """TRL's documented example reward."""
    return [-abs(20 - len(c)) for c in completions]


def reward_topic(completions, topic, **kwargs):
    SEEN["topic"] = list(topic)
    SEEN["kwargs"] = sorted(kwargs)
    return [float(len(c) % 3 == int(t[1])) for c, t in zip(completions, topic)]


@pytest.fixture()
def registered():
    for fn in (reward_len, reward_topic):
        rewards.register_reward(fn.__name__, replace=True)(fn)
    yield
    for fn in (reward_len, reward_topic):
        rewards.unregister_reward(fn.__name__)


def args_for(tmp_path, path, **kw):
    base = dict(model="tiny", task=str(path), reward=["reward_len"], peft="full", max_steps=4, per_device_train_batch_size=4, eval_steps=2,
                learning_rate=1e-3, eps=1e-2, autocast="none", progress=False, output_dir=str(tmp_path / "run"),
                num_train=20, num_eval=6, num_test=6, max_completion_length=8)
    base.update(kw)
    return MeZOConfig(**base)


# -- data -----------------------------------------------------------------------------------------
def test_a_prompt_column_file_is_a_prompt_task_with_the_other_columns_for_the_rewards(tmp_path):
    task = from_prompts(write_jsonl(tmp_path / "p.jsonl", plain_rows()))
    assert task.kind == "prompts" and task.metrics == []
    train = task.load_split("train")
    assert len(train) == 24 and {len(task.load_split(s)) for s in ("validation", "test")} == {3}
    ex = train[0]
    assert ex.messages is None and ex.answers is None and ex.candidates is None
    assert "prompt" not in ex.columns and ex.columns["topic"].startswith("t")


def test_chat_messages_and_templates_and_another_prompt_column(tmp_path):
    rows = [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"say {i}"}],
             "text": f"review {i}"} for i in range(12)]
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    ex = from_prompts(path, prompt_column="messages").load_split("train")[0]
    assert ex.messages[-1]["role"] == "user" and ex.prompt == ex.messages[-1]["content"]
    ex = from_prompts(path, template="Continue: {text}").load_split("train")[0]
    assert ex.prompt.startswith("Continue: review ") and ex.messages is None


def test_chat_prompts_go_through_the_chat_template_and_completions_come_back_as_messages(tmp_path, tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)  # the fixture is shared: give this copy a chat template
    lm = LanguageModel(make_tiny_causal_lm(tok), tok)
    lm.tokenizer.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                                  "{% if add_generation_prompt %}<assistant>{% endif %}")
    rows = [{"prompt": [{"role": "user", "content": f"the movie {i}"}]} for i in range(12)]
    ex = from_prompts(write_jsonl(tmp_path / "c.jsonl", rows)).load_split("train")[:2]
    out = model_outputs(lm, ex, {"generation"}, max_new_tokens=4)
    assert out.prompts == [e.messages for e in ex]
    assert out.completions[0] == [{"role": "assistant", "content": out.texts[0]}]
    from mezo_rl.training.outputs import prompt_texts
    assert prompt_texts(lm, ex)[0] == f"<user>{ex[0].prompt}<assistant>"


def test_bad_prompt_data_is_one_line(tmp_path, factory):
    with pytest.raises(MissingColumnError, match=r"no 'prompt' column.*columns \['text'\].*--prompt-column"):
        from_prompts(write_jsonl(tmp_path / "t.jsonl", [{"text": "a"}] * 12))
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": [{"role": "user"}]}] * 12)
    with pytest.raises(TaskDataError, match=r"row \d+: a prompt must be text or a list of chat messages"):
        from_prompts(bad).load_split("train")
    rows = [{"prompt": [{"role": "user", "content": "hi"}]}] * 12
    ex = from_prompts(write_jsonl(tmp_path / "c.jsonl", rows)).load_split("train")
    with pytest.raises(ChatTemplateError, match="no chat template"):
        model_outputs(factory(), ex[:1], {"generation"})
    for msg in (str(e) for e in (ChatTemplateError("x"),)):
        assert "\n" not in msg


@pytest.mark.parametrize("kw, match", [
    (dict(num_generations=2, do_sample=False), "with --no-do-sample: greedy decoding writes the same"),
    (dict(num_generations=8, do_sample=True), "must divide --per-device-train-batch-size 4"),
    (dict(num_generations=3, do_sample=True), "must divide --per-device-train-batch-size 4"),
    (dict(num_generations=0), "num-generations"),
])
def test_generation_counts_are_checked(tmp_path, kw, match):
    with pytest.raises(ConfigError, match=match):
        args_for(tmp_path, tmp_path / "p.jsonl", **kw)


def test_num_generations_samples_as_in_trl(tmp_path):
    assert args_for(tmp_path, tmp_path / "p.jsonl", num_generations=2).do_sample is True
    assert args_for(tmp_path, tmp_path / "p.jsonl").do_sample is False  # one greedy completion per prompt


# -- shaping --------------------------------------------------------------------------------------
def test_group_shape_centres_and_scales_each_prompt_across_every_member():
    plus, minus = [1.0, 3.0, 10.0, 10.0], [2.0, 2.0, 10.0, None]
    shaped = group_shape([plus, minus], groups=[0, 0, 1, 1])
    # prompt 0: values 1, 3, 2, 2 (mean 2, population std sqrt(0.5)); prompt 1: no spread -> 0
    s = math.sqrt(0.5)
    assert shaped == [[-1 / s, 1 / s, 0.0, 0.0], [0.0, 0.0, 0.0, None]]
    # after shaping every prompt has mean 0 over its members: the mean reward of a step cancels
    flat = [v for m in shaped for v, g in zip(m, [0, 0, 1, 1]) if v is not None and g == 0]
    assert abs(sum(flat)) < 1e-12


def test_example_rewards_weight_and_flip_components():
    o = rewards.Objective([rewards.get_reward("exact_match"), rewards.get_reward("cross_entropy")], weights=[2.0, 0.5])
    assert o.example_rewards({"exact_match": [1.0, None, None], "cross_entropy": [3.0, 4.0, None]}) == [2.0 - 1.5, -2.0, None]


def test_se_and_distinct_n():
    assert Moments(6.0, 14.0, 3).se == pytest.approx(math.sqrt(1.0 / 3))  # values 1, 2, 3
    assert Moments.of([1.0, 2.0, 3.0]) == Moments(6.0, 14.0, 3) and math.isnan(Moments(1.0, 1.0, 1).se)
    assert distinct_n(["a b a b", "a b"], 2) == pytest.approx(2 / 4)


# -- training -------------------------------------------------------------------------------------
def test_common_random_numbers_with_several_generations(tmp_path, factory):
    lm = factory()
    ex = from_prompts(write_jsonl(tmp_path / "p.jsonl", plain_rows())).load_split("train")[:3]
    kw = dict(max_new_tokens=6, do_sample=True, sampling=Sampling(temperature=2.0), num_generations=4)
    a = model_outputs(lm, ex, {"generation"}, sample_seed=7, **kw)
    b = model_outputs(lm, ex, {"generation"}, sample_seed=7, **kw)
    assert a.texts == b.texts and a.groups == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    assert len(set(a.texts[:4])) > 1  # the G samples of one prompt differ


@pytest.mark.parametrize("shaping", ["none", "group"])
def test_a_prompt_run_reports_its_rewards_and_logs_completions(tmp_path, factory, registered, shaping):
    path = write_jsonl(tmp_path / "p.jsonl", plain_rows())
    args = args_for(tmp_path, path, reward=["reward_len", "reward_topic"], reward_weights=[1.0, 0.5],
                    num_generations=2, do_sample=True, reward_shaping=shaping, log_completions=2)
    trainer = MeZOTrainer(args=args, lm=factory(), lm_factory=factory)
    trainer.train()
    summary = trainer.summary
    val = summary["validation"]
    for key in ("objective", "objective/se", "reward_len", "reward_len/se", "reward_topic", "distinct_2",
                "completion_chars", "n"):
        assert key in val, key
    assert summary["metric_for_best"] == "objective"
    assert val["objective"] == pytest.approx(val["reward_len"] + 0.5 * val["reward_topic"])
    assert "prompt" not in SEEN["kwargs"] and SEEN["topic"] and all(t in ("t0", "t1", "t2") for t in SEEN["topic"])
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_rec = [r for r in steps if "loss" in r]
    assert len(train_rec) == 4 and all("reward/reward_len" in r and "reward/reward_len/std" in r for r in train_rec)
    samples = read_samples(tmp_path / "run", "validation", 0)
    assert len(samples) == 2 and {"prompt", "completion", "reward_len", "reward_topic"} <= set(samples[0])
    assert read_samples(tmp_path / "run", "test", 4) or read_samples(tmp_path / "run", "test", summary["best_step"])


def test_group_shaping_changes_the_losses_not_the_members(tmp_path, factory, registered):
    path = write_jsonl(tmp_path / "p.jsonl", plain_rows())
    args = args_for(tmp_path, path, num_generations=2, do_sample=True, reward_shaping="group", max_steps=1)
    trainer = MeZOTrainer(args=args, lm=factory(), lm_factory=factory)
    batch = trainer.splits["train"][:2]
    outs = [trainer.member_outcomes(batch, None, 3)[0], trainer.member_outcomes(batch, None, 3)[0]]
    losses, record = trainer.member_losses(outs)
    assert losses == [0.0, 0.0]  # identical members: every shaped value is centred away
    assert record["reward/reward_len"] == pytest.approx(sum(outs[0].values["reward_len"]) / 4)


def test_a_reward_with_no_opinion_on_a_whole_batch_is_one_line(tmp_path, factory):
    rewards.register_reward("silent", replace=True)(lambda completions, **kw: [None] * len(completions))
    try:
        path = write_jsonl(tmp_path / "p.jsonl", plain_rows())
        trainer = MeZOTrainer(args=args_for(tmp_path, path, reward=["silent"]), lm=factory(), lm_factory=factory)
        with pytest.raises(RewardsSilentError, match="returned None .* for every completion"):
            trainer.member_losses(trainer.member_outcomes(trainer.splits["train"][:2], None, 0))
    finally:
        rewards.unregister_reward("silent")


def test_score_rewards_are_refused_on_prompt_tasks(tmp_path):
    from mezo_rl.cli.checks import check_training
    path = write_jsonl(tmp_path / "p.jsonl", plain_rows())
    with pytest.raises(UserError, match="scores gold candidates"):
        check_training(args_for(tmp_path, path, reward=["cross_entropy"]), model=False)
