"""The paper's baselines on the same task and data as MeZO (Malladi et al., 2023, Section 3 / Appendix E).

* ``zero-shot``: the prompted model as is.
* ``icl``: in-context learning with ``num_demonstrations`` training examples (the paper uses 32)
  rendered by ``task.demonstration`` and prepended to every test prompt.
* ``lp``: linear probing: a multinomial logistic-regression head fitted with ``scipy.optimize``
  (L-BFGS, L2-regularised) on ``lm.features`` of the training prompts; classification tasks only
  (the paper switches to head-tuning for multiple choice and generation).
* ``ft``: fine-tuning with Adam through backprop (the paper's FT: batch 8, lr 1e-5, linear decay).
  Classification uses cross-entropy over the candidates' mean log-likelihoods; multiple choice
  and generation use teacher-forced NLL of the correct candidate / gold answer.

Each returns a dict ``{"method", "test": metrics, "wall_time_s", "peak_rss_mb", ...}`` so the
memory/accuracy comparison of the paper (Figure 1, Table 22) can be made against a MeZO run's
summary.json. ``mezo-rl baseline --method zero-shot|icl|lp|ft`` runs them from the command line.
"""
from __future__ import annotations

import json
import pathlib
import random
import time

import numpy as np
import torch
from tqdm.auto import tqdm

from mezo_rl.cli import checks
from mezo_rl.training.plan import resolve_task
from mezo_rl.training.setup import load_splits
from mezo_rl.training.arguments import METHODS, BaselineArguments
from mezo_rl.training.evaluation import evaluate
from mezo_rl.model.loading import load_model
from mezo_rl.training.outputs import model_outputs
from mezo_rl.training.trainer import peak_rss_mb
from mezo_rl.rewards import candidate_cross_entropy
from mezo_rl.choices import weights_dtype

__all__ = ["METHODS", "BaselineArguments", "zero_shot", "icl", "linear_probe", "finetune", "run_baseline",
           "pick_demonstrations", "fit_logistic_regression"]


def _evaluate(lm, task, examples, batch_size=16, max_new_tokens=32, demonstrations=None) -> dict:
    metrics = evaluate(lm, task, examples, batch_size=batch_size, max_new_tokens=max_new_tokens,
                       demonstrations=demonstrations)
    return {k: float(v) for k, v in metrics.items()}


def zero_shot(lm, task, test, *, batch_size=16, max_new_tokens=32) -> dict:
    """Task metrics of the unchanged model on ``test``."""
    return _evaluate(lm, task, test, batch_size, max_new_tokens)


def pick_demonstrations(train, num_demonstrations=32, seed=0) -> list:
    """``num_demonstrations`` training examples drawn with ``seed`` (the same ones for every test example)."""
    if not train:
        raise ValueError("icl: the training split is empty; demonstrations come from it")
    if num_demonstrations < 1:
        raise ValueError(f"icl: num_demonstrations must be >= 1, got {num_demonstrations}")
    return random.Random(seed).sample(list(train), min(num_demonstrations, len(train)))


def icl(lm, task, train, test, *, num_demonstrations=32, seed=0, batch_size=16, max_new_tokens=32) -> dict:
    """In-context learning: metrics on ``test`` with the same ``num_demonstrations`` rendered
    training examples (``task.demonstration``) prepended to every prompt."""
    demos = pick_demonstrations(train, num_demonstrations, seed)
    return _evaluate(lm, task, test, batch_size, max_new_tokens, demonstrations=demos)


def _features(lm, examples, batch_size):
    feats = []
    with torch.no_grad():
        for i in range(0, len(examples), batch_size):
            feats.append(lm.features([ex.prompt for ex in examples[i:i + batch_size]]).float())
    return torch.cat(feats).numpy().astype(np.float64)


def fit_logistic_regression(x: np.ndarray, y: np.ndarray, n_classes: int, l2: float = 1.0):
    """Multinomial logistic regression by L-BFGS (scipy): returns ``predict(x) -> labels``.

    Features are standardised with the training mean/std; the loss is the mean cross-entropy plus
    ``l2 / (2 n)`` times the squared norm of the weights (not the bias).
    """
    from scipy.optimize import minimize
    from scipy.special import logsumexp

    mean, std = x.mean(0), x.std(0) + 1e-6
    xs = (x - mean) / std
    n, d = xs.shape
    onehot = np.eye(n_classes)[y]

    def loss_and_grad(theta):
        w, b = theta[: d * n_classes].reshape(d, n_classes), theta[d * n_classes:]
        logits = xs @ w + b
        logp = logits - logsumexp(logits, axis=1, keepdims=True)
        loss = -(onehot * logp).sum() / n + l2 / (2 * n) * (w ** 2).sum()
        g = (np.exp(logp) - onehot) / n
        return loss, np.concatenate([(xs.T @ g + l2 / n * w).ravel(), g.sum(0)])

    res = minimize(loss_and_grad, np.zeros(d * n_classes + n_classes), jac=True, method="L-BFGS-B",
                   options={"maxiter": 1000})
    w, b = res.x[: d * n_classes].reshape(d, n_classes), res.x[d * n_classes:]

    def predict(features: np.ndarray) -> np.ndarray:
        return (((features - mean) / std) @ w + b).argmax(1)

    return predict


def linear_probe(lm, task, train, test, *, l2=1.0, batch_size=16) -> dict:
    """Linear probing: logistic regression on ``lm.features`` (classification tasks only)."""
    if task.kind != "classification":
        raise ValueError(f"lp: linear probing needs a classification task; {getattr(task, 'name', task)!r} is "
                         f"{task.kind!r} (the paper uses head-tuning there; try --method ft or icl)")
    n_classes = len(train[0].candidates)
    x_train, y_train = _features(lm, train, batch_size), np.array([ex.label for ex in train])
    predict = fit_logistic_regression(x_train, y_train, n_classes, l2)
    pred = predict(_features(lm, test, batch_size))
    y_test = np.array([ex.label for ex in test])
    return {"accuracy": float((pred == y_test).mean()),
            "train_accuracy": float((predict(x_train) == y_train).mean())}


def _ft_loss(lm, task, batch):
    """Differentiable loss of a batch, as in the paper's FT: cross-entropy over the candidates'
    mean log-likelihoods for classification; teacher-forced NLL of the correct candidate / gold
    answer for multiple choice and generation. The scores come from the same
    :func:`mezo_rl.training.outputs.model_outputs` as training and evaluation (so masked LMs use their prompt)."""
    out = model_outputs(lm, batch, {"scores"}, gold_only=task.kind != "classification")
    return torch.stack(candidate_cross_entropy(out.candidate_scores, out.labels)).mean()


def finetune(lm, task, train, *, lr=1e-5, batch_size=8, epochs=1.0, max_steps=None, seed=0,
             progress=True) -> dict:
    """Fine-tune every parameter of ``lm`` in place with Adam through backprop (linear lr decay).

    Returns ``{"steps", "final_loss"}``. Memory: Adam keeps two parameter-sized buffers and backprop
    keeps the activations, which is the cost MeZO avoids; compare ``peak_rss_mb``.
    """
    steps_per_epoch = max(1, len(train) // batch_size)
    steps = max(1, int(round(epochs * steps_per_epoch)))
    if max_steps is not None:
        steps = min(steps, max_steps)
    params = [p for p in lm.model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / steps))
    rng = random.Random(seed)
    order: list[int] = []
    lm.model.train()
    loss = torch.tensor(float("nan"))
    try:
        for _ in tqdm(range(steps), desc="ft", disable=not progress, dynamic_ncols=True):
            if len(order) < batch_size:
                fresh = list(range(len(train)))
                rng.shuffle(fresh)
                order += fresh
            batch, order = [train[i] for i in order[:batch_size]], order[batch_size:]
            loss = _ft_loss(lm, task, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    finally:
        lm.model.eval()
    return {"steps": steps, "final_loss": float(loss.detach())}


def run_baseline(args: BaselineArguments, lm=None, task=None, splits=None) -> dict:
    """Run one baseline end to end (load model/task/data unless given) and return its result dict."""
    t0 = time.perf_counter()
    if task is None:
        task = resolve_task(args)  # a name, module:function, data file or dataset (+ its options)
    if splits is None:
        sizes = {"test": args.num_test, **({"train": args.num_train} if args.method != "zero-shot" else {})}
        splits = {"train": [], **load_splits(task, args.task, sizes, args.data_dir, args.seed)}
    if lm is None:
        lm = load_model(args.model, dtype=weights_dtype(args.dtype, getattr(args, "autocast", "auto")))
    kw = dict(batch_size=args.eval_batch_size, max_new_tokens=args.max_completion_length)
    result = {"method": args.method, "model": args.model, "task": args.task}
    if args.method == "zero-shot":
        result["test"] = zero_shot(lm, task, splits["test"], **kw)
    elif args.method == "icl":
        result["test"] = icl(lm, task, splits["train"], splits["test"], num_demonstrations=args.num_demonstrations,
                             seed=args.seed, **kw)
    elif args.method == "lp":
        result["test"] = linear_probe(lm, task, splits["train"], splits["test"], l2=args.lp_l2,
                                      batch_size=args.eval_batch_size)
    else:
        result["ft"] = finetune(lm, task, splits["train"], lr=args.ft_lr, batch_size=args.ft_batch_size,
                                epochs=args.ft_epochs, max_steps=args.ft_max_steps, seed=args.seed)
        result["test"] = zero_shot(lm, task, splits["test"], **kw)
    result["wall_time_s"] = time.perf_counter() - t0
    result["peak_rss_mb"] = peak_rss_mb()
    if args.output_dir:
        out = pathlib.Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"baseline_{args.method}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
