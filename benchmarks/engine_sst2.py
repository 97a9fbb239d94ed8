"""Exact mode (Rademacher z, eps = 2^-10) vs default (Gaussian z, eps = 1e-3) on a real task.

    flock /tmp/mezo-heavy.lock python benchmarks/engine_sst2.py [--steps 200] [--lr 1e-5] [--json out.json]

SmolLM2-135M-Instruct, full-parameter MeZO on SST-2 (GLUE train.tsv / dev.tsv read directly from
$MEZO_RL_DATA/SST-2), prompt ``"<sentence> It was"`` with candidates ``" great"`` / ``" terrible"``;
the loss is the cross-entropy over the two candidates' next-token log-likelihoods at the last
prompt position. Both runs see the same batches in the same order; each starts from the same
weights. Reported: zero-shot and final dev accuracy / loss on ``--n-dev`` dev sentences, and the
mean training loss over the first and last quarter of the run.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import random
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.nn.functional as F

from mezo_rl.model.loading import load_model
from mezo_rl.engine.optim import MeZO

DATA = pathlib.Path(os.environ.get("MEZO_RL_DATA", pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"))


def read_sst2(split: str) -> list[tuple[str, int]]:
    with open(DATA / "SST-2" / f"{split}.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [(r["sentence"].strip(), int(r["label"])) for r in rows]


class Scorer:
    """CE over the candidates' logits at the last prompt token (label 1 = " great")."""

    def __init__(self, model, tokenizer):
        self.model, self.tok = model, tokenizer
        ids = [tokenizer(w, add_special_tokens=False)["input_ids"] for w in (" terrible", " great")]
        if any(len(i) != 1 for i in ids):
            raise RuntimeError(f"candidates are not single tokens: {ids}")
        self.cand = torch.tensor([i[0] for i in ids])

    @torch.no_grad()
    def logits(self, sentences: list[str]) -> torch.Tensor:
        enc = self.tok([f"{s} It was" for s in sentences], return_tensors="pt", padding=True,
                       truncation=True, max_length=64, padding_side="left")
        out = self.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits[:, -1]
        return out[:, self.cand].float()

    def loss(self, batch) -> torch.Tensor:
        return F.cross_entropy(self.logits([s for s, _ in batch]), torch.tensor([y for _, y in batch]))

    def evaluate(self, data, bs: int = 32) -> tuple[float, float]:
        correct, total = 0, 0.0
        for i in range(0, len(data), bs):
            chunk = data[i:i + bs]
            lg = self.logits([s for s, _ in chunk])
            y = torch.tensor([y for _, y in chunk])
            correct += (lg.argmax(1) == y).sum().item()
            total += F.cross_entropy(lg, y, reduction="sum").item()
        return correct / len(data), total / len(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--n-dev", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--modes", nargs="+", default=["gaussian", "exact"])
    ap.add_argument("--json")
    args = ap.parse_args()

    rng = random.Random(args.seed)
    train = read_sst2("train")
    dev = read_sst2("dev")
    rng.shuffle(dev)
    dev = dev[: args.n_dev]
    batches = [rng.sample(train, args.batch) for _ in range(args.steps)]

    lm = load_model("smollm2-135m")
    model, tok = lm.model, lm.tokenizer
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    scorer = Scorer(model, tok)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    acc0, loss0 = scorer.evaluate(dev)
    print(f"zero-shot: dev acc {acc0:.3f}  dev loss {loss0:.4f}  ({len(dev)} dev sentences)", flush=True)
    results = {"zero_shot": {"acc": acc0, "loss": loss0}, "args": vars(args), "runs": []}
    for mode in args.modes:
        model.load_state_dict(initial)
        kw = dict(noise="rademacher", eps=2**-10) if mode == "exact" else dict(noise="gaussian", eps=1e-3)
        opt = MeZO(model.parameters(), lr=args.lr, seed=args.seed, **kw)
        t0, losses = time.perf_counter(), []
        for t, b in enumerate(batches):
            losses.append(opt.step(lambda: scorer.loss(b)).loss)
            if (t + 1) % 50 == 0:
                print(f"  {mode} step {t + 1}: mean train loss (last 50) {sum(losses[-50:]) / 50:.4f}", flush=True)
        secs = time.perf_counter() - t0
        acc, loss = scorer.evaluate(dev)
        q = max(1, len(losses) // 4)
        r = {"mode": mode, **kw, "lr": args.lr, "steps": args.steps, "seconds": secs, "backend": opt.noise_backend,
             "dev_acc": acc, "dev_loss": loss, "train_loss_first_quarter": sum(losses[:q]) / q,
             "train_loss_last_quarter": sum(losses[-q:]) / q}
        results["runs"].append(r)
        print(f"{mode:9s} noise={kw['noise']} eps={kw['eps']:.3g}: dev acc {acc0:.3f} -> {acc:.3f}, dev loss "
              f"{loss0:.4f} -> {loss:.4f}, train loss {r['train_loss_first_quarter']:.4f} -> "
              f"{r['train_loss_last_quarter']:.4f}  ({secs:.0f}s, {secs / args.steps:.2f}s/step)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
