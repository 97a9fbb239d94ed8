"""Sweep the main job's settings in seconds: MeZO on the final norm's gains, accuracy objective, SST-2.

With only the final norm trainable, a prediction is argmax_c (g * n(x)) . e_c, where n(x) is the
RMS-normalised input of the final norm at the scored position (fixed: the trunk is frozen), g the
576 gains and e_c the output-head row of label word c. This script computes n(x) once per example
with the real model, then runs the real engine (``mezo_rl.optim.MeZO``: Rademacher probes,
``normalize="std"``, ``n_spsa``) on a copy of the gains with the batch error rate as the loss, on the
trainer's batches (``sample_batch_indices``) of the trainer's training sample. What it leaves out of
`mezo-rl train`: the validation-based choice of the best step (it reports the final weights) and the
vocabulary normaliser of the log-likelihoods (it cancels in the argmax because SST-2's label words
are single tokens). It is a way to choose settings, not a result: the README's figures come from
`mezo-rl train` runs.

    MEZO_RL_DATA=../shared/data python benchmarks/norm_sweep.py --seeds 0 1 2 3 4 5 \
        --config steps=1500,batch_size=64,n_spsa=2 --config steps=1000,batch_size=128,n_spsa=2

Each --config is comma-separated key=value pairs of steps, batch_size, n_spsa, lr and eps (the rest
take the main job's defaults: lr 0.02, eps 0.1). Prints one line per config: test accuracy (n = 872)
per seed, min and mean, and the forward "rows" the config costs in `mezo-rl train`
(steps x n_spsa x 2 x batch), which sets its wall time there (about 1.2 ms per row on 2 cores).
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from mezo_rl.arguments import TrainingArguments
from mezo_rl.optim import MeZO
from mezo_rl.rundir import build_model
from mezo_rl.trainer import sample_batch_indices
from tasks import get_task

DEFAULTS = dict(steps=1500, batch_size=64, n_spsa=2, lr=0.02, eps=0.1)


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


def run(cfg, seed, n_train, y_train, n_test, y_test, gains, heads):
    w = gains.clone().requires_grad_(True)  # MeZO trains tensors that require grad
    opt = MeZO([w], lr=cfg["lr"], eps=cfg["eps"], noise="rademacher", normalize="std", n_spsa=cfg["n_spsa"],
               seed=seed, noise_backend="torch", record=False)
    for step in range(cfg["steps"]):
        idx = sample_batch_indices(len(y_train), cfg["batch_size"], seed, step)
        feats, labels = n_train[idx], y_train[idx]
        opt.step(lambda: 1.0 - ((feats * w) @ heads.T).argmax(1).eq(labels).float().mean())
    return float(((n_test * w) @ heads.T).argmax(1).eq(y_test).float().mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", action="append", default=None, help="key=value,... (steps, batch_size, n_spsa, lr, eps)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--model", default="smollm2-135m")
    a = ap.parse_args()
    configs = []
    for text in a.config or [""]:
        cfg = dict(DEFAULTS)
        for part in filter(None, text.split(",")):
            key, _, value = part.partition("=")
            if key not in DEFAULTS:
                ap.error(f"--config: unknown key {key!r}; accepted: {', '.join(DEFAULTS)}")
            cfg[key] = type(DEFAULTS[key])(value)
        configs.append(cfg)

    lm = build_model(TrainingArguments(model=a.model, peft="norm"))
    task = get_task("sst2")
    test = task.load_split("test")
    n_test, heads = normalised_features(lm, test)
    y_test = torch.tensor([e.label for e in test])
    gains = lm.model.model.norm.weight.detach().clone()
    print(f"zero-shot test accuracy {float(((n_test * gains) @ heads.T).argmax(1).eq(y_test).float().mean()):.3f} (n = {len(test)})")
    train_by_seed = {}
    for seed in a.seeds:  # the trainer's training sample of each seed
        train = task.load_split("train", n=1000, seed=seed)
        train_by_seed[seed] = (normalised_features(lm, train)[0], torch.tensor([e.label for e in train]))
    for cfg in configs:
        accs = [run(cfg, s, *train_by_seed[s], n_test, y_test, gains, heads) for s in a.seeds]
        rows = cfg["steps"] * cfg["n_spsa"] * 2 * cfg["batch_size"]
        print(f"{cfg}  rows {rows:,}  test accuracy {' '.join(f'{x:.3f}' for x in accs)}  "
              f"min {min(accs):.3f}  mean {np.mean(accs):.3f}", flush=True)


if __name__ == "__main__":
    main()
