"""Examples, the Task interface, the registry, in-context demonstrations.

A task turns dataset rows into ``Example``s: a prompt plus either candidate continuations (one of
them right: classification, multiple choice) or gold answers (generation). The language model then
scores the candidates or generates after the prompt; the task knows nothing about models.

    >>> from mezo_rl.tasks import get_task
    >>> task = get_task("sst2")
    >>> ex = task.load_split("validation", n=500, seed=0)[0]
    >>> ex.prompt, ex.candidates, ex.label       # ('... It was', [' terrible', ' great'], 1)
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from mezo_rl.errors import UnknownNameError
from mezo_rl.registry import Registry

KINDS = ("classification", "multiple_choice", "generation", "prompts")
SPLITS = ("train", "validation", "test")
PAPER_SIZES = {"train": 1000, "validation": 500, "test": 1000}  # MeZO §3.2 / Appendix D.1 (OPT tasks)
MASK = "[MASK]"  # the mask placeholder in ``Example.mask_prompt`` (same string as mezo_rl.model.scoring.MASK)


@dataclass
class Example:
    """One prompt with its candidates or gold answers.

    Attributes:
        prompt: the text the model continues (causal LMs).
        candidates: classification / multiple choice: the continuations to score; each is appended
            to ``prompt`` as is, so it carries its own leading space (``" great"``). None for generation.
        label: index of the right candidate (None for generation).
        answers: generation: every gold answer, written as a continuation of ``prompt`` (a leading
            space where the prompt does not end in whitespace); ``answers[0]`` is the teacher-forcing
            target. None for classification.
        columns: the raw dataset row the example was made from.
        messages: a conversational prompt (a list of ``{"role", "content"}`` dicts, TRL's format), or
            None for a plain-text prompt. The model renders it with its tokenizer's chat template;
            ``prompt`` then holds the last message's content, for display.
        mask_prompt: for masked LMs (the paper's Table 13 prompts): the prompt with ``[MASK]`` where
            the label word goes, or None when the task has no masked-LM prompt.
        mask_candidates: the label words scored at the mask (same order as ``candidates``).
    """

    prompt: str
    candidates: list[str] | None = None
    label: int | None = None
    answers: list[str] | None = None
    columns: dict = field(default_factory=dict)
    mask_prompt: str | None = None
    mask_candidates: list[str] | None = None
    messages: list[dict] | None = None

    def for_lm(self, is_causal: bool) -> tuple[str, list[str] | None]:
        """(prompt, candidates) to hand a causal (``is_causal=True``) or a masked LM."""
        if is_causal:
            return self.prompt, self.candidates
        if self.mask_prompt is None:
            raise ValueError(
                "this example has no masked-LM prompt (Example.mask_prompt); masked LMs are supported on "
                "the tasks with a Table 13 prompt: sst2, sst5, trec, mnli, snli, rte"
            )
        return self.mask_prompt, self.mask_candidates

    @property
    def target(self) -> str:
        """The right continuation: ``candidates[label]`` or ``answers[0]``."""
        return self.candidates[self.label] if self.candidates is not None else self.answers[0]


def continuation(prompt: str, text: str) -> str:
    """``text`` as a continuation of ``prompt``: a leading space unless one side already has whitespace."""
    text = str(text)
    if prompt and not prompt[-1].isspace() and text and not text[0].isspace():
        return " " + text
    return text


def metrics_of_kind(kind: str) -> list[str]:
    """The evaluation metrics of a task of ``kind`` that does not name its own (:attr:`Task.metrics`): the
    first one is also the reward a run optimises when it is given none."""
    if kind == "prompts":
        return []
    return ["squad_f1", "exact_match"] if kind == "generation" else ["accuracy"]


class Task:
    """Base class of every task. Subclasses set ``name``, ``kind`` and implement ``examples``.

    Attributes:
        name: registry name.
        kind: ``"classification"``, ``"multiple_choice"``, ``"generation"`` (gold answers) or
            ``"prompts"`` (prompts only, no gold: the rewards of the run judge the completions).
        metrics: names of its evaluation metrics, as registered in ``rewards`` (``["accuracy"]`` for
            classification/multiple choice, ``["squad_f1", "exact_match"]`` for generation, none for
            prompts: there the run's own rewards are the metrics).
        stop: the strings that end a completion because the task's format needs them (SQuAD and DROP:
            ``("\\n",)``, the answer is one line); none by default. Completions always end at EOS, and a
            run's ``--stop`` strings are added to these.
    """

    name: str = "task"
    kind: str = "classification"
    description: str = ""
    stop: tuple[str, ...] = ()

    @property
    def metrics(self) -> list[str]:
        return metrics_of_kind(self.kind)

    def examples(self, split: str, data_dir=None) -> list[Example]:
        """Every example of ``split`` (before sampling). Subclasses implement this."""
        raise NotImplementedError

    def load_split(self, split: str, data_dir=None, n: int | None = None, seed: int = 0, k: int | None = None) -> list[Example]:
        """Examples of ``split`` ("train" | "validation" | "test").

        Args:
            data_dir: the local data directory (default: ``$MEZO_RL_DATA``).
            n: sample this many examples at random (all of them, in file order, when None);
                the paper uses 1000 train / 500 validation / 1000 test (``PAPER_SIZES``).
            seed: the sampling seed (the same seed gives the same examples in the same order).
            k: instead of ``n``, sample k examples per class (the paper's k=16 / k=512 setting).
        """
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        pool = self.examples(split, data_dir)
        if k is not None:
            return sample_per_class(pool, k, seed)
        return sample(pool, n, seed)

    def demonstration(self, example: Example) -> str:
        """The example with its right answer filled in (for in-context learning)."""
        return example.prompt + example.target

    def __repr__(self):
        return f"<Task {self.name!r} ({self.kind})>"


def completion_stops(task, stop=None) -> list[str]:
    """The strings that end a run's completions (besides EOS, which always does): the task's own, where its
    format needs them (``task.stop``: SQuAD's and DROP's newline), then ``stop`` (the run's ``--stop``),
    each once. A prompt task has none of its own: its completions run to EOS unless ``--stop`` says otherwise."""
    return list(dict.fromkeys([*getattr(task, "stop", ()), *(stop or ())]))


def sample(examples: list, n: int | None, seed: int) -> list:
    """n examples drawn without replacement with ``random.Random(seed)``, in random order; all of them,
    in their original order, when n is None."""
    if n is None:
        return list(examples)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    order = list(range(len(examples)))
    rng.shuffle(order)
    return [examples[i] for i in order[:n]]


def sample_per_class(examples: list[Example], k: int, seed: int) -> list[Example]:
    """k examples per label (fewer where a class has fewer), shuffled together."""
    if k < 1:
        raise ValueError(f"k (examples per class) must be >= 1, got {k}")
    if any(ex.label is None for ex in examples):
        raise ValueError("k-shot sampling needs labelled examples (classification or multiple choice)")
    by_label: dict[int, list] = {}
    for ex in examples:
        by_label.setdefault(ex.label, []).append(ex)
    picked = []
    for label in sorted(by_label):
        picked += sample(by_label[label], k, seed + label)
    return sample(picked, len(picked), seed)


def with_demonstrations(task: Task, example: Example, demonstrations: list[Example], separator: str = "\n\n") -> Example:
    """``example`` with k rendered demonstrations prepended to its prompt (the ICL baseline)."""
    if not demonstrations:
        return example
    prefix = separator.join(task.demonstration(d) for d in demonstrations) + separator
    return replace(example, prompt=prefix + example.prompt, mask_prompt=None)


# ---------------------------------------------------------------------- registry
ENTRY_POINT_GROUP = "mezo_rl.tasks"


class UnknownTaskError(UnknownNameError, KeyError):
    """No task of that name is registered (the message suggests close names)."""


def _as_factory(obj, name: str, source: str):
    """What the registry stores: a ``Task`` instance, or a class / function that returns one."""
    if not (isinstance(obj, Task) or callable(obj)):
        raise TypeError(f"task {name!r} ({source}) needs a Task, a Task subclass or a function, got {obj!r}")
    return obj


REGISTRY: Registry = Registry(
    "task", ENTRY_POINT_GROUP, _as_factory, error=UnknownTaskError,
    hint="A task in your own code can be given as 'package.module:name' or 'file.py:name'; your own data as "
         "a file (--task FILE.jsonl/.json/.csv/.tsv --template ...) or a Hugging Face dataset id.")


def register_task(name: str):
    """Register a task under ``name``: decorate a ``Task`` subclass or a function returning a ``Task``,
    or call ``register_task("name")(task_instance)`` to register a ready-made one (e.g. ``from_file``)."""

    def deco(obj):
        return REGISTRY.register(name, _as_factory(obj, name, "register_task"))

    return deco


def get_task(name: str, **kwargs) -> Task:
    """The task ``name``: registered, ``module:object`` / ``file.py:object``, or an entry point of the
    group ``mezo_rl.tasks`` (keyword arguments go to its class or function)."""
    obj = REGISTRY.get(name)
    if isinstance(obj, Task):
        if kwargs:
            raise TypeError(f"task {name!r} is a ready-made instance; it takes no arguments")
        return obj
    task = obj(**kwargs)
    if not isinstance(task, Task):
        raise TypeError(f"task {name!r} was registered with {obj!r}, which returned {type(task).__name__}, not a Task")
    if getattr(task, "name", "task") == "task":
        task.name = name
    return task


def list_tasks() -> list[str]:
    """Registered task names and those of installed packages' ``mezo_rl.tasks`` entry points."""
    return REGISTRY.names()
