"""A Hugging Face `evaluate` metric script kept on disk (tests/test_rewards.py loads it offline)."""
import datasets
import evaluate


class WordOverlap(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Fraction of the reference's distinct words that the prediction contains.",
            citation="", inputs_description="predictions, references: lists of strings",
            features=datasets.Features({"predictions": datasets.Value("string"),
                                        "references": datasets.Value("string")}))

    def _compute(self, predictions, references):
        scores = [len(set(p.split()) & set(r.split())) / max(1, len(set(r.split())))
                  for p, r in zip(predictions, references)]
        return {"overlap": sum(scores) / len(scores)}
