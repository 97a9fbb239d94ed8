"""Where a run's metrics go besides ``metrics.jsonl``: ``report_to``, with TRL's keys.

``report_to`` takes ``"none"``, or one or more of ``"tensorboard"``, ``"trackio"`` and ``"wandb"`` (``"all"``:
every one of them that is installed), as in transformers. Each is a callback on ``on_log``
(:mod:`mezo_rl.training.callbacks`), so a dashboard of a MeZO run reads like one of a TRL GRPO run:

==============================  ============================================================
``loss``                        the step's loss (the mean over its members)
``reward`` / ``reward_std``     the weighted reward of the step's completions: mean, and the mean over
                                prompts of its spread across each prompt's completions
``rewards/<name>/mean|std``     each reward's mean over the step's completions, and its spread
``frac_reward_zero_std``        the share of prompts whose completions all got the same weighted reward
``completions/mean_length``     the completions' mean length in tokens (also ``min_length``, ``max_length``)
``completions/clipped_ratio``   the share of completions that reached ``max_completion_length``
``num_tokens``                  the prompt and completion tokens the run's steps have read so far
``completions`` (a table)       ``log_completions``: prompt, completion and each reward, every logging step
``kl``                          KL to the starting model, when the run computes it
``learning_rate``               the step's learning rate
``eval_<metric>``               each validation metric (``eval_reward``: the weighted reward,
                                ``eval_rewards/<name>/mean`` and ``/std``: each reward's; :func:`metric_key`,
                                the names ``evaluate()`` and ``metric_for_best_model`` use too)
==============================  ============================================================

The dashboards get these under transformers' prefixes (``train/reward``, ``eval/reward``, ...), as a
``transformers.Trainer`` writes them. trackio is local-first (its database under ``$TRACKIO_DIR``, by
default in the Hugging Face cache); wandb runs in whatever ``WANDB_MODE`` says (``offline`` writes
``OUTPUT_DIR/wandb`` and needs no account). Each integration is an optional extra:
``pip install 'mezo-rl[trackio]'`` / ``'mezo-rl[wandb]'`` / ``'mezo-rl[tensorboard]'``; asking for one that is not
installed is one line naming the extra, before anything is loaded (:func:`check_report_to`).
"""
from __future__ import annotations

import json
import math
import pathlib
import statistics
from typing import Optional

from mezo_rl.choices import INTEGRATIONS, REPORT_TO, check_report_to
from mezo_rl.rewards import trl_names
from mezo_rl.training.callbacks import TrainerCallback

__all__ = ["REPORT_TO", "INTEGRATIONS", "check_report_to", "train_logs", "eval_logs", "eval_metrics", "metric_key",
           "rewrite_logs", "reporters", "completion_stats", "completions_table", "log_table", "write_completions_table", "completions_file", "COMPLETIONS_DIR",
           "TensorBoardReporter", "TrackioReporter", "WandbReporter", "PROJECT"]

#: integration -> (the module it needs, the pip extra that installs it)
PROJECT = "mezo-rl"  # the trackio / wandb project of a run




# ---------------------------------------------------------------------- TRL's keys
_TRAIN_KEYS = {"lr": "learning_rate", "seconds": "step_time"}
_PASSED = ("loss", "reward", "reward_std", "frac_reward_zero_std", "completions/mean_length", "completions/min_length",
           "completions/max_length", "completions/clipped_ratio", "num_tokens", "kl", "projected_grad", "update_kept")


def _number(v) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


#: a prompt task's weighted reward (``mezo_rl.training.evaluation.OBJECTIVE``) and its statistics -> TRL's names
_OBJECTIVE_KEYS = {"objective": "reward", "objective/std": "reward_std", "objective/se": "reward_se"}


def metric_key(key: str, names: dict) -> str:
    """An evaluation metric (a key of ``mezo_rl.training.evaluation.evaluate``'s result) under TRL's name, the one
    name ``evaluate()``, ``log_history``, the dashboards and ``metric_for_best_model`` use: the weighted reward
    ``reward`` (``reward_std``, ``reward_se``); a reward's mean ``rewards/<name>/mean`` (``/std``, ``/se``), its
    name from ``names`` (reward reference -> TRL name: :func:`mezo_rl.rewards.trl_names`); others as they are
    (``accuracy``, ``kl``, ``distinct_2``, ...)."""
    if key in _OBJECTIVE_KEYS:
        return _OBJECTIVE_KEYS[key]
    base, stat = (key.rpartition("/")[0], key.rpartition("/")[2]) if key.endswith(("/se", "/std")) else (key, "mean")
    return f"rewards/{names[base]}/{stat}" if base in names else key


def eval_metrics(metrics: dict, reward_names=(), prefix: str = "eval") -> dict:
    """An evaluation's metrics as transformers returns and logs them: numbers only, each as
    ``<prefix>_<TRL name>`` (:func:`metric_key`; ``reward_names``: the run's reward references)."""
    names = trl_names(reward_names)
    return {f"{prefix}_{metric_key(k, names)}": float(v) for k, v in metrics.items() if _number(v) is not None}


def train_logs(record: dict) -> dict:
    """A training step's ``metrics.jsonl`` record under TRL's keys (numbers only; ``step`` left out)."""
    rewards_of = {k[len("reward/"):-len("/std")] if k.endswith("/std") else k[len("reward/"):]
                  for k in record if k.startswith("reward/")}
    names = trl_names(sorted(rewards_of))
    out = {}
    for key, value in record.items():
        if _number(value) is None:
            continue
        if key.startswith("reward/"):  # reward/<name> and reward/<name>/std
            name, std = (key[len("reward/"):-len("/std")], True) if key.endswith("/std") else (key[len("reward/"):], False)
            out[f"rewards/{names[name]}/{'std' if std else 'mean'}"] = float(value)
        elif key in _TRAIN_KEYS:
            out[_TRAIN_KEYS[key]] = float(value)
        elif key in _PASSED:
            out[key] = float(value)
    return out


def eval_logs(record: dict, reward_names=()) -> dict:
    """An evaluation's ``metrics.jsonl`` record as transformers logs it: every metric as ``<split>_<metric>``
    (``eval_`` for validation, ``test_`` for test) under TRL's names (:func:`eval_metrics`), with
    ``<split>_runtime``."""
    prefix = "eval" if record.get("split") == "validation" else record.get("split", "eval")
    out = eval_metrics(record.get("metrics") or {}, reward_names, prefix)
    if _number(record.get("seconds")) is not None:
        out[f"{prefix}_runtime"] = float(record["seconds"])
    return out


def rewrite_logs(logs: dict) -> dict:
    """transformers' dashboard prefixes: ``eval_x`` -> ``eval/x``, ``test_x`` -> ``test/x``, else ``train/x``."""
    out = {}
    for key, value in logs.items():
        for prefix in ("eval", "test"):
            if key.startswith(prefix + "_"):
                out[f"{prefix}/{key[len(prefix) + 1:]}"] = value
                break
        else:
            out[f"train/{key}"] = value
    return out


def completion_stats(objective, outcomes, tokenizer=None, max_completion_length=None) -> dict:
    """TRL's statistics of a step's completions, from every member's objective output (this process's rows):
    ``reward`` (the mean weighted reward), ``reward_std`` (the spread of a prompt's weighted rewards across all
    of its completions, every member's, averaged over the prompts), ``frac_reward_zero_std`` (the share of
    prompts whose completions all scored the same: nothing to learn from them with ``reward_shaping`` group)
    and, where the step generated text and ``tokenizer`` is given, ``completions/mean_length``,
    ``completions/min_length`` and ``completions/max_length`` (in tokens, the text re-tokenised),
    ``completions/clipped_ratio`` (the share that reached ``max_completion_length``) and ``step_tokens`` (the
    prompt and completion tokens the step's members read and wrote; the trainer adds them up into
    ``num_tokens``)."""
    per_prompt: dict[int, list[float]] = {}
    for out in outcomes:
        for group, value in zip(out.groups, objective.example_rewards(out.values)):
            if value is not None:
                per_prompt.setdefault(group, []).append(value)
    out: dict = {}
    values = [v for vs in per_prompt.values() for v in vs]
    if values:
        stds = [statistics.pstdev(vs) for vs in per_prompt.values()]
        out.update(reward=statistics.fmean(values), reward_std=statistics.fmean(stds),
                   frac_reward_zero_std=statistics.fmean(math.isclose(s, 0.0, abs_tol=1e-8) for s in stds))
    texts = [t for o in outcomes for t in (getattr(o, "texts", None) or [])]
    if texts and tokenizer is not None:
        lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        out["completions/mean_length"] = statistics.fmean(lengths)
        out["completions/min_length"], out["completions/max_length"] = float(min(lengths)), float(max(lengths))
        if max_completion_length:
            out["completions/clipped_ratio"] = statistics.fmean(n >= max_completion_length for n in lengths)
        prompts = [p if isinstance(p, str) else json.dumps(p) for o in outcomes for p in (getattr(o, "prompts", None) or [])]
        prompt_tokens = sum(len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]) if prompts else 0
        out["step_tokens"] = prompt_tokens + sum(lengths)
    return out


def completions_table(objective, outcome, step: int, limit: int) -> list[dict]:
    """The first ``limit`` rows of a step's completions (one member's objective output) as TRL's completions table
    shows them: ``step``, ``prompt``, ``completion`` and each reward under its TRL name."""
    names = trl_names(objective.names)
    rows = []
    for i, text in enumerate((getattr(outcome, "texts", None) or [])[:limit]):
        rows.append({"step": step, "prompt": outcome.prompts[i], "completion": text,
                     **{names[name]: values[i] for name, values in outcome.values.items()}})
    return rows


def log_table(callbacks, name: str, rows: list[dict], step: int) -> None:
    """``rows`` as a table named ``name`` to every logger among ``callbacks`` that shows tables (trackio, wandb)."""
    for callback in callbacks:
        if isinstance(callback, _Reporter) and rows:
            callback.write_table(name, rows, step)


COMPLETIONS_DIR = "completions"


def completions_file(run_dir, split: str, step: int) -> pathlib.Path:
    return pathlib.Path(run_dir) / COMPLETIONS_DIR / f"{split}-step{step:06d}.parquet"


def write_completions_table(run_dir, split: str, step: int, samples: list[dict]) -> Optional[pathlib.Path]:
    """An evaluation's kept completions as a Parquet table, as TRL's ``log_completions`` writes them: one row per
    completion with ``step``, ``prompt`` (chat messages as JSON), ``completion`` and one column per reward.
    Needs pyarrow (which ``datasets`` brings); without it only the JSONL samples are written."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return None
    keys = list(dict.fromkeys(k for r in samples for k in r if k != "split"))
    columns = {k: [_cell(r.get(k)) for r in samples] for k in keys}
    path = completions_file(run_dir, split, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    pq.write_table(pa.table(columns), tmp)
    tmp.replace(path)
    return path


def _cell(value):
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    return json.dumps(value, sort_keys=True, default=str)


# ---------------------------------------------------------------------- the loggers
class _Reporter(TrainerCallback):
    """Logs every ``on_log`` to one integration; opened at ``on_train_begin``, closed at ``on_train_end``
    (main process only: the trainer gives these callbacks to rank 0)."""

    def on_train_begin(self, args, state, control, **kwargs):
        self.open(args)

    def on_log(self, args, state, control, logs=None, **kwargs):
        numbers = {k: float(v) for k, v in (logs or {}).items() if _number(v) is not None}
        if numbers:
            self.write(rewrite_logs(numbers), state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def open(self, args) -> None: ...

    def write(self, logs: dict, step: int) -> None: ...

    def close(self) -> None: ...

    def write_table(self, name: str, rows: list[dict], step: int) -> None:
        """A table of ``rows`` (dicts with the same keys); loggers without tables ignore it."""


def _columns(rows: list[dict]) -> tuple[list[str], list[list]]:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    return columns, [[_cell(r.get(k)) for k in columns] for r in rows]


def _run_name(args) -> str:
    return getattr(args, "run_name", None) or pathlib.Path(args.output_dir).resolve().name


def _config(args) -> dict:
    return args.to_dict() if hasattr(args, "to_dict") else dict(vars(args))


class TensorBoardReporter(_Reporter):
    """Scalars to ``logging_dir`` (default ``OUTPUT_DIR/tensorboard``; ``torch.utils.tensorboard``; the
    ``tensorboard`` extra)."""

    def __init__(self, log_dir=None):
        self.log_dir, self.writer = log_dir, None

    def open(self, args):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(self.log_dir or getattr(args, "logging_dir", None)
                                        or pathlib.Path(args.output_dir) / "tensorboard"))

    def write(self, logs, step):
        for key, value in logs.items():
            self.writer.add_scalar(key, value, step)

    def close(self):
        if self.writer is not None:
            self.writer.close()


class TrackioReporter(_Reporter):
    """Metrics to trackio (local-first: a SQLite database under ``$TRACKIO_DIR``), project :data:`PROJECT`,
    the run named after the output directory (or ``run_name``), the resolved config attached."""

    def __init__(self, project: str = PROJECT):
        self.project, self.run = project, None

    def open(self, args):
        import trackio

        self.trackio = trackio
        self.run = trackio.init(project=self.project, name=_run_name(args), config=_config(args), embed=False,
                                auto_log_cpu=False, auto_log_gpu=False,
                                resume="allow" if getattr(args, "resume", False) else "never")  # --resume: the same run

    def write(self, logs, step):
        self.trackio.log(logs, step=step)

    def write_table(self, name, rows, step):
        columns, data = _columns(rows)
        self.trackio.log({name: self.trackio.Table(columns=columns, data=data)}, step=step)

    def close(self):
        if self.run is not None:
            self.trackio.finish()
            self.run = None


class WandbReporter(_Reporter):
    """Metrics to Weights & Biases in the mode ``WANDB_MODE`` sets (``offline``: ``OUTPUT_DIR/wandb``, no
    account needed; ``wandb sync`` uploads it later), project :data:`PROJECT`."""

    def __init__(self, project: str = PROJECT):
        self.project, self.run = project, None

    def open(self, args):
        import wandb

        pathlib.Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=self.project, name=_run_name(args), dir=str(args.output_dir),
                              config=_config(args), reinit="finish_previous", settings=wandb.Settings(silent=True))

    def write(self, logs, step):
        self.run.log(logs, step=step)

    def write_table(self, name, rows, step):
        import wandb

        columns, data = _columns(rows)
        self.run.log({name: wandb.Table(columns=columns, data=data)}, step=step)

    def close(self):
        if self.run is not None:
            self.run.finish()
            self.run = None


_REPORTERS = {"tensorboard": TensorBoardReporter, "trackio": TrackioReporter, "wandb": WandbReporter}


def reporters(names) -> list[TrainerCallback]:
    """One logging callback per integration of ``names``, as :func:`check_report_to` returns them (a run's:
    ``RunPlan.report_to``)."""
    return [_REPORTERS[name]() for name in names]
