"""The reward-KL frontier (benchmarks/suite/frontier.py) on fabricated protocol records: the cells' means and SEs
over seeds, the Pareto points chosen on validation, the generated "who wins at which kl", the table and the plot."""
from __future__ import annotations

import math
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from suite import frontier as fr  # noqa: E402
from test_rl_protocol import _fields  # noqa: E402

REWARD = "exact_answer"


def rec(cell, tool, seed, val_gain, val_kl, gain, kl=None, **kw):
    return {"protocol": 1, "task": "arithmetic", "cell": cell, "tool": tool, "seed": seed, "ok": True, "lr": 1e-3,
            "beta": 0.0, **_fields(val_gain, val_kl, gain, kl), **kw}


def three(cell, tool, val_gain, val_kl, gains, kls=None):
    kls = kls or [val_kl] * 3
    return [rec(cell, tool, s, val_gain, val_kl, g, k) for s, (g, k) in enumerate(zip(gains, kls))]


def test_a_cell_is_the_mean_over_its_seeds_with_the_se_over_seeds():
    rows = three("m", "mezo-rl", 0.3, 0.01, [0.30, 0.36, 0.42], kls=[0.01, 0.02, 0.03])
    (s,) = fr.summarise(rows, REWARD)
    sd = math.sqrt(((0.30 - 0.36) ** 2 + 0 + (0.42 - 0.36) ** 2) / 2)
    assert s["seeds"] == [0, 1, 2] and s["compared"]
    assert s["gain"] == pytest.approx(0.36) and s["gain_se"] == pytest.approx(sd / math.sqrt(3))
    assert s["kl"] == pytest.approx(0.02) and s["kl_se"] == pytest.approx(0.01 / math.sqrt(3))
    assert s["val_gain"] == pytest.approx(0.3) and s["val_kl"] == pytest.approx(0.01)
    # a later record of a seed replaces the earlier; a record the protocol does not admit is left out
    again = rows + [rec("m", "mezo-rl", 2, 0.3, 0.01, 0.36, 0.02)]
    sd = math.sqrt((0.04 ** 2 + 0.02 ** 2 + 0.02 ** 2) / 2)   # gains 0.30, 0.36, 0.36
    assert fr.summarise(again, REWARD)[0]["gain_se"] == pytest.approx(sd / math.sqrt(3))
    pre = [{k: v for k, v in r.items() if k != "protocol"} for r in rows]
    assert fr.summarise(pre, REWARD) == []
    (two,) = fr.summarise(rows[:2], REWARD)
    assert not two["compared"]


def test_pareto_keeps_the_undominated_points_on_validation():
    pts = [{"id": i, "val_kl": k, "val_gain": g} for i, (k, g) in enumerate(
        [(0.01, 0.10), (0.02, 0.30), (0.02, 0.20), (0.05, 0.25), (0.10, 0.40), (0.10, 0.40), (0.001, 0.0)])]
    assert [p["id"] for p in fr.pareto(pts)] == [6, 0, 1, 4, 5]   # 2 and 3 dominated by 1; ties both kept


def test_the_frontier_reads_validation_not_test():
    """A cell with the better test gain but a worse validation is not on the frontier: the frontier is a choice."""
    rows = (three("a", "mezo-rl", 0.30, 0.01, [0.10] * 3) + three("b", "mezo-rl", 0.20, 0.02, [0.90] * 3)
            + three("c", "trl-grpo", 0.5, 0.2, [0.5] * 3))
    summ = fr.summarise(rows, REWARD)
    assert [s["cell"] for s in fr.frontier(summ, "mezo-rl")] == ["a"]
    assert fr.candidates([r for r in rows if r["seed"] == 0], REWARD) == ["a", "c"]


def test_who_wins_at_each_kl_budget():
    """MeZO alone at kl <= 0.01; at 0.05 MeZO's 0.30 (SE 0.01) against GRPO's 0.20 (SE 0.01): MeZO; from 0.2 GRPO's
    0.60 wins; a GRPO cell within 2 SE at 0.1 names no winner."""
    mezo = three("m1", "mezo-rl", 0.2, 0.01, [0.19, 0.20, 0.21]) + three("m2", "mezo-rl", 0.3, 0.05, [0.29, 0.30, 0.31])
    grpo = (three("g1", "trl-grpo", 0.2, 0.05, [0.19, 0.20, 0.21]) + three("g2", "trl-grpo", 0.31, 0.1, [0.27, 0.31, 0.35])
            + three("g3", "trl-grpo", 0.6, 0.2, [0.59, 0.60, 0.61]))
    summ = fr.summarise(mezo + grpo, REWARD)
    rows = fr.who_wins(summ)
    assert [r["verdict"] for r in rows] == ["only MeZO has a cell", "MeZO", "neither (within 2 SE)", "TRL GRPO"]
    assert [r["lo"] for r in rows] == pytest.approx([0.01, 0.05, 0.1, 0.2])
    assert [r["hi"] for r in rows] == pytest.approx([0.01, 0.05, 0.1, 0.2])
    assert rows[1]["diff"] == pytest.approx(0.10) and rows[1]["se"] == pytest.approx(math.hypot(*[0.01 / math.sqrt(3)] * 2))
    assert (rows[2]["mezo"], rows[2]["grpo"]) == ("m2", "g2")   # each tool's best validation gain within the budget
    text = fr.statements(summ)
    assert text[0].startswith("- validation kl below 0.0100: no compared cell")
    assert "**MeZO**: MeZO m2 vs GRPO g1, development gain difference +0.100" in text[2]
    assert text[-1].startswith("- validation kl from 0.2000 up: **TRL GRPO**")


def test_table_and_plot(tmp_path):
    rows = three("m", "mezo-rl", 0.3, 0.01, [0.3, 0.32, 0.34]) + three("g", "trl-grpo", 0.4, 0.1, [0.4, 0.5, 0.6])
    rows += [rec("lonely", "mezo-rl", 0, 0.1, 0.2, 0.1)]
    summ = fr.summarise(rows, REWARD)
    lines = fr.table(summ)
    assert len(lines) == 2 + 3
    assert lines[2].startswith("| MeZO | m |") and lines[2].endswith("| yes |")
    assert "+0.320 ± 0.012" in lines[2]
    assert lines[-1].startswith("| MeZO | lonely |") and "(1 seed(s): not compared)" in lines[-1]
    png = fr.plot(summ, tmp_path / "x_frontier.png", "t", REWARD)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert fr.plot(fr.summarise(rows[-1:], REWARD), tmp_path / "one.png", "t", REWARD).is_file()  # one seed: hollow
    assert fr.plot([], tmp_path / "none.png", "t", REWARD) is None


def test_frontier_labels_keep_their_order_and_never_overlap():
    ys = [0.30, 0.31, 0.29, 0.60, 0.05, 0.62]
    gap, top = 0.05, 0.64
    out = fr.spread(ys, gap, top)
    order = sorted(range(len(ys)), key=lambda i: ys[i])
    placed = [out[i] for i in order]
    assert all(b - a >= gap - 1e-12 for a, b in zip(placed, placed[1:]))   # in order, a gap apart
    assert max(out) <= top + 1e-12
    assert out[4] == 0.05                                                  # a label with room stays at its point
    assert sum(out[i] for i in (0, 1, 2)) / 3 == pytest.approx(0.30)     # a crowded run is centred on its points
    assert fr.spread([0.1], gap) == [0.1]
