"""Which noise should be the engine's default? MeZO's convergence per noise kind on SmolLM2-135M,
the same batches and the same number of forward passes for each (one process per call).

    flock /tmp/mezo-heavy.lock python benchmarks/engine_convergence.py --task sst2 --seeds 0 1 2 \\
        [--scope last-block] [--steps 800] [--eval-every 100] [--lr 1e-4] [--eps 1e-3] \\
        [--configs gaussian rademacher lowrank1 lowrank4 fzoo] [--out runs.jsonl]
    python benchmarks/engine_convergence.py --table runs.jsonl [--step-cost sc.json]

Task examples come from the project's task registry (``mezo_rl.tasks.get_task``: paper prompts; a
``--n-train`` sample of the train split drawn with seed 0, the same pool for every seed; the
a ``--n-dev`` sample of the validation split, seed 0). Loss: cross-entropy over the candidates'
logits at the next-token position after the prompt, using the first token of each candidate
(SST-2: " terrible" / " great"; SST-5: " terrible" " bad" " okay" " good" " great"), so one
forward pass per batch scores every candidate. Each seed draws its own ``--steps`` batches of
``--batch`` examples; every config of that seed starts from the same weights and sees the same
batches. Dev accuracy and CE are measured every ``--eval-every`` steps (the learning curve).

Scopes (what MeZO trains):
  last-block  the last decoder block (SmolLM2: 3.5M parameters in 7 matrices and 2 norm vectors),
              everything below it frozen and computed once: the block's input at every position
              of every example is cached, and a forward pass runs only that block (keys and
              values at every position, the query, attention output and MLP at the last one),
              the final norm and the candidates' rows of the output head. Checked against the
              full model's logits at start-up. A forward costs milliseconds, so the runs can be
              long enough for the noise kinds to separate; the matrices keep the shapes of the
              full model's (576 x 576, 576 x 1536, ...), which is what low-rank noise acts on.
  full        every parameter (134.5M), full forward passes (seconds per step: short runs only).

Configs (lr and eps from the command line, the same for all but fzoo):
  gaussian    Gaussian z, compiled kernel           rademacher  Rademacher z, compiled kernel
  lowrank1/4  z = B A^T / sqrt(r), r = 1 / 4        fzoo        Rademacher z + step_normalize="std"
fzoo's lr is matched to the others' initial step size: lr_fzoo = lr * median |g| of the plain
projected gradient over 4 directions at the initial weights on the first batch (its step is
lr * (l+ - l-) / (2 sigma) per unit of z instead of lr * (l+ - l-) / (2 eps)).
One JSON line per (task, seed, scope, config, steps, lr) is appended to ``--out``; lines already
there are skipped, so an interrupted sweep resumes where it stopped.

``--table`` prints the comparison from such a file: dev CE (and accuracy), mean +- std over
seeds, after the same number of steps (= forward passes) at several points of the curve
(``--at``); and, given ``benchmarks/step_cost.py --json`` output (``--step-cost``: each config's
full-model step time as S/(2F)), at the same wall-clock on the full model: the budget is the
slowest config's time for ``--budget-steps`` steps, and each config is read at the last
evaluated step it can afford within it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.nn.functional as F

CONFIGS = {
    "gaussian": dict(noise="gaussian", noise_backend="compiled"),
    "rademacher": dict(noise="rademacher", noise_backend="compiled"),
    "lowrank1": dict(noise="lowrank", rank=1),
    "lowrank4": dict(noise="lowrank", rank=4),
    "fzoo": dict(noise="rademacher", noise_backend="compiled", step_normalize="std"),
}
# the step_cost.py row whose S/(2F) prices each config on the full model
COST_ROW = {"gaussian": "gaussian", "rademacher": "rademacher", "lowrank1": "lowrank1", "lowrank4": "lowrank4",
            "fzoo": "rademacher"}


def first_tokens(tokenizer, candidates: list[str]) -> torch.Tensor:
    first = [tokenizer(c, add_special_tokens=False)["input_ids"][0] for c in candidates]
    if len(set(first)) != len(first):
        raise ValueError(f"candidates {candidates} do not have distinct first tokens")
    return torch.tensor(first)


class Scorer:
    """CE / accuracy over the first tokens of the candidates at the position after the prompt."""

    params: list[torch.Tensor]

    def logits(self, prompts: list[str]) -> torch.Tensor:
        raise NotImplementedError

    def loss(self, batch) -> torch.Tensor:
        return F.cross_entropy(self.logits([e.prompt for e in batch]), torch.tensor([e.label for e in batch]))

    @torch.no_grad()
    def evaluate(self, data, bs: int = 32) -> tuple[float, float]:
        correct, total = 0, 0.0
        for i in range(0, len(data), bs):
            chunk = data[i:i + bs]
            lg = self.logits([e.prompt for e in chunk])
            y = torch.tensor([e.label for e in chunk])
            correct += (lg.argmax(1) == y).sum().item()
            total += F.cross_entropy(lg, y, reduction="sum").item()
        return correct / len(data), total / len(data)


class FullModelScorer(Scorer):
    """Full forward passes (left padding, the last position)."""

    def __init__(self, model, tokenizer, candidates, max_length: int = 96):
        self.model, self.tok, self.max_length = model, tokenizer, max_length
        self.cand = first_tokens(tokenizer, candidates)
        self.params = list(model.parameters())

    def encode(self, prompts):
        return self.tok(prompts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_length,
                        padding_side="left", truncation_side="left")

    @torch.no_grad()
    def logits(self, prompts):
        enc = self.encode(prompts)
        out = self.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], logits_to_keep=1).logits
        return out[:, -1, self.cand].float()


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LastBlockScorer(Scorer):
    """Trains only the last decoder block of a Llama-style model on cached block inputs.

    ``cache(prompts)`` runs the full model once per prompt (batches, left padding) and keeps the
    last block's input at the prompt's own positions. ``logits`` left-pads those cached rows and
    runs the block at the last position only: RMSNorm, k/v projections and rotary embeddings at
    every position (positions counted from each prompt's first token, so padding does not shift
    them), the query at the last one, grouped-query softmax attention over the prompt's own
    positions, o_proj, the MLP, the final norm and the candidates' rows of the (frozen) head.
    """

    def __init__(self, full: FullModelScorer):
        self.full, self.model = full, full.model
        self.block = self.model.model.layers[-1]
        self.cand = full.cand
        self.params = list(self.block.parameters())
        cfg = self.model.config
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.head_rows = self.model.get_output_embeddings().weight[self.cand].detach()
        self.rows: dict[str, torch.Tensor] = {}
        self._captured = None
        self.block.register_forward_pre_hook(self._capture, with_kwargs=True)

    def _capture(self, module, args, kwargs):
        if self._capturing:
            self._captured = (args[0] if args else kwargs["hidden_states"]).detach()

    _capturing = False

    @torch.no_grad()
    def cache(self, prompts: list[str], bs: int = 16) -> None:
        todo = sorted({p for p in prompts if p not in self.rows})
        self._capturing = True
        try:
            for i in range(0, len(todo), bs):
                chunk = todo[i:i + bs]
                enc = self.full.encode(chunk)
                self.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], logits_to_keep=1)
                for j, p in enumerate(chunk):
                    keep = enc["attention_mask"][j].bool()
                    self.rows[p] = self._captured[j, keep].clone()
        finally:
            self._capturing = False

    @torch.no_grad()
    def logits(self, prompts):
        rows = [self.rows[p] for p in prompts]
        B, L, d = len(rows), max(r.shape[0] for r in rows), rows[0].shape[1]
        h = rows[0].new_zeros(B, L, d)
        valid = torch.zeros(B, L, dtype=torch.bool)
        pos = torch.zeros(B, L, dtype=torch.long)
        for j, r in enumerate(rows):
            h[j, L - r.shape[0]:] = r
            valid[j, L - r.shape[0]:] = True
            pos[j, L - r.shape[0]:] = torch.arange(r.shape[0])
        blk, attn = self.block, self.block.self_attn
        x = blk.input_layernorm(h)
        cos, sin = self.model.model.rotary_emb(h, pos)               # [B, L, head_dim]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        k = attn.k_proj(x).view(B, L, self.n_kv, self.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(B, L, self.n_kv, self.head_dim).transpose(1, 2)
        q = attn.q_proj(x[:, -1:]).view(B, 1, self.n_heads, self.head_dim).transpose(1, 2)
        k, q = _rotate(k, cos, sin), _rotate(q, cos[:, :, -1:], sin[:, :, -1:])
        rep = self.n_heads // self.n_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = (q @ k.transpose(-1, -2)) * attn.scaling                  # [B, H, 1, L]
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, 1, -1)
        r = h[:, -1:] + attn.o_proj(out)
        y = r + blk.mlp(blk.post_attention_layernorm(r))
        y = self.model.model.norm(y)[:, 0]
        return (y @ self.head_rows.t()).float()


def run(args) -> None:
    from mezo_rl import tasks
    from mezo_rl.model.loading import load_model
    from mezo_rl.engine.optim import MeZO

    torch.set_num_threads(args.threads)
    key = lambda seed, c: (args.task, seed, args.scope, c, args.steps, args.lr)
    done = set()
    if os.path.exists(args.out):
        with open(args.out) as f:
            done = {(r["task"], r["seed"], r["scope"], r["config"], r["steps"], r["lr_base"]) for r in map(json.loads, f)}
    todo = [(seed, c) for seed in args.seeds for c in args.configs if key(seed, c) not in done]
    if not todo:
        print("all configs done")
        return

    task = tasks.get_task(args.task)
    train = task.load_split("train", n=args.n_train, seed=0)
    dev = task.load_split("validation", n=args.n_dev, seed=0)  # the same dev sample for every seed
    lm = load_model("smollm2-135m")
    model, tok = lm.model, lm.tokenizer
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model.requires_grad_(False)
    scorer = FullModelScorer(model, tok, train[0].candidates)
    if args.scope == "last-block":
        full, scorer = scorer, LastBlockScorer(scorer)
        t0 = time.perf_counter()
        scorer.cache([e.prompt for e in train + dev])
        probe = [e.prompt for e in dev[:16]]
        ref, got = full.logits(probe), scorer.logits(probe)
        err = (ref - got).abs().max().item()
        # float32 accumulation over a 30-block forward: allow 1e-3 of the logits' scale
        if err > 1e-3 * ref.abs().max().item() + 1e-4:
            raise SystemExit(f"last-block forward disagrees with the full model: max |diff| {err:.3g}")
        print(f"cached {len(scorer.rows)} prompts in {time.perf_counter() - t0:.0f}s; last-block logits match the "
              f"full model (max |diff| {err:.2g})", flush=True)
    for p in scorer.params:
        p.requires_grad_(True)  # what MeZO trains (the model's forward runs under no_grad)
    initial = [p.detach().clone() for p in scorer.params]

    def reset():
        with torch.no_grad():
            for p, p0 in zip(scorer.params, initial):
                p.copy_(p0)

    acc0, loss0 = scorer.evaluate(dev)
    print(f"{args.task} ({args.scope}): zero-shot dev acc {acc0:.3f} loss {loss0:.4f} (n = {len(dev)})", flush=True)
    for seed, name in todo:
        rng = random.Random(seed)
        batches = [rng.sample(train, args.batch) for _ in range(args.steps)]
        reset()
        kw = dict(CONFIGS[name])
        lr = args.lr
        if kw.get("step_normalize"):
            probe = MeZO(scorer.params, lr=0.0, eps=args.eps, n_spsa=4, seed=10**6 + seed, record=False,
                         noise="rademacher", noise_backend="compiled")
            res = probe.step(lambda: scorer.loss(batches[0]))
            lr = args.lr * statistics.median(abs(g) for g in res.projected_grads)
            reset()
        opt = MeZO(scorer.params, lr=lr, eps=args.eps, seed=seed, record=False, **kw)
        curve, losses, secs, cpu = [(0, acc0, loss0)], [], 0.0, 0.0
        for i, b in enumerate(batches, 1):
            t0, c0 = time.perf_counter(), time.process_time()
            losses.append(opt.step(lambda: scorer.loss(b)).loss)
            secs, cpu = secs + time.perf_counter() - t0, cpu + time.process_time() - c0
            if i % args.eval_every == 0 or i == args.steps:
                curve.append((i, *scorer.evaluate(dev)))
        _, acc, loss = curve[-1]
        finite = all(math.isfinite(x) for x in losses)
        r = {"task": args.task, "seed": seed, "scope": args.scope, "config": name, **kw, "lr_base": args.lr, "lr": lr,
             "eps": args.eps, "steps": args.steps, "batch": args.batch, "n_dev": len(dev), "backend": opt.noise_backend,
             "seconds": secs, "s_per_step": secs / args.steps, "cpu_s_per_step": cpu / args.steps, "dev_acc0": acc0,
             "dev_loss0": loss0, "dev_acc": acc, "dev_loss": loss, "curve": curve, "finite": finite,
             "train_losses": losses}
        with open(args.out, "a") as f:
            f.write(json.dumps(r) + "\n")
        best = max(c[1] for c in curve)
        print(f"  seed {seed} {name:10s} lr {lr:.3g}: dev acc {acc0:.3f} -> {acc:.3f} (best {best:.3f}), dev loss {loss0:.4f} -> "
              f"{loss:.4f} ({secs / args.steps * 1e3:.0f} ms/step)", flush=True)


def _ms(xs) -> str:
    return f"{statistics.mean(xs):.3f} +- {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"


def _at(curve, step):
    """The last curve point at or before ``step``."""
    return max((p for p in curve if p[0] <= step), key=lambda p: p[0])


def table(path: str, step_cost: str | None, at: list[int] | None, budget_steps: int) -> None:
    with open(path) as f:
        runs = [json.loads(line) for line in f]
    cost = None
    if step_cost:
        with open(step_cost) as f:
            cost = {r["row"]: r["S/2F"] for r in json.load(f)["rows"]}
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["task"], r["scope"], r["steps"], r["lr_base"]), []).append(r)
    for (task, scope, steps, lr), rs in groups.items():
        configs = list(dict.fromkeys(r["config"] for r in rs))
        n_dev, seeds = rs[0]["n_dev"], sorted({r["seed"] for r in rs})
        checkpoints = sorted({min(a, steps) for a in (at or [steps // 8, steps // 4, steps // 2, steps])})
        print(f"\n{task}, {scope}, {steps} steps x batch {rs[0]['batch']}, lr {lr:g}, eps {rs[0]['eps']:g}, "
              f"dev n = {n_dev}, seeds {seeds}; zero-shot dev acc {rs[0]['dev_acc0']:.3f}, CE {rs[0]['dev_loss0']:.3f}")
        print("\nSame forward passes: dev CE (acc) after k steps, mean +- std over seeds")
        print("| config | " + " | ".join(f"k = {k}" for k in checkpoints) + " |")
        print("|---|" + "---|" * len(checkpoints))
        for c in configs:
            cr = [r for r in rs if r["config"] == c]
            cells = []
            for k in checkpoints:
                pts = [_at(r["curve"], k) for r in cr]
                cells.append(f"{_ms([p[2] for p in pts])} ({statistics.mean(p[1] for p in pts):.3f})")
            flag = "" if all(r["finite"] for r in cr) else " (non-finite losses)"
            print(f"| {c}{flag} | " + " | ".join(cells) + " |")
        if not cost:
            continue
        slowest = max(cost[COST_ROW[c]] for c in configs)
        print(f"\nSame wall-clock on the full model: the time the slowest config needs for {budget_steps} steps "
              "(step time from step_cost.py S/(2F))")
        print("| config | full-model step / 2F | steps affordable | evaluated at | dev CE | dev acc |")
        print("|---|---:|---:|---:|---|---|")
        for c in configs:
            cr = [r for r in rs if r["config"] == c]
            afford = budget_steps * slowest / cost[COST_ROW[c]]
            pts = [_at(r["curve"], afford) for r in cr]
            print(f"| {c} | {cost[COST_ROW[c]]:.3f} | {afford:.0f} | {pts[0][0]} | {_ms([p[2] for p in pts])} | "
                  f"{_ms([p[1] for p in pts])} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="sst2")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--scope", default="last-block", choices=["last-block", "full"])
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--eps", type=float, default=1e-3)
    ap.add_argument("--n-train", type=int, default=1000)
    ap.add_argument("--n-dev", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--out", default="engine_convergence.jsonl")
    ap.add_argument("--table", metavar="JSONL", help="print the comparison table of a results file and exit")
    ap.add_argument("--step-cost", metavar="JSON", help="benchmarks/step_cost.py --json output (for --table)")
    ap.add_argument("--at", type=int, nargs="+", help="steps at which --table compares the curves (default: 1/8, 1/4, 1/2 and all of the run)")
    ap.add_argument("--budget-steps", type=int, default=100,
                    help="--table's equal-wall-clock budget, in steps of the slowest config (default 100)")
    args = ap.parse_args()
    if args.table:
        table(args.table, args.step_cost, args.at, args.budget_steps)
    else:
        run(args)


if __name__ == "__main__":
    main()
