"""What HiZOO's curvature did to the noise in the arithmetic frontier's runs, and the plain decay that matches it.

    python benchmarks/hizoo_scale.py

For each current record of a ``mezo-full-hizoo-a*`` cell in docs/results/rl_frontier.jsonl (benchmarks/rl.py
--frontier arithmetic), the run its command wrote (``--output-dir``) is replayed from its trajectory
(``checkpoint/trajectory.npz``) on zero weights of the run's shapes: the curvature depends on the logged seeds,
values and eps only, never on the weights. After each step ``Curvature.noise_scale()`` gives the rms, the geometric
mean and the log-SD over every weight of the noise's per-weight scale ``H^-1/2``, the factor HiZOO puts on each
weight's perturbation and step.

Per alpha, the rms after step t of every seed is fitted by ``(1 + k t)^-p`` (least squares in logs) at p = 1/2, at
p = 1 and with p free; ``best`` is the fixed power with the smaller residual, k to two digits. Where that fits and
the log-SD stays small (H alike for every weight), the rms is nearly all HiZOO does, and plain MeZO with its lr and
eps multiplied by ``best`` is its control: benchmarks/rl.py's ``mezo-full-decay*`` cells
(``benchmarks/mezo_budget.py --scale-decay k --scale-decay-power p``; tests/test_rl_protocol.py holds them to this
record). Where neither fixed power fits (a residual of order 1 in logs), no plain decay stands for HiZOO.

Writes ``--record`` (default docs/results/hizoo_scale.jsonl, replaced): a line per run (cell, seed, steps, each
step's rms and geomean, the last log-SD, the trajectory's sha256) and a line per alpha (the fits and their rms
residual in logs), each with the command, commit and CPU; prints a table.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import re
import shlex
import sys

import numpy as np
import torch
from scipy.optimize import least_squares

REPO = pathlib.Path(__file__).resolve().parents[1]
for _path in (REPO, REPO / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
import rl  # noqa: E402
from mezo_rl.engine.optim import replay_trajectory  # noqa: E402
from mezo_rl.engine.trajectory import Trajectory  # noqa: E402
from suite.protocol import commit, cpu_info  # noqa: E402
from suite.records import load_records  # noqa: E402

FRONTIER_RECORDS = REPO / "docs" / "results" / "rl_frontier.jsonl"
CELL = re.compile(r"^mezo-full-hizoo-a(?P<alpha>[^-]+(?:-\d+)?)-lr")
#: the fixed powers of the fit, in the order a tie is broken
POWERS = (0.5, 1.0)


def noise_scales(trajectory: Trajectory) -> list[dict]:
    """``Curvature.noise_scale()`` after each step of a HiZOO run's ``trajectory``, replayed on zero weights."""
    h = trajectory.header
    trainable = set(h["trainable"])
    params = [torch.zeros(shape, dtype=getattr(torch, dtype)).requires_grad_(i in trainable)
              for i, (shape, dtype) in enumerate(zip(h["param_shapes"], h["param_dtypes"]))]
    out = []
    replay_trajectory(params, trajectory, on_step=lambda t, opt: out.append(opt.curvature.noise_scale()))
    return out


def fit(rms_by_run: list[list[float]], power: float | None) -> dict:
    """``(1 + k t)^-p`` through every run's rms after step t = 1, 2, ... (least squares in logs)."""
    t = np.concatenate([np.arange(1, len(r) + 1) for r in rms_by_run]).astype(float)
    y = np.log(np.concatenate([np.asarray(r, dtype=float) for r in rms_by_run]))
    if power is None:
        res = least_squares(lambda x: -x[1] * np.log1p(x[0] * t) - y, [0.02, 0.7], bounds=([0, 0.05], [100, 20]))
        k, p = res.x
    else:
        res = least_squares(lambda x: -power * np.log1p(x[0] * t) - y, [0.02], bounds=([0], [100]))
        k, p = res.x[0], power
    return {"k": float(k), "p": float(p), "resid_log_rms": float(np.sqrt(np.mean(res.fun ** 2))), "n": int(t.size)}


def runs_of(records: list[dict]) -> list[tuple[dict, pathlib.Path]]:
    """The HiZOO cells' current arithmetic records, each with its run folder (its command's ``--output-dir``)."""
    out = []
    for r in rl.current_records([r for r in records if r.get("task") == "arithmetic" and r.get("ok")]):
        if CELL.match(r["cell"]):
            args = shlex.split(r["command"])
            out.append((r, pathlib.Path(args[args.index("--output-dir") + 1])))
    return sorted(out, key=lambda x: (x[0]["cell"], x[0]["seed"]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--record", default=str(REPO / "docs" / "results" / "hizoo_scale.jsonl"))
    a = p.parse_args(argv)
    runs = runs_of(load_records(FRONTIER_RECORDS))
    if not runs:
        raise SystemExit(f"no current mezo-full-hizoo-a* arithmetic record in {FRONTIER_RECORDS}")
    head = {"command": shlex.join(["python", "benchmarks/hizoo_scale.py", *sys.argv[1:]]), "commit": commit(REPO),
            "cpu": cpu_info(), "torch": torch.__version__}
    lines, by_alpha = [], {}
    for record, run_dir in runs:
        path = run_dir / "checkpoint" / "trajectory.npz"
        if not path.is_file():
            raise SystemExit(f"{record['cell']} seed {record['seed']}: no trajectory at {path} (run the cell first)")
        trajectory = Trajectory.load(path)
        if len(trajectory) != record["steps"]:
            raise SystemExit(f"{path}: {len(trajectory)} steps, its record {record['steps']}: not the recorded run")
        scales = noise_scales(trajectory)
        alpha = CELL.match(record["cell"])["alpha"]
        by_alpha.setdefault(alpha, []).append([s["rms"] for s in scales])
        lines.append({"kind": "run", "cell": record["cell"], "alpha": alpha, "seed": record["seed"],
                      "steps": len(scales), "rms": [s["rms"] for s in scales],
                      "geomean": [s["geomean"] for s in scales], "log_sd": scales[-1]["log_sd"],
                      "trajectory_sha256": hashlib.sha256(path.read_bytes()).hexdigest(), **head})
    print("| run | steps | rms of H^-1/2 at 1/4, 1/2, 3/4, end | geomean at end | log-SD at end |\n|---|---|---|---|---|")
    for x in lines:
        at = [x["rms"][max(0, round(f * x["steps"]) - 1)] for f in (0.25, 0.5, 0.75, 1.0)]
        print(f"| alpha {x['alpha']} seed {x['seed']} | {x['steps']} | {', '.join(f'{v:.3g}' for v in at)} "
              f"| {x['geomean'][-1]:.3g} | {x['log_sd']:.3g} |")
    print("\n| alpha | runs | fit p = 1/2: k (resid) | p = 1: k (resid) | p free: k, p (resid) | better fixed power, k to 2 digits |\n|---|---|---|---|---|---|")
    for alpha, rms in by_alpha.items():
        fits = {str(pw): fit(rms, pw) for pw in POWERS}
        free = fit(rms, None)
        best = min(POWERS, key=lambda pw: fits[str(pw)]["resid_log_rms"])
        lines.append({"kind": "fit", "alpha": alpha, "runs": len(rms), "fits": fits, "free": free,
                      "best": {"k": float(f"{fits[str(best)]['k']:.2g}"), "p": best}, **head})
        cells = " | ".join(f"{f['k']:.3g} ({f['resid_log_rms']:.3f})" for f in fits.values())
        print(f"| {alpha} | {len(rms)} | {cells} | {free['k']:.3g}, {free['p']:.3g} ({free['resid_log_rms']:.3f}) "
              f"| k {lines[-1]['best']['k']:g}, p {best:g} |")
    pathlib.Path(a.record).write_text("".join(json.dumps(x) + "\n" for x in lines))
    print(f"\nwrote {a.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
