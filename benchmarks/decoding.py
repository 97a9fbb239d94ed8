"""Greedy decoding speed: ``LanguageModel.generate`` against transformers' ``model.generate`` on the same
prompts, SmolLM2-135M, in one process (so the ratio between the two is taken under the same load).

    flock /tmp/mezo-heavy.lock python benchmarks/decoding.py [--reps 5] [--prompts 16] [--new 32] \\
        [--precision fp32 bf16] [--device cpu|cuda] [--threads 2] [--json out.json]

The prompts: the first ``--prompts`` of a seed-0 sample of the ``countdown`` task's train split, rendered
with the model's chat template (the RL path's prompts), decoded in one batch (``lm.batch_size`` = the
number of prompts), ``--new`` new tokens, greedy, stopping at EOS only. ``bf16``: both run under
``torch.autocast(dtype=torch.bfloat16)`` with float32 weights (what ``--autocast bfloat16`` does).
transformers' ``generate`` gets the same left-padded batch, ``max_new_tokens``, EOS and pad ids.

Each rep times one call of each (interleaved; medians reported). Throughput = rows x ``--new`` / seconds
(decoding slots per second: a row that stopped at EOS still occupies its slot until the batch ends, in
both). ``same text`` says whether the two produced the same completions.

Run with ``PYTHONPATH`` pointing at another checkout to time that checkout's ``LanguageModel`` (a
``generate`` that still stops at newlines by default is asked not to, so both decode the same tokens).
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from mezo_rl.model.loading import load_model
from mezo_rl.tasks import get_task


def prompts_of(lm, n: int) -> list[str]:
    examples = get_task("countdown").load_split("train", n=n, seed=0)
    return [lm.tokenizer.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=False) for ex in examples]


def eos_only_kwargs(lm) -> dict:
    """The keyword that makes ``lm.generate`` stop at EOS only, in this checkout or an older one."""
    params = inspect.signature(lm.generate).parameters
    return {"stop_at_newline": False} if "stop_at_newline" in params else {}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(lm, prompts, new: int, precision: str, reps: int) -> dict:
    dev, tok = lm.device, lm.tokenizer
    kw = eos_only_kwargs(lm)
    tok.padding_side = "left"
    batch = tok(prompts, return_tensors="pt", padding=True).to(dev)
    eos = lm.model.config.eos_token_id if lm.model.config.eos_token_id is not None else tok.eos_token_id
    ctx = lambda: torch.autocast(dev.type, dtype=torch.bfloat16, enabled=precision == "bf16")  # noqa: E731

    def ours():
        return lm.generate(prompts, max_new_tokens=new, **kw)

    def theirs():
        out = lm.model.generate(**batch, max_new_tokens=new, do_sample=False, eos_token_id=eos,
                                pad_token_id=tok.pad_token_id)
        return tok.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)

    times = {"ours": [], "transformers": []}
    with torch.no_grad(), ctx():
        texts = {"ours": ours(), "transformers": theirs()}  # warm-up (and the texts compared)
        for _ in range(reps):
            for name, fn in (("ours", ours), ("transformers", theirs)):
                sync(dev)
                t0 = time.perf_counter()
                fn()
                sync(dev)
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    slots = len(prompts) * new
    return {"precision": precision, "rows": len(prompts), "new_tokens": new, "reps": reps,
            "seconds": med, "slots_per_s": {k: slots / v for k, v in med.items()},
            "ours_over_transformers_time": med["ours"] / med["transformers"],
            "same_text": [a.strip() for a in texts["ours"]] == [b.strip() for b in texts["transformers"]]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    lm = load_model("smollm2-135m", device=a.device, batch_size=a.prompts)
    prompts = prompts_of(lm, a.prompts)
    rows = []
    for precision in a.precision:
        r = measure(lm, prompts, a.new, precision, a.reps)
        rows.append(r)
        print(f"{precision}: {a.prompts} prompts x {a.new} new tokens, median of {a.reps}: "
              f"LanguageModel.generate {r['seconds']['ours']:.3f} s ({r['slots_per_s']['ours']:.1f} tokens/s), "
              f"transformers generate {r['seconds']['transformers']:.3f} s "
              f"({r['slots_per_s']['transformers']:.1f} tokens/s), ratio {r['ours_over_transformers_time']:.2f}, "
              f"same text: {r['same_text']}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": a.device, "threads": torch.get_num_threads(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
