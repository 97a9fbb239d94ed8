"""The results suite (benchmarks/results.py, the package benchmarks/suite/): keying, resume, verdicts and
rendering (fast, pure functions fed with fabricated cell records as *inputs*), and the quick mode end to
end on the real model (slow)."""
from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

from mezo_rl.training.defaults import MODE_DEFAULTS

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))     # as `python benchmarks/results.py` sees it

from results import main, parse_method_args, parse_only  # noqa: E402
from suite.plan import (METHODS, MEZO_CE, NORM, QUICK, TASKS, Cell, Settings, build_argv, cell_key,  # noqa: E402
                        option, plan, variant_of)
from suite.records import append_record, load_records, pending  # noqa: E402
from suite.render import render  # noqa: E402
from suite.run import cell_run_dir, run_cell, unfinished_run  # noqa: E402
from suite.stats import aggregate  # noqa: E402
from suite.verdicts import FAILS, HOLDS, INCONCLUSIVE, MISSING, verdicts  # noqa: E402


def _rec(task="sst2", method="zero-shot", seed=0, value=0.5, n=872, status="ok", model="smollm2-135m",
         argv=None, steps=None, batch=None, curve=None, date="2026-11-23T12:00:00Z"):
    argv = argv or ["baseline", "--method", method, "--task", task, "--seed", str(seed)]
    return {"key": cell_key(model, task, method, seed, argv), "model": model, "task": task, "method": method,
            "seed": seed, "variant": variant_of(argv), "argv": argv, "status": status, "value": value, "n": n,
            "metric": "accuracy", "steps": steps, "batch": batch, "wall_time_s": 10.0, "peak_rss_mb": 1000.0,
            "command": "python -m mezo_rl " + " ".join(argv), "curve": curve, "date": date,
            "machine": {"cpu": "test CPU", "logical_cpus": 2}}


def _train_argv(method, seed, steps=200, task="sst2"):
    return build_argv("smollm2-135m", TASKS[task], method, seed, Settings(steps=(steps,)), steps)


# --- keying and planning ----------------------------------------------------------------------------

def test_key_depends_on_every_setting_but_not_on_where_the_run_writes():
    s = Settings()
    base = build_argv("smollm2-135m", TASKS["sst2"], "mezo-full", 0, s, 200)
    assert "--output-dir" not in base
    k = cell_key("smollm2-135m", "sst2", "mezo-full", 0, base)
    assert k == cell_key("smollm2-135m", "sst2", "mezo-full", 0, list(base))
    assert k != cell_key("smollm2-135m", "sst2", "mezo-full", 1, base)
    other_steps = build_argv("smollm2-135m", TASKS["sst2"], "mezo-full", 0, s, 400)
    assert k != cell_key("smollm2-135m", "sst2", "mezo-full", 0, other_steps)
    extra = build_argv("smollm2-135m", TASKS["sst2"], "mezo-full", 0,
                          Settings(method_args={"mezo-full": ["--learning-rate", "2e-5"]}), 200)
    assert extra[-2:] == ["--learning-rate", "2e-5"]
    assert k != cell_key("smollm2-135m", "sst2", "mezo-full", 0, extra)
    # seeds of one setting share a variant; a changed setting is another variant
    assert variant_of(base) == variant_of(build_argv("smollm2-135m", TASKS["sst2"], "mezo-full", 2, s, 200))
    assert variant_of(base) != variant_of(other_steps)
    # ... and so do the models: one variant is one row of a table whose columns are the models
    assert variant_of(base) == variant_of(build_argv("gemma3-270m", TASKS["sst2"], "mezo-full", 0, s, 200))


def test_plan_same_data_for_every_method_and_the_right_objective():
    s = Settings(steps=(100, 400))
    cells = plan(["smollm2-135m"], ["sst2", "squad"], list(METHODS), [0, 1], s, {"sst2": 872, "squad": 10570})
    by = {}
    for c in cells:
        by.setdefault((c.task, c.method), []).append(c)
    # zero-shot on the whole SST-2 test split: the seed changes nothing, one cell; SQuAD samples 200 of 10570
    assert [c.seed for c in by[("sst2", "zero-shot")]] == [0]
    assert [c.seed for c in by[("squad", "zero-shot")]] == [0, 1]
    assert ("squad", "lp") not in by                                  # linear probing: classification only
    assert sorted((c.seed, c.steps) for c in by[("sst2", "mezo-full")]) == [(0, 100), (0, 400), (1, 100), (1, 400)]
    for c in cells:   # every method of a task samples the same train/test examples
        p = TASKS[c.task]
        assert option(c.argv, "--num-train") == str(p.num_train)
        assert option(c.argv, "--num-test") == str(p.num_test)
        assert option(c.argv, "--seed") == str(c.seed)
        # ... and generates answers of the same length limit (the CLI default on classification)
        assert option(c.argv, "--max-completion-length") == (str(p.max_new_tokens) if p.max_new_tokens else None)
    metric_sst2 = by[("sst2", "mezo-metric")][0].argv
    metric_squad = by[("squad", "mezo-metric")][0].argv
    assert option(metric_sst2, "--reward") == "accuracy" and option(metric_sst2, "--peft") == "norm"
    # the final norm runs its own length whatever --steps says; the accuracy objective is `mezo-rl train`'s
    # default run, at its default length; on classification only
    assert sorted(c.steps for c in by[("sst2", "mezo-metric")]) == [MODE_DEFAULTS["norm"]["max_steps"]] * 2
    assert option(metric_sst2, "--per-device-train-batch-size") == str(MODE_DEFAULTS["norm"]["per_device_train_batch_size"])
    assert sorted(c.steps for c in by[("sst2", "mezo-norm")]) == [NORM["steps"]] * 2
    assert option(by[("sst2", "mezo-norm")][0].argv, "--reward") == "cross_entropy"
    assert ("squad", "mezo-norm") not in by
    assert option(metric_squad, "--reward") == "squad_f1" and option(metric_squad, "--peft") == "prefix"
    assert all(option(by[("sst2", m)][0].argv, "--reward") == "cross_entropy" for m in MEZO_CE)
    assert len({c.key for c in cells}) == len(cells)
    # seed-major order: every seed-0 cell comes before any seed-1 cell
    seeds = [c.seed for c in cells]
    assert seeds == sorted(seeds)


# --- the results file and resuming ------------------------------------------------------------------

def test_a_task_s_own_method_options_come_before_the_command_line_s():
    squad = build_argv("smollm2-135m", TASKS["squad"], "mezo-lora", 0, Settings(), 200)
    sst2 = build_argv("smollm2-135m", TASKS["sst2"], "mezo-lora", 0, Settings(), 200)
    assert squad[-2:] == ["--learning-rate", "1e-3"] and sst2[-2:] != ["--learning-rate", "1e-3"]     # SQuAD's LoRA lr, not SST-2's
    mine = build_argv("smollm2-135m", TASKS["squad"], "mezo-lora", 0,
                         Settings(method_args={"mezo-lora": ["--learning-rate", "5e-4"]}), 200)
    assert mine[-4:] == ["--learning-rate", "1e-3", "--learning-rate", "5e-4"]                       # --method-args still wins


def test_pending_skips_finished_cells_and_retries_failed_ones(tmp_path):
    cells = plan(["smollm2-135m"], ["rte"], ["zero-shot", "lp", "ft"], [0], Settings(), {"rte": 277})
    path = tmp_path / "cells.jsonl"
    ok = dict(_rec("rte", "zero-shot"), key=cells[0].key)
    failed = dict(_rec("rte", "lp", status="failed"), key=cells[1].key)
    for r in (ok, failed):
        append_record(path, r)
    with open(path, "a") as f:
        f.write('{"key": "torn')                    # an interrupted write is ignored
    records = load_records(path)
    assert len(records) == 2
    assert [c.method for c in pending(cells, records)] == ["lp", "ft"]
    # appended after the torn line, a later success replaces the failure (the latest line of a key wins)
    append_record(path, dict(failed, status="ok"))
    assert [c.method for c in pending(cells, load_records(path))] == ["ft"]


def test_a_crashing_cell_is_recorded_as_failed_with_the_cli_error(tmp_path):
    """The real CLI, given an option value it rejects, exits non-zero before loading anything."""
    cell = Cell("smollm2-135m", "sst2", "zero-shot", 0, None,
                   ["baseline", "--method", "no-such-method", "--task", "sst2"])
    rec = run_cell(cell, tmp_path, TASKS["sst2"], {"cpu": "x"}, log=lambda *_: None)
    assert rec["status"] == "failed"
    assert rec["returncode"] != 0
    assert "no-such-method" in rec["error"]
    assert rec["command"].startswith("python -m mezo_rl baseline --method no-such-method")
    assert rec["wall_time_s"] > 0 and rec["peak_rss_mb"] > 0


def test_a_cell_stopped_part_way_continues_from_its_checkpoint(tmp_path, tiny_model_dir, data_dir):
    """A MeZO cell killed at step 3 of 6 is resumed by the next suite run (the real CLI with --resume),
    not started over: its first 3 steps and their records are kept, and the record says so."""
    from mezo_rl.training.callbacks import TrainerCallback
    from mezo_rl.cli.main import _config, build_parser, parse_into
    from mezo_rl.training.arguments import MeZOConfig
    from mezo_rl.training.trainer import MeZOTrainer, TrainingInterrupted

    argv = ["train", "--model", str(tiny_model_dir), "--task", "sst2", "--data-dir", str(data_dir),
            "--reward", "cross_entropy", "--max-steps", "6", "--eval-steps", "3", "--per-device-train-batch-size", "4", "--num-train", "16",
            "--num-eval", "4", "--num-test", "4", "--learning-rate", "1e-3", "--eps", "1e-2", "--autocast", "none",
            "--no-progress", "--seed", "3"]
    cell = Cell("tiny", "sst2", "mezo-full", 3, 6, argv)
    run_dir = cell_run_dir(tmp_path, cell)

    class StopAfter3(TrainerCallback):          # what a kill between steps 3 and 4 leaves behind
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                raise KeyboardInterrupt

    ns = build_parser().parse_args(argv + ["--output-dir", str(run_dir)])
    with pytest.raises(TrainingInterrupted):
        MeZOTrainer(args=parse_into(MeZOConfig, ns, _config(ns)), callbacks=[StopAfter3()]).train()
    first = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert unfinished_run(run_dir)[0] == 3

    logs = []
    rec = run_cell(cell, tmp_path, TASKS["sst2"], {"cpu": "x"}, log=logs.append)
    assert rec["status"] == "ok", rec.get("error")
    assert rec["resumed_from_step"] == 3 and "resumed from its step-3 checkpoint" in logs[0]
    assert rec["steps"] == 6 and rec["wall_time_s"] >= rec["wall_time_before_resume_s"] > 0
    assert "--resume" not in rec["command"]       # the command that reproduces the cell runs it whole
    after = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert after[:len(first)] == first            # the stopped part's records, kept as they were
    assert [r["step"] for r in after if "split" not in r] == [1, 2, 3, 4, 5, 6]
    assert unfinished_run(run_dir) is None


# --- aggregation and verdicts -----------------------------------------------------------------------

def test_aggregate_mean_std_and_standard_error():
    recs = [_rec("sst2", "mezo-prefix", seed=s, value=v, n=872, argv=_train_argv("mezo-prefix", s),
                 steps=200, batch=16) for s, v in ((0, 0.60), (1, 0.64), (2, 0.65))]
    recs.append(dict(recs[0], value=0.10))          # an older line of the same cell: superseded below
    recs.append(recs[0])
    (g,) = aggregate(recs)
    assert g.seeds == [0, 1, 2] and g.k == 3
    assert g.mean == pytest.approx((0.60 + 0.64 + 0.65) / 3)
    std = math.sqrt(sum((v - g.mean) ** 2 for v in (0.60, 0.64, 0.65)) / 2)
    assert g.std == pytest.approx(std)
    assert g.se == pytest.approx(max(math.sqrt(g.mean * (1 - g.mean) / 872), std / math.sqrt(3)))
    (one,) = aggregate([_rec(value=0.5, n=100)])
    assert one.std is None and one.se == pytest.approx(0.05)


def _verdict(vs, claim, task="sst2"):
    (v,) = [v for v in vs if v.claim == claim and v.task == task]
    return v


def test_verdicts_are_computed_from_the_numbers():
    n = 872
    recs = [_rec("sst2", "zero-shot", value=0.50, n=n),
            _rec("sst2", "icl", value=0.58, n=n),
            _rec("sst2", "ft", value=0.80, n=n, steps=125, batch=8),
            _rec("sst2", "mezo-full", value=0.62, n=n, argv=_train_argv("mezo-full", 0), steps=200, batch=16),
            _rec("sst2", "mezo-prefix", value=0.66, n=n, argv=_train_argv("mezo-prefix", 0), steps=200, batch=16),
            _rec("sst2", "mezo-metric", value=0.53, n=n, argv=_train_argv("mezo-metric", 0), steps=200, batch=32)]
    vs = verdicts(aggregate(recs))
    se = lambda a, b: math.sqrt(a * (1 - a) / n + b * (1 - b) / n)  # noqa: E731
    # best MeZO (prefix 0.66) vs zero-shot 0.50: 16 points, far beyond 2 SE
    assert 0.16 > 2 * se(0.66, 0.50)
    assert _verdict(vs, "MeZO well above zero-shot").verdict == HOLDS
    assert "+16.0 points" in _verdict(vs, "MeZO well above zero-shot").detail
    # vs ICL 0.58: 8 points, also beyond 2 SE (~4.7)
    assert _verdict(vs, "MeZO well above ICL").verdict == HOLDS
    # full 0.62 vs prefix 0.66: a 4-point gap, within the 5-point tolerance; LoRA reported missing
    v = _verdict(vs, "MeZO full / LoRA / prefix comparable")
    assert v.verdict == HOLDS and "4.0 points" in v.detail and "MeZO LoRA" in v.detail
    # accuracy objective 0.53 vs 0.50: 3 points < 2 SE (~4.8): not "well above"
    assert 0.03 < 2 * se(0.53, 0.50)
    assert _verdict(vs, "accuracy/F1 objective well above zero-shot").verdict == FAILS
    # MeZO 0.66 vs FT 0.80: 14 points short
    v = _verdict(vs, "MeZO within 5 points of FT")
    assert v.verdict == FAILS and "-14.0 points" in v.detail and "200" in v.detail


def test_within_ft_reports_the_fewest_steps_that_reach_it_and_missing_cells_say_not_measured():
    n = 872
    recs = [_rec("rte", "ft", value=0.60, n=n, steps=125, batch=8)]
    for steps, value in ((100, 0.50), (400, 0.56), (1600, 0.59)):
        recs.append(_rec("rte", "mezo-lora", value=value, n=n, argv=_train_argv("mezo-lora", 0, steps, "rte"),
                         steps=steps, batch=16))
    vs = verdicts(aggregate(recs))
    v = _verdict(vs, "MeZO within 5 points of FT", "rte")
    assert v.verdict == HOLDS and "first at 400 MeZO steps" in v.detail
    assert _verdict(vs, "MeZO well above zero-shot", "rte").verdict == MISSING
    assert _verdict(vs, "MeZO well above ICL", "rte").verdict == MISSING
    assert _verdict(vs, "accuracy/F1 objective well above zero-shot", "rte").verdict == MISSING
    assert _verdict(vs, "MeZO full / LoRA / prefix comparable", "rte").verdict == MISSING


def test_closeness_claims_are_inconclusive_when_nothing_moved_off_zero_shot():
    # RTE as measured: FT 50.2 and MeZO prefix 48.4 are within 5 points, but neither is 2 SE above
    # zero-shot 46.6 (n = 277, SE of a difference ~4.2): "close" only because neither learned
    n = 277
    recs = [_rec("rte", "zero-shot", value=0.466, n=n), _rec("rte", "ft", value=0.502, n=n, steps=125, batch=8),
            _rec("rte", "mezo-prefix", value=0.484, n=n, argv=_train_argv("mezo-prefix", 0, 200, "rte"),
                 steps=200, batch=16),
            _rec("rte", "mezo-full", value=0.47, n=n, argv=_train_argv("mezo-full", 0, 200, "rte"),
                 steps=200, batch=16)]
    vs = verdicts(aggregate(recs))
    v = _verdict(vs, "MeZO within 5 points of FT", "rte")
    assert v.verdict == INCONCLUSIVE and "neither moved off zero-shot" in v.detail and "-1.8 points" in v.detail
    v = _verdict(vs, "MeZO full / LoRA / prefix comparable", "rte")
    assert v.verdict == INCONCLUSIVE and "none moved off zero-shot" in v.detail
    # once FT does move (0.70: 23 points, far beyond 2 SE) a MeZO within 5 of it is a real "holds"
    recs[1] = _rec("rte", "ft", value=0.70, n=n, steps=125, batch=8)
    recs[2] = _rec("rte", "mezo-prefix", value=0.66, n=n, argv=_train_argv("mezo-prefix", 0, 200, "rte"),
                   steps=200, batch=16)
    vs = verdicts(aggregate(recs))
    assert _verdict(vs, "MeZO within 5 points of FT", "rte").verdict == HOLDS
    # full 0.47 vs prefix 0.66: a 19-point gap, and prefix learned: the modes really differ
    assert _verdict(vs, "MeZO full / LoRA / prefix comparable", "rte").verdict == FAILS


def test_a_gap_beyond_the_tolerance_between_modes_that_did_not_learn_is_inconclusive():
    # RTE as measured on seed 0: LoRA 52.0 and full 46.9 are 5.1 points apart, but neither is 2 SE
    # (~8.5 points at n = 277) above zero-shot 46.6: the gap is noise between two runs that stood still
    n = 277
    recs = [_rec("rte", "zero-shot", value=0.466, n=n), _rec("rte", "ft", value=0.502, n=n, steps=125, batch=8)]
    recs += [_rec("rte", m, value=v, n=n, argv=_train_argv(m, 0, 200, "rte"), steps=200, batch=16)
             for m, v in (("mezo-full", 0.469), ("mezo-lora", 0.520), ("mezo-prefix", 0.484))]
    vs = verdicts(aggregate(recs))
    v = _verdict(vs, "MeZO full / LoRA / prefix comparable", "rte")
    assert v.verdict == INCONCLUSIVE and "none moved off zero-shot" in v.detail and "5.1 points" in v.detail
    # the same for "within 5 of FT": best MeZO 0.48 is 6 points under FT 0.54, but FT is only 7.4 above
    # zero-shot (< 2 SE), so neither learned; FT at 0.60 (13.4 above, > 2 SE) makes it a real miss
    recs = [r for r in recs if r["method"] not in ("mezo-lora", "mezo-prefix")]
    recs.append(_rec("rte", "mezo-prefix", value=0.48, n=n, argv=_train_argv("mezo-prefix", 0, 200, "rte"),
                     steps=200, batch=16))
    for ft, verdict in ((0.54, INCONCLUSIVE), (0.60, FAILS)):
        recs[1] = _rec("rte", "ft", value=ft, n=n, steps=125, batch=8)
        v = _verdict(verdicts(aggregate(recs)), "MeZO within 5 points of FT", "rte")
        assert v.verdict == verdict and ("neither moved off zero-shot" in v.detail) == (verdict == INCONCLUSIVE)


def test_comparable_fails_beyond_the_tolerance():
    recs = [_rec("sst2", m, value=v, argv=_train_argv(m, 0), steps=200, batch=16)
            for m, v in (("mezo-full", 0.55), ("mezo-lora", 0.52), ("mezo-prefix", 0.70))]
    v = _verdict(verdicts(aggregate(recs)), "MeZO full / LoRA / prefix comparable")
    assert v.verdict == FAILS and "18.0 points" in v.detail


# --- rendering --------------------------------------------------------------------------------------

def test_render_markdown_tables_commands_and_not_measured_rows(tmp_path):
    recs = [_rec("sst2", "zero-shot", value=0.5092, n=872),
            _rec("sst2", "mezo-prefix", seed=0, value=0.60, n=872, argv=_train_argv("mezo-prefix", 0), steps=200,
                 batch=16, curve=[[0, 0.5], [40, 0.55], [200, 0.6]]),
            _rec("sst2", "mezo-prefix", seed=1, value=0.64, n=872, argv=_train_argv("mezo-prefix", 1), steps=200,
                 batch=16, curve=[[0, 0.5], [40, 0.57], [200, 0.62]]),
            _rec("rte", "lp", value=0.55, n=277, status="failed")]
    recs[-1]["error"] = "Traceback ...\nValueError: boom"
    path = tmp_path / "cells.jsonl"
    for r in recs:
        append_record(path, r)
    append_record(path, {"status": "note", "model": "gemma3-270m", "note": "gemma3-270m: not available here"})
    md_path = render(path, tmp_path / "results.md", tasks=["sst2", "squad"])
    md = md_path.read_text()
    assert "## SST-2" in md and "## RTE" in md
    zs_row = next(l for l in md.splitlines() if l.startswith("| Zero-shot |"))
    assert "**50.9**" in zs_row and "| 872 |" in zs_row
    prefix_row = next(l for l in md.splitlines() if l.startswith("| MeZO prefix (CE) |"))
    std = 100 * math.sqrt(((0.60 - 0.62) ** 2 + (0.64 - 0.62) ** 2) / 1)
    assert f"**62.0** ± {std:.1f}" in prefix_row and "| 0,1 |" in prefix_row and "200 × 16" in prefix_row
    assert next(l for l in md.splitlines() if l.startswith("| ICL |")).count("not measured") == 1
    assert "| Linear probing | failed |" in md and "ValueError: boom" in md
    assert "gemma3-270m: not available here" in md
    assert "python -m mezo_rl baseline --method zero-shot" in md     # the commands, in footnotes
    assert "## The paper's claims at this scale" in md and "**not measured**" in md
    # a task without any cell still has its section and its claims row, all "not measured"
    squad = md.split("## SQuAD")[1].split("## ")[0]
    assert "| MeZO prefix (F1 objective) | not measured |" in squad and "Linear probing" not in squad
    assert "| every claim | SQuAD | – | **not measured** |" in md
    assert "| SQuAD (planned) | 1000 | 100 | at most 200 | 2 |" in md
    assert (tmp_path / "results" / "sst2_bars.png").stat().st_size > 0
    assert (tmp_path / "results" / "sst2_curves.png").stat().st_size > 0
    assert "](results/sst2_bars.png)" in md


def test_the_same_method_on_two_models_is_one_row_with_a_column_per_model(tmp_path):
    argv = {m: ["baseline", "--method", "lp", "--model", m, "--task", "sst2", "--seed", "0"]
            for m in ("smollm2-135m", "gemma3-270m")}
    recs = [_rec("sst2", "lp", value=0.75, model="smollm2-135m", argv=argv["smollm2-135m"]),
            _rec("sst2", "lp", value=0.84, model="gemma3-270m", argv=argv["gemma3-270m"])]
    recs[1]["variant"] = "stale"   # a record written before variant_of left the model out
    path = tmp_path / "cells.jsonl"
    for r in recs:
        append_record(path, r)
    md = render(path, tmp_path / "results.md", tasks=["sst2"]).read_text()
    rows = [l for l in md.splitlines() if l.startswith("| Linear probing")]
    assert len(rows) == 1 and rows[0].startswith("| Linear probing |")
    assert "**75.0**" in rows[0] and "**84.0**" in rows[0] and "not measured" not in rows[0]


def test_step_variants_of_a_method_are_rows_in_order_of_steps(tmp_path):
    path = tmp_path / "cells.jsonl"
    for steps in (12000, 1500, 20000):   # "12000" < "1500" < "20000" as text
        argv = _train_argv("mezo-norm", 0) + ["--max-steps", str(steps)]
        append_record(path, _rec("sst2", "mezo-norm", value=0.75, argv=argv, steps=steps, batch=64))
    md = render(path, tmp_path / "results.md", tasks=["sst2"]).read_text()
    rows = [l.split(" | ")[0] for l in md.splitlines() if l.startswith("| MeZO final norm (CE)")]
    assert rows == [f"| MeZO final norm (CE), {k} steps" for k in (1500, 12000, 20000)]


def test_variants_with_the_same_steps_are_labelled_by_the_options_that_differ(tmp_path):
    path = tmp_path / "cells.jsonl"
    for lr in ("0.003", "0.0001"):
        for seed in (0, 1):
            argv = _train_argv("mezo-lora", seed) + ["--learning-rate", lr]
            append_record(path, _rec("sst2", "mezo-lora", seed=seed, value=0.6, argv=argv, steps=200, batch=16))
    md = render(path, tmp_path / "results.md", tasks=["sst2"]).read_text()
    rows = [l.split(" | ")[0] for l in md.splitlines() if l.startswith("| MeZO LoRA (CE)")]
    assert rows == ["| MeZO LoRA (CE), lr 0.0001", "| MeZO LoRA (CE), lr 0.003"]


def test_render_only_command_line(tmp_path):
    path = tmp_path / "cells.jsonl"
    append_record(path, _rec("sst2", "zero-shot", value=0.5, n=872))
    out = tmp_path / "r.md"
    assert main(["--render-only", "--results", str(path), "--out-md", str(out)]) == 0
    assert "**50.0**" in out.read_text()


def test_only_filter_is_checked():
    assert parse_only(["task=sst2,rte", "seed=0"]) == {"task": {"sst2", "rte"}, "seed": {"0"}}
    with pytest.raises(SystemExit, match="unknown field 'steps'"):
        parse_only(["steps=3"])
    with pytest.raises(SystemExit, match="unknown method"):
        parse_method_args(["mezo=--lr 1"])


# --- end to end -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_quick_mode_end_to_end(tmp_path):
    """The suite's --quick mode on SmolLM2 (a few minutes on 2 cores): real cells through the real CLI."""
    results, md = tmp_path / "cells.jsonl", tmp_path / "results.md"
    cmd = [sys.executable, str(REPO / "benchmarks" / "results.py"), "--quick", "--results", str(results),
           "--out-md", str(md), "--runs-dir", str(tmp_path / "runs")]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    recs = [r for r in load_records(results) if "key" in r]
    assert sorted(r["method"] for r in recs) == sorted(QUICK["methods"])
    for r in recs:
        assert r["status"] == "ok", r.get("error")
        assert 0.0 <= r["value"] <= 1.0 and r["n"] == 16
        assert r["wall_time_s"] > 0 and r["peak_rss_mb"] > 100      # a real model was loaded
        assert r["command"].startswith("python -m mezo_rl ")
    prefix = next(r for r in recs if r["method"] == "mezo-prefix")
    assert prefix["steps"] == 4 and prefix["batch"] == 4 and len(prefix["curve"]) >= 2
    ft = next(r for r in recs if r["method"] == "ft")
    assert ft["steps"] == 2
    text = md.read_text()
    assert "## SST-2" in text and "## The paper's claims at this scale" in text
    assert (tmp_path / "results" / "sst2_bars.png").stat().st_size > 0
    assert (tmp_path / "results" / "sst2_curves.png").stat().st_size > 0
    # resuming: everything is done, nothing runs again
    p2 = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert p2.returncode == 0 and "0 to run" in p2.stdout
    assert len([r for r in load_records(results) if "key" in r]) == len(recs)
