"""GRPO both ways (issue 70): TRL's ``GRPOTrainer`` with its default gradient checkpointing and without it, on the
arithmetic frontier's best full-weight GRPO cell, for a fixed number of steps: the seconds a step takes and the peak
memory of training.

    flock /tmp/mezo-heavy.lock python benchmarks/grpo_gc.py --steps 15 --rounds 2

The two commands are the cells' own (``benchmarks/rl.py``: ``grpo-full-lr3e-6-beta0.04``, which every full-weight
GRPO record ran with checkpointing, and its twin ``grpo-full-nogc-lr3e-6-beta0.04``), run for ``--steps`` steps
instead of the time budget, with the evaluations cut to 16 prompts and no validation during training (time and
memory are measured here, not reward), at the protocol's precision on this CPU (``--autocast auto``: bf16 autocast
where bf16 is native, float32 elsewhere). Each variant runs in its own process, the two alternating, ``--rounds``
times, so a drift of the machine's speed falls on both. One JSON line per run is appended to ``--record`` (default
docs/results/grpo_gc_cpu.jsonl): the command, the commit, the CPU, the seed, the steps, each step's seconds and
their median, the peak RSS of training and of the whole process.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import pathlib
import shlex
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import rl  # noqa: E402

RECORD = HERE.parent / "docs" / "results" / "grpo_gc_cpu.jsonl"
CELLS = {"checkpointing": "grpo-full-lr3e-6-beta0.04", "no checkpointing": "grpo-full-nogc-lr3e-6-beta0.04"}
#: the options a probe sets in place of the cell's: its length, the evaluations' size, no validation during training
PROBE = {"--num-eval": "16", "--num-test": "16", "--eval-points": "0"}


def probe_command(cell: str, seed: int, steps: int, out: pathlib.Path) -> list[str]:
    """``cell``'s frontier command for ``steps`` steps (no time budget), with :data:`PROBE`'s options."""
    cmd = rl.frontier_command(rl.frontier_cell("arithmetic", cell), seed, out)
    i = cmd.index("--time-budget-s")
    cmd = cmd[:i] + cmd[i + 2:] + ["--max-steps", str(steps)]
    for option, value in PROBE.items():
        if option in cmd:
            cmd[cmd.index(option) + 1] = value
        else:
            cmd += [option, value]
    return cmd


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=15, help="training steps a run makes")
    p.add_argument("--rounds", type=int, default=2, help="runs of each variant, alternating")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--record", type=pathlib.Path, default=RECORD)
    a = p.parse_args(argv)
    if a.steps < 2 or a.rounds < 1:
        p.error(f"--steps must be >= 2 and --rounds >= 1, got {a.steps} and {a.rounds}")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    for r in range(a.rounds):
        for variant, cell in CELLS.items():
            with tempfile.TemporaryDirectory() as tmp:
                out = pathlib.Path(tmp)
                cmd = probe_command(cell, a.seed, a.steps, out)
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                s = json.loads((out / "summary.json").read_text())
            secs = s["step_seconds"]
            record = {"what": "GRPO both ways: the seconds of a step and the peak memory of training, with and "
                              "without TRL's gradient checkpointing", "variant": variant, "cell": cell, "round": r,
                      "date": _dt.date.today().isoformat(), "commit": commit, "cpu": s["cpu"], "seed": a.seed,
                      "precision": s["precision"], "torch_threads": s["torch_threads"],
                      "gradient_checkpointing": s["grpo_config"]["gradient_checkpointing"],  # as TRL ran it
                      "command": shlex.join(cmd), "steps": len(secs),
                      "s_per_step_median": statistics.median(secs), "step_seconds": secs,
                      "peak_train_rss_mb": s["peak_train_rss_mb"], "peak_rss_mb": s["peak_rss_mb"]}
            with open(a.record, "a") as f:
                f.write(json.dumps(record) + "\n")
            print(f"{variant:>16}  round {r}: {record['s_per_step_median']:.2f} s a step (median of {len(secs)}), "
                  f"peak of training {record['peak_train_rss_mb']:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
