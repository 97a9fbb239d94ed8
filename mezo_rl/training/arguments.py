"""Every option, declared once: small argument dataclasses composed per command.

Each field carries its help text and, where it has them, its ``choices`` and its ``min`` in the
field metadata (:func:`mezo_rl.training.fields.option`); :class:`~mezo_rl.training.fields.Arguments` checks every
field against those in one loop, and
``mezo_rl.cli.main`` turns the same fields into ``--options``. The pieces:

==========================  =========================================================
``ModelArguments``          model, trust_remote_code
``TaskArguments``           task
``DataTaskArguments``       template, prompt_column, label_column, candidates, target_column, validation_file, test_file, dataset_config
``ObjectiveArguments``      reward, reward_weights, reward_scale, reward_shaping, beta
``PeftArguments``           peft, lora_r, lora_alpha, lora_target_modules, lora_modules_to_save, lora_dropout, ...
``DataArguments``           data_dir, num_train, num_eval, num_test
``MeZOArguments``           max_steps, per_device_train_batch_size, learning_rate, eps, weight_decay, lr_scheduler_type, ...
``SeedArguments``           seed
``ComputeArguments``        dtype, autocast, device_map, max_memory
``GenerationArguments``     max_completion_length, max_prompt_length, num_generations, do_sample, temperature, ...
``EvalArguments``           eval_strategy, eval_steps, metric_for_best_model, greater_is_better, load_best_model_at_end, ...
``OutputArguments``         output_dir, resume, overwrite_output_dir, save_model, push_to_hub, report_to, progress, ...
==========================  =========================================================

:class:`MeZOConfig` (``mezo-rl train``) inherits all of them and stays one
flat dataclass.
``mezo-rl baseline`` (:class:`BaselineArguments`) and ``mezo-rl eval`` (:class:`EvalRunArguments`)
reuse single fields with :func:`shared`, so a default or a help text lives in one place, and inherit
``DataTaskArguments`` (a data file or dataset as the task, in every command).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Optional

from mezo_rl.choices import (ESTIMATORS, MEMBER_EVALUATIONS, HIZOO_OPTIONS, HUB_STRATEGIES, NOISES, ON_NONFINITE, ROUNDINGS,
                             SAMPLING_FIELDS, Sampling, check_member_evaluation, check_report_to,
                             parse_max_memory)
from mezo_rl.errors import ConfigError
from mezo_rl.rewards import trl_names
from mezo_rl.training.defaults import MODE_DEFAULTS, MODES, PROMPT_TASK_DEFAULTS
from mezo_rl.training.fields import RENAMED, Arguments, accepts_trl_options, flag, option, shared

#: ``lr_scheduler_type``: the schedules of ``transformers.get_scheduler`` that need no more than warmup and length
LR_SCHEDULERS = ("constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial")


def _fmt(x: float) -> str:
    """1e-2 -> '1e-2', 2e-4 -> '2e-4' (how the help texts write learning rates)."""
    mantissa, exp = f"{x:.0e}".split("e")
    return f"{mantissa}e{int(exp)}"


def _per_mode(key: str) -> str:
    """``(default per --peft mode: norm 2e-2, full 2e-4, ...)``: the help text's view of mezo_rl.training.defaults."""
    show = lambda v: _fmt(v) if isinstance(v, float) and v else str(v)  # noqa: E731
    prompts = "".join(f"; a prompt task in {m} mode: {show(row[key])}"
                      for m, row in PROMPT_TASK_DEFAULTS.items() if key in row)
    return "(default per --peft mode: " + ", ".join(f"{m} {show(MODE_DEFAULTS[m][key])}" for m in MODES) + prompts + ")"


# ---------------------------------------------------------------------- the pieces
@dataclass
class ModelArguments(Arguments):
    model: str = option("smollm2-135m", "short name (smollm2-135m; gemma3-270m with its package, see README), hub id, local directory or .gguf file")
    trust_remote_code: bool = option(False, "let from_pretrained run the model repository's own code")


@dataclass
class DataTaskArguments(Arguments):
    """How a data file or a Hugging Face dataset becomes a task (``mezo_rl.tasks.user``); shared by every command."""

    template: Optional[str] = option(None, "data file/dataset tasks: the prompt, with {column} fields, e.g. '{text} It was'")
    prompt_column: Optional[str] = option(None, "prompt-only tasks (no gold answer; the rewards judge the completions): the column holding each prompt, text or a list of chat messages (default: prompt)")
    label_column: Optional[str] = option(None, "classification: the column with the label (the right candidate's index or text)")
    candidates: Optional[list[str]] = option(None, "classification: the continuations to score (comma-separated or repeated), e.g. terrible,great")
    target_column: Optional[str] = option(None, "generation: the column with the gold answer (a string or a list)")
    validation_file: Optional[str] = option(None, "data file tasks: a separate validation file (default: carved from the train rows)")
    test_file: Optional[str] = option(None, "data file tasks: a separate test file (default: carved from the train rows)")
    dataset_config: Optional[str] = option(None, "Hugging Face dataset tasks: the configuration name (e.g. sst2 of nyu-mll/glue)")


@dataclass
class TaskArguments(Arguments):
    task: str = option("sst2", "a task name (see `mezo-rl tasks`), 'module:function' / 'file.py:function' returning a "
                               "Task, a data file (.jsonl/.json/.csv/.tsv: give --template and the columns) or a "
                               "Hugging Face dataset (hub id or local directory, with --template and the columns)")


DATA_TASK_FIELDS = tuple(f.name for f in dataclasses.fields(DataTaskArguments))


def data_task_options(args) -> dict:
    """The data file/dataset task options given in ``args`` (any arguments object with those fields)."""
    return {k: getattr(args, k) for k in DATA_TASK_FIELDS if getattr(args, k, None) not in (None, [])}


@dataclass
class ObjectiveArguments(Arguments):
    reward: Optional[list[str]] = option(None, "reward/objective name (see `mezo-rl rewards`); repeat to combine "
                                         "several (default: the task's own metric, e.g. accuracy for SST-2, squad_f1 "
                                         "for SQuAD, exact_answer for arithmetic; a prompt file or dataset needs one)")
    reward_weights: Optional[list[float]] = option(None, "one weight per --reward (default: all 1)")
    reward_scale: Optional[str] = option(None, "std: divide each reward by the spread of its values on the first batch (then fixed) before weighting, so rewards on different scales weigh as their weights say (default: each reward as it is)", choices=["std"])
    reward_shaping: str = option("none", "group: centre each prompt's weighted rewards across all of the step's completions of it (every member, every --num-generations sample) and divide by their std, as GRPO and EGGROLL do per prompt; rank: each member's loss is its centred rank among the step's members (-1/2 best to +1/2 worst, ties averaged), the fitness shaping of evolution strategies; none: the mean reward", choices=["none", "group", "rank"])
    beta: float = option(0.0, "the KL coefficient (TRL's beta), prompt tasks: each member's loss adds beta times the mean per-token KL to the starting model (exact over the vocabulary; both members of a pair read it on the + member's completions), so a step prefers members that stay close to where the run began; 0: no penalty (kl is still reported at each evaluation)", ge=0.0)

    def __post_init__(self):
        if isinstance(self.reward, str):
            self.reward = [self.reward]
        if self.reward is not None and not self.reward:
            raise ConfigError("--reward: give at least one reward name (see `mezo-rl rewards`)")
        self.check_reward_weights()
        super().__post_init__()

    def check_reward_weights(self) -> None:
        """One weight per ``--reward`` given (the rewards of a trainer's ``reward_funcs``, or a task's own:
        checked by the plan, once they are known)."""
        if self.reward is not None:
            check_reward_weights(self.reward_weights, self.reward)


def check_reward_weights(weights, rewards, given: str = "--reward") -> None:
    """One weight per reward, in order, as TRL weighs its ``reward_funcs``: a count mismatch is one line naming
    the rewards (by the names their logs use) and where they were given (``given``)."""
    if weights is None or len(weights) == len(rewards):
        return
    names = list(trl_names(rewards).values())
    raise ConfigError(f"--reward-weights: got {len(weights)} weights for {len(names)} rewards "
                      f"{names} ({given}, in order); give one weight per --reward (reward_funcs entry)")


@dataclass
class PeftArguments(Arguments):
    peft: Optional[str] = option(None, "what MeZO trains: norm (the final normalisation layer's gains; the default), full (every weight: full fine-tuning; the default for a prompt task), lora (low-rank adapters) or prefix (prefix-tuning)", choices=MODES)
    lora_r: int = option(8, "LoRA rank (paper: 8)", min=1)
    lora_alpha: int = option(16, "LoRA alpha (paper: 16)", min=1)
    lora_target_modules: Optional[list[str]] = option(None, "the linear layers LoRA wraps (names, or all-linear; default: "
                                                            "q_proj,v_proj, the paper's)")
    lora_modules_to_save: Optional[list[str]] = option(None, "modules trained in full beside the LoRA adapter (names)")
    lora_dropout: float = option(0.0, "--peft lora: dropout on the adapter's input (peft's lora_dropout), drawn while a "
                                      "step evaluates its members, the same masks for every member of the step; none "
                                      "in evaluation", ge=0, lt=1)
    num_prefix_tokens: int = option(5, "prefix-tuning length (paper: 5)", min=1)
    trainable: Optional[str] = option(None, "train only the parameters whose names match this regular expression (re.search; the others are frozen), e.g. 'norm' for the normalisation weights (LN-tuning); default: all of them (the adapter's with --peft)")

    def __post_init__(self):
        for name in ("lora_target_modules", "lora_modules_to_save"):  # TRL's LoraConfig takes one name as a string
            if isinstance(getattr(self, name), str):
                setattr(self, name, [n.strip() for n in getattr(self, name).split(",") if n.strip()])
        super().__post_init__()
        if self.trainable is not None:
            try:
                re.compile(self.trainable)
            except re.error as e:
                raise ConfigError(f"--trainable: {self.trainable!r} is not a regular expression ({e}); "
                                  "give a pattern matched against parameter names, e.g. 'norm'") from None


@dataclass
class DataArguments(Arguments):
    # None: the tasks layer decides (mezo_rl.tasks.data.data_root: $MEZO_RL_DATA, else the Hugging Face datasets)
    data_dir: Optional[str] = option(None, "directory with the datasets (default: $MEZO_RL_DATA)")
    num_train: int = option(1000, "training examples sampled from the train split (paper: 1000)", min=1)
    num_eval: int = option(200, "validation examples, sampled from the train split outside the training examples where the task has no validation file (paper: 500)", min=1)
    num_test: int = option(1000, "test examples (paper: 1000; the whole split where it is smaller, e.g. SST-2's 872)", min=0)


@dataclass
class MeZOArguments(Arguments):
    max_steps: Optional[int] = option(None, f"training steps (paper: 20000; -1 or unset with --num-train-epochs: "
                                            f"from the epochs) {_per_mode('max_steps')}", min=0)
    num_train_epochs: Optional[float] = option(None, "with --max-steps unset: run this many passes' worth of "
                                                     "--num-train examples (batches are drawn with replacement)", gt=0)
    per_device_train_batch_size: Optional[int] = option(None, f"completions per step on each process: examples, or "
                                                        f"prompts x --num-generations (TRL's per_device_train_batch_size; "
                                                        f"paper: 16) {_per_mode('per_device_train_batch_size')}", min=1)
    gradient_accumulation_steps: int = option(1, "a step's batch is this many per-device batches (MeZO sees them all "
                                                 "at +eps and -eps, then steps once)", min=1)
    learning_rate: Optional[float] = option(None, f"learning rate; with --step-normalize std the length of each sign step "
                                                  f"{_per_mode('learning_rate')}", ge=0)
    eps: Optional[float] = option(None, f"perturbation scale {_per_mode('eps')}; with the paper's 1e-3 the accuracy of a batch is the same at +eps and -eps", gt=0)
    weight_decay: Optional[float] = option(None, f"decoupled weight decay, biases and norm weights exempt {_per_mode('weight_decay')}", ge=0)
    lr_scheduler_type: str = option("constant", "the learning-rate schedule, as in transformers (constant: the paper)",
                                    choices=LR_SCHEDULERS)
    warmup_steps: float = option(0.0, "linear warmup: steps, or a fraction of --max-steps when < 1 (as in transformers; "
                                      "constant ignores it, constant_with_warmup, linear and cosine use it)", ge=0)
    n_spsa: Optional[int] = option(None, f"SPSA samples per step (Appendix B.1) {_per_mode('n_spsa')}", min=1)
    noise: Optional[str] = option(None, f"perturbation distribution: gaussian, rademacher (+-1) or lowrank (z = B A^T / sqrt(rank) per matrix, LOZO) {_per_mode('noise')}", choices=NOISES)
    rank: int = option(1, "rank of --noise lowrank", min=1)
    lowrank_interval: int = option(1, "hold the low-rank subspace factor for this many noise samples (LOZO; 1 = fresh every step)", min=1)
    step_normalize: Optional[str] = option(None, f"std: divide each loss difference by the spread of the step's losses instead of by 2 eps (FZOO-style; with one sample a sign step of length lr); none: divide by 2 eps (the paper) {_per_mode('step_normalize')}", choices=["std", "none"])
    estimator: str = option("two_point", "two_point (+/-eps per sample), one_point, or es (n one-sided members, losses centred across them; ES-at-scale with --step-normalize std)", choices=ESTIMATORS)
    momentum: float = option(0.0, "ZO-SGD momentum (Appendix B.2)", ge=0, lt=1)
    adam: bool = option(False, "ZO-Adam (Appendix B.2)")
    hessian_smooth: float = option(0.0, "HiZOO: precondition the perturbation by a diagonal curvature estimate that moves at this rate a step, measured by one more member (the unperturbed weights); 0 = off; needs --noise lowrank with --rank 1", ge=0, lt=1)
    on_nonfinite: str = option("raise", "what a non-finite loss does", choices=ON_NONFINITE)
    rounding: str = option("stochastic", "how an update is written into bfloat16 / float16 weights, computed in float32 and rounded once: stochastic (unbiased at any learning rate; its random bits drawn from the step's seed) or nearest (drops an update below half a weight's spacing); float32 weights are unaffected", choices=list(ROUNDINGS))
    member_evaluation: str = option("auto", "how a step evaluates its members: inplace (perturb the weights, one member after another), batched (all members in one batched pass, the weights untouched until the update; --peft full needs --noise lowrank) or auto (batched where it measured faster: generation rewards on a GPU, or with prompts at most 4x --max-completion-length long; inplace otherwise, scoring included; batched for bfloat16 weights, which the in-place sweeps would round; a resumed run keeps the mode it ran with)", choices=["auto", *MEMBER_EVALUATIONS])


@dataclass
class SeedArguments(Arguments):
    seed: int = option(0, "seed for data sampling, perturbations and generation")


@dataclass
class ComputeArguments(Arguments):
    dtype: str = option("auto", "the weights' dtype: float32, bfloat16 (bf16 inference's memory; a step evaluates its members batched and writes its update with --rounding), float16 (CUDA only), or auto (bfloat16 where bf16 is native, a GPU or a CPU with AVX512-BF16/AMX, with --autocast auto, for a run whose members can be evaluated batched; float32 elsewhere)", choices=["auto", "float32", "bfloat16", "float16"])
    autocast: str = option("auto", "bf16 autocast of the forward passes with fp32 master weights: auto (only where the CPU has native bf16: AVX512-BF16/AMX; on other CPUs bf16 is slower than fp32), bfloat16 or none", choices=["auto", "none", "bfloat16"])
    device_map: Optional[str] = option(None, "spread a model larger than one device over several (passed to from_pretrained, e.g. auto); offloading to disk is rejected")
    max_memory: Optional[str] = option(None, "per-device memory caps with --device-map, e.g. '0=20GiB,1=20GiB,cpu=60GiB'")

    def __post_init__(self):
        super().__post_init__()
        parse_max_memory(self.max_memory)  # a bad spec fails here, before any model is loaded


@dataclass
class GenerationArguments(Arguments):
    max_completion_length: int = option(32, "the most tokens a completion has, in training and evaluation", min=1)
    max_prompt_length: Optional[int] = option(None, "keep only the last N tokens of a longer prompt (default: whole "
                                                    "prompts)", min=1)
    num_generations: int = option(1, "completions per prompt in a training step, sampled as in TRL; "
                                     "--per-device-train-batch-size counts completions", min=1)
    do_sample: Optional[bool] = option(None, "sample completions in training (the same seed at +eps and -eps); "
                                             "default: with --num-generations > 1")
    temperature: float = option(1.0, "sampling temperature (> 0)")
    top_p: float = option(1.0, "sampling: draw from the smallest set of tokens whose probability reaches this (1: "
                               "all)", gt=0, le=1)
    top_k: Optional[int] = option(None, "sampling: draw from the k most likely tokens (0 or unset: all)", min=0)
    min_p: Optional[float] = option(None, "sampling: drop the tokens below this times the most likely one's "
                                          "probability (unset or 0: none)", ge=0, le=1)
    repetition_penalty: float = option(1.0, "divide the positive logit of every token already in the prompt or "
                                            "the completion by this (a negative one: multiply), greedy decoding "
                                            "too; 1: none", gt=0)
    generation_kwargs: Optional[dict] = option(None, "TRL's generation_kwargs: values of the sampling options "
                                                     "above (temperature, top_p, top_k, min_p, repetition_penalty) "
                                                     "that override them, as a JSON object on the command line")
    stop: Optional[list[str]] = option(None, "end each completion at the first of these strings, which it keeps "
                                             "(repeat for several; on the command line \\n is a newline); every "
                                             "completion also ends at EOS, and a task whose format needs it adds its "
                                             "own (SQuAD and DROP: a newline)", verbatim=True)

    def __post_init__(self):
        if isinstance(self.stop, str):  # one stop string, as TRL and vLLM take it
            self.stop = [self.stop]
        if self.stop is not None and (not isinstance(self.stop, (list, tuple)) or not self.stop
                                      or not all(isinstance(s, str) and s for s in self.stop)):
            raise ConfigError(f"--stop: got {self.stop!r}; accepted: one or more non-empty strings")
        super().__post_init__()
        if self.do_sample is None:  # TRL samples its num_generations completions
            self.do_sample = self.num_generations > 1
        if self.num_generations > 1 and not self.do_sample:
            raise ConfigError(f"--num-generations {self.num_generations} with --no-do-sample: greedy decoding writes the "
                              f"same completion every time; leave out --no-do-sample")
        extra = sorted(set(self.generation_kwargs or {}) - set(SAMPLING_FIELDS))
        if extra:
            raise ConfigError(f"--generation-kwargs: {', '.join(extra)} not honoured; accepted keys: "
                              f"{', '.join(SAMPLING_FIELDS)}")
        knobs = {k: getattr(self, k) for k in SAMPLING_FIELDS} | dict(self.generation_kwargs or {})
        if self.do_sample and not knobs["temperature"] > 0:
            raise ConfigError(f"--do-sample needs --temperature > 0, got {knobs['temperature']!r} "
                              f"(for greedy decoding leave out --do-sample)")
        neutral = {"top_p": (1.0,), "top_k": (None, 0), "min_p": (None, 0)}
        shaping = [k for k, values in neutral.items() if knobs[k] not in values]
        if shaping and not self.do_sample:
            raise ConfigError(f"{', '.join(flag(k) for k in shaping)} shape sampling, and decoding is greedy with one "
                              f"completion per prompt: give --do-sample (or --num-generations > 1), or leave them out")
        try:
            self.sampling()
        except ValueError as e:
            raise ConfigError(f"--generation-kwargs: {e}") from None

    def sampling(self) -> Sampling:
        """How a training step's completions are decoded (:class:`mezo_rl.choices.Sampling`): the sampling
        fields, ``generation_kwargs`` over them (as TRL lets them override), the temperature where sampling."""
        knobs = {k: getattr(self, k) for k in SAMPLING_FIELDS} | dict(self.generation_kwargs or {})
        if not self.do_sample:
            knobs["temperature"] = 1.0
        return Sampling(**knobs)




@dataclass
class EvalArguments(Arguments):
    eval_strategy: str = option("steps", "steps: validate at the start, every --eval-steps and at the end; no: never "
                                         "(the final step is the best)", choices=["steps", "no"])
    eval_steps: Optional[int] = option(None, "validate every N steps (default: max_steps/5, at least 1, as in the paper)", min=1)
    metric_for_best_model: Optional[str] = option(None, "validation metric that picks the best step, as evaluate() "
                                                        "and the logs name it, eval_ optional (accuracy, eval_reward, "
                                                        "rewards/<function name>/mean; default: the task's first "
                                                        "metric, a prompt task's reward)")
    greater_is_better: Optional[bool] = option(None, "the best step has the highest --metric-for-best-model (default: "
                                                     "yes, unless that metric is a loss)")
    load_best_model_at_end: bool = option(False, "end with the best step's weights (tested, saved; a tie goes to "
                                                 "the later step); default, as in transformers: the final step's")
    initial_test: bool = option(True, "also evaluate the untrained model on the test examples (summary.json: initial_test)")
    eval_batch_size: int = option(16, "examples per forward pass: in evaluation, and in a training step's scoring or generation (per member); generation decodes that many prompts of similar length together", min=1)
    logging_steps: int = option(1, "write a metrics.jsonl record every N steps", min=1)
    log_completions: int = option(16, "prompt tasks: completions kept as a table of prompt, completion and each "
                                      "reward, at each logging step of training (the step's first member's, "
                                      "completions/train-step<N>.parquet, and trackio / wandb where on) and at each "
                                      "evaluation (samples/<split>-step<N>.jsonl and completions/<split>-step<N>.parquet); "
                                      "0: none; TRL's true: 16", min=0)
    num_completions_to_print: Optional[int] = option(None, "prompt tasks: print this many of those completions at each "
                                                           "logging step and evaluation", min=0)


@dataclass
class OutputArguments(Arguments):
    output_dir: str = option("runs/mezo", "where config, metrics, summary and checkpoint go")
    resume: bool = option(False, "continue the run in --output-dir from its checkpoint")
    overwrite_output_dir: bool = option(False, "start over in an --output-dir that holds an unfinished run "
                                        "(without it, such a directory is refused: --resume continues it)")
    save_model: bool = option(False, "at the end, write the weights with save_pretrained into OUTPUT_DIR")
    merge: bool = option(False, "--peft lora: save_model() writes the adapter folded into the weights (a plain "
                                "from_pretrained model); default: the PEFT adapter folder (adapter_config.json, "
                                "adapter_model.safetensors) that peft.PeftModel.from_pretrained loads")
    save_steps: Optional[int] = option(None, "also write the checkpoint every N steps (TRL's save_steps; it is always "
                                             "written at each evaluation and at the end)", min=1)
    save_total_limit: Optional[int] = option(None, "checkpoints kept: a run keeps one (its trajectory replays any "
                                                   "step), which any limit allows", min=1)
    push_to_hub: bool = option(False, "upload the weights to --hub-model-id (the repository, token and network are "
                                      "checked before the first step)")
    hub_strategy: str = option("every_save", "with --push-to-hub, as in transformers: every_save (the weights at "
                                             "each save and at the end), end (once, at the end), checkpoint (also "
                                             "the checkpoint, as last-checkpoint/)", choices=HUB_STRATEGIES)
    hub_model_id: Optional[str] = option(None, "the Hub repository of --push-to-hub (default: OUTPUT_DIR's name)")
    hub_private_repo: Optional[bool] = option(None, "create the Hub repository private")
    hub_token: Optional[str] = option(None, "the Hub token of --push-to-hub (never written to the run directory)")
    logging_dir: Optional[str] = option(None, "report_to tensorboard: its directory (default: OUTPUT_DIR/tensorboard)")
    run_name: Optional[str] = option(None, "the run's name in trackio / wandb (TRL's run_name; default: the output "
                                           "directory's name)")
    report_to: list[str] = option(help="where metrics go besides metrics.jsonl, as in TRL: none, tensorboard "
                                       "(OUTPUT_DIR/tensorboard), trackio (local), wandb (honours WANDB_MODE, e.g. offline), "
                                       "or all (every one installed); repeat or comma-separate",
                                  default_factory=lambda: ["none"])

    def __post_init__(self):
        if isinstance(self.report_to, str):  # TRL takes one name as a string
            self.report_to = [n.strip() for n in self.report_to.split(",") if n.strip()]
        super().__post_init__()
    progress: bool = option(True, "show a tqdm progress bar")


# ---------------------------------------------------------------------- per command
# Base classes are listed last-first: a dataclass puts the fields of its last base first.
@accepts_trl_options
@dataclass
class MeZOConfig(OutputArguments, EvalArguments, GenerationArguments, ComputeArguments, SeedArguments,
                        MeZOArguments, DataArguments, PeftArguments, ObjectiveArguments, DataTaskArguments, TaskArguments,
                        ModelArguments):
    """Everything a training run needs, shaped like TRL's ``GRPOConfig``: where a field means what a
    ``GRPOConfig`` / ``transformers.TrainingArguments`` field means it has that name (``learning_rate``,
    ``max_steps``, ``per_device_train_batch_size``, ``gradient_accumulation_steps``, ``num_train_epochs``,
    ``lr_scheduler_type``, ``warmup_steps``, ``num_generations``, ``max_completion_length``, ...). Every other
    field of those two classes is taken too (:mod:`mezo_rl.training.config`): one that maps onto a field
    becomes it (``bf16=True``: ``autocast="bfloat16"``), the ones with no meaning for MeZO are named in one
    warning line saying why, and a few whose effect would be silently missing are refused in one line.
    Each field is also a ``mezo-rl train`` option (``--field-name``).

    Defaults are chosen so that ``mezo-rl train`` (SmolLM2-135M, SST-2, accuracy reward) finishes in
    minutes on a 2-core CPU and visibly moves validation accuracy. The paper's OPT settings
    (Table 16) are batch 16, lr 1e-6 or 1e-7, eps 1e-3, 20,000 steps, evaluation every 1/5 of the run,
    on 1,000 train / 500 validation / 1,000 test examples: pass them explicitly to reproduce it.

    An option left unset (None) is decided by the run's plan (:func:`mezo_rl.training.plan.plan_run`, from the
    task it has: the mode, the mode's row in ``mezo_rl.training.defaults``, the reward, the run length), which
    records every value the run uses in ``training_args.json``, so ``MeZOConfig.from_dict(config)``
    (``mezo-rl train --config RUN/training_args.json``) repeats the run. A configuration checks its own
    values only (each field's type, choices and bounds, and the combinations of the fields it was given);
    whatever needs the task, the model or the run directory is the plan's.
    """

    def __post_init__(self):
        if self.max_steps == -1:  # transformers' "unset"
            self.max_steps = None
        super().__post_init__()
        self.check_combinations()

    def check_combinations(self) -> None:
        """The combinations of the values given that cannot run, one line each; one with a value left unset
        (None) is checked once the plan has decided that value (the plan's configuration checks itself)."""
        if self.per_device_train_batch_size is not None:
            batch = self.per_device_train_batch_size * self.gradient_accumulation_steps
            if self.num_generations > batch or batch % self.num_generations:
                times = f" x --gradient-accumulation-steps {self.gradient_accumulation_steps}" if batch != self.per_device_train_batch_size else ""
                raise ConfigError(f"--num-generations {self.num_generations} must divide --per-device-train-batch-size "
                                  f"{self.per_device_train_batch_size}{times} (the completions of a step: that many / "
                                  f"num_generations prompts, num_generations each)")
        if self.merge and self.peft not in ("lora", None):
            raise ConfigError(f"--merge folds a LoRA adapter into the weights; --peft {self.peft} has none to fold "
                              f"(leave out --merge)")
        if self.lora_dropout and self.peft not in ("lora", None):  # None: the plan resolves the mode, then checks
            raise ConfigError(f"--lora-dropout {self.lora_dropout!r} is a LoRA adapter's dropout; --peft {self.peft} "
                              f"has no LoRA adapter (use --peft lora, or leave out --lora-dropout)")
        check_report_to(self.report_to)  # an unknown name or a missing package: one line, before anything loads
        check_member_evaluation(self.member_evaluation, self.peft, self.noise, self.trainable,  # dtype auto: the plan decides
                                None if self.dtype == "auto" else self.dtype)
        if self.hessian_smooth and self.noise is not None and {k: getattr(self, k) for k in HIZOO_OPTIONS} != HIZOO_OPTIONS:
            raise ConfigError(f"--hessian-smooth (HiZOO) needs --noise lowrank with --rank 1 and --estimator two_point; "
                              f"got --noise {self.noise} --rank {self.rank} --estimator {self.estimator}")

    @property
    def prompts_per_step(self) -> int:
        """The prompts (examples) of a training step: its completions over ``num_generations``."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps // self.num_generations

    def to_dict(self) -> dict:
        """The field values, without ``hub_token`` (a secret: never written to the run directory)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "hub_token"}

    save_strategy = logging_strategy = "steps"  # transformers' names, read by callbacks written for transformers


METHODS = ("zero-shot", "icl", "lp", "ft")


@dataclass
class BaselineArguments(DataTaskArguments):
    """Options of ``mezo-rl baseline`` (each field is ``--field-name``)."""

    method: str = option("zero-shot", "zero-shot, icl, lp (linear probing) or ft (Adam fine-tuning)", choices=METHODS)
    model: str = shared(ModelArguments, "model")
    task: str = shared(TaskArguments, "task")
    data_dir: Optional[str] = shared(DataArguments, "data_dir")
    num_train: int = shared(DataArguments, "num_train", help="training examples (demonstration pool for icl, training set for lp/ft)")
    num_test: int = shared(DataArguments, "num_test")
    seed: int = shared(SeedArguments, "seed", help="seed for data sampling, demonstrations and ft batches")
    dtype: str = shared(ComputeArguments, "dtype")
    eval_batch_size: int = shared(EvalArguments, "eval_batch_size")
    max_completion_length: int = shared(GenerationArguments, "max_completion_length")
    num_demonstrations: int = option(32, "icl: demonstrations in the context (paper: 32)", min=1)
    lp_l2: float = option(1.0, "lp: L2 penalty of the logistic regression (on standardised features)")
    ft_lr: float = option(1e-5, "ft: Adam learning rate (paper: 1e-5, 5e-5, 8e-5)")
    ft_batch_size: int = option(8, "ft: batch size (paper: 8)", min=1)
    ft_epochs: float = option(1.0, "ft: epochs over the training examples (paper: 5)")
    ft_max_steps: Optional[int] = option(None, "ft: stop after this many steps")
    output_dir: Optional[str] = option(None, "write baseline_<method>.json here")


@dataclass
class EvalRunArguments(DataTaskArguments):
    """Evaluate a model, or a run's best/final weights, on a task split; prints JSON."""

    model: str = shared(ModelArguments, "model", help="model to evaluate (ignored with --run-dir)")
    run_dir: Optional[str] = option(None, "evaluate this run's weights instead (base + trajectory)")
    step: str = option("best", "with --run-dir: best, final or a step number")
    task: Optional[str] = option(None, "task (default: sst2, or the run's task); as for train: a name, "
                                       "'module:function', a data file or a Hugging Face dataset")
    split: str = option("validation", "the split to evaluate", choices=["train", "validation", "test"])
    n: Optional[int] = option(None, "evaluate on this many examples (default: all)", min=1)
    seed: int = shared(SeedArguments, "seed", help="seed for subsampling with --n")
    data_dir: Optional[str] = shared(DataArguments, "data_dir")
    dtype: str = shared(ComputeArguments, "dtype")
    eval_batch_size: int = shared(EvalArguments, "eval_batch_size")
    max_completion_length: Optional[int] = option(None, "the most tokens a completion has (default: with --run-dir "
                                                        "the run's --max-completion-length, else 32)", min=1)

    def __post_init__(self):
        super().__post_init__()
        parse_step(self.step)


#: each command's earlier option names -> the field that replaced them (``mezo-rl`` names it when one is given)
RENAMED_OPTIONS = {
    "train": RENAMED, "compare": RENAMED,
    "eval": {"batch_size": "eval_batch_size", "max_new_tokens": "max_completion_length"},
    "baseline": {"max_new_tokens": "max_completion_length", "batch_size": "eval_batch_size"},
}


def parse_step(step) -> str | int:
    """``"best"`` / ``"final"`` / a step number (``--step`` of eval and export)."""
    if step in ("best", "final") or isinstance(step, int):
        return step
    try:
        return int(step)
    except ValueError:
        raise ConfigError(f"--step: got {step!r}, accepted: best, final or a step number") from None
