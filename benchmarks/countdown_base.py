"""Countdown's base rates: how often a model solves the puzzle before any training, by difficulty, and why not.

    flock /tmp/mezo-heavy.lock python benchmarks/countdown_base.py --model smollm2-135m --n 200
    flock /tmp/mezo-heavy.lock python benchmarks/countdown_base.py --model gemma3-270m --n 200 --sampled 4

Countdown enters training only where a small model starts above 0%. Each difficulty (how many numbers a puzzle
gives, ``--counts``, and the largest number, ``--max-numbers``) is posed in ES-at-scale's published prompt
(``--form paper``: plain text that opens a ``<think>`` block; ``chat``: the chat form), and the difficulty they
published (``countdown-paper``: 3-4 numbers from 1..99) is added by ``--paper``. ``n`` puzzles of ``--split``
(default ``validation``: held out from training, and where the protocol lets the difficulty be chosen; the test
split stays unread) are evaluated greedily with ``mezo_rl.training.evaluation.evaluate``, the code a training
run's evaluation uses, stopping as a run does: at EOS and at the ``--stop`` strings (none by default, as TRL).

Per difficulty it prints one JSON line and a markdown row: ``correct`` (``countdown_correct``: the last
``<answer>`` uses every number once and reaches the target) and the ``countdown`` reward (0.1 x format + 1.0 x
correct), each with its SE, and the measured reasons a completion scores nothing: the share with an
``<answer>...</answer>`` pair (``answer_tag``), whose last answer parses as an expression (``parsable``), that
also uses each number once (``uses_numbers``), that has no pair but solves the puzzle on its first line
(``bare_correct``: right, untagged, scored 0), that ended at EOS before ``--max-new-tokens`` (``ended``), and
that loop (``loops``: ``suite.protocol.repetition_of`` below ``LOOP_REPETITION``). ``--sampled K`` adds the rate
under sampling (temperature 1, K completions a puzzle, as an RL run draws them): the share of completions that
are correct (``sampled_correct``) and of puzzles with at least one correct completion (``pass_at_k``).

Each row is appended to ``--record`` (default ``docs/results/countdown_base.jsonl``) with what issue 50's
protocol asks of a record: the command, the commit, the CPU (model, AVX512-BF16), the seed, n, the precision
(``--autocast``, mezo-rl's spelling, the protocol's setting by default) and sample completions.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import pathlib
import shlex
import sys
import time
from collections import Counter

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))   # the suite package beside this file
from suite.protocol import LOOP_REPETITION, PRECISION, commit, cpu_info, precision_of, repetition_of  # noqa: E402
from suite.records import append_record  # noqa: E402

from mezo_rl.model.loading import load_model  # noqa: E402
from mezo_rl.rewards.verifiable import TOLERANCE, ExpressionError, answer_contents, evaluate_expression  # noqa: E402
from mezo_rl.stats import Moments  # noqa: E402
from mezo_rl.tasks import get_task  # noqa: E402
from mezo_rl.training.evaluation import evaluate  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
SAMPLES = 6  # completions kept per difficulty, beside their puzzles


def _solves(expression: str, numbers, target) -> tuple[bool, bool]:
    """(parses, solves): ``expression`` parses, and it uses ``numbers`` each once and equals ``target``."""
    try:
        value, used = evaluate_expression(expression.strip())
    except ExpressionError:
        return False, False
    return True, Counter(used) == Counter(int(n) for n in numbers) and abs(float(value) - float(target)) < TOLERANCE


def diagnose(text: str, numbers, tokens: int | None, max_new_tokens: int, target=None) -> dict:
    """Why a completion scores what it does: an answer pair, a parsable last answer, the numbers each used once,
    an end before the token limit (``tokens`` None: unknown), a loop; and ``bare_correct``: with no answer pair,
    whether its first line, up to an ``=``, solves the puzzle (right but untagged, which the reward scores 0)."""
    found = answer_contents(text)
    parsed, uses = False, False
    if found:
        try:
            _, used = evaluate_expression(found[-1].strip())
            parsed, uses = True, Counter(used) == Counter(int(n) for n in numbers)
        except ExpressionError:
            pass
    lines = text.strip().splitlines()
    bare = not found and target is not None and bool(lines) and _solves(lines[0].split("=")[0], numbers, target)[1]
    return {"answer_tag": float(bool(found)), "parsable": float(parsed), "uses_numbers": float(uses),
            "bare_correct": float(bare), "ended": float(tokens < max_new_tokens) if tokens is not None else None,
            "loops": float(repetition_of(text) < LOOP_REPETITION)}


def token_count(lm, text: str) -> int:
    return len(lm.tokenizer(text, add_special_tokens=False)["input_ids"])


def sampled_rates(lm, task, examples, k: int, batch_size: int, max_new_tokens: int, stop, seed: int) -> dict:
    """Sampling at temperature 1, ``k`` completions a puzzle (``model_outputs`` as a training step draws them):
    the share of completions solved and of puzzles with at least one solved, with SEs."""
    from mezo_rl import rewards
    from mezo_rl.tasks import completion_stops
    from mezo_rl.training.outputs import model_outputs

    correct = rewards.get_reward("countdown_correct")
    stops = completion_stops(task, stop)
    per_completion, per_puzzle = [], []
    with lm.batches_of(batch_size):
        for start in range(0, len(examples), batch_size):
            batch = examples[start:start + batch_size]
            out = model_outputs(lm, batch, ("generation",), sample_seed=seed + start, do_sample=True,
                                num_generations=k, max_new_tokens=max_new_tokens, stop=stops)
            kw = out.as_kwargs()
            values = correct.fn(kw["prompts"], kw["completions"], **kw["columns"])
            per_completion += values
            by_group = {}
            for g, v in zip(out.groups, values):
                by_group.setdefault(g, []).append(v)
            per_puzzle += [float(max(v)) for v in by_group.values()]
    c, p = Moments.of(per_completion), Moments.of(per_puzzle)
    return {"sampled_k": k, "sampled_correct": c.mean, "sampled_correct_se": c.se, "pass_at_k": p.mean,
            "pass_at_k_se": p.se, "sampled_n": c.count}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--form", choices=["paper", "chat"], default="paper",
                    help="ES-at-scale's published prompt (plain text, opens <think>) or the chat form")
    ap.add_argument("--counts", type=int, nargs="*", default=[2, 3, 4])
    ap.add_argument("--max-numbers", type=int, nargs="*", default=[10, 20])
    ap.add_argument("--paper", action=argparse.BooleanOptionalAction, default=True,
                    help="also ES-at-scale's difficulty (3-4 numbers from 1..99), in --form")
    ap.add_argument("--split", choices=["validation", "test", "train"], default="validation")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--stop", nargs="*", default=[], help="strings that end a completion besides EOS (a run's --stop)")
    ap.add_argument("--sampled", type=int, default=0, metavar="K",
                    help="also sample K completions a puzzle at temperature 1 (0: greedy only)")
    ap.add_argument("--autocast", default=PRECISION, choices=["auto", "bfloat16", "none"],
                    help="mezo-rl's --autocast for the evaluations (default: the protocol's, as the RL cells)")
    ap.add_argument("--record", default=str(REPO / "docs" / "results" / "countdown_base.jsonl"),
                    help="JSONL the rows are appended to ('' : none)")
    args = ap.parse_args()
    if any(not s for s in args.stop):
        raise SystemExit("--stop: an empty string; accepted: non-empty text")
    import torch

    from mezo_rl.training.outputs import autocast

    code, command = commit(REPO), shlex.join([sys.executable, *sys.argv])
    chat = args.form == "chat"
    lm = load_model(args.model, batch_size=args.batch_size)
    settings = [dict(count=c, max_number=m) for c in args.counts for m in args.max_numbers]
    if args.paper:
        settings.append(dict(count=(3, 4), max_number=99))
    rows = []
    for options in settings:
        task = get_task("countdown", chat=chat, **options)
        examples = task.load_split(args.split, n=args.n, seed=args.seed)
        values = {"countdown": [], "countdown_correct": []}
        why = {k: [] for k in ("answer_tag", "parsable", "uses_numbers", "bare_correct", "ended", "loops")}
        samples = []

        def keep(batch, outputs, vals):
            for k in values:
                values[k] += vals[k]
            for g, text in zip(outputs.groups, outputs.texts):
                d = diagnose(text, batch[g].columns["numbers"], token_count(lm, text), args.max_new_tokens,
                             batch[g].columns["target"])
                for k in why:
                    why[k].append(d[k])
            if len(samples) < SAMPLES:
                samples.extend({"numbers": batch[g].columns["numbers"], "target": batch[g].columns["target"],
                                "completion": text, "countdown": r}
                               for g, text, r in list(zip(outputs.groups, outputs.texts, vals["countdown"]))[:3])

        t0 = time.perf_counter()
        with torch.no_grad(), autocast(args.autocast, lm.device.type):
            evaluate(lm, task, examples, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                     on_batch=keep, stop=args.stop)
        seconds = time.perf_counter() - t0
        reward, correct = (Moments.of(values[k]) for k in values)
        count = options["count"]
        row = {"model": args.model, "form": args.form,
               "prompt": "ES-at-scale's (plain)" if not chat else "chat form", "split": args.split,
               "count": list(count) if isinstance(count, tuple) else count, "max_number": options["max_number"],
               "published": options == dict(count=(3, 4), max_number=99),
               "n": correct.count, "correct": correct.mean, "correct_se": correct.se, "reward": reward.mean,
               "reward_se": reward.se, **{k: Moments.of(v).mean for k, v in why.items()},
               "greedy_seconds": round(seconds, 1)}
        if args.sampled:
            t0 = time.perf_counter()
            with torch.no_grad(), autocast(args.autocast, lm.device.type):
                row.update(sampled_rates(lm, task, examples, args.sampled, args.batch_size, args.max_new_tokens,
                                         args.stop, args.seed))
            row["sampled_seconds"] = round(time.perf_counter() - t0, 1)
        row.update({"samples": samples, "seed": args.seed, "decoding": "greedy", "max_new_tokens": args.max_new_tokens,
                    "stop": ["EOS", *args.stop], "command": command, "commit": code, "cpu": cpu_info(),
                    "precision": precision_of(args.autocast), "date": _dt.date.today().isoformat()})
        rows.append(row)
        if args.record:
            append_record(args.record, row)
        print(json.dumps(row), flush=True)
    print("\n| model | numbers | from 1.. | correct (SE) | reward (SE) | answer tag | parsable | uses numbers | "
          "untagged right | ended | loops | n |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        c = r["count"] if isinstance(r["count"], int) else "-".join(map(str, r["count"]))
        print(f"| {r['model']} | {c} | {r['max_number']} | {100 * r['correct']:.1f}% ({100 * r['correct_se']:.1f}) | "
              f"{r['reward']:.3f} ({r['reward_se']:.3f}) | {r['answer_tag']:.2f} | {r['parsable']:.2f} | "
              f"{r['uses_numbers']:.2f} | {r['bare_correct']:.2f} | {r['ended']:.2f} | {r['loops']:.2f} | {r['n']} |")


if __name__ == "__main__":
    main()
