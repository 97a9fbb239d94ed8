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

import pytest
import torch

from conftest import make_tiny_causal_lm
from mezo_rl.lm import LanguageModel
from mezo_rl.rundir import TrainerState, load_run
from mezo_rl.arguments import TrainingArguments
from mezo_rl.trainer import Trainer
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


def test_old_run_resumes_to_the_weights_the_old_code_produced(run_copy, factory):
    args = dataclasses.replace(TrainingArguments.from_dict(json.loads((run_copy / "config.json").read_text())),
                               steps=6, resume=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        summary = Trainer(args, lm=factory(), lm_factory=factory, task=get_task("sst2"), splits=splits()).train()
    finally:
        torch.set_num_threads(threads)
    assert summary["validation"] == EXPECTED["resumed_summary_validation"]
    for step in ("best", "final"):
        lm, _, n = load_run(run_copy, step, lm=factory())
        assert (n, digest(lm)) == (EXPECTED[f"resumed_{step}"]["step"], EXPECTED[f"resumed_{step}"]["sha256"]), step
