"""Where completions end: EOS always, the caller's stop strings (``LanguageModel.generate(stop=...)``, a run's
``--stop``), and the newline only where a task's format asks for it (SQuAD, DROP), never for prompt tasks.

A stop string is found on the device from the new tokens' ids and the text keeps it, ending with it (as
transformers' ``generate(stop_strings=...)``, less what the completing token carries beyond it): these tests
take a greedy completion written without stops, pick strings inside it (within one token, across tokens,
starting or ending inside a token) and check that the completion with that stop is the text up to the end of
its first occurrence, and that decoding ended at the token that completed it. Forced tokens (:func:`forced`)
make a tiny model write a given text, so that a stop string surely fires where a format needs it.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from conftest import make_tiny_causal_lm
from mezo_rl.model.decoding import end_at_stop, stop_strings
from mezo_rl.model.lm import LanguageModel
from mezo_rl.tasks import Example, get_task
from mezo_rl.tasks import completion_stops
from mezo_rl.training.outputs import model_outputs

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


@contextlib.contextmanager
def forced(lm, text):
    """``lm`` writes ``text``'s tokens, then EOS, after any prompt: at each decoding step its real logits, with the
    next token of ``text`` raised just above the largest (the step counted from the prompt's forward pass)."""
    ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"] + [lm.tokenizer.eos_token_id]
    step = [0]

    def count(module, args, kwargs):
        step[0] = 0 if kwargs["input_ids"].shape[1] > 1 else step[0] + 1

    def force(module, args, out):
        out = out.clone()
        out[..., ids[min(step[0], len(ids) - 1)]] = out.amax(-1) + 1
        return out

    hooks = [lm._base.register_forward_pre_hook(count, with_kwargs=True), lm._head.register_forward_hook(force)]
    try:
        yield len(ids)
    finally:
        for h in hooks:
            h.remove()


def test_a_stop_string_anywhere_in_the_text_ends_it_and_ends_decoding(lm):
    tok = lm.tokenizer
    tried = {"in one token": 0, "across tokens": 0, "from inside a token": 0, "ending inside a token": 0}
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
                ends = [b for b in starts + [len(free)] if b > last_char]
                tried["ending inside a token"] += ends[0] > last_char + 1  # the completing token carries more
                calls, hook = forward_count(lm)
                try:
                    got = lm.generate([prompt], max_new_tokens=NEW, stop=[s])[0]
                finally:
                    hook.remove()
                assert got == free[: first + len(s)], (prompt, s)
                assert len(calls) == min(k + 1, NEW), (prompt, s, kind)  # decoding ended at that token
    assert all(n > 0 for n in tried.values()), tried
    assert len(tok(PROMPTS[0])["input_ids"]) > 1


def test_several_stop_strings_end_at_the_first_written_and_rows_stop_independently(lm):
    free = lm.generate(PROMPTS, max_new_tokens=NEW)
    a, b = free[0][6:8], free[1][2:4]
    got = lm.generate(PROMPTS, max_new_tokens=NEW, stop=[a, b])
    assert got == [end_at_stop(t, [a, b]) for t in free]
    assert got[0] == free[0][: min(i + len(s) for s in (a, b) if (i := free[0].find(s)) >= 0)]
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
    assert lm.generate(PROMPTS, max_new_tokens=4, stop=["\n"]) == ["\n"] * len(PROMPTS)

    squad, drop, arithmetic = get_task("squad"), get_task("drop"), get_task("arithmetic-plain")
    assert completion_stops(squad) == completion_stops(drop) == ["\n"]
    assert completion_stops(arithmetic) == [] and completion_stops(get_task("countdown")) == []
    assert completion_stops(squad, ["</answer>", "\n"]) == ["\n", "</answer>"]
    assert completion_stops(arithmetic, ["</answer>"]) == ["</answer>"]

    questions = squad.load_split("validation", data_dir=data_dir, n=2)
    prompts = [Example(prompt=p) for p in PROMPTS[:2]]
    out = model_outputs(lm, questions, {"generation"}, max_new_tokens=3, stop=completion_stops(squad))
    assert out.texts == ["\n", "\n"]
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
                     max_completion_length=2, stop=["=", "\n"], initial_test=False, member_evaluation="inplace")
    factory = lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)  # noqa: E731
    MeZOTrainer(args=args, lm=lm, lm_factory=factory, task=task, splits=splits).train()
    assert len(seen) >= 3 and all(s == ["=", "\n"] for s in seen)


def test_stop_strings_are_checked():
    assert stop_strings(None) == () and stop_strings([]) == ()
    assert stop_strings("\n") == ("\n",) and stop_strings(["a", "b", "a"]) == ("a", "b")
    for bad in ([""], ["a", ""], [3], 3, [None], b"x"):
        with pytest.raises(ValueError, match=r"^stop: got .*; accepted: a list of non-empty strings"):
            stop_strings(bad)
    assert end_at_stop("a b. c", [".", " "]) == "a " and end_at_stop("abc", ["x"]) == "abc"
    assert end_at_stop("xabc", ["abc", "b"]) == "xab"  # "b" is written first: it ends before "abc" does
    assert end_at_stop("a</answer> b</answer>", ["</answer>"]) == "a</answer>"


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


def test_a_completion_keeps_its_closing_tag_and_the_countdown_reward_scores_it(lm):
    """``--stop "</answer>"``: the completion ends with the tag it closed, so ES-at-scale's format and answer
    both count; the same text run to EOS writes on past the tag, and scores less."""
    from mezo_rl.rewards import get_reward
    from mezo_rl.training.evaluation import evaluate

    task = get_task("countdown-paper")  # ES-at-scale's prompt: it ends in "<think>", which opens the block
    puzzles = task.load_split("validation", n=2)
    assert all(ex.prompt.endswith("<think>") for ex in puzzles)
    for ex in puzzles:
        kept = f" I combine them.</think>\n<answer>{ex.columns['solution']}</answer>"
        with forced(lm, kept + "\nThat is all.") as n:
            calls, hook = forward_count(lm)
            try:
                got = lm.generate([ex.prompt], max_new_tokens=n, stop=["</answer>"])[0]
            finally:
                hook.remove()
            assert got == kept
            assert len(calls) < n - 1  # the stop ended decoding: the rest of the text was never written
            to_eos = lm.generate([ex.prompt], max_new_tokens=n)[0]
            stopped = evaluate(lm, task, [ex], max_new_tokens=n, stop=["</answer>"])
            unstopped = evaluate(lm, task, [ex], max_new_tokens=n)
        assert to_eos == kept + "\nThat is all."
        assert stopped["countdown"] == pytest.approx(0.1 * 1.0 + 1.0) and stopped["countdown_correct"] == 1.0
        assert unstopped["countdown"] == pytest.approx(0.1 * (0.1 + 0.5) + 1.0)
        # what a completion cut before the tag (this project's old rule, vLLM's stop) scored: the think pair alone
        cut = kept[: -len("</answer>")]
        reward = get_reward("countdown").fn
        assert reward(prompts=[ex.prompt], completions=[cut], numbers=[ex.columns["numbers"]],
                      target=[ex.columns["target"]]) == [pytest.approx(0.1 * 0.1)]


@pytest.mark.parametrize("name", ["squad", "drop"])
def test_squad_and_drop_answers_end_with_their_newline_and_score_as_when_it_was_cut(lm, data_dir, name):
    """SQuAD's and DROP's completions now end with the newline their format stops at; the answer their metrics
    read from a completion (official SQuAD normalisation), and so every metric, is the one the completion cut
    before the newline gave: the recorded figures stand."""
    from mezo_rl.rewards import get_reward
    from mezo_rl.rewards.squad import normalize_answer
    from mezo_rl.training.evaluation import evaluate

    task = get_task(name)
    metrics = ["squad_f1", "exact_match", "rouge_l", "bleu"]
    tried = {m: 0.0 for m in metrics}
    for ex in task.load_split("test", data_dir=data_dir, n=3):  # the split the fixtures fill for both tasks
        gold = ex.columns["answers"]
        for before in (f" {gold[0]}", f" {gold[0]} and so on", f" {gold[0].split()[0]}", " no idea", ""):
            with forced(lm, before + "\nQuestion: what next?") as n:
                got = lm.generate([ex.prompt], max_new_tokens=n, stop=completion_stops(task))[0]
                now = evaluate(lm, task, [ex], max_new_tokens=n, metrics=metrics)
            assert got == before + "\n"
            assert normalize_answer(got) == normalize_answer(before)
            for m in metrics:
                then = get_reward(m).fn(prompts=[ex.prompt], completions=[before], answers=[gold])[0]
                assert now[m] == then, (name, before, m)  # one example: its value, exactly
                tried[m] += then
    assert all(v > 0 for v in tried.values()), tried  # right answers were among those tried


def test_resuming_a_run_made_when_completions_were_cut_before_the_stop(tmp_path, tiny_tokenizer):
    """A checkpoint without model.json's ``stop_strings`` comes from the version that cut a completion before its
    stop string. Its run is refused in one line where its completions would now differ (a stop string that a
    reward or metric reads past), by the trainer and by the command line's checks before any model loads; it
    resumes where nothing can differ (no stop; only SQuAD's newline, read by F1 and exact match)."""
    import json

    from mezo_rl.cli.checks import check_training
    from mezo_rl.errors import ConfigError
    from mezo_rl.training.arguments import MeZOConfig
    from mezo_rl.training.rundir import STOP_STRINGS, check_stop_strings
    from mezo_rl.training.plan import build_objective
    from mezo_rl.training.trainer import MeZOTrainer
    from test_trainer import make_args

    task = get_task("arithmetic-plain")
    splits = {s: task.load_split(s, n=4) for s in ("train", "validation", "test")}

    def args(steps, resume=False):
        return make_args(tmp_path, task=task.name, reward=["exact_answer"], stop=["="], max_steps=steps, eval_steps=1,
                         max_completion_length=3, initial_test=False, member_evaluation="inplace", resume=resume)

    def run(steps, resume=False):
        factory = lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)  # noqa: E731
        MeZOTrainer(args=args(steps, resume), lm=factory(), lm_factory=factory, task=task, splits=splits).train()

    run(1)
    run(2, resume=True)  # a checkpoint of this version: it resumes
    path = tmp_path / "run" / "checkpoint" / "model.json"
    identity = json.loads(path.read_text())
    assert identity.pop("stop_strings") == STOP_STRINGS
    path.write_text(json.dumps(identity))  # the checkpoint as the version that cut before the stop string wrote it
    refused = (r"^--resume: the run in '.*run' was made with stop strings cut before the string; this version keeps "
               r"them, so its completions would differ: start it over with --overwrite-output-dir$")
    with pytest.raises(ConfigError, match=refused):
        run(3, resume=True)
    with pytest.raises(ConfigError, match=refused):
        check_training(args(3, resume=True), model=False)
    assert json.loads((tmp_path / "run" / "checkpoint" / "trainer_state.json").read_text())["global_step"] == 2

    def check(task_name, reward, stop=None):
        check_stop_strings(tmp_path / "run", MeZOConfig(task=task_name, stop=stop), get_task(task_name),
                           build_objective([reward]))

    check("arithmetic-plain", "exact_answer")                       # no stop string: nothing differs
    check("squad", "cross_entropy")                                 # the newline, read by F1 and exact match
    check("squad", "cross_entropy", stop=["\n", " "])               # whitespace, read by F1 and exact match
    check("sst2", "cross_entropy", stop=["."])                      # nothing generates
    for task_name, reward, stop in (("squad", "cross_entropy", ["."]), ("arithmetic-plain", "exact_answer", ["\n"])):
        with pytest.raises(ConfigError, match=refused):
            check(task_name, reward, stop)


def test_a_stop_that_is_not_text_is_one_line_from_a_config_file_before_any_model_loads(tmp_path, monkeypatch, capsys):
    import mezo_rl.model.loading as loading
    from mezo_rl.cli.main import main

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    for text, says in (("stop: [5]\n", "--stop: got [5]"), ("stop: ''\n", "--stop: got ['']"),
                       ("stop: []\n", "--stop: got []")):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"task: arithmetic\n{text}")
        assert main(["train", "--config", str(cfg)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("mezo-rl: error: ") and err.count("\n") == 1, err
        assert says in err and "accepted: one or more non-empty strings" in err


def test_eval_of_a_run_made_when_completions_were_cut_before_the_stop_warns(tmp_path, tiny_model_dir, capsys):
    """`mezo-rl eval --run-dir` of a run from the version that cut completions before their stop string evaluates
    under this version's rule and says so in one line; a run of this version evaluates without it."""
    import json

    from mezo_rl.cli.main import main

    run = tmp_path / "run"
    assert main(["train", "--model", str(tiny_model_dir), "--task", "arithmetic-plain", "--reward", "exact_answer",
                 "--stop", "=", "--max-steps", "1", "--per-device-train-batch-size", "2", "--num-train", "4",
                 "--num-eval", "2", "--num-test", "2", "--max-completion-length", "3", "--member-evaluation", "inplace",
                 "--autocast", "none", "--no-progress", "--output-dir", str(run)]) == 0
    evaluate = ["eval", "--run-dir", str(run), "--split", "validation", "--n", "2"]
    capsys.readouterr()
    assert main(evaluate) == 0
    assert "warning" not in capsys.readouterr().err
    path = run / "checkpoint" / "model.json"
    identity = json.loads(path.read_text())
    del identity["stop_strings"]
    path.write_text(json.dumps(identity))
    assert main(evaluate) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning")]
    assert warned == [f"warning: the run in {str(run)!r} was made by a version that cut completions before their "
                      "stop string; this evaluation keeps it, so its figures can differ from the run's own"]
