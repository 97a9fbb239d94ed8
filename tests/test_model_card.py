"""The model card: `mezo-rl export` and trainer.save_model write README.md with Hub metadata, the rewards, the
results before -> after with n, the command that repeats the run and the MeZO citation; push_to_hub offline is
one line and leaves everything on disk."""
from __future__ import annotations

import json

import pytest

from mezo_rl.cli.main import main
from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.training.model_card import HubPushError, base_model_id, push_to_hub, read_card_metadata
from test_trainer import factory, make_args, train  # noqa: F401  (factory is a fixture)


def test_save_model_writes_a_card_with_hub_metadata_and_the_runs_results(tmp_path, factory):  # noqa: F811
    args = make_args(tmp_path, max_steps=2, eval_steps=2, model="HuggingFaceTB/SmolLM2-135M-Instruct",
                     reward=["cross_entropy", "accuracy"], reward_weights=[1.0, 0.0], save_model=True)
    trainer, summary = train(args, factory)
    card = tmp_path / "run" / "README.md"  # save_model writes into the output directory, as transformers
    meta = read_card_metadata(card)
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and meta["library_name"] == "mezo-rl"
    assert {"mezo-rl", "zeroth-order"} <= set(meta["tags"])
    text = card.read_text()
    assert "- `cross_entropy` (weight 1)" in text and "- `accuracy` (weight 0)" in text
    before, after = summary["initial_test"]["accuracy"], summary["test"]["accuracy"]
    n = int(summary["test"]["n"])
    assert f"| test | accuracy | {before:.4g} | {after:.4g} | {n} |" in text
    assert "mezo-rl train --config training_args.json" in text and "Fine-Tuning Language Models with Just Forward Passes" in text
    saved = json.loads((tmp_path / "run" / "training_args.json").read_text())
    assert MeZOConfig.from_dict(saved) == trainer.args and (tmp_path / "run" / "config.json").is_file()  # the model's config


def test_export_writes_the_card_and_an_offline_push_is_one_line(tmp_path, tiny_model_dir, data_dir, capsys, monkeypatch):
    run, out = tmp_path / "run", tmp_path / "exported"
    assert main(["train", "--model", str(tiny_model_dir), "--task", "sst2", "--data-dir", str(data_dir),
                 "--reward", "cross_entropy", "--max-steps", "2", "--per-device-train-batch-size", "4",
                 "--num-train", "16", "--num-eval", "4", "--num-test", "4", "--autocast", "none", "--no-progress",
                 "--output-dir", str(run)]) == 0
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rc = main(["export", "--run-dir", str(run), "--output", str(out), "--push-to-hub", "someone/tiny-mezo"])
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the model-loading progress output
    assert rc == 2 and last.startswith("mezo-rl: error: push_to_hub 'someone/tiny-mezo': HF_HUB_OFFLINE is set")
    meta = read_card_metadata(out / "README.md")  # written before the push was tried, and kept
    assert meta["library_name"] == "mezo-rl" and "base_model" not in meta  # a local directory is no hub id
    assert (out / "config.json").is_file() and "| validation | accuracy |" in (out / "README.md").read_text()
    with pytest.raises(HubPushError, match="not a saved model directory"):
        push_to_hub(tmp_path / "nowhere", "someone/x")


def test_base_model_ids():
    assert base_model_id("smollm2-135m") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert base_model_id("google/gemma-3-270m") == "google/gemma-3-270m"
    assert base_model_id("./runs/model") is None and base_model_id("model.gguf") is None
