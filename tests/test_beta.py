"""--beta (TRL's KL coefficient) and the kl every prompt-task evaluation reports (issue 35)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from mezo_rl import rewards
from conftest import make_tiny_causal_lm
from mezo_rl.errors import ConfigError
from mezo_rl.model.lm import LanguageModel
from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.training.trainer import MeZOTrainer

WORDS = ["the movie was", "a film about", "the acting is", "this story has", "the plot was", "an ending that"]


def flat(completions, **kwargs):
    """A reward with no opinion between completions: only the KL penalty can move the weights."""
    return [1.0] * len(completions)


def reward_len(completions, **kwargs):
    return [-abs(20 - len(c)) for c in completions]


@pytest.fixture()
def registered():
    for fn in (flat, reward_len):
        rewards.register_reward(fn.__name__, replace=True)(fn)
    yield
    for fn in (flat, reward_len):
        rewards.unregister_reward(fn.__name__)


def args_for(tmp_path, name, **kw):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{WORDS[i % 6]} {i}"}) + "\n" for i in range(30)))
    base = dict(model="tiny", task=str(path), reward=["reward_len"], peft="norm", max_steps=2,
                per_device_train_batch_size=4, eval_steps=2, autocast="none", progress=False,
                output_dir=str(tmp_path / name), num_train=20, num_eval=6, num_test=6, max_completion_length=8)
    return MeZOConfig(**{**base, **kw})


def trainer(args, tiny_tokenizer):
    return MeZOTrainer(args=args, lm=LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer),
                   lm_factory=lambda: LanguageModel(make_tiny_causal_lm(tiny_tokenizer), tiny_tokenizer))


def drift(t):
    """Move the trained tensors away from the start: a policy that has drifted from where the run began."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in t.start.params:
            p.add_(0.3 * torch.randn(p.shape, generator=g))


def test_kl_is_exactly_zero_at_lr_0(tmp_path, tiny_tokenizer, registered):
    # batched members never perturb the weights in place, so at lr 0 they are the starting weights, bit for bit
    args = args_for(tmp_path, "lr0", learning_rate=0.0, member_evaluation="batched", do_sample=True)
    t = trainer(args, tiny_tokenizer)
    t.train()
    summary = t.summary
    for split in ("initial_validation", "validation", "test"):
        assert summary[split]["kl"] == 0.0 and summary[split]["kl_tokens"] > 0


def test_beta_pulls_the_policy_back_towards_the_start(tmp_path, tiny_tokenizer, registered):
    """From weights moved away from the start, with a reward that has no opinion: beta 0 makes no step (every
    member's loss is the same), beta > 0 steps along the finite-difference gradient of the KL (eps small
    enough that the +eps and -eps members write the same greedy completions), so the KL goes down."""
    kl = {}
    for beta in (0.0, 1.0):
        t = trainer(args_for(tmp_path, f"b{beta}", reward=["flat"], learning_rate=30.0, eps=1e-3, beta=beta,
                             n_spsa=1, max_steps=6), tiny_tokenizer)
        drift(t)
        before = t.evaluate()["eval_kl"]
        records = [t.training_step() for _ in range(6)]
        kl[beta] = t.evaluate()["eval_kl"]
        assert ("kl" in records[-1]) == (beta > 0)  # logged per step where it is computed anyway
    assert before > 0 and kl[1.0] < 0.9 * kl[0.0]


def test_the_two_members_of_a_pair_score_their_kl_on_the_same_completions(tmp_path, tiny_tokenizer, registered,
                                                                           monkeypatch):
    """The KL term of a step is a finite difference, (kl+ - kl-) / (2 eps): over the same texts (the + member's
    completions) it is the difference of a smooth function of the weights; over each member's own sampled
    completions it would be mostly the difference between two texts."""
    import mezo_rl.training.trainer as trainer_module

    scored = []
    real = trainer_module.completion_kl

    def spy(lm, start, prompts, completions, **kw):
        scored.append(list(completions))
        return real(lm, start, prompts, completions, **kw)

    monkeypatch.setattr(trainer_module, "completion_kl", spy)
    t = trainer(args_for(tmp_path, "pairs", beta=1.0, n_spsa=2, do_sample=True, peft="full", eps=0.5,
                         member_evaluation="inplace"), tiny_tokenizer)  # batched: the next test
    own = []
    real_outcomes = t.member_outcomes

    def outcomes(*a, **kw):
        result = real_outcomes(*a, **kw)
        own.append(list(result[0].texts))
        return result

    t.member_outcomes = outcomes
    t.training_step()
    assert len(scored) == len(own) == 4  # +s0, -s0, +s1, -s1
    for k in (0, 2):
        assert scored[k] == own[k] and scored[k + 1] == own[k]  # both members of a pair: the + member's texts
    assert any(own[k] != own[k + 1] for k in (0, 2))  # the - members wrote other completions (every weight moved by eps 0.5)


def kl_tolerance(model, kl: float, seq_len: int) -> float:
    """Twice the float32 rounding bound of a mean per-token KL computed twice (in place and batched: other
    rows a pass, the perturbation weight-side or activation-side). At a position, KL = sum_v p_v (lp_v - lq_v);
    each log-probability carries the rounding of one forward pass (relative gamma_n, n the pass's reduction
    terms plus the prompt's length), so the KL errs by at most gamma_n * sum_v p_v (|lp_v| + |lq_v|) (the log
    probabilities themselves) + gamma_n * sum_v p_v |lp_v| |lp_v - lq_v| (p's own rounding). With
    sum_v p_v |lp_v| = H(p) <= ln V and sum_v p_v |lq_v| = H(p) + KL <= ln V + KL, the magnitude is at most
    (2 ln V + KL) (1 + 2 ln V + KL)."""
    from conftest import float32_rounding_bound, model_reduction_terms

    s = 2 * math.log(model.config.vocab_size) + kl
    return 2 * float32_rounding_bound(s * (1 + s), model_reduction_terms(model, seq_len) + seq_len)


def test_batched_members_read_the_kl_that_members_in_place_read(tmp_path, tiny_tokenizer, registered):
    """--beta with the members in one batched pass (``--member-evaluation batched``): each member's KL to the start,
    its perturbation applied activation-side and the start's logits read with the pass paused, is the KL the
    in-place mode reads with that member's weights in place, on the same texts (the + member's of its pair).
    eps 0.5 on every weight of drifted weights: the four members' KLs differ by far more than the two modes'
    rounding."""
    seen = {}
    for evaluation in ("inplace", "batched"):
        t = trainer(args_for(tmp_path, evaluation, beta=1.0, n_spsa=2, peft="full", eps=0.5, member_evaluation=evaluation),
                    tiny_tokenizer)
        drift(t)
        real = t.member_losses

        def spy(outcomes, real=real, member_evaluation=evaluation):
            seen[evaluation] = [(o.kl.mean, o.kl.tokens, o.texts) for o in outcomes]
            return real(outcomes)

        t.member_losses = spy
        t.training_step()
    model = t.lm.model
    assert [x[1:] for x in seen["inplace"]] == [x[1:] for x in seen["batched"]]  # same texts, same tokens
    kls = {e: [x[0] for x in seen[e]] for e in seen}
    longest = max(len(tiny_tokenizer(f"{w} {i}")["input_ids"]) for w in WORDS for i in range(30)) + 8  # + completion
    for a, b in zip(kls["inplace"], kls["batched"]):
        assert abs(a - b) <= kl_tolerance(model, max(a, b), longest)
    # and each is nearest its own member's: a member read with another's perturbation, or none, would not be
    assert [min(range(4), key=lambda j: abs(b - kls["inplace"][j])) for b in kls["batched"]] == [0, 1, 2, 3]
    assert len({round(k, 3) for k in kls["inplace"]}) == 4


def test_bad_beta_is_one_line_before_the_model_loads(tmp_path, registered, tiny_tokenizer):
    with pytest.raises(ConfigError, match="--beta"):
        args_for(tmp_path, "neg", beta=-0.1)
    assert args_for(tmp_path, "batched", beta=0.1, member_evaluation="batched").member_evaluation == "batched"  # served (below)

    def no_model():
        raise AssertionError("the model was loaded")

    args = MeZOConfig(model="tiny", task="sst2", reward=["accuracy"], beta=0.1, output_dir=str(tmp_path / "c"))
    with pytest.raises(ConfigError, match="prompt task"):
        MeZOTrainer(args=args, lm_factory=no_model, splits={"train": [1], "validation": [], "test": []})


@pytest.mark.parametrize("value, says", [("abc", "invalid float value: 'abc'"), ("-1", "accepted: a number >= 0"),
                                         ("nan", "accepted: a number >= 0")])
def test_the_command_line_refuses_a_bad_beta_in_one_line(value, says, capsys):
    from mezo_rl.cli.main import main

    assert main(["train", "--task", "arithmetic", "--beta", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mezo-rl: error: ") and err.count("\n") == 1 and says in err and "--beta" in err


def test_bounded_losses_cap_the_spread_at_eps_and_leave_smaller_spreads_alone():
    from mezo_rl.engine.optim import spread
    from mezo_rl.training.fitness import bounded_losses

    small = [0.001, -0.002, 0.0005, 0.0005]
    assert bounded_losses(small, 0.01) == small
    big = [3.0, -1.0, 40.0, 2.0]
    out = bounded_losses(big, 0.01)
    assert spread(out) == pytest.approx(0.01, rel=1e-12)
    assert [b / a for a, b in zip(big, out)] == pytest.approx([0.01 / spread(big)] * 4, rel=1e-12)  # one scale


def test_a_large_beta_cannot_make_a_step_longer_than_a_normalised_one(tmp_path, tiny_tokenizer, registered):
    """With a KL term that dwarfs the reward's (beta 1e6, weights far from the start) the losses of a pair are
    scaled to a spread of eps: with two members (n_spsa 1) |l+ - l-| / 2 is that spread, so the projected
    gradient is +-1, as a normalised step's. Unbounded it would be beta (kl+ - kl-) / (2 eps), orders larger."""
    t = trainer(args_for(tmp_path, "big", reward=["reward_len"], learning_rate=0.05, eps=1e-3, beta=1e6,
                         n_spsa=1, max_steps=3), tiny_tokenizer)
    drift(t)
    for _ in range(3):
        r = t.training_step()
        assert r["kl"] > 0
        (pg,) = r["projected_grad"] if isinstance(r["projected_grad"], list) else [r["projected_grad"]]
        assert abs(pg) == pytest.approx(1.0, rel=1e-9)
