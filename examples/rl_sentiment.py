"""RL on prompts: make SmolLM2-135M continue movie reviews more positively, with a black-box reward.

The prompts are the openings (first words) of SST-2 review sentences, a prompt-only dataset in TRL's
format (``{"prompt": ...}``, no gold answer). The reward is VADER's positivity of the completion
(``examples/sentiment_reward.py``): a third-party scorer that mezo-rl only calls. Held-out prompts
come from SST-2's test split, so the gain is measured on reviews never trained on; ``distinct_2``
and the completions' length show whether the text stays text.

The defaults train the final norm's gains (``--peft norm``) for 90 steps of 16 prompts. Each step
has 4 SPSA samples, so 8 members (+eps and -eps of each), and every member writes greedy completions:
the completions the held-out evaluation scores. The 8 members decode together as one batch
(``--member-evaluation auto`` picks the batched mode for these short prompts). The step is the norm mode's
FZOO-style one (Rademacher z, loss differences divided by the spread of the 8 members' losses, their
mean taken over the 4 samples) with lr 0.1. ``--num-generations 4 --reward-shaping group`` trains on
sampled completions with GRPO-style per-prompt shaping instead (benchmarks/rl.py compares the two).
``--repetition-weight W`` adds a second reward beside positivity, ``repetition`` (sentiment_reward.py:
minus the share of a completion's word bigrams that repeat an earlier one), weighted W: a guard against
the loops of positive words a lexicon rewards.

    python examples/rl_sentiment.py                      # write the prompts, train, print before -> after
    python examples/rl_sentiment.py --prompts-only       # only write the JSONL files (for `mezo-rl train`)
    python examples/rl_sentiment.py --resume             # continue a stopped run

The same run from the command line, once the prompts are written:

    mezo-rl train --task runs/rl_sentiment/prompts/train.jsonl \\
        --validation-file runs/rl_sentiment/prompts/validation.jsonl \\
        --test-file runs/rl_sentiment/prompts/test.jsonl \\
        --reward examples/sentiment_reward.py:positivity --max-completion-length 24 --num-train 1000 \\
        --num-eval 64 --num-test 200 --eval-steps 30 --eval-batch-size 64 --log-completions 200 \\
        --output-dir runs/rl_sentiment/run

(90 steps of 16, 4 SPSA samples and lr 0.1 are what ``mezo-rl train`` gives a prompt task in the norm
mode: ``mezo_rl.training.defaults.PROMPT_TASK_DEFAULTS``.)

Needs the data directory (``--data-dir`` or ``$MEZO_RL_DATA``, holding ``SST-2/LM-BFF-original/``)
and the SmolLM2 package (see README). Measured figures: docs/rl.md.
"""
import argparse
import json
import os
import pathlib
import random
import sys

from mezo_rl.training.arguments import MeZOConfig
from mezo_rl.cli.plots import results_line
from mezo_rl.training.trainer import MeZOTrainer, TrainingInterrupted

HERE = pathlib.Path(__file__).resolve().parent
PREFIX = "Movie review: "


def openings(path: pathlib.Path, header: bool, words: int) -> list[str]:
    """The first ``words`` words of each review sentence of an SST-2 LM-BFF file (``sentence<TAB>label``
    under a header, or ``label sentence`` without one), duplicates dropped."""
    lines = path.read_text(encoding="utf-8").splitlines()[1 if header else 0:]
    out = []
    for line in lines:
        sentence = line.split("\t", 1)[0] if header else line.split(" ", 1)[1]
        tokens = sentence.split()
        if len(tokens) > words + 2:  # long enough that an opening leaves something to write
            out.append(" ".join(tokens[:words]))
    return list(dict.fromkeys(out))


def write_prompts(data_dir: pathlib.Path, out_dir: pathlib.Path, n_train: int, n_val: int, n_test: int,
                  words: int) -> dict:
    """prompts/{train,validation,test}.jsonl: train and validation from SST-2's train and dev
    sentences, test from its test sentences; a fixed shuffle (seed 0) picks them."""
    src = data_dir / "SST-2" / "LM-BFF-original"
    pools = {"train": openings(src / "train.tsv", True, words), "validation": openings(src / "dev.tsv", True, words),
             "test": openings(src / "test.tsv", False, words)}
    sizes = {"train": n_train, "validation": n_val, "test": n_test}
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, pool in pools.items():
        random.Random(0).shuffle(pool)
        files[split] = out_dir / f"{split}.jsonl"
        files[split].write_text("".join(json.dumps({"prompt": PREFIX + p}) + "\n" for p in pool[:sizes[split]]))
    return files


def rewards_of(repetition_weight: float) -> tuple[list[str], list[float] | None]:
    """The example's rewards (``file.py:function`` references) and their weights: positivity, and beside it the
    ``repetition`` guard where its weight is > 0 (no weights, i.e. all 1, for positivity alone)."""
    names = ["positivity", "repetition"] if repetition_weight else ["positivity"]
    return ([f"{HERE / 'sentiment_reward.py'}:{name}" for name in names],
            [1.0, repetition_weight] if repetition_weight else None)


def main():
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--data-dir", default=os.environ.get("MEZO_RL_DATA"), help="datasets directory (default: $MEZO_RL_DATA)")
    p.add_argument("--output-dir", default="runs/rl_sentiment", help="prompts/ and run/ go here")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--max-steps", type=int, default=None, help="training steps (default: a prompt task's, 90 in norm mode)")
    p.add_argument("--per-device-train-batch-size", type=int, default=None, help="completions per step (default: a prompt task's, 16 in norm mode)")
    p.add_argument("--num-generations", type=int, default=1, help="completions per prompt (> 1 samples; 1: greedy)")
    p.add_argument("--peft", default="norm", help="what MeZO trains (norm, full, lora, prefix)")
    p.add_argument("--learning-rate", type=float, default=None, help="length of each sign step of the norm gains (default: a prompt task's, 0.1 in norm mode)")
    p.add_argument("--eps", type=float, default=None, help="perturbation scale (default: the --peft mode's)")
    p.add_argument("--n-spsa", type=int, default=None,
                   help="SPSA samples per step, 2 members each, decoded together (default: a prompt task's, 4 in norm mode)")
    p.add_argument("--estimator", default="two_point")
    p.add_argument("--step-normalize", default=None)
    p.add_argument("--reward-shaping", default="none", choices=["none", "group"])
    p.add_argument("--beta", type=float, default=0.0,
                   help="KL penalty towards the starting model in each member's loss (TRL's beta; default 0, as TRL's)")
    p.add_argument("--repetition-weight", type=float, default=0.0,
                   help="weight of the `repetition` guard beside positivity (sentiment_reward.py: minus the share of "
                        "a completion's repeated word bigrams); 0 (the default): positivity alone")
    p.add_argument("--do-sample", action="store_true")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-completion-length", type=int, default=24)
    p.add_argument("--words", type=int, default=6, help="words of each review kept as the prompt")
    p.add_argument("--num-train", type=int, default=1000)
    p.add_argument("--num-eval", type=int, default=64)
    p.add_argument("--num-test", type=int, default=200)
    p.add_argument("--eval-steps", type=int, default=30)
    p.add_argument("--eval-batch-size", type=int, default=64, help="prompts per forward pass (evaluations and steps)")
    p.add_argument("--log-completions", type=int, default=200,
                   help="completions of each evaluation kept in run/samples/ (the report's before -> after pairs)")
    p.add_argument("--member-evaluation", default="auto", choices=["auto", "inplace", "batched"],
                   help="how a step evaluates its members (see `mezo-rl train --help`)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--prompts-only", action="store_true", help="write the prompt files and stop")
    a = p.parse_args()
    if not a.repetition_weight >= 0:  # NaN too
        p.error(f"--repetition-weight must be a number >= 0, got {a.repetition_weight}")
    if not a.data_dir:
        p.error("give --data-dir or set MEZO_RL_DATA (the directory holding SST-2/LM-BFF-original/)")
    source = pathlib.Path(a.data_dir) / "SST-2" / "LM-BFF-original"
    missing = [name for name in ("train.tsv", "dev.tsv", "test.tsv") if not (source / name).is_file()]
    if missing:  # one line, before anything is written or loaded
        sys.exit(f"rl_sentiment.py: error: {source} lacks {', '.join(missing)}: this example reads SST-2's LM-BFF "
                 f"files (the layout of docs/tasks.md); give --data-dir DIR or set MEZO_RL_DATA=DIR")
    out = pathlib.Path(a.output_dir)
    files = write_prompts(pathlib.Path(a.data_dir), out / "prompts", a.num_train, a.num_eval, a.num_test, a.words)
    if a.prompts_only:
        print("\n".join(str(f) for f in files.values()))
        return
    rewards, weights = rewards_of(a.repetition_weight)
    args = MeZOConfig(
        load_best_model_at_end=True,  # validation picks the step whose weights are tested
        model=a.model, task=str(files["train"]), validation_file=str(files["validation"]), test_file=str(files["test"]),
        reward=rewards, reward_weights=weights, peft=a.peft,
        max_steps=a.max_steps, per_device_train_batch_size=a.per_device_train_batch_size,
        num_generations=a.num_generations, do_sample=a.do_sample or a.num_generations > 1, temperature=a.temperature,
        learning_rate=a.learning_rate, eps=a.eps, n_spsa=a.n_spsa, estimator=a.estimator, step_normalize=a.step_normalize,
        reward_shaping=a.reward_shaping, beta=a.beta, max_completion_length=a.max_completion_length, num_train=a.num_train, num_eval=a.num_eval,
        num_test=a.num_test, eval_steps=a.eval_steps, eval_batch_size=a.eval_batch_size, seed=a.seed, log_completions=a.log_completions,
        member_evaluation=a.member_evaluation,
        output_dir=str(out / "run"), resume=a.resume)
    try:
        trainer = MeZOTrainer(args=args)
        trainer.train()
        summary = trainer.summary
    except TrainingInterrupted as err:  # Ctrl-C / SIGTERM: the checkpoint is written, say how to go on
        raise SystemExit(f"{err}; checkpoint in {err.output_dir}: run the same command with --resume to continue")
    print(results_line(summary))
    for key in ("objective", "positivity", "repetition", "kl", "distinct_2", "completion_chars"):
        if key not in summary["test"]:
            continue
        before, after = summary["initial_test"].get(key, float("nan")), summary["test"].get(key, float("nan"))
        se = summary["test"].get(f"{key}/se")
        print(f"test {key}: {before:.4f} -> {after:.4f}" + (f" (SE {se:.4f})" if se is not None else "")
              + f", n = {summary['test']['n']:.0f}")


if __name__ == "__main__":
    main()
