"""A run's config.json records every value the run used, and `mezo-rl train --config RUN/training_args.json`
repeats the run bit for bit (tiny model, hand-made SST-2-style data)."""
from __future__ import annotations

import json

from mezo_rl.cli.main import main
from mezo_rl.training.defaults import MODE_DEFAULTS
from mezo_rl.training.rundir import CHECKPOINT_DIR, CONFIG_FILE, TRAJECTORY_FILE


def test_config_json_has_no_nulls_and_repeats_the_run(tmp_path, tiny_model_dir, data_dir, monkeypatch):
    first, again = tmp_path / "first", tmp_path / "again"
    # every per-mode option left to its default (--peft norm: lr, eps, noise, normalize, n_spsa, weight decay)
    assert main(["train", "--model", str(tiny_model_dir), "--task", "sst2", "--data-dir", str(data_dir),
                 "--max-steps", "3", "--per-device-train-batch-size", "4", "--num-train", "16", "--num-eval", "4", "--num-test", "4",
                 "--autocast", "none", "--no-progress", "--output-dir", str(first)]) == 0
    config = json.loads((first / CONFIG_FILE).read_text())
    assert config["peft"] == "norm" and None not in [config[k] for k in MODE_DEFAULTS["norm"]]
    assert {k: config[k] for k in MODE_DEFAULTS["norm"] if k not in ("max_steps", "per_device_train_batch_size")} == \
        {k: v for k, v in MODE_DEFAULTS["norm"].items() if k not in ("max_steps", "per_device_train_batch_size")}
    assert config["eval_steps"] == 1 and list(config) == sorted(config)

    # the run is repeated from its config.json alone, even where the defaults have changed since
    monkeypatch.setitem(MODE_DEFAULTS, "norm", {**MODE_DEFAULTS["norm"], "learning_rate": 0.5, "eps": 0.3,
                                                "noise": "gaussian", "step_normalize": "none", "n_spsa": 1})
    assert main(["train", "--config", str(first / CONFIG_FILE), "--output-dir", str(again)]) == 0
    assert (again / CHECKPOINT_DIR / TRAJECTORY_FILE).read_bytes() == (first / CHECKPOINT_DIR / TRAJECTORY_FILE).read_bytes()
    assert {**json.loads((again / CONFIG_FILE).read_text()), "output_dir": None} == {**config, "output_dir": None}
