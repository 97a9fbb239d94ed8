"""The grid accounted for (issue 70): every cell benchmarks/rl.py declares has records, or is pruned with its reason
in its definition, or is declared for a later session with the reason it exists; issue 70's cells are the ones the
records' validation figures point at; and a new record carries its per-prompt outcomes and the untouched read."""
from __future__ import annotations

import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import rl  # noqa: E402
from suite.frontier import frontier, summarise  # noqa: E402
from suite.protocol import ProtocolError  # noqa: E402
from suite.records import load_records  # noqa: E402

RECORDS = rl.current_records(load_records(rl.FRONTIER_RECORDS))


def recorded(task: str, name: str) -> list[int]:
    return sorted({r["seed"] for r in RECORDS if r.get("task") == task and r.get("cell") == name and r.get("ok")})


def cells():
    return [c for grid in rl.FRONTIER_GRIDS.values() for c in grid]


@pytest.mark.parametrize("cell", cells(), ids=lambda c: f"{c.task}/{c.name}")
def test_every_declared_cell_is_recorded_pruned_with_a_reason_or_planned(cell):
    seeds = recorded(cell.task, cell.name)
    if cell.pruned:
        assert cell.pruned.startswith("pruned") and len(cell.pruned) > 40, "a pruned cell says why"
        assert not seeds, f"{cell.name} is pruned but has records for seeds {seeds}: the reason is stale"
        assert not rl.frontier_pending(cell.task, "all", [cell.name], []), "a pruned cell never runs"
    elif cell.planned:
        assert cell.planned.startswith("issue 70") and len(cell.planned) > 40
        first = cell.seeds if rl.FRONTIER_TASKS[cell.task].get("every_seed") else cell.seeds[:1]
        assert rl.frontier_pending(cell.task, "grid", [cell.name], []) == [(cell, s) for s in first]
    else:
        assert seeds, f"{cell.task} {cell.name}: no record, no pruning reason, not planned"


def grpo_frontier_kls() -> list[float]:
    rows = [r for r in RECORDS if r.get("task") == "arithmetic"]
    return [round(s["val_kl"], 3) for s in frontier(summarise(rows, "exact_answer"), "trl-grpo")]


@pytest.mark.parametrize("lo,hi", [(0.073, 0.176), (0.176, 0.341)])
def test_each_of_grpos_kl_gaps_has_a_declared_cell(lo, hi):
    kls = grpo_frontier_kls()
    assert lo in kls and hi in kls and kls.index(hi) == kls.index(lo) + 1   # consecutive on GRPO's frontier
    gap = [c for c in rl.FRONTIER_GRIDS["arithmetic"] if c.tool == "trl-grpo" and f"{lo} to {hi}" in c.planned]
    assert len(gap) == 1 and not recorded("arithmetic", gap[0].name)


def best_on_validation(prefix: str) -> str:
    rows = [r for r in RECORDS if r.get("task") == "arithmetic"]
    compared = [s for s in summarise(rows, "exact_answer") if s["compared"] and s["cell"].startswith(prefix)
                and not s["cell"].startswith(prefix + "nogc")]
    return max(compared, key=lambda s: s["val_gain"])["cell"]


def test_the_four_times_budget_cells_are_each_tools_best_on_validation_with_three_seeds():
    four = rl.FRONTIER_GRIDS["arithmetic-4x"]
    assert rl.FRONTIER_TASKS["arithmetic-4x"]["budget_s"] == 4 * rl.FRONTIER_TASKS["arithmetic"]["budget_s"]
    assert sorted(c.name for c in four) == sorted(best_on_validation(p) for p in ("mezo-", "grpo-full-", "grpo-lora-"))
    for c in four:
        assert len(c.seeds) == 3
        cmd = rl.frontier_command(c, 0, pathlib.Path("x"))
        assert cmd[cmd.index("--time-budget-s") + 1] == str(4 * rl.FRONTIER_TASKS["arithmetic"]["budget_s"])
        assert cmd[cmd.index("--task") + 1] == "arithmetic"   # the registered task; the grid is its own


def test_grpo_both_ways_its_best_full_weight_cell_without_gradient_checkpointing():
    import grpo_sentiment

    (nogc,) = [c for c in rl.FRONTIER_GRIDS["arithmetic"] if c.family == "grpo-full-nogc"]
    best = rl.frontier_cell("arithmetic", best_on_validation("grpo-full-"))
    cmd = rl.frontier_command(nogc, 0, pathlib.Path("x"))
    assert (nogc.lr, nogc.beta) == (best.lr, best.beta) and "--no-gradient-checkpointing" in cmd
    assert [a for a in cmd if a != "--no-gradient-checkpointing"] == rl.frontier_command(best, 0, pathlib.Path("x"))
    assert grpo_sentiment.parse_args(["--task", "arithmetic", "--no-gradient-checkpointing"]).no_gradient_checkpointing


def test_the_curriculum_cells_train_the_first_stage_on_its_reward():
    for c in rl.FRONTIER_GRIDS["countdown-curriculum2"]:
        cmd = rl.frontier_command(c, 0, pathlib.Path("x"))
        assert cmd[cmd.index("--task") + 1] == "countdown-curriculum2"
        assert cmd[cmd.index("--reward") + 1] == "countdown_lenient"
    assert {c.tool for c in rl.FRONTIER_GRIDS["countdown-curriculum2"]} == {"mezo-rl", "trl-grpo"}


def test_the_untouched_read_is_not_part_of_a_cells_definition():
    c = rl.frontier_cell("arithmetic", "grpo-full-lr3e-6-beta0.04")
    cmd = rl.frontier_command(c, 0, rl.FRONTIER_RUNS / "x")
    with_read = cmd + ["--untouched-cell", c.name, "--untouched-task", "arithmetic"]
    assert rl._command_key(rl.shlex.join(with_read)) == rl._command_key(rl.shlex.join(cmd))


def test_a_new_record_carries_per_prompt_outcomes_and_the_untouched_read_at_the_pick(tmp_path, tiny_tokenizer,
                                                                                     monkeypatch):
    from test_rl_protocol import _tiny_run

    monkeypatch.setitem(rl.FRONTIER_TASKS, "tiny", dict(reward="protocol_len", num_eval=6))
    out = _tiny_run(tmp_path, tiny_tokenizer)
    base = {"protocol": 1, "task": "tiny", "cell": "c", "tool": "mezo-rl", "seed": 0, "ok": True, "command": "cmd",
            "commit": "abc", "cpu": {"model": "x", "avx512_bf16": False}}
    record = rl.complete_frontier(dict(base), out)
    dev = record["outcomes"]["development"]
    assert len(dev["before"]) == len(dev["after"]) == record["n"]["test"]
    assert [p for p, _ in dev["before"]] == [p for p, _ in dev["after"]]   # the same prompts, paired by id
    assert "untouched" not in record["outcomes"]   # this cell read no untouched split

    read = {"split": "untouched", "step": record["best_step"], "n": 2, "reward": "protocol_len", "mean": 0.5,
            "outcomes": [["q1", 0.0], ["q2", 1.0]]}
    (out / "run" / "untouched.json").write_text(json.dumps(read))
    record = rl.complete_frontier(dict(base), out)
    assert record["outcomes"]["untouched"]["after"] == [["q1", 0.0], ["q2", 1.0]] and record["untouched"]["n"] == 2
    (out / "run" / "untouched.json").write_text(json.dumps({**read, "step": record["best_step"] + 1}))
    with pytest.raises(ProtocolError, match="untouched split was read at step"):
        rl.complete_frontier(dict(base), out)


def test_the_runner_refuses_a_cell_whose_untouched_split_was_read_before_training(tmp_path, monkeypatch):
    from suite import untouched

    ledger = untouched.Ledger(tmp_path / "reads.jsonl")
    ledger.claim("arithmetic", "grpo-full-lr3e-6-beta0.04", 0, 70, "abc")
    monkeypatch.setattr(untouched, "LEDGER", ledger.path)
    monkeypatch.setattr(untouched.Ledger.__init__, "__defaults__", (ledger.path,))
    ran = []
    monkeypatch.setattr(rl.subprocess, "Popen", lambda *a, **k: ran.append(a))
    with pytest.raises(ProtocolError, match="read once"):
        rl.run_frontier_cell(rl.frontier_cell("arithmetic", "grpo-full-lr3e-6-beta0.04"), 0)
    assert not ran


def _read(rec, values):
    return {**rec, "outcomes": {"untouched": {"after": [[f"q{i}", v] for i, v in enumerate(values)]}}}


def test_stage_untouched_reruns_every_seed_of_the_cells_validation_chose_and_more_seeds_follow_a_close_verdict():
    from test_rl_protocol import _rec

    m, m2 = rl.frontier_cell("arithmetic", "mezo-full-lr1e-3-beta0"), rl.frontier_cell("arithmetic", "mezo-lora-lr3e-3-beta0")
    g = rl.frontier_cell("arithmetic", "grpo-full-lr1e-5-beta0.2")
    recs = [_rec(m, 0.4, 0.2, 0.4, seed=s) for s in range(3)] + [_rec(g, 0.3, 0.2, 0.3, seed=s) for s in range(3)]
    recs += [_rec(m2, 0.1, 0.5, 0.1, seed=s) for s in range(3)]   # dominated on validation: in no verdict pair
    assert rl.verdict_pairs("arithmetic", recs) == [(m.name, g.name)]
    todo = rl.frontier_pending("arithmetic", "untouched", None, recs)
    assert todo == [(m, 0), (m, 1), (m, 2), (g, 0), (g, 1), (g, 2)]
    assert rl.frontier_pending("arithmetic", "more-seeds", None, recs) == []   # no reads yet: nothing to judge

    # every seed read: far apart, no more seeds; close, seeds 3 and 4 of both cells
    far = [_read(r, [1] * 30 + [0] * 10) if r["cell"] == m.name else _read(r, [1] * 10 + [0] * 30) for r in recs[:6]]
    assert rl.frontier_pending("arithmetic", "untouched", None, far + recs[6:]) == []
    assert rl.frontier_pending("arithmetic", "more-seeds", None, far + recs[6:]) == []
    close = [_read(r, [1] * 30 + [0] * 10) if r["cell"] == m.name else _read(r, [1] * 29 + [0] * 11) for r in recs[:6]]
    more = rl.frontier_pending("arithmetic", "more-seeds", None, close + recs[6:])
    assert more == [(m, 3), (g, 3), (m, 4), (g, 4)] and rl.EXTRA_SEEDS == (3, 4)
    assert rl.frontier_command(m, 4, pathlib.Path("x"))   # an extra seed is a seed of the cell


def test_a_task_without_an_untouched_split_adds_seeds_to_a_pair_close_on_development():
    from test_rl_protocol import _fields, _rec

    task = "countdown-curriculum2"
    m, g = rl.frontier_cell(task, "mezo-full-lr3e-3-beta0"), rl.frontier_cell(task, "grpo-full-lr3e-6-beta0")

    def rec(cell, val, kl, seed, values):
        fields = {k: v for k, v in _fields(val, kl, val, reward="countdown_lenient").items() if k != "command"}
        return {**_rec(cell, val, kl, val, seed=seed), **fields,
                "outcomes": {"development": {"after": [[f"q{i}", v] for i, v in enumerate(values)]}}}

    far = [rec(m, 0.2, 0.1, s, [1] * 30 + [0] * 10) for s in range(3)] + \
        [rec(g, 0.2, 0.2, s, [1] * 10 + [0] * 30) for s in range(3)]
    assert rl.verdict_pairs(task, far) == [(m.name, g.name)]
    assert rl.frontier_pending(task, "untouched", None, far) == []      # no untouched split to read
    assert rl.frontier_pending(task, "more-seeds", None, far) == []     # far apart on development
    close = far[:3] + [rec(g, 0.2, 0.2, s, [1] * 29 + [0] * 11) for s in range(3)]
    assert rl.frontier_pending(task, "more-seeds", None, close) == [(m, 3), (g, 3), (m, 4), (g, 4)]


def test_the_four_times_budget_cells_run_every_seed_in_their_first_stage():
    todo = rl.frontier_pending("arithmetic-4x", "grid", None, [])
    assert todo == [(c, s) for c in rl.FRONTIER_GRIDS["arithmetic-4x"] for s in c.seeds] and len(todo) == 9


def test_a_curriculum_stage_starts_from_the_previous_stages_validation_pick():
    from test_rl_protocol import _fields, _rec

    for stage, before in (("countdown-curriculum3", "countdown-curriculum2"),
                          ("countdown-curriculum4", "countdown-curriculum3")):
        for c in rl.FRONTIER_GRIDS[stage]:
            cmd = rl.frontier_command(c, 2, pathlib.Path("x"))
            assert cmd[cmd.index("--model") + 1] == str(rl.PICKS / f"{before}-{c.tool}-s2")
            assert cmd[cmd.index("--task") + 1] == stage
    assert "--model" not in rl.frontier_command(rl.FRONTIER_GRIDS["countdown-curriculum2"][0], 0, pathlib.Path("x"))
    # the pick: each tool's compared cell with the highest mean validation gain (test figures play no part)
    a, b, g = rl.FRONTIER_GRIDS["countdown-curriculum2"][0], rl.FRONTIER_GRIDS["countdown-curriculum2"][1], \
        rl.FRONTIER_GRIDS["countdown-curriculum2"][2]
    def rec(cell, val, test, seed):   # a current record of the cell, its figures under the stage's reward
        r, f = _rec(cell, val, 0.1, test, seed=seed), _fields(val, 0.1, test, reward="countdown_lenient")
        return {**r, **{k: f[k] for k in ("initial_validation", "validation", "initial_test", "test")}}

    recs = [rec(a, 0.2, 0.9, s) for s in range(3)] + [rec(b, 0.3, 0.1, s) for s in range(3)]
    recs += [rec(g, 0.4, 0.5, s) for s in range(2)]   # 2 seeds: not compared
    assert rl.stage_picks("countdown-curriculum2", recs) == {"mezo-rl": b.name}


def test_grpo_runs_of_a_stage_that_a_later_one_starts_from_save_their_pick(tmp_path, monkeypatch):
    monkeypatch.setattr(rl, "FRONTIER_RUNS", tmp_path / "runs")
    monkeypatch.setattr(rl, "FRONTIER_RECORDS", tmp_path / "records.jsonl")
    got = []

    class Stop(Exception):
        pass

    def popen(cmd, **kw):
        got.append(cmd)
        raise Stop

    monkeypatch.setattr(rl.subprocess, "Popen", popen)
    monkeypatch.setattr(rl, "protocol_commit", lambda repo: "abc")
    for task in ("countdown-curriculum2", "countdown-curriculum4"):
        cell = next(c for c in rl.FRONTIER_GRIDS[task] if c.tool == "trl-grpo")
        with pytest.raises(Stop):
            rl.run_frontier_cell(cell, 0)
    assert "--save-picked" in got[0] and "--save-picked" not in got[1]   # no stage starts from the last one
    assert rl._command_key(rl.shlex.join(got[0])) == rl._command_key(rl.shlex.join(
        rl.frontier_command(rl.FRONTIER_GRIDS["countdown-curriculum2"][2], 0, tmp_path / "y")))


def test_stage_untouched_reruns_a_pair_only_on_the_machine_its_cells_ran_on():
    from test_rl_protocol import _rec

    m, g = rl.frontier_cell("arithmetic", "mezo-full-lr1e-3-beta0"), rl.frontier_cell("arithmetic", "grpo-full-lr1e-5-beta0.2")
    recs = [_rec(m, 0.4, 0.2, 0.4, seed=s) for s in range(3)] + [_rec(g, 0.3, 0.2, 0.3, seed=s) for s in range(3)]
    assert len(rl.frontier_pending("arithmetic", "untouched", None, recs)) == 6
    elsewhere = [{**r, "machine": "x86_64 2 cpus, another CPU, avx512_bf16"} for r in recs]
    assert rl.frontier_pending("arithmetic", "untouched", None, elsewhere) == []   # its time budget means other steps here

