"""The GRPO side of the untouched split (issue 70), end to end on a tiny model: benchmarks/grpo_sentiment.py trains an
arithmetic cell with TRL, validation picks a step before the last, the untouched split is read once with that step's
weights (the ledger claims it; a second run of the cell is refused before it trains), ``--save-picked`` writes those
weights as a directory ``--model`` loads, and benchmarks/rl.py's record of the finished cell carries the read's
per-prompt outcomes at the pick. Needs TRL (skipped without it)."""
from __future__ import annotations

import copy
import json
import pathlib
import sys

import pytest

trl = pytest.importorskip("trl")

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))     # as `python benchmarks/rl.py` sees it

import grpo_sentiment  # noqa: E402
import rl  # noqa: E402
from suite import untouched  # noqa: E402
from suite.protocol import ProtocolError  # noqa: E402

CHAT = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}")
CELL = "grpo-full-lr1e-5-beta0"


def _weights(model):
    import torch

    return torch.cat([p.detach().float().flatten() for p in model.parameters()]).clone()


def _probe(model):
    """The model's logits on a fixed input: the function its weights compute (LoRA folded in or not)."""
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([[5, 17, 42, 9, 3]])).logits.float().clone()


def _cell(tmp_path, tiny_tokenizer, monkeypatch, peft="full"):
    """A tiny model directory (a chat template: the arithmetic task's prompts are messages), the ledger redirected
    to ``tmp_path`` (never docs/results/untouched_reads.jsonl); returns the GRPO script's arguments of a cell."""
    from conftest import make_tiny_causal_lm

    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = CHAT
    model_dir = tmp_path / "model"
    make_tiny_causal_lm(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    ledger = tmp_path / "reads.jsonl"
    monkeypatch.setattr(untouched, "LEDGER", ledger)
    monkeypatch.setattr(untouched.Ledger.__init__, "__defaults__", (ledger,))

    def argv(output_dir):
        return ["--task", "arithmetic", "--reward", "exact_answer", "--model", str(model_dir), "--peft", peft,
                "--lr", "1e-2", "--output-dir", str(output_dir), "--seed", "0", "--max-completion-length", "4",
                "--num-generations", "2", "--batch-size", "4", "--time-budget-s", "1000", "--num-train", "16",
                "--num-eval", "4", "--num-test", "4", "--no-base-loglik", "--autocast", "none",
                "--untouched-cell", CELL, "--untouched-task", "arithmetic", "--save-picked", str(output_dir / "picked")]

    return argv


def _record(out, monkeypatch):
    """benchmarks/rl.py's record of the finished cell in ``out``."""
    monkeypatch.setattr(rl, "hacking_measures", lambda before, after: {})   # the base model is SmolLM2: not here
    base = {"protocol": rl.PROTOCOL, "task": "arithmetic", "cell": CELL, "tool": "trl-grpo", "seed": 0, "ok": True,
            "command": "cmd", "commit": "abc", "cpu": {"model": "x", "avx512_bf16": False}}
    return rl.complete_frontier(dict(base), out)


@pytest.mark.parametrize("peft", ["full", "lora"])
def test_a_grpo_cell_reads_the_untouched_split_once_at_validations_pick(peft, tmp_path, tiny_tokenizer, monkeypatch,
                                                                      one_thread):
    import torch

    from mezo_rl.model.loading import load_model

    argv = _cell(tmp_path, tiny_tokenizer, monkeypatch, peft)

    # the budget's rule, made deterministic: validate after step 1, stop after step 3
    decisions = iter(["validate", None, "stop"])
    monkeypatch.setattr(grpo_sentiment, "after_step", lambda *a: next(decisions))

    # validation's objective, by the order of the validations (steps 0, 1, 3): step 1 is the pick; and the weights
    # each one scored
    objectives, scored = iter([0.0, 1.0, 0.5]), []
    real_call = grpo_sentiment.Scorer.__call__

    def call(self, model, tokenizer, split, keep=None):
        got = real_call(self, model, tokenizer, split, keep)
        if split == "validation":
            got["objective"] = next(objectives)
            scored.append((_weights(model), _probe(model)))
        return got

    monkeypatch.setattr(grpo_sentiment.Scorer, "__call__", call)

    # a training reward that varies between completions (the random model never answers right: with exact_answer
    # alone GRPO's advantages are 0 and the weights would never move); the evaluations keep exact_answer
    built = []

    class Trainer(trl.GRPOTrainer):
        def __init__(self, *args, reward_funcs, **kw):
            built.append(1)

            def varied(completions, **kw):
                texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
                return [float(sum(map(ord, t)) % 7) for t in texts]

            super().__init__(*args, reward_funcs=[varied], **kw)

    monkeypatch.setattr(trl, "GRPOTrainer", Trainer)

    read_at = []
    real_read = untouched.read

    def read(lm, *args, **kw):
        read_at.append((_weights(lm.model), _probe(lm.model)))
        return real_read(lm, *args, **kw)

    monkeypatch.setattr(untouched, "read", read)

    out = tmp_path / "cell"
    summary = grpo_sentiment.main(argv(out))
    assert summary["steps"] == 3 and summary["best_step"] == summary["pick"]["step"] == 1
    assert [v["step"] for v in summary["pick"]["validated"]] == [0, 1, 3]
    (w0, _), (w1, p1), (w3, _) = scored
    assert not torch.equal(w1, w0) and not torch.equal(w3, w1)   # training moved the weights after the pick

    # the untouched split was read once, with the picked step's weights, and the ledger holds that one read
    assert len(read_at) == 1 and torch.equal(read_at[0][0], w1)
    got = json.loads((out / "untouched.json").read_text())
    assert got["step"] == 1 and got["n"] == len(got["outcomes"]) == untouched.SIZE
    assert [i for i, _ in got["outcomes"]] == [r["question"] for r in untouched.arithmetic_rows()]
    assert all(v in (0.0, 1.0) for _, v in got["outcomes"])
    reads = untouched.Ledger().reads()
    assert [(r["task"], r["cell"], r["seed"], r["step"]) for r in reads] == [("arithmetic", CELL, 0, 1)]

    # --save-picked: the picked step's function, as a directory `--model` loads (LoRA folded into the weights)
    picked = load_model(str(out / "picked")).model
    assert torch.allclose(_probe(picked), p1, atol=1e-5)

    # a second run of the cell is refused before anything trains or is evaluated; the ledger is unchanged
    built.clear()
    with pytest.raises(ProtocolError, match="read once"):
        grpo_sentiment.main(argv(tmp_path / "again"))
    assert not built and not (tmp_path / "again").exists() and len(untouched.Ledger().reads()) == 1
    with pytest.raises(ProtocolError, match="read once"):
        untouched.Ledger().claim("arithmetic", CELL, 0, 1, "abc")

    # benchmarks/rl.py's record of the finished cell: the pick, and the untouched read's per-prompt outcomes at it
    record = _record(out, monkeypatch)
    assert record["best_step"] == record["pick"]["step"] == record["untouched"]["step"] == 1
    assert record["outcomes"]["untouched"]["after"] == got["outcomes"]
    assert record["untouched"]["n"] == untouched.SIZE and "outcomes" not in record["untouched"]
    dev = record["outcomes"]["development"]
    assert len(dev["before"]) == len(dev["after"]) == record["n"]["test"] == 4


def test_a_failed_untouched_read_keeps_the_runs_own_figures(tmp_path, tiny_tokenizer, monkeypatch, one_thread):
    """A read that fails after its claim counts (the ledger's line stands), as a MeZO cell's: the trained run still
    writes its summary and exits normally, so the cell is recorded, without an untouched read."""
    argv = _cell(tmp_path, tiny_tokenizer, monkeypatch)

    def read(lm, task, cell, seed, step, *args, **kw):
        untouched.Ledger().claim(task, cell, seed, step, "abc")
        raise RuntimeError("out of memory part-way")

    monkeypatch.setattr(untouched, "read", read)
    out = tmp_path / "cell"
    summary = grpo_sentiment.main([*argv(out), "--max-steps", "1"])
    assert summary["untouched_error"] == "RuntimeError: out of memory part-way"
    assert (out / "summary.json").is_file() and not (out / "untouched.json").exists()
    assert len(untouched.Ledger().reads()) == 1
    record = _record(out, monkeypatch)
    assert "untouched" not in record and "untouched" not in record["outcomes"] and record["steps"] == 1


def test_a_cell_whose_untouched_split_was_read_is_skipped_and_the_others_still_run(tmp_path, monkeypatch):
    """benchmarks/rl.py --frontier: the ledger's refusal of one pending cell (refused before it trains) does not stop
    the cells after it."""
    cells = [c for c in rl.FRONTIER_GRIDS["arithmetic"] if c.tool == "trl-grpo" and not c.exploratory][:2]
    ledger = untouched.Ledger(tmp_path / "reads.jsonl")
    ledger.claim("arithmetic", cells[0].name, 0, 10, "abc")
    monkeypatch.setattr(untouched.Ledger.__init__, "__defaults__", (ledger.path,))
    monkeypatch.setattr(rl, "FRONTIER_RUNS", tmp_path / "runs")
    monkeypatch.setattr(rl, "FRONTIER_RECORDS", tmp_path / "records.jsonl")
    monkeypatch.setattr(rl, "frontier_pending", lambda *a: [(cells[0], 0), (cells[1], 0)])
    monkeypatch.setattr(rl, "protocol_commit", lambda repo: "abc")
    started = []

    class Started(Exception):
        pass

    def popen(cmd, **kw):
        started.append(cmd)
        raise Started

    monkeypatch.setattr(rl.subprocess, "Popen", popen)
    with pytest.raises(Started):
        rl.frontier_main("arithmetic", "untouched", None, False)
    assert len(started) == 1 and cells[1].name in started[0] and cells[0].name not in started[0]
