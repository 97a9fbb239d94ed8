"""Run directories written before the issue-13 refactor still load, replay and resume (tests/data/run_v0).

The fixture was written by the trainer at commit 2380a84 (see tests/data/run_v0/README.md); its
expected.json holds the checksums of the weights that code produced. Replaying a stored trajectory
is exact whatever the thread count; resuming trains three more steps, whose float32 forward passes
depend on the reduction order, so that part runs single-threaded as the old code did.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import shutil

import numpy as np
import pytest
import torch

from conftest import make_tiny_causal_lm
from mezo_rl.model.lm import LanguageModel
from mezo_rl.training.rundir import TrainerState, load_run
from mezo_rl.training.arguments import TrainingArguments
from mezo_rl.training.trainer import Trainer
from mezo_rl.engine.trajectory import Trajectory
from tasks import get_task
from test_trainer import splits

FIXTURE = pathlib.Path(__file__).parent / "data" / "run_v0"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())


def digest(lm) -> str:
    h = hashlib.sha256()
    for name, p in lm.model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.fixture()
def factory(tiny_tokenizer):
    return lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)


@pytest.fixture()
def run_copy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the fixture's config.json says output_dir="run_v0"
    shutil.copytree(FIXTURE, tmp_path / "run_v0")
    return tmp_path / "run_v0"


def test_the_tiny_model_is_rebuilt_bit_for_bit(factory):
    assert digest(factory()) == digest(factory()) == EXPECTED["initial"]


def test_old_run_replays_to_the_weights_the_old_code_produced(run_copy, factory):
    for step in ("best", "final"):
        lm, args, n = load_run(run_copy, step, lm=factory())
        assert (n, digest(lm)) == (EXPECTED[step]["step"], EXPECTED[step]["sha256"]), step
    assert args.steps == 3 and args.reward == ["cross_entropy", "accuracy"]
    state = TrainerState.load(run_copy / "checkpoint" / "trainer_state.json")
    assert state.step == 3 and state.objective["names"] == ["cross_entropy", "accuracy"]


def test_old_run_resumes_along_the_trajectory_the_old_code_produced(run_copy, factory):
    """Resuming keeps the old steps as stored and continues with the old code's seeds and data.

    The three new steps are float32 forward passes, so their values may differ from the old code's
    by rounding whenever a dependency reorders a reduction (a transformers release did: the old
    fixture's checksums stopped matching with the old code itself). Seeds and stored steps are
    compared exactly; each new loss within ``K * u * |L|`` with u = 2**-24 and K = 400, the longest
    float32 reduction in the tiny model (the log-sum-exp over its 400-token vocabulary); each
    projected gradient within the resulting difference bound ``2 * tol_L / (2 * eps)``.
    """
    args = dataclasses.replace(TrainingArguments.from_dict(json.loads((run_copy / "config.json").read_text())),
                               steps=6, resume=True)
    stored = Trajectory.load(run_copy / "checkpoint" / "trajectory.npz")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        summary = Trainer(args, lm=factory(), lm_factory=factory, task=get_task("sst2"), splits=splits()).train()
    finally:
        torch.set_num_threads(threads)
    assert summary["validation"] == EXPECTED["resumed_summary_validation"]
    resumed = Trajectory.load(run_copy / "checkpoint" / "trajectory.npz")
    want = EXPECTED["resumed_trajectory"]
    assert resumed.column("seeds").tolist() == want["seeds"]
    for name in ("values", "projected_grads"):  # the old steps are kept, not recomputed
        assert np.array_equal(resumed.column(name)[:3], stored.column(name))
    values, grads = np.asarray(want["values"]), np.asarray(want["projected_grads"])
    tol_values = 400 * 2.0 ** -24 * np.abs(values[3:])
    assert np.all(np.abs(resumed.column("values")[3:] - values[3:]) <= tol_values)
    tol_grads = tol_values.sum(axis=1, keepdims=True) / (2 * args.eps)
    assert np.all(np.abs(resumed.column("projected_grads")[3:] - grads[3:]) <= tol_grads)
    lm, _, n = load_run(run_copy, "best", lm=factory())
    assert (n, digest(lm)) == (EXPECTED["resumed_best"]["step"], EXPECTED["resumed_best"]["sha256"])
    lm, _, n = load_run(run_copy, "final", lm=factory())
    assert n == EXPECTED["resumed_final"]["step"] == 6
