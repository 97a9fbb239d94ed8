"""benchmarks/device_speed.py: bad input is one line and exit 2 before anything loads; --count-ops on a tiny
random Llama prints every ratio (the members' decode within the op-count bound)."""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))  # as `python benchmarks/device_speed.py` sees it

import device_speed  # noqa: E402


@pytest.mark.parametrize("argv, line", [
    (["--arch", "gpt-9"], "unknown --arch 'gpt-9'; choices: smollm2-135m, smollm2-1.7b, llama-7b, tiny"),
    (["--members", "2,3"], "--members takes positive even numbers (two-point members: +eps and -eps), got '2,3'"),
    (["--members", "0"], "--members takes positive even numbers (two-point members: +eps and -eps), got '0'"),
    (["--members", "-2"], "--members takes positive even numbers (two-point members: +eps and -eps), got '-2'"),
    (["--device", "tpu"], "--device must be cpu or cuda, got 'tpu'"),
])
def test_bad_input_is_one_line_and_exit_2_before_anything_loads(argv, line):
    code = ("import sys; sys.path.insert(0, 'benchmarks'); import device_speed\n"
            "try:\n    device_speed.main(sys.argv[1:])\n"
            "finally:\n    assert 'transformers' not in sys.modules and 'mezo_rl.model.lm' not in sys.modules\n")
    res = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.splitlines() == [line]


def test_cuda_without_cuda_is_one_line(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        device_speed.main(["--device", "cuda", "--arch", "tiny"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "--device cuda: no CUDA device is available here (torch.cuda.is_available() is False); use --device cpu"]


def test_count_ops_on_a_tiny_llama_prints_every_ratio(capsys):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert device_speed.main(["--arch", "tiny", "--count-ops", "--no-time", "--members", "2,4", "--prompts", "2",
                                  "--new-tokens", "4", "--prompt-tokens", "6", "--score-tokens", "12"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    # (the bound on these ratios is tests/test_op_counts.py's; a 2-prompt, 4-token decode is mostly fixed cost)
    ratios = [float(r) for r in re.findall(r"members' decode +[\d,]+ \(([\d.]+)x\)", out)]
    assert len(ratios) == 2 and all(1 < r < 2 for r in ratios)
    steps = re.findall(r"scoring step / two forwards, (lowrank|gaussian) noise, (in place|batched members), aten ops: "
                       r"[\d,]+ / [\d,]+ = ", out)
    assert steps == [("lowrank", "in place"), ("gaussian", "in place"), ("lowrank", "batched members")]
    assert "in-place generation step / two decodes, aten ops:" in out
    for part in ("inference", "MeZO step", "backprop + AdamW"):
        assert re.search(rf"  {re.escape(part)} +\d+\.\d\d GiB \(\d+\.\d\dx\)", out)
