"""The untouched test split (benchmarks/suite/untouched.py): the committed prompts are the seed's draw and share
nothing with the splits read so far, and the split is read once per (task, cell, seed): a second read is refused
before anything is evaluated."""
from __future__ import annotations

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))

from suite import untouched  # noqa: E402
from suite.protocol import ProtocolError  # noqa: E402

from mezo_rl.tasks import get_task  # noqa: E402


def pair(question: str) -> tuple[int, int]:
    a, _, b = question.removeprefix("What is ").removesuffix("?").split()
    return int(a), int(b)


def test_arithmetic_is_the_seeds_draw_and_shares_no_question_with_the_splits_read_so_far():
    rows = untouched.arithmetic_rows()
    assert rows == untouched.draw_arithmetic() and len(rows) == untouched.SIZE == 500
    pairs = [pair(r["question"]) for r in rows]
    assert all(str(a + b) == r["answer"] for (a, b), r in zip(pairs, rows))
    unordered = {frozenset((a, b)) if a != b else frozenset((a,)) for a, b in pairs}
    assert len(unordered) == len(rows)  # no question twice, in either order
    task = get_task("arithmetic")
    for split in ("train", "validation", "test"):  # test: the development split from issue 70 on
        read = {pair(ex.columns["question"]) for ex in task.load_split(split)}
        assert not read & set(pairs) and not read & {(b, a) for a, b in pairs}


def test_the_sentiment_selection_is_committed_as_rows_with_checksums():
    sel = json.loads((untouched.DATA / "sentiment.json").read_text())
    assert len(sel["rows"]) == len(set(sel["rows"])) == untouched.SIZE
    assert len(sel["source_sha256"]) == len(sel["prompts_sha256"]) == 64 and sel["seed"] == untouched.SEED


@pytest.mark.slow
def test_sentiment_rebuilds_from_the_data_and_shares_no_prompt_with_the_splits_read_so_far(shared_data_dir, tmp_path):
    prompts = [p for _, p in untouched.sentiment_prompts(shared_data_dir)]
    task, exs, ids = untouched.examples("sentiment", shared_data_dir, tmp_path)  # as a read evaluates them
    assert [ex.prompt for ex in exs] == prompts and len(ids) == untouched.SIZE
    assert len(set(prompts)) == untouched.SIZE
    got = untouched.sentiment_rows(shared_data_dir)
    read = {got["prefix"] + o for o in got["pool"][:untouched.SENTIMENT_USED]} | {got["prefix"] + o for o in got["others"]}
    assert not read & set(prompts)
    assert json.loads((untouched.DATA / "sentiment.json").read_text()) == untouched.draw_sentiment(shared_data_dir)


def test_the_ledger_refuses_a_second_read_of_a_cell_and_seed(tmp_path):
    ledger = untouched.Ledger(tmp_path / "reads.jsonl")
    ledger.claim("arithmetic", "c", 0, 12, "abc")
    ledger.claim("arithmetic", "c", 1, 9, "abc")        # another seed: its own read
    ledger.claim("sentiment", "c", 0, 3, "abc")         # another task
    with pytest.raises(ProtocolError, match="read once"):
        ledger.claim("arithmetic", "c", 0, 12, "def")
    assert len(ledger.reads()) == 3


def test_a_read_evaluates_once_and_a_second_read_is_refused_before_evaluating(tiny_causal_lm, tmp_path, monkeypatch):
    from mezo_rl.model.lm import LanguageModel
    from mezo_rl.tasks.verifiable import ArithmeticTask

    plain = ArithmeticTask(chat=False)  # the tiny model has no chat template; the same questions in plain form
    rows = untouched.arithmetic_rows()[:6]
    monkeypatch.setattr(untouched, "examples", lambda task, data_dir=None, tmp_dir=None: (
        plain, [plain.make_example(r["question"], r["answer"]) for r in rows], [r["question"] for r in rows]))
    ledger = untouched.Ledger(tmp_path / "reads.jsonl")
    lm = LanguageModel(*tiny_causal_lm)
    out = untouched.read(lm, "arithmetic", "mezo-full-lr3e-3-beta0", 0, 40, "exact_answer", 4, "none", "abc",
                         ledger=ledger)
    assert out["n"] == 6 and out["step"] == 40 and [i for i, _ in out["outcomes"]] == [r["question"] for r in rows]
    assert all(v in (0.0, 1.0) for _, v in out["outcomes"])
    assert out["mean"] == pytest.approx(sum(v for _, v in out["outcomes"]) / 6)
    calls = []
    monkeypatch.setattr("mezo_rl.training.evaluation.evaluate", lambda *a, **k: calls.append(1))
    with pytest.raises(ProtocolError, match="read once"):
        untouched.read(lm, "arithmetic", "mezo-full-lr3e-3-beta0", 0, 40, "exact_answer", 4, "none", "abc",
                       ledger=ledger)
    assert not calls and len(ledger.reads()) == 1


def test_a_reward_that_cannot_run_stops_the_read_before_it_is_claimed(tiny_causal_lm, tmp_path, monkeypatch):
    """A reward whose package is missing fails on an empty completion before the claim: nothing is evaluated, the
    ledger stays empty, and the read can be made once the package is there."""
    from mezo_rl.model.lm import LanguageModel
    from mezo_rl.tasks.verifiable import ArithmeticTask

    plain = ArithmeticTask(chat=False)
    rows = untouched.arithmetic_rows()[:2]
    monkeypatch.setattr(untouched, "examples", lambda task, data_dir=None, tmp_dir=None: (
        plain, [plain.make_example(r["question"], r["answer"]) for r in rows], [r["question"] for r in rows]))
    (tmp_path / "needs_a_package.py").write_text(
        "def needs_a_package(completions, **kw):\n    import a_package_that_is_not_installed  # noqa: F401\n")
    ledger, calls = untouched.Ledger(tmp_path / "reads.jsonl"), []
    monkeypatch.setattr("mezo_rl.training.evaluation.evaluate", lambda *a, **k: calls.append(1))
    with pytest.raises(Exception, match="a_package_that_is_not_installed"):
        untouched.read(LanguageModel(*tiny_causal_lm), "arithmetic", "c", 0, 0,
                       f"{tmp_path / 'needs_a_package.py'}:needs_a_package", 4, "none", "abc", ledger=ledger)
    assert not calls and ledger.reads() == []


def test_a_mezo_run_is_replayed_to_validations_pick_and_read_once(tmp_path, tiny_tokenizer, monkeypatch):
    """benchmarks/untouched.py --read-run: the run's weights rebuilt at its picked step from the trajectory (the same
    weights the run's own development read scored), the untouched split read once, a second read refused."""
    import untouched as script
    from conftest import make_tiny_causal_lm
    from test_rl_protocol import _tiny_run

    from mezo_rl.model.lm import LanguageModel
    from mezo_rl.tasks.verifiable import ArithmeticTask
    from mezo_rl.training import rundir

    out = _tiny_run(tmp_path, tiny_tokenizer)
    real_load_run = rundir.load_run
    steps = []

    def load_run(run_dir, step="best", lm=None):   # the tiny model is built here, not loaded by name
        got = real_load_run(run_dir, step, lm=LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer))
        steps.append(got[2])
        return got

    monkeypatch.setattr(rundir, "load_run", load_run)
    plain = ArithmeticTask(chat=False)
    rows = untouched.arithmetic_rows()[:4]
    monkeypatch.setattr(untouched, "examples", lambda task, data_dir=None, tmp_dir=None: (
        plain, [plain.make_example(r["question"], r["answer"]) for r in rows], [r["question"] for r in rows]))
    monkeypatch.setattr(untouched.Ledger.__init__, "__defaults__", (tmp_path / "reads.jsonl",))
    best = json.loads((out / "run" / "summary.json").read_text())["best_step"]
    read = script.read_run(out / "run", "arithmetic", "c", 0, False, None)
    assert steps == [best] and read["step"] == best and read["n"] == 4
    assert json.loads((out / "run" / "untouched.json").read_text()) == read
    with pytest.raises(ProtocolError, match="read once"):
        script.read_run(out / "run", "arithmetic", "c", 0, False, None)
    assert steps == [best] and len(untouched.Ledger().reads()) == 1   # refused before the replay


def test_the_starting_weights_read_keeps_its_per_prompt_outcomes_and_is_read_once(tmp_path, tiny_tokenizer,
                                                                                   monkeypatch, capsys):
    """benchmarks/untouched.py --start --task T: the base model reads the untouched split once (cell
    starting-weights, seed 0) and its record keeps every prompt's outcome, the baseline a gain is paired with."""
    import untouched as script
    from conftest import make_tiny_causal_lm

    from mezo_rl.model.lm import LanguageModel
    from mezo_rl.tasks.verifiable import ArithmeticTask

    monkeypatch.setattr("mezo_rl.model.loading.load_model",
                        lambda name, **kw: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer))
    plain = ArithmeticTask(chat=False)
    rows = untouched.arithmetic_rows()[:3]
    monkeypatch.setattr(untouched, "examples", lambda task, data_dir=None, tmp_dir=None: (
        plain, [plain.make_example(r["question"], r["answer"]) for r in rows], [r["question"] for r in rows]))
    monkeypatch.setattr(untouched.Ledger.__init__, "__defaults__", (tmp_path / "reads.jsonl",))
    monkeypatch.setattr(script, "START_RECORDS", tmp_path / "start.jsonl")
    assert script.main(["--start", "--task", "arithmetic"]) == 0
    (record,) = [json.loads(line) for line in (tmp_path / "start.jsonl").read_text().splitlines()]
    assert (record["task"], record["cell"], record["seed"]) == ("arithmetic", untouched.START, 0)
    assert [i for i, _ in record["untouched"]["outcomes"]] == [r["question"] for r in rows]
    assert record["untouched"]["mean"] == sum(v for _, v in record["untouched"]["outcomes"]) / 3
    assert "outcomes" not in json.loads(capsys.readouterr().out.strip().splitlines()[-1])   # printed: the summary
    with pytest.raises(ProtocolError, match="read once"):
        script.main(["--start", "--task", "arithmetic"])
    assert len((tmp_path / "start.jsonl").read_text().splitlines()) == 1
