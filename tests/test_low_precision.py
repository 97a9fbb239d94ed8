"""bf16 / fp16 weights: never perturbed in place, updated in float32 and rounded once, stochastically by default.

The tolerances are derived: stochastic rounding of v between neighbours lo < v < hi writes hi with probability
p = (v - lo) / (hi - lo), so a count of round-ups over N independent draws is Binomial(N, p), and the error it
adds to a weight has variance p (1 - p) (hi - lo)^2 <= (hi - lo)^2 / 4.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from mezo_rl.engine import rounding
from mezo_rl.engine.optim import MeZO, replay_trajectory
from mezo_rl.engine.population import BatchedMembers
from mezo_rl.engine.trajectory import Trajectory
from mezo_rl.errors import ConfigError
from mezo_rl.training.arguments import MeZOConfig

LOW = (torch.bfloat16, torch.float16)


def _model(dtype, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(48, 40), torch.nn.Linear(40, 6)).to(dtype)


def _fixed(values):
    """A batched closure that ignores the model: the members' losses are ``values`` (the engine's update only)."""
    return lambda members: list(values[: len(members)])


def _spacing(w: torch.Tensor) -> torch.Tensor:
    """The distance from each low-precision value to the next one away from zero, as float64."""
    up = torch.nextafter(w, torch.full_like(w, math.inf)).double() - w.double()
    down = w.double() - torch.nextafter(w, torch.full_like(w, -math.inf)).double()
    return torch.maximum(up, down)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("mode", rounding.ROUNDINGS)
def test_at_lr_0_low_precision_weights_stay_bit_for_bit_and_in_place_is_refused(dtype, mode):
    model = _model(dtype)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=f"^MeZO cannot perturb {str(dtype)[6:]} weights in place: "):
        MeZO(model.parameters(), lr=0.0, eps=1e-2)
    opt = MeZO(model.parameters(), lr=0.0, eps=1e-2, n_spsa=2, rounding=mode, member_evaluation=BatchedMembers(model))
    for _ in range(30):
        res = opt.step(_fixed([1.0, 0.0, 0.5, 2.0]))
    assert res.update_kept is None  # nothing was to change
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


def test_stochastic_rounding_rounds_up_in_proportion_to_the_distance():
    """A value a quarter of the way from 1 to the next bf16 / fp16 value rounds up about a quarter of the time."""
    for dtype in LOW:
        lo = torch.tensor(1.0, dtype=dtype)
        hi = torch.nextafter(lo, torch.tensor(2.0, dtype=dtype)).float()
        n = 1 << 16  # distinct random words per chunk: independent draws
        v = torch.full((n,), 1.0 + 0.25 * (float(hi) - 1.0))
        words = rounding.random_words(123, torch.device("cpu"))
        out = rounding.round_(v.clone(), dtype, "stochastic", rounding.chunk_words(words, 123, 0))
        assert set(out.tolist()) <= {1.0, float(hi)}
        ups = int((out == float(hi)).sum())
        sd = math.sqrt(n * 0.25 * 0.75)
        assert abs(ups - 0.25 * n) < 5 * sd
        assert rounding.round_(v.clone(), dtype, "nearest").eq(1.0).all()
        # a value the dtype holds is written as itself, whatever the random bits
        exact = torch.full((n,), float(hi))
        assert rounding.round_(exact.clone(), dtype, "stochastic", rounding.chunk_words(words, 123, 0)).eq(exact).all()


def _run(model, lr, steps, mode, seed=0):
    opt = MeZO(model.parameters(), lr=lr, eps=1e-2, n_spsa=1, rounding=mode, seed=seed,
               member_evaluation=BatchedMembers(model))
    kept = []
    for _ in range(steps):
        res = opt.step(_fixed([1.0, 0.0]))
        kept.append(res.update_kept)
    return opt, kept


@pytest.mark.parametrize("dtype", LOW)
def test_the_stochastically_rounded_change_projects_onto_the_float32_change_at_1(dtype):
    """30 steps of fixed losses: the low-precision run's change, projected on the float32 run's change from the same
    weights, is 1 within five of its standard deviations (each step's rounding error, variance <= spacing^2 / 4,
    summed over steps and entries); rounding to nearest keeps far less at a small lr."""
    steps = 30
    base = _model(dtype)
    start = [p.detach().double() for p in base.parameters()]
    small = 1e-6 if dtype == torch.bfloat16 else 1e-8  # an update below half of most weights' spacing
    for lr in (2e-4, small):
        ref32 = _model(dtype).float()
        _run(ref32, lr, steps, "stochastic")
        want = [p.detach().double() - s for p, s in zip(ref32.parameters(), start)]
        norm = sum(float((w * w).sum()) for w in want)
        var = sum(float((w * w * steps * _spacing(p.detach()) ** 2 / 4).sum()) for w, p in zip(want, base.parameters()))
        bound = 5 * math.sqrt(var) / norm
        for mode in rounding.ROUNDINGS:
            low = _model(dtype)
            _, kept = _run(low, lr, steps, mode)
            got = [p.detach().double() - s for p, s in zip(low.parameters(), start)]
            projection = sum(float((g * w).sum()) for g, w in zip(got, want)) / norm
            if mode == "stochastic":
                assert abs(projection - 1) < bound, (lr, projection, bound)
            elif lr == small:
                assert projection < 0.5, projection  # nearest drops updates below half a spacing
                assert sum(kept) / len(kept) < 0.5


def test_a_low_precision_run_replays_and_resumes_bit_for_bit():
    model, resumed, ref = _model(torch.bfloat16), _model(torch.bfloat16), _model(torch.bfloat16)
    opt, _ = _run(model, 1e-3, 6, "stochastic", seed=3)
    first = MeZO(resumed.parameters(), lr=1e-3, eps=1e-2, seed=3, member_evaluation=BatchedMembers(resumed))
    for _ in range(3):
        first.step(_fixed([1.0, 0.0]))
    second = MeZO(resumed.parameters(), lr=1e-3, eps=1e-2, seed=3, member_evaluation=BatchedMembers(resumed))
    second.load_state_dict(first.state_dict())
    for _ in range(3):
        second.step(_fixed([1.0, 0.0]))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), resumed.parameters()))
    replay_trajectory(list(ref.parameters()), opt.trajectory)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters()))


def test_a_low_precision_run_recorded_before_rounding_existed_is_refused_in_one_line(tmp_path):
    model = _model(torch.bfloat16)
    opt, _ = _run(model, 1e-3, 2, "stochastic")
    header = {k: v for k, v in opt.trajectory.header.items() if k != "rounding"}
    old = Trajectory.from_state_dict({**opt.trajectory.state_dict(), "header": json.dumps(header)})
    with pytest.raises(ValueError, match="^this run's bfloat16 weights were updated by an earlier mezo-rl.*bit for bit"):
        replay_trajectory(list(_model(torch.bfloat16).parameters()), old)
    sd = opt.state_dict()
    sd["mezo"]["config"].pop("rounding")
    fresh = _model(torch.bfloat16)
    with pytest.raises(ValueError, match="^this run's bfloat16 weights were updated by an earlier mezo-rl"):
        MeZO(fresh.parameters(), lr=1e-3, eps=1e-2, member_evaluation=BatchedMembers(fresh)).load_state_dict(sd)
    # a float32 run of the same age replays: its updates never rounded into a low-precision dtype
    f32 = _model(torch.float32)
    opt32, _ = _run(f32, 1e-3, 2, "stochastic")
    header32 = {k: v for k, v in opt32.trajectory.header.items() if k != "rounding"}
    ref = _model(torch.float32)
    replay_trajectory(list(ref.parameters()), Trajectory.from_state_dict({**opt32.trajectory.state_dict(), "header": json.dumps(header32)}))
    assert all(torch.equal(p, q) for p, q in zip(f32.parameters(), ref.parameters()))


def test_row_blocks_and_chunks_write_what_one_chunk_writes():
    """Cut into row blocks and chunks (a limit far below the tensors' size), an update rounded to nearest writes the
    same bits as in one piece: every entry is computed alike, from the same rows of the noise."""
    from mezo_rl.engine import noise

    def run(limit):
        torch.manual_seed(1)
        ps = [torch.randn(37, 11).bfloat16(), torch.randn(5).bfloat16(), torch.randn(8, 3, 2).bfloat16()]
        entries = [(i, p, {"g": 0}) for i, p in enumerate(ps)]
        spec = noise.NoiseSpec("lowrank", "torch", rank=2, layout=noise.layout((i, p) for i, p, _ in entries))

        def add(items):
            spec.add_([(pc.index, pc.p, pc.start, v, -0.3) for pc, v in items], 99)
        kept = rounding.update_(entries, add, lambda g: 0.999, "nearest", 5, split_rows=True, limit=limit)
        return ps, kept

    whole, kept = run(None)
    for limit in (7, 20, 64):
        cut, _ = run(limit)
        assert all(torch.equal(a, b) for a, b in zip(whole, cut)), limit
    assert kept is not None and 0 < kept < 2
    assert len(rounding.chunks(rounding.pieces([(0, whole[0], {})], 20, True), 20)) == math.ceil(37 / (20 // 11))


def test_momentum_and_adam_round_their_low_precision_steps_and_replay():
    for options in (dict(momentum=0.9), dict(adam=True)):
        model, ref = _model(torch.bfloat16), _model(torch.bfloat16)
        opt = MeZO(model.parameters(), lr=1e-4, eps=1e-2, member_evaluation=BatchedMembers(model), **options)
        for _ in range(4):
            res = opt.step(_fixed([1.0, 0.0]))
        assert res.update_kept is not None
        assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters()))
        replay_trajectory(list(ref.parameters()), opt.trajectory)
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters()))


def test_bad_dtype_combinations_are_refused_in_one_line_before_anything_loads():
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="^--dtype float16 needs a CUDA device"):
            MeZOConfig(dtype="float16")
    with pytest.raises(ConfigError, match="^--dtype bfloat16 with --autocast bfloat16: "):
        MeZOConfig(dtype="bfloat16", autocast="bfloat16")
    with pytest.raises(ConfigError, match="^--dtype bfloat16: a step must evaluate its members batched.*not --member-evaluation inplace"):
        MeZOConfig(dtype="bfloat16", member_evaluation="inplace")
    with pytest.raises(ConfigError, match="^--dtype bfloat16: a step must evaluate its members batched.*--noise lowrank"):
        MeZOConfig(dtype="bfloat16", peft="full", noise="gaussian")
    with pytest.raises(ValueError, match="^rounding must be one of"):
        MeZO([torch.zeros(2, requires_grad=True)], rounding="up")
    assert MeZOConfig(dtype="bfloat16").rounding == "stochastic"


def test_auto_dtype_is_bf16_only_where_bf16_is_native_and_autocast_is_auto(monkeypatch):
    from mezo_rl import choices

    for native, autocast, want in ((True, "auto", "bfloat16"), (True, "none", "float32"),
                                   (True, "bfloat16", "float32"), (False, "auto", "float32")):
        monkeypatch.setattr(choices, "bf16_is_native", lambda native=native: native)
        assert choices.weights_dtype("auto", autocast) == want
        assert choices.weights_dtype("float32", autocast) == "float32"


def test_a_bf16_run_logs_the_update_kept_warns_once_when_rounding_eats_it_and_replays(tmp_path, tiny_tokenizer):
    """Through the trainer: every step's record has ``update_kept``, the summary its mean; rounding to nearest at
    a learning rate far below the weights' spacing warns once; the best step's weights rebuild bit for bit."""
    import json
    import warnings

    from conftest import make_tiny_causal_lm
    from mezo_rl.model.lm import LanguageModel
    from mezo_rl.tasks import get_task
    from mezo_rl.training import trainer as trainer_module
    from mezo_rl.training.rundir import load_run
    from test_trainer import make_args, splits

    def factory():
        return LanguageModel(make_tiny_causal_lm(tiny_tokenizer).to(torch.bfloat16), tiny_tokenizer)

    def run(name, **kw):
        args = make_args(tmp_path, name, dtype="bfloat16", noise="lowrank", **kw)
        t = trainer_module.MeZOTrainer(args=args, lm=factory(), lm_factory=factory, task=get_task("sst2"), splits=splits())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t.train()
        return t, [w for w in caught if "rounding is eating it" in str(w.message)]

    steps = trainer_module.KEPT_WINDOW + 2
    t, warned = run("nearest", rounding="nearest", learning_rate=1e-9, max_steps=steps, eval_steps=steps)
    records = [json.loads(line) for line in (tmp_path / "nearest" / "metrics.jsonl").read_text().splitlines()]
    kept = [r["update_kept"] for r in records if "split" not in r]
    assert len(kept) == steps and max(kept) < trainer_module.KEPT_LOW
    assert len(warned) == 1 and "--rounding nearest" in str(warned[0].message)
    assert t.summary["update_kept"] == pytest.approx(sum(kept) / len(kept))

    t, warned = run("stochastic", max_steps=6, eval_steps=3)
    assert not warned and t.summary["update_kept"] is not None
    lm, _, step = load_run(tmp_path / "stochastic", "best" if t.args.load_best_model_at_end else "final", lm=factory())
    assert step == t.summary["best_step"] and all(torch.equal(p, q) for p, q in zip(lm.model.parameters(), t.lm.model.parameters()))


@pytest.mark.parametrize("options, want", [({}, "bfloat16"), ({"member_evaluation": "inplace"}, "float32"),
                                           ({"peft": "full", "noise": "gaussian"}, "float32"),
                                           ({"autocast": "none"}, "float32")])
def test_auto_picks_bf16_weights_only_for_a_run_whose_members_can_be_evaluated_on_them(monkeypatch, options, want):
    """Where bf16 is native, --dtype auto is bf16 unless the run's member evaluation would refuse bf16 weights (in
    place, or every matrix with element-wise noise): auto then keeps float32 rather than refusing the run."""
    from mezo_rl.tasks import get_task
    from mezo_rl import choices
    from mezo_rl.training.plan import plan_run
    from mezo_rl.rewards import build_objective

    monkeypatch.setattr(choices, "bf16_is_native", lambda: True)
    plan = plan_run(MeZOConfig(task="sst2", dtype="auto", **options), get_task("sst2"), build_objective(["accuracy"]))
    assert plan.dtype == want
    with pytest.raises(ConfigError, match="--member-evaluation inplace"):  # asked for by name: refused, as before
        plan_run(MeZOConfig(task="sst2", dtype="bfloat16", member_evaluation="inplace"), get_task("sst2"),
                 build_objective(["accuracy"]))
