"""Callbacks with the Hugging Face contract: (args, state, control, **kwargs), a TrainerControl that stops
training or asks for an evaluation or a save, and transformers' own TrainerCallback subclasses."""
from __future__ import annotations

import json

import pytest

from mezo_rl.errors import ConfigError
from mezo_rl.training.callbacks import EarlyStoppingCallback, TrainerCallback
from test_trainer import factory, make_args, train  # noqa: F401  (factory is a fixture)


def records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_early_stopping_on_a_metric_ends_the_run_and_tests_the_best_step(tmp_path, factory):  # noqa: F811
    # learning rate 0: validation accuracy never improves on the step-0 value, so one evaluation of patience stops;
    # step 2 ties step 0, and a tie goes to the later step
    args = make_args(tmp_path, max_steps=12, eval_steps=2, learning_rate=0.0, metric_for_best_model="accuracy",
                     load_best_model_at_end=True)
    trainer, summary = train(args, factory, callbacks=[EarlyStoppingCallback(early_stopping_patience=1)])
    assert summary["steps"] == 2 and summary["stopped_early"] is True and summary["best_step"] == 2
    steps = [r["step"] for r in records(tmp_path / "run") if "split" not in r]
    assert steps == [1, 2]
    assert [r["step"] for r in records(tmp_path / "run") if r.get("split") == "test"] == [0, 2]
    ckpt = json.loads((tmp_path / "run" / "checkpoint" / "trainer_state.json").read_text())
    assert ckpt["global_step"] == 2  # the checkpoint is where training stopped: --resume would continue from it


def test_transformers_early_stopping_callback_works_unchanged(tmp_path, factory):  # noqa: F811
    transformers = pytest.importorskip("transformers")
    args = make_args(tmp_path, max_steps=12, eval_steps=2, learning_rate=0.0, metric_for_best_model="accuracy")  # as transformers asks
    _, summary = train(args, factory, callbacks=[transformers.EarlyStoppingCallback(early_stopping_patience=2)])
    assert summary["steps"] == 4 and summary["stopped_early"] is True


def test_a_transformers_callback_subclass_gets_args_state_control_and_steers_the_run(tmp_path, factory):  # noqa: F811
    transformers = pytest.importorskip("transformers")
    seen = []

    class Steer(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            seen.append(("begin", state.global_step, state.max_steps, kwargs["model"] is not None))

        def on_step_end(self, args, state, control, **kwargs):
            seen.append(("step", state.global_step))
            if state.global_step == 1:
                control.should_evaluate = True  # an evaluation now, though eval_steps is 3
            if state.global_step == 2:
                control.should_save = True
            return control

        def on_save(self, args, state, control, **kwargs):
            seen.append(("save", state.global_step))

        def on_log(self, args, state, control, logs=None, **kwargs):
            if "loss" in logs:
                seen.append(("log", state.global_step, sorted(k for k in logs if k.startswith("rewards/"))))

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            seen.append(("evaluate", state.global_step, "eval_accuracy" in metrics))

    _, summary = train(make_args(tmp_path, max_steps=3, eval_steps=3), factory, callbacks=[Steer()])
    assert seen[0] == ("begin", 0, 3, True)
    assert ("evaluate", 1, True) in seen and ("save", 1) in seen and ("save", 2) in seen and ("save", 3) in seen
    assert ("log", 1, ["rewards/cross_entropy/mean", "rewards/cross_entropy/std"]) in seen
    validations = [r["step"] for r in records(tmp_path / "run") if r.get("split") == "validation"]
    assert validations == [0, 1, 3]  # the requested evaluation at step 1, then eval_steps' own
    assert summary["stopped_early"] is False


def test_save_steps_writes_the_checkpoint_between_evaluations(tmp_path, factory):  # noqa: F811
    saved = []

    class Saves(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            saved.append(state.global_step)

    train(make_args(tmp_path, max_steps=6, eval_steps=6, save_steps=2), factory, callbacks=[Saves])  # a class is instantiated
    assert saved == [2, 4, 6]


def test_a_callback_object_without_hooks_is_one_line(tmp_path, factory):  # noqa: F811
    with pytest.raises(ConfigError, match="callback object: has none of the hooks on_init_end"):
        train(make_args(tmp_path), factory, callbacks=[object()])


def test_a_resumed_run_validates_first_where_a_callback_asks_at_train_begin(tmp_path, factory):  # noqa: F811
    """A run that died after its step-2 checkpoint, before the validation a callback wanted there (a time budget's
    mark passed in that step): resumed with a callback that asks at on_train_begin, it validates step 2 before
    going on; resumed without, it does not."""
    class DiesAtStep3(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 2:
                raise RuntimeError("the process died")

    class AsksAtBegin(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            control.should_evaluate = True

    for name, callbacks in (("asked", [AsksAtBegin()]), ("not", [])):
        args = dict(name=name, max_steps=3, eval_steps=100, save_steps=1)
        with pytest.raises(RuntimeError, match="died"):
            train(make_args(tmp_path, **args), factory, callbacks=[DiesAtStep3()])
        train(make_args(tmp_path, resume=True, **args), factory, callbacks=callbacks)
        validated = [r["step"] for r in records(tmp_path / name) if r.get("split") == "validation"]
        assert validated == ([0, 2, 3] if callbacks else [0, 3])
