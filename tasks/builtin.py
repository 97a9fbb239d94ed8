"""The paper's 15 tasks with its prompts.

Table 14 (OPT experiments; prompts from MeZO's ``templates.py``): SST-2, RTE, CB, BoolQ, WSC, WiC,
MultiRC (classification), COPA, ReCoRD (multiple choice), SQuAD, DROP (generation).
Table 13 (RoBERTa experiments, LM-BFF prompts with a mask): SST-5, TREC, MNLI, SNLI, plus SST-2 and
RTE, which carry both. A Table 13 prompt is in ``Example.mask_prompt``; for causal LMs the prompt is
the text before the mask and each candidate is the label word followed by the text after the mask
(``"<S1>?" + " Yes, <s2>"``), so a causal LM scores the whole filled-in template from the mask on.
TREC's mask comes first (``[MASK]: <S1>``): its causal prompt is empty and the candidates are
``"Description: <S1>"`` etc., scored from a start token.

Splits follow MeZO: for the SuperGLUE tasks, SST-2, SQuAD the official validation file is the test
split and the validation split is carved out of the train file (a fixed shuffle, so train and
validation never overlap). Where the data directory lacks a file (BoolQ train, ReCoRD, DROP dev, SNLI/MNLI
train) the task loads what exists and logs a warning saying what stands in; docs/tasks.md lists them.
"""
from __future__ import annotations

import pathlib

from .base import Example, Task, continuation, register_task, MASK
from .data import TaskFileNotFoundError, carve, data_root, find, hub_rows, read, read_table, warn_once

YES_NO = ["No", "Yes"]  # label 0 = false, 1 = true (SuperGLUE booleans)


class FileTask(Task):
    """A task read from files under the data directory.

    Subclasses set ``train_files`` / ``test_files`` (paths relative to the data directory, read and
    concatenated), optionally ``validation_files``, ``n_validation`` (the size of the validation
    split carved from train when there are no validation files), ``notes`` (split -> caveat logged
    when that split is loaded), ``lmbff`` (directory under ``LM-BFF-k-shot``), and implement
    ``rows(path)`` (the raw rows of one file) and ``make(row)`` (the Examples of one row).

    Without a data directory the rows come from the Hugging Face dataset ``hf = (id, config,
    {"train": split, "test": split[, "validation": split]})``, converted to the file layout by ``hf_rows``.
    """

    train_files: tuple = ()
    validation_files: tuple = ()
    test_files: tuple = ()
    n_validation: int = 500
    notes: dict = {}
    lmbff: str | None = None
    hf: tuple | None = None

    def __init__(self):
        self._cache = {}

    def rows(self, path: pathlib.Path) -> list[dict]:
        return read(path)

    def make(self, row: dict) -> list[Example]:
        raise NotImplementedError

    def hf_rows(self, rows: list[dict]) -> list[dict]:
        """Hugging Face rows in the layout ``make`` expects (identity where they already match)."""
        return rows

    def _from_files(self, root, files) -> list[Example]:
        out = []
        for rel in files:
            for row in self.rows(find(root, rel, self.name)):
                out += self.make(row)
        return out

    def _load(self, root, part: str) -> list[Example]:
        """Every example of one source part ("train" | "validation" | "test") from files or the hub."""
        if root is not None:
            files = {"train": self.train_files, "validation": self.validation_files, "test": self.test_files}[part]
            return self._from_files(root, files)
        if self.hf is None:
            raise TaskFileNotFoundError(f"task {self.name!r} needs a data directory (data_dir=... or MEZO_RL_DATA)")
        dataset, config, splits = self.hf
        return [ex for row in self.hf_rows(hub_rows(self.name, dataset, config, splits[part])) for ex in self.make(row)]

    def _has_validation(self, root) -> bool:
        return bool(self.validation_files) if root is not None else "validation" in self.hf[2]

    def examples(self, split: str, data_dir=None) -> list[Example]:
        root = data_root(data_dir)
        key = (split, str(root))
        if key not in self._cache:
            self._cache[key] = self._split(split, root)
        if split in self.notes and root is not None:
            warn_once(f"{self.name} {split}: {self.notes[split]}")
        return self._cache[key]

    def _split(self, split, root) -> list[Example]:
        if split == "test":
            return self._load(root, "test")
        if self._has_validation(root):
            return self._load(root, split)
        pool = self._load(root, "train")
        n_val = min(self.n_validation, len(pool) // 2)
        if n_val < self.n_validation:
            warn_once(f"{self.name}: only {len(pool)} train examples; validation carved from them has {n_val}, not {self.n_validation}")
        validation, train = carve(pool, [n_val])
        return validation if split == "validation" else train

    def load_kshot_files(self, split: str, seed: int = 13, data_dir=None) -> list[Example]:
        """The LM-BFF k=16 split files (``LM-BFF-k-shot/<task>/16-<seed>/``; seeds 13, 21, 42, 87, 100).

        train and validation are the files' train and dev (16 per class each); test is the file's
        test when it exists there, else this task's own test split.
        """
        if self.lmbff is None:
            raise ValueError(f"task {self.name!r} has no LM-BFF k-shot files (those exist for sst2, sst5, trec, rte, mnli, snli)")
        root = data_root(data_dir)
        if root is None:
            raise TaskFileNotFoundError("the LM-BFF k-shot files need a data directory (data_dir=... or MEZO_RL_DATA)")
        folder = root / "LM-BFF-k-shot" / self.lmbff / f"16-{seed}"
        if not folder.is_dir():
            raise TaskFileNotFoundError(f"task {self.name!r}: no LM-BFF k-shot folder {str(folder)!r} (seeds: 13, 21, 42, 87, 100)")
        stem = {"train": "train", "validation": "dev", "test": "test"}[split]
        files = sorted(p for p in folder.iterdir() if p.stem in (stem, stem + "_matched"))
        if not files:
            if split == "test":
                warn_once(f"{self.name}: no LM-BFF test file in {folder}; using the task's own test split")
                return self.examples("test", data_dir)
            raise TaskFileNotFoundError(f"task {self.name!r}: no {stem}.* file in {str(folder)!r}")
        return [ex for row in self.kshot_rows(files[0]) for ex in self.make(row)]

    def kshot_rows(self, path: pathlib.Path) -> list[dict]:
        return self.rows(path)


# ---------------------------------------------------------------------- helpers for the prompts
def _label_index(value, names: list, task: str) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return int(value)
    if value in names:
        return names.index(value)
    raise ValueError(f"task {task!r}: unknown label {value!r} (expected one of {names} or an index)")


def _nli_sentences(premise: str, hypothesis: str) -> tuple[str, str]:
    """LM-BFF's ``*sent-_0*`` (drop the final punctuation) and ``*sentl_1*`` (lower-case the first letter)."""
    s1 = premise.strip()
    if s1 and s1[-1] in ".?!,;:":
        s1 = s1[:-1].rstrip()
    s2 = hypothesis.strip()
    return s1, (s2[:1].lower() + s2[1:])


def _nli_table13(s1: str, s2: str, words: list[str]) -> dict:
    """Table 13's ``<S1> ? [MASK] , <S2>``: as a masked-LM prompt and as a causal prompt + continuations."""
    return dict(
        mask_prompt=f"{s1}? {MASK}, {s2}",
        mask_candidates=[f" {w}" for w in words],
    ), (f"{s1}?", [f" {w}, {s2}" for w in words])


def _ptb(text: str) -> str:
    return text.replace("-lrb-", "(").replace("-rrb-", ")").strip()


# ---------------------------------------------------------------------- Table 14 (+13) classification
@register_task("sst2")
class SST2(FileTask):
    """SST-2 sentiment. Table 14: ``<text> It was terrible/great``; Table 13: ``<S1> It was [MASK] .``"""

    name, kind = "sst2", "classification"
    train_files, test_files = ("SST-2/train.tsv",), ("SST-2/dev.tsv",)
    lmbff = "SST-2"
    hf = ("nyu-mll/glue", "sst2", {"train": "train", "test": "validation"})
    words = [" terrible", " great"]

    def rows(self, path):
        return read_table(path)

    def make(self, row):
        text = row["sentence"].strip()
        return [Example(f"{text} It was", list(self.words), int(row["label"]), columns=row,
                        mask_prompt=f"{text} It was {MASK}.", mask_candidates=list(self.words))]


class SuperGLUEYesNo(FileTask):
    """A SuperGLUE task whose answer is Yes/No after a prompt ending in a newline."""

    kind = "classification"
    label_names = [False, True]
    candidates = YES_NO

    def prompt(self, row) -> str:
        raise NotImplementedError

    def make(self, row):
        label = _label_index(row["label"], self.label_names, self.name)
        return [Example(self.prompt(row), list(self.candidates), label, columns=row)]


@register_task("rte")
class RTE(SuperGLUEYesNo):
    """RTE. Table 14: ``<premise>\\nDoes this mean that "<hypothesis>" is true? Yes or No?\\n`` Yes/No;
    Table 13 (masked LMs): ``<S1> ? [MASK] , <S2>`` with Yes/No."""

    name = "rte"
    train_files, test_files = ("RTE/train.jsonl",), ("RTE/val.jsonl",)
    label_names, candidates = ["entailment", "not_entailment"], ["Yes", "No"]
    lmbff = "RTE"
    hf = ("aps/super_glue", "rte", {"train": "train", "test": "validation"})

    def kshot_rows(self, path):
        return [dict(premise=r["sentence1"], hypothesis=r["sentence2"], label=r["label"]) for r in read_table(path)]

    def prompt(self, row):
        return f"{row['premise']}\nDoes this mean that \"{row['hypothesis']}\" is true? Yes or No?\n"

    def make(self, row):
        (ex,) = super().make(row)
        mask, _ = _nli_table13(*_nli_sentences(row["premise"], row["hypothesis"]), ["Yes", "No"])
        ex.mask_prompt, ex.mask_candidates = mask["mask_prompt"], mask["mask_candidates"]
        return [ex]


@register_task("cb")
class CB(SuperGLUEYesNo):
    """CB. ``Suppose <premise> Can we infer that "<hypothesis>"? Yes, No, or Maybe?\\n`` Yes/No/Maybe."""

    name = "cb"
    train_files, test_files = ("CB/train.jsonl",), ("CB/val.jsonl",)
    label_names, candidates = ["entailment", "contradiction", "neutral"], ["Yes", "No", "Maybe"]
    hf = ("aps/super_glue", "cb", {"train": "train", "test": "validation"})
    n_validation = 100  # CB has 250 train examples (MeZO also uses 100 for validation)

    def prompt(self, row):
        return f"Suppose {row['premise']} Can we infer that \"{row['hypothesis']}\"? Yes, No, or Maybe?\n"


@register_task("boolq")
class BoolQ(SuperGLUEYesNo):
    """BoolQ. ``<passage> <question>?\\n`` Yes/No."""

    name = "boolq"
    train_files = ("BoolQ/FewGLUE/train.jsonl", "BoolQ/FewGLUE_32dev/dev32.jsonl")
    test_files = ("BoolQ/val.jsonl",)
    hf = ("aps/super_glue", "boolq", {"train": "train", "test": "validation"})
    notes = {
        "train": "the BoolQ train file is missing from the data directory; train and validation come from the 64 "
        "FewGLUE stand-in examples (BoolQ/FewGLUE*/, drawn from BoolQ train)",
        "validation": "validation is carved from the 64 FewGLUE stand-in examples (BoolQ train is missing)",
    }

    def prompt(self, row):
        q = row["question"].strip()
        q = q[:1].upper() + q[1:]
        return f"{row['passage']} {q.rstrip('?')}?\n"


@register_task("wsc")
class WSC(SuperGLUEYesNo):
    """WSC. ``<text>\\nIn the previous sentence, does the pronoun "<span2>" refer to <span1>? Yes or No?\\n``"""

    name = "wsc"
    train_files, test_files = ("WSC/train.jsonl",), ("WSC/val.jsonl",)
    n_validation = 100
    hf = ("aps/super_glue", "wsc.fixed", {"train": "train", "test": "validation"})

    def hf_rows(self, rows):
        return [dict(r, target=dict(span1_text=r["span1_text"], span2_text=r["span2_text"])) for r in rows]

    def prompt(self, row):
        t = row["target"]
        return (f"{row['text']}\nIn the previous sentence, does the pronoun \"{t['span2_text'].lower()}\" "
                f"refer to {t['span1_text']}? Yes or No?\n")


@register_task("wic")
class WiC(SuperGLUEYesNo):
    """WiC. ``Does the word "<word>" have the same meaning in these two sentences? Yes, No?\\n<sent1>\\n<sent2>\\n``"""

    name = "wic"
    train_files, test_files = ("WiC/train.jsonl",), ("WiC/val.jsonl",)
    hf = ("aps/super_glue", "wic", {"train": "train", "test": "validation"})

    def prompt(self, row):
        return (f"Does the word \"{row['word']}\" have the same meaning in these two sentences? Yes, No?\n"
                f"{row['sentence1']}\n{row['sentence2']}\n")


@register_task("multirc")
class MultiRC(SuperGLUEYesNo):
    """MultiRC, one example per answer option.
    ``<paragraph>\\nQuestion: <question>\\nI found this answer "<answer>". Is that correct? Yes or No?\\n``"""

    name = "multirc"
    train_files, test_files = ("MultiRC/train.jsonl",), ("MultiRC/val.jsonl",)
    hf = ("aps/super_glue", "multirc", {"train": "train", "test": "validation"})

    def hf_rows(self, rows):  # the hub's MultiRC is already one row per answer option
        return [dict(passage=dict(text=r["paragraph"], questions=[dict(question=r["question"], idx=r["idx"]["question"],
                     answers=[dict(text=r["answer"], label=r["label"], idx=r["idx"]["answer"])])]), idx=r["idx"]["paragraph"])
                for r in rows]

    def make(self, row):
        out, paragraph = [], row["passage"]["text"]
        for q in row["passage"]["questions"]:
            for a in q["answers"]:
                prompt = (f"{paragraph}\nQuestion: {q['question']}\n"
                          f"I found this answer \"{a['text']}\". Is that correct? Yes or No?\n")
                cols = dict(paragraph=paragraph, question=q["question"], answer=a["text"], label=a["label"],
                            idx=row.get("idx"), question_idx=q.get("idx"), answer_idx=a.get("idx"))
                out.append(Example(prompt, list(YES_NO), int(a["label"]), columns=cols))
        return out


# ---------------------------------------------------------------------- multiple choice
@register_task("copa")
class COPA(FileTask):
    """COPA. ``<premise> so/because <candidate>`` (premise without its final period, candidate lower-cased)."""

    name, kind = "copa", "multiple_choice"
    train_files, test_files = ("COPA/train.jsonl",), ("COPA/val.jsonl",)
    n_validation = 100
    hf = ("aps/super_glue", "copa", {"train": "train", "test": "validation"})

    def make(self, row):
        premise = row["premise"].strip()
        premise = premise[:-1] if premise.endswith(".") else premise
        conj = {"cause": "because", "effect": "so"}[row["question"]]

        def lower(c):
            first, _, rest = c.partition(" ")
            return " ".join([first if first == "I" else first.lower()] + ([rest] if rest else []))

        return [Example(f"{premise} {conj}", [" " + lower(row["choice1"]), " " + lower(row["choice2"])],
                        int(row["label"]), columns=row)]


@register_task("record")
class ReCoRD(FileTask):
    """ReCoRD. ``<passage>\\n<query with @placeholder replaced by the candidate entity>``; the candidates
    are the passage's distinct entities; the first gold entity is the label."""

    name, kind = "record", "multiple_choice"
    train_files, test_files = ("ReCoRD/FewGLUE/train.jsonl",), ("ReCoRD/FewGLUE_32dev/dev32.jsonl",)
    notes = {s: "ReCoRD train/val files are missing from the data directory; using the FewGLUE stand-ins (32 train "
             "examples, 32 'dev32' examples as test, all drawn from ReCoRD train)" for s in ("train", "validation", "test")}

    hf = ("aps/super_glue", "record", {"train": "train", "test": "validation"})

    def hf_rows(self, rows):  # the hub gives one row per query, entities as strings
        return [dict(passage=dict(text=r["passage"], entity_names=r["entities"]),
                     qas=[dict(query=r["query"], answers=[dict(text=a) for a in r["answers"]], idx=r["idx"]["query"])])
                for r in rows]

    def make(self, row):
        text = row["passage"]["text"]
        entities = []
        names = row["passage"].get("entity_names") or [text[e["start"] : e["end"] + 1] for e in row["passage"]["entities"]]
        for name in names:  # SuperGLUE entity spans are inclusive
            if name not in entities:
                entities.append(name)
        passage = text.replace("@highlight\n", "- ")
        out = []
        for qa in row["qas"]:
            gold = [a["text"] for a in qa.get("answers", [])]
            label = next((i for i, e in enumerate(entities) if e in gold), None)
            if label is None:
                continue  # no gold entity among the candidates: cannot be scored
            cands = [qa["query"].replace("@placeholder", e) for e in entities]
            cols = dict(passage=text, query=qa["query"], entities=entities, answers=gold, idx=qa.get("idx"))
            out.append(Example(f"{passage}\n", cands, label, columns=cols))
        return out


# ---------------------------------------------------------------------- generation
@register_task("squad")
class SQuAD(FileTask):
    """SQuAD v1.1. ``Title: <title>\\nContext: <context>\\nQuestion: <question>\\nAnswer:`` (greedy generation)."""

    name, kind = "squad", "generation"
    stop = ("\n",)  # the answer is the line after "Answer:"
    train_files, test_files = ("SQuAD/train-v1.1.json",), ("SQuAD/dev-v1.1.json",)
    hf = ("rajpurkar/squad", None, {"train": "train", "test": "validation"})

    def hf_rows(self, rows):
        return [dict(title=r["title"], context=r["context"], question=r["question"], id=r["id"],
                     answers=list(r["answers"]["text"])) for r in rows]
    notes = {s: "SQuAD train is a partial file (3,807 of 87,599 questions, 11 articles); train and validation "
             "are drawn from it, from different articles" for s in ("train", "validation")}

    def _split(self, split, root):
        """Test: the official dev file. Validation: whole articles of the train file (the smallest first, ties by
        title, taken until it holds ``n_validation`` questions), so that no validation question shares its
        article, and the answers in it, with a training question; train: the other articles."""
        if split == "test":
            return super()._split(split, root)
        by_title: dict = {}
        for ex in self._load(root, "train"):
            by_title.setdefault(ex.columns["title"], []).append(ex)
        articles = [by_title[t] for t in sorted(by_title, key=lambda t: (len(by_title[t]), t))]
        validation, k = [], 0
        while k < len(articles) - 1 and len(validation) < self.n_validation:  # train keeps one article at least
            validation += articles[k]
            k += 1
        return validation if split == "validation" else [ex for group in articles[k:] for ex in group]

    def rows(self, path):
        return [dict(title=a["title"], context=p["context"], question=q["question"], id=q["id"],
                     answers=[x["text"] for x in q["answers"]])
                for a in read(path)["data"] for p in a["paragraphs"] for q in p["qas"]]

    def make(self, row):
        prompt = f"Title: {row['title']}\nContext: {row['context']}\nQuestion: {row['question']}\nAnswer:"
        answers = list(dict.fromkeys(a.strip() for a in row["answers"]))
        return [Example(prompt, answers=[continuation(prompt, a) for a in answers], columns=row)]


@register_task("drop")
class DROP(FileTask):
    """DROP. ``Passage: <context>\\nQuestion: <question>\\nAnswer:`` (greedy generation).

    Only a 217-passage prefix of the DROP train file exists locally: test (~1000 questions),
    validation (~500) and train are carved from it by passage, so no passage is in two splits.
    """

    name, kind = "drop", "generation"
    stop = ("\n",)  # the answer is the line after "Answer:"
    train_files = ("DROP/drop_dataset_train.json",)
    hf = ("ucinlp/drop", None, {"train": "train", "test": "validation"})

    def hf_rows(self, rows):
        return [dict(passage_id=r["section_id"], passage=r["passage"], question=r["question"], query_id=r["query_id"],
                     answers=list(dict.fromkeys(r["answers_spans"]["spans"]))) for r in rows]
    notes = {s: "DROP dev is missing and train is a 217-passage prefix; test, validation and train are carved from "
             "that prefix by passage" for s in ("train", "validation", "test")}

    def rows(self, path):
        return [dict(passage_id=pid, passage=p["passage"], question=qa["question"], query_id=qa["query_id"],
                     answers=self._answers(qa["answer"]))
                for pid, p in read(path).items() for qa in p["qa_pairs"]]

    @staticmethod
    def _answers(ans) -> list[str]:
        if ans.get("number"):
            return [str(ans["number"])]
        if ans.get("spans"):
            return list(ans["spans"])
        d = ans.get("date") or {}
        date = " ".join(x for x in (d.get("month", ""), d.get("day", ""), d.get("year", "")) if x)
        return [date] if date else []

    def make(self, row):
        if not row["answers"]:
            return []
        prompt = f"Passage: {row['passage']}\nQuestion: {row['question']}\nAnswer:"
        return [Example(prompt, answers=[continuation(prompt, a.strip()) for a in row["answers"]], columns=row)]

    def _split(self, split, root):
        if root is None:  # the hub has DROP's train and dev: the usual splits
            return super()._split(split, root)
        by_passage: dict = {}
        for ex in self._from_files(root, self.train_files):
            by_passage.setdefault(ex.columns["passage_id"], []).append(ex)
        (passages,) = carve(list(by_passage.values()), [])
        parts, current, targets = [[], [], []], 0, [1000, 500]
        for group in passages:  # fill test to ~1000 questions, then validation to ~500, then train
            if current < 2 and len(parts[current]) >= targets[current]:
                current += 1
            parts[current] += group
        return dict(zip(("test", "validation", "train"), parts))[split]


# ---------------------------------------------------------------------- Table 13 (LM-BFF prompts)
@register_task("sst5")
class SST5(FileTask):
    """SST-5. Table 13: ``<S1> It was [MASK] .`` with great/good/okay/bad/terrible."""

    name, kind = "sst5", "classification"
    train_files, validation_files, test_files = ("SST-5/train.tsv",), ("SST-5/dev.tsv",), ("SST-5/test.tsv",)
    lmbff = "sst-5"
    hf = ("SetFit/sst5", None, {"train": "train", "validation": "validation", "test": "test"})

    def hf_rows(self, rows):
        return [dict(label=r["label"], sentence=r["text"].strip()) for r in rows]
    words = ["terrible", "bad", "okay", "good", "great"]  # labels 0 (very negative) .. 4 (very positive)

    def rows(self, path):
        r = read_table(path, header=False)
        return [dict(label=int(x[0]), sentence=_ptb(x[1])) for x in r]

    def make(self, row):
        s = row["sentence"]
        return [Example(f"{s} It was", [f" {w}." for w in self.words], int(row["label"]), columns=row,
                        mask_prompt=f"{s} It was {MASK}.", mask_candidates=[f" {w}" for w in self.words])]


@register_task("trec")
class TREC(FileTask):
    """TREC coarse question type. Table 13: ``[MASK] : <S1>`` with Description/Entity/Expression/Human/Location/Number."""

    name, kind = "trec", "classification"
    train_files, test_files = ("TREC/train.csv",), ("TREC/test.csv",)
    lmbff = "trec"
    hf = ("CogComp/trec", None, {"train": "train", "test": "test"})
    HF_COARSE = [2, 1, 0, 3, 4, 5]  # the hub's coarse_label order is ABBR, ENTY, DESC, HUM, LOC, NUM

    def hf_rows(self, rows):
        return [dict(label=self.HF_COARSE[r["coarse_label"]], question=r["text"].strip()) for r in rows]
    words = ["Description", "Entity", "Expression", "Human", "Location", "Number"]  # labels 0..5 (LM-BFF order)

    def rows(self, path):
        return [dict(label=int(x[0]), question=x[1].strip()) for x in read_table(path, header=False)]

    def make(self, row):
        q = row["question"]
        return [Example("", [f"{w}: {q}" for w in self.words], int(row["label"]), columns=row,
                        mask_prompt=f"{MASK}: {q}", mask_candidates=list(self.words))]


class NLI13(FileTask):
    """MNLI / SNLI with Table 13's ``<S1> ? [MASK] , <S2>`` and Yes/Maybe/No."""

    kind = "classification"
    label_names = ["entailment", "neutral", "contradiction"]
    words = ["Yes", "Maybe", "No"]

    def kshot_rows(self, path):
        return [dict(premise=r["sentence1"], hypothesis=r["sentence2"], label=r["gold_label"]) for r in read_table(path)]

    def rows(self, path):
        return self.kshot_rows(path) if path.suffix == ".tsv" else read(path)

    def hf_rows(self, rows):
        return [r for r in rows if r["label"] in (0, 1, 2)]  # -1: no gold label

    def make(self, row):
        mask, (prompt, cands) = _nli_table13(*_nli_sentences(row["premise"], row["hypothesis"]), self.words)
        label = _label_index(row["label"], self.label_names, self.name)
        return [Example(prompt, cands, label, columns=row, **mask)]

    def _split(self, split, root):
        if root is None or split == "test":  # the hub has the full train sets
            return super()._split(split, root)
        files = sorted((root / "LM-BFF-k-shot" / self.lmbff).glob("16-*/*.tsv"))
        files = [f for f in files if f.stem in ("train", "dev", "dev_matched")]
        if not files:
            raise TaskFileNotFoundError(f"task {self.name!r}: no LM-BFF k-shot files under {str(root / 'LM-BFF-k-shot' / self.lmbff)!r}")
        seen, pool = set(), []
        for f in files:  # the union of the five seeds' train and dev files, without duplicates
            for row in self.kshot_rows(f):
                key = (row["premise"], row["hypothesis"])
                if key not in seen:
                    seen.add(key)
                    pool += self.make(row)
        validation, train = carve(pool, [len(pool) // 4])
        return validation if split == "validation" else train


@register_task("mnli")
class MNLI(NLI13):
    name, test_files, lmbff = "mnli", ("MNLI/dev.jsonl",), "MNLI"
    hf = ("nyu-mll/glue", "mnli", {"train": "train", "test": "validation_matched"})
    notes = {s: "MNLI train is missing from the data directory; train and validation come from the union of the "
             "LM-BFF k=16 files (5 seeds, 16 per class each), so k=512 is not available" for s in ("train", "validation")}


@register_task("snli")
class SNLI(NLI13):
    name, test_files, lmbff = "snli", ("SNLI/dev.jsonl",), "SNLI"
    hf = ("stanfordnlp/snli", None, {"train": "train", "validation": "validation", "test": "test"})
    notes = {s: "SNLI train is missing from the data directory; train and validation come from the union of the "
             "LM-BFF k=16 files (5 seeds, 16 per class each), so k=512 is not available" for s in ("train", "validation")}


PAPER_TASKS = ["sst2", "rte", "cb", "boolq", "wsc", "wic", "multirc", "copa", "record", "squad", "drop",
               "sst5", "trec", "mnli", "snli"]
