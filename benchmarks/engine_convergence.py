"""Which noise should be the engine's default? Convergence of full-parameter MeZO on SmolLM2-135M
per noise kind, the same batches and number of forward passes for each (one process per call).

    flock /tmp/mezo-heavy.lock python benchmarks/engine_convergence.py --task sst2 --seed 0 \\
        [--steps 30] [--n-dev 200] [--configs gaussian rademacher lowrank1 lowrank4 fzoo] [--out runs.jsonl]

Task examples come from the project's task registry (``tasks.get_task``: paper prompts, train
sample and validation split from $MEZO_RL_DATA). Loss: cross-entropy over the candidates' logits at
the next-token position after the prompt, using the first token of each candidate (SST-2:
" terrible" / " great"; SST-5: " terrible" " bad" " okay" " good" " great", whose shared "."
is dropped), so one forward pass per batch scores every candidate. Every config starts from
the same weights and sees the same ``--steps`` batches of ``--batch`` examples; dev accuracy and
dev CE are measured on the same ``--n-dev`` validation examples before and after.

Configs (lr and eps from the command line, the same for all but fzoo):
  gaussian    Gaussian z, compiled kernel           rademacher  Rademacher z, compiled kernel
  lowrank1/4  z = B A^T / sqrt(r), r = 1 / 4        fzoo        Rademacher z + normalize="std"
fzoo's lr is matched to the others' initial step size: lr_fzoo = lr * median |g| of the plain
projected gradient over 4 directions at the initial weights on the first batch (its step is
lr * (l+ - l-) / (2 sigma) per unit of z instead of lr * (l+ - l-) / (2 eps)).
One JSON line per (task, seed, config) is appended to ``--out``; configs already there are skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.nn.functional as F

import tasks
from mezo_rl.models import load_model
from mezo_rl.optim import MeZO

CONFIGS = {
    "gaussian": dict(noise="gaussian", noise_backend="compiled"),
    "rademacher": dict(noise="rademacher", noise_backend="compiled"),
    "lowrank1": dict(noise="lowrank", rank=1),
    "lowrank4": dict(noise="lowrank", rank=4),
    "fzoo": dict(noise="rademacher", noise_backend="compiled", normalize="std"),
}


class FirstTokenScorer:
    """CE over the first tokens of the candidates at the position after the prompt."""

    def __init__(self, model, tokenizer, candidates: list[str], max_length: int = 96):
        self.model, self.tok, self.max_length = model, tokenizer, max_length
        first = [tokenizer(c, add_special_tokens=False)["input_ids"][0] for c in candidates]
        if len(set(first)) != len(first):
            raise ValueError(f"candidates {candidates} do not have distinct first tokens")
        self.cand = torch.tensor(first)

    @torch.no_grad()
    def logits(self, prompts: list[str]) -> torch.Tensor:
        enc = self.tok(prompts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_length,
                       padding_side="left", truncation_side="left")
        out = self.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits[:, -1]
        return out[:, self.cand].float()

    def loss(self, batch) -> torch.Tensor:
        return F.cross_entropy(self.logits([e.prompt for e in batch]), torch.tensor([e.label for e in batch]))

    def evaluate(self, data, bs: int = 32) -> tuple[float, float]:
        correct, total = 0, 0.0
        for i in range(0, len(data), bs):
            chunk = data[i:i + bs]
            lg = self.logits([e.prompt for e in chunk])
            y = torch.tensor([e.label for e in chunk])
            correct += (lg.argmax(1) == y).sum().item()
            total += F.cross_entropy(lg, y, reduction="sum").item()
        return correct / len(data), total / len(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="sst2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--eps", type=float, default=1e-3)
    ap.add_argument("--n-train", type=int, default=1000)
    ap.add_argument("--n-dev", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--out", default="engine_convergence.jsonl")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    done = set()
    if os.path.exists(args.out):
        with open(args.out) as f:
            done = {(r["task"], r["seed"], r["config"], r["steps"]) for r in map(json.loads, f)}
    todo = [c for c in args.configs if (args.task, args.seed, c, args.steps) not in done]
    if not todo:
        print("all configs done")
        return

    task = tasks.get_task(args.task)
    train = task.load_split("train", n=args.n_train, seed=args.seed)
    dev = task.load_split("validation", n=args.n_dev, seed=0)  # the same dev examples for every seed
    rng = random.Random(args.seed)
    batches = [rng.sample(train, args.batch) for _ in range(args.steps)]
    lm = load_model("smollm2-135m")
    model, tok = lm.model, lm.tokenizer
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    scorer = FirstTokenScorer(model, tok, train[0].candidates)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    acc0, loss0 = scorer.evaluate(dev)
    print(f"{args.task} seed {args.seed}: zero-shot dev acc {acc0:.3f} loss {loss0:.4f} ({len(dev)} dev)", flush=True)
    for name in todo:
        model.load_state_dict(initial)
        kw = dict(CONFIGS[name])
        lr = args.lr
        if kw.get("normalize"):
            probe = MeZO(model.parameters(), lr=0.0, eps=args.eps, n_spsa=4, seed=10**6 + args.seed, record=False,
                         noise="rademacher", noise_backend="compiled")
            res = probe.step(lambda: scorer.loss(batches[0]))
            lr = args.lr * statistics.median(abs(g) for g in res.projected_grads)
            model.load_state_dict(initial)
        opt = MeZO(model.parameters(), lr=lr, eps=args.eps, seed=args.seed, record=False, **kw)
        t0, c0, losses = time.perf_counter(), time.process_time(), []
        for b in batches:
            losses.append(opt.step(lambda: scorer.loss(b)).loss)
        secs, cpu = time.perf_counter() - t0, time.process_time() - c0
        acc, loss = scorer.evaluate(dev)
        r = {"task": args.task, "seed": args.seed, "config": name, **kw, "lr": lr, "eps": args.eps,
             "steps": args.steps, "batch": args.batch, "n_dev": len(dev), "backend": opt.noise_backend,
             "seconds": secs, "s_per_step": secs / args.steps, "cpu_s_per_step": cpu / args.steps, "dev_acc0": acc0, "dev_loss0": loss0,
             "dev_acc": acc, "dev_loss": loss, "train_losses": losses}
        with open(args.out, "a") as f:
            f.write(json.dumps(r) + "\n")
        print(f"  {name:10s} lr {lr:.3g}: dev acc {acc0:.3f} -> {acc:.3f}, dev loss {loss0:.4f} -> {loss:.4f} "
              f"({secs / args.steps:.2f} s/step wall, {cpu / args.steps:.2f} CPU)", flush=True)


if __name__ == "__main__":
    main()
