"""RL on a verifiable task: make SmolLM2-135M-Instruct better at two-digit addition, with a reward that
cannot be faked.

The task ``arithmetic`` is generated from a seed (no download): chat prompts such as "What is 37 + 48?
Reply with the number only.", the gold number in the column ``answer``. The reward ``exact_answer`` is 1
when the last number of the completion is the answer, else 0: a gain on it is a gain in arithmetic, not
in pleasing a scorer. Every evaluation also reports ``kl``, the mean per-token KL of the trained policy to
the starting model over its completions (docs/rl.md, "KL to the starting model"), ``distinct_2`` and the
completions' length.

    python examples/rl_arithmetic.py                       # the prompt-task defaults (every weight, 20 steps)
    python examples/rl_arithmetic.py --peft lora --beta 1  # LoRA, with a KL penalty towards the start
    python examples/rl_arithmetic.py --max-steps 4 --num-eval 16 --num-test 16   # a smoke run

The same run from the command line:

    mezo-rl train --task arithmetic --max-completion-length 16 --num-eval 100 \\
        --num-test 200 --eval-batch-size 64 --log-completions 200 --output-dir runs/rl_arithmetic

Measured figures (this example's settings and TRL's GRPO beside them): docs/results.md.
"""
import argparse

from mezo_rl.cli.plots import results_line
from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.training.trainer import MeZOTrainer, TrainingInterrupted


def main(argv=None):
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--output-dir", default="runs/rl_arithmetic")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--task", default="arithmetic", help="a verifiable task (mezo-rl tasks lists them)")
    p.add_argument("--peft", default=None, help="what MeZO trains (full, the prompt tasks' default; lora, norm, prefix)")
    p.add_argument("--max-steps", type=int, default=None, help="training steps (default: a prompt task's)")
    p.add_argument("--learning-rate", type=float, default=None, help="default: a prompt task's for the mode")
    p.add_argument("--beta", type=float, default=0.0, help="KL penalty towards the starting model (TRL's beta)")
    p.add_argument("--max-completion-length", type=int, default=16)
    p.add_argument("--num-train", type=int, default=1000)
    p.add_argument("--num-eval", type=int, default=100)
    p.add_argument("--num-test", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    a = p.parse_args(argv)
    args = MeZOConfig(
        load_best_model_at_end=True,  # validation picks the step whose weights are tested
        model=a.model, task=a.task, reward=["exact_answer"], peft=a.peft, max_steps=a.max_steps,
        learning_rate=a.learning_rate, beta=a.beta, max_completion_length=a.max_completion_length,
        num_train=a.num_train, num_eval=a.num_eval, num_test=a.num_test, eval_batch_size=64,
        log_completions=a.num_test, seed=a.seed, output_dir=a.output_dir, resume=a.resume)
    try:
        trainer = MeZOTrainer(args=args)
        trainer.train()
        summary = trainer.summary
    except TrainingInterrupted as err:  # Ctrl-C / SIGTERM: the checkpoint is written, say how to go on
        raise SystemExit(f"{err}; checkpoint in {err.output_dir}: run the same command with --resume to continue")
    print(results_line(summary))
    before, after = summary["initial_test"], summary["test"]
    for key in ("exact_answer", "kl", "distinct_2", "completion_chars"):
        print(f"test {key}: {before.get(key, float('nan')):.4f} -> {after.get(key, float('nan')):.4f}, "
              f"n = {after['n']:.0f}")
    return summary


if __name__ == "__main__":
    main()
