"""Sweep the main job's settings in seconds: MeZO on the final norm's gains, accuracy objective, SST-2.

With only the final norm trainable, a prediction is argmax_c (g * n(x)) . e_c, where n(x) is the
RMS-normalised input of the final norm at the scored position (fixed: the trunk is frozen), g the
576 gains and e_c the output-head row of label word c. This script computes n(x) once per example
with the real model, then runs the real engine (``mezo_rl.engine.optim.MeZO``: Rademacher probes,
``step_normalize="std"``, ``n_spsa``) on a copy of the gains with the batch error rate (``objective=accuracy``,
the main job) or the batch's cross-entropy over the label words (``objective=cross_entropy``, the suite's
``mezo-norm``) as the loss, on the trainer's batches (``sample_batch_indices``) of the trainer's training
sample. What it leaves out of `mezo-rl train`: the validation-based choice of the best step (it reports
the final weights) and the vocabulary normaliser of the log-likelihoods (it cancels in the argmax and in
the cross-entropy over the candidates because SST-2's label words are single tokens). It is a way to
choose settings, not a result: the README's figures come from `mezo-rl train` runs.

    MEZO_RL_DATA=DIR python benchmarks/norm_sweep.py --seeds 0 1 2 3 4 5 \
        --config steps=1500,batch_size=64,n_spsa=2 --config steps=1000,batch_size=128,n_spsa=2

Each --config is comma-separated key=value pairs of steps, batch_size, n_spsa, lr, eps, objective and
lr_scheduler (the rest take the main job's defaults except steps: 1500 steps, lr 0.02, eps 0.1, accuracy,
constant). Prints one line per config: test accuracy (n = 872) per seed, min and mean, and the forward
"rows" the config costs in `mezo-rl train` (steps x n_spsa x 2 x batch), which sets its wall time there
(about 0.7 ms per row on 2 cores).
``--at 1500 3000 6000`` also prints the test accuracy of the same runs after those many steps
(how many steps a setting needs).
"""
from __future__ import annotations

import argparse
import pathlib

import numpy as np
import torch

from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.engine.optim import SCHEDULERS, MeZO, get_scheduler
from mezo_rl.training.setup import build_model
from mezo_rl.training.trainer import sample_batch_indices
from mezo_rl.tasks import get_task

DEFAULTS = dict(steps=1500, batch_size=64, n_spsa=2, lr=0.02, eps=0.1, objective="accuracy", lr_scheduler="constant")
OBJECTIVES = ("accuracy", "cross_entropy")


def normalised_features(lm, examples, batch_size=32):
    """n(x) at the scored position (the last prompt token) of every example ([N, H]) and the label
    words' output-head rows ([C, H])."""
    norm, tok = lm.model.model.norm, lm.tokenizer
    seen = []
    hook = norm.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    feats = []
    try:
        with torch.no_grad():
            for i in range(0, len(examples), batch_size):
                enc = [tok(e.prompt)["input_ids"] for e in examples[i:i + batch_size]]
                ids = torch.full((len(enc), max(map(len, enc))), tok.pad_token_id)
                mask = torch.zeros_like(ids)
                for row, e in enumerate(enc):  # right padding: real positions unchanged
                    ids[row, :len(e)], mask[row, :len(e)] = torch.tensor(e), 1
                lm.model.model(input_ids=ids, attention_mask=mask)
                feats.append(seen[-1][torch.arange(len(enc)), torch.tensor([len(e) - 1 for e in enc])])
    finally:
        hook.remove()
    x = torch.cat(feats).float()
    n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    words = [tok(c, add_special_tokens=False)["input_ids"] for c in examples[0].candidates]
    assert all(len(w) == 1 for w in words), "label words must be single tokens"
    return n, lm.model.lm_head.weight[[w[0] for w in words]].detach().float()


def batch_loss(objective, logits, labels):
    """The closure's value: the batch error rate, or the mean cross-entropy over the label words."""
    if objective == "accuracy":
        return 1.0 - logits.argmax(1).eq(labels).float().mean()
    return torch.nn.functional.cross_entropy(logits, labels)


def run(cfg, seed, n_train, y_train, n_test, y_test, gains, heads, at=()):
    """Test accuracy of the final gains, and {k: test accuracy after k steps} for each k in ``at``."""
    w = gains.clone().requires_grad_(True)  # MeZO trains tensors that require grad
    opt = MeZO([w], lr=cfg["lr"], eps=cfg["eps"], noise="rademacher", step_normalize="std", n_spsa=cfg["n_spsa"],
               seed=seed, noise_backend="torch", record=False)
    scheduler = get_scheduler(cfg["lr_scheduler"], opt, cfg["steps"])
    test_acc = lambda: float(((n_test * w) @ heads.T).argmax(1).eq(y_test).float().mean())
    curve = {}
    for step in range(cfg["steps"]):
        idx = sample_batch_indices(len(y_train), cfg["batch_size"], seed, step)
        feats, labels = n_train[idx], y_train[idx]
        opt.step(lambda: batch_loss(cfg["objective"], (feats * w) @ heads.T, labels))
        scheduler.step()
        if step + 1 in at:
            curve[step + 1] = test_acc()
    return test_acc(), curve


def compute_features(model, seeds, have):
    """The test split's and each seed's 1000 training examples' n(x), labels, the label rows, the gains."""
    lm = build_model(MeZOConfig(model=model, peft="norm"))
    task = get_task("sst2")
    test = task.load_split("test")
    n_test, heads = normalised_features(lm, test)
    train = dict(have.get("train", {}))
    for seed in seeds:  # the trainer's training sample of each seed
        if seed not in train:
            examples = task.load_split("train", n=1000, seed=seed)
            train[seed] = (normalised_features(lm, examples)[0], torch.tensor([e.label for e in examples]))
    return dict(model=model, n_test=n_test, y_test=torch.tensor([e.label for e in test]), heads=heads,
                gains=lm.model.model.norm.weight.detach().clone(), train=train)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", action="append", default=None, help="key=value,... (steps, batch_size, n_spsa, lr, eps, objective, lr_scheduler)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--features", type=pathlib.Path, default=None,
                    help="keep the computed features in this file and reuse them (the model's forward passes are "
                    "the only slow part)")
    ap.add_argument("--at", type=int, nargs="*", default=[], help="also report test accuracy after these many steps")
    a = ap.parse_args()
    configs = []
    for text in a.config or [""]:
        cfg = dict(DEFAULTS)
        for part in filter(None, text.split(",")):
            key, _, value = part.partition("=")
            if key not in DEFAULTS:
                ap.error(f"--config: unknown key {key!r}; accepted: {', '.join(DEFAULTS)}")
            cfg[key] = type(DEFAULTS[key])(value)
        if cfg["objective"] not in OBJECTIVES:
            ap.error(f"--config: objective must be one of {', '.join(OBJECTIVES)}, got {cfg['objective']!r}")
        if cfg["lr_scheduler"] not in SCHEDULERS:
            ap.error(f"--config: lr_scheduler must be one of {', '.join(SCHEDULERS)}, got {cfg['lr_scheduler']!r}")
        configs.append(cfg)

    feats = torch.load(a.features) if a.features is not None and a.features.is_file() else {}
    if feats.get("model") != a.model or not set(a.seeds) <= set(feats.get("train", {})):
        feats = compute_features(a.model, a.seeds, feats if feats.get("model") == a.model else {})
        if a.features is not None:
            torch.save(feats, a.features)
    n_test, y_test, heads, gains = feats["n_test"], feats["y_test"], feats["heads"], feats["gains"]
    print(f"zero-shot test accuracy {float(((n_test * gains) @ heads.T).argmax(1).eq(y_test).float().mean()):.3f} (n = {len(y_test)})")
    train_by_seed = feats["train"]
    for cfg in configs:
        runs = [run(cfg, s, *train_by_seed[s], n_test, y_test, gains, heads, set(a.at)) for s in a.seeds]
        accs = [acc for acc, _ in runs]
        rows = cfg["steps"] * cfg["n_spsa"] * 2 * cfg["batch_size"]
        print(f"{cfg}  rows {rows:,}  test accuracy {' '.join(f'{x:.3f}' for x in accs)}  "
              f"min {min(accs):.3f}  mean {np.mean(accs):.3f}", flush=True)
        for k in sorted(k for k in a.at if k <= cfg["steps"]):
            at_k = [curve[k] for _, curve in runs]
            print(f"    after {k} steps: {' '.join(f'{x:.3f}' for x in at_k)}  mean {np.mean(at_k):.3f}", flush=True)


if __name__ == "__main__":
    main()
