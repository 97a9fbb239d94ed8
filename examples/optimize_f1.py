"""Optimise SQuAD F1 directly: a generation-based, non-differentiable reward, on SmolLM2-135M.

Every MeZO step generates answers (greedy, up to a newline) for the same batch at theta + eps*z and
theta - eps*z, scores them with the ``squad_f1`` reward and moves the weights along z. As in the
paper's non-differentiable experiments (Section 3.3, Table 4) the trainable part is a prefix
(``--peft prefix``: 5 key/value tokens per layer initialised from real activations, eps 1e-1).

The step is FZOO-style: Rademacher z and ``step_normalize="std"``, which with one SPSA sample is a sign
step of length lr: F1 at +eps and -eps is a step function of the weights, so its difference
divided by 2 eps says little about how far to move, only which way (or nothing, when every answer
is the same at both points).

The best step is picked on SQuAD's validation split: questions from whole articles of the train file that
no training question uses (``mezo_rl.tasks.builtin.SQuAD``), so a step that memorises the training articles' answers
does not look better there than on the test questions (SQuAD dev).

    python examples/optimize_f1.py --max-steps 20 --num-test 32    # a look: 20 steps, 32 test questions
    python examples/optimize_f1.py                             # the full run
    python examples/optimize_f1.py --n-spsa 2 --reward-shaping group --learning-rate 6e-2 --lr-scheduler linear \
        --max-steps 80                                             # 2 SPSA samples, per-question shaping
    python examples/optimize_f1.py --resume                    # continue a stopped run

Its settings, commands and what is recorded of its runs: benchmarks/README.md, "SQuAD F1 as the objective". Needs the data directory (MEZO_RL_DATA
or --data-dir) and the SmolLM2 package (see README).
"""
import argparse
import json

from mezo_rl.engine.optim import SCHEDULERS
from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.cli.plots import results_line
from mezo_rl.training.trainer import MeZOTrainer, TrainingInterrupted


def main():
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--max-steps", type=int, default=160, help="MeZO steps (default 160: ~70 minutes of steps)")
    p.add_argument("--per-device-train-batch-size", type=int, default=16, help="questions per step (paper: 16)")
    p.add_argument("--learning-rate", type=float, default=2e-2, help="length of each sign step")
    p.add_argument("--eps", type=float, default=1e-1, help="perturbation scale (paper, prefix: 1e-1)")
    p.add_argument("--n-spsa", type=int, default=1,
                   help="SPSA samples per step (each costs two more batched decodes; default 1). With 2 the "
                   "step at the same --learning-rate is ~1/3 as long (measured): raise --learning-rate with it")
    p.add_argument("--lr-scheduler", choices=SCHEDULERS, default="constant",
                   help="constant step length, or linear decay to 0 over --max-steps")
    p.add_argument("--reward-shaping", choices=["none", "group"], default="none",
                   help="group: each question's F1 z-scored across the step's members, so every question whose "
                        "answer changes between members weighs the same, however much F1 it moves")
    p.add_argument("--num-eval", type=int, default=100, help="validation questions that pick the best step")
    p.add_argument("--num-test", type=int, default=200, help="test questions (SQuAD dev), before and after")
    p.add_argument("--eval-every", type=int, default=20, help="validate every N steps")
    p.add_argument("--eval-batch-size", type=int, default=8,
                   help="questions per forward pass, in steps and evaluations (of similar length: long contexts "
                        "pad less in small chunks)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--output-dir", default="runs/optimize-f1")
    p.add_argument("--resume", action="store_true", help="continue the run in --output-dir from its checkpoint")
    a = p.parse_args()
    args = MeZOConfig(
        model="smollm2-135m", task="squad", reward=["squad_f1"], peft="prefix",
        noise="rademacher", step_normalize="std", n_spsa=a.n_spsa, learning_rate=a.learning_rate, eps=a.eps, lr_scheduler_type=a.lr_scheduler,
        reward_shaping=a.reward_shaping,
        max_steps=a.max_steps, per_device_train_batch_size=a.per_device_train_batch_size, eval_steps=min(a.eval_every, a.max_steps) or 1, eval_batch_size=a.eval_batch_size,
        num_train=1000, num_eval=a.num_eval, num_test=a.num_test, max_completion_length=16, seed=a.seed,
        data_dir=a.data_dir, output_dir=a.output_dir, resume=a.resume,
    )
    try:
        trainer = MeZOTrainer(args=args)
        trainer.train()
        s = trainer.summary
    except TrainingInterrupted as err:  # Ctrl-C / SIGTERM: the checkpoint is written, say how to go on
        raise SystemExit(f"{err}; checkpoint in {err.output_dir}: run the same command with --resume to continue")
    print(json.dumps({k: s[k] for k in ("initial_validation", "validation", "initial_test", "test", "best_step")}
                     | {"wall_time_s": round(s["wall_time_s"], 1)}, indent=2))
    print(results_line(s))   # the line `mezo-rl train` ends with


if __name__ == "__main__":
    main()
