"""Tasks: the paper's prompts verbatim, file loading for every built-in task, splits and sampling,
the registry, in-context demonstrations (user file tasks: test_user_tasks.py), clear errors.

The file tests run on tests/data (made-up rows in each task's format); their ``real`` variants, marked
slow, run the same checks on the real data directory."""

import pytest

from mezo_rl import tasks
from mezo_rl.tasks import (KINDS, PAPER_TASKS, Example, UnknownTaskError, get_task, list_tasks, register_task,
                   sample_per_class, with_demonstrations)


@pytest.fixture(params=["fixtures", pytest.param("real", marks=pytest.mark.slow)])
def files(request):
    """(which, directory): tests/data, and (slow) the real data directory."""
    return request.param, request.getfixturevalue("data_dir" if request.param == "fixtures" else "shared_data_dir")


def test_all_paper_tasks_are_registered():
    assert len(PAPER_TASKS) == 15 and set(PAPER_TASKS) <= set(list_tasks())
    for name in PAPER_TASKS:
        task = get_task(name)
        assert task.kind in KINDS
        assert task.metrics == (["squad_f1", "exact_match"] if task.kind == "generation" else ["accuracy"])


@pytest.mark.parametrize("name", PAPER_TASKS)
def test_every_builtin_task_renders_its_files(name, files):
    which, data = files
    task = get_task(name)
    # DROP fills test to ~1000 questions before validation and train: the three fixture passages are all test
    splits = ("test",) if (name, which) == ("drop", "fixtures") else ("train", "validation", "test")
    for split in splits:
        exs = task.load_split(split, data_dir=data, n=20, seed=1)
        assert 0 < len(exs) <= 20
        for ex in exs:
            assert isinstance(ex.prompt, str) and isinstance(ex.columns, dict)
            if task.kind == "generation":
                assert ex.candidates is None and ex.answers and all(a.strip() for a in ex.answers)
                assert ex.answers[0].startswith(" ") and ex.prompt.endswith("Answer:")
            else:
                assert len(ex.candidates) >= 2 and 0 <= ex.label < len(ex.candidates)
                assert all(isinstance(c, str) and c.strip() for c in ex.candidates)
                if ex.mask_prompt is not None:
                    assert ex.mask_prompt.count(tasks.MASK) == 1
                    assert len(ex.mask_candidates) == len(ex.candidates)
            assert task.demonstration(ex).startswith(ex.prompt)


def test_paper_prompts_on_the_fixture_rows(data_dir):
    """Each template on the first test row of tests/data, the rows chosen to exercise its edge cases."""
    def first(name, split="test"):
        return get_task(name).examples(split, data_dir)[0]

    ex = first("rte")  # Table 13's mask prompt drops the premise's final period and lower-cases the hypothesis
    assert ex.prompt == ('The old bridge over the river, built in 1890, was closed for repairs last spring.\n'
                         'Does this mean that "The bridge was closed." is true? Yes or No?\n')
    assert ex.candidates == ["Yes", "No"] and ex.label == 0
    assert ex.mask_prompt == "The old bridge over the river, built in 1890, was closed for repairs last spring? [MASK], the bridge was closed."

    ex = first("cb")
    assert ex.prompt == ('Suppose Mia looked at the map for a long time. Was she lost? '
                         'Can we infer that "Mia was lost"? Yes, No, or Maybe?\n')
    assert ex.candidates == ["Yes", "No", "Maybe"] and ex.label == 2  # neutral

    ex = first("copa")  # the premise loses its period, the choices their capital, except "I"
    assert ex.prompt == "The girl dropped the glass so"
    assert ex.candidates == [" it broke into pieces.", " I laughed at the cat."] and ex.label == 0

    ex = first("wic")
    assert ex.prompt == ('Does the word "class" have the same meaning in these two sentences? Yes, No?\n'
                         "She teaches a class of twenty pupils.\nThe hotel offers travel in first class.\n")
    assert ex.candidates == ["No", "Yes"] and ex.label == 0

    ex = first("wsc")  # the pronoun lower-cased
    assert ex.prompt == ('Jack told Leo about the storm. He laughed at the news.\n'
                         'In the previous sentence, does the pronoun "he" refer to Leo? Yes or No?\n')
    assert ex.label == 1

    ex = first("boolq")  # the question capitalised, with a question mark
    assert ex.prompt.endswith(" the width of the earth. Is the moon bigger than the earth?\n") and ex.label == 0

    ex = first("squad")  # repeated gold answers kept once, each a continuation of "Answer:"
    assert ex.prompt == ("Title: Lake_Verna\nContext: Lake Verna lies above Alde. Its deepest point, 40 metres, is near "
                         "the northern shore.\nQuestion: What is the lake near?\nAnswer:")
    assert ex.answers == [" Alde", " above Alde"]

    ex = first("drop")  # a number, a span and a date answer; a question without an answer is left out
    assert ex.prompt.startswith("Passage: The Hawks scored two field goals") and ex.prompt.endswith(
        "\nQuestion: How many field goals did the Hawks score?\nAnswer:")
    assert [e.answers for e in get_task("drop").examples("test", data_dir)][-3:] == [[" the town"], [" 300"], [" May 4 2018"]]

    ex = first("sst2")
    assert ex.prompt == "a small , kind film that earns every one of its tears . It was"
    assert ex.candidates == [" terrible", " great"] and ex.label == 1
    assert ex.mask_prompt == "a small , kind film that earns every one of its tears . It was [MASK]."

    ex = first("sst5")  # PTB brackets restored
    assert ex.prompt == "the ( long ) middle part is fine . It was" and ex.candidates[ex.label] == " okay."

    ex = first("trec")
    assert ex.prompt == "" and ex.candidates[5] == "Number: How many moons does the planet have ?" and ex.label == 5
    assert ex.mask_prompt == "[MASK]: How many moons does the planet have ?"

    ex = first("mnli")
    assert ex.prompt == "The new park is quiet enough?"
    assert ex.candidates[1] == " Maybe, everyone likes the new park" and ex.label == 1

    ex = first("multirc")
    assert ex.prompt.endswith('\nQuestion: What blocked Hill Road?\nI found this answer "Fallen trees". Is that correct? Yes or No?\n')
    assert ex.label == 1

    ex = first("record")  # one candidate per distinct entity, the first gold entity the label
    assert ex.prompt.startswith("Lima (News) -- ") and "\n- Ana Ruiz opens a new restaurant\n" in ex.prompt
    assert ex.candidates == [f"{e} said the menu will change every week." for e in ("Lima", "Ana Ruiz", "Luis Vega")]
    assert ex.label == 1


@pytest.mark.slow
def test_paper_prompts_verbatim(shared_data_dir):
    def first(name, split="test"):
        return get_task(name).examples(split, shared_data_dir)[0]

    ex = first("rte")
    assert ex.prompt == ('Dana Reeve, the widow of the actor Christopher Reeve, has died of lung cancer at age 44, according '
                         'to the Christopher Reeve Foundation.\nDoes this mean that "Christopher Reeve had an accident." is '
                         'true? Yes or No?\n')
    assert ex.candidates == ["Yes", "No"] and ex.label == 1
    assert ex.mask_prompt.endswith("Foundation? [MASK], christopher Reeve had an accident.")

    ex = first("cb")
    assert ex.prompt.startswith("Suppose Valence the void-brain") and ex.prompt.endswith(
        'Can we infer that "Valence was helping"? Yes, No, or Maybe?\n')
    assert ex.candidates == ["Yes", "No", "Maybe"] and ex.label == 1  # contradiction

    ex = first("copa")
    assert ex.prompt == "The man turned on the faucet so"
    assert ex.candidates == [" the toilet filled with water.", " water flowed from the spout."] and ex.label == 1

    ex = first("wic")
    assert ex.prompt == ('Does the word "class" have the same meaning in these two sentences? Yes, No?\n'
                         "An emerging professional class.\nApologizing for losing your temper, even though you were "
                         "badly provoked, showed real class.\n")
    assert ex.candidates == ["No", "Yes"] and ex.label == 0

    ex = first("wsc")
    assert ex.prompt.endswith('\nIn the previous sentence, does the pronoun "him" refer to anyone? Yes or No?\n')

    ex = first("squad")
    assert ex.prompt.startswith("Title: Super_Bowl_50\nContext: Super Bowl 50 was")
    assert ex.prompt.endswith("\nQuestion: Which NFL team represented the AFC at Super Bowl 50?\nAnswer:")
    assert ex.answers == [" Denver Broncos"]

    ex = first("sst2")
    assert ex.prompt == "it 's a charming and often affecting journey . It was"
    assert ex.candidates == [" terrible", " great"] and ex.label == 1
    assert ex.mask_prompt == "it 's a charming and often affecting journey . It was [MASK]."

    ex = first("trec")
    assert ex.prompt == "" and ex.candidates[5] == "Number: How far is it from Denver to Aspen ?" and ex.label == 5
    assert ex.mask_prompt == "[MASK]: How far is it from Denver to Aspen ?"

    ex = first("mnli")
    assert ex.prompt == "The new rights are nice enough?"
    assert ex.candidates[1] == " Maybe, everyone really likes the newest benefits" and ex.label == 1

    ex = get_task("boolq").examples("test", shared_data_dir)[0]
    assert ex.prompt.endswith(" Does ethanol take more energy make that produces?\n")


def test_splits_are_disjoint_and_sampling_is_seeded(files):
    which, data = files
    (n_train_file, n_val), n_passages = {"fixtures": ((40, 20), 3), "real": ((2490, 500), 217)}[which]
    task = get_task("rte")
    train = {ex.columns["idx"] for ex in task.examples("train", data)}
    val = {ex.columns["idx"] for ex in task.examples("validation", data)}
    assert len(val) == n_val and len(train) == n_train_file - n_val and not train & val
    a = task.load_split("train", data, n=10, seed=3)
    assert [e.prompt for e in a] == [e.prompt for e in task.load_split("train", data, n=10, seed=3)]
    assert [e.prompt for e in a] != [e.prompt for e in task.load_split("train", data, n=10, seed=4)]
    drop = get_task("drop")
    ids = {s: {e.columns["passage_id"] for e in drop.examples(s, data)} for s in ("train", "validation", "test")}
    assert not ids["train"] & ids["test"] and not ids["train"] & ids["validation"] and not ids["validation"] & ids["test"]
    assert len(ids["train"] | ids["validation"] | ids["test"]) == n_passages  # every passage in exactly one split


def test_k_per_class_and_lmbff_files(files):
    which, data = files
    k, k_file = {"fixtures": (4, 2), "real": (16, 16)}[which]  # per class: sampled from train; in the k-shot files
    task = get_task("sst5")
    exs = task.load_split("train", data, k=k, seed=13)
    assert len(exs) == 5 * k and all(sum(e.label == c for e in exs) == k for c in range(5))
    kshot = get_task("trec").load_kshot_files("train", seed=42, data_dir=data)
    assert len(kshot) == 6 * k_file and all(sum(e.label == c for e in kshot) == k_file for c in range(6))
    mnli = get_task("mnli").load_kshot_files("validation", seed=13, data_dir=data)
    assert len(mnli) == 3 * {"fixtures": 3, "real": 16}[which]
    # the real SST-2 k-shot test file is the dev set; tests/data has none, so the task's own test split stands in
    sst2 = get_task("sst2")
    assert len(sst2.load_kshot_files("test", seed=13, data_dir=data)) == len(sst2.examples("test", data))
    with pytest.raises(ValueError, match="no LM-BFF"):
        get_task("copa").load_kshot_files("train", data_dir=data)
    with pytest.raises(ValueError, match="k-shot sampling needs labelled"):
        sample_per_class([Example("q", answers=[" a"])], 2, 0)


def test_missing_files_are_reported_with_a_warning_or_an_error(data_dir, tmp_path, caplog, monkeypatch):
    with caplog.at_level("WARNING", logger="mezo_rl.tasks"):
        tasks.data._warned.clear()
        get_task("boolq").load_split("train", data_dir)
    assert "BoolQ train file is missing" in caplog.text
    with pytest.raises(FileNotFoundError, match="SST-2/train.tsv"):
        get_task("sst2").load_split("train", data_dir=tmp_path)
    with pytest.raises(ValueError, match="split must be one of"):
        get_task("sst2").load_split("dev", data_dir=data_dir)


def test_registry_suggests_close_names_and_accepts_classes_functions_instances():
    with pytest.raises(UnknownTaskError, match="did you mean 'sst2'"):
        get_task("sst-2")
    with pytest.raises(ValueError, match="already registered"):
        register_task("sst2")(tasks.builtin.SST2)

    @register_task("test-fn-task")
    def make(suffix=" !"):
        return from_instance(suffix)

    def from_instance(suffix):
        class T(tasks.Task):
            kind = "classification"

            def examples(self, split, data_dir=None):
                return [Example("x" + suffix, [" a", " b"], 0)]
        return T()

    t = get_task("test-fn-task", suffix=" ?")
    assert t.name == "test-fn-task" and t.load_split("test")[0].prompt == "x ?"


def test_in_context_demonstrations(data_dir):
    task = get_task("sst2")
    demos = task.load_split("train", data_dir, n=2, seed=0)
    ex = task.load_split("test", data_dir, n=1, seed=0)[0]
    icl = with_demonstrations(task, ex, demos)
    d0, d1 = (task.demonstration(d) for d in demos)
    assert icl.prompt == f"{d0}\n\n{d1}\n\n{ex.prompt}" and d0.endswith(demos[0].candidates[demos[0].label])
    assert icl.candidates == ex.candidates and icl.label == ex.label
    gen = get_task("squad")
    q = gen.load_split("train", data_dir, n=1)[0]
    assert gen.demonstration(q) == q.prompt + q.answers[0]


def test_hugging_face_rows_render_like_the_local_files(data_dir):
    """The hub layouts (used when no data directory is given) map onto the same prompts and labels."""
    def one(name, row):
        task = get_task(name)
        return [ex for r in task.hf_rows([row]) for ex in task.make(r)]

    (ex,) = one("trec", {"text": "How many moons does the planet have ?", "coarse_label": 5, "fine_label": 0})
    local = get_task("trec").examples("test", data_dir)[0]
    assert (ex.candidates, ex.label) == (local.candidates, local.label)
    (ex,) = one("trec", {"text": "What does NASA stand for ?", "coarse_label": 0, "fine_label": 0})
    assert ex.candidates[ex.label].startswith("Expression:")  # hub ABBR -> LM-BFF "Expression"
    (ex,) = one("wsc", {"text": "Mark told Pete many lies about himself .", "span1_text": "Pete", "span2_text": "He",
                        "span1_index": 2, "span2_index": 6, "idx": 0, "label": 0})
    assert ex.prompt.endswith('does the pronoun "he" refer to Pete? Yes or No?\n') and ex.label == 0
    (ex,) = one("multirc", {"paragraph": "P.", "question": "Q?", "answer": "A", "label": 1,
                            "idx": {"paragraph": 0, "question": 0, "answer": 0}})
    assert ex.prompt == 'P.\nQuestion: Q?\nI found this answer "A". Is that correct? Yes or No?\n' and ex.label == 1
    (ex,) = one("record", {"passage": "Ann met Bob.\n@highlight\nBob is tall", "query": "@placeholder is tall",
                           "entities": ["Ann", "Bob"], "entity_spans": {}, "answers": ["Bob"],
                           "idx": {"passage": 0, "query": 0}})
    assert ex.prompt == "Ann met Bob.\n- Bob is tall\n" and ex.candidates == ["Ann is tall", "Bob is tall"] and ex.label == 1
    (ex,) = one("squad", {"id": "1", "title": "T", "context": "C", "question": "Q?",
                          "answers": {"text": ["x", "x", "y"], "answer_start": [0, 0, 1]}})
    assert ex.prompt == "Title: T\nContext: C\nQuestion: Q?\nAnswer:" and ex.answers == [" x", " y"]
    (ex,) = one("drop", {"section_id": "s", "query_id": "q", "passage": "P", "question": "Q?",
                         "answers_spans": {"spans": ["3"], "types": ["number"]}})
    assert ex.prompt == "Passage: P\nQuestion: Q?\nAnswer:" and ex.answers == [" 3"]
    assert one("mnli", {"premise": "A.", "hypothesis": "B", "label": -1}) == []
    (ex,) = one("sst5", {"text": "fine . ", "label": 2, "label_text": "neutral"})
    assert ex.prompt == "fine . It was" and ex.candidates[ex.label] == " okay."


def test_without_a_data_directory_the_hub_is_tried(monkeypatch):
    monkeypatch.delenv("MEZO_RL_DATA", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    try:
        exs = get_task("copa").load_split("test", n=3)
    except FileNotFoundError as e:  # offline and not in the HF cache: say so and name both options
        assert "MEZO_RL_DATA" in str(e) and "aps/super_glue" in str(e)
    else:  # the dataset happens to be in the local HF cache
        assert len(exs) == 3 and exs[0].prompt.endswith((" so", " because"))


def test_tasks_are_found_by_module_path_and_unknown_names_are_user_errors():
    from mezo_rl.errors import UnknownNameError

    task = get_task("mezo_rl.tasks.builtin:SST2")  # a Task subclass by import path, as rewards are
    assert task.kind == "classification" and task.load_split is not None
    with pytest.raises(UnknownNameError):
        get_task("sst-2")
    with pytest.raises(KeyError):  # still a KeyError for code that caught the old UnknownTaskError
        get_task("sst-2")
