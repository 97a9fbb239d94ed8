"""benchmarks/rl.py's arithmetic: the paired gain and its SE, the bar count in the tables, and which MeZO
cell's training time a GRPO cell gets (pure functions fed with fabricated records as inputs)."""
from __future__ import annotations

import math
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))     # as `python benchmarks/rl.py` sees it

import rl  # noqa: E402


def _samples(values, prompts=None):
    prompts = prompts or [f"p{i}" for i in range(len(values))]
    return [{"prompt": p, "completion": "c", rl.REWARD: v} for p, v in zip(prompts, values)]


def test_paired_gain_is_the_mean_difference_with_its_standard_error():
    before, after = [0.0, 0.5, -0.5, 0.0], [0.4, 0.5, 0.1, 0.1]   # differences 0.4, 0, 0.6, 0.1
    out = rl.paired_gain(_samples(before), _samples(after))
    diffs = [0.4, 0.0, 0.6, 0.1]
    mean = sum(diffs) / 4
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 3)
    assert out["n"] == 4
    assert out["gain"] == pytest.approx(mean, abs=1e-12)
    assert out["se"] == pytest.approx(sd / 2, abs=1e-12)


def test_paired_gain_refuses_unmatched_prompts_or_missing_rewards():
    assert rl.paired_gain(_samples([0.1, 0.2]), _samples([0.1, 0.2], prompts=["p0", "other"])) == {}
    assert rl.paired_gain(_samples([0.1, 0.2]), _samples([0.1])) == {}
    assert rl.paired_gain(_samples([0.1, None]), _samples([0.1, 0.3])) == {}


def _record(variant, seed, before, after, paired=None, machine=None):
    return {"variant": variant, "tool": rl.VARIANTS[variant][0], "seed": seed, "ok": True, "steps": 60,
            "machine": machine or rl.machine(),
            "initial_test": {rl.REWARD: before, f"{rl.REWARD}/se": 0.02, "n": 200},
            "test": {rl.REWARD: after, f"{rl.REWARD}/se": 0.03, "n": 200},
            "paired": paired or {}, "wall_s": 600.0, "peak_rss_mb": 1000.0, "train_s": 500.0}


def test_the_bar_counts_seeds_by_the_gain_over_its_own_se():
    records = [_record("mezo", 0, 0.1, 0.2, {"gain": 0.10, "se": 0.025, "n": 200}),   # 4.0 SE: above
               _record("mezo", 1, 0.1, 0.2, {"gain": 0.10, "se": 0.040, "n": 200}),   # 2.5 SE: not
               _record("mezo", 2, 0.1, 0.3)]                                          # 0.2 / sqrt(.02²+.03²) = 5.5 SE
    table = rl.render(records)
    row = next(line for line in table.splitlines() if line.startswith("| mezo | M1 | the example"))
    assert "| 2 of 3 |" in row
    assert "+0.100 (0.040) | 2.5 |" in table and "†" in table   # the unpaired SE is marked


def test_machines_are_kept_apart():
    """A cell rerun on another CPU is another cell: its seconds and, through float32 rounding, its completions
    differ, so neither replaces the other and each machine's seeds are counted on their own."""
    records = [_record("mezo", 0, 0.1, 0.2, {"gain": 0.10, "se": 0.025, "n": 200}, machine="cpu A"),
               _record("mezo", 0, 0.1, 0.15, {"gain": 0.05, "se": 0.025, "n": 200}, machine="cpu B")]
    table = rl.render(records)
    rows = [line for line in table.splitlines() if line.startswith("| mezo | M")]
    assert len(rows) == 4  # one cell row and one summary row per machine
    assert "- M1: cpu A" in table and "- M2: cpu B" in table
    assert any("| M1 |" in r and "| 1 of 1 |" in r for r in rows) and any("| M2 |" in r and "| 0 of 1 |" in r for r in rows)


def test_a_cells_sample_completions_are_shown_beside_its_figures():
    """Records keep the first test prompts' completions before -> after; the tables show two of each cell that
    has them (records written before they were kept show none)."""
    before = [{"prompt": f"p{i}", "completion": f"old {i}", rl.REWARD: 0.0} for i in range(5)]
    after = [{"prompt": f"p{i}", "completion": f"new {i}", rl.REWARD: 0.5} for i in range(5)]
    kept = rl.sample_pairs(before, after, rl.REWARD)
    assert [s["after"] for s in kept] == ["new 0", "new 1", "new 2", "new 3"] and kept[0][rl.REWARD] == 0.5
    records = [dict(_record("mezo", 0, 0.1, 0.2), samples=kept), _record("mezo", 1, 0.1, 0.2)]
    lines = [line for line in rl.render(records).splitlines() if line.startswith("- mezo seed")]
    assert lines == ["- mezo seed 0 on M1: 'p0': 'old 0' → 'new 0'", "- mezo seed 0 on M1: 'p1': 'old 1' → 'new 1'"]


def test_each_grpo_variant_gets_the_training_time_of_its_mezo_cell(tmp_path):
    records = [dict(_record("mezo", 0, 0.1, 0.2), train_s=800.0),
               dict(_record("mezo-g4-group", 0, 0.1, 0.2), train_s=2000.0)]
    assert "--time-budget-s 800" in " ".join(rl.command("grpo", 0, tmp_path, records))
    assert "--time-budget-s 2000" in " ".join(rl.command("grpo-long", 0, tmp_path, records))
    with pytest.raises(SystemExit, match="run the mezo cell of seed 1 on this machine"):
        rl.command("grpo", 1, tmp_path, records)
    elsewhere = [dict(_record("mezo", 1, 0.1, 0.2, machine="another cpu"), train_s=900.0)]
    with pytest.raises(SystemExit, match="run the mezo cell of seed 1 on this machine"):  # seconds of another CPU
        rl.command("grpo", 1, tmp_path, elsewhere)


def test_a_rerun_keeps_the_earlier_run_directories(tmp_path):
    cell = tmp_path / "mezo-s1"
    for text in ("first", "second"):
        cell.mkdir()
        (cell / "log.txt").write_text(text)
        rl.set_aside(cell)
    assert not cell.exists()
    assert [(tmp_path / f"mezo-s1-prev{n}" / "log.txt").read_text() for n in (1, 2)] == ["first", "second"]
    rl.set_aside(cell)  # nothing to move
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mezo-s1-prev1", "mezo-s1-prev2"]


def test_head_to_head_pairs_the_two_models_by_prompt():
    a = _samples([0.1, 0.5, 0.3])
    b = list(reversed(_samples([0.0, 0.2, 0.3])))  # another order: pairing is by prompt
    out = rl.head_to_head(a, b)
    diffs = [0.1, 0.3, 0.0]
    mean = sum(diffs) / 3
    sd = (sum((d - mean) ** 2 for d in diffs) / 2) ** 0.5
    assert out["n"] == 3 and out["gain"] == pytest.approx(mean) and out["se"] == pytest.approx(sd / 3 ** 0.5)
    assert rl.head_to_head(a, _samples([0.0, 0.2, 0.3], prompts=["p0", "p1", "other"])) == {}
    assert rl.head_to_head(a, _samples([0.0, None, 0.3])) == {}
