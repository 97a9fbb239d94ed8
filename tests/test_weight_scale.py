"""benchmarks/weight_scale.py: the RMS of a model's matrices, the scale --eps and --learning-rate are absolute against."""
import math
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
from weight_scale import scale  # noqa: E402


def test_the_scale_is_the_rms_over_every_matrix_entry_and_leaves_out_vectors():
    model = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Linear(2, 2))
    with torch.no_grad():
        model[0].weight.fill_(2.0)   # 8 entries of 2
        model[1].weight.fill_(-0.5)  # 4 entries of -0.5
        model[0].bias.fill_(100.0)   # a vector: not a matrix full mode perturbs entry by entry at a matrix's scale
    s = scale(model)
    assert s["matrices"] == 2
    assert math.isclose(s["rms"], math.sqrt((8 * 4.0 + 4 * 0.25) / 12))
    assert (s["matrix_rms_min"], s["matrix_rms_max"]) == (0.5, 2.0)
