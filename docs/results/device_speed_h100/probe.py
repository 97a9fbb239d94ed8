"""Where a scoring step's and a population decode's extra time goes on a GPU: one process per shape.

    python docs/results/device_speed_h100/probe.py smollm2-135m smollm2-1.7b

Prints, for low-rank noise in place (the default): two forwards, the step, and the step's parts timed on their own
(the host's draw of the factors, their copy to the device, one sweep: time to return and time to finish), the step's
profile (top ops by host time and by device time), a sweep recorded as a CUDA graph and replayed, then a
population decode at M = 8 (plain / members, CUDA graph), the time to record a decode's graph, and the device time
by op of one eager decode, plain and members. Random weights (benchmarks/device_speed.py's shapes); the numbers
are timing only.
"""
import os
import sys
import time

sys.path[:0] = [os.path.join(os.path.dirname(__file__), "..", "..", ".."),
                os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmarks")]

import torch  # noqa: E402

import device_speed as ds  # noqa: E402
from mezo_rl.engine import noise as nz  # noqa: E402
from mezo_rl.engine.optim import MeZO  # noqa: E402
from mezo_rl.model.cuda_graph import DecodeGraph  # noqa: E402


DEVICE = os.environ.get("PROBE_DEVICE", "cuda")  # cpu: a smoke test of this script (no graphs, host profile only)
ACTIVITIES = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if DEVICE == "cuda" else [])


METER = ds.Meter(DEVICE, 5)  # the fastest of 5 timed calls after a warm-up, the device synchronised
sync, best = METER.sync, METER.time


def table(prof, key, n):
    rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:n]
    for e in rows:
        print(f"    {e.key[:48]:48s} calls {e.count:6d}  self cpu {e.self_cpu_time_total / 1e3:8.2f} ms  "
              f"self device {getattr(e, 'self_device_time_total', 0) / 1e3:8.2f} ms")


def graph_sweep(spec, tensors, dtype, device):
    """A sweep ``p <- p + s z`` of every tensor recorded once as a CUDA graph: static device buffers for the factors,
    the scale a device scalar; replayed after copying a new draw in. Returns (load(seed, s), replay)."""
    draw = spec._draw(12345)
    static_b = draw.b.to(device=device, dtype=dtype)
    static_a = draw.a.to(device=device, dtype=dtype)
    scale = torch.ones((), device=device, dtype=torch.float32)
    mats = [(p, spec._position(i, p)[1], 1.0 / spec.rank ** 0.5) for i, p in tensors if p.dim() >= 2]
    vecs = [(p, spec._position(i, p)[1], 1.0) for i, p in tensors if p.dim() < 2]

    def run():
        fake = object.__new__(nz._Draw)
        fake.spec, fake.b, fake.a, fake._views = spec, static_b * scale, static_a, {}
        spec._apply(fake, dtype, device, [], mats, vecs)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        run()
        side.synchronize()
        graph.capture_begin()
        run()
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(side)
    sync()

    def load(seed, s):
        d = spec._draw(seed)
        static_b.copy_(d.b)
        static_a.copy_(d.a)
        scale.fill_(s)

    return load, graph.replay


def scoring_probe(lm, args):
    vocab = lm.model.config.vocab_size
    prompts = ds.texts(args.prompts, args.score_tokens - 1, 2, vocab)
    cands = [[" w5", " w6"]] * args.prompts
    lm.batch_size = args.prompts

    def loss():
        return float(sum(s.mean[0] for s in lm.score(prompts, cands)))

    with torch.no_grad():
        one = best(loss)
    opt = MeZO(list(lm.model.parameters()), lr=0.0, eps=1e-3, noise="lowrank", noise_backend="torch")
    step = best(lambda: opt.step(loss))
    print(f"  one forward {one * 1e3:.1f} ms; scoring step {step * 1e3:.1f} ms = {step / (2 * one):.2f}x two forwards")
    spec, dev, dtype = opt._noise, lm.device, next(lm.model.parameters()).dtype
    entries = opt._prepare()
    tensors = [(i, p) for i, p, _ in entries]
    coefs = [(1e-3, 0.0, 1.0)] * len(tensors)
    seeds = iter(range(10**6, 10**7))
    t_draw = best(lambda: nz._Draw(spec, next(seeds)))
    d = spec._draw(77)

    def views():
        d._views.clear()
        d.views(dtype, dev)
    t_views = best(views)
    host = []

    def sweep():
        t = time.perf_counter()
        spec.sweep_(tensors, 77, coefs)
        host.append(time.perf_counter() - t)
    t_sweep = best(sweep)
    print(f"  {len(tensors)} tensors; draw (host) {t_draw * 1e3:.1f} ms; factors to the device {t_views * 1e3:.1f} ms; "
          f"one sweep: returns after {min(host) * 1e3:.1f} ms, done after {t_sweep * 1e3:.1f} ms")
    if DEVICE == "cuda":
        load, replay = graph_sweep(spec, tensors, dtype, dev)
        t_replay = best(replay)
        t_load_replay = best(lambda: (load(next(seeds), 1e-3), replay()))
        print(f"  graph sweep: replay {t_replay * 1e3:.1f} ms; new draw + copy + replay {t_load_replay * 1e3:.1f} ms")
    opt.step(loss)
    sync()
    with torch.profiler.profile(activities=ACTIVITIES) as prof:
        opt.step(loss)
        sync()
    print("  step profile, by host time:")
    table(prof, "self_cpu_time_total", 14)
    print("  step profile, by device time:")
    table(prof, "self_device_time_total", 8)


def decode_probe(lm, args):
    meter = ds.Meter(DEVICE, 3)
    plain, closure, step = ds.population(lm, args, meter, 8, False)
    print(f"  M=8 graph decode: plain {plain:.3f} s, members' decode {closure:.3f} s ({plain / closure:.2f}), "
          f"whole step {step:.3f} s ({plain / step:.2f})")
    rec, orig = [], DecodeGraph.record

    def timed(*a, **k):
        sync()
        t = time.perf_counter()
        out = orig(*a, **k)
        sync()
        rec.append(time.perf_counter() - t)
        return out
    DecodeGraph.record = timed
    try:
        ds.population(lm, args, ds.Meter(DEVICE, 1), 8, False)
    finally:
        DecodeGraph.record = orig
    print(f"  recording a decode's graph (eager step + capture): {', '.join(f'{t * 1e3:.1f}' for t in rec)} ms")
    from decoding import eos_only_kwargs
    from mezo_rl.engine.population import BatchedMembers

    prompts = ds.texts(args.prompts, args.prompt_tokens, 1, lm.model.config.vocab_size)
    gen = dict(max_new_tokens=args.new_tokens, **eos_only_kwargs(lm))
    opt = MeZO(list(lm.model.parameters()), lr=0.0, eps=1e-3, n_spsa=4, noise_backend="torch",
               evaluation=BatchedMembers(lm.model))
    with ds.eager_decoding(True):
        for name in ("plain", "members"):
            def run():
                if name == "plain":
                    lm.batch_size = 8 * args.prompts
                    lm.generate(prompts * 8, **gen)
                else:
                    lm.batch_size = args.prompts
                    opt.step(lambda members: (lm.generate(prompts, members=len(members), **gen), [0.0] * 8)[1])
            run()
            sync()
            with torch.profiler.profile(activities=ACTIVITIES) as prof:
                run()
                sync()
            total = sum(e.self_device_time_total for e in prof.key_averages()) / 1e3
            print(f"  eager decode {name}: device time {total:.1f} ms; by device time:")
            table(prof, "self_device_time_total", 10)


@torch.no_grad()
def main():
    for arch in sys.argv[1:]:
        args = ds.parse(["--device", DEVICE, "--arch", arch] + (["--prompts", "2", "--new-tokens", "4"] if DEVICE == "cpu" else []))
        lm, dtype = ds.build(args)
        print(f"# {arch}, {torch.cuda.get_device_name() if DEVICE == 'cuda' else 'cpu'}, {dtype}, torch {torch.__version__}, "
              f"{sum(p.numel() for p in lm.model.parameters()):,} parameters", flush=True)
        scoring_probe(lm, args)
        sys.stdout.flush()
        decode_probe(lm, args)
        sys.stdout.flush()
        del lm
        if DEVICE == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
