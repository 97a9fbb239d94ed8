"""SQuAD F1 as the objective, a grid: configurations of ``examples/optimize_f1.py``'s run trained side by side on
one device, each for the same wall-clock budget, each choosing its best step on validation and testing it.

    MEZO_RL_DATA=DIR HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \\
        python benchmarks/f1_grid.py --device-map cuda --budget 300 --out runs/f1-grid     # every configuration
    python benchmarks/f1_grid.py --configs prefix-b16 --budget 60 --num-eval 8 --num-test 8   # a look, on the CPU

Every configuration is the example's task and reward (``squad`` with ``squad_f1`` of greedy answers, 16 new
tokens, 1000 training questions, validation on ``--num-eval`` questions from articles no training question
uses, test on ``--num-test`` SQuAD dev questions, seed ``--seed``), in its own process. A callback stops
training at the step boundary nearest ``--budget`` seconds of steps and validates at each ``1/--eval-points`` of
them (benchmarks/mezo_budget.py's ``TimeBudget``: the protocol's equal-time rule), so the
configurations get the same training time whatever their step costs; the run's own end then tests its best
step. Each configuration's record (validation and test before and after with their SEs, steps, seconds a
step, peak memory) is one JSON line in ``OUT/results.jsonl``, written by its own process; its run directory
(``OUT/NAME``) replays with ``mezo-rl eval --run-dir``.

``--jobs`` configurations run at once (default: all): on a GPU they share the device, so a configuration's
seconds a step depend on its neighbours (each record says how many ran at once); on a CPU run one at a time
(``--jobs 1``). Figures and commands:
benchmarks/README.md, "SQuAD F1 as the objective".
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from mezo_budget import TimeBudget  # the protocol's equal-time rule (benchmarks/suite/protocol.py)

RESULTS = "results.jsonl"

def _config(peft: str, lr: float, batch_size: int, n_spsa: int) -> dict:
    """Training arguments over the example's: the normalised step (with one SPSA sample a sign step of length
    lr), each mode's noise and eps (the prefix's, the example's; LoRA's and every weight's, the prompt tasks')."""
    noise, eps = {"prefix": ("rademacher", 1e-1), "lora": ("gaussian", 1e-2), "full": ("lowrank", 1e-2)}[peft]
    return dict(peft=peft, noise=noise, eps=eps, step_normalize="std", n_spsa=n_spsa, learning_rate=lr,
                per_device_train_batch_size=batch_size)


#: name -> training arguments over the example's (examples/optimize_f1.py). ``prefix-b16`` is the example's
#: step; the ``b64-n4`` rows estimate a direction from 16x the answers (64 questions, 4 SPSA samples; their
#: std-normalised coefficients average below 1, so the same lr makes a shorter step).
CONFIGS = {
    "prefix-b16": _config("prefix", 2e-2, 16, 1),
    "prefix-b16-lr1e-2": _config("prefix", 1e-2, 16, 1),
    "prefix-b64-n4": _config("prefix", 4e-2, 64, 4),
    "prefix-b64-n4-lr2e-2": _config("prefix", 2e-2, 64, 4),
    "lora-b64-n4": _config("lora", 1e-2, 64, 4),
    "full-b64-n4": _config("full", 3e-4, 64, 4),
    "full-b64-n4-lr1e-3": _config("full", 1e-3, 64, 4),
}


def run_one(name: str, a) -> dict:
    """Train configuration ``name`` in this process; returns its record."""
    import torch

    from mezo_rl.training.arguments import MeZOConfig
    from mezo_rl.training.trainer import MeZOTrainer

    out = pathlib.Path(a.out) / name
    args = MeZOConfig(
        model=a.model, task="squad", reward=["squad_f1"], **CONFIGS[name],
        max_steps=10**6, eval_steps=10**6, eval_batch_size=a.eval_batch_size, lr_scheduler_type="constant",
        num_train=1000, num_eval=a.num_eval, num_test=a.num_test, max_completion_length=16, seed=a.seed,
        data_dir=a.data_dir, device_map=a.device_map, output_dir=str(out), progress=False,
    )
    trainer = MeZOTrainer(args=args, callbacks=[TimeBudget(a.budget, a.eval_points)])
    trainer.train()
    s = trainer.summary
    se = lambda split: s[split].get("squad_f1/se")  # noqa: E731
    return {
        "config": name, **CONFIGS[name], "seed": a.seed, "device": a.device_map or "cpu",
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() and a.device_map else None,
        "budget_s": a.budget, "concurrent": min(a.jobs or len(a.configs.split(",")), len(a.configs.split(","))),
        "steps": s["steps"], "best_step": s["best_step"],
        "s_per_step": round(s["time_s"]["steps"] / max(s["steps"], 1), 3),
        "validation_f1": [s["initial_validation"]["squad_f1"], s["validation"]["squad_f1"]],
        "validation_n": s["validation"]["n"],
        "test_f1": [s["initial_test"]["squad_f1"], s["test"]["squad_f1"]],
        "test_f1_se": [se("initial_test"), se("test")], "test_n": s["test"]["n"],
        "test_exact_match": [s["initial_test"]["exact_match"], s["test"]["exact_match"]],
        "peak_rss_mb": s["peak_rss_mb"],
        "peak_gpu_mb": round(torch.cuda.max_memory_allocated() / 2**20) if torch.cuda.is_available() else None,
        "wall_time_s": round(s["wall_time_s"], 1), "run_dir": str(out),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of: {', '.join(CONFIGS)}")
    p.add_argument("--budget", type=float, default=300.0, help="seconds of training steps per configuration")
    p.add_argument("--eval-points", type=int, default=6, help="validate at each 1/N of the budget (and at the end)")
    p.add_argument("--jobs", type=int, default=0, help="configurations at once (default: all of them)")
    p.add_argument("--device-map", default=None, help="where each run computes, e.g. cuda (default: the CPU)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--num-eval", type=int, default=100)
    p.add_argument("--num-test", type=int, default=200)
    p.add_argument("--eval-batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default="runs/f1-grid")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)   # a worker: train this configuration
    a = p.parse_args()
    names = a.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        p.error(f"unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
    if not a.budget > 0 or a.eval_points < 1:
        p.error(f"--budget must be > 0 and --eval-points >= 1, got {a.budget} and {a.eval_points}")
    if a.one:   # the worker writes its own record: a finished configuration's survives its parent
        record = json.dumps(run_one(a.one, a))
        with open(pathlib.Path(a.out) / RESULTS, "a") as f:
            f.write(record + "\n")
        print(record, flush=True)
        return
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = a.jobs or len(names)
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // jobs)))

    def worker(name: str) -> str:   # one configuration's process, its output in OUT/NAME.log
        with open(out / f"{name}.log", "w") as log:
            rc = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--one", name], stdout=log,
                                stderr=subprocess.STDOUT, env=env).returncode
        return f"{name}: {'done' if rc == 0 else f'exit {rc}'} (log {out / (name + '.log')})"

    with ThreadPoolExecutor(jobs) as pool:
        for line in pool.map(worker, names):
            print(line, flush=True)
    print(f"records: {out / RESULTS}")


if __name__ == "__main__":
    main()
