"""evaluate(): accuracy from argmax mean log-likelihood, generation metrics, masked LMs, ICL, errors."""
import json

import pytest
import torch

from mezo_rl.training.evaluation import evaluate
from mezo_rl.model.lm import LanguageModel
from mezo_rl.rewards.squad import normalize_answer
from mezo_rl.tasks import Example, Task, get_task, with_demonstrations


class ListTask(Task):
    def __init__(self, kind, examples):
        self.kind, self._examples, self.name = kind, examples, "list"

    def examples(self, split, data_dir=None):
        return self._examples


def test_classification_accuracy_is_argmax_of_mean_loglik(tiny_causal_lm, data_dir):
    lm = LanguageModel(*tiny_causal_lm, batch_size=5)
    task = get_task("sst2")
    exs = task.load_split("validation", data_dir, n=12, seed=0)
    with torch.no_grad():
        scores = lm.score([e.prompt for e in exs], [e.candidates for e in exs])
    right = [float(int(s.mean.argmax()) == e.label) for s, e in zip(scores, exs)]
    expected, n = sum(right) / len(exs), len(exs)
    se = (sum((r - expected) ** 2 for r in right) / (n - 1) / n) ** 0.5  # the sample SE of the mean
    assert evaluate(lm, task, exs, batch_size=5) == {"accuracy": pytest.approx(expected),
                                                     "accuracy/se": pytest.approx(se), "n": 12}
    # gold = the model's own choice -> accuracy 1; gold = its least likely candidate -> 0
    mine = [Example(e.prompt, e.candidates, int(s.mean.argmax())) for s, e in zip(scores, exs)]
    worst = [Example(e.prompt, e.candidates, int(s.mean.argmin())) for s, e in zip(scores, exs)]
    assert evaluate(lm, task, mine)["accuracy"] == 1.0
    assert evaluate(lm, task, worst)["accuracy"] == 0.0


def test_generation_metrics(tiny_causal_lm):
    lm = LanguageModel(*tiny_causal_lm)
    prompts = ["Question : what is the capital of France ? Answer :", "the sun rose early and", "It was", "Yes or"]
    outs = lm.generate(prompts, max_new_tokens=8)
    task = ListTask("generation", [])
    right = [Example(p, answers=[" zzz", o]) for p, o in zip(prompts, outs) if normalize_answer(o)]
    assert right  # some completion has words left after SQuAD normalisation
    wrong = [Example(p, answers=[" 12345 qqq"]) for p in prompts]
    res = evaluate(lm, task, right, max_new_tokens=8)
    assert {k: res.pop(k) for k in ("squad_f1", "exact_match", "n")} == {"squad_f1": 1.0, "exact_match": 1.0, "n": len(right)}
    assert res.keys() == {"squad_f1/se", "exact_match/se"}  # every answer right: no spread (NaN from one answer)
    assert all(v == 0.0 if len(right) > 1 else v != v for v in res.values())
    res = evaluate(lm, task, wrong, max_new_tokens=8)
    assert res["exact_match"] == 0.0 and res["squad_f1"] < 1.0


def _six_questions() -> list:
    """Generation examples of different prompt lengths (so which of them share a forward pass matters)."""
    prompts = ["Question : what is the capital of France ? Answer :", "the sun rose early and", "It was",
               "Yes or", "the cat sat on the mat and then", "once upon a"]
    return [Example(p, answers=[" zzz"]) for p in prompts]


def test_evaluation_forward_passes_hold_its_batch_size(tiny_causal_lm):
    """``evaluate(batch_size=B)`` decodes B prompts per forward pass (not the LM's own batch size, which
    it restores after, exception or not), and the metrics do not depend on it."""
    lm, task, examples = LanguageModel(*tiny_causal_lm, batch_size=2), ListTask("generation", []), _six_questions()
    rows = []
    hook = lm._base.register_forward_pre_hook(lambda m, args, kw: rows.append(kw["input_ids"].shape[0]),
                                              with_kwargs=True)
    try:
        small = evaluate(lm, task, examples, batch_size=2, max_new_tokens=4)
        assert set(rows) == {2} and lm.batch_size == 2
        rows.clear()
        big = evaluate(lm, task, examples, batch_size=6, max_new_tokens=4)
        assert set(rows) == {6} and lm.batch_size == 2
        with pytest.raises(ValueError, match="no examples"):
            evaluate(lm, task, [], batch_size=6)
        with pytest.raises(ZeroDivisionError):
            with lm.batches_of(5):
                1 / 0
        assert lm.batch_size == 2
    finally:
        hook.remove()
    assert small == big


def test_the_same_examples_in_another_order_make_the_same_forward_passes(tiny_causal_lm, monkeypatch):
    """A seed's shuffle of the test split must not change its score: the calls hold the same examples (so the
    same rows, padding and rounding) whatever order they come in, and the metrics are equal bit for bit."""
    import mezo_rl.training.evaluation as ev

    monkeypatch.setattr(ev, "EXAMPLES_PER_CALL", 2)  # 3 calls of 2: which examples share one is the point
    lm, task, examples = LanguageModel(*tiny_causal_lm, batch_size=2), ListTask("generation", []), _six_questions()
    seen = []
    hook = lm._base.register_forward_pre_hook(lambda m, args, kw: seen.append(kw["input_ids"].tolist()), with_kwargs=True)
    try:
        runs = []
        for order in (examples, examples[::-1], [examples[i] for i in (3, 0, 5, 1, 4, 2)]):
            seen.clear()
            runs.append((evaluate(lm, task, order, batch_size=2, max_new_tokens=3), [x for x in seen if len(x[0]) > 1]))
    finally:
        hook.remove()
    (first, prefills), *others = runs
    assert len(prefills) == 3
    for result, other_prefills in others:
        assert other_prefills == prefills and result == first


def test_masked_lm_uses_the_table13_prompt(tiny_masked_lm, data_dir):
    lm = LanguageModel(*tiny_masked_lm)
    exs = get_task("sst5").load_split("test", data_dir, n=6, seed=0)
    res = evaluate(lm, get_task("sst5"), exs)
    assert res["n"] == 6 and 0.0 <= res["accuracy"] <= 1.0
    with pytest.raises(ValueError, match="no masked-LM prompt"):
        evaluate(lm, get_task("copa"), get_task("copa").load_split("test", data_dir, n=2))


def test_in_context_demonstrations_change_the_prompt(tiny_causal_lm, data_dir):
    lm = LanguageModel(*tiny_causal_lm)
    task = get_task("rte")
    exs = task.load_split("test", data_dir, n=4, seed=0)
    demos = task.load_split("train", data_dir, n=2, seed=0)
    icl = evaluate(lm, task, exs, demonstrations=demos)
    prompts = [with_demonstrations(task, e, demos).prompt for e in exs]
    assert all(p.startswith(task.demonstration(demos[0]) + "\n\n") for p in prompts)
    with torch.no_grad():
        scores = lm.score(prompts, [e.candidates for e in exs])
    expected = sum(int(s.mean.argmax()) == e.label for s, e in zip(scores, exs)) / 4
    assert icl["accuracy"] == pytest.approx(expected) and icl["n"] == 4 and icl.keys() == {"accuracy", "accuracy/se", "n"}
    with pytest.raises(ValueError, match="causal LMs only"):
        evaluate(LanguageModel(*_masked(lm)), task, exs, demonstrations=demos)


def _masked(_):
    from conftest import _train_tokenizer, make_tiny_masked_lm

    tok = _train_tokenizer(mask=True)
    return make_tiny_masked_lm(tok), tok


def test_bad_input(tiny_causal_lm):
    lm = LanguageModel(*tiny_causal_lm)
    task = ListTask("classification", [])
    with pytest.raises(ValueError, match="no examples"):
        evaluate(lm, task, [])
    with pytest.raises(ValueError, match="needs generated text"):
        evaluate(lm, task, [Example("a", [" b", " c"], 0)], metrics=["squad_f1"])


def test_a_user_metric_is_both_a_training_reward_and_an_evaluation_metric(tmp_path, tiny_causal_lm):
    """One reward reading candidate_scores, labels and a dataset column: it drives training and is
    reported by evaluate(), through the same examples -> model outputs -> objective path."""
    from conftest import FLOAT32_UNIT_ROUNDOFF, float32_rounding_bound, make_tiny_causal_lm, model_reduction_terms
    from mezo_rl.training.outputs import objective_outputs
    from mezo_rl.training.arguments import MeZOConfig
    from mezo_rl.training.trainer import MeZOTrainer
    from mezo_rl.rewards import build_objective, register_reward, unregister_reward

    @register_reward("test_weighted_margin", higher_is_better=True, needs="scores")
    def weighted_margin(prompts, candidate_scores, labels, weight):
        """weight * (mean log-likelihood of the gold candidate - that of the other one)."""
        return [w * float(s.mean[y] - s.mean[1 - y]) for s, y, w in zip(candidate_scores, labels, weight)]

    model, tok = tiny_causal_lm
    lm = LanguageModel(model, tok)
    words = ["good", "bad", "great", "dull", "warm", "sad", "fun", "cold"]
    exs = [Example(f"the movie was {w} . It was", [" terrible", " great"], i % 2, columns={"weight": 1.0 + i})
           for i, w in enumerate(words)]
    try:
        with torch.no_grad():
            scores = lm.score([e.prompt for e in exs], [e.candidates for e in exs])
        expected = [(1.0 + i) * float(s.mean[e.label] - s.mean[1 - e.label]) for i, (s, e) in enumerate(zip(scores, exs))]
        # as an evaluation metric (in batches of 3: the sums add up over batches)
        res = evaluate(lm, get_task("sst2"), exs, batch_size=3, metrics=["test_weighted_margin"])
        # Batches of 3 are scored in other shapes than the whole list, so each float32 mean log-likelihood may
        # differ in summation order: within 2 delta of ours (conftest.float32_rounding_bound), a margin within
        # 4 delta, plus the rounding of its float32 subtraction in each (u |margin| <= 2 u max|mean|), times the weight.
        longest = max(len(tok(e.prompt + c)["input_ids"]) for e in exs for c in e.candidates)
        biggest = max(float(s.mean.abs().max()) for s in scores)
        delta = float32_rounding_bound(biggest, model_reduction_terms(model, longest) + max(int(s.n_tokens.max()) for s in scores))
        tol = sum((1.0 + i) * (4 * delta + 2 * 2 * FLOAT32_UNIT_ROUNDOFF * biggest) for i in range(len(exs))) / len(exs)
        assert res["n"] == len(exs) and abs(res["test_weighted_margin"] - sum(expected) / len(exs)) <= tol
        # the same value as the training objective's component on the same examples (one batch of 8: same bound)
        out = objective_outputs(lm, build_objective(["test_weighted_margin"]), exs)
        assert abs(out.components["test_weighted_margin"] - res["test_weighted_margin"]) <= tol
        # as a training reward
        args = MeZOConfig(model="tiny", task="sst2", reward=["test_weighted_margin"], max_steps=2, per_device_train_batch_size=4,
                                 eval_steps=2, learning_rate=1e-3, eps=1e-2, autocast="none", progress=False,
                                 output_dir=str(tmp_path / "run"))
        factory = lambda: LanguageModel(make_tiny_causal_lm(tok), tok)
        trainer = MeZOTrainer(args=args, lm=lm, lm_factory=factory, task=get_task("sst2"),
                          splits={"train": exs, "validation": exs, "test": []})
        trainer.train()
        records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert all(isinstance(r["reward/test_weighted_margin"], float) for r in records if "split" not in r)
        # a missing column is named before anything runs, in evaluation as in training
        plain = [Example(e.prompt, e.candidates, e.label) for e in exs]
        with pytest.raises(ValueError, match=r"needs column\(s\) \['weight'\]"):
            evaluate(lm, get_task("sst2"), plain, metrics=["test_weighted_margin"])
    finally:
        unregister_reward("test_weighted_margin")
