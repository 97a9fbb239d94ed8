"""Compare objectives from Python: cross-entropy vs accuracy vs both on SST-2 (same data, seed and model).

Trains one MeZO run per objective into ``runs/compare-sst2/<objective>`` (``"a+b"`` sums two
rewards with equal weights) and writes ``runs/compare-sst2/comparison.md`` plus PNG plots of
validation accuracy against steps and against wall-clock time. The same as::

    mezo-rl compare --objective cross_entropy --objective accuracy --objective accuracy+cross_entropy \
        --output-dir runs/compare-sst2

    python examples/compare_objectives.py            # about 11 minutes per objective on 2 CPU cores

Each run uses `mezo-rl train`'s defaults (MeZO on the final norm); ``--steps`` shortens
them.
"""
import argparse

from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.cli.compare import compare, objective_variants


def main():
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--objectives", nargs="+", default=["cross_entropy", "accuracy", "accuracy+cross_entropy"])
    p.add_argument("--max-steps", type=int, default=None, help="default: mezo-rl train's")
    p.add_argument("--task", default="sst2")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--output-dir", default="runs/compare-sst2")
    a = p.parse_args()
    base = MeZOConfig(task=a.task, max_steps=a.max_steps, data_dir=a.data_dir, output_dir=a.output_dir)
    summaries = compare(objective_variants(base, a.objectives), a.output_dir)
    for name, s in summaries.items():
        m = s["metric_for_best"]
        print(f"{name:>16s}: validation {m} {s['initial_validation'][m]:.4f} -> {s['validation'][m]:.4f}, "
              f"test {s['test'][m]:.4f}, {s['wall_time_s']:.0f} s")
    print(open(f"{a.output_dir}/comparison.md").read())


if __name__ == "__main__":
    main()
