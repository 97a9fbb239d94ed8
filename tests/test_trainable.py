"""--trainable: MeZO on a named subset of the weights (e.g. the normalisation gains), replayable."""
from __future__ import annotations

import pytest
import torch

from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.errors import ConfigError
from mezo_rl.training.rundir import load_run
from mezo_rl.training.setup import trainable_parameters
from test_trainer import factory, make_args, train, weights  # noqa: F401  (factory is a fixture)


def test_only_matching_parameters_move_and_the_run_replays(tmp_path, factory):
    args = make_args(tmp_path, trainable=r"norm\.weight$", noise="rademacher", step_normalize="std", learning_rate=1e-2, eps=1e-1)
    before = {n: p.detach().clone() for n, p in factory().model.named_parameters()}
    trainer, summary = train(args, factory)
    names = [n for n, p in trainer.lm.model.named_parameters() if p.requires_grad]
    assert names and all(n.endswith("norm.weight") for n in names)
    final, _, _ = load_run(args.output_dir, "final", lm=factory())
    assert len(trainable_parameters(final.model)) == len(names)
    moved = {n for n, p in final.model.named_parameters() if not torch.equal(before[n], p.detach())}
    assert moved and moved <= set(names)              # frozen weights are bit-identical
    best, _, _ = load_run(args.output_dir, "best", lm=factory())
    assert all(torch.equal(a, b) for a, b in zip(weights(best), weights(trainer.lm)))


def test_a_pattern_that_matches_nothing_is_refused_naming_it(tmp_path, factory):
    with pytest.raises(ConfigError, match="no trainable parameter"):
        train(make_args(tmp_path, trainable="no_such_layer"), factory)


def test_an_invalid_pattern_is_refused_before_anything_loads():
    with pytest.raises(ConfigError, match=r"--trainable: '\(' is not a regular expression"):
        MeZOConfig(trainable="(")


def test_only_the_norm_mode_turns_the_trunk_cache_on(factory):
    from mezo_rl.model.peft import FINAL_NORM
    from mezo_rl.training.setup import build_model

    assert build_model(MeZOConfig(peft="norm"), factory()).trunk_cache_active
    # the same trainable set by --trainable in full mode: the trunk is frozen, yet the cache stays off,
    # so an in-place edit of a frozen weight changes the next score
    lm = build_model(MeZOConfig(peft="full", trainable=FINAL_NORM), factory())
    assert not lm.trunk_cache_active
    prompts, candidates = ["the movie was great . It was"], [[" great", " terrible"]]
    before = lm.score(prompts, candidates)[0].sum
    with torch.no_grad():
        next(p for n, p in lm.model.named_parameters() if "layers.0." in n and not p.requires_grad).mul_(2.0)
    assert not torch.equal(lm.score(prompts, candidates)[0].sum, before)
