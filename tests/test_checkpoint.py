"""Checkpoints are safe and deterministic: nothing in a run directory is unpickled, a damaged file gets
one line naming it (and the directory is left as it is), and a resumed run writes the very bytes an
uninterrupted one does.

Runs use the tiny causal LM and the hand-made SST-2-style splits of tests/test_trainer.py.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import pickle
import shutil

import numpy as np
import pytest
import torch

from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.training.rundir import (CHECKPOINT_DIR, LEGACY_OPTIMIZER_FILE, OPTIMIZER_FILE, OPTIMIZER_TENSORS_FILE, STATE_FILE,
                            TRAJECTORY_FILE, CheckpointError, read_checkpoint, read_trajectory)
from mezo_rl.training.trainer import MeZOTrainer
from test_cli_errors import assert_one_line_error, run_cli
from test_trainer import factory, make_args, train  # noqa: F401  (factory: a fixture)

def files(run: pathlib.Path) -> dict[str, bytes]:
    """Every file under ``run``, by relative path."""
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


class Payload:
    """Unpickling this object creates ``marker``: the proof that a loader ran code from a file."""

    def __init__(self, marker: pathlib.Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


@pytest.fixture()
def fixed_clock(monkeypatch):
    # the wall time is measured, not computed: freeze it so that every other byte can be compared
    monkeypatch.setattr(MeZOTrainer, "wall_time", lambda self: 0.0)


@pytest.mark.parametrize("variant", [dict(momentum=0.9), dict(adam=True), dict(hessian_smooth=0.3)])
def test_a_resumed_run_writes_the_bytes_of_an_uninterrupted_one(tmp_path, factory, fixed_clock, variant):
    common = dict(eval_steps=2, **variant)
    train(make_args(tmp_path, "whole", max_steps=4, **common), factory)
    train(make_args(tmp_path, "parts", max_steps=2, **common), factory)
    train(make_args(tmp_path, "parts", max_steps=4, resume=True, **common), factory)
    whole, parts = (files(tmp_path / run / CHECKPOINT_DIR) for run in ("whole", "parts"))
    assert sorted(whole) == sorted([OPTIMIZER_FILE, OPTIMIZER_TENSORS_FILE, STATE_FILE, TRAJECTORY_FILE, "model.json"])
    for name in whole:
        assert whole[name] == parts[name], name


def as_recorded_before_the_renames(run: pathlib.Path) -> None:
    """Rewrite ``run``'s records under the names an earlier mezo-rl wrote (issue 69: one word, one meaning):
    ``evaluation`` for ``member_evaluation`` in training_args.json; MeZO's ``evaluation`` and ``normalize`` for
    ``member_evaluation`` and ``step_normalize`` in optimizer.json (config, param groups) and the trajectory's header;
    the objective's ``normalize`` for ``reward_scale`` in trainer_state.json."""
    def old(d, names):
        return {names.get(k, k): v for k, v in d.items()}

    engine = {"member_evaluation": "evaluation", "step_normalize": "normalize"}
    config = run / "training_args.json"
    config.write_text(json.dumps(old(json.loads(config.read_text()), {"member_evaluation": "evaluation"})))
    ckpt = run / CHECKPOINT_DIR
    saved = json.loads((ckpt / OPTIMIZER_FILE).read_text())
    saved["mezo"]["config"] = old(saved["mezo"]["config"], engine)
    saved["param_groups"] = [old(g, engine) for g in saved["param_groups"]]
    (ckpt / OPTIMIZER_FILE).write_text(json.dumps(saved))
    state = json.loads((ckpt / STATE_FILE).read_text())
    own = state["stateful_callbacks"]["MeZOTrainer"]
    own["objective"] = old(own["objective"], {"reward_scale": "normalize"})
    (ckpt / STATE_FILE).write_text(json.dumps(state))
    trajectory = read_trajectory(ckpt / TRAJECTORY_FILE)
    trajectory.header = old(trajectory.header, engine)
    trajectory.save(ckpt / TRAJECTORY_FILE)
    assert "evaluation" in json.loads(config.read_text()) and "normalize" in read_trajectory(ckpt / TRAJECTORY_FILE).header
    assert "normalize" in json.loads((ckpt / STATE_FILE).read_text())["stateful_callbacks"]["MeZOTrainer"]["objective"]


@pytest.mark.parametrize("variant", [dict(momentum=0.9, member_evaluation="inplace"),
                                     dict(adam=True, member_evaluation="batched", noise="lowrank", reward_scale="std")])
def test_a_run_recorded_under_the_earlier_names_resumes_with_the_bytes_of_an_uninterrupted_one(tmp_path, factory,
                                                                                                fixed_clock, variant):
    """A run directory written before the renames (its records say ``evaluation`` and ``normalize``) is history,
    read under the new names: it resumes and writes the bytes an uninterrupted run
    writes (the new names)."""
    common = dict(eval_steps=2, **variant)
    train(make_args(tmp_path, "whole", max_steps=4, **common), factory)
    train(make_args(tmp_path, "parts", max_steps=2, **common), factory)
    as_recorded_before_the_renames(tmp_path / "parts")
    train(make_args(tmp_path, "parts", max_steps=4, resume=True, **common), factory)
    whole, parts = (files(tmp_path / run / CHECKPOINT_DIR) for run in ("whole", "parts"))
    for name in whole:
        assert whole[name] == parts[name], name


@pytest.fixture()
def plain_run(tmp_path, factory):
    """A finished 2-step run of plain MeZO (no optimizer buffers)."""
    train(make_args(tmp_path, "plain", max_steps=2, eval_steps=2), factory)
    return tmp_path / "plain"


def test_a_checkpoint_from_before_the_safe_format_is_refused_in_one_line(plain_run):
    ckpt = plain_run / CHECKPOINT_DIR
    (ckpt / OPTIMIZER_FILE).unlink()
    torch.save({"optimizer": {}, "scheduler": {}}, ckpt / LEGACY_OPTIMIZER_FILE)
    before = files(plain_run)
    with pytest.raises(CheckpointError, match="not supported") as err:
        read_checkpoint(plain_run)
    assert "\n" not in str(err.value) and LEGACY_OPTIMIZER_FILE in str(err.value)
    assert files(plain_run) == before


def test_a_pickle_payload_is_refused_without_running_it(tmp_path, plain_run):
    marker = tmp_path / "payload-ran"
    run = plain_run
    ckpt = run / CHECKPOINT_DIR
    (ckpt / OPTIMIZER_FILE).unlink()
    for payload in (lambda p: torch.save({"optimizer": Payload(marker), "scheduler": {}}, p),  # a torch zip
                    lambda p: p.write_bytes(pickle.dumps({"optimizer": Payload(marker)}))):   # a bare pickle
        payload(ckpt / LEGACY_OPTIMIZER_FILE)
        before = files(run)
        with pytest.raises(CheckpointError, match=LEGACY_OPTIMIZER_FILE) as err:
            read_checkpoint(run)
        assert "\n" not in str(err.value) and files(run) == before
        assert not marker.exists()
    # the trajectory is read with allow_pickle=False: an object array in it is refused, never built
    np.savez(ckpt / TRAJECTORY_FILE, format=np.array("mezo-rl-trajectory/1"),
             header=np.array([Payload(marker)], dtype=object))
    with pytest.raises(CheckpointError, match=TRAJECTORY_FILE):
        read_trajectory(ckpt / TRAJECTORY_FILE)
    assert not marker.exists()


@pytest.fixture(scope="module")
def momentum_run(tmp_path_factory, tiny_tokenizer):
    """A finished 2-step run with momentum buffers (optimizer.safetensors), to damage copies of."""
    from conftest import make_tiny_causal_lm
    from mezo_rl.model.lm import LanguageModel

    tmp = tmp_path_factory.mktemp("momentum")
    make = lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)  # noqa: E731
    train(make_args(tmp, "run", max_steps=2, eval_steps=2, momentum=0.9), make)
    return tmp / "run"


@pytest.mark.parametrize("name", [OPTIMIZER_FILE, OPTIMIZER_TENSORS_FILE, STATE_FILE, TRAJECTORY_FILE])
def test_a_damaged_checkpoint_file_gets_one_line_and_is_left_as_it_is(tmp_path, momentum_run, name):
    run = tmp_path / "run"
    shutil.copytree(momentum_run, run)
    path = run / CHECKPOINT_DIR / name
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # truncated
    before = files(run)
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(run)
    message = str(err.value)
    assert str(path) in message and "--overwrite-output-dir" in message and "\n" not in message
    assert files(run) == before


def test_resume_from_a_damaged_checkpoint_is_one_line_on_the_command_line(tmp_path, tiny_model_dir, data_dir,
                                                                          capsys):
    out = tmp_path / "run"
    argv = ["train", "--model", tiny_model_dir, "--task", "sst2", "--data-dir", data_dir, "--max-steps", "1",
            "--per-device-train-batch-size", "2", "--num-train", "8", "--num-eval", "4", "--num-test", "2", "--learning-rate", "1e-3",
            "--autocast", "none", "--no-progress", "--peft", "full", "--output-dir", out]
    assert run_cli(argv, capsys)[0] == 0
    optimizer = out / CHECKPOINT_DIR / OPTIMIZER_FILE
    optimizer.write_text(optimizer.read_text()[:40])
    before = files(out)
    rc, _, err = run_cli([*argv[:-2], "--max-steps", "2", "--resume", "--output-dir", out], capsys)
    assert_one_line_error(rc, err, optimizer)
    assert files(out) == before
