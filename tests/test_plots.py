"""What a run directory shows: curves.png, the one-line result and `report` (mezo_rl.cli.plots)."""
from __future__ import annotations

import json
import math
import shutil
import sys

import pytest

from mezo_rl.errors import UserError
from mezo_rl.cli.plots import (CURVES_FILE, CurvesCallback, MissingPlotDependency, plot_training_curves, pyplot, report, results_line,
                           running_mean, training_curves)
from test_trainer import make_args, train

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_tokenizer):
    """A finished tiny run: 6 steps, two reward components, evaluations at steps 0, 3, 6."""
    from conftest import make_tiny_causal_lm
    from mezo_rl.model.lm import LanguageModel

    tmp = tmp_path_factory.mktemp("plots")
    args = make_args(tmp, reward=["cross_entropy", "accuracy"], reward_weights=[1.0, 0.5])
    _, summary = train(args, lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer),
                       callbacks=[CurvesCallback()])  # what `mezo-rl train` adds
    return tmp / "run", summary


@pytest.fixture()
def run(finished_run, tmp_path):
    """A copy of the finished run that a test may change."""
    src, summary = finished_run
    shutil.copytree(src, tmp_path / "run")
    return tmp_path / "run", summary


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]


def test_running_mean_is_the_mean_of_the_last_window_values():
    assert running_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert running_mean([2.0, math.nan, 4.0], 3) == [2.0, 2.0, 3.0]  # a skipped step does not poison the mean
    assert math.isnan(running_mean([math.nan], 1)[0])


def test_curves_are_the_logged_rewards_and_validation_metric(run):
    run_dir, summary = run
    curves = training_curves(run_dir, window=2)
    steps = [r for r in records(run_dir) if "split" not in r]
    assert set(curves["reward"]) == {"cross_entropy", "accuracy"}
    xs, ys, mean = curves["reward"]["cross_entropy"]
    assert xs == [1, 2, 3, 4, 5, 6] and ys == [r["reward/cross_entropy"] for r in steps]
    assert mean[3] == pytest.approx((ys[2] + ys[3]) / 2)
    val = [r for r in records(run_dir) if r.get("split") == "validation"]
    assert curves["metric"] == "accuracy"
    assert curves["validation"] == ([0, 3, 6], [r["metrics"]["accuracy"] for r in val])
    assert curves["best_step"] == summary["best_step"]
    assert (run_dir / CURVES_FILE).read_bytes()[:8] == PNG  # the trainer drew it at the end of the run
    (run_dir / CURVES_FILE).unlink()
    path = plot_training_curves(run_dir)
    assert path == run_dir / CURVES_FILE and path.read_bytes()[:8] == PNG


def test_report_names_the_run_and_gives_before_after_with_n(run):
    run_dir, summary = run
    text = report(run_dir)
    lines = text.splitlines()
    assert lines[0] == f"run {run_dir}: task sst2, model tiny, objective cross_entropy + 0.5*accuracy"
    assert lines[1] == "MeZO: full fine-tuning, 6 steps of 4 examples, lr 0.001, eps 0.01, seed 0"
    v0, v1 = summary["initial_validation"]["accuracy"], summary["validation"]["accuracy"]
    t0, t1 = summary["initial_test"]["accuracy"], summary["test"]["accuracy"]
    sv, st = summary["validation"]["accuracy/se"], summary["test"]["accuracy/se"]
    assert lines[2] == (f"validation accuracy {v0:.3f} -> {v1:.3f} (SE {sv:.3f}) (n=12), test accuracy {t0:.3f} -> "
                        f"{t1:.3f} (SE {st:.3f}) (n=12), best step {summary['best_step']} of 6")
    assert lines[3] == f"wall time {summary['wall_time_s']:.0f} s, peak memory {summary['peak_rss_mb']:.0f} MiB (RSS)"
    assert lines[4] == f"plot: {run_dir / CURVES_FILE}" and (run_dir / CURVES_FILE).read_bytes()[:8] == PNG


def test_results_line_formats():
    summary = {"metric_for_best": "accuracy", "best_step": 40, "steps": 50,
               "initial_validation": {"accuracy": 0.53, "n": 100.0}, "validation": {"accuracy": 0.65, "n": 100.0},
               "initial_test": {"accuracy": 0.505, "n": 872.0}, "test": {"accuracy": 0.72, "n": 872.0}}
    assert results_line(summary) == ("validation accuracy 0.530 -> 0.650 (n=100), test accuracy 0.505 -> 0.720 "
                                     "(n=872), best step 40 of 50")
    summary.update(initial_test=None, test={})  # --no-initial-test, and a task without a test split
    assert results_line(summary) == "validation accuracy 0.530 -> 0.650 (n=100), best step 40 of 50"


def test_report_of_an_unfinished_run(run):
    run_dir, summary = run
    (run_dir / "summary.json").unlink()
    kept = [r for r in records(run_dir) if r["step"] <= 3 and not (r.get("split") == "test" and r["step"] > 0)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    lines = report(run_dir, plot=False).splitlines()
    assert lines[2] == "unfinished (no summary.json): 3 of 6 steps logged"
    val = [r for r in kept if r.get("split") == "validation"]
    assert lines[3] == (f"validation accuracy {val[0]['metrics']['accuracy']:.3f} (step 0) -> "
                        f"{val[-1]['metrics']['accuracy']:.3f} (step 3) (n=12)")


def test_not_a_run_directory_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"does not exist"):
        report(tmp_path / "nope")
    (tmp_path / "training_args.json").write_text("{}")
    with pytest.raises(UserError, match=r"not a mezo-rl run directory \(missing metrics.jsonl\)"):
        report(tmp_path)


def test_without_matplotlib_the_report_says_what_to_install(run, monkeypatch):
    run_dir, _ = run
    (run_dir / CURVES_FILE).unlink()  # the trainer drew it at the end of the run
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(MissingPlotDependency, match=r"pip install 'mezo-rl\[plot\]'"):
        pyplot()
    text = report(run_dir)
    assert text.splitlines()[-1].startswith("no plot: plots need matplotlib") and not (run_dir / CURVES_FILE).exists()
