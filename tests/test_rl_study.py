"""benchmarks/rl.py --study: which MeZO cell's training seconds a GRPO cell gets, and the rendered table and
reward-KL plot (pure functions fed with fabricated records as inputs)."""
from __future__ import annotations

import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))     # as `python benchmarks/rl.py` sees it

import rl  # noqa: E402


def _record(cell, gain, kl, machine=None, train_s=120.0):
    reward = rl.STUDY_TASKS["arithmetic"]["reward"]
    return {"task": "arithmetic", "cell": cell, "tool": rl.STUDY_CELLS[cell][0], "seed": 0, "ok": True,
            "machine": machine or rl.machine(), "train_s": train_s, "steps": 20, "best_step": 20,
            "initial_test": {reward: 0.2, "n": 200}, "test": {reward: 0.2 + gain, "n": 200, "kl": kl},
            "paired": {"gain": gain, "se": 0.01, "n": 200},
            "samples": [{"prompt": "What is 1 + 2?", "before": "4", "after": "3", reward: 1.0}]}


def test_both_tools_train_for_the_budget(tmp_path):
    """A GRPO cell stops at the study's budget; a MeZO cell runs its steps and validates once, at its end."""
    cmd = rl.study_command("arithmetic", "grpo-lora-lr1e-5", 0, tmp_path)
    assert cmd[cmd.index("--time-budget-s") + 1] == str(rl.STUDY_BUDGET_S) and cmd[cmd.index("--lr") + 1] == "1e-5"
    mezo = rl.study_command("arithmetic", "mezo-lora-lr3e-3", 0, tmp_path)
    assert mezo[mezo.index("--max-steps") + 1] == mezo[mezo.index("--eval-steps") + 1] and "--num-test" in mezo
    assert mezo[mezo.index("--member-evaluation") + 1] == "batched"


def test_the_study_renders_a_table_and_a_reward_kl_plot(tmp_path, monkeypatch):
    monkeypatch.setattr(rl, "STUDY_PLOTS", tmp_path)
    text = rl.render_study([_record("mezo-norm-lr0.1", 0.05, 0.002), _record("grpo-lora-lr1e-5", 0.01, 0.0005)])
    rows = [line for line in text.splitlines() if line.startswith("| mezo-norm-lr0.1 ") or line.startswith("| grpo-lora")]
    assert len(rows) == 2 and "+0.050 (0.010)" in rows[0] and "0.00200" in rows[0]
    assert (tmp_path / "rl_study_arithmetic.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert rl.render_study([]) == ""


def test_hacking_measures_pair_the_prompts_and_see_a_collapse(tiny_causal_lm):
    """Base log-likelihood's change is the mean of the per-prompt changes (SE from those); distinct-2's change
    carries a bootstrap SE: zero for unchanged completions, and a collapse onto one phrase is many SE down."""
    from mezo_rl.model.lm import LanguageModel
    from mezo_rl.stats import Moments
    from suite.hacking import base_logliks, hacking_measures

    model, tok = tiny_causal_lm
    lm = LanguageModel(model, tok)
    prompts = [f"prompt number {i}" for i in range(12)]
    before = [{"prompt": p, "completion": f"a story about {w} and more"} for p, w in zip(prompts, "abcdefghijkl")]
    same = hacking_measures(before, [dict(s) for s in reversed(before)], lm)  # pairing is by prompt, not position
    assert same["change"] == 0.0 and same["change_se"] == 0.0 and same["change_n"] == 12
    assert same["distinct_2_change"] == 0.0 and same["distinct_2_change_se"] == 0.0
    after = [{"prompt": p, "completion": "great great great great"} for p in prompts]
    m = hacking_measures(before, after, lm)
    lb, la = base_logliks(prompts, [s["completion"] for s in before], lm), base_logliks(prompts, [s["completion"] for s in after], lm)
    diffs = Moments.of(a - b for a, b in zip(la, lb))
    assert m["change"] == diffs.mean and m["change_se"] == diffs.se
    assert m["distinct_2_change"] < -2 * m["distinct_2_change_se"] < 0


def test_cells_on_several_seeds_get_a_summary_row():
    rows = [dict(_record("mezo-full-lr1e-3-20steps", g, 0.02), seed=s, paired={"gain": g, "se": 0.02, "n": 200})
            for s, g in enumerate((0.10, 0.04, 0.16))]
    lines = rl.study_seed_summary(rows + [_record("grpo-lora-lr1e-4", 0.3, 0.2)])
    row = next(line for line in lines if line.startswith("| mezo-full-lr1e-3-20steps "))
    assert "| 0, 1, 2 | +0.100 ± 0.060 | 2 of 3 |" in row       # 0.04 is 2 SE: under the bar
    assert not any(line.startswith("| grpo-lora") for line in lines)  # one seed: no summary


def test_pre_protocol_cells_are_marked_exploratory_and_compared_nowhere(tmp_path, monkeypatch):
    """The study's records predate issue 50's protocol (one seed, 50 validation prompts, settings chosen after reading
    test): the section says so and states no winner, however the numbers fall."""
    monkeypatch.setattr(rl, "STUDY_PLOTS", tmp_path)
    def rec(cell, seed, gain, objective):
        return dict(_record(cell, gain, 0.3), seed=seed, validation={"objective": objective}, peak_rss_mb=1000.0,
                    paired={"gain": gain, "se": 0.04, "n": 200})
    rows = [rec("mezo-full-lr3e-3", s, g, 0.6) for s, g in enumerate((0.40, 0.28, 0.30))]
    rows += [rec("grpo-full-lr1e-5", s, g, 0.64) for s, g in enumerate((0.42, 0.56, 0.50))]
    text = rl.render_study(rows)
    assert "exploratory, pre-protocol" in text and rl.PRE_PROTOCOL in text
    assert "larger" not in text and "MeZO - GRPO" not in text


def test_every_mezo_study_cell_is_a_valid_train_command(tmp_path):
    """A cell whose options `mezo-rl train` does not take would fail only after the runner started it: each MeZO
    cell's command parses into MeZOConfig (no model loads)."""
    from mezo_rl.cli.main import build_parser, parse_into
    from mezo_rl.training.arguments import MeZOConfig

    parser = build_parser()
    for cell, (tool, _, _) in rl.STUDY_CELLS.items():
        if tool == "mezo-rl":
            cmd = rl.study_command("arithmetic", cell, 0, tmp_path / cell)
            argv = cmd[cmd.index("train"):]
            ns = parser.parse_args(argv)
            assert parse_into(MeZOConfig, ns).task == "arithmetic", cell
