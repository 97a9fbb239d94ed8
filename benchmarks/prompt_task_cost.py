"""What a prompt task's training step and evaluation cost against plain inference of the same rows, with the
run's defaults (one process, so each ratio is within one run).

    flock /tmp/mezo-heavy.lock python benchmarks/prompt_task_cost.py [--task arithmetic] [--steps 3]
        [--num-eval 16] [--autocast none] [--json out.json]

The run: ``MeZOTrainer`` on ``--task`` (a prompt task) with every default of ``mezo-rl train`` for it (``--peft``
unset: every weight, ``PROMPT_TASK_DEFAULTS``: batch B = 16, 4 SPSA samples, so M = 8 members decoded
together), ``--steps`` steps and a validation of ``--num-eval`` prompts at step 0 and at the end.
Read from its metrics.jsonl: S, each step's seconds after the first (the first also compiles the noise
kernel); V, each validation's seconds (decode, ``kl`` to the starting model, the text measures), the last
one warm like the plain inference after it. Then, on the model the run ends with, plain inference
(``LanguageModel.generate`` under ``torch.no_grad()``, greedy, the run's completion length): P_step, the M x B
rows of one training batch (each of B training prompts M times, in one call of ``--eval-batch-size`` x M
rows a forward, as the batched step holds them); P_eval, the validation prompts once. Prints
``prompt-task step / plain inference of its M x B rows: X.XX`` (the median S over P_step) and
``evaluation / plain inference of its prompts: X.XX`` (the last V over P_eval; the first V's ratio too).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.training.outputs import prompt_texts
from mezo_rl.training.trainer import MeZOTrainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="arithmetic")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--num-eval", type=int, default=16)
    ap.add_argument("--autocast", default="none", choices=["none", "auto", "bfloat16"])
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.steps < 2 or args.num_eval < 1:
        ap.error("--steps must be >= 2 (the first step also compiles) and --num-eval >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    out = pathlib.Path(tempfile.mkdtemp(prefix="prompt_task_cost_"))
    run = MeZOConfig(model=args.model, task=args.task, max_steps=args.steps, num_eval=args.num_eval, num_test=0, initial_test=False,
                     autocast=args.autocast, progress=False, save_model=False, output_dir=str(out / "run"))
    trainer = MeZOTrainer(args=run)
    a = trainer.args
    M, B = trainer.optimizer.members_per_step, a.per_device_train_batch_size
    trainer.train()
    records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines() if line]
    S = [r["seconds"] for r in records if "split" not in r][1:]
    V = [r["seconds"] for r in records if r.get("split") == "validation"]
    lm, length = trainer.lm, a.max_completion_length
    batch = prompt_texts(lm, trainer.splits["train"][:B])
    valid = prompt_texts(lm, trainer.splits["validation"])

    def timed(prompts, rows_per_forward):
        with torch.no_grad(), lm.batches_of(rows_per_forward):
            t0 = time.perf_counter()
            texts = lm.generate(prompts, max_new_tokens=length)
            return time.perf_counter() - t0, texts

    p_step, _ = timed([p for p in batch for _ in range(M)], a.eval_batch_size * M)
    p_eval, _ = timed(valid, a.eval_batch_size)
    row = {"model": args.model, "task": args.task, "members": M, "batch": B, "max_new_tokens": length, "threads": torch.get_num_threads(),
           "autocast": args.autocast, "steps_s": S, "validation_s": V, "plain_step_rows_s": p_step,
           "plain_eval_prompts_s": p_eval, "n_eval": len(valid),
           "step_over_plain": statistics.median(S) / p_step, "eval_over_plain": V[-1] / p_eval,
           "first_eval_over_plain": V[0] / p_eval}
    print(json.dumps(row, indent=1))
    print(f"prompt-task step / plain inference of its M x B rows: {row['step_over_plain']:.2f} "
          f"(M = {M}, B = {B}, {length} new tokens)")
    print(f"evaluation / plain inference of its prompts: {row['eval_over_plain']:.2f} (n = {len(valid)}; the first "
          f"evaluation: {row['first_eval_over_plain']:.2f})")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
