"""Where completions end: EOS always, the caller's stop strings (``LanguageModel.generate(stop=...)``, a run's
``--stop``), and the newline only where a task's format asks for it (SQuAD, DROP), never for prompt tasks.

A stop string is found on the device from the new tokens' ids and the text is cut just before it: these
tests take a greedy completion written without stops, pick strings inside it (within one token, across
tokens, starting inside a token) and check that the completion with that stop is the text before its
first occurrence, and that decoding ended at the token that completed it.
"""
from __future__ import annotations

import pytest
import torch

from conftest import make_tiny_causal_lm
from mezo_rl.model.lm import LanguageModel, cut_at_stop, stop_strings
from mezo_rl.tasks import Example, get_task
from mezo_rl.training.outputs import completion_stops, model_outputs

PROMPTS = ["the sun rose early and", "It was", "Does this mean that the premise is true ?", "Yes or No ?"]
NEW = 16


@pytest.fixture()
def lm(tiny_tokenizer):
    # seed 3: a model whose greedy completions of PROMPTS vary (several distinct tokens each), and hold no EOS
    return LanguageModel(make_tiny_causal_lm(tiny_tokenizer, seed=3), tiny_tokenizer, batch_size=4)


def forward_count(lm):
    """A list that grows by one per forward pass of the model's base (a decoding step), and the hook's handle."""
    calls = []
    return calls, lm._base.register_forward_pre_hook(lambda m, a: calls.append(1))


def completion_tokens(lm, prompt):
    """The greedy completion's token ids (no stops) and its text after each token."""
    tok = lm.tokenizer
    ids = tok(prompt)["input_ids"]
    new = []
    with torch.no_grad():
        for _ in range(NEW):
            nxt = lm.model(input_ids=torch.tensor([ids + new])).logits[0, -1].argmax().item()
            if nxt == tok.eos_token_id:
                break
            new.append(nxt)
    return new, [tok.decode(new[: k + 1]) for k in range(len(new))]


def test_a_stop_string_anywhere_in_the_text_cuts_it_there_and_ends_decoding(lm):
    tok = lm.tokenizer
    tried = {"in one token": 0, "across tokens": 0, "from inside a token": 0}
    for prompt in PROMPTS:
        new, texts = completion_tokens(lm, prompt)
        free = lm.generate([prompt], max_new_tokens=NEW)[0]
        assert free == texts[-1]
        starts = [len(t) for t in [""] + texts[:-1]]  # where each token's text begins
        # up to the first byte that does not decode on its own (a random model writes such bytes): text after it
        # is not each token's text in turn, and a replacement character is no text the model wrote
        clean = free.split("\ufffd")[0]
        assert all(texts[k + 1].startswith(texts[k]) for k in range(len(texts) - 1) if "\ufffd" not in texts[k + 1])
        for begin in range(0, len(clean), 2):
            for size in (1, 3):
                s = clean[begin : begin + size]
                if len(s) < size or not s.strip():
                    continue
                first = free.find(s)
                last_char = first + len(s) - 1
                k = max(i for i, b in enumerate(starts) if b <= last_char)  # the token completing s
                inside = max(i for i, b in enumerate(starts) if b <= first)
                kind = ("in one token" if inside == k else
                        "from inside a token" if starts[inside] < first else "across tokens")
                tried[kind] += 1
                calls, hook = forward_count(lm)
                try:
                    got = lm.generate([prompt], max_new_tokens=NEW, stop=[s])[0]
                finally:
                    hook.remove()
                assert got == free[:first], (prompt, s)
                assert len(calls) == min(k + 1, NEW), (prompt, s, kind)  # decoding ended at that token
    assert all(n > 0 for n in tried.values()), tried
    assert len(tok(PROMPTS[0])["input_ids"]) > 1


def test_several_stop_strings_cut_at_the_earliest_and_rows_stop_independently(lm):
    free = lm.generate(PROMPTS, max_new_tokens=NEW)
    a, b = free[0][6:8], free[1][2:4]
    got = lm.generate(PROMPTS, max_new_tokens=NEW, stop=[a, b])
    assert got == [cut_at_stop(t, [a, b]) for t in free]
    assert got[0] == free[0][: min(i for i in (free[0].find(a), free[0].find(b)) if i >= 0)]
    members = lm.generate(PROMPTS, max_new_tokens=NEW, stop=[a, b], members=3)
    assert members == [got] * 3


def test_eos_always_ends_a_completion_and_is_not_in_the_text(lm):
    tok, model = lm.tokenizer, lm.model
    with torch.no_grad():  # EOS wins from the first step on
        model.lm_head.bias = torch.nn.Parameter(torch.zeros(len(tok)))
        model.lm_head.bias.data[tok.eos_token_id] = 1e4
    calls, hook = forward_count(lm)
    try:
        assert lm.generate(PROMPTS, max_new_tokens=NEW) == [""] * len(PROMPTS)
        assert lm.generate(PROMPTS, max_new_tokens=NEW, stop=["zz"]) == [""] * len(PROMPTS)
    finally:
        hook.remove()
    assert len(calls) == 2  # one step each: every row finished at once


def test_the_newline_stops_only_where_asked(lm, data_dir):
    tok, model = lm.tokenizer, lm.model
    nl = tok("\n", add_special_tokens=False)["input_ids"][0]
    with torch.no_grad():  # a newline wins at every step
        model.lm_head.bias = torch.nn.Parameter(torch.zeros(len(tok)))
        model.lm_head.bias.data[nl] = 1e4
    assert lm.generate(PROMPTS, max_new_tokens=4) == ["\n\n\n\n"] * len(PROMPTS)
    assert lm.generate(PROMPTS, max_new_tokens=4, stop=["\n"]) == [""] * len(PROMPTS)

    squad, drop, arithmetic = get_task("squad"), get_task("drop"), get_task("arithmetic-plain")
    assert completion_stops(squad) == completion_stops(drop) == ["\n"]
    assert completion_stops(arithmetic) == [] and completion_stops(get_task("countdown")) == []
    assert completion_stops(squad, ["</answer>", "\n"]) == ["\n", "</answer>"]
    assert completion_stops(arithmetic, ["</answer>"]) == ["</answer>"]

    questions = squad.load_split("validation", data_dir=data_dir, n=2)
    prompts = [Example(prompt=p) for p in PROMPTS[:2]]
    out = model_outputs(lm, questions, {"generation"}, max_new_tokens=3, stop=completion_stops(squad))
    assert out.texts == ["", ""]
    out = model_outputs(lm, prompts, {"generation"}, max_new_tokens=3, stop=completion_stops(arithmetic))
    assert out.texts == ["\n\n\n", "\n\n\n"]


def test_evaluation_and_training_pass_the_runs_stops(tmp_path, tiny_tokenizer, data_dir):
    """A prompt task's evaluation and training steps decode with the run's --stop strings only; SQuAD's with
    its newline as well."""
    from mezo_rl.training.evaluation import evaluate
    from mezo_rl.training.trainer import MeZOTrainer
    from test_trainer import make_args

    lm = LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)
    seen = []
    generate = lm.generate
    lm.generate = lambda prompts, **kw: (seen.append(kw.get("stop")), generate(prompts, **kw))[1]
    squad = get_task("squad")
    evaluate(lm, squad, squad.load_split("validation", data_dir=data_dir, n=2), max_new_tokens=2, stop=["ok"])
    assert seen == [["\n", "ok"]]

    seen.clear()
    task = get_task("arithmetic-plain")
    splits = {s: task.load_split(s, n=4) for s in ("train", "validation", "test")}
    args = make_args(tmp_path, task="arithmetic-plain", reward=["exact_answer"], max_steps=1, eval_steps=1,
                     max_completion_length=2, stop=["=", "\n"], initial_test=False, evaluation="inplace")
    factory = lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)  # noqa: E731
    MeZOTrainer(args=args, lm=lm, lm_factory=factory, task=task, splits=splits).train()
    assert len(seen) >= 3 and all(s == ["=", "\n"] for s in seen)


def test_stop_strings_are_checked():
    assert stop_strings(None) == () and stop_strings([]) == ()
    assert stop_strings("\n") == ("\n",) and stop_strings(["a", "b", "a"]) == ("a", "b")
    for bad in ([""], ["a", ""], [3], 3, [None], b"x"):
        with pytest.raises(ValueError, match=r"^stop: got .*; accepted: a list of non-empty strings"):
            stop_strings(bad)
    assert cut_at_stop("a b. c", [".", " "]) == "a" and cut_at_stop("abc", ["x"]) == "abc"


@pytest.mark.parametrize("argv, says", [(["--stop", ""], "--stop: got ['']"),
                                        (["--stop", "a", "--stop", ""], "--stop: got ['a', '']")])
def test_a_bad_stop_is_one_line_before_any_model_loads(argv, says, monkeypatch, capsys):
    import mezo_rl.model.loading as loading
    from mezo_rl.cli.main import main

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["train", "--task", "arithmetic", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mezo-rl: error: ") and err.count("\n") == 1, err
    assert says in err and "accepted: one or more non-empty strings" in err


def test_stop_from_the_command_line_and_a_config_file(tmp_path):
    from mezo_rl.cli.main import build_parser, load_config_file, parse_into
    from mezo_rl.errors import ConfigError
    from mezo_rl.training.arguments import MeZOConfig

    def parse(argv, config=None):
        return parse_into(MeZOConfig, build_parser().parse_args(["train", *argv]), config)

    assert parse([]).stop is None
    assert parse(["--stop", "\\n", "--stop", "a, b", "--stop", "\\\\n"]).stop == ["\n", "a, b", "\\n"]
    cfg = tmp_path / "c.yaml"
    cfg.write_text('stop: "</answer>"\n')
    assert parse([], load_config_file(str(cfg))).stop == ["</answer>"]
    cfg.write_text("stop: [5]\n")
    with pytest.raises(ConfigError, match=r"^--stop: got \[5\]; accepted: one or more non-empty strings$"):
        parse([], load_config_file(str(cfg)))
    for bad in ([], [""], 7):
        with pytest.raises(ConfigError, match=r"^--stop: got .*; accepted: one or more non-empty strings$"):
            MeZOConfig(stop=bad)
    assert MeZOConfig(stop="\n").stop == ["\n"]
    assert MeZOConfig.from_dict(MeZOConfig(stop=["\n", "x"]).to_dict()).stop == ["\n", "x"]
