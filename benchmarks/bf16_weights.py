"""bf16 weights: what an update keeps, and the memory a step costs at sizes where memory binds.

    python benchmarks/bf16_weights.py keep [--steps 30]          # SmolLM2-135M in bf16, fixed loss values
    flock /tmp/mezo-heavy.lock python benchmarks/bf16_weights.py memory [--shapes 1.7b 7b] [--dtypes bfloat16 float32]
    python benchmarks/bf16_weights.py one SHAPE DTYPE MODE        # one memory cell in this process (what memory runs)

``keep``: MeZO on SmolLM2-135M's weights loaded in bf16, evaluated batched (``BatchedMembers``, the trainer's mode
for low-precision weights), 30 steps whose members' losses are fixed (g eps at +eps z, -g eps at -eps z: a projected
gradient g every step), so only the engine acts. Beside it the same steps on float32 copies of the
same (bf16-valued) weights. Per lr and rounding: whether the weights stayed bit for bit (lr 0), the realised change
projected on the float32 run's change, the share of entries that ever changed and the mean ``update_kept``.

``train``: a short MeZO run, bf16 weights against float32 (no autocast), one process each, on ``--device`` (cpu or
cuda): random weights of ``--arch`` (``benchmarks/device_speed.py``'s shapes: smollm2-135m, smollm2-1.7b, llama-7b),
``--prompts`` prompts of 16 random words, ``--members`` members decoded batched (``BatchedMembers``) for
``--new-tokens`` greedy tokens each, and a synthetic reward: the share of a completion's words whose id is even (the
loss is minus its mean over the prompts). Per dtype: the median seconds a step (the first left out), the peak memory
(CUDA: ``torch.cuda.max_memory_allocated``; CPU: peak RSS above the imports'), the mean ``update_kept`` and the reward
at the first and last step.

    python benchmarks/bf16_weights.py train --device cuda --arch smollm2-1.7b --steps 20

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


def train_one(arch: str, dtype: str, device: str, steps: int, prompts: int, members: int, new_tokens: int,
              lr: float) -> None:
    import statistics
    import time

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from device_speed import ARCHS, word_tokenizer
    from mezo_rl.engine.optim import BatchedMembers, MeZO
    from mezo_rl.model.lm import LanguageModel

    cuda = device == "cuda"
    base = rss_mib()
    cfg = LlamaConfig(**ARCHS[arch], max_position_embeddings=2048, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    torch.manual_seed(0)
    torch.set_default_dtype(getattr(torch, dtype))  # built in its dtype, where it runs: no float32 copy of a bf16 model
    with torch.device(device):
        model = LlamaForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    lm = LanguageModel(model, word_tokenizer(cfg.vocab_size), batch_size=prompts)
    gen = torch.Generator().manual_seed(1)
    texts = [" ".join(f"w{int(i)}" for i in torch.randint(2, cfg.vocab_size, (16,), generator=gen)) for _ in range(prompts)]

    def reward(completion: str) -> float:
        words = completion.split()
        return sum(int(w[1:]) % 2 == 0 for w in words if w[1:].isdigit()) / max(1, len(words))

    def closure(ms):
        outs = lm.generate(texts, members=len(ms), max_new_tokens=new_tokens)
        return [-sum(map(reward, block)) / len(block) for block in outs]

    opt = MeZO(model.parameters(), lr=lr, eps=1e-3, noise="lowrank", n_spsa=members // 2,
               step_normalize="std", member_evaluation=BatchedMembers(model))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    seconds, kept, losses = [], [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        res = opt.step(closure)
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
        losses.append(res.loss)
        if res.update_kept is not None:
            kept.append(res.update_kept)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if cuda
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base)
    command = (f"python benchmarks/bf16_weights.py train --arch {arch} --dtypes {dtype} --device {device} --steps {steps} "
               f"--prompts {prompts} --members {members} --new-tokens {new_tokens} --lr {lr:g}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    print(json.dumps(dict(kind="train", command=command, commit=commit, arch=arch, dtype=dtype, device=device,
                          gpu=torch.cuda.get_device_name() if cuda else None, cpu=cpu_name(),
                          parameters=sum(p.numel() for p in model.parameters()), steps=steps, prompts=prompts,
                          members=members, new_tokens=new_tokens, lr=lr,
                          s_per_step=round(statistics.median(seconds[1:] or seconds), 4),
                          peak_mib=round(peak, 1), update_kept=round(sum(kept) / len(kept), 4) if kept else None,
                          reward_first=-losses[0], reward_last=-losses[-1])), flush=True)


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
    t = sub.add_parser("train")
    from device_speed import ARCHS, fail  # the shapes, named once; bad input: one line, exit status 2
    t.add_argument("--arch", default="smollm2-1.7b", choices=list(ARCHS))
    t.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"])
    t.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    t.add_argument("--steps", type=int, default=20)
    t.add_argument("--prompts", type=int, default=8)
    t.add_argument("--members", type=int, default=8)
    t.add_argument("--new-tokens", type=int, default=16)
    t.add_argument("--lr", type=float, default=1e-4)
    t.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # one dtype, in this process
    o = sub.add_parser("one")
    o.add_argument("shape", choices=list(SHAPES))
    o.add_argument("dtype", choices=["bfloat16", "float32"])
    o.add_argument("mode", choices=["inference", "mezo", "adamw"])
    a = ap.parse_args()
    if a.cmd == "keep":
        keep(a.steps)
    elif a.cmd == "train":
        for name in ("steps", "prompts", "new_tokens"):
            if getattr(a, name) < 1:
                fail(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(a, name)}")
        if a.members < 2 or a.members % 2:
            fail(f"--members takes a positive even number (two-point members: +eps and -eps), got {a.members}")
        if a.device == "cuda":
            import torch
            if not torch.cuda.is_available():
                fail("--device cuda: no CUDA device here (accepted: cpu, or cuda where one is)")
        if a.one:
            train_one(a.arch, a.dtypes[0], a.device, a.steps, a.prompts, a.members, a.new_tokens, a.lr)
            return
        for dtype in a.dtypes:  # one process each: the peak is that run's alone
            subprocess.run([sys.executable, __file__, "train", "--one", "--arch", a.arch, "--dtypes", dtype,
                            "--device", a.device, "--steps", str(a.steps), "--prompts", str(a.prompts),
                            "--members", str(a.members), "--new-tokens", str(a.new_tokens), "--lr", str(a.lr)],
                           check=True)
    elif a.cmd == "memory":
        memory(a.shapes, a.dtypes)
    else:
        one(a.shape, a.dtype, a.mode)


if __name__ == "__main__":
    main()
