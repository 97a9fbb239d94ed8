"""One resolver: ``plan_run`` decides every value once (user, default, task default, mode default, derived,
resumed run), ``explain`` prints each with its source, ``mezo-rl train --dry-run`` prints it before any model
loads, and a resumed run's directory is read once, by the plan."""
from __future__ import annotations

import collections
import pathlib

import pytest

from conftest import make_tiny_causal_lm

datasets = pytest.importorskip("datasets")

from mezo_rl import MeZOConfig  # noqa: E402
from mezo_rl.cli import plots  # noqa: E402
from mezo_rl.cli.main import main  # noqa: E402
from mezo_rl.model.lm import LanguageModel  # noqa: E402
from mezo_rl.tasks import get_task  # noqa: E402
from mezo_rl.training import rundir  # noqa: E402
from mezo_rl.training.defaults import MODE_DEFAULTS, PROMPT_TASK_DEFAULTS  # noqa: E402
from mezo_rl.training.plan import plan_given  # noqa: E402
from mezo_rl.training.resolve import explain  # noqa: E402
from mezo_rl.training.trainer import MeZOTrainer  # noqa: E402
from test_trainer import make_args, splits  # noqa: E402


def sources(plan) -> dict:
    """``explain(plan)`` read back: field -> (value as printed, source)."""
    out = {}
    for line in explain(plan).splitlines():
        name, rest = line.split(None, 1)
        value, source = rest.rsplit("  ", 1)
        out[name] = (value.strip(), source.strip())
    return out


def brevity(prompts, completions, **columns):
    return [-len(c) for c in completions]


def counted_reads(run: pathlib.Path, monkeypatch) -> collections.Counter:
    """Reads of each file under ``run`` from here on (its path under ``run`` -> count): text and JSON files, the
    trajectory, and the optimizer's buffers (the header check that opens their file without reading them aside)."""
    reads, run = collections.Counter(), pathlib.Path(run)
    read_text, read_trajectory, read_tensors = pathlib.Path.read_text, rundir.read_trajectory, rundir.read_optimizer_tensors

    def counted_text(path, *a, **k):
        if run in pathlib.Path(path).absolute().parents:
            reads[pathlib.Path(path).relative_to(run).as_posix()] += 1
        return read_text(path, *a, **k)

    def counted_trajectory(path):
        reads[pathlib.Path(path).relative_to(run).as_posix()] += 1
        return read_trajectory(path)

    def counted_tensors(ckpt, names, *, load=True):
        if load and names:
            reads["checkpoint/" + rundir.OPTIMIZER_TENSORS_FILE] += 1
        return read_tensors(ckpt, names, load=load)

    monkeypatch.setattr(pathlib.Path, "read_text", counted_text)
    monkeypatch.setattr(rundir, "read_trajectory", counted_trajectory)
    monkeypatch.setattr(rundir, "read_optimizer_tensors", counted_tensors)
    return reads


def test_explain_the_default_run():
    plan, _, _ = plan_given(MeZOConfig())
    seen = sources(plan)
    assert set(seen) == set(plan.args.to_dict())  # every value, the secret left out
    assert seen["peft"] == ("norm", "task default") and seen["reward"] == ("['accuracy']", "task default")
    assert seen["learning_rate"] == (str(MODE_DEFAULTS["norm"]["learning_rate"]), "mode default")
    assert seen["max_steps"] == (str(MODE_DEFAULTS["norm"]["max_steps"]), "mode default")
    assert seen["eval_steps"] == (str(MODE_DEFAULTS["norm"]["max_steps"] // 5), "derived")
    assert seen["model"] == ("smollm2-135m", "default") and seen["seed"] == ("0", "default")
    assert {source for _, source in seen.values()} <= {"default", "task default", "mode default", "derived"}


def test_explain_a_trl_script_run():
    """GRPOConfig's fields on a MeZOConfig, a reward function and a Dataset of prompts, as a TRL script gives them."""
    args = MeZOConfig(output_dir="out", learning_rate=1e-1, num_generations=4, per_device_train_batch_size=8,
                      max_completion_length=16, logging_steps=2, bf16=True, hub_token="hf_secret")
    dataset = datasets.Dataset.from_dict({"prompt": ["say a", "say b", "say c", "say d"]})
    plan, _, _ = plan_given(args, reward_funcs=[brevity], train_dataset=dataset)
    seen = sources(plan)
    assert seen["learning_rate"] == ("0.1", "user") and seen["num_generations"] == ("4", "user")
    assert seen["autocast"] == ("bfloat16", "user")  # TRL's bf16=True
    assert seen["reward"][1] == "user" and "brevity" in seen["reward"][0]  # the reward function, recorded by name
    assert seen["peft"] == ("full", "task default")  # a prompt task trains every weight
    assert seen["max_steps"] == (str(PROMPT_TASK_DEFAULTS["full"]["max_steps"]), "task default")
    assert seen["step_normalize"] == ("std", "task default") and seen["eps"][1] == "mode default"
    assert seen["do_sample"] == ("True", "derived") and "hub_token" not in seen and "hf_secret" not in explain(plan)


def test_explain_a_resumed_run_and_its_directory_is_read_once(tmp_path, tiny_tokenizer, monkeypatch):
    factory = lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer)  # noqa: E731
    MeZOTrainer(args=make_args(tmp_path, max_steps=2, adam=True), lm=factory(), lm_factory=factory,
                task=get_task("sst2"), splits=splits()).train()
    reads = counted_reads(tmp_path / "run", monkeypatch)
    args = make_args(tmp_path, max_steps=4, adam=True, resume=True)
    plan, _, _ = plan_given(args, task=get_task("sst2"))
    trainer = MeZOTrainer(args=plan.args, plan=plan, lm=factory(), lm_factory=factory, splits=splits())
    trainer._resume()  # the checkpoint restored: what train() does first
    assert trainer.step == 2
    expected = {rundir.CONFIG_FILE, *(f"checkpoint/{f}" for f in (rundir.MODEL_FILE, rundir.STATE_FILE,
                                                                   rundir.OPTIMIZER_FILE, rundir.TRAJECTORY_FILE,
                                                                   rundir.OPTIMIZER_TENSORS_FILE))}
    reads.pop(rundir.METRICS_FILE)  # the log, cut back to the checkpoint's step (not read to decide anything)
    assert set(reads) == expected and set(reads.values()) == {1}, reads
    seen = sources(plan)
    assert seen["resume"] == ("True", "user") and seen["max_steps"] == ("4", "user")
    assert seen["member_evaluation"] == ("auto -> inplace", "resumed run")


def test_a_resumed_command_line_run_reads_its_directory_once(tmp_path, tiny_model_dir, data_dir, monkeypatch):
    run = tmp_path / "run"
    argv = ["train", "--model", str(tiny_model_dir), "--task", "sst2", "--data-dir", str(data_dir), "--peft", "full",
            "--per-device-train-batch-size", "2", "--num-train", "8", "--num-eval", "4", "--num-test", "2",
            "--learning-rate", "1e-3", "--autocast", "none", "--no-progress", "--output-dir", str(run)]
    assert main([*argv, "--max-steps", "1"]) == 0
    reads = counted_reads(run, monkeypatch)
    at_end, draw = {}, plots.CurvesCallback.on_train_end

    def curves(self, *a, **k):  # the finished run's files, read again to draw curves.png: after training, not setup
        at_end.update(reads)
        return draw(self, *a, **k)

    monkeypatch.setattr(plots.CurvesCallback, "on_train_end", curves)
    assert main([*argv, "--max-steps", "2", "--resume"]) == 0
    setup = {rundir.CONFIG_FILE, *(f"checkpoint/{f}" for f in (rundir.MODEL_FILE, rundir.STATE_FILE,
                                                                rundir.OPTIMIZER_FILE, rundir.TRAJECTORY_FILE))}
    assert {name: at_end.get(name) for name in setup} == dict.fromkeys(setup, 1), at_end


def test_train_dry_run_prints_the_plan_and_loads_nothing(tmp_path, tiny_model_dir, data_dir, capsys):
    out = tmp_path / "run"
    assert main(["train", "--dry-run", "--model", str(tiny_model_dir), "--data-dir", str(data_dir),
                 "--learning-rate", "0.5", "--output-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    lines = {line.split()[0]: line for line in printed.splitlines()}
    assert lines["learning_rate"].split()[1:] == ["0.5", "user"]
    assert lines["peft"].endswith("task default") and lines["eps"].endswith("mode default")
    assert not out.exists()  # nothing written
    assert main(["train", "--dry-run", "--eps", "0"]) == 2  # bad input: one line, exit status 2, as without it
