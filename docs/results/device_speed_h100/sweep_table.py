"""The in-place Gaussian scoring step with the compiled noise backend, one process, one model: each sweep's keys and
coefficients sent to the device as one table (``NoiseSpec._compiled_sweep_``) against a copy per tensor (the
kernel called through ``axpy_``, as before), interleaved, against two forward passes.

    python docs/results/device_speed_h100/sweep_table.py --device cuda --arch smollm2-135m,smollm2-1.7b
"""
import argparse
import statistics
import sys
import time

sys.path.insert(0, "benchmarks")
import device_speed as ds  # noqa: E402
import torch  # noqa: E402

from mezo_rl.engine import noise  # noqa: E402
from mezo_rl.engine.optim import MeZO  # noqa: E402


def per_tensor(self, tensors, seed, coefs):
    for (index, p), (a, b, c) in zip(tensors, coefs):
        noise.axpy_(p, noise.tensor_key(seed, index, p.shape), self.kind, self.backend, a=a, b=b, c=c)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--arch", default="tiny")
    ap.add_argument("--repeats", type=int, default=10)
    a = ap.parse_args()
    table = noise.NoiseSpec._compiled_sweep_
    for arch in a.arch.split(","):
        args = ds.parse(["--device", a.device, "--arch", arch, "--sections", "score"])
        lm, dtype = ds.build(args)
        prompts = ds.texts(args.prompts, args.score_tokens - 1, 2, lm.model.config.vocab_size)
        cands = [[" w5", " w6"]] * args.prompts
        lm.batch_size = args.prompts

        def loss():
            return float(sum(s.mean[0] for s in lm.score(prompts, cands)))

        opt = MeZO(list(lm.model.parameters()), lr=0.0, eps=1e-3, noise="gaussian", noise_backend="compiled")
        sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)

        def timed(fn):
            sync()
            t = time.perf_counter()
            fn()
            sync()
            return time.perf_counter() - t

        def two():
            with torch.no_grad():
                loss()
                loss()

        def sweeps():  # the step's three sweeps alone (+eps, -2 eps, restore and update)
            ts = list(enumerate(opt.param_groups[0]["params"]))
            opt._noise.sweep_(ts, 1, [(1e-3, 0.0, 1.0)] * len(ts))
            opt._noise.sweep_(ts, 1, [(-2e-3, 0.0, 1.0)] * len(ts))
            opt._noise.sweep_(ts, 1, [(1e-3, 0.0, 1.0)] * len(ts))

        got = {k: [] for k in ("two forwards", "step, table", "step, per tensor", "3 sweeps, table",
                               "3 sweeps, per tensor")}
        for r in range(a.repeats + 1):  # the first round warms up (compiles), not kept
            for name, impl in (("table", table), ("per tensor", per_tensor)):
                noise.NoiseSpec._compiled_sweep_ = impl
                t_step = timed(lambda: opt.step(loss))
                t_sw = timed(sweeps)
                if r:
                    got[f"step, {name}"].append(t_step)
                    got[f"3 sweeps, {name}"].append(t_sw)
            t_two = timed(two)
            if r:
                got["two forwards"].append(t_two)
        noise.NoiseSpec._compiled_sweep_ = table
        n = sum(p.numel() for p in lm.model.parameters())
        dev = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
        print(f"# {arch} ({n:,} parameters, {len(list(lm.model.parameters()))} tensors), {dev}, {dtype}, torch "
              f"{torch.__version__}; scoring {args.prompts} x {args.score_tokens}; {a.repeats} interleaved rounds")
        two_min = min(got["two forwards"])
        for k, v in got.items():
            print(f"  {k:22s} min {min(v):.4f} s  median {statistics.median(v):.4f} s  min / two forwards' min "
                  f"{min(v) / two_min:.2f}")


if __name__ == "__main__":
    main()
