"""The paired bootstrap over prompts and seeds (benchmarks/suite/bootstrap.py) on cases whose answer is known by
construction: where the resampled statistic is an exact binomial, its percentile interval and SE are computed
here from the binomial law, and the test checks the bootstrap finds them. The tolerances come from the Monte Carlo
error of RESAMPLES draws, not from a run."""
from __future__ import annotations

import math
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))

from suite import bootstrap as bs  # noqa: E402

B = bs.RESAMPLES
MC_SD = math.sqrt(0.025 * 0.975 / B)  # the Monte Carlo sd of an empirical CDF at 2.5% (and at 97.5%)


def binomial_cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1))


def binomial_interval(n: int, p: float) -> tuple[float, float]:
    """The exact 2.5% and 97.5% quantiles (inverted CDF) of Binomial(n, p) / n, after checking that the CDF is far
    enough from 0.025 and 0.975 at every jump for B draws to find the same quantiles (beyond 5 Monte Carlo sds)."""
    cdf = [binomial_cdf(i, n, p) for i in range(n + 1)]
    for q in (0.025, 0.975):
        assert min(abs(c - q) for c in cdf) > 5 * MC_SD, "the case is too close to a jump to be decided by B draws"
    lo = next(i for i, c in enumerate(cdf) if c >= 0.025)
    hi = next(i for i, c in enumerate(cdf) if c >= 0.975)
    return lo / n, hi / n


def test_seeds_resampled_an_exact_binomial_interval():
    # 5 seeds, each with the same difference on every prompt: 0, 0, 1, 1, 1. A resample's statistic is the share of
    # drawn seeds whose difference is 1, Binomial(5, 0.6) / 5: its interval and sd are known exactly
    a = [[d] * 4 for d in (0, 0, 1, 1, 1)]
    b = [[0] * 4 for _ in range(5)]
    iv = bs.paired_bootstrap(a, b)
    lo, hi = binomial_interval(5, 0.6)
    assert (iv.lo, iv.hi) == (pytest.approx(lo), pytest.approx(hi)) == (0.2, 1.0)
    assert iv.diff == pytest.approx(0.6) and (iv.seeds, iv.prompts) == (5, 4)
    # the sd of the resampled statistic: sqrt(p (1 - p) / 5); a sample sd of B draws is within 5 of its relative
    # sds, 1 / sqrt(2 (B - 1)), of the true one
    assert iv.se == pytest.approx(math.sqrt(0.6 * 0.4 / 5), rel=5 / math.sqrt(2 * (B - 1)))


def test_prompts_resampled_an_exact_binomial_interval():
    # one seed, 10 prompts, the difference 1 on 5 of them and 0 on the others: Binomial(10, 0.5) / 10
    a = [[1] * 5 + [0] * 5]
    iv = bs.paired_bootstrap(a, [[0] * 10])
    lo, hi = binomial_interval(10, 0.5)
    assert (iv.lo, iv.hi) == (pytest.approx(lo), pytest.approx(hi)) == (0.2, 0.8)
    assert iv.se == pytest.approx(math.sqrt(0.25 / 10), rel=5 / math.sqrt(2 * (B - 1)))
    assert bs.verdict(iv, "MeZO", "GRPO") == "MeZO" and iv.excludes_zero


def test_the_same_draw_serves_both_tools():
    # B is A shifted by 0.1 on every seed and prompt: every paired resample gives exactly 0.1, so the interval is the
    # point. Resampling the two tools apart would spread it over the outcomes' own variation (here 0 to 1).
    a = [[(i * 7 + s) % 2 for i in range(30)] for s in range(3)]
    b = [[x - 0.1 for x in row] for row in a]
    iv = bs.paired_bootstrap(a, b, resamples=500)
    assert iv.lo == pytest.approx(0.1) and iv.hi == pytest.approx(0.1) and iv.se == pytest.approx(0, abs=1e-12)
    same = bs.paired_bootstrap(a, a, resamples=500)
    assert (same.lo, same.hi) == (0.0, 0.0) and "neither" in bs.verdict(same)


def test_more_seeds_for_a_close_difference_only():
    close = bs.Interval(diff=0.02, lo=-0.01, hi=0.05, se=0.01, seeds=3, prompts=500, resamples=B)
    clear = bs.Interval(diff=0.05, lo=0.03, hi=0.07, se=0.01, seeds=3, prompts=500, resamples=B)
    assert bs.needs_more_seeds(close) and not bs.needs_more_seeds(clear)
    assert not bs.needs_more_seeds(dataclasses_replace(close, seeds=bs.MORE_SEEDS))


def dataclasses_replace(iv, **kw):
    import dataclasses
    return dataclasses.replace(iv, **kw)


def test_records_pair_by_prompt_id_and_refuse_other_prompts():
    def rec(seed, values, ids=("p1", "p2", "p3")):
        return {"cell": "c", "seed": seed, "outcomes": {"untouched": {"after": [[i, v] for i, v in zip(ids, values)]}}}

    a = [rec(0, [1, 0, 1]), rec(1, [1, 1, 1])]
    b = [rec(1, [1, 1, 0], ids=("p3", "p2", "p1")), rec(0, [0, 0, 1])]   # another order: paired by id
    iv = bs.compare_cells(a, b, "untouched", resamples=200)
    # seed 0: 1-0, 0-0, 1-1; seed 1: 1-0 (p1), 1-1, 1-1
    assert iv.diff == pytest.approx(2 / 6) and iv.seeds == 2
    with pytest.raises(ValueError, match="different"):
        bs.compare_cells(a, [rec(0, [1, 1, 1], ids=("p1", "p2", "p9"))], "untouched")
    with pytest.raises(ValueError, match="same seeds and prompts"):
        bs.paired_bootstrap([[1, 2]], [[1, 2, 3]])
    with pytest.raises(ValueError, match="finite"):
        bs.paired_bootstrap([[1, math.nan]], [[1, 2]])


def test_the_pages_verdicts_come_from_the_untouched_reads_of_the_cells_validation_chose():
    import rl
    from suite import frontier as fr
    from test_rl_frontier import three

    def with_reads(rows, values):
        return [{**r, "outcomes": {"untouched": {"after": [[f"q{i}", v] for i, v in enumerate(values[r["seed"]])]}}}
                for r in rows]

    n = 40
    m = with_reads(three("m", "mezo-rl", 0.3, 0.01, [0.3] * 3), [[1] * 30 + [0] * 10] * 3)
    g = with_reads(three("g", "trl-grpo", 0.3, 0.01, [0.3] * 3), [[1] * 10 + [0] * 30] * 3)
    (line,) = rl.bootstrap_verdicts(fr.summarise(m + g, "exact_answer"), m + g)
    assert "**MeZO**" in line and "+0.500" in line and f"3 seeds x {n} prompts" in line and "run seeds" not in line
    close = with_reads(three("g", "trl-grpo", 0.3, 0.01, [0.3] * 3), [[1] * 29 + [0] * 11] * 3)
    (line,) = rl.bootstrap_verdicts(fr.summarise(m + close, "exact_answer"), m + close)
    assert "**neither" in line and "run seeds 3..4" in line
    unread = three("g", "trl-grpo", 0.3, 0.01, [0.3] * 3)   # no untouched read yet: no verdict
    assert rl.bootstrap_verdicts(fr.summarise(m + unread, "exact_answer"), m + unread) == []


def test_a_cell_learned_only_where_the_interval_of_its_gain_over_the_start_excludes_zero():
    import rl
    from suite import frontier as fr
    from test_rl_frontier import three

    n = 20
    start = [0.0] * n

    def with_outcomes(rows, after):
        # "before" in reverse prompt order: the gain pairs each prompt with itself by id
        return [{**r, "outcomes": {"development": {
            "after": [[f"q{i}", v] for i, v in enumerate(after)],
            "before": [[f"q{i}", start[i]] for i in reversed(range(n))]}}} for r in rows]

    # every seed solves the same 6 of 20 prompts the start did not: only prompt sampling varies, and the
    # resampled gain is Binomial(20, 0.3) / 20 exactly
    learned = with_outcomes(three("m", "mezo-rl", 0.3, 0.01, [0.3] * 3), [1.0] * 6 + [0.0] * 14)
    same = with_outcomes(three("g", "trl-grpo", 0.0, 0.01, [0.0] * 3), start)
    lines = rl.learned_statements(fr.summarise(learned + same, "exact_answer"), learned + same)
    lo, hi = binomial_interval(n, 0.3)
    (m_line,) = [x for x in lines if " m:" in x]
    (g_line,) = [x for x in lines if " g:" in x]
    assert "**learned**" in m_line and "+0.300" in m_line and f"[{lo:+.3f}, {hi:+.3f}]" in m_line
    assert f"3 seeds x {n} prompts" in m_line
    assert "**not learned" in g_line and "+0.000" in g_line
    # a cell with a seed missing its per-prompt outcomes states nothing (its gain would not be over every seed)
    part = learned[:2] + three("m", "mezo-rl", 0.3, 0.01, [0.3] * 3)[2:]
    assert rl.learned_statements(fr.summarise(part, "exact_answer"), part) == []


def test_a_task_without_an_untouched_split_compares_its_pairs_on_development_with_the_prompts():
    import rl
    from suite import frontier as fr
    from test_rl_frontier import three

    def with_dev(rows, values):
        return [{**r, "outcomes": {"development": {"after": [[f"q{i}", v] for i, v in enumerate(values)]}}}
                for r in rows]

    # the seeds agree (SE over seeds 0), yet 1 prompt of 40 is no evidence once the prompts are resampled
    m = with_dev(three("m", "mezo-rl", 0.3, 0.01, [0.3] * 3), [1] * 11 + [0] * 29)
    g = with_dev(three("g", "trl-grpo", 0.3, 0.01, [0.3] * 3), [1] * 10 + [0] * 30)
    (line,) = rl.bootstrap_verdicts(fr.summarise(m + g, "exact_answer"), m + g, "development")
    assert "**neither" in line and "development difference +0.025" in line
    assert rl.bootstrap_verdicts(fr.summarise(m + g, "exact_answer"), m + g) == []   # no untouched read
