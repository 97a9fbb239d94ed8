"""Optimise SQuAD F1 directly: a generation-based, non-differentiable reward, on SmolLM2-135M.

Every MeZO step generates answers (greedy) for the same batch at theta + eps*z and theta - eps*z,
scores them with the ``squad_f1`` reward and moves the weights along z. As in the paper's
non-differentiable experiments (Section 3.3, Table 4) the trainable part is a prefix
(``--peft prefix``: 5 tokens per layer initialised from real activations, lr 1e-2, eps 1e-1).

    python examples/optimize_f1.py                 # ~10 minutes on 2 CPU cores
    python examples/optimize_f1.py --steps 40      # longer run

Needs the data directory (MEZO_RL_DATA or --data-dir) and the SmolLM2 package (see README).
"""
import argparse
import json

from mezo_rl.trainer import Trainer, TrainingArguments


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--num-eval", type=int, default=32)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--output-dir", default="runs/optimize-f1")
    a = p.parse_args()
    args = TrainingArguments(
        model="smollm2-135m", task="squad", reward=["squad_f1"], peft="prefix",
        steps=a.steps, batch_size=a.batch_size, eval_steps=max(1, a.steps // 2),
        num_train=1000, num_eval=a.num_eval, num_test=a.num_eval, max_new_tokens=16,
        data_dir=a.data_dir, output_dir=a.output_dir,
    )
    summary = Trainer(args).train()
    before, after = summary["initial_validation"], summary["validation"]
    print(json.dumps({"validation_before": before, "validation_best": after, "test": summary["test"],
                      "best_step": summary["best_step"], "wall_time_s": round(summary["wall_time_s"], 1)}, indent=2))
    print(f"SQuAD F1 on {a.num_eval} validation questions: {before['squad_f1']:.4f} -> {after['squad_f1']:.4f} "
          f"(best step {summary['best_step']} of {a.steps})")


if __name__ == "__main__":
    main()
