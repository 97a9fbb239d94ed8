"""Full-parameter MeZO vs MeZO (LoRA) vs MeZO (prefix) on SmolLM2-135M: step time and a short SST-2 run.

    flock /tmp/mezo-heavy.lock .venv/bin/python benchmarks/peft_modes.py steps            # step time
    flock /tmp/mezo-heavy.lock .venv/bin/python benchmarks/peft_modes.py sst2 --steps 200 # accuracy

``steps``: for each mode, a fresh SmolLM2 (+ adapter) and one fixed SST-2 batch; times ``--repeats``
MeZO steps after one warm-up step, reporting the best repeat (the median in brackets: on a shared
machine the best is the least-disturbed measurement) (each step = perturb, forward, perturb, forward, restore, update,
the closure being the cross-entropy over the two label words as in the trainer) and, separately,
one plain forward of the same batch. step - 2 x forward is what perturbing and updating cost.

``sst2``: for each mode, validation accuracy before and after ``--steps`` MeZO steps with the
per-mode hyperparameters (``mezo_rl.training.defaults.MODE_DEFAULTS``), batch 16 (Table 16), constant lr, through the
project's MeZOTrainer (``--runner trainer``, default) or a minimal loop over lm.score (``--runner loop``).

Both print a markdown table and write JSON to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch
import torch.nn.functional as F

MODES = ("full", "lora", "prefix")


def build(mode: str, model: str, dtype: str):
    from mezo_rl.model.loading import load_model
    from mezo_rl.model.peft import apply_peft

    lm = load_model(model, dtype=dtype)
    if mode != "full":
        apply_peft(lm, mode)
    return lm


def ce_closure(lm, examples):
    """Cross-entropy over each example's candidates (mean log-likelihood per token), as a closure."""
    prompts = [e.prompt for e in examples]
    candidates = [e.candidates for e in examples]
    labels = torch.tensor([e.label for e in examples])

    def closure():
        scores = lm.score(prompts, candidates)
        logits = torch.stack([s.mean for s in scores])
        return F.cross_entropy(logits, labels)

    return closure


@torch.no_grad()
def accuracy(lm, examples, batch_size=32):
    correct = 0
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        scores = lm.score([e.prompt for e in chunk], [e.candidates for e in chunk])
        correct += sum(int(s.mean.argmax()) == e.label for s, e in zip(scores, chunk))
    return correct / len(examples)


def trainable(lm):
    return [p for p in lm.model.parameters() if p.requires_grad]


def bench_steps(ns):
    from mezo_rl.engine.optim import MeZO
    from mezo_rl.training.defaults import MODE_DEFAULTS, mezo_options
    from mezo_rl.tasks import get_task

    batch = get_task("sst2").load_split("train", n=ns.batch_size, seed=0)
    rows = []
    for mode in MODES:
        lm = build(mode, ns.model, ns.dtype)
        if mode == "full":
            lm.model.requires_grad_(True)
        params = trainable(lm)
        opt = MeZO(params, **mezo_options(MODE_DEFAULTS[mode]), seed=0)
        closure = ce_closure(lm, batch)
        with torch.no_grad():
            opt.step(closure)  # warm-up
            forwards, steps = [], []
            for _ in range(ns.repeats):
                t = time.perf_counter()
                closure()
                forwards.append(time.perf_counter() - t)
                t = time.perf_counter()
                opt.step(closure)
                steps.append(time.perf_counter() - t)
        # min = the least-disturbed repeat on a shared machine; the median shows the spread
        step, fwd = min(steps), min(forwards)
        rows.append(dict(mode=mode, trainable=sum(p.numel() for p in params), step_s=step, forward_s=fwd,
                         overhead_s=step - 2 * fwd, step_median_s=statistics.median(steps),
                         forward_median_s=statistics.median(forwards), steps_s=steps, forwards_s=forwards))
        print(json.dumps(rows[-1]), flush=True)
        del lm, opt
    print(f"\n{ns.model} ({ns.dtype}), SST-2 batch {ns.batch_size}, best (median) of {ns.repeats} repeats, "
          f"{torch.get_num_threads()} threads\n")
    print("| mode | trainable params | step (s) | forward (s) | step - 2 x forward (s) |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['trainable']:,} | {r['step_s']:.2f} ({r['step_median_s']:.2f}) | "
              f"{r['forward_s']:.2f} ({r['forward_median_s']:.2f}) | {r['overhead_s']:.2f} |")
    return rows


def run_sst2_loop(mode, ns, train, val):
    from mezo_rl.engine.optim import MeZO
    from mezo_rl.training.defaults import MODE_DEFAULTS, mezo_options
    from mezo_rl.training.trainer import sample_batch_indices

    lm = build(mode, ns.model, ns.dtype)
    if mode == "full":
        lm.model.requires_grad_(True)
    before = accuracy(lm, val)
    opt = MeZO(trainable(lm), **mezo_options(MODE_DEFAULTS[mode]), seed=ns.seed)
    t = time.perf_counter()
    losses = []
    with torch.no_grad():
        for step in range(ns.steps):
            idx = sample_batch_indices(len(train), ns.batch_size, ns.seed, step)
            losses.append(float(opt.step(ce_closure(lm, [train[i] for i in idx])).loss))
    train_s = time.perf_counter() - t
    return dict(before=before, after=accuracy(lm, val), train_s=train_s,
                first_loss=statistics.mean(losses[:20]), last_loss=statistics.mean(losses[-20:]))


def run_sst2_trainer(mode, ns, out_dir):
    from mezo_rl.training.arguments import MeZOConfig
    from mezo_rl.training.trainer import MeZOTrainer

    args = MeZOConfig(model=ns.model, task="sst2", reward=["cross_entropy"], peft=mode,
                             max_steps=ns.steps, per_device_train_batch_size=ns.batch_size, num_train=ns.num_train, num_eval=ns.num_eval,
                             num_test=0, seed=ns.seed, dtype=ns.dtype, autocast=ns.autocast,
                             eval_steps=ns.steps, metric_for_best_model="accuracy", progress=False,
                             output_dir=os.path.join(out_dir, mode))
    t = time.perf_counter()
    trainer = MeZOTrainer(args=args)
    trainer.train()
    summary = trainer.summary
    wall = time.perf_counter() - t
    with open(os.path.join(args.output_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    final = [r for r in records if r.get("split") == "validation" and r["step"] == ns.steps][-1]
    losses = [r["loss"] for r in records if "loss" in r and r.get("split") is None]
    return dict(before=summary["initial_validation"]["accuracy"], after=final["metrics"]["accuracy"],
                train_s=wall, first_loss=statistics.mean(losses[:20]), last_loss=statistics.mean(losses[-20:]),
                hyperparameters=mezo_options(vars(trainer.args)), summary=summary)


def bench_sst2(ns):
    from mezo_rl.tasks import get_task

    rows = []
    if ns.runner == "loop":
        task = get_task("sst2")
        train = task.load_split("train", n=ns.num_train, seed=ns.seed)
        val = task.load_split("validation", n=ns.num_eval, seed=ns.seed)
    for mode in ns.modes:
        if ns.runner == "loop":
            r = run_sst2_loop(mode, ns, train, val)
        else:
            r = run_sst2_trainer(mode, ns, ns.run_dir)
        rows.append(dict(mode=mode, **r))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "summary"}, default=str), flush=True)
    print(f"\n{ns.model}, SST-2: {ns.steps} MeZO steps, batch {ns.batch_size}, {ns.num_train} train / "
          f"{ns.num_eval} validation examples, seed {ns.seed}, runner {ns.runner}\n")
    print("| mode | val. accuracy before | after | train time (s) |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['before']:.3f} | {r['after']:.3f} | {r['train_s']:.0f} |")
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["steps", "sst2"])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--batch-size", type=int, default=16, help="examples per step (paper, Table 16: 16)")
    p.add_argument("--repeats", type=int, default=5, help="steps: timed steps per mode")
    p.add_argument("--steps", type=int, default=200, help="sst2: MeZO steps per mode")
    p.add_argument("--num-train", type=int, default=1000)
    p.add_argument("--num-eval", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--runner", default="trainer", choices=["trainer", "loop"])
    p.add_argument("--autocast", default="none", choices=["none", "bfloat16"], help="sst2 with the trainer")
    p.add_argument("--run-dir", default="runs/peft_modes")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    ns = p.parse_args(argv)
    rows = bench_steps(ns) if ns.what == "steps" else bench_sst2(ns)
    if ns.out:
        with open(ns.out, "w") as f:
            json.dump(rows, f, indent=2, default=str)


if __name__ == "__main__":
    main()
