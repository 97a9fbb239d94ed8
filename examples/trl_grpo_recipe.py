"""A TRL GRPO recipe run by MeZO: the script as a TRL user writes it, with two names changed.

TRL's version of this script imports ``GRPOConfig, GRPOTrainer`` from ``trl``; here they are ``MeZOConfig`` and
``MeZOTrainer``, and every other line is TRL's: two reward functions weighed by ``reward_weights``, the
dataset's extra column (``answer``) passed to the rewards as a keyword, TRL's sampling knobs, a LoRA
``peft_config`` with dropout, ``log_completions``, the hub push off. The fields that mean nothing for MeZO
(``optim``, ``gradient_checkpointing``, ``loss_type``, ...) are accepted and named in one warning line.

    python examples/trl_grpo_recipe.py                   # 40 steps on SmolLM2-135M-Instruct (any hub id works too)
    python examples/trl_grpo_recipe.py --max-steps 2     # a smoke run

The prompts are the built-in ``arithmetic`` task's (generated from a seed: no download), turned into a
``datasets.Dataset`` with the columns a TRL user's data would have: ``prompt`` (chat messages) and ``answer``.
"""
import argparse
import re

from datasets import Dataset
from peft import LoraConfig

from mezo_rl import MeZOConfig, MeZOTrainer  # TRL: from trl import GRPOConfig, GRPOTrainer
from mezo_rl.tasks import get_task


def correct_answer(completions, answer, **kwargs):
    """1.0 where the completion's last number is the answer (TRL passes the dataset's ``answer`` column)."""
    rewards = []
    for completion, gold in zip(completions, answer):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        numbers = re.findall(r"-?\d+", text)
        rewards.append(1.0 if numbers and numbers[-1] == str(gold) else 0.0)
    return rewards


def short_reply(completions, **kwargs):
    """1.0 for a reply of at most 8 characters (the number only), less as it grows."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [min(1.0, 8 / max(len(t.strip()), 1)) for t in texts]


def dataset(split: str, n: int) -> Dataset:
    rows = get_task("arithmetic").load_split(split, n=n, seed=0)
    return Dataset.from_dict({"prompt": [r.messages for r in rows], "answer": [r.columns["answer"] for r in rows]})


def config(output_dir: str, max_steps: int, **overrides) -> MeZOConfig:
    """The recipe's fields: TRL's names and values (MeZOConfig in GRPOConfig's place)."""
    fields = dict(
        output_dir=output_dir,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=64,
        gradient_accumulation_steps=1,
        num_generations=4,
        max_completion_length=16,
        temperature=0.9,
        top_p=0.95,
        top_k=50,
        repetition_penalty=1.0,
        beta=0.04,
        reward_weights=[1.0, 0.5],
        max_steps=max_steps,
        num_train_epochs=1,
        lr_scheduler_type="constant",
        warmup_ratio=0.0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        gradient_checkpointing=True,
        loss_type="dapo",
        logging_steps=1,
        log_completions=True,
        num_completions_to_print=2,
        eval_strategy="steps",
        eval_steps=max(1, max_steps // 4),
        save_strategy="no",
        report_to="none",
        push_to_hub=False,
        remove_unused_columns=False,
        seed=42,
    )
    fields.update(overrides)
    return MeZOConfig(**fields)


def main(argv=None):
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--model", default="smollm2-135m", help="a hub id or a short name (smollm2-135m loads offline)")
    p.add_argument("--output-dir", default="runs/trl_grpo_recipe")
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--num-eval", type=int, default=64)
    a = p.parse_args(argv)
    trainer = MeZOTrainer(
        model=a.model,
        reward_funcs=[correct_answer, short_reply],
        args=config(a.output_dir, a.max_steps),
        train_dataset=dataset("train", 512),
        eval_dataset=dataset("validation", a.num_eval),
        peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear",
                               task_type="CAUSAL_LM"),
    )
    trainer.train()
    metrics = trainer.evaluate()
    for key in ("eval_reward", "eval_rewards/correct_answer/mean", "eval_rewards/short_reply/mean", "eval_kl"):
        print(f"{key}: {metrics[key]:.4f}")
    trainer.save_model()  # a PEFT adapter folder: PeftModel.from_pretrained(base, output_dir)
    return metrics


if __name__ == "__main__":
    main()
