"""The default run's shape at its floor (``--peft norm``, the accuracy objective), on the tiny model:
the frozen trunk runs once per distinct example for the whole run, the best step's rebuilt model
included, and the summary says where the time went."""
from __future__ import annotations

import math
import random

import torch

from conftest import make_tiny_causal_lm
from mezo_rl.model.lm import LanguageModel
from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.training.callbacks import TrainerCallback
from mezo_rl.training.trainer import MeZOTrainer
from mezo_rl.tasks import Example, get_task


def examples(n: int, seed: int) -> list[Example]:
    """SST-2-shaped examples whose label words are single tokens of the tiny tokenizer (the candidate path)."""
    rng = random.Random(seed)
    words = "the movie was good and the acting was bad so the sun rose early".split()
    return [Example(prompt=" ".join(rng.sample(words, 6)) + f" {i} . Yes or No ?", candidates=[" No", " Yes"],
                    label=rng.randrange(2), columns={}) for i in range(n)]


def test_the_trunk_runs_once_per_example_for_the_whole_run(tmp_path, tiny_tokenizer):
    rows = []  # sequences through the first trunk layer, every model of the run

    def factory():
        model = make_tiny_causal_lm(tiny_tokenizer)
        model.model.layers[0].register_forward_hook(lambda m, i, o: rows.append(i[0].shape[0]))
        return LanguageModel(model, tiny_tokenizer)

    splits = {"train": examples(24, 0), "validation": examples(12, 1), "test": examples(12, 2)}
    # lr 0: the validation accuracy stays step 0's; a tie goes to the later step, so a callback makes step 0's
    # value unbeatable: the best step is 0 and the run rebuilds the model for it (the path that used to run the
    # trunk over the test split a second time)
    class HoldStepZero(TrainerCallback):
        def on_evaluate(self, args, state, control, **kwargs):
            if state.global_step > 0:
                state.best_metric = math.inf

    args = MeZOConfig(model="tiny", task="sst2", reward=["accuracy"], peft="norm", max_steps=6, per_device_train_batch_size=8,
                             eval_steps=3, learning_rate=0.0, autocast="none", progress=False, output_dir=str(tmp_path / "run"),
                             num_train=24, num_eval=12, num_test=12, initial_test=True, load_best_model_at_end=True)
    trainer = MeZOTrainer(args=args, lm=factory(), lm_factory=factory, task=get_task("sst2"), splits=splits,
                          callbacks=[HoldStepZero()])
    assert trainer.lm.trunk_cache_active
    trainer.train()
    summary = trainer.summary
    assert summary["best_step"] == 0 and summary["steps"] == 6  # the rebuild happened
    distinct = {ex.prompt for split in splits.values() for ex in split}
    # each example's trunk exactly once; besides, each of the two models built (the run's, the best step's) ran
    # the one-row probe that enable_trunk_cache checks the layout with
    assert sum(rows) == len(distinct) + 2
    time_s = summary["time_s"]
    assert set(time_s) == {"load", "trunk", "steps", "evaluations"} and all(v >= 0 for v in time_s.values())
    assert time_s["trunk"] > 0 and time_s["steps"] > 0 and time_s["evaluations"] > 0
