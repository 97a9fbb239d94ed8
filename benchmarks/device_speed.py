"""The engine at device speed: random weights of a real architecture, no download, one process.

    python benchmarks/device_speed.py --device cuda --arch smollm2-135m
    python benchmarks/device_speed.py --device cpu --arch smollm2-135m --count-ops --prompts 4 --new-tokens 8

Prints, with the project's own ``LanguageModel``, ``MeZO`` and ``BatchedMembers``:
- population decode / plain inference of the same M x prompts rows at each M (greedy; the batched
  members' closure, and the whole step with its noise draw and update), as a speed ratio
  (plain time / population time: 1 is as fast as plain inference);
- a scoring step / two forward passes (prompts x score-tokens tokens): in place with low-rank and Gaussian noise,
  and with batched members (low-rank);
- an in-place generation step / two decodes;
- plain greedy decoding of the prompts, ``LanguageModel.generate`` against transformers' ``model.generate``
  on the same left-padded batch (speed-up, and whether the tokens are the same), and whether the
  decoding step replayed as a CUDA graph gives the eager step's tokens, plain and with members;
- peak memory of inference, the MeZO scoring step and backprop + AdamW on the same batch (CUDA:
  ``torch.cuda.max_memory_allocated``; CPU: the process's peak RSS, reset between parts);
- with ``--count-ops``, the same comparisons in dispatched aten ops (``mezo_rl.opcount.OpCounter``):
  population ops / plain ops, step ops / forward ops.

Bad input is one line and exit status 2 before anything loads. Results: benchmarks/README.md, "The
engine at device speed".
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time

ARCHS = {
    # SmolLM2-135M(-Instruct): LlamaConfig, tied embeddings
    "smollm2-135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True),
    # SmolLM2-1.7B's shape
    "smollm2-1.7b": dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=32,
                         intermediate_size=8192, vocab_size=49152, tie_word_embeddings=True),
    # a 7B Llama's shape (Llama-2-7B)
    "llama-7b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                     intermediate_size=11008, vocab_size=32000, tie_word_embeddings=False),
    # a tiny Llama, for the tests of this script
    "tiny": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=64, vocab_size=512, tie_word_embeddings=True),
}
SECTIONS = ("decode", "score", "inplace", "generate", "memory")


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--arch", default="smollm2-135m", help=f"one of {', '.join(ARCHS)}")
    ap.add_argument("--members", default="2,8,32", help="population sizes M, comma-separated positive even numbers")
    ap.add_argument("--count-ops", action="store_true", help="also count dispatched aten ops")
    ap.add_argument("--no-time", action="store_true", help="op counts (and memory) only: skip the timings")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--score-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="auto", help="float32, bfloat16, or auto (bfloat16 on cuda, float32 on cpu)")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs of each part (the fastest is kept)")
    ap.add_argument("--eager-decode", action="store_true",
                    help="decode without CUDA graphs (each token's step dispatched op by op), for comparison")
    args = ap.parse_args(argv)
    if args.device not in ("cpu", "cuda"):
        raise SystemExit(f"--device must be cpu or cuda, got {args.device!r}")
    if args.arch not in ARCHS:
        raise SystemExit(f"unknown --arch {args.arch!r}; choices: {', '.join(ARCHS)}")
    try:
        members = [int(m) for m in args.members.split(",")]
    except ValueError:
        members = None
    if not members or any(m < 2 or m % 2 for m in members):
        raise SystemExit(f"--members takes positive even numbers (two-point members: +eps and -eps), got {args.members!r}")
    args.members = members
    if args.dtype not in ("auto", "float32", "bfloat16"):
        raise SystemExit(f"--dtype must be auto, float32 or bfloat16, got {args.dtype!r}")
    sections = args.sections.split(",")
    if any(s not in SECTIONS for s in sections):
        raise SystemExit(f"--sections takes {', '.join(SECTIONS)}, got {args.sections!r}")
    args.sections = sections
    for name in ("prompts", "new_tokens", "prompt_tokens", "score_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    return args


def fail(message: str) -> None:
    print(message, file=sys.stderr)
    raise SystemExit(2)


def word_tokenizer(vocab_size: int):
    """A whitespace word-level tokenizer whose vocabulary is the model's: token i is ``w<i>`` (0 pad, 1 eos)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<eos>")


def build(args):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from mezo_rl.model.lm import LanguageModel

    dtype = {"auto": torch.bfloat16 if args.device == "cuda" else torch.float32,
             "float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    cfg = LlamaConfig(**ARCHS[args.arch], max_position_embeddings=4096, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(args.device):  # random weights made where they run
            model = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(default)
    model.requires_grad_(True)
    tok = word_tokenizer(cfg.vocab_size)
    return LanguageModel(model, tok, batch_size=args.prompts), dtype


def texts(n, length, seed, vocab):
    import random

    rng = random.Random(seed)
    return [" ".join(f"w{rng.randrange(2, vocab)}" for _ in range(length)) for _ in range(n)]


class Meter:
    """Wall time (fastest of ``repeats``, the device synchronised) or dispatched aten ops of a callable."""

    def __init__(self, device, repeats):
        import torch

        self.torch, self.device, self.repeats = torch, device, repeats

    def sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def time(self, fn, after=None):
        """The fastest of ``repeats`` calls of ``fn`` after a warm-up; with ``after`` (read after each call, e.g. a
        time the call recorded inside itself), also the smallest value it read: ``(best, best_after)``."""
        fn()  # warm-up: allocations, kernels' first launch
        best = best_after = float("inf")
        for _ in range(self.repeats):
            self.sync()
            t = time.perf_counter()
            fn()
            self.sync()
            best = min(best, time.perf_counter() - t)
            if after is not None:
                best_after = min(best_after, after())
        return best if after is None else (best, best_after)

    @staticmethod
    def ops(fn):
        from mezo_rl.opcount import OpCounter

        fn()
        with OpCounter() as counter:
            fn()
        return counter.total


@contextlib.contextmanager
def eager_decoding(on: bool = True):
    """Within the block, ``LanguageModel.generate`` decodes without CUDA graphs (its plan otherwise unchanged)."""
    import dataclasses

    import mezo_rl.model.decoding as model_decoding

    plan = model_decoding.decode_plan
    if on:
        model_decoding.decode_plan = lambda *a, **k: dataclasses.replace(plan(*a, **k), graphed=False)
    try:
        yield
    finally:
        model_decoding.decode_plan = plan


def population(lm, args, meter, M, counting):
    """(plain, closure, step): plain decode of the M x prompts rows, the batched members' closure, the whole step."""
    from decoding import eos_only_kwargs
    from mezo_rl.engine.optim import MeZO
    from mezo_rl.engine.population import BatchedMembers
    from mezo_rl.opcount import OpCounter

    vocab = lm.model.config.vocab_size
    prompts = texts(args.prompts, args.prompt_tokens, 1, vocab)
    gen = dict(max_new_tokens=args.new_tokens, **eos_only_kwargs(lm))
    lm.batch_size = M * args.prompts

    def plain():
        lm.generate(prompts * M, **gen)

    lm_rows = args.prompts
    opt = MeZO([p for p in lm.model.parameters()], lr=0.0, eps=1e-3, n_spsa=M // 2, noise_backend="torch",
               member_evaluation=BatchedMembers(lm.model))
    inner = {"ops": 0, "time": 0.0}

    def closure(members):
        lm.batch_size = lm_rows
        if counting:
            with OpCounter() as c:
                lm.generate(prompts, members=len(members), **gen)
            inner["ops"] = c.total
        else:
            meter.sync()
            t = time.perf_counter()
            lm.generate(prompts, members=len(members), **gen)
            meter.sync()
            inner["time"] = time.perf_counter() - t
        return [0.0] * len(members)

    def step():
        opt.step(closure)

    if counting:
        p = meter.ops(plain)
        s = meter.ops(step)
        return p, inner["ops"], s
    p = meter.time(plain)
    best_step, best_closure = meter.time(step, after=lambda: inner["time"])
    return p, best_closure, best_step


def scoring(lm, args, meter, noise, counting, batched=False):
    """(two forwards, one scoring step): prompts x score-tokens tokens, one two-point sample; the step in place
    (the members' perturbations swept into the weights), or ``batched`` (``BatchedMembers``: both members in
    one forward on twice the rows, low-rank noise, no sweep but the update's)."""
    import torch

    from mezo_rl.engine.optim import MeZO
    from mezo_rl.engine.population import BatchedMembers

    vocab = lm.model.config.vocab_size
    prompts = texts(args.prompts, args.score_tokens - 1, 2, vocab)
    cands = [[" w5", " w6"]] * args.prompts
    lm.batch_size = args.prompts

    def loss():
        return float(sum(s.mean[0] for s in lm.score(prompts, cands)))

    def member_losses(members):
        per_member = lm.score(prompts, cands, members=len(members))
        return [float(sum(s.mean[0] for s in scores)) for scores in per_member]

    def forwards():
        with torch.no_grad():
            loss()
            loss()

    backend = "torch" if noise == "lowrank" or args.device == "cpu" else "auto"
    if batched:
        opt = MeZO(list(lm.model.parameters()), lr=0.0, eps=1e-3, noise=noise, noise_backend=backend,
                   member_evaluation=BatchedMembers(lm.model))
        step = lambda: opt.step(member_losses)  # noqa: E731
    else:
        opt = MeZO(list(lm.model.parameters()), lr=0.0, eps=1e-3, noise=noise, noise_backend=backend)
        step = lambda: opt.step(loss)  # noqa: E731
    measure = meter.ops if counting else meter.time
    return measure(forwards), measure(step)


def inplace_generation(lm, args, meter, counting):
    """(two decodes, one in-place generation step) of the prompts, greedy."""
    from decoding import eos_only_kwargs
    from mezo_rl.engine.optim import MeZO

    prompts = texts(args.prompts, args.prompt_tokens, 3, lm.model.config.vocab_size)
    gen = dict(max_new_tokens=args.new_tokens, **eos_only_kwargs(lm))
    lm.batch_size = args.prompts

    def two():
        lm.generate(prompts, **gen)
        lm.generate(prompts, **gen)

    opt = MeZO(list(lm.model.parameters()), lr=0.0, eps=1e-3, noise_backend="torch")
    step = lambda: opt.step(lambda: (lm.generate(prompts, **gen), 0.0)[1])
    measure = meter.ops if counting else meter.time
    return measure(two), measure(step)


def versus_generate(lm, args, meter):
    """``(ours, theirs, same)``: plain greedy decoding of the prompts by ``LanguageModel.generate`` and by
    transformers' ``model.generate`` on the same left-padded batch (EOS and padding ids the same), and whether
    the two wrote the same tokens."""
    prompts = texts(args.prompts, args.prompt_tokens, 4, lm.model.config.vocab_size)
    tok = lm.tokenizer
    tok.padding_side = "left"
    batch = tok(prompts, return_tensors="pt", padding=True).to(lm.device)
    lm.batch_size = args.prompts
    width = batch["input_ids"].shape[1]
    ours = lambda: lm.generate(prompts, max_new_tokens=args.new_tokens)  # noqa: E731
    theirs = lambda: lm.model.generate(**batch, max_new_tokens=args.new_tokens, do_sample=False,  # noqa: E731
                                       pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    same = ours() == [tok.decode(row[width:], skip_special_tokens=True) for row in theirs().tolist()]
    return meter.time(ours), meter.time(theirs), same


def graph_matches_eager(lm, args, M):
    """The share of rows whose greedy tokens are the same with the decoding step replayed as a CUDA graph as
    dispatched op by op: plain, and a population of M members (``BatchedMembers``, eps 1e-3)."""
    from mezo_rl.engine.optim import MeZO
    from mezo_rl.engine.population import BatchedMembers

    prompts = texts(args.prompts, args.prompt_tokens, 5, lm.model.config.vocab_size)
    lm.batch_size = args.prompts
    out = {}
    for eager in (False, True):
        with eager_decoding(eager):
            plain = lm.generate(prompts, max_new_tokens=args.new_tokens)
            blocks = []

            def closure(members):
                blocks.extend(lm.generate(prompts, members=len(members), max_new_tokens=args.new_tokens))
                return [0.0] * len(members)

            opt = MeZO(list(lm.model.parameters()), lr=0.0, eps=1e-3, n_spsa=M // 2, noise_backend="torch",
                       member_evaluation=BatchedMembers(lm.model), seed=7)
            opt.step(closure)
            out[eager] = (plain, [t for block in blocks for t in block])
    share = lambda a, b: sum(x == y for x, y in zip(a, b)) / len(a)  # noqa: E731
    return share(out[False][0], out[True][0]), share(out[False][1], out[True][1])


def peak_memory(lm, args):
    """Peak memory (bytes) of inference, a MeZO scoring step and backprop + AdamW, on the same batch."""
    import torch

    from mezo_rl.engine.optim import MeZO

    vocab = lm.model.config.vocab_size
    prompts = texts(args.prompts, args.score_tokens - 1, 2, vocab)
    cands = [[" w5", " w6"]] * args.prompts
    lm.batch_size = args.prompts

    def loss():
        return sum(s.mean[0] for s in lm.score(prompts, cands))

    def reset():
        if args.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        else:
            with open("/proc/self/clear_refs", "w") as f:  # resets the peak RSS (VmHWM) to the current RSS
                f.write("5")

    def peak():
        if args.device == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated()
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

    out = {}
    reset()
    with torch.no_grad():
        loss()
    out["inference"] = peak()
    opt = MeZO(list(lm.model.parameters()), lr=0.0, eps=1e-3, noise_backend="torch")
    reset()
    opt.step(lambda: float(loss()))
    out["MeZO step"] = peak()
    del opt
    adamw = torch.optim.AdamW(lm.model.parameters(), lr=1e-5)
    reset()
    try:
        loss().backward()
        adamw.step()
        out["backprop + AdamW"] = peak()
    except torch.OutOfMemoryError:
        out["backprop + AdamW"] = None
    adamw.zero_grad(set_to_none=True)
    del adamw
    lm.model.zero_grad(set_to_none=True)
    return out


def main(argv=None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # argparse's own errors exit 2 already; ours carry the line
        if isinstance(e.code, str):
            fail(e.code)
        raise
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: no CUDA device is available here (torch.cuda.is_available() is False); use --device cpu")
    lm, dtype = build(args)
    meter = Meter(args.device, args.repeats)
    eager = eager_decoding(args.eager_decode)  # held until main returns: the whole run
    eager.__enter__()
    n_params = sum(p.numel() for p in lm.model.parameters())
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"# {args.arch} ({n_params:,} parameters, random weights), {device}, {str(dtype).replace('torch.', '')}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.prompts} prompts of "
          f"{args.prompt_tokens} tokens, {args.new_tokens} new tokens (greedy"
          f"{', eager decoding' if args.eager_decode else ''}); scoring {args.prompts} x {args.score_tokens}")
    modes = ([] if args.no_time else [False]) + ([True] if args.count_ops else [])
    for counting in modes:
        unit = "aten ops" if counting else "time"
        if "decode" in args.sections:
            print(f"\npopulation decode, {unit}:" + (" population / plain (same rows)" if counting else
                                                     " plain / population (same rows; 1 = as fast as plain)"))
            for M in args.members:
                plain, closure, step = population(lm, args, meter, M, counting)
                if counting:
                    print(f"  M={M:3d}: plain {plain:9,d}  members' decode {closure:9,d} ({closure / plain:.2f}x)  "
                          f"whole step {step:9,d} ({step / plain:.2f}x)")
                else:
                    print(f"  M={M:3d}: plain {plain:8.3f} s  members' decode {closure:8.3f} s ({plain / closure:.2f})  "
                          f"whole step {step:8.3f} s ({plain / step:.2f})")
        if "score" in args.sections:
            for noise, batched in (("lowrank", False), ("gaussian", False), ("lowrank", True)):
                two, step = scoring(lm, args, meter, noise, counting, batched)
                fmt = (lambda v: f"{v:,d}") if counting else (lambda v: f"{v:.3f} s")
                how = "batched members" if batched else "in place"
                print(f"scoring step / two forwards, {noise} noise, {how}, {unit}: {fmt(step)} / {fmt(two)} = {step / two:.2f}")
        if "inplace" in args.sections:
            two, step = inplace_generation(lm, args, meter, counting)
            fmt = (lambda v: f"{v:,d}") if counting else (lambda v: f"{v:.3f} s")
            print(f"in-place generation step / two decodes, {unit}: {fmt(step)} / {fmt(two)} = {step / two:.2f}")
        if "generate" in args.sections and not counting:
            ours, theirs, same = versus_generate(lm, args, meter)
            print(f"plain decode, LanguageModel.generate / transformers' generate, time: {ours:.3f} s / {theirs:.3f} s "
                  f"(ours {theirs / ours:.2f}x as fast); same tokens: {'yes' if same else 'no'}")
            if args.device == "cuda" and not args.eager_decode:
                M = max(args.members)
                plain, members = graph_matches_eager(lm, args, M)
                print(f"CUDA graph step = eager step, rows with the same greedy tokens: plain {plain:.0%}, "
                      f"M={M} members {members:.0%}")
    if "memory" in args.sections:
        mem = peak_memory(lm, args)
        base = mem["inference"]
        kind = "max_memory_allocated" if args.device == "cuda" else "peak RSS"
        print(f"\npeak memory ({kind}, scoring batch {args.prompts} x {args.score_tokens}):")
        for name, value in mem.items():
            print(f"  {name:18s} " + ("out of memory" if value is None else f"{value / 2**30:7.2f} GiB ({value / base:.2f}x)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
