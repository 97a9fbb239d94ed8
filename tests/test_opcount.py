"""The aten operator counter: what it counts is what the code dispatches, independent of the values."""
import torch

from mezo_rl.opcount import OpCounter


def test_counts_each_dispatched_operator_by_name():
    a, b = torch.randn(4, 3), torch.randn(3, 5)
    with OpCounter() as ops:
        c = a @ b
        c.add_(1.0)
        c.relu()
    assert ops.counts["aten.mm"] == 1 and ops.counts["aten.add_"] == 1 and ops.counts["aten.relu"] == 1
    assert ops.total == 3


def test_a_python_loop_costs_one_operator_per_iteration_and_a_batched_op_one():
    x, ws = torch.randn(8, 2, 16), torch.randn(8, 16, 4)
    with OpCounter() as looped:
        out_loop = torch.stack([x[k] @ ws[k] for k in range(8)])
    with OpCounter() as batched:
        out_bmm = torch.bmm(x, ws)
    assert looped.counts["aten.mm"] == 8 and batched.total == 1
    torch.testing.assert_close(out_loop, out_bmm)
