"""How many prompts to decode together: ``LanguageModel.generate``'s chunking, on SmolLM2-135M (one
process, so every ratio is within one run).

    flock /tmp/mezo-heavy.lock python benchmarks/generation_batch.py [--sizes 8,16,64] [--reps 1] [--json out.json]

Two workloads: the RL example's 200 test prompts (short: SST-2 review openings, 24 new tokens,
examples/rl_sentiment.py) and SQuAD validation questions (long: a paragraph each, 16 new tokens,
``--squad`` of them). Per workload the baseline is what evaluation did before chunks were ordered by
length: the prompts in their given order, 16 at a time (one ``generate`` call per 16, so nothing is
reordered across them). Each other row is one ``generate`` call on all the prompts with
``batch_size`` B (chunks of prompts of similar length). It prints seconds, baseline / row (the
speed-up) and how many texts equal the baseline's (greedy decoding should not depend on the
chunking). Reps interleave the rows; medians. Needs $MEZO_RL_DATA (SST-2 and SQuAD).
"""
import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples"))

BASELINE = 16


def workloads(data_dir: pathlib.Path, n_squad: int) -> dict:
    import rl_sentiment
    from mezo_rl.tasks import get_task

    with tempfile.TemporaryDirectory() as tmp:
        files = rl_sentiment.write_prompts(data_dir, pathlib.Path(tmp), 1, 1, 200, 6)
        rl = [json.loads(line)["prompt"] for line in files["test"].read_text().splitlines()]
    squad = [ex.prompt for ex in get_task("squad").load_split("validation", data_dir=str(data_dir), n=n_squad, seed=0)]
    return {"rl test prompts (24 new tokens)": (rl, 24), "squad validation (16 new tokens)": (squad, 16)}


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="8,16,64", help="batch sizes of the length-ordered rows")
    p.add_argument("--squad", type=int, default=48, help="SQuAD questions")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--data-dir", default=os.environ.get("MEZO_RL_DATA"))
    p.add_argument("--json", default=None, help="also write the rows here")
    a = p.parse_args(argv)
    if not a.data_dir:
        p.error("give --data-dir or set MEZO_RL_DATA")
    import torch
    from mezo_rl.model.loading import load_model

    lm = load_model("smollm2-135m")
    sizes = [int(s) for s in a.sizes.split(",")]
    rows = []
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name, (prompts, new) in workloads(pathlib.Path(a.data_dir), a.squad).items():
        def given_order():
            with lm.batches_of(BASELINE):
                return [t for s in range(0, len(prompts), BASELINE)
                        for t in lm.generate(prompts[s:s + BASELINE], max_new_tokens=new, stop=["\n"])]

        def ordered(b):
            with lm.batches_of(b):
                return lm.generate(prompts, max_new_tokens=new, stop=["\n"])  # both workloads end at a newline

        runs = {"given order, 16 at a time": given_order, **{f"by length, {b} at a time": (lambda b=b: ordered(b))
                                                             for b in sizes}}
        secs, texts = {k: [] for k in runs}, {}
        for _ in range(a.reps):
            for k, fn in runs.items():
                s, texts[k] = timed(fn)
                secs[k].append(s)
        base = statistics.median(secs["given order, 16 at a time"])
        print(f"\n{name}: {len(prompts)} prompts")
        for k in runs:
            s = statistics.median(secs[k])
            same = sum(x == y for x, y in zip(texts[k], texts["given order, 16 at a time"]))
            rows.append({"workload": name, "row": k, "seconds": s, "speedup": base / s, "same_texts": same,
                         "n": len(prompts)})
            print(f"  {k:<28} {s:7.1f} s   x{base / s:4.2f}   texts equal to the baseline's: {same}/{len(prompts)}")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
