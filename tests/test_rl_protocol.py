"""Issue 50's protocol in benchmarks/ (suite/protocol.py, rl.py --frontier): the test split is read only at
validation's pick, compared cells need seeds and validation prompts, every record carries its fields; a real tiny
mezo-rl run's log replays through the gate, and a tampered one is refused."""
from __future__ import annotations

import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))     # as `python benchmarks/rl.py` sees it

import rl  # noqa: E402
from suite.protocol import (MIN_SEEDS, MIN_VALIDATION, RECORD_FIELDS, ProtocolError, TestGate, admitted,  # noqa: E402
                            after_step, check_cell, cpu_info, missing_fields, text_counts)


# ---------------------------------------------------------------------------------------------- the gate
def test_the_equal_time_rule_stops_at_the_nearest_step_boundary_and_validates_at_each_mark():
    # a budget of 30 s in thirds: marks at 10 and 20 s; steps of 4 s from 0 s
    seen, spent = [], 0.0
    while True:
        decision = after_step(spent, 4.0, 30.0, 3)
        spent += 4.0
        seen.append((spent, decision))
        if decision == "stop":
            break
    # 12 crosses 10 and 20 crosses 20 (validate); 28 + 2 reaches 30: the stop at 28 s, 2 s short, not at 32 s
    assert seen == [(4, None), (8, None), (12, "validate"), (16, None), (20, "validate"), (24, None), (28, "stop")]
    # one step across two marks validates once; no marks at eval_points 0 or 1
    assert after_step(9.0, 12.0, 30.0, 3) == "validate" and after_step(9.0, 12.0, 30.0, 1) is None
    assert after_step(0.0, 12.0, 30.0, 0) is None
    with pytest.raises(ValueError):
        after_step(0.0, 1.0, 0.0, 3)


def test_test_before_validations_pick_is_refused():
    gate = TestGate()
    gate.validated(0, 0.1)
    gate.baseline()                       # the starting weights: allowed once, before training
    gate.validated(10, 0.3)
    with pytest.raises(ProtocolError, match="before validation's pick"):
        gate.test(10)
    assert gate.pick() == 10
    with pytest.raises(ProtocolError, match="validation picked step 10"):
        gate.test(20)
    gate.test(10)
    with pytest.raises(ProtocolError, match="read once"):
        gate.test(10)
    with pytest.raises(ProtocolError, match="after validation's pick"):
        gate.validated(30, 0.9)           # no more choosing once test may be read
    assert gate.record()["step"] == 10 and gate.record()["on"] == "validation"


def test_the_pick_is_the_latest_of_the_best_and_the_baseline_comes_before_training():
    gate = TestGate()
    for step, v in [(0, 0.1), (5, 0.4), (10, 0.4), (15, 0.2)]:
        gate.validated(step, v)
    assert gate.pick() == 10  # a tie goes to the later step, as MeZOTrainer picks its best step
    late = TestGate()
    late.validated(0, 0.1)
    late.validated(5, 0.2)
    with pytest.raises(ProtocolError, match="before any training step"):
        late.baseline()


def test_a_replayed_log_that_read_test_mid_run_is_refused():
    ok = [{"split": "validation", "step": 0, "objective": 0.1}, {"split": "test", "step": 0},
          {"split": "validation", "step": 10, "objective": 0.5}, {"split": "validation", "step": 20, "objective": 0.3},
          {"split": "test", "step": 20, "weights_step": 10}]
    assert TestGate.replay(ok).record()["step"] == 10
    peeked = ok[:3] + [{"split": "test", "step": 10}] + ok[3:]     # test read at step 10, then validation again
    with pytest.raises(ProtocolError):
        TestGate.replay(peeked)
    wrong = ok[:-1] + [{"split": "test", "step": 20, "weights_step": 20}]   # the final weights, not the pick
    with pytest.raises(ProtocolError, match="validation picked step 10"):
        TestGate.replay(wrong)
    with pytest.raises(ProtocolError, match="never read its test split"):
        TestGate.replay(ok[:-1])


# ---------------------------------------------------------------------------------------------- cells
def test_compared_cells_need_seeds_and_validation_prompts_unless_exploratory():
    with pytest.raises(ProtocolError, match=f"at least {MIN_SEEDS}"):
        check_cell("one-seed", (0,), 200)
    with pytest.raises(ProtocolError, match=f"at least {MIN_VALIDATION}"):
        check_cell("small-validation", (0, 1, 2), 50)
    check_cell("exploratory", (0,), 50, exploratory=True)
    with pytest.raises(ProtocolError):
        rl.FrontierCell("arithmetic", "mezo-full", "1e-3", "0", (), seeds=(0, 1))
    assert rl.FrontierCell("arithmetic", "mezo-full", "1e-3", "0", (), seeds=(0,), exploratory=True).exploratory
    for task, cells in rl.FRONTIER_GRIDS.items():      # the defined grids pass the protocol's check
        assert rl.FRONTIER_TASKS[task]["num_eval"] >= MIN_VALIDATION
        assert all(len(c.seeds) >= MIN_SEEDS and not c.exploratory for c in cells)
        assert len({c.name for c in cells}) == len(cells)


def test_the_grids_bracket_grpo_loras_lr_and_tune_sentiment_on_sentiment(tmp_path):
    lora = {float(c.lr) for c in rl.FRONTIER_GRIDS["arithmetic"] if c.family == "grpo-lora"}
    assert max(lora) > 1e-4 and min(lora) <= 1e-4
    assert {c.family for c in rl.FRONTIER_GRIDS["sentiment"]} >= {"mezo-full", "grpo-full"}
    for task, cells in rl.FRONTIER_GRIDS.items():   # both tools at the protocol's precision, with the task's sizes
        for c in cells:
            cmd = rl.frontier_command(c, 0, tmp_path)
            assert cmd[cmd.index("--num-eval") + 1] == str(rl.FRONTIER_TASKS[task]["num_eval"])
            assert cmd[cmd.index("--autocast") + 1] == rl.PRECISION
    with pytest.raises(SystemExit, match="not one of the cell's seeds"):
        rl.frontier_command(rl.FRONTIER_GRIDS["arithmetic"][0], 7, tmp_path)


def test_every_mezo_frontier_cell_is_a_valid_train_command(tmp_path):
    import mezo_budget
    from mezo_rl.cli.main import build_parser, parse_into
    from mezo_rl.training.arguments import MeZOConfig

    parser = build_parser()
    for c in [c for cells in rl.FRONTIER_GRIDS.values() for c in cells]:
        if c.tool == "mezo-rl":   # each task's MeZO cells stop at its budget of seconds, as GRPO's do
            cmd = rl.frontier_command(c, 0, tmp_path)
            budget, train = mezo_budget.parse(cmd[2:])
            assert budget.time_budget_s == rl.FRONTIER_TASKS[c.task]["budget_s"]
            a = parse_into(MeZOConfig, parser.parse_args(["train", *train]))
            assert a.num_eval >= MIN_VALIDATION and a.beta == float(c.beta) and a.autocast == rl.PRECISION
            assert a.eval_steps >= a.max_steps   # only the budget's validations (and the last) run


def test_the_sentiment_cells_train_on_the_prompts_the_runner_writes(tmp_path):
    """MeZO's sentiment cells read the prompt files the example's writer puts where their command names them, the
    same prompts the GRPO script writes for its cells; without SST-2 the runner stops with one line first."""
    src = tmp_path / "data" / "SST-2" / "LM-BFF-original"
    src.mkdir(parents=True)
    sentences = [f"the film number {i} is a long and winding story" for i in range(30)]
    (src / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{x}\t1\n" for x in sentences[:10]))
    (src / "dev.tsv").write_text("sentence\tlabel\n" + "".join(f"{x}\t0\n" for x in sentences[10:20]))
    (src / "test.tsv").write_text("".join(f"1 {x}\n" for x in sentences[20:]))
    files = rl.write_sentiment_prompts(str(tmp_path / "data"), root=tmp_path / "checkout")
    cmd = rl.frontier_command(rl.frontier_cell("sentiment", "mezo-full-lr1e-3-beta0"), 1, tmp_path)
    for split, flag in (("train", "--task"), ("validation", "--validation-file"), ("test", "--test-file")):
        assert tmp_path / "checkout" / cmd[cmd.index(flag) + 1] == files[split]
        rows = [json.loads(line) for line in files[split].read_text().splitlines()]
        assert rows and all(r["prompt"].startswith("Movie review: the film number") for r in rows)
    assert cmd[cmd.index("--reward") + 1].endswith(f"sentiment_reward.py:{rl.REWARD}")
    with pytest.raises(SystemExit, match="set MEZO_RL_DATA"):
        rl.write_sentiment_prompts(str(tmp_path / "nowhere"), root=tmp_path / "checkout")


def test_the_guarded_sentiment_cells_train_both_tools_on_the_examples_guarded_objective(tmp_path):
    """Both tools' guard cells train on the sentiment prompts with the rewards and weights the example builds for
    its guard (positivity, then `repetition` at the task's weight): one objective, so one pick rule."""
    import grpo_sentiment
    from mezo_rl.cli.main import build_parser, parse_into
    from mezo_rl.training.arguments import MeZOConfig

    example = rl.import_path(rl.EXAMPLE, "rl_sentiment_example")
    weight = float(rl.FRONTIER_TASKS["sentiment-guard"]["guard"])
    refs, weights = example.rewards_of(weight)
    cells = rl.FRONTIER_GRIDS["sentiment-guard"]
    assert {c.tool for c in cells} == {"mezo-rl", "trl-grpo"}
    for c in cells:
        cmd = rl.frontier_command(c, 0, tmp_path)
        if c.tool == "mezo-rl":
            a = parse_into(MeZOConfig, build_parser().parse_args(["train", *cmd[cmd.index("--") + 1:]]))
            assert [pathlib.PurePath(r).name for r in a.reward] == [pathlib.PurePath(r).name for r in refs]
            assert a.reward_weights == weights and a.task == str(rl.SENTIMENT_PROMPTS / "train.jsonl")
        else:
            (tmp_path / "SST-2" / "LM-BFF-original").mkdir(parents=True, exist_ok=True)
            g = grpo_sentiment.parse_args([*cmd[2:], "--data-dir", str(tmp_path)])
            assert g.repetition_weight == weight and g.task is None
    for c in rl.FRONTIER_GRIDS["sentiment"]:   # the unguarded task trains on positivity alone
        cmd = rl.frontier_command(c, 0, tmp_path)
        assert "--reward-weights" not in cmd and "--repetition-weight" not in cmd


def test_the_grpo_script_takes_the_protocols_precision():
    import grpo_sentiment

    a = grpo_sentiment.parse_args(["--task", "arithmetic", "--reward", "exact_answer"])
    assert a.autocast == rl.PRECISION
    with pytest.raises(SystemExit):
        grpo_sentiment.parse_args(["--task", "arithmetic", "--autocast", "fp8"])


# ---------------------------------------------------------------------------------------------- records
def test_counts_and_cpu():
    samples = [{"completion": "a great movie. a great movie. a great movie."}, {"completion": "Great!"},
               {"completion": "greatly fine"}, {"completion": [{"role": "assistant", "content": "it is great"}]}]
    assert text_counts(samples) == {"n": 4, "loops": 1, "great": 3}
    info = cpu_info("model name\t: Some CPU\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert info == {"model": "Some CPU", "avx512_bf16": True, "amx": False}
    assert cpu_info("model name\t: Other\nflags\t\t: avx2\n")["avx512_bf16"] is False


def _tiny_run(tmp_path, tiny_tokenizer):
    from conftest import make_tiny_causal_lm
    from mezo_rl import rewards
    from mezo_rl.model.lm import LanguageModel
    from mezo_rl.training.arguments import MeZOConfig
    from mezo_rl.training.trainer import MeZOTrainer

    def reward_len(completions, **kw):
        return [-abs(12 - len(c)) / 12 for c in completions]

    rewards.register_reward("protocol_len", replace=True)(reward_len)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"the movie {i} was"}) + "\n" for i in range(40)))
    out = tmp_path / "cell"
    args = MeZOConfig(model="tiny", task=str(prompts), reward=["protocol_len"], peft="full", max_steps=4,
                      load_best_model_at_end=True,  # as the frontier's command: test reads validation's pick
                      per_device_train_batch_size=4, eval_steps=2, learning_rate=1e-3, eps=1e-2, autocast="none",
                      progress=False, output_dir=str(out / "run"), num_train=20, num_eval=6, num_test=6,
                      max_completion_length=6, log_completions=6)
    factory = lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)  # noqa: E731
    try:
        MeZOTrainer(args=args, lm=factory(), lm_factory=factory).train()
    finally:
        rewards.unregister_reward("protocol_len")
    return out


def test_a_real_runs_record_carries_every_field_and_a_peek_at_test_is_refused(tmp_path, tiny_tokenizer, monkeypatch):
    """A tiny mezo-rl run completed by the frontier's runner: its log replays through the gate, its record names
    validation's pick and carries every RECORD_FIELD (it is kept out of comparisons: a few validation prompts); the
    same run with a test read inserted before its last validation is refused."""
    monkeypatch.setitem(rl.FRONTIER_TASKS, "tiny", dict(reward="protocol_len", num_eval=6))
    out = _tiny_run(tmp_path, tiny_tokenizer)
    base = {"protocol": 1, "task": "tiny", "cell": "c", "tool": "mezo-rl", "seed": 0, "ok": True, "command": "cmd",
            "commit": "abc", "cpu": cpu_info()}
    record = rl.complete_frontier(dict(base), out)
    assert missing_fields(record) == [], missing_fields(record)
    assert set(RECORD_FIELDS) <= set(record)
    summary = json.loads((out / "run" / "summary.json").read_text())
    assert record["pick"]["step"] == summary["best_step"] and record["pick"]["on"] == "validation"
    assert [v["step"] for v in record["pick"]["validated"]] == [0, 2, 4]
    assert record["config"]["autocast"] == "none" and record["precision"] == "fp32"
    n = {"validation": int(summary["validation"]["n"]), "test": int(summary["test"]["n"])}
    assert record["n"] == n and record["counts"]["after"]["n"] == n["test"] > 0
    assert admitted(record) == (False, f"validation n {n['validation']} < {MIN_VALIDATION}")
    assert admitted({**record, "n": {"validation": 200, "test": 6}}) == (True, "")
    assert admitted({k: v for k, v in record.items() if k != "protocol"})[1] == "exploratory (pre-protocol)"
    assert "config" in missing_fields({k: v for k, v in record.items() if k != "config"})

    # the pre-protocol runners (--study, --variants) now keep the same fields, though their cells stay exploratory
    monkeypatch.setitem(rl.STUDY_TASKS, "tiny", dict(reward="protocol_len"))
    study = rl.complete_study({"task": "tiny", "cell": "c", "tool": "mezo-rl", "seed": 0, "ok": True}, out)
    assert study["config"] == record["config"] and study["n"] == n and study["counts"] == record["counts"]
    assert admitted({**study, "command": "cmd", "commit": "abc", "cpu": cpu_info()})[1] == "exploratory (pre-protocol)"

    metrics = out / "run" / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    last_val = max(i for i, line in enumerate(lines) if '"split": "validation"' in line)
    peek = json.dumps({"step": 2, "split": "test", "metrics": {"objective": 0.0}})
    metrics.write_text("\n".join(lines[:last_val] + [peek] + lines[last_val:]) + "\n")
    with pytest.raises(ProtocolError):
        rl.complete_frontier(dict(base), out)


def test_the_runner_records_a_protocol_breach_as_a_failed_cell(tmp_path, monkeypatch):
    """run_frontier_cell: a run whose evaluations break the protocol is recorded with its error, never admitted."""
    cell = next(c for c in rl.FRONTIER_GRIDS["arithmetic"] if c.tool == "trl-grpo")
    monkeypatch.setattr(rl, "FRONTIER_RUNS", tmp_path / "runs")
    monkeypatch.setattr(rl, "FRONTIER_RECORDS", tmp_path / "records.jsonl")
    out = tmp_path / "runs" / f"arithmetic-{cell.name}-s0"
    out.mkdir(parents=True)
    (out / "summary.json").write_text("{}")  # an earlier finished run: set aside, the new one starts afresh
    reads = [{"split": "validation", "step": 0, "objective": 0.1}, {"split": "test", "step": 0, "weights_step": 0},
             {"split": "validation", "step": 5, "objective": 0.3}, {"split": "test", "step": 9, "weights_step": 9}]
    summary = json.dumps({"reads": reads, "best_step": 9})
    monkeypatch.setattr(rl, "frontier_command", lambda c, s, d: [
        sys.executable, "-c", f"import pathlib; pathlib.Path({str(d / 'summary.json')!r}).write_text({summary!r})"])
    r = rl.run_frontier_cell(cell, 0)
    assert r["ok"] is False and "validation picked step 5" in r["protocol_error"]
    assert rl.load_records(tmp_path / "records.jsonl")[-1]["protocol_error"] == r["protocol_error"]
    assert (out.with_name(out.name + "-prev1") / "summary.json").read_text() == "{}"


def test_frontier_stages_resume_and_pick_on_validation(monkeypatch):
    """Stage grid: every cell's first seed not yet recorded; stage seeds: the other seeds of the cells on seed 0's
    validation frontier (a cell with a better test figure but worse validation is not chosen) and of the moonshot's
    variants whose first seed is in, on the frontier or not."""
    grid = rl.FRONTIER_GRIDS["arithmetic"]
    here = rl.machine()

    a, b, c = grid[0], grid[1], grid[-1]
    records = [_rec(a, 0.30, 0.10, 0.1), _rec(b, 0.20, 0.20, 0.9), _rec(c, 0.1, 0.05, 0.1)]  # b: dominated on validation
    todo = rl.frontier_pending("arithmetic", "grid", None, records)
    runnable = [x for x in grid if not x.pruned]   # a pruned cell (its reason in its definition) is never pending
    assert grid[2].pruned and (grid[2], 0) not in todo
    assert todo == [(x, 0) for x in runnable if x not in (a, b, c)] and (grid[3], 0) in todo
    seeds = rl.frontier_pending("arithmetic", "seeds", None, records)
    assert seeds == [(a, 1), (a, 2), (c, 1), (c, 2)]
    pop = rl.frontier_cell("arithmetic", "mezo-full-pop16-lr3e-3-beta0")
    assert pop.variant and not a.variant
    dominated = records + [_rec(pop, 0.05, 0.3, 0.1)]  # off the frontier on validation, but a variant: all seeds
    assert rl.frontier_pending("arithmetic", "seeds", None, dominated) == [(a, 1), (a, 2), (pop, 1), (pop, 2),
                                                                            (c, 1), (c, 2)]


def test_a_cell_whose_validation_picked_its_start_runs_no_more_seeds():
    """A seed-0 run whose validation never passed the start (pick: step 0, so kl 0 and gain 0) is the untrained model:
    undominated at kl 0, but not a frontier candidate."""
    grid = rl.FRONTIER_GRIDS["arithmetic"]
    a, c = grid[0], next(x for x in grid[2:] if not x.pruned)   # any two cells that run (a pruned one never does)
    start = {**_rec(c, 0.0, 0.0, 0.0), "pick": {"on": "validation", "step": 0}}
    assert rl.frontier_pending("arithmetic", "seeds", [a.name, c.name], [_rec(a, 0.3, 0.1, 0.1), start]) == [(a, 1), (a, 2)]
    moved = {**start, "pick": {"on": "validation", "step": 30}}  # the same point, reached by training: a candidate
    assert (c, 1) in rl.frontier_pending("arithmetic", "seeds", [a.name, c.name], [_rec(a, 0.3, 0.1, 0.1), moved])


def test_a_variant_over_several_lrs_runs_more_seeds_at_validations_pick():
    """A moonshot variant with several lrs (ZO-Adam) waits for every lr's seed 0, then runs seeds 1-2 at the lr whose
    seed-0 validation gain is largest, not at the one with the best test figure."""
    adam = [c for c in rl.FRONTIER_GRIDS["arithmetic"] if c.family == "mezo-full-adam"]
    assert len(adam) >= 2 and all(c.variant for c in adam)
    low, high, *rest = adam
    best = rl.frontier_cell("arithmetic", "mezo-full-lr1e-3-beta0")
    some = [_rec(best, 0.30, 0.1, 0.3), _rec(low, 0.10, 0.3, 0.9)]  # the variants: off MeZO's seed-0 frontier
    assert not any(c in adam for c, _ in rl.frontier_pending("arithmetic", "seeds", [c.name for c in adam], some))
    every = some + [_rec(high, 0.25, 0.3, 0.1)] + [_rec(c, 0.05, 0.3, 0.1) for c in rest]
    assert rl.frontier_pending("arithmetic", "seeds", [c.name for c in adam], every) == [(high, 1), (high, 2)]
    start = [{**_rec(c, 0.0, 0.0, 0.0), "pick": {"on": "validation", "step": 0}} for c in adam]
    assert rl.frontier_pending("arithmetic", "seeds", [c.name for c in adam], start) == []  # none left its start


def test_a_record_of_an_earlier_cell_definition_is_superseded():
    """A MeZO cell re-sized to the budget (another --max-steps): its old record neither counts as done nor enters
    the comparison; the rendered section names it as superseded."""
    cell = rl.frontier_cell("arithmetic", "mezo-full-lr1e-3-beta0")
    now = _rec(cell, 0.3, 0.1, 0.2)
    steps = cell.args[cell.args.index("--max-steps") + 1]
    old = dict(now, command=now["command"].replace(f"--max-steps {steps}", "--max-steps 58"), steps=58)
    assert rl.superseded(now) == "" and "58 steps" in rl.superseded(old)
    assert (cell, 0) in rl.frontier_pending("arithmetic", "grid", [cell.name], [old])
    assert rl.frontier_pending("arithmetic", "grid", [cell.name], [now]) == []
    assert rl.current_records([old, now]) == [now]
    assert "superseded: an earlier definition of the cell (58 steps)" in rl.render_frontier([old])


def test_a_record_made_before_its_tools_behaviour_changed_is_superseded(tmp_path, monkeypatch):
    """The same command at a commit without a behaviour change of its tool (GRPO's newline stop) is another run:
    superseded, pending again, named in the rendered section; the other tool's records at that commit and a commit
    this checkout does not know stand."""
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    rl.subprocess.run(git[:3] + ["init", "-q"], check=True)
    commits = []
    for i in range(3):
        rl.subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", str(i)], check=True)
        commits.append(rl.subprocess.run(git[:3] + ["rev-parse", "HEAD"], capture_output=True, text=True,
                                         check=True).stdout.strip())
    monkeypatch.setattr(rl, "REPO", tmp_path)
    monkeypatch.setattr(rl, "BEHAVIOUR_CHANGES", [("trl-grpo", commits[1], "it stopped at a newline")])
    grpo = rl.frontier_cell("arithmetic", "grpo-lora-lr3e-4-beta0")
    mezo = rl.frontier_cell("arithmetic", "mezo-lora-lr1e-2-beta0")
    old, new = (dict(_rec(grpo, 0.3, 0.1, 0.2), commit=c) for c in (commits[0], commits[2] + "+dirty"))
    assert rl.superseded(old) == "superseded: it stopped at a newline" and rl.superseded(new) == ""
    assert rl.superseded(dict(_rec(mezo, 0.3, 0.1, 0.2), commit=commits[0])) == ""
    assert rl.superseded(dict(old, commit="abc")) == ""
    assert rl.frontier_pending("arithmetic", "grid", [grpo.name], [old]) == [(grpo, 0)]
    assert rl.current_records([old, new]) == [new]
    assert "superseded: it stopped at a newline" in rl.render_frontier([old])


def test_a_cell_that_missed_the_budget_is_not_equal_time():
    """A run whose training seconds miss the task's budget by more than a validation interval (the resolution of
    its pick) is kept out and run again; within it, it stands."""
    cell = rl.frontier_cell("arithmetic", "grpo-full-lr1e-5-beta0.04")
    budget = rl.FRONTIER_TASKS["arithmetic"]["budget_s"]
    interval = budget / rl.FRONTIER_EVAL_POINTS
    near, far = dict(_rec(cell, 0.3, 0.1, 0.2), train_s=budget + 0.9 * interval), dict(_rec(cell, 0.3, 0.1, 0.2),
                                                                                      train_s=budget + 1.1 * interval)
    assert rl.superseded(near) == "" and rl.superseded(far).startswith("not equal-time")
    resumed = dict(near, command=near["command"] + " --resume")   # a cell stopped part-way and resumed: the same run
    assert rl.superseded(resumed) == ""
    sentiment = rl.frontier_cell("sentiment", "mezo-full-lr1e-3-beta0")   # MeZO on sentiment: the same rule
    assert rl.superseded(dict(_rec(sentiment, 0.3, 0.1, 0.2), train_s=3 * budget)).startswith("not equal-time")
    assert rl.frontier_pending("arithmetic", "grid", [cell.name], [far]) == [(cell, 0)]
    assert rl.frontier_pending("arithmetic", "grid", [cell.name], [near]) == []


# ---------------------------------------------------------------------------------------------- fixtures
def _rec(cell, val, kl, test_gain, seed=0):
    """A record of ``cell`` (its current command) on this machine."""
    cmd = rl.frontier_command(cell, seed, rl.FRONTIER_RUNS / f"{cell.task}-{cell.name}-s{seed}")
    return {"protocol": 1, "task": cell.task, "cell": cell.name, "tool": cell.tool, "seed": seed, "ok": True,
            "machine": rl.machine(), **_fields(val, kl, test_gain), "command": rl.shlex.join(cmd)}


def _fields(val_gain, val_kl, test_gain, test_kl=None, se=0.02, reward="exact_answer"):
    return {"commit": "abc", "cpu": {"model": "x", "avx512_bf16": True}, "command": "cmd", "precision": "fp32",
            "config": {"lr": 1}, "samples": [{"prompt": "p", "before": "a", "after": "b"}],
            "counts": {"before": {"n": 200, "loops": 0, "great": 0}, "after": {"n": 200, "loops": 0, "great": 0}},
            "pick": {"on": "validation", "step": 10}, "n": {"validation": 200, "test": 500},
            "initial_validation": {reward: 0.2}, "validation": {reward: 0.2 + val_gain, "kl": val_kl},
            "initial_test": {reward: 0.2}, "test": {reward: 0.2 + test_gain, "kl": val_kl if test_kl is None else test_kl},
            "paired": {"gain": test_gain, "se": se, "n": 500}}


def test_the_commit_is_dirty_for_changed_code_not_for_the_records(tmp_path):
    """A cell started while an earlier seed's record waits uncommitted in docs/results names a clean commit; a
    changed file of code makes it +dirty."""
    import subprocess

    from suite.protocol import commit

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "r.jsonl").write_text("{}\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    head = commit(tmp_path)
    assert len(head) == 40 and "+" not in head
    (tmp_path / "docs" / "results" / "r.jsonl").write_text("{}\n{}\n")
    assert commit(tmp_path) == head
    (tmp_path / "code.py").write_text("x = 2\n")
    assert commit(tmp_path) == head + "+dirty"


def test_a_variant_over_settings_of_its_own_runs_more_seeds_at_one_setting():
    """HiZOO's cells (``mezo-full-hizoo-a<alpha>``, one family per alpha) are one variant: seeds 1-2 run at the alpha
    whose seed-0 validation gain is largest (and at cells on seed 0's frontier), not at every alpha."""
    hizoo = [c for c in rl.FRONTIER_GRIDS["arithmetic"] if c.family.startswith("mezo-full-hizoo-")]
    assert len(hizoo) >= 3 and all(c.variant for c in hizoo) and len({c.family for c in hizoo}) == len(hizoo)
    names = [c.name for c in hizoo]
    first, second, *rest = hizoo
    # first: on the frontier (the least kl); second: the variant's pick; the rest dominated by first
    every = [_rec(first, 0.20, 0.1, 0.3), _rec(second, 0.30, 0.4, 0.1)] + [_rec(c, 0.05, 0.3, 0.1) for c in rest]
    assert rl.frontier_pending("arithmetic", "seeds", names, every) == [(first, 1), (first, 2), (second, 1), (second, 2)]


def test_hizoos_controls_decay_as_the_recorded_fit_of_its_runs_curvature():
    """Each mezo-full-decay* cell's --scale-decay K --scale-decay-power P is the better fixed-power fit of the rms of
    H^-1/2 over HiZOO's runs at one alpha (docs/results/hizoo_scale.jsonl, benchmarks/hizoo_scale.py), and each fit
    a control stands for fits within 10% in rms (a residual below 0.1 in logs)."""
    fits = {x["alpha"]: x for x in map(json.loads, (rl.REPO / "docs" / "results" / "hizoo_scale.jsonl").read_text()
                                       .splitlines()) if x["kind"] == "fit"}
    controls = [c for c in rl.FRONTIER_GRIDS["arithmetic"] if c.family.startswith("mezo-full-decay")]
    assert len(controls) == 2
    matched = set()
    for c in controls:
        k = float(c.launcher[c.launcher.index("--scale-decay") + 1])
        p = float(c.launcher[c.launcher.index("--scale-decay-power") + 1])
        alpha = next(a for a, f in fits.items() if (f["best"]["k"], f["best"]["p"]) == (k, p))
        assert fits[alpha]["fits"][str(p)]["resid_log_rms"] < 0.1
        matched.add(alpha)
    assert matched == {"1e-5", "1e-4"}
