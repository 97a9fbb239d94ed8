"""What the suite runs: the tasks' protocol, the methods, and the grid of cells with their command lines.

A *cell* is (model, task, method, seed[, steps]) with the ``python -m mezo_rl ...`` argv that runs it;
its key hashes everything that defines it (the command line apart from the output directory), so a
changed setting is a new cell. Nothing here runs anything or reads results.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
from typing import Iterable, Optional

REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_RESULTS = REPO / "docs" / "results" / "cells.jsonl"
DEFAULT_MD = REPO / "docs" / "results.md"
DEFAULT_RUNS = REPO / "runs" / "results"


@dataclasses.dataclass(frozen=True)
class TaskProtocol:
    """The data of a task's cells: the same for every method (the sampling seed is the cell's)."""

    name: str
    label: str
    num_train: int = 1000
    num_eval: int = 200
    num_test: int = 1000
    metric: str = "accuracy"          # the task metric reported (summary/baseline "test" key)
    metric_reward: str = "accuracy"   # the non-differentiable objective of the "mezo-metric" method
    icl_demos: int = 32               # paper: 32 demonstrations
    kind: str = "classification"
    max_new_tokens: Optional[int] = None  # generation tasks: the answer length limit of every method
    # ((method, (option, value, ...)), ...): this task's own options for a method, appended to its command
    # (later options win, as with --method-args, which comes after them)
    method_args: tuple = ()


TASKS = {
    "sst2": TaskProtocol("sst2", "SST-2"),
    "rte": TaskProtocol("rte", "RTE"),
    # the third classification task: full train/dev/test files (CB's test has 56 examples, BoolQ has no
    # train file here, TREC's causal prompt is empty so linear probing has no features to read)
    # 500 of its 2210 test examples: 5 two-token candidates make an SST-5 evaluation ~4x an SST-2 one
    "sst5": TaskProtocol("sst5", "SST-5", num_test=500),
    # 200 questions: greedy generation over long contexts; 2 demonstrations fit SmolLM2's context
    # 16 new tokens (a SQuAD answer is a few words; the training step decodes twice per question)
    # LoRA at lr 1e-3: SST-2's 3e-3 diverged here (loss 2.8 -> 15 by step 30, validation F1 0.0 at step 40;
    # SQuAD's projected gradients are ~3x SST-2's); 1e-3 reached test F1 32.2 (benchmarks/README.md)
    "squad": TaskProtocol("squad", "SQuAD", num_eval=100, num_test=200, metric="squad_f1",
                          metric_reward="squad_f1", icl_demos=2, kind="generation", max_new_tokens=16,
                          method_args=(("mezo-lora", ("--learning-rate", "1e-3")),)),
}


@dataclasses.dataclass(frozen=True)
class Method:
    name: str
    label: str
    command: str                      # "baseline" or "train"
    kinds: tuple = ("classification", "generation")
    mezo: bool = False
    # train: peft, reward (None = the task's metric_reward), lr, eps, batch
    peft: str = "full"
    reward: Optional[str] = "cross_entropy"
    lr: Optional[float] = None
    eps: Optional[float] = None
    batch: int = 16
    steps: Optional[int] = None       # the method's own run length (None: the suite's --steps)
    extra: tuple = ()                 # further `mezo-rl train` options, written into the command


# lr/eps are written out (not left to the CLI defaults) so a recorded command reproduces its cell
# even after the defaults change. full: the paper's eps with an lr measured to lower SST-2 dev loss
# (benchmarks/README.md, engine_sst2); prefix: mezo_rl.training.defaults.MODE_DEFAULTS (paper Table 16); LoRA: the
# paper's eps with an lr picked on SST-2 validation accuracy at this 200-step budget (seed 0: the paper's
# 1e-4, tuned for 20,000 steps, leaves validation at 0.565 throughout; best step: 1e-3 0.595, 3e-3 0.675;
# 1e-2 diverges; benchmarks/README.md, "Full, LoRA and prefix");
# metric objective: `mezo-rl train`'s default run (final norm, accuracy reward) on classification,
# prefix-tuning for SQuAD F1. The final norm runs its own length: its steps skip the frozen trunk (cached).
# "mezo-metric" on classification is that default run: its 3000 steps are `mezo-rl train`'s default for
# --peft norm (mezo_rl.training.defaults.MODE_DEFAULTS; a test keeps the two equal). "mezo-norm" (CE) keeps the
# 1500 steps its cells on three tasks were measured at.
NORM = dict(peft="norm", lr=2e-2, eps=1e-1, batch=64, steps=1500,
            extra=("--noise", "rademacher", "--step-normalize", "std", "--n-spsa", "2"))
DEFAULT_NORM_STEPS = 3000
METHODS = {
    "zero-shot": Method("zero-shot", "Zero-shot", "baseline"),
    "icl": Method("icl", "ICL", "baseline"),
    "lp": Method("lp", "Linear probing", "baseline", kinds=("classification",)),
    "ft": Method("ft", "FT (Adam, backprop)", "baseline"),
    "mezo-full": Method("mezo-full", "MeZO full (CE)", "train", mezo=True, lr=1e-5, eps=1e-3),
    "mezo-lora": Method("mezo-lora", "MeZO LoRA (CE)", "train", mezo=True, peft="lora", lr=3e-3, eps=1e-2),
    "mezo-prefix": Method("mezo-prefix", "MeZO prefix (CE)", "train", mezo=True, peft="prefix", lr=1e-2, eps=1e-1),
    "mezo-norm": Method("mezo-norm", "MeZO final norm (CE)", "train", mezo=True, kinds=("classification",), **NORM),
    "mezo-metric": Method("mezo-metric", "MeZO final norm (accuracy objective)", "train", mezo=True, reward=None,
                          **{**NORM, "steps": DEFAULT_NORM_STEPS}),
}
# F1 at +eps and -eps is a step function: examples/optimize_f1.py's FZOO-style sign steps (benchmarks/README.md, "SQuAD F1 as the objective")
METRIC_ON_GENERATION = Method("mezo-metric", "MeZO prefix (F1 objective)", "train", mezo=True, peft="prefix",
                              reward=None, lr=2e-2, eps=1e-1, batch=16, steps=160,
                              extra=("--noise", "rademacher", "--step-normalize", "std", "--n-spsa", "1",
                                     "--eval-steps", "20"))
MEZO_CE = ("mezo-full", "mezo-lora", "mezo-prefix")   # the paper's three modes ("comparable")
MEZO_ANY_CE = MEZO_CE + ("mezo-norm",)                 # "MeZO" in the other claims: the best of these
MODELS = ("smollm2-135m", "gemma3-270m")


def method_for(method: str, protocol: TaskProtocol) -> Method:
    m = METHODS[method]
    if method == "mezo-metric" and protocol.kind == "generation":
        return METRIC_ON_GENERATION
    return m


def method_label(method: str, task: str) -> str:
    """The row label of a method on a task (a method or task unknown to the suite: its name)."""
    if method not in METHODS:
        return method
    return method_for(method, TASKS[task]).label if task in TASKS else METHODS[method].label


@dataclasses.dataclass
class Settings:
    """Knobs of one suite invocation that shape the command lines."""

    steps: tuple = (200,)             # MeZO steps (one cell per value)
    batch_size: Optional[int] = None  # MeZO batch; None = the method's own
    ft_epochs: float = 1.0
    ft_max_steps: Optional[int] = None
    eval_batch_size: Optional[int] = None
    method_args: dict = dataclasses.field(default_factory=dict)   # method -> extra argv (later options win)
    protocol_overrides: dict = dataclasses.field(default_factory=dict)   # e.g. num_train=16 for --quick


@dataclasses.dataclass
class Cell:
    model: str
    task: str
    method: str
    seed: int
    steps: Optional[int]              # MeZO steps; None for baselines
    argv: list                        # after `python -m mezo_rl`, without --output-dir

    @property
    def key(self) -> str:
        return cell_key(self.model, self.task, self.method, self.seed, self.argv)


def cell_key(model: str, task: str, method: str, seed: int, argv: list) -> str:
    """Identity of a cell: everything that defines it (the command line, apart from where it writes)."""
    blob = json.dumps({"model": model, "task": task, "method": method, "seed": seed, "argv": list(argv)},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def variant_of(argv: list) -> str:
    """The settings of a cell apart from its seed and its model: cells of one variant are averaged over
    seeds, and one variant is one row of a task's table, whose columns are the models."""
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--seed", "--model"):
            skip = True
            continue
        rest.append(a)
    return hashlib.sha256(json.dumps(rest).encode()).hexdigest()[:8]


def _fmt(x) -> str:
    return repr(x) if isinstance(x, float) else str(x)


def build_argv(model: str, protocol: TaskProtocol, method: str, seed: int, settings: Settings,
               steps: Optional[int] = None) -> list:
    m = method_for(method, protocol)
    p = dataclasses.replace(protocol, **settings.protocol_overrides)
    common = ["--model", model, "--task", p.name, "--num-train", str(p.num_train), "--num-test", str(p.num_test),
              "--seed", str(seed)]
    if settings.eval_batch_size:
        common += ["--eval-batch-size", str(settings.eval_batch_size)]
    if m.command == "baseline":
        argv = ["baseline", "--method", m.name] + common
        if p.max_new_tokens:
            argv += ["--max-completion-length", str(p.max_new_tokens)]
        if m.name == "icl":
            argv += ["--num-demonstrations", str(p.icl_demos)]
        if m.name == "ft":
            argv += ["--ft-epochs", _fmt(settings.ft_epochs)]
            if settings.ft_max_steps is not None:
                argv += ["--ft-max-steps", str(settings.ft_max_steps)]
    else:
        batch = settings.batch_size or m.batch
        argv = ["train"] + common + (["--max-completion-length", str(p.max_new_tokens)] if p.max_new_tokens else [])
        argv += ["--num-eval", str(p.num_eval), "--peft", m.peft, "--reward", m.reward or p.metric_reward,
                 "--learning-rate", _fmt(m.lr), "--eps", _fmt(m.eps), "--max-steps", str(steps),
                 "--per-device-train-batch-size", str(batch), *m.extra, "--no-initial-test", "--no-progress"]
    return argv + list(dict(p.method_args).get(method, ())) + list(settings.method_args.get(method, ()))


def test_split_size(task: str, data_dir: Optional[str] = None) -> Optional[int]:
    """Number of examples in the task's test split (None if it cannot be read here)."""
    try:
        from mezo_rl.tasks import get_task

        return len(get_task(task).load_split("test", data_dir=data_dir))
    except Exception:  # noqa: BLE001 -- only an optimisation / a label; the cell itself reports errors
        return None


def plan(models: Iterable[str], tasks: Iterable[str], methods: Iterable[str], seeds: Iterable[int],
         settings: Settings, split_sizes: Optional[dict] = None) -> list[Cell]:
    """Every cell of the grid, in run order: model, then seed (all of seed 0 first), task, method.

    Zero-shot depends on the seed only through the test sample: where the test sample is the whole
    split (``num_test`` >= its size), only the first seed is run.
    """
    split_sizes = split_sizes or {}
    seeds = list(seeds)
    cells = []
    for model in models:
        for seed in seeds:
            for task in tasks:
                protocol = dataclasses.replace(TASKS[task], **settings.protocol_overrides)
                for method in methods:
                    m = method_for(method, protocol)
                    if protocol.kind not in m.kinds:
                        continue
                    size = split_sizes.get(task)
                    if (method == "zero-shot" and seed != seeds[0] and size is not None
                            and protocol.num_test >= size):
                        continue
                    for steps in (((m.steps,) if m.steps else settings.steps) if m.mezo else (None,)):
                        argv = build_argv(model, TASKS[task], method, seed, settings, steps)
                        cells.append(Cell(model, task, method, seed, steps, argv))
    return cells


def options(argv: list) -> dict:
    """A command's options as {"--name": "value"} ("" for a bare flag; a later option wins, as in the CLI)."""
    out = {}
    for i, a in enumerate(argv):
        if a.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[a] = nxt if nxt is not None and not nxt.startswith("--") else ""
    return out


def option(argv: list, name: str, default=None):
    """The value of one option of a command (``default`` if absent or a bare flag)."""
    value = options(argv).get(name)
    return default if value in (None, "") else value


def task_order(task: str) -> tuple:
    """Sort key: the order of ``TASKS``, unknown tasks last."""
    names = list(TASKS)
    return (names.index(task) if task in names else len(names), task)


def method_order(method: str) -> int:
    """Sort key: the order of ``METHODS``, unknown methods last."""
    names = list(METHODS)
    return names.index(method) if method in names else len(names)


# --quick: minutes on a CPU, the whole path (baselines, FT, a MeZO run) through the real CLI
QUICK = dict(tasks=["sst2"], methods=["zero-shot", "lp", "ft", "mezo-prefix"], seeds=[0], steps=[4],
             batch_size=4, protocol=dict(num_train=16, num_eval=8, num_test=16), ft_max_steps=2)

