"""What a MeZO scoring step dispatches beyond its forward passes, in aten operators, as the number of trainable
tensors grows (a random tiny Llama of 2 and 8 layers; the counts do not depend on the weights' values or the CPU).

    python benchmarks/sweep_ops.py [--layers 2 8]
    python benchmarks/sweep_ops.py --model smollm2-135m     # the default step on a real model, 2 x 8 tokens

Per row (an optimizer configuration) and model: the operators of one in-place step whose closure is a forward
pass and its cross-entropy (after a first step), over those of its closure's forward passes (two per noise
sample), and the difference: the sweeps' own operators (mezo_rl.opcount.OpCounter). On a GPU each operator is
at least one kernel launch, so the ratio is what a launch-bound step costs over its forwards (docs/engine.md,
"Fused sweeps").
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from mezo_rl.engine.optim import MeZO
from mezo_rl.opcount import OpCounter

ROWS = {
    "default (low-rank r = 1)": {},
    "weight decay 0.1": dict(weight_decay=0.1),
    "n_spsa = 2": dict(n_spsa=2),
    "momentum 0.9": dict(momentum=0.9),
    "Gaussian, torch backend": dict(noise="gaussian", noise_backend="torch"),
}


def tiny_llama(layers: int):
    """The tests' tiny Llama shape (hidden 32, 4 heads, 2 key/value heads, tied embeddings), random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval()


def count(model, options: dict, shape=(4, 16)) -> tuple[int, int, int]:
    """(trainable tensors, operators of the closure's forwards, operators of the step) of ``model``."""
    ids = torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(0))

    def loss():
        return F.cross_entropy(model(input_ids=ids).logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())

    opt = MeZO(model.parameters(), lr=1e-3, eps=1e-3, **options)
    opt.step(loss)
    with torch.no_grad(), OpCounter() as forward:
        loss()
    with OpCounter() as step:
        opt.step(loss)
    return len(list(model.parameters())), opt.members_per_step * forward.total, step.total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--model", help="count the default step of this model (load_model name) instead")
    args = ap.parse_args()
    if args.model:
        from mezo_rl.model.loading import load_model

        tensors, forwards, step = count(load_model(args.model).model, {}, shape=(2, 8))
        print(f"{args.model}, default step, 2 x 8 tokens: {step} / {forwards} = {step / forwards:.3f} "
              f"(+{step - forwards}; {tensors} tensors)")
        return
    print("| step | " + " | ".join(f"{n} layers: step / forwards (sweeps)" for n in args.layers) + " |")
    print("|---|" + "---:|" * len(args.layers))
    for name, options in ROWS.items():
        cells = []
        for n in args.layers:
            tensors, forwards, step = count(tiny_llama(n), options)
            cells.append(f"{step} / {forwards} = {step / forwards:.3f} (+{step - forwards}; {tensors} tensors)")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
