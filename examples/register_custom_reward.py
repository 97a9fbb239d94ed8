"""Fine-tune SmolLM2 on a reward you wrote yourself, with MeZO.

The reward below is ordinary Python in this file, not a built-in: it gets plain numbers and returns
plain numbers, and MeZO never needs its gradient (it only compares the reward at theta + eps*z and
theta - eps*z). Anything with that shape works the same way: a regex check, a lookup table, a call
to a judge model or a web service.

Here the scorer pays, for each SST-2 review, the probability the model gives to the correct label
word ("great" / "terrible") against the other, computed from the candidates' mean log-likelihoods
with ``math.exp`` (no autograd anywhere). Accuracy is reported next to it with weight 0, so it is
watched but not optimised.

    export MEZO_RL_DATA=/path/to/data HF_HUB_OFFLINE=1
    python examples/register_custom_reward.py                 # mezo-rl train's defaults: MeZO on the final norm
    python examples/register_custom_reward.py --peft prefix --max-steps 100

The reward is measured before and after training on the whole SST-2 test split (872 reviews the
run never trains or selects on), with its standard error. Measured: benchmarks/README.md,
"A custom reward".

The same reward is usable from the command line once it lives in an importable module or a file:

    mezo-rl train --task sst2 --reward examples/register_custom_reward.py:gold_probability --reward accuracy \
        --reward-weights 1,0
"""
from __future__ import annotations

import argparse
import math

from mezo_rl import MeZOTrainer, MeZOConfig
from mezo_rl.training.callbacks import TrainerCallback
from mezo_rl.training.outputs import objective_outputs
from mezo_rl.rewards import register_reward


@register_reward("gold_probability", higher_is_better=True, needs="scores")
def gold_probability(prompts, candidate_scores, labels, **columns):
    """Probability of the gold label word among the candidates (softmax of mean log-likelihoods), a black box to MeZO."""
    out = []
    for scores, label in zip(candidate_scores, labels):
        if label is None:  # no gold label: no opinion on this example
            out.append(None)
            continue
        logits = [float(v) for v in scores.mean]
        top = max(logits)
        weights = [math.exp(v - top) for v in logits]
        out.append(weights[label] / sum(weights))
    return out


class HeldOutReward(TrainerCallback):
    """Scores the objective on the test examples before the first step and after the last one:
    each component's mean and its standard error over the examples."""

    before = after = None

    def _measure(self, trainer):
        values = objective_outputs(trainer.lm, trainer.objective, trainer.splits["test"]).values
        out = {}
        for name, vals in values.items():
            vals = [float(v) for v in vals if v is not None]
            mean = sum(vals) / len(vals)
            sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / max(len(vals) - 1, 1))
            out[name] = (mean, sd / math.sqrt(len(vals)), len(vals))
        return out

    def on_train_begin(self, args, state, control, trainer, **kwargs):
        self.before = self._measure(trainer)

    def on_step_end(self, args, state, control, trainer, **kwargs):
        if state.global_step == args.max_steps:  # the final weights, before the trainer restores its best step
            self.after = self._measure(trainer)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-steps", type=int, default=None, help="default: mezo-rl train's for --peft")
    p.add_argument("--per-device-train-batch-size", type=int, default=None, help="default: mezo-rl train's for --peft")
    p.add_argument("--peft", default="norm", choices=["norm", "full", "lora", "prefix"])
    p.add_argument("--learning-rate", type=float, default=None, help="default: mezo-rl train's for --peft")
    p.add_argument("--eps", type=float, default=None, help="default: mezo-rl train's for --peft")
    p.add_argument("--held-out", type=int, default=1000, help="test examples for the before/after reward (SST-2 has 872)")
    p.add_argument("--output-dir", default="runs/custom_reward")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    args = MeZOConfig(
        model="smollm2-135m", task="sst2",
        reward=["gold_probability", "accuracy"], reward_weights=[1.0, 0.0],
        peft=a.peft, learning_rate=a.learning_rate, eps=a.eps, max_steps=a.max_steps, per_device_train_batch_size=a.per_device_train_batch_size,
        num_train=1000, num_test=a.held_out, output_dir=a.output_dir, seed=a.seed, progress=True,
    )
    probe = HeldOutReward()
    trainer = MeZOTrainer(args=args, callbacks=[probe])
    print(f"objective: {trainer.objective}")
    trainer.train()

    run = trainer.args  # the run as resolved: the mode's defaults filled in
    print(f"\nheld-out reward on the test split ({run.peft} MeZO, {run.max_steps} steps of {run.per_device_train_batch_size}, "
          f"final weights; mean +- standard error, n examples):")
    for name, (mean, se, n) in probe.before.items():
        mean_after, se_after, _ = probe.after[name]
        gain = mean_after - mean
        print(f"  {name:18s} {mean:.4f} +- {se:.4f} -> {mean_after:.4f} +- {se_after:.4f} (n = {n}; "
              f"gain {gain:+.4f} = {gain / math.hypot(se, se_after):+.1f} SE)")


if __name__ == "__main__":
    main()
