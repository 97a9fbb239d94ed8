"""Why accuracy is hard for MeZO on SST-2, and which weights to perturb: margins before and under noise.

Prints, for the zero-shot model on the SST-2 test split, the margin m = mean log p(" great") -
mean log p(" terrible") per sentence (the prediction is m > 0), the accuracy at 0 and the accuracy of
the best threshold chosen on the test split itself (an oracle: how much of the gap is calibration).
Then, per trainable set (``--modes``: full / norm / lora / prefix), it perturbs the weights by
+eps z and -eps z (Rademacher z, one draw) and reports how the margins of the first 96 training
examples move: the mean shift (a coherent change the accuracy objective can reward) against the
per-example spread (noise), and how many predictions flip.

    MEZO_RL_DATA=DIR python benchmarks/sst2_margins.py --modes norm,prefix,lora --eps 0.1,1
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.training.setup import build_model, trainable_parameters
from mezo_rl.tasks import get_task


def margins(lm, examples, batch_size=32) -> np.ndarray:
    out = []
    with torch.no_grad():
        for i in range(0, len(examples), batch_size):
            batch = examples[i:i + batch_size]
            scores = lm.score([e.prompt for e in batch], [e.candidates for e in batch])
            out += [float(s.mean[1] - s.mean[0]) for s in scores]
    return np.array(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--modes", default="norm,prefix,lora", help="comma list of full, norm, lora, prefix")
    ap.add_argument("--eps", default="0.1,1", help="comma list of perturbation scales")
    ap.add_argument("--no-test", action="store_true", help="skip the zero-shot test-split margins")
    a = ap.parse_args()
    task = get_task("sst2")
    train = task.load_split("train", n=1000, seed=0)[:96]
    y_train = np.array([e.label for e in train])
    for i, mode in enumerate(a.modes.split(",")):
        lm = build_model(MeZOConfig(model=a.model, peft="none" if mode == "full" else mode))
        if i == 0 and not a.no_test:
            test = task.load_split("test")
            m, y = margins(lm, test), np.array([e.label for e in test])
            accs = [((m > t) == y).mean() for t in np.sort(m)]
            print(f"zero-shot test (n={len(test)}): accuracy {((m > 0) == y).mean():.3f}, predicted 'great' "
                  f"{(m > 0).mean():.3f}, margin quantiles 10/50/90% {np.quantile(m, [.1, .5, .9]).round(2)}, "
                  f"best threshold on the test split itself (oracle) {max(accs):.3f}")
        params = trainable_parameters(lm.model)
        m0 = margins(lm, train)
        print(f"{mode}: {sum(p.numel() for p in params):,} trainable weights; train[:96] accuracy {((m0 > 0) == y_train).mean():.3f}")
        for eps in (float(e) for e in a.eps.split(",")):
            g = torch.Generator().manual_seed(1)
            zs = [torch.randint(0, 2, p.shape, generator=g).to(p.dtype) * 2 - 1 for p in params]
            shifted = []
            for sign in (1.0, -2.0, 1.0):  # +eps, -eps, back to theta
                for p, z in zip(params, zs):
                    p.data.add_(z, alpha=sign * eps)
                if sign != 1.0 or not shifted:
                    shifted.append(margins(lm, train))
            for label, m in zip(("+eps", "-eps"), shifted):
                d = m - m0
                print(f"  eps {eps:g} {label}: margin shift mean {d.mean():+.3f}, per-example spread {d.std():.3f}, "
                      f"flips {int(((m > 0) != (m0 > 0)).sum())}/96, accuracy {((m > 0) == y_train).mean():.3f}")
        del lm


if __name__ == "__main__":
    main()
