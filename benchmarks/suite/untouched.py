"""The untouched test split (issue 70): prompts nobody has read, read once per (cell, seed) at validation's pick.

Issue 50's test split was read about 150 times while its grid grew around it. From issue 70 on, that split is the
**development** split (the runs still read it after training, as before: its records' ``test`` and ``initial_test``
fields), and verdicts come from this one:

* **arithmetic**: 500 two-digit additions drawn with a new seed (:data:`SEED`) outside everything the ``arithmetic``
  task's seed-0 splits hold (train, validation and the development split), in either order of the operands
  (``37 + 48`` excludes ``48 + 37``). Committed as data: ``benchmarks/untouched/arithmetic.jsonl`` (question, answer).
* **sentiment**: 500 review openings of SST-2's test sentences (``SST-2/LM-BFF-original/test.tsv``), drawn with
  :data:`SEED` outside the first :data:`SENTIMENT_USED` of the example's shuffled test pool (every test prompt any
  sentiment run has read: at most 600) and outside every opening of the train and dev files. SST-2 states no
  licence, so the prompts are not committed: ``benchmarks/untouched/sentiment.json`` holds the selection as row
  numbers of ``test.tsv`` with the file's sha256 and the sha256 of the prompts they give; :func:`examples` rebuilds
  the prompts from the data directory and refuses a file or a result that differs.

**Read once.** :class:`Ledger` (``docs/results/untouched_reads.jsonl``, committed with the records) holds one line
per read, keyed by (task, cell, seed); a second read of a key raises ProtocolError before anything is evaluated.
The read happens at validation's pick: a MeZO run is replayed to its picked step from its trajectory
(``benchmarks/untouched.py --read-run``), a GRPO run reads it in the same process, right after its development read,
with the picked weights still in place (``benchmarks/grpo_sentiment.py --untouched-cell``). The starting weights'
read (the baseline of a gain, nothing chosen from it) is the cell :data:`START` of seed 0.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import pathlib
import random

from .protocol import ProtocolError, cpu_info
from .records import append_record, load_records

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
DATA = REPO / "benchmarks" / "untouched"
LEDGER = REPO / "docs" / "results" / "untouched_reads.jsonl"
#: the untouched split's seed (every split before it was drawn with seed 0): the issue's number
SEED = 70
SIZE = 500
#: the sentiment prompts any run has read from the example's shuffled test pool, at most (mezo-full-test600)
SENTIMENT_USED = 600
#: the cell name of the starting weights' read
START = "starting-weights"
TASKS = ("arithmetic", "sentiment")


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------------------------- drawing the split
def draw_arithmetic(size: int = SIZE, seed: int = SEED) -> list[dict]:
    """``size`` two-digit additions (question, answer) outside the ``arithmetic`` task's seed-0 splits, in either
    order of the operands, drawn with ``seed``."""
    from mezo_rl.tasks import get_task

    task = get_task("arithmetic")
    used = set()
    for split in ("train", "validation", "test"):
        for ex in task.load_split(split):
            a, _, b = ex.columns["question"].removeprefix("What is ").removesuffix("?").split()
            used |= {(int(a), int(b)), (int(b), int(a))}
    rng = random.Random(f"untouched/arithmetic/seed={seed}")
    out, seen = [], set()
    while len(out) < size:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if (a, b) in used or (a, b) in seen:
            continue
        seen |= {(a, b), (b, a)}
        out.append({"question": f"What is {a} + {b}?", "answer": str(a + b)})
    return out


def sentiment_rows(data_dir) -> dict:
    """The example's sentiment pools (examples/rl_sentiment.py ``openings``): test.tsv's openings with their row
    numbers, in the example's shuffled order, and the set of every train and dev opening."""
    from .run import import_path

    example = import_path(REPO / "examples" / "rl_sentiment.py", "rl_sentiment_example")
    src = pathlib.Path(data_dir) / "SST-2" / "LM-BFF-original"
    words = 6
    lines = (src / "test.tsv").read_text(encoding="utf-8").splitlines()
    row_of = {}
    for i, line in enumerate(lines):
        tokens = line.split(" ", 1)[1].split()
        if len(tokens) > words + 2:
            row_of.setdefault(" ".join(tokens[:words]), i)
    pool = example.openings(src / "test.tsv", False, words)
    random.Random(0).shuffle(pool)  # the example's shuffle: its test prompts are pool[:num_test]
    others = set(example.openings(src / "train.tsv", True, words)) | set(example.openings(src / "dev.tsv", True, words))
    return {"pool": pool, "row_of": row_of, "others": others, "prefix": example.PREFIX, "words": words,
            "sha256": hashlib.sha256((src / "test.tsv").read_bytes()).hexdigest()}


def draw_sentiment(data_dir, size: int = SIZE, seed: int = SEED) -> dict:
    """The sentiment selection: ``size`` openings of test.tsv outside the first SENTIMENT_USED of the example's
    shuffled pool and outside every train and dev opening, drawn with ``seed``; as row numbers with checksums."""
    got = sentiment_rows(data_dir)
    fresh = [o for o in got["pool"][SENTIMENT_USED:] if o not in got["others"]]
    fresh.sort(key=lambda o: got["row_of"][o])  # a draw that does not depend on the shuffle's order
    if len(fresh) < size:
        raise ProtocolError(f"only {len(fresh)} unread sentiment openings, fewer than {size}")
    chosen = random.Random(f"untouched/sentiment/seed={seed}").sample(fresh, size)
    prompts = [got["prefix"] + o for o in chosen]
    return {"source": "SST-2/LM-BFF-original/test.tsv", "source_sha256": got["sha256"], "words": got["words"],
            "prefix": got["prefix"], "rows": [got["row_of"][o] for o in chosen], "seed": seed,
            "excluded": f"the first {SENTIMENT_USED} of examples/rl_sentiment.py's shuffled test pool, and every "
                        "opening of train.tsv and dev.tsv",
            "prompts_sha256": sha256_text("\n".join(prompts))}


# ---------------------------------------------------------------------------------------------- reading the split
def arithmetic_rows() -> list[dict]:
    return [json.loads(line) for line in (DATA / "arithmetic.jsonl").read_text().splitlines() if line.strip()]


def sentiment_prompts(data_dir) -> list[tuple[str, str]]:
    """(id, prompt) of the committed sentiment selection, rebuilt from ``data_dir``; ProtocolError where the data file
    or the prompts differ from the ones selected."""
    sel = json.loads((DATA / "sentiment.json").read_text())
    path = pathlib.Path(data_dir) / sel["source"]
    if hashlib.sha256(path.read_bytes()).hexdigest() != sel["source_sha256"]:
        raise ProtocolError(f"{path} is not the file the untouched sentiment prompts were drawn from (sha256 differs)")
    lines = path.read_text(encoding="utf-8").splitlines()
    prompts = [sel["prefix"] + " ".join(lines[i].split(" ", 1)[1].split()[:sel["words"]]) for i in sel["rows"]]
    if sha256_text("\n".join(prompts)) != sel["prompts_sha256"]:
        raise ProtocolError("the untouched sentiment prompts rebuilt from the data differ from the ones selected")
    return [(f"test.tsv:{i}", p) for i, p in zip(sel["rows"], prompts)]


def split_of(task: str) -> str:
    """The untouched split a study task reads: ``arithmetic-4x`` reads arithmetic's, ``sentiment-guard`` sentiment's."""
    for name in TASKS:
        if task == name or task.startswith(name + "-"):
            return name
    raise ProtocolError(f"no untouched split for task {task!r}; there is one for {', '.join(TASKS)}")


def examples(task: str, data_dir=None, tmp_dir=None):
    """(the task object, its examples, their ids) of the untouched split of ``task`` (``arithmetic``, or
    ``sentiment``/``sentiment-guard``: the same prompts), as the runs' own tasks give them."""
    from mezo_rl.tasks import from_prompts, get_task

    task = split_of(task)
    if task == "arithmetic":
        t = get_task("arithmetic")
        rows = arithmetic_rows()
        return t, [t.make_example(r["question"], r["answer"]) for r in rows], [r["question"] for r in rows]
    if task == "sentiment":
        if not data_dir:
            raise ProtocolError("the untouched sentiment prompts are rebuilt from SST-2: set MEZO_RL_DATA")
        pairs = sentiment_prompts(data_dir)
        path = pathlib.Path(tmp_dir or (REPO / "runs")) / "untouched-sentiment.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"prompt": p}) + "\n" for _, p in pairs))
        # read as the test split only; a prompt task is named by, and needs, a train file: the same one
        t = from_prompts({"train": str(path), "test": str(path)}, name="sentiment-untouched")
        return t, t.load_split("test"), [i for i, _ in pairs]
    raise ProtocolError(f"no untouched split for task {task!r}; there is one for {', '.join(TASKS)}")


class Ledger:
    """The reads of the untouched split, one JSON line each; a (task, cell, seed) is read once."""

    def __init__(self, path=LEDGER):
        self.path = pathlib.Path(path)

    def reads(self) -> list[dict]:
        return load_records(self.path)

    def check(self, task: str, cell: str, seed: int) -> None:
        for r in self.reads():
            if (r["task"], r["cell"], r["seed"]) == (task, cell, seed):
                raise ProtocolError(f"the untouched split of {task} was read for {cell} seed {seed} already "
                                    f"(step {r['step']}, commit {r['commit'][:12]}): it is read once per cell and seed")

    def claim(self, task: str, cell: str, seed: int, step: int, commit: str) -> None:
        """Refuse a second read of (task, cell, seed); else write this read down (before anything is evaluated: a
        read that fails part-way still counts)."""
        self.check(task, cell, seed)
        append_record(self.path, {"task": task, "cell": cell, "seed": int(seed), "step": int(step), "commit": commit,
                                  "cpu": cpu_info(), "date": _dt.date.today().isoformat()})


def read(lm, task: str, cell: str, seed: int, step: int, reward: str, max_new_tokens: int, autocast_mode: str,
         commit: str, ledger: Ledger | None = None, data_dir=None, batch_size: int = 64, tmp_dir=None) -> dict:
    """Read the untouched split of ``task`` once with ``lm``'s weights (validation's pick, ``step``): the ledger's
    claim first (ProtocolError on a second read), then mezo-rl's evaluation (greedy, as the development read) under
    ``reward``. Returns the record's ``untouched`` field: the step, n, the mean, and per prompt ``[id, value]``."""
    import torch

    from mezo_rl.rewards import build_objective
    from mezo_rl.rewards.objective import example_columns
    from mezo_rl.training.evaluation import evaluate
    from mezo_rl.training.outputs import autocast

    ledger = ledger or Ledger()
    t, exs, ids = examples(task, data_dir, tmp_dir)
    ledger.check(task, cell, seed)
    objective = build_objective([reward])
    name = objective.names[0]
    # the reward tried on an empty completion of the first prompt, in the form the read passes, before the claim:
    # a reward that cannot run here (a package missing) stops the read with nothing evaluated and nothing claimed
    first = exs[0]
    empty = [{"role": "assistant", "content": ""}] if isinstance(first.prompt, list) else ""
    objective.evaluate([first.prompt], completions=[empty], columns=example_columns([first]))
    values: list = []
    ledger.claim(task, cell, seed, step, commit)
    was_training = lm.model.training
    lm.model.eval()
    try:
        with torch.no_grad(), autocast(autocast_mode, lm.device.type):
            metrics = evaluate(lm, t, exs, batch_size=batch_size, max_new_tokens=max_new_tokens, objective=objective,
                               on_batch=lambda batch, outputs, vals: values.extend(vals[name]))
    finally:
        lm.model.train(was_training)
    if len(values) != len(ids):
        raise ProtocolError(f"the untouched read gave {len(values)} outcomes for {len(ids)} prompts")
    return {"split": "untouched", "seed_of_split": SEED, "step": int(step), "n": len(ids), "reward": name,
            "mean": float(metrics[name]), "outcomes": [[i, v] for i, v in zip(ids, values)]}
