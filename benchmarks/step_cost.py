"""What a MeZO step costs compared with two forward passes, per noise kind, on SmolLM2-135M
(one process, so every ratio is within one run).

    flock /tmp/mezo-heavy.lock python benchmarks/step_cost.py [--rows ...] [--reps 5]
        [--dtype float32] [--autocast none|bfloat16] [--threads 2] [--json out.json]

F = one forward pass of the plain model under torch.no_grad() (batch 16 x sequence 64 random
token ids, next-token cross-entropy from the logits). For each row, S = one optimizer step whose
closure is that forward pass, and S / (2F): what a step costs beyond its two forward passes.
Forward and steps are interleaved (rep 1: F, every row's step; rep 2: ...) so background load
hits all rows alike. Reported per row: the median over ``--reps`` of wall time and of process CPU
time (all threads; on a shared machine where other jobs preempt this one, CPU time is the steadier
measure of the work itself: preemption adds wall time, not CPU time), and the ratios of each; and
S/(2F) from the minima (min S over min F: each the least-disturbed sample, the usual estimate of
a cost on a noisy machine, since interference only ever adds time); and S/own: the step's time over
the time of its own two closure calls (the forwards at +eps and -eps timed inside that step), median
over reps: what the step adds to its two forwards, immune to the forward's drift between reps.

Rows (``--rows`` picks a subset):
  default              MeZO() with every default (noise, backend)
  gaussian             Gaussian z, compiled counter-hash kernel
  gaussian-torch       Gaussian z, torch.Generator (no compiler)
  rademacher           Rademacher z, compiled kernel
  lowrank1, lowrank4   z = B A^T / sqrt(r) per matrix (r = 1, 4), Gaussian for 1-D tensors
  reference            Algorithm 1 written the way the MeZO reference implementation writes it:
                       torch.manual_seed(step seed) before each of four sweeps (+eps, -2eps, +eps,
                       update), torch.normal per tensor, ``param.data = param.data + s * z * eps``
  batched              the default noise (low-rank r = 1) with the batched member evaluation
                       (``member_evaluation="batched"``): one forward over both members' 2 x 16 rows, the
                       weights untouched, then the update; its closure returns each member's loss
Peak memory: benchmarks/memory_run.py (one process per mode, the same rows).

    flock /tmp/mezo-heavy.lock python benchmarks/step_cost.py --norm [--reps 50] [--threads 2]

``--norm``: the default run's step (``--peft norm`` on SST-2: 64 training examples, accuracy, MeZO with
the norm row of ``mezo_rl.training.defaults``, in place, the trunk cache filled first), its closure
the training path (``objective_outputs``) two ways, steps interleaved: ``candidate logits``
(the objective is invariant to the normaliser, so each example's two label words' logits are computed
at its one position) and ``full vocabulary`` (``log_softmax=True``: vocabulary-wide logits and their
log-sum-exp at every scored position, what every step computed before). Prints the medians and
``norm-mode scoring step, full vocabulary / candidate logits: X.X``; the two paths' accuracies over
the steps must be identical (checked).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import torch.nn.functional as F

from mezo_rl.model.loading import load_model
from mezo_rl.engine.optim import BatchedMembers, MeZO

ROWS = {
    "default": {},
    "gaussian": dict(noise="gaussian", noise_backend="compiled"),
    "gaussian-torch": dict(noise="gaussian", noise_backend="torch"),
    "rademacher": dict(noise="rademacher", noise_backend="compiled"),
    "lowrank1": dict(noise="lowrank", rank=1),
    "lowrank4": dict(noise="lowrank", rank=4),
    "reference": None,
}
# rows whose closure evaluates every member in one batched forward (not in memory_run.py's modes)
BATCHED_ROWS = {"batched": dict(noise="lowrank", rank=1)}


class ReferenceStyleMeZO:
    """Algorithm 1 of Malladi et al. (2023) in the style of their reference implementation:
    the global RNG is reseeded with the step's seed before every sweep, z is drawn per tensor with
    ``torch.normal``, and each sweep rebinds ``param.data`` to a new tensor (``p + s * z * eps``:
    three temporaries of the tensor's size). Four sweeps: +eps, -2 eps, +eps (restore), update."""

    def __init__(self, params, lr: float, eps: float, weight_decay: float = 0.0, seed: int = 0):
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.eps, self.wd = lr, eps, weight_decay
        self.rng = np.random.default_rng(seed)

    def _perturb(self, seed: int, scale: float) -> None:
        torch.manual_seed(seed)
        for p in self.params:
            z = torch.normal(mean=0, std=1, size=p.data.size(), device=p.data.device, dtype=p.data.dtype)
            p.data = p.data + scale * z * self.eps

    @torch.no_grad()
    def step(self, closure):
        seed = int(self.rng.integers(1_000_000_000))
        self._perturb(seed, 1.0)
        l_plus = float(closure())
        self._perturb(seed, -2.0)
        l_minus = float(closure())
        g = (l_plus - l_minus) / (2 * self.eps)
        self._perturb(seed, 1.0)
        torch.manual_seed(seed)
        for p in self.params:
            z = torch.normal(mean=0, std=1, size=p.data.size(), device=p.data.device, dtype=p.data.dtype)
            p.data = p.data - self.lr * (g * z + self.wd * p.data)
        return l_plus, l_minus


def make_optimizer(row: str, params, lr: float = 1e-7, eps: float = 1e-3, model=None):
    if row in BATCHED_ROWS:
        return MeZO(params, lr=lr, eps=eps, record=False, member_evaluation=BatchedMembers(model), **BATCHED_ROWS[row])
    if ROWS[row] is None:
        return ReferenceStyleMeZO(params, lr=lr, eps=eps)
    return MeZO(params, lr=lr, eps=eps, record=False, **ROWS[row])


def make_loss(model, ids, autocast: str = "none"):
    """The closure: next-token cross-entropy on ``ids``; called with a step's members (batched rows),
    one forward over M copies of ``ids`` (member-major) and each member's cross-entropy. ``autocast="bfloat16"``:
    the forward under ``torch.autocast`` in bf16 (the weights, and so the sweeps, stay in their dtype)."""
    def ce(logits, x):
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten())

    def loss(members=None):
        with torch.no_grad(), torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast == "bfloat16"):
            if members is None:
                return ce(model(input_ids=ids).logits, ids)
            logits = model(input_ids=ids.repeat(len(members), 1)).logits
            return [ce(block, ids) for block in logits.chunk(len(members))]
    return loss


def batch(vocab: int, bsz: int = 16, seq: int = 64) -> torch.Tensor:
    return torch.randint(0, vocab, (bsz, seq), generator=torch.Generator().manual_seed(0))


def timed(fn) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one call."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def norm_scoring(args) -> dict:
    """``--norm``: the norm-mode scoring step, candidate logits against the full vocabulary (see above)."""
    import re

    from mezo_rl import tasks
    from mezo_rl.model.peft import FINAL_NORM
    from mezo_rl.training.defaults import MODE_DEFAULTS, mezo_options
    from mezo_rl.training.outputs import model_outputs, objective_outputs
    from mezo_rl.rewards import build_objective

    lm = load_model("smollm2-135m")
    for name, p in lm.model.named_parameters():
        p.requires_grad_(re.search(FINAL_NORM, name) is not None)
    assert lm.enable_trunk_cache()
    row = MODE_DEFAULTS["norm"]
    train = tasks.get_task("sst2").load_split("train", n=256, seed=0)  # a pool the batches are drawn from
    objective = build_objective("accuracy")
    assert objective.shift_invariant
    params = [p for p in lm.model.parameters() if p.requires_grad]
    opts = {path: MeZO(params, record=False, seed=0, **mezo_options(row)) for path in ("candidate", "full")}
    with torch.no_grad():
        model_outputs(lm, train, {"scores"})  # the trunk over every training example, as the trainer does first
    rng = np.random.default_rng(0)
    accuracy = {path: [] for path in opts}

    def closure(path, batch):
        def loss():
            if path == "candidate":  # the training path: the objective says what the model may skip
                out = objective_outputs(lm, objective, batch)
            else:
                out = objective.evaluate(**model_outputs(lm, batch, {"scores"}).as_kwargs())
            accuracy[path].append(out.components["accuracy"])
            return out.loss
        return loss

    times = {path: [] for path in opts}
    for rep in range(args.reps + 1):
        batch = [train[i] for i in rng.choice(len(train), row["per_device_train_batch_size"], replace=False)]
        state = [p.detach().clone() for p in params]
        for path, opt in opts.items():  # the same batch and weights for both; lr 0 keeps them equal
            for p, s in zip(params, state):
                p.data.copy_(s)
            for g in opt.param_groups:
                g["lr"] = 0.0
            t = timed(lambda: opt.step(closure(path, batch)))
            if rep:  # rep 0: warm-up
                times[path].append(t)
    assert accuracy["candidate"] == accuracy["full"], "the two paths disagree on an accuracy"
    med = {path: tuple(statistics.median(x[i] for x in t) for i in (0, 1)) for path, t in times.items()}
    ratio, ratio_cpu = med["full"][0] / med["candidate"][0], med["full"][1] / med["candidate"][1]
    members = opts["full"].members_per_step
    print(f"SmolLM2-135M fp32, --peft norm, SST-2, batch {row['batch_size']}, {members} members a step (in place), "
          f"{args.threads} threads; medians of {args.reps} steps")
    print(f"| path | step wall ms | step CPU ms |\n|---|---:|---:|")
    for path in opts:
        print(f"| {'candidate logits' if path == 'candidate' else 'full vocabulary'} | {med[path][0] * 1e3:.1f} | "
              f"{med[path][1] * 1e3:.1f} |")
    print(f"norm-mode scoring step, full vocabulary / candidate logits: {ratio:.1f} (CPU time: {ratio_cpu:.1f})")
    return {"medians": med, "all": times, "ratio": ratio, "ratio_cpu": ratio_cpu, "threads": args.threads}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--norm", action="store_true", help="the norm-mode scoring step, candidate logits vs full vocabulary")
    ap.add_argument("--rows", nargs="+", default=[*ROWS, *BATCHED_ROWS], choices=[*ROWS, *BATCHED_ROWS])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--autocast", default="none", choices=["none", "bfloat16"],
                    help="run the forwards under torch.autocast in bf16 (fp32 weights: the in-place mode's bf16 setup)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.norm:
        result = norm_scoring(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        return
    model = load_model("smollm2-135m", dtype=args.dtype).model
    ids = batch(model.config.vocab_size)
    loss = make_loss(model, ids, args.autocast)
    opts = {row: make_optimizer(row, list(model.parameters()), model=model) for row in args.rows}
    loss()
    for row, opt in opts.items():  # warm-up: compiles the noise kernels where needed
        t = timed(lambda: opt.step(loss))[0]
        print(f"warm-up {row}: {t:.1f}s (backend {getattr(opt, 'noise_backend', '-')})", flush=True)
    fwd, steps, own = [], {row: [] for row in opts}, {row: [] for row in opts}
    inner = []  # wall seconds of each closure call inside the step being timed

    def timed_loss(*members):
        t = time.perf_counter()
        out = loss(*members)
        inner.append(time.perf_counter() - t)
        return out

    for rep in range(args.reps):
        fwd.append(timed(loss))
        for row, opt in opts.items():
            inner.clear()
            steps[row].append(timed(lambda: opt.step(timed_loss)))
            own[row].append(steps[row][-1][0] / sum(inner))
        print(f"rep {rep + 1}: F {fwd[-1][0] * 1e3:.0f} ms, " + ", ".join(f"{r} {s[-1][0] * 1e3:.0f}" for r, s in steps.items()),
              flush=True)
    f_wall, f_cpu = (statistics.median(t[i] for t in fwd) for i in (0, 1))
    med = {row: tuple(statistics.median(t[i] for t in times) for i in (0, 1)) for row, times in steps.items()}
    ref = med.get("reference")
    out = {"dtype": args.dtype, "autocast": args.autocast, "threads": args.threads, "reps": args.reps, "F": f_wall, "F_cpu": f_cpu, "F_min": min(t[0] for t in fwd),
           "F_all": fwd, "rows": []}
    print(f"\nF = {f_wall * 1e3:.0f} ms wall, {f_cpu * 1e3:.0f} ms CPU (medians of {args.reps})")
    f_min = min(t[0] for t in fwd)
    ref_min = min(t[0] for t in steps["reference"]) if "reference" in steps else None
    print(f"F min = {f_min * 1e3:.0f} ms wall")
    print(f"{'row':15s} {'S wall':>7s} {'S/(2F)':>7s} {'ref/S':>6s} {'S CPU':>7s} {'S/(2F)':>7s} {'ref/S':>6s} "
          f"{'S min':>7s} {'S/(2F)':>7s} {'ref/S':>6s} {'S/own':>6s}  noise / backend")
    for row, times in steps.items():
        (s_wall, s_cpu), opt = med[row], opts[row]
        what = "reference style" if ROWS.get(row, 0) is None else f"{opt.config['noise']}" + (
            f" r={opt.config['rank']}" if opt.config["noise"] == "lowrank" else "") + f" / {opt.noise_backend}" + (
            " / batched members" if row in BATCHED_ROWS else "")
        r = {"row": row, "what": what, "S": s_wall, "S/2F": s_wall / (2 * f_wall), "ref/S": ref[0] / s_wall if ref else None,
             "S_cpu": s_cpu, "S/2F_cpu": s_cpu / (2 * f_cpu), "ref/S_cpu": ref[1] / s_cpu if ref else None, "S_all": times}
        s_min = min(t[0] for t in times)
        r.update({"S_min": s_min, "S/2F_min": s_min / (2 * f_min), "ref/S_min": ref_min / s_min if ref_min else None,
                  "S/own": statistics.median(own[row]), "S/own_all": own[row]})
        out["rows"].append(r)
        nan = float("nan")
        print(f"{row:15s} {s_wall * 1e3:7.0f} {r['S/2F']:7.3f} {r['ref/S'] or nan:6.2f} {s_cpu * 1e3:7.0f} "
              f"{r['S/2F_cpu']:7.3f} {r['ref/S_cpu'] or nan:6.2f} {s_min * 1e3:7.0f} {r['S/2F_min']:7.3f} "
              f"{r['ref/S_min'] or nan:6.2f} {r['S/own']:6.3f}  {what}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
