"""The protocol every compared RL figure obeys (issue 50), in code rather than in prose.

1. **Choices on validation only.** Steps, learning rates, beta and every other choice are made on the
   validation split. Within a run the pick is the validated step with the highest validation objective (the
   latest of equal ones, as ``MeZOTrainer`` picks its best step); across cells (the reward-KL frontier, "which cell is best at this kl") the pick
   reads the cells' validation figures only (``suite.frontier``).
2. **Test once, at validation's pick.** A run reads its test split once after training, with the weights of
   validation's pick, and the record names that pick (``pick``: the step, the validated steps, the split it was
   made on). The one other test read allowed is the *baseline*: the starting weights at step 0, before any
   training step (the same model for every cell of a seed; the paired gain needs it; nothing is chosen from
   it). :class:`TestGate` is the door: a test read before the pick, at other weights, twice, or followed by a
   further validation raises :class:`ProtocolError`. The GRPO script reads its test split through a live
   gate; a MeZO run's log (``metrics.jsonl``) is replayed through one (:func:`reads_of_mezo_run`) before the
   runner takes any test figure from it.
3. **Enough to compare.** A compared cell has at least ``MIN_SEEDS`` seeds and a validation set of at least
   ``MIN_VALIDATION`` prompts. Decision: a cell *definition* that falls short is refused (ProtocolError) unless
   it is declared ``exploratory``; an exploratory cell runs and is recorded, but its records are never
   admitted to a comparison (:func:`admitted` says why), and the generated pages list it apart, marked
   exploratory. Records written before this protocol (no ``protocol`` field) are "exploratory (pre-protocol)".
4. **Same precision.** Both tools run at one autocast setting (``PRECISION``: mezo-rl's ``--autocast``
   spelling; the GRPO script maps it onto TRL's ``bf16`` flag and its own evaluations' autocast), and each
   record states the precision it resolved to (:func:`precision_of`).
5. **Every figure from a record.** A protocol record carries ``RECORD_FIELDS``: the command, the commit, the
   CPU (model name and whether it has AVX512-BF16), the seed, n (validation and test prompts), the precision,
   the tool's full configuration (mezo-rl's ``config.json``; TRL's ``GRPOConfig`` as a dict), sample
   completions, the pick, and the word and loop counts the docs quote (:func:`text_counts`).
"""
from __future__ import annotations

import functools
import math
import pathlib
import subprocess

#: the protocol's version, written into each record it admits (records without one are pre-protocol)
PROTOCOL = 1
#: a compared cell's seeds, at least
MIN_SEEDS = 3
#: a compared cell's validation prompts, at least
MIN_VALIDATION = 200
#: both tools' autocast (mezo-rl's ``--autocast`` spelling: bf16 autocast with fp32 weights where the CPU has native
#: bf16, fp32 elsewhere); the record states what it resolved to
PRECISION = "auto"
#: the weights both tools keep: float32 (mezo-rl's ``--dtype``, pinned: its default ``auto`` would keep bf16 weights
#: where bf16 is native, while the GRPO script keeps float32 weights under autocast)
WEIGHTS = "float32"
#: what a protocol record carries (``missing_fields``)
RECORD_FIELDS = ("protocol", "command", "commit", "cpu", "seed", "n", "precision", "config", "samples", "counts",
                 "pick")
#: a loop: a completion whose `repetition` (minus the share of its word bigrams that repeat an earlier one) is below
LOOP_REPETITION = -0.3
#: the words whose counts the docs quote (test completions that contain the word)
COUNTED_WORDS = ("great",)


class ProtocolError(Exception):
    """A cell, a run or a comparison that breaks the protocol."""


# ---------------------------------------------------------------------------------------------- equal time
def after_step(spent: float, step_s: float, budget_s: float, eval_points: int) -> str | None:
    """The equal-time rule both tools' budgeted runs obey, after a step of ``step_s`` seconds that began at ``spent``
    seconds of training (evaluations not counted): ``"stop"`` at the step boundary nearest the budget (once
    ``spent + step_s`` plus half a step reaches it), else ``"validate"`` when the step crossed one or more of the
    marks at each ``1/eval_points`` of the budget (``eval_points`` 0 or 1: no marks), else None."""
    if not budget_s > 0 or eval_points < 0:
        raise ValueError(f"a budget of seconds > 0 and eval_points >= 0, got {budget_s!r} and {eval_points!r}")
    after = spent + step_s
    if after + step_s / 2 >= budget_s:
        return "stop"
    marks = [budget_s * k / eval_points for k in range(1, eval_points)]
    if sum(after >= m for m in marks) > sum(spent >= m for m in marks):
        return "validate"
    return None


# ---------------------------------------------------------------------------------------------- the test gate
class TestGate:
    """The one door to a cell's test split. Feed it every evaluation in the order they happen:
    ``validated(step, objective)`` for each validation, ``baseline()`` for the starting weights' test read
    (allowed once, before any training step, i.e. before any validation past step 0), then ``pick()`` (which
    closes validation) and ``test(step)`` with the weights of the picked step, once."""

    __test__ = False  # not a pytest class

    def __init__(self):
        self.validations: list[tuple[int, float]] = []
        self.picked: int | None = None
        self.tested = False
        self.baseline_read = False

    def validated(self, step: int, objective: float) -> None:
        if self.picked is not None:
            raise ProtocolError(f"validation at step {step} after validation's pick (step {self.picked}) was made: "
                                "the pick is final once the test split may be read")
        if objective is None or (isinstance(objective, float) and math.isnan(objective)):
            raise ProtocolError(f"validation at step {step} has no objective: nothing to pick on")
        self.validations.append((int(step), float(objective)))

    def baseline(self) -> None:
        if self.baseline_read or any(step > 0 for step, _ in self.validations) or self.picked is not None:
            raise ProtocolError("the baseline test read (the starting weights) comes once, before any training step")
        self.baseline_read = True

    def pick(self) -> int:
        """Validation's pick: the validated step with the highest objective, the latest of equal ones (the trainer's
        rule for its best step: the weights that trained longer for the same validation)."""
        if self.picked is None:
            if not self.validations:
                raise ProtocolError("no validation: there is no pick, and test may not be read")
            best = None
            for step, value in self.validations:
                if best is None or value >= best[1]:
                    best = (step, value)
            self.picked = best[0]
        return self.picked

    def test(self, step: int) -> None:
        """Allow the test read at ``step``'s weights, or refuse it."""
        if self.picked is None:
            raise ProtocolError(f"test read (step {step}'s weights) before validation's pick")
        if int(step) != self.picked:
            raise ProtocolError(f"test read at step {step}'s weights; validation picked step {self.picked}")
        if self.tested:
            raise ProtocolError("the test split is read once per cell; this was a second read")
        self.tested = True

    def record(self) -> dict:
        """The record's ``pick``: the step, the split it was made on and every validated step's objective."""
        if self.picked is None or not self.tested:
            raise ProtocolError("no pick recorded: the cell has not read its test split at validation's pick")
        return {"on": "validation", "step": self.picked, "rule": "highest validation objective, latest of ties",
                "validated": [{"step": s, "objective": v} for s, v in self.validations]}

    @classmethod
    def replay(cls, reads: list[dict]) -> "TestGate":
        """A gate fed a run's evaluations in order (``{"split", "step", "objective"}``; a test read names the step
        whose weights it scored, ``weights_step``): raises ProtocolError where the run broke the protocol."""
        gate = cls()
        for r in reads:
            if r["split"] == "validation":
                gate.validated(r["step"], r.get("objective"))
            elif r["split"] == "test":
                weights = r.get("weights_step", r["step"])
                if weights == 0 and not gate.baseline_read and not any(s > 0 for s, _ in gate.validations):
                    gate.baseline()
                else:
                    gate.pick()
                    gate.test(weights)
            else:
                raise ProtocolError(f"unknown split {r['split']!r} in the run's evaluations")
        if not gate.tested:
            raise ProtocolError("the run never read its test split at validation's pick")
        return gate


def reads_of_mezo_run(metrics_lines: list[dict], best_step: int) -> list[dict]:
    """The evaluations of a ``mezo-rl train`` run in order, from its ``metrics.jsonl`` records: each validation,
    and each test read, the last of which scored ``best_step``'s weights (the trainer restores them before it)."""
    evals = [r for r in metrics_lines if "split" in r]
    tests = [i for i, r in enumerate(evals) if r["split"] == "test"]
    out = []
    for i, r in enumerate(evals):
        read = {"split": r["split"], "step": r["step"], "objective": (r.get("metrics") or {}).get("objective")}
        if r["split"] == "test":
            read["weights_step"] = best_step if i == tests[-1] else r["step"]
        out.append(read)
    return out


# ---------------------------------------------------------------------------------------------- cells
def check_cell(name: str, seeds, num_eval: int, exploratory: bool = False) -> None:
    """Refuse a compared cell's definition with fewer than MIN_SEEDS seeds or MIN_VALIDATION validation prompts
    (an exploratory cell may have fewer: it is never compared)."""
    if exploratory:
        return
    if len(set(seeds)) < MIN_SEEDS:
        raise ProtocolError(f"cell {name}: {len(set(seeds))} seed(s); a compared cell has at least {MIN_SEEDS} "
                            "(or declare it exploratory: it is then kept out of comparisons)")
    if num_eval < MIN_VALIDATION:
        raise ProtocolError(f"cell {name}: validation of {num_eval} prompts; a compared cell validates on at least "
                            f"{MIN_VALIDATION} (or declare it exploratory)")


def admitted(record: dict) -> tuple[bool, str]:
    """Whether one seed's record may enter a comparison, and why not: a protocol record, not exploratory, with
    every field, validated on enough prompts and tested at validation's pick."""
    if not record.get("ok"):
        return False, "failed"
    if "protocol" not in record:
        return False, "exploratory (pre-protocol)"
    if record.get("exploratory"):
        return False, "exploratory"
    missing = missing_fields(record)
    if missing:
        return False, f"missing {', '.join(missing)}"
    if (record["n"].get("validation") or 0) < MIN_VALIDATION:
        return False, f"validation n {record['n'].get('validation')} < {MIN_VALIDATION}"
    if (record.get("pick") or {}).get("on") != "validation":
        return False, "not picked on validation"
    return True, ""


def missing_fields(record: dict) -> list[str]:
    """The RECORD_FIELDS a record lacks (or holds empty)."""
    out = []
    for k in RECORD_FIELDS:
        v = record.get(k)
        if v is None or (isinstance(v, (dict, list, str)) and not v and k != "samples"):
            out.append(k)
        elif k == "samples" and not v:
            out.append(k)
    cpu = record.get("cpu") or {}
    if "cpu" not in out and not ({"model", "avx512_bf16"} <= set(cpu)):
        out.append("cpu")
    n = record.get("n") or {}
    if "n" not in out and not ({"validation", "test"} <= set(n)):
        out.append("n")
    return out


# ---------------------------------------------------------------------------------------------- the record's fields
def cpu_info(cpuinfo: str | None = None) -> dict:
    """The CPU's model name and whether it has AVX512-BF16 (``avx512_bf16`` in /proc/cpuinfo's flags)."""
    if cpuinfo is None:
        try:
            cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    model, flags = None, []
    for line in cpuinfo.splitlines():
        if line.startswith("model name") and model is None:
            model = line.split(":", 1)[1].strip()
        elif line.startswith("flags") and not flags:
            flags = line.split(":", 1)[1].split()
    return {"model": model or "unknown", "avx512_bf16": "avx512_bf16" in flags, "amx": "amx_tile" in flags}


def commit(repo) -> str:
    """The repository's commit, with ``+dirty`` where tracked files outside docs/ differ from it (docs/ holds the
    records and renderings a run appends to, not code a run executes)."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs")
    return head + ("+dirty" if changed else "")


@functools.lru_cache(maxsize=None)
def made_before(repo: str, change: str, commit: str) -> bool:
    """Whether ``commit`` (a record's, ``+dirty`` allowed) lacks ``change``: git in ``repo`` says ``change`` is not
    its ancestor. A commit the repository does not know (or no git) is not judged: False."""
    try:
        done = subprocess.run(["git", "-C", repo, "merge-base", "--is-ancestor", change, commit.split("+")[0]],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 1


def precision_of(mode: str) -> str:
    """What mezo-rl's ``--autocast`` mode resolves to here (``bf16 autocast, fp32 weights`` or ``fp32``)."""
    from mezo_rl.choices import bf16_is_native

    bf16 = mode == "bfloat16" or (mode == "auto" and bf16_is_native())
    return "bf16 autocast, fp32 weights" if bf16 else "fp32"


def _text(completion) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else str(completion)


def repetition_of(text: str) -> float:
    """Minus the share of a text's word bigrams that repeat an earlier bigram of it (the example's ``repetition``
    reward, examples/sentiment_reward.py, on one text)."""
    words = text.split()
    grams = list(zip(words, words[1:]))
    return -(len(grams) - len(set(grams))) / len(grams) if grams else 0.0


def text_counts(samples: list[dict], words=COUNTED_WORDS) -> dict:
    """The counts the docs quote, over a split's completions: how many contain each counted word (case-insensitive,
    as a word), how many loop (``repetition`` below LOOP_REPETITION), and n."""
    texts = [_text(s["completion"]) for s in samples]
    out = {"n": len(texts), "loops": sum(repetition_of(t) < LOOP_REPETITION for t in texts)}
    for w in words:
        out[w] = sum(w in [x.strip(".,!?;:\"'()").lower() for x in t.split()] for t in texts)
    return out
