"""Data-parallel MeZO over torch.distributed (gloo, 2 CPU ranks) and the DistContext helpers.

Multi-rank tests spawn real processes with torch.multiprocessing; each worker sets the variables
torchrun would set and builds its context with DistContext.from_env(), so the code under test is the
code a torchrun launch runs. Workers report back through files in tmp_path.
"""
from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

import mezo_rl.training.distributed as D
from conftest import FLOAT32_UNIT_ROUNDOFF, float32_rounding_bound, make_tiny_causal_lm, model_reduction_terms
from mezo_rl.model.peft import check_no_offload, set_trainable
from mezo_rl.training.distributed import DistContext, WeightMismatchError, weight_checksums
from mezo_rl.engine.optim import replay_trajectory
from mezo_rl.engine.trajectory import Trajectory


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join(rank: int, world_size: int, port: int) -> DistContext:
    """Set what torchrun sets, then join through the public entry point."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    return DistContext.from_env(backend="gloo", timeout_s=60)


def _spawn(worker, world_size: int, *args) -> None:
    mp.spawn(worker, args=(world_size, _free_port(), *args), nprocs=world_size, join=True)


def _two_ranks(tmp_path, tiny_causal_lm, worker, steps: int) -> tuple:
    """Save the tiny model, run ``worker(rank, world_size, port, model_dir, out_dir, steps)`` on 2 gloo
    ranks; returns what each rank saved (``out_dir/rank<r>.pt``) and ``out_dir``."""
    model, tokenizer = tiny_causal_lm
    model_dir, out_dir = tmp_path / "model", tmp_path / "out"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out_dir.mkdir()
    _spawn(worker, 2, str(model_dir), str(out_dir), steps)
    return torch.load(out_dir / "rank0.pt"), torch.load(out_dir / "rank1.pt"), out_dir


# ---------------------------------------------------------------------------- single process
def test_shards_partition_the_batch_contiguously_and_evenly():
    items = list(range(11))
    for world in (1, 2, 3, 4, 16):
        shards = [DistContext(rank=r, world_size=world).shard(items) for r in range(world)]
        assert sum(shards, []) == items  # contiguous, in rank order, nothing lost or repeated
        sizes = [len(s) for s in shards]
        assert max(sizes) - min(sizes) <= 1
        assert sizes == sorted(sizes, reverse=True)  # the extra items go to the first ranks
    # fewer items than ranks: the last ranks get empty shards
    assert [DistContext(rank=r, world_size=4).shard(["a", "b"]) for r in range(4)] == [["a"], ["b"], [], []]


def test_single_process_context_is_a_cheap_no_op(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ctx = DistContext.from_env()
    assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.is_distributed) == (0, 1, True, False)
    assert ctx.device == torch.device("cpu")
    assert ctx.shard([1, 2, 3]) == [1, 2, 3]
    assert ctx.all_reduce_sum([1.5, 2]) == [1.5, 2.0]
    t = ctx.all_reduce_sum(torch.tensor([1.0, 2.0], dtype=torch.float32))
    assert t.dtype == torch.float64 and t.tolist() == [1.0, 2.0]
    assert ctx.all_reduce_sum_dict({"acc": 3.0}, keys=["acc", "f1"]) == {"acc": 3.0, "f1": 0.0}
    ctx.check_same_weights([torch.ones(3)])
    ctx.check_same_object("anything")
    with pytest.raises(TypeError, match=r"^settings must be a JSON value \(dict, list, str, int, float, bool or None\).*set"):
        ctx.check_same_object({"a": {1, 2}}, what="settings")  # refused on one process as on many: nothing pickled
    ctx.barrier()
    ctx.close()
    assert ctx.bytes_communicated == 0


def test_bad_input_gets_a_clear_error(monkeypatch):
    ctx = DistContext()
    with pytest.raises(TypeError, match="list of floats or a tensor"):
        ctx.all_reduce_sum("1.0")
    with pytest.raises(TypeError, match="every value must be a number"):
        ctx.all_reduce_sum([1.0, "x"])
    with pytest.raises(KeyError, match="not in the agreed keys"):
        ctx.all_reduce_sum_dict({"acc": 1.0, "typo": 2.0}, keys=["acc"])
    with pytest.raises(ValueError, match="0 <= rank < world_size"):
        DistContext(rank=2, world_size=2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(RuntimeError, match="torchrun"):
        DistContext.from_env(backend="gloo")
    with pytest.raises(ValueError, match="unknown backend"):
        DistContext.from_env(backend="mpi")


def test_weight_checksums_detect_any_change_without_big_temporaries(monkeypatch):
    monkeypatch.setattr(D, "_CHUNK", 7)  # force several chunks per tensor
    torch.manual_seed(0)
    a = torch.randn(5, 9)
    base = weight_checksums([a, a.to(torch.bfloat16), torch.arange(4)])
    assert base.shape == (3, 3) and base.dtype == torch.int64
    assert torch.equal(base, weight_checksums([a.clone(), a.to(torch.bfloat16), torch.arange(4)]))

    one_ulp = a.clone()
    one_ulp[3, 4] = torch.nextafter(one_ulp[3, 4], torch.tensor(float("inf")))
    swapped = a.clone().view(-1)
    swapped[[2, 40]] = swapped[[40, 2]]  # two elements in different chunks
    swapped_in_chunk = a.clone().view(-1)
    swapped_in_chunk[[8, 10]] = swapped_in_chunk[[10, 8]]  # both in chunk 1 (elements 7..13)
    for changed in (one_ulp, swapped.view(5, 9), swapped_in_chunk.view(5, 9), a.roll(1, dims=1)):
        row = weight_checksums([changed])[0]
        assert not torch.equal(row, base[0]), "a changed tensor must change its checksum"
    # a non-contiguous view is checksummed by its values in logical order
    assert torch.equal(weight_checksums([a.t()]), weight_checksums([a.t().contiguous()]))
    with pytest.raises(ValueError, match="meta"):
        weight_checksums([torch.empty(3, device="meta")])


def test_check_no_offload_names_offloaded_parameters():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    check_no_offload(model)  # all resident: fine
    model[1].weight = torch.nn.Parameter(torch.empty(2, 2, device="meta"))
    with pytest.raises(ValueError, match=r"1 trainable parameter\(s\) are offloaded.*1\.weight"):
        check_no_offload(model)
    model[1].weight.requires_grad_(False)  # a frozen weight is never written: it may be offloaded
    check_no_offload(model)


# ---------------------------------------------------------------------------- two gloo ranks
def _collectives_worker(rank, world_size, port, out_dir):
    with _join(rank, world_size, port) as ctx:
        report = {"rank": ctx.rank, "world_size": ctx.world_size, "is_main": ctx.is_main}
        report["sum_list"] = ctx.all_reduce_sum([rank + 0.5, 1.0, 1e-17 * (rank + 1)])
        report["sum_tensor"] = ctx.all_reduce_sum(torch.full((2, 2), float(rank + 1)))
        report["sum_dict"] = ctx.all_reduce_sum_dict({"a": 1.0} if rank == 0 else {}, keys=["a", "b"])
        report["bytes_after_reduces"] = ctx.bytes_communicated

        torch.manual_seed(0)  # identical weights on both ranks
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        ctx.check_same_weights(model.named_parameters())
        if rank == 1:
            with torch.no_grad():
                model[1].bias[0] += 1e-6
        try:
            ctx.check_same_weights(model.named_parameters())
            report["mismatch_error"] = None
        except WeightMismatchError as e:
            report["mismatch_error"] = str(e)
        before = ctx.bytes_communicated
        ctx.check_same_object({"noise": "torch", "lr": 0.1 + 0.2}, what="settings")  # floats travel exactly
        report["object_bytes"] = ctx.bytes_communicated - before
        try:
            ctx.check_same_object({"noise": "torch" if rank == 0 else "compiled"}, what="settings")
            report["settings_error"] = None
        except WeightMismatchError as e:
            report["settings_error"] = str(e)
        ctx.barrier()
        torch.save(report, os.path.join(out_dir, f"rank{rank}.pt"))


def test_two_ranks_collectives_checksum_and_byte_count(tmp_path):
    _spawn(_collectives_worker, 2, str(tmp_path))
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert (r0["rank"], r1["rank"], r0["world_size"], r0["is_main"], r1["is_main"]) == (0, 1, 2, True, False)
    for r in (r0, r1):
        assert r["sum_list"] == [2.0, 2.0, 3e-17]  # float64: the tiny term survives
        assert r["sum_tensor"].dtype == torch.float64 and r["sum_tensor"].eq(3.0).all()
        assert r["sum_dict"] == {"a": 1.0, "b": 0.0}
        assert r["bytes_after_reduces"] == (3 + 4 + 2) * 8  # payload of three all-reduces
        # a compared object: its length (8 bytes), then its JSON text, padded to the longest rank's
        assert r["object_bytes"] == 8 + len('{"lr": 0.30000000000000004, "noise": "torch"}')
        # both ranks raise the same clear error, naming the rank and the tensor
        assert r["mismatch_error"] is not None
        assert "rank 1 differs from rank 0 in 1 tensor(s): 1.bias" in r["mismatch_error"]
        assert r["settings_error"] == ("ranks disagree on settings: rank 0: {'noise': 'torch'}; "
                                       "rank 1: {'noise': 'compiled'}")


def _leave_worker(rank, world_size, port, second_port, out_dir):
    import time

    report = {}
    with _join(rank, world_size, port) as ctx:  # a normal end: rank 0 is still busy when rank 1 leaves the block
        if rank == 0:
            time.sleep(1.0)
            report["busy_until"] = time.monotonic()
    report["left"] = time.monotonic()
    report["group_left"] = not torch.distributed.is_initialized()
    start = time.monotonic()
    try:  # an error path: rank 1 fails while rank 0 waits in a collective rank 1 never reaches
        with _join(rank, world_size, second_port) as ctx:
            if rank == 1:
                raise ValueError("rank 1 failed")
            ctx.all_reduce_sum([1.0])
    except (ValueError, RuntimeError) as e:
        report["error"] = type(e).__name__
    report["error_path_seconds"] = time.monotonic() - start
    report["group_left_after_error"] = not torch.distributed.is_initialized()
    torch.save(report, os.path.join(out_dir, f"rank{rank}.pt"))


def test_ranks_leave_together_at_a_normal_end_and_at_once_on_an_error(tmp_path):
    _spawn(_leave_worker, 2, _free_port(), str(tmp_path))
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    # a normal end waits for every rank: rank 1 leaves after rank 0's work (one machine, one monotonic clock)
    assert r1["left"] >= r0["busy_until"]
    assert r0["group_left"] and r1["group_left"]
    # an error inside the block does not wait for the others: the failing rank is out long before the
    # 60 s collective timeout, and the rank left waiting fails instead of hanging until it
    assert r1["error"] == "ValueError" and r0["error"] == "RuntimeError"
    assert r1["error_path_seconds"] < 30 and r0["error_path_seconds"] < 30
    assert r0["group_left_after_error"] and r1["group_left_after_error"]


# ---------------------------------------------------------------------------- data-parallel MeZO
REVIEWS = [
    ("the movie was good and the acting was bad .", 0), ("It was great .", 0), ("It was terrible .", 1),
    ("so because the sun rose early and the people went outside .", 0), ("what a bad movie .", 1),
    ("the cat sat on the mat .", 0), ("the acting was terrible .", 1), ("the park was great .", 0),
]
GLOBAL_BATCH = 5  # odd on purpose: the shards of 2 ranks are uneven (3 + 2)


def brevity(prompts, completions):
    """A user reward (a plain callable, TRL-style): shorter completions score higher."""
    return [-float(len(c)) for c in completions]


def _objective():
    # Three kinds of component, all all-reduced the same way: cross_entropy (scores) drives the loss;
    # accuracy has weight 0 (reported only); brevity is a user reward on greedy completions (the
    # random tiny model always continues " was was was was", so it goes through the plumbing but
    # does not move the weights, and "std" warns that it has no spread). reward_scale="std" fixes each
    # scale from the first global batch, so sq_sums must be all-reduced as well.
    from mezo_rl.rewards import build_objective

    return build_objective(["cross_entropy", "accuracy", brevity], weights=[1.0, 0.0, 0.1], reward_scale="std")


def _global_loss(ctx, lm, objective, shard) -> float:
    """The trainer's closure: evaluate this rank's shard, all-reduce sums/counts/sq_sums, global loss."""
    prompts = [f"{text} It was" for text, _ in shard]
    with torch.no_grad():
        scores = lm.score(prompts, [[" great", " terrible"]] * len(shard))
        completions = lm.generate(prompts, max_new_tokens=4)
    out = objective.evaluate(prompts=prompts, completions=completions, candidate_scores=scores,
                             labels=[y for _, y in shard], columns={})
    keys = list(out.sums)
    n = len(keys)
    stats = ctx.all_reduce_sum([out.sums[k] for k in keys] + [out.counts[k] for k in keys]
                               + [out.sq_sums[k] for k in keys])
    return objective.loss_from(dict(zip(keys, stats[:n])), dict(zip(keys, stats[n:2 * n])),
                               dict(zip(keys, stats[2 * n:])))


def _train_data_parallel(ctx, model, tokenizer, steps, lr=1e-4, eps=1e-3, seed=0):
    """The trainer's plan: same global batch on every rank, own shard, all-reduced objective stats.

    Returns the global losses the closures returned (identical on every rank), the optimizer and
    the objective (whose ``scales`` the first batch fixed).
    """
    from mezo_rl.model.lm import LanguageModel
    from mezo_rl.engine.optim import MeZO

    lm, objective = LanguageModel(model, tokenizer), _objective()
    opt = MeZO(model.parameters(), lr=lr, eps=eps, seed=seed, noise="gaussian", noise_backend="torch")  # element-wise z: the bound below
    losses = []
    for step in range(steps):
        order = torch.randperm(len(REVIEWS), generator=torch.Generator().manual_seed(1000 + step))
        batch = [REVIEWS[i] for i in order[:GLOBAL_BATCH]]  # same data seed on every rank
        shard = ctx.shard(batch)

        def closure():
            losses.append(_global_loss(ctx, lm, objective, shard))
            return losses[-1]

        opt.step(closure)
    return losses, opt, objective


def _train_worker(rank, world_size, port, model_dir, out_dir, steps):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _join(rank, world_size, port) as ctx:
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        ctx.check_same_weights(model.named_parameters())
        before = ctx.bytes_communicated
        losses, opt, _ = _train_data_parallel(ctx, model, tokenizer, steps)
        bytes_per_step = (ctx.bytes_communicated - before) / steps
        if ctx.is_main:  # only rank 0 writes the run's files
            opt.trajectory.save(os.path.join(out_dir, "trajectory.npz"))
        torch.save({"state": model.state_dict(), "losses": losses, "bytes_per_step": bytes_per_step},
                   os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.filterwarnings("ignore:reward_scale='std'")
def test_two_ranks_match_each_other_and_a_single_process_run(tmp_path, tiny_causal_lm):
    model, tokenizer = tiny_causal_lm
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    steps = 6
    r0, r1, out_dir = _two_ranks(tmp_path, tiny_causal_lm, _train_worker, steps)

    # every rank applied the same updates: identical losses, bit-identical weights
    assert r0["losses"] == r1["losses"]
    for name, t in r0["state"].items():
        assert torch.equal(t, r1["state"][name]), f"ranks diverged in {name}"

    # One process on the union of the shards, same seeds: equal up to float32 rounding. The shards
    # are scored in other batch shapes than the whole batch, so each log-likelihood may differ in
    # the order of its float32 sums: the tolerances below are derived from that, not tuned.
    from mezo_rl.model.lm import LanguageModel
    from mezo_rl.engine.noise import generate, tensor_key

    with torch.no_grad():
        scores = LanguageModel(model, tokenizer).score([f"{t} It was" for t, _ in REVIEWS],
                                                       [[" great", " terrible"]] * len(REVIEWS))
    longest = max(len(tokenizer(f"{t} It was great")["input_ids"]) for t, _ in REVIEWS)
    delta = float32_rounding_bound(max(float(s.mean.abs().max()) for s in scores),
                                   model_reduction_terms(model, longest))  # one mean log-likelihood
    single_losses, single_opt, objective = _train_data_parallel(DistContext(), model, tokenizer, steps)
    # The loss is mean(CE) / s (accuracy has weight 0; brevity is exact and has no spread). CE = logsumexp(m) - m_y
    # moves by at most 2 delta when every m does; the scale s (the std of the first batch's CE values) by at most
    # 2 delta sqrt(B / (B - 1)). Both runs carry such errors, hence the leading 2.
    s, b = objective.scales["cross_entropy"], GLOBAL_BATCH
    for two, one in zip(r0["losses"], single_losses):
        assert abs(two - one) <= 2 * (2 * delta + abs(one) * 2 * delta * (b / (b - 1)) ** 0.5) / s, (two, one)

    # The weights: each run moved every tensor by -lr * g_t * z_t per step, with the same z_t (same seeds) and its
    # own projected gradient g_t, so they differ by lr * sum_t |g_t - g'_t| |z_t|, plus the rounding of the three
    # in-place float32 updates of a step (each rounds twice, at most u * |value| each), in each of the two runs.
    two_traj = Trajectory.load(out_dir / "trajectory.npz")
    assert (two_traj.seeds == single_opt.trajectory.seeds).all()
    g_diff = torch.as_tensor(two_traj.projected_grads - single_opt.trajectory.projected_grads, dtype=torch.float64)
    lr, eps = single_opt.param_groups[0]["lr"], single_opt.param_groups[0]["eps"]
    moved = 0.0
    state = model.state_dict()
    for index, (name, p) in enumerate(model.named_parameters()):
        explained = torch.zeros(p.numel(), dtype=torch.float64)
        largest = initial[name].abs().max().double()
        for t in range(steps):
            z = generate(tensor_key(int(two_traj.seeds[t, 0]), index, p.shape), p.numel(), "gaussian", "torch").double()
            explained += lr * g_diff[t].abs().sum() * z.abs()
            largest += 2 * eps * z.abs().max() + lr * abs(float(single_opt.trajectory.projected_grads[t, 0])) * z.abs().max()
        rounding = 2 * steps * 3 * 2 * FLOAT32_UNIT_ROUNDOFF * largest
        diff = (r0["state"][name] - state[name]).double().reshape(-1).abs()
        assert (diff <= explained + rounding).all(), f"{name}: {float((diff - explained - rounding).max())} beyond the bound"
        moved = max(moved, float((state[name] - initial[name]).abs().max()))
    assert moved > 1e-3, "training must move the weights for the comparison to mean anything"

    # per step: 2 closures x (sums, counts, sq_sums) x 3 components x 8 bytes
    assert r0["bytes_per_step"] == r1["bytes_per_step"] == 2 * 3 * 3 * 8
    # only rank 0 wrote the trajectory, and it replays the run
    assert sorted(p.name for p in out_dir.iterdir()) == ["rank0.pt", "rank1.pt", "trajectory.npz"]

    fresh = make_tiny_causal_lm(tokenizer)
    replay_trajectory(list(fresh.parameters()), Trajectory.load(out_dir / "trajectory.npz"))
    for name, t in fresh.state_dict().items():
        assert torch.equal(t, r0["state"][name]), f"replaying the trajectory does not rebuild {name}"


# ---------------------------------------------------------------------------- device_map="auto"
@pytest.mark.filterwarnings("ignore:reward_scale='std'")
def test_device_map_auto_trains_in_place_and_offload_is_rejected(tmp_path, tiny_causal_lm):
    """What can be checked without GPUs: a device map that fits keeps every weight resident and
    MeZO trains it exactly like a plainly loaded model; a max_memory that does not fit offloads
    weights to disk ('meta' parameters), which MeZO cannot update in place, and is rejected."""
    from mezo_rl.model.loading import load_model

    model, tokenizer = tiny_causal_lm
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    plain = load_model(str(tmp_path / "model"))
    mapped = load_model(str(tmp_path / "model"), device_map="auto", max_memory={"cpu": "1GiB"})
    check_no_offload(mapped.model)
    plain_losses, *_ = _train_data_parallel(DistContext(), plain.model, plain.tokenizer, steps=2)
    mapped_losses, *_ = _train_data_parallel(DistContext(), mapped.model, mapped.tokenizer, steps=2)
    assert plain_losses == mapped_losses
    for (name, a), b in zip(plain.model.state_dict().items(), mapped.model.state_dict().values()):
        assert torch.equal(a, b), name

    offloaded = load_model(str(tmp_path / "model"), device_map="auto", max_memory={"cpu": "100KB"},
                           offload_folder=str(tmp_path / "offload"))
    with pytest.raises(ValueError, match=r"offloaded \(on the 'meta' device\).*model\.layers\.0"):
        set_trainable(offloaded, "full")  # what a run's build does with the model it loaded


# ---------------------------------------------------------------------------- torchrun + the CLI
def _run_cli(launcher: list[str], args: list[str]) -> None:
    import subprocess
    import sys

    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, *launcher, "-m", "mezo_rl", "train", *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(launcher) or 'python'} failed:\n{proc.stderr[-4000:]}"


def _step_records(run_dir) -> list[dict]:
    import json

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return [r for r in records if "loss" in r]


@pytest.mark.slow  # two CLI runs: ~40 s with a warm torch.compile cache, ~2 min cold
def test_torchrun_mezo_rl_train_matches_a_single_process_run(tmp_path, tiny_causal_lm, data_dir):
    from mezo_rl.training.rundir import CHECKPOINT_DIR, TRAJECTORY_FILE
    from mezo_rl.engine.trajectory import Trajectory

    model, tokenizer = tiny_causal_lm
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    common = ["--model", str(tmp_path / "model"), "--task", "sst2", "--data-dir", str(data_dir),
              "--reward", "cross_entropy", "--max-steps", "3", "--per-device-train-batch-size", "5", "--num-train", "20",
              "--num-eval", "8", "--num-test", "8", "--learning-rate", "1e-3", "--autocast", "none", "--no-progress"]
    _run_cli(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"],
             common + ["--output-dir", str(tmp_path / "two")])
    _run_cli([], common + ["--output-dir", str(tmp_path / "one")])
    two, one = tmp_path / "two", tmp_path / "one"

    # rank 0 alone wrote: the same files as a single process, each step logged exactly once
    def files(d):
        return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())
    assert files(two) == files(one)
    steps_two, steps_one = _step_records(two), _step_records(one)
    assert [r["step"] for r in steps_two] == [1, 2, 3]
    # The global loss of each step equals the single-process loss on the whole batch up to float32 rounding:
    # each rank scores its shard in other batch shapes, so a mean log-likelihood m may differ by 2 delta, and the
    # cross-entropy logsumexp(m) - m_y (the loss, unnormalised) by twice that. Derived from the train examples.
    from mezo_rl.model.lm import LanguageModel
    from mezo_rl.tasks import get_task

    train = get_task("sst2").load_split("train", data_dir=data_dir, n=20, seed=0)
    with torch.no_grad():
        scores = LanguageModel(model, tokenizer).score([e.prompt for e in train], [e.candidates for e in train])
    longest = max(len(tokenizer(e.prompt + c)["input_ids"]) for e in train for c in e.candidates)
    delta = float32_rounding_bound(max(float(s.mean.abs().max()) for s in scores), model_reduction_terms(model, longest))
    for key in ("loss_plus", "loss_minus"):
        for a, b in zip((r[key] for r in steps_two), (r[key] for r in steps_one)):
            assert abs(a - b) <= 2 * 2 * delta, (key, a, b)
    t2 = Trajectory.load(two / CHECKPOINT_DIR / TRAJECTORY_FILE)
    t1 = Trajectory.load(one / CHECKPOINT_DIR / TRAJECTORY_FILE)
    assert (t2.seeds == t1.seeds).all()
    # g = (L+ - L-) / (2 eps): the projected gradients differ by what the logged losses explain, no more
    for r2, r1, g2, g1, eps in zip(steps_two, steps_one, t2.projected_grads[:, 0], t1.projected_grads[:, 0], t1.epss[:, 0]):
        explained = (abs(r2["loss_plus"] - r1["loss_plus"]) + abs(r2["loss_minus"] - r1["loss_minus"])) / (2 * eps)
        assert abs(g2 - g1) <= explained * (1 + 1e-9) + 4 * 2 ** -53 * (abs(g1) + abs(g2)), (g2, g1, explained)
