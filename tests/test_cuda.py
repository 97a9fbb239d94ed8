"""A run on a CUDA device: it trains, evaluates and exports there, and its checkpoint (seeds and projected
gradients) replays to the same weights on the CPU, up to float rounding, in every mode.

Skipped where no CUDA device is present (CI has none); run on a GPU machine with ``pytest tests/test_cuda.py``.
"""
from __future__ import annotations

import json

import pytest
import torch

from mezo_rl.cli.main import main
from mezo_rl.engine import noise
from mezo_rl.model.loading import load_model
from mezo_rl.training.rundir import load_run

DEVICE = "cuda"
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

EPS32 = torch.finfo(torch.float32).eps
STEPS = 3


@pytest.mark.parametrize("kind", ["gaussian", "rademacher"])
@pytest.mark.parametrize("backend", ["torch", "compiled"])
def test_element_wise_noise_is_the_same_numbers_on_cuda_and_on_the_cpu(kind, backend):
    key, numel = noise.tensor_key(7, 3, (64, 129)), 64 * 129
    cpu = noise.generate(key, numel, kind, backend, device="cpu")
    gpu = noise.generate(key, numel, kind, backend, device=DEVICE).cpu()
    if kind == "rademacher":
        assert torch.equal(cpu, gpu)
    else:
        # Box-Muller: sqrt, log and cos, each within 2 ulp on either device (IEEE fp32, CUDA's libdevice),
        # so z = sqrt(-2 log u1) cos(2 pi u2) agrees to a few ulp of |z| <= 6.
        torch.testing.assert_close(gpu, cpu, rtol=0, atol=8 * EPS32 * 6)


def test_low_rank_factors_are_the_same_numbers_on_cuda_and_on_the_cpu():
    p_cpu, p_gpu = torch.zeros(48, 40), torch.zeros(48, 40, device=DEVICE)
    spec = noise.NoiseSpec("lowrank", "torch", rank=2, layout=noise.layout([(0, p_cpu)]))
    for a, b in zip(spec.factors(p_cpu, 11, 0), spec.factors(p_gpu, 11, 0)):
        assert torch.equal(a, b.cpu())
    # a sweep from zero weights: 0.5 / sqrt(2) * B[:, q] A[:, q]^T summed over q on either device; each product and
    # each sum round once (a fused multiply-add rounds less): 3 roundings per term on each side, of the terms' size
    spec.axpy_(p_cpu, 11, 0, a=0.5)
    spec.axpy_(p_gpu, 11, 0, a=0.5)
    fb, fa = spec.factors(p_cpu, 11, 0)
    bound = 2 * 3 * (EPS32 / 2) * (0.5 / 2**0.5) * (fb.abs() @ fa.abs().t())
    assert ((p_gpu.cpu() - p_cpu).abs() <= bound + torch.finfo(torch.float32).tiny).all()


REWARD = '''
def reward_text(completions, **kwargs):  # a function of the text that a tiny random model's samples spread over
    return [float(sum(map(ord, c)) % 13) for c in completions]
'''


def _train(tmp_path, model_dir, peft, *extra):
    """A few steps of a prompt task on the device, with a reward the tiny model's completions spread over."""
    run = tmp_path / f"run-{peft}"
    (tmp_path / "rewards.py").write_text(REWARD)
    assert main(["train", "--model", str(model_dir), "--task", "arithmetic-plain",
                 "--reward", f"{tmp_path / 'rewards.py'}:reward_text", "--peft", peft,
                 "--device-map", DEVICE, "--max-steps", str(STEPS), "--eval-steps", str(STEPS),
                 "--per-device-train-batch-size", "4", "--num-train", "16", "--num-eval", "4", "--num-test", "8",
                 "--max-completion-length", "6", "--do-sample", "--learning-rate", "0.05", "--autocast", "none",
                 "--no-progress", "--output-dir", str(run), *extra]) == 0
    return run


@pytest.mark.parametrize("peft,extra", [("norm", ("--eps", "0.5")), ("lora", ("--eps", "0.5")),
                                        ("prefix", ("--eps", "5")), ("full", ()), ("full", ("--beta", "0.1"))],
                         ids=["norm", "lora", "prefix", "full", "full-beta"])
def test_a_cuda_run_replays_on_the_cpu_to_the_weights_it_trained(tmp_path, tiny_model_dir, capsys, peft, extra):
    run = _train(tmp_path, tiny_model_dir, peft, *extra)
    summary = json.loads((run / "summary.json").read_text())
    assert "kl" in summary["test"]

    on_gpu, args, n = load_run(run, "final")  # the recorded --device-map: replayed on the GPU
    assert n == STEPS and next(on_gpu.model.parameters()).device.type == DEVICE
    on_cpu, _, _ = load_run(run, "final", lm=load_model(str(tiny_model_dir)))
    start, _, _ = load_run(run, 0, lm=load_model(str(tiny_model_dir)))  # with the adapter at its start
    base = {k: v.detach().float() for k, v in start.model.state_dict().items()}
    gpu_state = {k: v.detach().cpu().float() for k, v in on_gpu.model.state_dict().items()}
    cpu_state = {k: v.detach().float() for k, v in on_cpu.model.state_dict().items()}
    assert gpu_state.keys() == cpu_state.keys()

    moved = max((cpu_state[k] - base[k]).abs().max().item() for k in cpu_state)
    largest = max(v.abs().max().item() for v in cpu_state.values())
    # Both replays apply the same recorded steps to the same start with the same noise numbers (the tests
    # above); they differ only by fp32 rounding: each step's update rounds a few times (<= 8 ulp of the
    # largest weight, noise transcendentals included), over STEPS steps.
    tol = STEPS * 8 * EPS32 * largest
    worst = max((gpu_state[k] - cpu_state[k]).abs().max().item() for k in cpu_state)
    assert moved > 100 * tol, f"the run did not move its weights ({moved}) beyond rounding"
    assert worst <= tol, f"CUDA and CPU replays differ by {worst} (rounding allows {tol})"

    capsys.readouterr()
    assert main(["eval", "--run-dir", str(run), "--split", "test", "--step", "final",
                 "--max-completion-length", "6"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["metrics"]["kl"] == pytest.approx(summary["test"]["kl"], abs=1e-6) or summary["best_step"] != STEPS
    assert main(["export", "--run-dir", str(run), "--step", "final", "--output", str(tmp_path / "exported")]) == 0
    written = {f.name for f in (tmp_path / "exported").iterdir()}
    assert {"config.json", "mezo_peft.json"} & written  # a prefix is exported as an adapter


@pytest.mark.parametrize("members", [None, 4])
def test_the_decoding_step_replayed_as_a_cuda_graph_writes_the_eager_steps_tokens(tiny_causal_lm, monkeypatch, members):
    """On CUDA the one-token step is recorded once per decode and replayed (LanguageModel.generate's plan); the
    replay runs the kernels the eager step runs, on the same inputs, so greedy decoding writes the same tokens,
    plain and for a population of batched members (their factors recorded with the step)."""
    import dataclasses

    import mezo_rl.model.decoding as decoding
    from mezo_rl.engine.optim import MeZO
    from mezo_rl.engine.population import BatchedMembers
    from mezo_rl.model.lm import LanguageModel

    model, tok = tiny_causal_lm
    model.to(DEVICE)
    lm = LanguageModel(model, tok)
    prompts = ["the movie was", "a b c d e f", "Yes"]
    assert decoding.decode_plan(model, DEVICE).graphed

    def decode():
        if members is None:
            return lm.generate(prompts, max_new_tokens=12)
        out = []

        def closure(ms):
            out.extend(lm.generate(prompts, max_new_tokens=12, members=len(ms)))
            return [0.0] * len(ms)

        MeZO(list(model.parameters()), lr=0.0, eps=1e-2, n_spsa=members // 2, noise_backend="torch",
             member_evaluation=BatchedMembers(model)).step(closure)
        return out

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a failed recording warns: here it must not fail
        graphed = decode()
    plan = decoding.decode_plan
    monkeypatch.setattr(decoding, "decode_plan", lambda *a, **k: dataclasses.replace(plan(*a, **k), graphed=False))
    assert decode() == graphed
