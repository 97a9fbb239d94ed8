"""Each tool's reward-KL frontier, from the protocol's records (pure functions of the records, apart from the plot).

A *cell* is one grid point (tool, lr, beta, ...) over its seeds. Its summary holds the means over its admitted
seeds of the validation gain and kl (what every choice reads) and of the test gain and kl (the records' ``test``:
the development split since issue 70, whose verdicts come from the untouched split, ``suite/untouched.py``),
each test figure with its SE over seeds (sd / sqrt(k): seed-to-seed variation and the sampling of each seed's
test prompts together). A tool's *frontier* is the set of its cells that no other cell of the tool beats on
validation: none has a validation gain at least as large at a validation kl at most as large, one of them strictly
(:func:`pareto`). Which cells get more seeds is read off seed 0's validation frontier (:func:`candidates`); the
frontier that is compared keeps the cells with at least ``MIN_SEEDS`` admitted seeds. :func:`who_wins` states, at
each kl budget, which tool's test gain is the larger: at budget K each tool's cell is its frontier cell with the
highest validation gain among those whose validation kl is at most K (a choice on validation), and their test
gains are compared (a difference beyond 2 SE of it decides; within, no winner).
"""
from __future__ import annotations

import math
import pathlib

from mezo_rl.stats import Moments

from .protocol import MIN_SEEDS, admitted

TOOLS = {"mezo-rl": "MeZO", "trl-grpo": "TRL GRPO"}
#: each tool's marker and colour on the plots
STYLE = {"mezo-rl": ("o", "C0"), "trl-grpo": ("s", "C3")}
#: a gain difference beyond this many SE of it names a winner
WIN_SE = 2.0


def _mean_se(xs: list[float]) -> tuple[float, float]:
    m = Moments.of(xs)
    return m.mean, (m.std() / math.sqrt(len(xs)) if len(xs) > 1 else math.nan)


def val_gain(record: dict, reward: str) -> float:
    """The validation gain at validation's pick: the picked step's validation reward minus the starting weights'."""
    return record["validation"][reward] - record["initial_validation"][reward]


def summarise(records: list[dict], reward: str) -> list[dict]:
    """One summary per (task, cell) over its admitted seeds (the latest record of a seed wins)."""
    latest: dict = {}
    for r in records:
        if admitted(r)[0]:
            latest[(r["task"], r["cell"], r["seed"])] = r
    cells: dict = {}
    for (task, cell, _), r in latest.items():
        cells.setdefault((task, cell), []).append(r)
    out = []
    for (task, cell), rs in cells.items():
        rs.sort(key=lambda r: r["seed"])
        g, g_se = _mean_se([r["paired"]["gain"] for r in rs])
        kl, kl_se = _mean_se([r["test"]["kl"] for r in rs])
        out.append({"task": task, "cell": cell, "tool": rs[0]["tool"], "family": rs[0].get("family"),
                    "lr": rs[0].get("lr"), "beta": rs[0].get("beta"), "seeds": [r["seed"] for r in rs],
                    "compared": len(rs) >= MIN_SEEDS,
                    "val_gain": Moments.of(val_gain(r, reward) for r in rs).mean,
                    "val_kl": Moments.of(r["validation"]["kl"] for r in rs).mean,
                    "gain": g, "gain_se": g_se, "kl": kl, "kl_se": kl_se,
                    "paired_se": Moments.of(r["paired"]["se"] for r in rs).mean,
                    "n_test": sorted({r["n"]["test"] for r in rs}), "n_validation": sorted({r["n"]["validation"] for r in rs}),
                    "train_s": max(r.get("train_s") or math.nan for r in rs),
                    "peak_rss_mb": max(r.get("peak_rss_mb") or math.nan for r in rs)})
    return out


def pareto(points: list[dict], x: str = "val_kl", y: str = "val_gain") -> list[dict]:
    """The points no other point dominates (``y`` at least as large at ``x`` at most as large, one strictly), in
    order of ``x``."""
    def dominated(p):
        return any(q[y] >= p[y] and q[x] <= p[x] and (q[y] > p[y] or q[x] < p[x]) for q in points)
    return sorted((p for p in points if not dominated(p)), key=lambda p: (p[x], -p[y]))


def frontier(summaries: list[dict], tool: str) -> list[dict]:
    """A tool's compared frontier: its cells with at least MIN_SEEDS admitted seeds that no other such cell beats on
    validation."""
    return pareto([s for s in summaries if s["tool"] == tool and s["compared"]])


def left_start(record: dict) -> bool:
    """Whether validation picked a trained step: a run whose pick is step 0 is the untrained model, which every tool
    has at kl 0."""
    return (record.get("pick") or {}).get("step") != 0


def candidates(records: list[dict], reward: str, seed: int = 0) -> list[str]:
    """The cells on each tool's seed-``seed`` validation frontier: the ones the grid's next stage runs on more seeds.
    A run whose validation did not leave its start (``left_start``) is no candidate."""
    first = summarise([r for r in records if r.get("seed") == seed and left_start(r)], reward)
    return [s["cell"] for tool in TOOLS for s in pareto([s for s in first if s["tool"] == tool])]


def who_wins(summaries: list[dict]) -> list[dict]:
    """At each kl budget K (the frontier cells' validation kls, ascending) each tool's cell (the frontier cell
    with the highest validation gain at validation kl <= K) and the test gain difference MeZO - GRPO with its SE
    (the two cells' SEs over seeds combined: independent runs); consecutive budgets with the same verdict
    merged into one range ``[lo, hi]``."""
    fronts = {tool: frontier(summaries, tool) for tool in TOOLS}
    budgets = sorted({p["val_kl"] for f in fronts.values() for p in f})
    rows = []
    for k in budgets:
        pick = {}
        for tool, f in fronts.items():
            within = [p for p in f if p["val_kl"] <= k]
            pick[tool] = max(within, key=lambda p: p["val_gain"]) if within else None
        m, g = pick["mezo-rl"], pick["trl-grpo"]
        if m is None or g is None:
            verdict, diff, se = (f"only {TOOLS['mezo-rl' if g is None else 'trl-grpo']} has a cell", math.nan, math.nan)
        else:
            diff, se = m["gain"] - g["gain"], math.hypot(m["gain_se"], g["gain_se"])
            verdict = ("MeZO" if diff > WIN_SE * se else "TRL GRPO" if diff < -WIN_SE * se
                       else f"neither (within {WIN_SE:g} SE)")
        row = {"lo": k, "hi": k, "verdict": verdict, "mezo": m and m["cell"], "grpo": g and g["cell"],
               "diff": diff, "se": se}
        if rows and rows[-1]["verdict"] == verdict and rows[-1]["mezo"] == row["mezo"] and rows[-1]["grpo"] == row["grpo"]:
            rows[-1]["hi"] = k
        else:
            rows.append(row)
    return rows


def _f(x, d=3) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"


def statements(summaries: list[dict]) -> list[str]:
    """"At which kl each tool wins", one line per range of budgets, computed from the records."""
    out = []
    rows = who_wins(summaries)
    for i, r in enumerate(rows):
        hi = rows[i + 1]["lo"] if i + 1 < len(rows) else None
        span = (f"validation kl from {_f(r['lo'], 4)}" + (f" up to (not including) {_f(hi, 4)}" if hi is not None else " up"))
        figures = (f": MeZO {r['mezo']} vs GRPO {r['grpo']}, development gain difference {r['diff']:+.3f} "
                   f"(SE {_f(r['se'])})"
                   if r["mezo"] and r["grpo"] else f" ({r['mezo'] or r['grpo']})")
        out.append(f"- {span}: **{r['verdict']}**{figures}.")
    if rows and rows[0]["lo"] > 0:
        out.insert(0, f"- validation kl below {_f(rows[0]['lo'], 4)}: no compared cell of either tool.")
    return out


def table(summaries: list[dict]) -> list[str]:
    """The cells (compared ones first), with their frontier membership."""
    on = {(s["task"], s["cell"]) for tool in TOOLS for s in frontier(summaries, tool)}
    lines = ["| tool | cell | lr | beta | seeds | validation gain | validation kl | development gain ± SE (seeds) | "
             "development kl ± SE | paired SE (mean) | n val / dev per seed | train s (max) | peak RSS MiB | frontier |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in sorted(summaries, key=lambda s: (not s["compared"], s["tool"], s["val_kl"])):
        where = ("yes" if (s["task"], s["cell"]) in on else "no") if s["compared"] else \
            f"({len(s['seeds'])} seed(s): not compared)"
        lines.append(f"| {TOOLS[s['tool']]} | {s['cell']} | {s['lr']:g} | {s['beta']:g} | {', '.join(map(str, s['seeds']))} | "
                     f"{s['val_gain']:+.3f} | {_f(s['val_kl'], 4)} | {s['gain']:+.3f} ± {_f(s['gain_se'])} | "
                     f"{_f(s['kl'], 4)} ± {_f(s['kl_se'], 4)} | {_f(s['paired_se'])} | "
                     f"{'/'.join(map(str, s['n_validation']))} / {'/'.join(map(str, s['n_test']))} | "
                     f"{_f(s['train_s'], 0)} | {_f(s['peak_rss_mb'], 0)} | "
                     f"{where} |")
    return lines


def plot(summaries: list[dict], path, title: str, reward: str) -> pathlib.Path | None:
    """Held-out gain (± SE over seeds) against test kl (± SE over seeds) for each tool's cells: compared cells
    filled, the frontier joined and labelled (MeZO's labels to the left of their points, GRPO's to the right, each
    side spread so that no two overlap), the other cells faint and unlabelled (the table names every cell), cells
    still short of MIN_SEEDS hollow (no SE bar with one seed); None where matplotlib is missing or there is no
    cell."""
    plt = pyplot() if summaries else None
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    top, labels = 0.0, []
    for tool, name in TOOLS.items():
        marker, colour = STYLE[tool]
        front = frontier(summaries, tool)
        for s in (s for s in summaries if s["tool"] == tool):
            top = max(top, s["kl"])
            on = s in front
            ax.errorbar([s["kl"]], [s["gain"]], xerr=[0 if math.isnan(s["kl_se"]) else s["kl_se"]],
                        yerr=[0 if math.isnan(s["gain_se"]) else s["gain_se"]], fmt=marker, color=colour,
                        mfc=colour if s["compared"] else "none", alpha=1.0 if on else 0.35, capsize=3)
        if front:
            ax.plot([s["kl"] for s in front], [s["gain"] for s in front], "-", color=colour, lw=1, label=f"{name} frontier")
            labels.append((tool, colour, [(s["kl"], s["gain"], s["cell"]) for s in front]))
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xscale("symlog", linthresh=1e-3)
    ax.set_xlim(0, max(top, 1e-2) * 8)  # a decade beyond the largest kl: room for the labels on the right
    ax.set_ylim(*ax.get_ylim())
    ax.set_xlabel("kl to the starting model (per token, test completions; ± SE over seeds)")
    ax.set_ylabel(f"held-out {reward} gain (± SE over seeds)", fontsize=8)
    ax.set_title(f"{title} (labelled: each tool's frontier; faint: off it; hollow: under {MIN_SEEDS} seeds)",
                 fontsize=8)
    if labels:
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    gap = LABEL_PT * 1.4 * fig.dpi / 72  # pixels between two labels' centres
    top_px = ax.transAxes.transform((0, 1))[1] - gap / 2
    for tool, colour, points in labels:
        ys = [ax.transData.transform((x, y))[1] for x, y, _ in points]
        dx, ha = (-12, "right") if tool == "mezo-rl" else (12, "left")
        for (x, y, text), py, ty in zip(points, ys, spread(ys, gap, top_px)):
            a = ax.annotate(text, (x, y), xytext=(dx, (ty - py) * 72 / fig.dpi), textcoords="offset points",
                            ha=ha, va="center", fontsize=LABEL_PT, color=colour,
                            arrowprops=dict(arrowstyle="-", lw=0.4, color=colour, alpha=0.6))
            a.set_in_layout(False)  # the axes keep their size; the labels sit inside the figure's margins
    return save(plt, fig, path, layout=False)


#: the frontier labels' font size, in points
LABEL_PT = 6


def spread(ys: list[float], gap: float, top: float = math.inf) -> list[float]:
    """Positions for labels wanted at ``ys`` (any order): each as near its own as the others allow, in the same
    order, neighbours at least ``gap`` apart (a run of labels closer than that is centred on its mean), none above
    ``top`` (the labels that would be are pushed down, and those they reach with them)."""
    def start(block: list[int]) -> float:  # where a run of touching labels begins, centred on their wishes
        return sum(ys[j] for j in block) / len(block) - gap * (len(block) - 1) / 2

    order = sorted(range(len(ys)), key=lambda i: ys[i])
    blocks: list[list[int]] = []
    for i in order:
        blocks.append([i])
        while len(blocks) > 1 and start(blocks[-2]) + gap * len(blocks[-2]) > start(blocks[-1]):
            blocks[-2:] = [blocks[-2] + blocks[-1]]
    out = [0.0] * len(ys)
    for block in blocks:
        first = start(block)
        for k, j in enumerate(block):
            out[j] = first + k * gap
    ceiling = top
    for j in reversed(order):
        out[j] = min(out[j], ceiling)
        ceiling = out[j] - gap
    return out


def pyplot():
    """matplotlib's pyplot on the Agg backend, or None where matplotlib is missing (the plots are then left out)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save(plt, fig, path, layout: bool = True) -> pathlib.Path:
    """Write ``fig`` to ``path`` (its folder made), close it and return the path (``layout``: fit it tight first)."""
    if layout:
        fig.tight_layout()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
