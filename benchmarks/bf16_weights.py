"""bf16 weights: what an update keeps, and the memory a step costs at sizes where memory binds.

    python benchmarks/bf16_weights.py keep [--steps 30]          # SmolLM2-135M in bf16, fixed loss values
    flock /tmp/mezo-heavy.lock python benchmarks/bf16_weights.py memory [--shapes 1.7b 7b] [--dtypes bfloat16 float32]
    python benchmarks/bf16_weights.py one SHAPE DTYPE MODE        # one memory cell in this process (what memory runs)

``keep``: MeZO on SmolLM2-135M's weights loaded in bf16, evaluated batched (``BatchedMembers``, the trainer's mode
for low-precision weights), 30 steps whose members' losses are fixed (g eps at +eps z, -g eps at -eps z: a projected
gradient g every step), so only the engine acts. Beside it the same steps on float32 copies of the
same (bf16-valued) weights. Per lr and rounding: whether the weights stayed bit for bit (lr 0), the realised change
projected on the float32 run's change, the share of entries that ever changed and the mean ``update_kept``.

``memory``: random weights (transformers' initialisation) of a real architecture's shape (SmolLM2-1.7B's Llama config; a 7B Llama-2 shape), one
process per cell; peak RSS (ru_maxrss) minus the RSS after imports, before the model is built, in MiB:
``inference`` (a forward of the batch a step's members read: 2 members x 4 sequences x 64 tokens, no grad) and
``mezo`` (one two-point step, evaluated batched, update included), ``adamw`` (forward, backward and a step of
``torch.optim.AdamW``, whose moments are kept in the weights' dtype: 4 copies of the weights; counted, not run,
where those copies alone exceed 0.8 of the machine's memory).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHAPES = {
    "1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                 num_key_value_heads=32, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=2048),
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False, max_position_embeddings=2048),
}
BATCH, TOKENS, MEMBERS = 4, 64, 2


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor()
    import torch
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return f"{name}, {os.cpu_count()} cores, native bf16: {'yes' if native else 'no'}"


def keep(steps: int) -> None:
    import torch
    from mezo_rl.engine.optim import BatchedMembers, MeZO
    from mezo_rl.model.loading import load_model

    def model():
        lm = load_model("smollm2-135m", dtype="bfloat16")
        return lm.model

    base = model()
    start = [p.detach().double() for p in base.parameters()]
    eps = 1e-2

    def run(m, lr, g, rounding):
        opt = MeZO(m.parameters(), lr=lr, eps=eps, noise="lowrank", rounding=rounding, member_evaluation=BatchedMembers(m))
        fixed = lambda members: [g * eps, -g * eps][: len(members)]  # noqa: E731  projected gradient g
        kept = [opt.step(fixed).update_kept for _ in range(steps)]
        return [k for k in kept if k is not None]

    print(f"# {cpu_name()}; torch {torch.__version__}; SmolLM2-135M bf16, {steps} steps, eps 1e-2, lowrank r=1, batched")
    print("| lr | projected grad | rounding | bit for bit | projection on fp32's change | entries changed | mean update_kept |")
    print("|---|---:|---|---|---:|---:|---:|")
    for lr, g in ((0.0, 50.0), (2e-4, 1.0), (2e-4, 50.0), (1e-3, 0.3), (1e-6, 50.0)):
        ref = model().float()
        run(ref, lr, g, "stochastic")
        want = [p.detach().double() - s for p, s in zip(ref.parameters(), start)]
        norm = sum(float((w * w).sum()) for w in want)
        del ref
        for rounding in ("stochastic", "nearest"):
            m = model()
            kept = run(m, lr, g, rounding)
            got = [p.detach().double() - s for p, s in zip(m.parameters(), start)]
            exact = all(float(g.abs().max()) == 0 for g in got)
            proj = sum(float((g * w).sum()) for g, w in zip(got, want)) / norm if norm else float("nan")
            changed = sum(int((g != 0).sum()) for g in got) / sum(g.numel() for g in got)
            mean = sum(kept) / len(kept) if kept else float("nan")
            print(f"| {lr:g} | {g:g} | {rounding} | {'yes' if exact else 'no'} | {proj:.4f} | {changed:.4f} | {mean:.4f} |", flush=True)
            del m


def one(shape: str, dtype: str, mode: str) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from mezo_rl.engine.optim import BatchedMembers, MeZO

    base = rss_mib()  # after the imports, before the model

    torch.manual_seed(0)
    torch.set_default_dtype(getattr(torch, dtype))  # built in its dtype: no float32 copy of a bf16 model
    model = LlamaForCausalLM(LlamaConfig(**SHAPES[shape])).eval()  # transformers' own random initialisation
    torch.set_default_dtype(torch.float32)
    loaded = rss_mib()
    ids = torch.randint(0, SHAPES[shape]["vocab_size"], (BATCH, TOKENS))

    def loss_rows(rows):
        out = model(input_ids=rows).logits.float()
        return torch.nn.functional.cross_entropy(out[:, :-1].flatten(0, 1), rows[:, 1:].flatten(), reduction="none")

    if mode == "inference":
        with torch.no_grad():
            loss_rows(ids.repeat(MEMBERS, 1))
    elif mode == "adamw":  # torch.optim.AdamW: its moments in the weights' dtype
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        loss_rows(ids.repeat(MEMBERS, 1)).mean().backward()
        opt.step()
    elif mode == "mezo":
        opt = MeZO(model.parameters(), lr=1e-6, eps=1e-3, noise="lowrank", member_evaluation=BatchedMembers(model))

        def closure(members):
            per = loss_rows(ids.repeat(len(members), 1)).view(len(members), -1)
            return [float(v) for v in per.mean(1)]
        opt.step(closure)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps(dict(shape=shape, dtype=dtype, mode=mode, parameters=n, baseline_mib=round(base, 1),
                          loaded_mib=round(loaded - base, 1), peak_mib=round(peak - base, 1))), flush=True)


def memory(shapes, dtypes) -> None:
    import torch

    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    print(f"# {cpu_name()}; torch {torch.__version__}; {total:.0f} MiB of memory; rows {MEMBERS} x {BATCH} x {TOKENS}")
    for shape in shapes:
        for dtype in dtypes:
            from transformers import LlamaConfig, LlamaForCausalLM
            with torch.device("meta"):
                n = sum(p.numel() for p in LlamaForCausalLM(LlamaConfig(**SHAPES[shape])).parameters())
            size = 2 if dtype == "bfloat16" else 4
            if n * size / 2**20 > 0.8 * total:
                print(json.dumps(dict(shape=shape, dtype=dtype, parameters=n, skipped=f"weights alone {n * size / 2**20:.0f} MiB")))
                continue
            for mode in ("inference", "mezo"):
                subprocess.run([sys.executable, __file__, "one", shape, dtype, mode], check=True)
            adamw = 4 * n * size / 2**20  # weights, gradients and AdamW's two moments, in the weights' dtype
            if adamw < 0.8 * total:
                subprocess.run([sys.executable, __file__, "one", shape, dtype, "adamw"], check=True)
            else:
                print(json.dumps(dict(shape=shape, dtype=dtype, mode="adamw", parameters=n, skipped=True,
                                      counted_mib=round(adamw))), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("keep")
    k.add_argument("--steps", type=int, default=30)
    m = sub.add_parser("memory")
    m.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    m.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"])
    o = sub.add_parser("one")
    o.add_argument("shape", choices=list(SHAPES))
    o.add_argument("dtype", choices=["bfloat16", "float32"])
    o.add_argument("mode", choices=["inference", "mezo", "adamw"])
    a = ap.parse_args()
    if a.cmd == "keep":
        keep(a.steps)
    elif a.cmd == "memory":
        memory(a.shapes, a.dtypes)
    else:
        one(a.shape, a.dtype, a.mode)


if __name__ == "__main__":
    main()
