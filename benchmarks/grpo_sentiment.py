"""TRL's GRPO on mezo-rl's RL example: the same model, prompts, reward and scoring, for a wall-clock budget.

The other side of issue 27's comparison (``examples/rl_sentiment.py`` is mezo-rl's side). It trains
SmolLM2-135M-Instruct with TRL's ``GRPOTrainer`` to continue movie-review openings positively, then
scores the model exactly as mezo-rl scores its own runs, and writes one JSON summary.

What is the same as the mezo-rl run, and how:

* model: ``mezo_rl.model.loading.load_model("smollm2-135m")`` (the same dequantised fp32 weights and tokenizer);
  the HF model object and its tokenizer are handed to ``GRPOTrainer`` (``processing_class``);
* prompts: ``write_prompts`` of ``examples/rl_sentiment.py`` with that script's defaults (1000 train,
  100 validation, 200 test prompts, 6-word openings of SST-2 sentences) into ``OUTPUT_DIR/prompts``;
  GRPO trains on ``train.jsonl`` as a prompt-only ``datasets.Dataset`` (column ``prompt``, plain text,
  no chat template, as mezo-rl feeds it); the files' sha256 are recorded so the two runs can be checked;
* reward: ``examples/sentiment_reward.py:positivity`` (VADER compound), passed as ``reward_funcs``; with
  ``--repetition-weight W`` the example's ``repetition`` guard beside it, ``reward_weights=[1, W]``;
* completions: ``--num-generations`` per prompt, ``--batch-size`` completions per step, at most
  ``--max-completion-length`` (24) tokens, temperature 1.0; a completion ends at EOS, as TRL's and
  mezo-rl's prompt tasks do (``--stop-at-newline`` also ends it at its first newline token: the newline
  tokens are added to the model's ``generation_config.eos_token_id``, which TRL reads as "every eos id the
  model declares ends a completion");
* training time: the sum of the steps' durations (generation, reward, loss, backward, optimizer
  step; evaluations excluded), as mezo-rl's ``seconds`` per step. A callback stops training at the
  step boundary nearest ``--time-budget-s`` (after step k if ``T_k + d_k / 2 >= budget``);
  ``--max-steps`` caps the steps without touching TRL's learning-rate schedule;
* scoring: ``mezo_rl.training.evaluation.evaluate`` with mezo-rl's objective and its settings (greedy, stop at EOS,
  24 new tokens, 32 prompts per batch, the ``autocast("auto")`` context, the same
  ``load_split(n, seed)`` subsets), before training and after: held-out test and validation reward
  mean with its SE and n, ``distinct_2`` and ``completion_chars``;
* best step: mezo-rl evaluates validation at step 0 and every fifth of its steps and tests the best
  step's weights; here validation runs at step 0, at each ``1/--eval-points`` of the budget and at
  the end, and the best (strictly higher ``objective``; step 0 included) is tested. The best weights
  wait on disk (``OUTPUT_DIR/best.pt``, deleted afterwards), never as a second copy in memory.
  ``--eval-points 0`` validates at the start and the end only. The test split is read through
  ``benchmarks/suite/protocol.py``'s ``TestGate``: the starting weights once (the baseline), then once at
  validation's pick, which the summary names (``pick``); any other test read is refused.

Everything else is TRL's documented default (GRPOConfig of the installed TRL, see ``settings`` and
``grpo_config`` in the summary): learning rate 1e-6 unless ``--lr``, AdamW, linear decay over
``num_train_epochs=3``, full fine-tuning, gradient checkpointing on, ``beta=0`` (no reference model),
``loss_type="dapo"``, ``scale_rewards="group"``, ``epsilon=0.2``, ``num_iterations=1``, top_p 1, top_k 0.
Set by this script: ``bf16`` from ``--autocast`` (mezo-rl's spelling and default, ``auto``: bf16 autocast with
fp32 weights where the CPU has native bf16, fp32 elsewhere; the protocol runs both tools at one setting, and the
summary's ``precision`` says what it resolved to; the evaluations use the same autocast), ``fp16=False``,
``use_cpu``, ``report_to="none"``, ``logging_steps=1``, ``save_strategy="no"``.

Memory: ``peak_rss_mb`` is the process peak through the final test evaluation (ru_maxrss, with the
peak before training kept across the reset below); ``peak_train_rss_mb`` is the peak of the training
phase alone (Linux VmHWM reset when training begins by writing 5 to /proc/self/clear_refs, as
``benchmarks/memory_run.py`` does; the in-run validations are inside it). ``base_loglik`` (the test
completions' mean log-likelihood per token under the untrained model, before -> after: the measure
``benchmarks/rl.py`` reports for mezo-rl runs) is computed last, after the trained model is freed.

    # the real run (the lead runs it; budget = the mezo-rl run's training seconds; benchmarks/rl.py sets it)
    export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false MEZO_RL_DATA=DIR
    flock /tmp/mezo-heavy.lock python benchmarks/grpo_sentiment.py --output-dir runs/grpo_sentiment --seed 0 \\
        --num-generations 4 --batch-size 16 --time-budget-s 900
    # a smoke run (a few minutes on a quiet machine: one or two steps)
    flock /tmp/mezo-heavy.lock python benchmarks/grpo_sentiment.py --output-dir runs/grpo_smoke \\
        --time-budget-s 60 --num-test 16 --num-eval 8 --eval-points 2

Other tasks (issue 35's study, ``benchmarks/rl.py --study``): ``--task NAME --reward REF`` trains on a
registered prompt task instead (``arithmetic``: chat prompts, which TRL renders with the tokenizer's chat
template as mezo-rl does; the task's columns reach the reward as keywords in both tools), with the same
``load_split(n, seed)`` subsets as ``mezo-rl train --num-train/--num-eval/--num-test --seed``. ``--peft lora``
trains mezo-rl's own LoRA adapter (``mezo_rl.model.peft.apply_peft``: r 8, alpha 16, q_proj and v_proj, the
same initial adapter as a ``mezo-rl train --peft lora`` run of the same seed) with TRL's optimizer; gradient
checkpointing is off there (the frozen embeddings would give the checkpointed blocks no gradient).
Every evaluation reports ``kl`` (``test.kl``): the exact per-token KL to the starting weights over the
completions, by the same ``evaluate(..., reference=StartingPoint)`` call mezo-rl's own evaluations make.

    flock /tmp/mezo-heavy.lock python benchmarks/grpo_sentiment.py --task arithmetic --reward exact_answer \\
        --peft lora --lr 1e-5 --max-completion-length 16 --time-budget-s 300 --output-dir runs/grpo_arith

Writes, as it goes: ``OUTPUT_DIR/prompts/*.jsonl``, ``initial.json`` (the evaluation before training),
``log.jsonl`` (TRL's log line of each step, with this script's step seconds), ``evaluations.jsonl``
(each validation), ``samples/test-{before,after}.jsonl`` (prompt, completion, reward), and at the end
``summary.json`` (also printed).
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import pathlib
import platform
import resource
import shlex
import statistics
import sys
import time
import traceback

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))   # the suite package beside this file
from suite.hacking import hacking_measures  # noqa: E402
from suite.run import import_path  # noqa: E402
from suite import untouched  # noqa: E402
from suite.protocol import PRECISION, TestGate, after_step, commit, cpu_info, precision_of, text_counts  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "rl_sentiment.py"
REWARD_FILE = REPO / "examples" / "sentiment_reward.py"
REWARD = "positivity"
MODEL = "smollm2-135m"
# the example's prompt files (examples/rl_sentiment.py: train, test and words as its defaults; 100 validation
# prompts, where the example keeps 64) and its evaluation batch (--eval-batch-size)
NUM_TRAIN, NUM_EVAL, NUM_TEST, WORDS, EVAL_BATCH_SIZE = 1000, 100, 200, 6, 64


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output-dir", default="runs/grpo_sentiment")
    p.add_argument("--data-dir", default=os.environ.get("MEZO_RL_DATA"), help="datasets directory (default: $MEZO_RL_DATA)")
    p.add_argument("--seed", type=int, default=0, help="TRL's seed (sampling, data order) and the evaluation subsets' seed")
    p.add_argument("--num-generations", type=int, default=4, help="completions per prompt, G (TRL needs >= 2)")
    p.add_argument("--batch-size", type=int, default=16, help="completions per step (per_device_train_batch_size); a multiple of G")
    p.add_argument("--max-completion-length", type=int, default=24, help="new tokens per completion (mezo-rl's --max-new-tokens)")
    p.add_argument("--time-budget-s", type=float, default=900.0, help="training seconds (sum of step times, evaluations excluded)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps at the latest (the LR schedule is not changed)")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: TRL's GRPOConfig default)")
    p.add_argument("--num-train", type=int, default=NUM_TRAIN, help="training prompts written")
    p.add_argument("--num-eval", type=int, default=NUM_EVAL, help="validation prompts (written and evaluated)")
    p.add_argument("--num-test", type=int, default=NUM_TEST, help="test prompts (written and evaluated)")
    p.add_argument("--words", type=int, default=WORDS, help="words of each review kept as the prompt")
    p.add_argument("--eval-points", type=int, default=5,
                   help="validations during training, at each 1/N of the budget (mezo-rl: every steps/5); the best is "
                        "tested. 0: no validation during training (validation at the start and the end picks)")
    p.add_argument("--autocast", default=PRECISION, choices=["auto", "bfloat16", "none"],
                   help="mezo-rl's --autocast: bf16 autocast with fp32 weights (auto: where the CPU has native bf16) "
                        "for TRL's training (its bf16 flag) and for the evaluations, or none (fp32)")
    p.add_argument("--stop-at-newline", action="store_true",
                   help="end GRPO's completions at their first newline too (TRL and mezo-rl's prompt tasks stop at EOS)")
    p.add_argument("--no-base-loglik", action="store_true", help="skip the base model's log-likelihood of the test completions")
    p.add_argument("--task", default=None, help="a registered prompt task (e.g. arithmetic) instead of the sentiment prompts")
    p.add_argument("--reward", default=None, help="with --task: the reward reference (default: the task's first metric)")
    p.add_argument("--repetition-weight", type=float, default=0.0,
                   help="weight of the example's `repetition` guard beside positivity (0: positivity alone)")
    p.add_argument("--peft", default="full", choices=["full", "lora"], help="what GRPO trains")
    p.add_argument("--beta", type=float, default=0.0,
                   help="TRL's KL coefficient (default 0, TRL's); > 0: TRL loads the base model again as its reference")
    p.add_argument("--no-gradient-checkpointing", action="store_true",
                   help="full weights without TRL's default gradient checkpointing (faster steps, more memory); LoRA "
                        "runs without it always")
    p.add_argument("--untouched-cell", default=None, metavar="CELL",
                   help="after the test read, read the untouched split (benchmarks/suite/untouched.py) once with the "
                        "same picked weights, for this cell and --seed (a cell read before is refused before it "
                        "trains); written to OUTPUT_DIR/untouched.json (a failed read: the summary's untouched_error)")
    p.add_argument("--model", default=MODEL,
                   help="the starting model (a name, a hub id or a saved directory: a curriculum stage starts from the "
                        "previous stage's picked weights)")
    p.add_argument("--save-picked", default=None, metavar="DIR",
                   help="after the test reads, save the picked weights here (save_pretrained; LoRA merged), for the "
                        "next curriculum stage")
    p.add_argument("--untouched-task", default=None,
                   help="with --untouched-cell: the task its read is filed under in the ledger (default: --task, or "
                        "sentiment / sentiment-guard)")
    a = p.parse_args(argv)
    if a.task is None and not a.data_dir:
        p.error("give --data-dir or set MEZO_RL_DATA (the directory holding SST-2/LM-BFF-original/)")
    if a.task is None and not (pathlib.Path(a.data_dir) / "SST-2" / "LM-BFF-original").is_dir():
        p.error(f"--data-dir {a.data_dir!r} has no SST-2/LM-BFF-original/")
    if a.num_generations < 2:
        p.error(f"--num-generations must be >= 2 (GRPO's advantages compare completions of a prompt), got {a.num_generations}")
    if a.batch_size < 1 or a.batch_size % a.num_generations:
        p.error(f"--batch-size ({a.batch_size}) must be a positive multiple of --num-generations ({a.num_generations})")
    if a.max_completion_length < 1:
        p.error(f"--max-completion-length must be >= 1, got {a.max_completion_length}")
    if not a.time_budget_s > 0:
        p.error(f"--time-budget-s must be > 0, got {a.time_budget_s}")
    if a.max_steps is not None and a.max_steps < 1:
        p.error(f"--max-steps must be >= 1, got {a.max_steps}")
    if a.lr is not None and not a.lr > 0:
        p.error(f"--lr must be > 0, got {a.lr}")
    if min(a.num_train, a.num_eval, a.num_test, a.words) < 1:
        p.error("--num-train, --num-eval, --num-test and --words must be >= 1")
    if not a.beta >= 0:
        p.error(f"--beta must be a number >= 0, got {a.beta}")
    if a.eval_points < 0:
        p.error(f"--eval-points must be >= 0, got {a.eval_points}")
    if not a.repetition_weight >= 0:
        p.error(f"--repetition-weight must be a number >= 0, got {a.repetition_weight}")
    if a.repetition_weight and a.task is not None:
        p.error("--repetition-weight guards the sentiment prompts' positivity: give it without --task")
    return a


# ---------------------------------------------------------------------------------------------- helpers
def rss_peak_mb() -> float:
    """ru_maxrss of this process in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def vm_hwm_mb() -> float | None:
    """VmHWM (peak RSS since start or the last clear_refs reset) in MiB, or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def append_jsonl(path: pathlib.Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record, default=str) + "\n")


def newline_token_ids(tokenizer) -> list[int]:
    """Every vocabulary token whose text contains a newline: the stops --stop-at-newline adds."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return [i for i, t in enumerate(texts) if "\n" in t]


class Scorer:
    """mezo-rl's own evaluation of the current weights of ``model`` on a split: the same call, batch
    size, token limit, decoding and autocast context as ``mezo_rl.training.trainer.MeZOTrainer.evaluate``."""

    def __init__(self, task, objective, splits: dict, max_new_tokens: int, autocast_mode: str = PRECISION):
        self.task, self.objective, self.splits, self.max_new_tokens = task, objective, splits, max_new_tokens
        self.autocast_mode = autocast_mode
        self.reward = objective.names[0]
        self.reference = None  # the starting weights (mezo_rl.training.kl.StartingPoint): evaluations report kl

    def __call__(self, model, tokenizer, split: str, keep: list | None = None) -> dict:
        import torch

        from mezo_rl.training.evaluation import evaluate
        from mezo_rl.model.lm import LanguageModel
        from mezo_rl.training.outputs import autocast, prompt_texts

        def on_batch(examples, outputs, values):
            rendered = prompt_texts(lm, examples)
            for i, text in enumerate(outputs.texts):
                keep.append({"prompt": outputs.prompts[i], "prompt_text": rendered[i], "completion": text,
                             **{k: v[i] for k, v in values.items()}})

        was_training = model.training
        model.eval()
        try:
            lm = LanguageModel(model, tokenizer)
            with torch.no_grad(), autocast(self.autocast_mode, lm.device.type):
                metrics = evaluate(lm, self.task, self.splits[split], batch_size=EVAL_BATCH_SIZE,
                                   max_new_tokens=self.max_new_tokens, objective=self.objective,
                                   on_batch=on_batch if keep is not None else None, reference=self.reference)
        finally:
            model.train(was_training)
        return {k: float(v) for k, v in metrics.items()}


def make_callback(a, out: pathlib.Path, scorer: Scorer, tokenizer, state: dict, gate: TestGate):
    """The TrainerCallback: times each step, stops at the budget (or the step cap), runs the in-run
    validations and keeps the best weights on disk, and records TRL's log lines."""
    import torch
    from transformers import TrainerCallback

    budget = a.time_budget_s

    class BudgetCallback(TrainerCallback):
        def on_train_begin(self, args, tstate, control, **kw):
            state["peak_before_train_mb"] = rss_peak_mb()
            state["hwm_reset"] = reset_peak_rss()
            state["train_wall_t0"] = time.perf_counter()

        def on_step_begin(self, args, tstate, control, **kw):
            state["t0"] = time.perf_counter()

        def on_step_end(self, args, tstate, control, model=None, **kw):
            d = time.perf_counter() - state["t0"]
            decision = after_step(sum(state["step_seconds"]), d, budget, a.eval_points)  # suite.protocol's rule
            state["step_seconds"].append(d)
            state["steps"] = tstate.global_step
            if decision == "stop" or (a.max_steps is not None and tstate.global_step >= a.max_steps):
                control.should_training_stop = True
                state["stopped_by"] = "budget" if decision == "stop" else "max_steps"
            elif decision == "validate":
                validate(model, tstate.global_step)
            return control

        def on_log(self, args, tstate, control, logs=None, **kw):
            if logs and "reward" in logs:
                line = {"step": tstate.global_step, "step_seconds": state["step_seconds"][-1], **logs}
                state["log"].append(line)
                append_jsonl(out / "log.jsonl", line)

        def on_train_end(self, args, tstate, control, **kw):
            state["train_wall_s"] = time.perf_counter() - state["train_wall_t0"]
            state["peak_train_rss_mb"] = vm_hwm_mb() if state["hwm_reset"] else None

    def validate(model, step):
        t0 = time.perf_counter()
        metrics = scorer(model, tokenizer, "validation")
        gate.validated(step, metrics["objective"])
        state["reads"].append({"split": "validation", "step": step, "objective": metrics["objective"]})
        record = {"step": step, "split": "validation", "metrics": metrics, "seconds": time.perf_counter() - t0,
                  "train_s": sum(state["step_seconds"])}
        append_jsonl(out / "evaluations.jsonl", record)
        state["validations"].append(record)
        if metrics["objective"] >= state["best_value"]:  # a tie goes to the later step, as validation's pick
            state["best_value"], state["best_step"], state["best_validation"] = metrics["objective"], step, metrics
            torch.save(trainable_state(model), out / "best.pt")
        print(f"[grpo_sentiment] validation at step {step}: {scorer.reward} {metrics[scorer.reward]:.4f} "
              f"(SE {metrics[scorer.reward + '/se']:.4f}, n {metrics['n']:.0f}); best step {state['best_step']}", flush=True)
        return metrics

    return BudgetCallback(), validate


def untouched_task(a) -> str:
    """The task an ``--untouched-cell`` read is filed under in the ledger: ``--untouched-task``, else ``--task``, else
    the sentiment prompts' (``sentiment-guard`` with the repetition guard)."""
    return a.untouched_task or a.task or ("sentiment-guard" if a.repetition_weight else "sentiment")


def trainable_state(model) -> dict:
    """The tensors training changes (all of them in full fine-tuning, the adapter's with LoRA), as copies."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


# ---------------------------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    a = parse_args(argv)
    if a.untouched_cell:  # refused before any training, not after it: a task with no untouched split, or a second read
        untouched.split_of(untouched_task(a))
        untouched.Ledger().check(untouched_task(a), a.untouched_cell, a.seed)
    code = commit(REPO)  # the code the run starts with
    out = pathlib.Path(a.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("log.jsonl", "evaluations.jsonl"):
        (out / name).write_text("")
    (out / "samples").mkdir(exist_ok=True)

    import datasets
    import torch
    import trl
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    from mezo_rl import rewards
    from mezo_rl import tasks
    from mezo_rl.model.loading import load_model

    from mezo_rl.model.peft import apply_peft
    from mezo_rl.training.kl import StartingPoint

    if a.task is None:  # prompts: the example's own writer and sizes
        example = import_path(EXAMPLE, "rl_sentiment_example")
        files = example.write_prompts(pathlib.Path(a.data_dir), out / "prompts", a.num_train, a.num_eval, a.num_test, a.words)
        task = tasks.from_prompts({split: str(path) for split, path in files.items()})
        module = import_path(REWARD_FILE, "sentiment_reward")
        refs, weights = example.rewards_of(a.repetition_weight)  # the example's rewards, as mezo-rl trains on them
        objective = rewards.build_objective(refs, weights=weights)
        reward_fns = [getattr(module, ref.rsplit(":", 1)[1]) for ref in refs]
        train_rows = [json.loads(line) for line in files["train"].read_text().splitlines() if line.strip()]
        train_dataset = datasets.Dataset.from_list([{"prompt": r["prompt"]} for r in train_rows])
    else:  # a registered prompt task: the subsets `mezo-rl train --num-train/--num-eval/--num-test --seed` reads
        task = tasks.get_task(a.task)
        files = {}
        spec = rewards.get_reward(a.reward or task.metrics[0])
        objective = rewards.build_objective([a.reward or task.metrics[0]])

        def reward_fn(prompts, completions, **kw):
            return spec.fn(prompts=prompts, completions=completions, **kw)

        reward_fn.__name__ = spec.name
        reward_fns, weights = [reward_fn], None
        train = task.load_split("train", n=a.num_train, seed=a.seed)
        train_dataset = datasets.Dataset.from_list(
            [{"prompt": ex.messages if ex.messages is not None else ex.prompt, **(ex.columns or {})} for ex in train])
    splits = {"validation": task.load_split("validation", n=a.num_eval, seed=a.seed),
              "test": task.load_split("test", n=a.num_test, seed=a.seed)}
    scorer = Scorer(task, objective, splits, a.max_completion_length, a.autocast)
    gate = TestGate()  # the one door to the test split (benchmarks/suite/protocol.py)
    reward_name = scorer.reward

    # model: as mezo-rl loads it (and with --peft lora, mezo-rl's adapter of this seed)
    lm = load_model(a.model)
    if a.peft == "lora":
        apply_peft(lm, "lora", seed=a.seed)
    model, tokenizer = lm.model, lm.tokenizer
    start = scorer.reference = StartingPoint(model)  # the trainable tensors at the start: the reference of `kl`

    # before training
    t0 = time.perf_counter()
    before_samples: list = []
    initial = {"initial_validation": scorer(model, tokenizer, "validation")}
    gate.validated(0, initial["initial_validation"]["objective"])
    gate.baseline()  # the starting weights' test figures: the paired gain's "before"; nothing is chosen from them
    initial["initial_test"] = scorer(model, tokenizer, "test", keep=before_samples)
    initial["eval_seconds"] = time.perf_counter() - t0
    (out / "initial.json").write_text(json.dumps(initial, indent=1))
    (out / "samples" / "test-before.jsonl").write_text("".join(json.dumps(s) + "\n" for s in before_samples))
    print(f"[grpo_sentiment] before: test {reward_name} {initial['initial_test'][reward_name]:.4f} "
          f"(SE {initial['initial_test'][reward_name + '/se']:.4f}, n {initial['initial_test']['n']:.0f})", flush=True)

    # --stop-at-newline: completions end at a newline too (TRL reads every eos id of the model's generation_config)
    stop_ids = []
    if a.stop_at_newline:
        eos = model.generation_config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        stop_ids = newline_token_ids(tokenizer)
        model.generation_config.eos_token_id = [*eos, *[i for i in stop_ids if i not in eos]]

    settings = {  # every GRPOConfig value this script sets; everything else is TRL's default
        "output_dir": str(out / "trl"),
        "num_generations": a.num_generations,
        "per_device_train_batch_size": a.batch_size,
        "max_completion_length": a.max_completion_length,
        "temperature": 1.0,
        "seed": a.seed,
        "bf16": precision_of(a.autocast) != "fp32",  # TRL's mixed precision: bf16 autocast, fp32 weights
        "fp16": False,
        "use_cpu": True,
        "report_to": "none",
        "logging_steps": 1,
        "save_strategy": "no",
    }
    if a.peft == "lora" or a.no_gradient_checkpointing:
        settings["gradient_checkpointing"] = False
    if a.lr is not None:
        settings["learning_rate"] = a.lr
    if a.beta:
        settings["beta"] = a.beta
    if weights:
        settings["reward_weights"] = weights
    config = GRPOConfig(**settings)

    state = {"step_seconds": [], "log": [], "validations": [], "steps": 0, "stopped_by": "end of data",
             "reads": [{"split": "validation", "step": 0, "objective": initial["initial_validation"]["objective"]},
                       {"split": "test", "step": 0, "weights_step": 0}],
             "best_value": initial["initial_validation"]["objective"], "best_step": 0,
             "best_validation": initial["initial_validation"]}
    callback, validate = make_callback(a, out, scorer, tokenizer, state, gate)
    state["validations"].append({"step": 0, "split": "validation", "metrics": initial["initial_validation"], "train_s": 0.0})
    append_jsonl(out / "evaluations.jsonl", state["validations"][0])
    trainer = GRPOTrainer(model=model, reward_funcs=reward_fns, args=config, train_dataset=train_dataset,
                          processing_class=tokenizer, callbacks=[callback])
    trainer.train()
    trained = trainer.accelerator.unwrap_model(trainer.model)
    assert trained is model, "GRPOTrainer replaced the model object"
    final_step = state["steps"]

    # after training: the last validation, then validation's pick; the picked step's weights on the test prompts
    if state["validations"][-1]["step"] != final_step:
        final_validation = validate(model, final_step)
    else:
        final_validation = state["validations"][-1]["metrics"]
    if gate.pick() != state["best_step"]:
        raise RuntimeError(f"the kept weights (step {state['best_step']}) are not validation's pick ({gate.pick()})")
    trainer.optimizer = trainer.lr_scheduler = None  # free AdamW's state before the test evaluation
    del trainer
    gc.collect()
    best = out / "best.pt"
    if state["best_step"] == 0:
        with torch.no_grad():
            for p, s in zip(start.params, start.start):
                p.copy_(s)
    elif state["best_step"] != final_step:
        model.load_state_dict(torch.load(best, map_location="cpu", weights_only=True), strict=False)
    if best.exists():
        best.unlink()
    after_samples: list = []
    gate.test(state["best_step"])  # refused unless this is validation's pick, read once
    state["reads"].append({"split": "test", "step": final_step, "weights_step": state["best_step"]})
    test = scorer(model, tokenizer, "test", keep=after_samples)
    (out / "samples" / "test-after.jsonl").write_text("".join(json.dumps(s) + "\n" for s in after_samples))
    untouched_error = None
    if a.untouched_cell:  # the untouched split, once, with the same picked weights (the ledger refuses a second read)
        reward_ref = (a.reward or task.metrics[0]) if a.task else f"{REWARD_FILE}:{REWARD}"
        try:
            read = untouched.read(lm, untouched_task(a), a.untouched_cell, a.seed, state["best_step"], reward_ref,
                                  a.max_completion_length, a.autocast, code, data_dir=a.data_dir,
                                  batch_size=EVAL_BATCH_SIZE, tmp_dir=out)
        except Exception as e:  # noqa: BLE001 -- as a MeZO cell's failed read: its ledger line stands, the run's
            # own figures are still written (benchmarks/rl.py records the cell with its untouched_error)
            untouched_error = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        else:
            (out / "untouched.json").write_text(json.dumps(read) + "\n")
    if a.save_picked:  # the picked weights, for the next curriculum stage (mezo-rl's own writer: LoRA merged)
        from mezo_rl.training.rundir import save_model
        save_model(lm, a.peft, a.save_picked, merged=True)  # LoRA folded in: a directory `--model` loads
    peak_rss = max(state.get("peak_before_train_mb", 0.0), rss_peak_mb())

    secs = state["step_seconds"]
    summary = {
        "tool": "trl-grpo",
        "trl_version": trl.__version__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "cpu": cpu_info(),
        "commit": code,
        "command": shlex.join([sys.executable, *sys.argv]),
        "autocast": a.autocast,
        "precision": precision_of(a.autocast),
        "pick": gate.record(),
        "reads": state["reads"],
        "counts": {"before": text_counts(before_samples), "after": text_counts(after_samples)},
        "model": a.model,
        "settings": settings,
        "grpo_config": json.loads(json.dumps(config.to_dict(), default=str)),
        "stop_at_newline": a.stop_at_newline,
        "stop_token_ids": len(stop_ids),
        "time_budget_s": a.time_budget_s,
        "max_steps_cap": a.max_steps,
        "stopped_by": state["stopped_by"],
        "steps": final_step,
        "train_s": sum(secs),
        "train_wall_s": state.get("train_wall_s"),
        "s_per_step": statistics.median(secs) if secs else None,
        "step_seconds": secs,
        "peak_rss_mb": peak_rss,
        "peak_before_train_mb": state.get("peak_before_train_mb"),
        "peak_train_rss_mb": state.get("peak_train_rss_mb"),
        "eval_points": a.eval_points,
        "best_step": state["best_step"],
        "initial_validation": initial["initial_validation"],
        "validation": state["best_validation"],
        "final_validation": final_validation,
        "initial_test": initial["initial_test"],
        "test": test,
        "task": a.task, "reward": reward_name, "peft": a.peft,
        **({"untouched_error": untouched_error} if untouched_error else {}),
        "validations": [{"step": v["step"], "train_s": v.get("train_s"), reward_name: v["metrics"][reward_name],
                         f"{reward_name}/se": v["metrics"][f"{reward_name}/se"]} for v in state["validations"]],
        "reward_curve": [{"step": line["step"], "reward": line.get("reward"), "reward_std": line.get("reward_std"),
                          "loss": line.get("loss"), "learning_rate": line.get("learning_rate"),
                          "completion_length": line.get("completions/mean_length")} for line in state["log"]],
        "prompt_files": {split: {"path": str(path), "sha256": sha256(path)} for split, path in files.items()},
        "eval": {"batch_size": EVAL_BATCH_SIZE, "max_new_tokens": a.max_completion_length, "decoding": "greedy",
                 "stop_at_newline": False, "num_eval": a.num_eval, "num_test": a.num_test, "seed": a.seed},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    if not a.no_base_loglik:  # last, with the trained model freed: it loads the base model once more
        del model, lm
        gc.collect()
        base = load_model(a.model)
        summary["base_loglik"] = hacking_measures(before_samples, after_samples, base)
        summary["peak_rss_with_loglik_mb"] = max(peak_rss, rss_peak_mb())
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    brief = {k: v for k, v in summary.items() if k not in ("grpo_config", "step_seconds")}
    print(json.dumps(brief, indent=1))
    b, t = summary["initial_test"], summary["test"]
    print(f"[grpo_sentiment] test {reward_name}: {b[reward_name]:.4f} -> {t[reward_name]:.4f} "
          f"(SE {t[reward_name + '/se']:.4f}), kl {t['kl']:.4g}, "
          f"n = {t['n']:.0f}; {final_step} steps in {summary['train_s']:.0f} s "
          f"({summary['s_per_step'] or math.nan:.1f} s/step); peak RSS {peak_rss:.0f} MiB "
          f"(training {summary['peak_train_rss_mb'] or math.nan:.0f} MiB)", flush=True)
    return summary


if __name__ == "__main__":
    main()
