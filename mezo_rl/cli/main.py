"""The ``mezo-rl`` command (also ``python -m mezo_rl``).

Subcommands::

    mezo-rl train     fine-tune with MeZO (options: the fields of MeZOConfig)
    mezo-rl eval      evaluate a model, or a run's best/final weights, on a task split; prints JSON
    mezo-rl export    base model + trajectory -> a save_pretrained directory with its model card (README.md)
    mezo-rl compare   train several objectives/configs on the same data and seed; table + plots
    mezo-rl baseline  zero-shot, ICL, linear probing or Adam fine-tuning on the same data
    mezo-rl report    a run's summary (task, model, objective, before -> after with n, best step) + curves.png
    mezo-rl tasks     list the tasks
    mezo-rl rewards   list the rewards

Options come from dataclasses, in the style of Hugging Face's ``HfArgumentParser``: every field is
``--field-name`` (``--field_name`` works too), booleans take ``--flag`` / ``--no-flag``, list fields
are repeatable (``--reward accuracy --reward cross_entropy``; ``--reward accuracy,cross_entropy``
also works). ``--config file.yaml`` (or .json) supplies values; options on the command line win.

Errors: a mistake the user can fix (a :class:`~mezo_rl.errors.UserError`: a bad option, an unknown
name, a missing file, a bad combination) ends the command with one line on stderr,
``mezo-rl: error: <what was wrong and what is accepted>``, and exit status 2; the checks run before any
model or data is loaded (:mod:`mezo_rl.cli.checks`). ``--debug`` (anywhere on the command line) or
``MEZO_RL_DEBUG=1`` also prints the traceback. Ctrl-C / SIGTERM during ``train`` writes a checkpoint
at the last completed step and prints the command that resumes (exit status 130 / 143).
"""
from __future__ import annotations

import argparse
import difflib
import contextlib
import dataclasses
import json
import os
import pathlib
import re
import shlex
import signal
import sys
import traceback
import typing
from typing import Any, Optional

import yaml

from mezo_rl.cli import checks, plots
from mezo_rl.training.plan import build_objective, resolve_task, reward_refs
from mezo_rl.training.resolve import explain
from mezo_rl.training.setup import load_splits

from mezo_rl.training import rundir
from mezo_rl.training.arguments import (RENAMED_OPTIONS, BaselineArguments, EvalRunArguments, MeZOConfig,
                                       data_task_options, parse_step)
from mezo_rl.training.config import trl_options
from mezo_rl.training.fields import RENAMED, flag, unwrap_optional
from mezo_rl.training.model_card import push_to_hub, write_model_card
from mezo_rl.cli.baselines import run_baseline
from mezo_rl.cli.compare import compare, objective_variants, write_report
from mezo_rl.training.distributed import DistContext
from mezo_rl.errors import ConfigError, UserError
from mezo_rl.training.evaluation import evaluate
from mezo_rl.training.kl import StartingPoint
from mezo_rl.model.loading import check_model, load_model
from mezo_rl.model.peft import PEFT_METHODS
from mezo_rl.training.rundir import load_run, save_model
from mezo_rl.training.runguard import RunLock
from mezo_rl.training.trainer import MeZOTrainer, TrainingInterrupted
from mezo_rl import rewards
from mezo_rl.rewards import describe_rewards
from mezo_rl.tasks import get_task, list_tasks
from mezo_rl.choices import weights_dtype


class UsageError(ConfigError):
    """What argparse rejects (an unknown option, a value of the wrong type, an invalid choice)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with its errors raised as :class:`UsageError` (one line, through ``main``) instead of
    printing the usage and exiting; an option is only its full name (no abbreviations: ``--lr`` is not
    ``--lr-scheduler-type``)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise UsageError(f"{message} (see `{self.prog} --help`)")


class OneLineHelp(argparse.HelpFormatter):
    """``--help`` with one line per option: its dash spelling (the underscore one is accepted, not shown),
    ``--[no-]flag`` for a boolean, and its help text unwrapped."""

    def __init__(self, prog):
        super().__init__(prog, max_help_position=38, width=100_000)

    def _format_action_invocation(self, action):
        if not action.option_strings:
            return super()._format_action_invocation(action)
        first = action.option_strings[0]
        if isinstance(action, argparse.BooleanOptionalAction):
            return "--[no-]" + first[2:]
        if action.nargs == 0:
            return first
        return f"{first} {self._format_args(action, self._get_default_metavar_for_optional(action))}"

    def _split_lines(self, text, width):
        return [" ".join(text.split())]


TRAIN_DESCRIPTION = ("Fine-tune a model with MeZO. Every option is a field of mezo_rl.MeZOConfig (TRL's GRPOConfig "
                     "names); --config FILE.yaml gives them as a file, and the command line wins. "
                     "The fields of GRPOConfig and TrainingArguments that are not options here are accepted in "
                     "the file (docs/api.md).")


# ---------------------------------------------------------------------- dataclass -> argparse
def _split_commas(item_type):
    def parse(text: str):
        return [item_type(t) for t in text.split(",") if t.strip()]
    parse.__name__ = item_type.__name__
    return parse


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def _verbatim(text: str) -> list[str]:
    """One item of a ``verbatim`` list option: the text as given, ``\\n``, ``\\t`` and ``\\\\`` read as escapes."""
    return [re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m.group(1)], text)]


_verbatim.__name__ = "str"


def _json_object(text: str) -> dict:
    """A dict option's value on the command line: a JSON object (``'{"top_k": 50}'``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not a JSON object ({e.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"not a JSON object: {text!r}")
    return value


_json_object.__name__ = "JSON object"


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls, skip=()) -> None:
    """Add one option per field of the dataclass ``cls`` (defaults suppressed: see :func:`parse_into`)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        tp = unwrap_optional(hints[f.name])
        names = [f"--{f.name.replace('_', '-')}"] + ([f"--{f.name}"] if "_" in f.name else [])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        help_text = f.metadata.get("help", "")
        if "default" not in help_text:  # one default each: the help text's own, or the field's
            help_text += f" (default: {','.join(map(str, default)) if isinstance(default, list) else default})"
        kw: dict[str, Any] = dict(dest=f.name, default=argparse.SUPPRESS, help=help_text)
        if "choices" in f.metadata:
            kw["choices"] = f.metadata["choices"]
        if tp is bool:
            parser.add_argument(*names, action=argparse.BooleanOptionalAction, **kw)
        elif tp is dict:
            parser.add_argument(*names, type=_json_object, metavar="JSON", **kw)
        elif typing.get_origin(tp) is list:
            (item,) = typing.get_args(tp)
            kw.pop("choices", None)
            parse = _verbatim if f.metadata.get("verbatim") else _split_commas(item)
            parser.add_argument(*names, action="append", type=parse, metavar=item.__name__.upper(), **kw)
        else:
            metavar = "{" + ",".join(map(str, kw["choices"])) + "}" if "choices" in kw else tp.__name__.upper()
            parser.add_argument(*names, type=tp, metavar=metavar, **kw)


def load_config_file(path: str, flag: str = "--config") -> dict:
    """Read a YAML or JSON file of option values (keys as field names; dashes allowed)."""
    if not os.path.isfile(path):
        raise ConfigError(f"{flag}: file not found: {path}")
    with open(path) as fh:
        try:
            data = json.load(fh) if path.endswith(".json") else yaml.safe_load(fh)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{flag} {path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from e
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            raise ConfigError(f"{flag} {path}: not valid YAML ({getattr(e, 'problem', None) or type(e).__name__}{where})") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{flag} {path}: expected a mapping of option: value, got {type(data).__name__}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def parse_into(cls, ns: argparse.Namespace, config: Optional[dict] = None, skip=()):
    """Build ``cls`` from dataclass defaults < config file < command line (``ns``)."""
    return cls(**option_values(cls, ns, config, skip))  # the argument dataclasses raise ConfigError naming the option


def option_values(cls, ns: argparse.Namespace, config: Optional[dict] = None, skip=()) -> dict:
    """The options of ``cls`` given in the config file, then on the command line (``ns``, which wins)."""
    fields = {f.name for f in dataclasses.fields(cls)} - set(skip)
    values = {}
    config = trl_options(config or {}, fields)
    unknown = sorted(set(config or {}) - fields)
    if unknown:
        renamed = RENAMED if cls is MeZOConfig else {}
        hints = [f"{k!r} (now {renamed[k]!r})" if renamed.get(k) in fields else repr(k) for k in unknown]
        raise ConfigError(f"config file: unknown option(s) {', '.join(hints)}; accepted: {sorted(fields)}")
    values.update(config or {})
    for name in fields:
        if hasattr(ns, name):
            v = getattr(ns, name)
            if isinstance(v, list) and v and isinstance(v[0], list):  # appended comma-lists
                v = [x for part in v for x in part]
            values[name] = v
    for name in ("reward", "candidates", "report_to"):
        if isinstance(values.get(name), str):
            values[name] = [s.strip() for s in values[name].split(",") if s.strip()]
    return values


# ---------------------------------------------------------------------- subcommands
@contextlib.contextmanager
def _model_loading_bars(show: bool):
    """transformers' weight-loading progress bars, shown only with --progress."""
    import transformers.utils.logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if show else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def cmd_train(ns, callbacks=()) -> int:
    args = parse_into(MeZOConfig, ns, _config(ns))
    if getattr(ns, "dry_run", False):
        print(explain(checks.check_training(args)))  # every value and its source; nothing loaded, nothing written
        return 0
    with _model_loading_bars(args.progress):
        return _train(args, callbacks)


def _train(args, callbacks=()) -> int:
    with DistContext.from_env() as dist:  # under torchrun: the group is left at the end, by every rank together
        # options, task, rewards, model, data and output directory: nothing loaded yet
        plan = checks.check_training(args)
        with RunLock(args.output_dir) if dist.is_main else contextlib.nullcontext():  # one run per output directory
            trainer = MeZOTrainer(args=plan.args, plan=plan, dist=dist, callbacks=[plots.CurvesCallback(), *callbacks])
            trainer.train()
    if dist.is_main:  # under torchrun, one report
        _print_summary(trainer.summary, trainer.output_dir)
    return 0


def _print_summary(summary: dict, output_dir) -> None:
    out = pathlib.Path(output_dir)
    files = [f for f in (rundir.SUMMARY_FILE, rundir.METRICS_FILE, plots.CURVES_FILE) if (out / f).is_file()]
    peak = f", peak memory {summary['peak_rss_mb']:.0f} MB" if summary.get("peak_rss_mb") else ""  # the process's peak RSS
    print(f"results in {out}: {', '.join(files)}, {rundir.CHECKPOINT_DIR}/ ({summary['wall_time_s']:.0f} s{peak})")
    print(plots.results_line(summary))


def _task_args(args, default_task: str = "sst2", run_args=None):
    """The arguments that name the task: ``args`` when it names one, else the run's (``run_args``), else the default."""
    if args.task is not None:
        return args
    if data_task_options(args):
        raise ConfigError(f"{', '.join('--' + k.replace('_', '-') for k in data_task_options(args))} need --task "
                          f"(the data file or dataset they describe)")
    return run_args if run_args is not None else dataclasses.replace(args, task=default_task)


def _replay_to(lm, run_dir, step) -> int:
    """Replay the first ``step`` ("best", "final" or a number) steps of the run in ``run_dir`` on ``lm`` (its
    weights at step 0); the step number."""
    ckpt = rundir.checkpoint_dir(pathlib.Path(run_dir))
    trajectory = rundir.read_trajectory(ckpt / rundir.TRAJECTORY_FILE)
    state = rundir.TrainerState.load_from_json(ckpt / rundir.STATE_FILE)
    step = parse_step(step)
    n = {"best": state.best_step, "final": state.global_step}.get(step, step)
    if not 0 <= n <= len(trajectory):
        raise ConfigError(f"--step {step!r}: the checkpoint in {run_dir} has steps 0..{len(trajectory)}")
    rundir.replay_prefix(lm, trajectory, n)
    return n


def cmd_eval(ns) -> int:
    args = parse_into(EvalRunArguments, ns)
    run_args = None
    if args.run_dir:
        checks.check_run_dir(args.run_dir)
        run_args = rundir.read_args(args.run_dir)
    else:
        check_model(args.model, weights_dtype(args.dtype, getattr(args, "autocast", "auto")))
    task_args = _task_args(args, run_args=run_args)
    data_dir = args.data_dir if args.data_dir is not None or run_args is None else run_args.data_dir
    checks.check_data_dir(data_dir)
    task = resolve_task(task_args)
    examples = load_splits(task, task_args.task, {args.split: args.n}, data_dir, args.seed)[args.split]
    objective = reference = None
    if args.run_dir and task.kind == "prompts":
        # the run's rewards are the metrics, and kl is to the run's starting weights: the base (+ adapter) at
        # step 0, its trainable tensors kept (mezo_rl.training.kl), then the run's steps replayed on it
        objective = build_objective(reward_refs(run_args.reward, task, run_args.task), run_args.reward_weights,
                                    run_args.reward_scale, run_args.trust_remote_code)
    if args.run_dir and rundir.stops_changed(args.run_dir, run_args.stop, task, objective):
        print(f"warning: the run in {args.run_dir!r} was made by a version that cut completions before their stop "
              "string; this evaluation keeps it, so its figures can differ from the run's own", file=sys.stderr)
    if args.run_dir and task.kind == "prompts":
        lm, _, _ = load_run(args.run_dir, 0)
        reference = StartingPoint(lm.model)
        step = _replay_to(lm, args.run_dir, args.step)
        info = {"run_dir": args.run_dir, "step": step}
    elif args.run_dir:
        lm, _, step = load_run(args.run_dir, args.step)
        info = {"run_dir": args.run_dir, "step": step}
    else:
        lm = load_model(args.model, dtype=weights_dtype(args.dtype, getattr(args, "autocast", "auto")))
        info = {"model": args.model}
    max_new_tokens = args.max_completion_length or (run_args.max_completion_length if run_args is not None else
                                                    MeZOConfig().max_completion_length)  # what the run generated
    metrics = evaluate(lm, task, examples, batch_size=args.eval_batch_size, max_new_tokens=max_new_tokens,
                       progress=True, desc=f"{args.split}", objective=objective, reference=reference,
                       stop=run_args.stop if run_args is not None else None)  # the run's --stop strings
    print(json.dumps({**info, "task": task_args.task, "split": args.split, "n": len(examples),
                      "metrics": {k: float(v) for k, v in metrics.items()}}, indent=2))
    return 0


def cmd_export(ns) -> int:
    checks.check_run_dir(ns.run_dir)
    step = parse_step(ns.step)
    out = pathlib.Path(ns.output)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--output {str(out)!r} is not a directory (a file is there)")
    lm, args, step = load_run(ns.run_dir, step)
    merged = ns.merge and args.peft == "lora"
    if ns.merge and args.peft == "prefix":
        raise ConfigError("--merge: a prefix adapter cannot be folded into the weights (it adds attention keys and "
                          "values, not a weight delta); leave out --merge")
    save_model(lm, args.peft, ns.output, merged=merged)
    summary_path = pathlib.Path(ns.run_dir) / rundir.SUMMARY_FILE
    write_model_card(ns.output, args.to_dict(), rundir.read_json(summary_path) if summary_path.is_file() else None,
                     step=step)  # README.md with Hub metadata, as TRL writes on every save
    if ns.push_to_hub:
        print(f"pushed to {push_to_hub(ns.output, ns.push_to_hub)}")
    print(f"wrote {ns.output} ({args.model} + {step} MeZO steps from {ns.run_dir}"
          + (f", {args.peft} {'merged' if merged else 'adapter'}" if args.peft in PEFT_METHODS else "") + ")")
    return 0


def cmd_compare(ns) -> int:
    if ns.runs:
        names = [os.path.basename(os.path.normpath(r)) for r in ns.runs]
        paths = write_report(dict(zip(names, ns.runs)), ns.report_dir or ".")
    else:
        given = option_values(MeZOConfig, ns, _config(ns))
        base = MeZOConfig(**given)
        variants = {}
        if ns.objective:
            variants.update(objective_variants(base, [o for part in ns.objective for o in part]))
        for path in ns.variant or []:
            name = os.path.splitext(os.path.basename(path))[0]
            overrides = load_config_file(path, flag="--variant")
            unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(MeZOConfig)})
            if unknown:
                raise ConfigError(f"--variant {path}: unknown option(s) {unknown}; use `mezo-rl train` option names")
            try:
                # built from the options given, so a variant in another --peft mode gets that mode's defaults
                variants[name] = MeZOConfig(**{**given, **overrides, "resume": False})
            except UserError as e:
                raise ConfigError(f"--variant {path}: {e}") from e
        if len(variants) < 2:
            raise ConfigError("compare: give at least two variants (--objective cross_entropy --objective accuracy, "
                              "and/or --variant a.yaml --variant b.yaml), or --runs DIR DIR to report finished runs")
        for args in variants.values():  # every run's options, before the first one starts
            checks.check_training(args, output=False)
        checks.check_output_dir(base)
        with RunLock(base.output_dir), _model_loading_bars(base.progress):
            compare(variants, base.output_dir)
        paths = {k: os.path.join(base.output_dir, n) for k, n in
                 (("table", "comparison.md"), ("validation_vs_steps.png", "validation_vs_steps.png"),
                  ("validation_vs_time.png", "validation_vs_time.png"))}
    print(open(paths["table"]).read())
    print("plots:", paths["validation_vs_steps.png"], paths["validation_vs_time.png"])
    return 0


def cmd_baseline(ns) -> int:
    args = parse_into(BaselineArguments, ns, _config(ns))
    check_model(args.model, weights_dtype(args.dtype, getattr(args, "autocast", "auto")))
    checks.check_data_dir(args.data_dir)
    task = resolve_task(args)
    if args.output_dir is not None and pathlib.Path(args.output_dir).is_file():
        raise ConfigError(f"--output-dir {args.output_dir!r} is not a directory (a file is there)")
    print(json.dumps(run_baseline(args, task=task), indent=2))
    return 0


def cmd_report(ns) -> int:
    print(plots.report(ns.run_dir, plot=ns.plot, pairs=ns.pairs))
    return 0


def cmd_tasks(ns) -> int:
    names = list_tasks()
    width = max(len(n) for n in names)
    for name in names:
        task = get_task(name)
        doc = (getattr(task, "description", None) or (type(task).__doc__ or "")).strip().splitlines()
        print(f"{name:{width}s} {task.kind:16s} {doc[0] if doc else ''}")
    return 0


def cmd_rewards(ns) -> int:
    rows = describe_rewards()
    width = max([len(r.name) for r in rows] + [4])
    print(f"{'name':{width}s}  {'needs':10s}  {'better':6s}  description")
    for r in rows:
        better = {True: "higher", False: "lower"}.get(r.higher_is_better, "?")
        print(f"{r.name:{width}s}  {r.kind:10s}  {better:6s}  {r.description}")
    return 0


def _config(ns) -> Optional[dict]:
    return load_config_file(ns.config) if getattr(ns, "config", None) else None


# ---------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="mezo-rl", description="Fine-tune language models on any objective with MeZO "
                            "(Malladi et al., 2023): forward passes only, inference memory.")
    parser.add_argument("--debug", action="store_true",
                        help="on an error, also print the Python traceback (also: MEZO_RL_DEBUG=1; accepted anywhere "
                        "on the command line)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fmt = argparse.ArgumentDefaultsHelpFormatter

    p = sub.add_parser("train", help="fine-tune with MeZO", description=TRAIN_DESCRIPTION, formatter_class=OneLineHelp,
                       usage="mezo-rl train [--config FILE] [--OPTION VALUE ...]")
    p.add_argument("--config", help="YAML/JSON file of option values (command-line options win)")
    p.add_argument("--dry-run", action="store_true", help="print every value the run would use and where it comes "
                                                         "from (user, default, task default, mode default, derived, "
                                                         "resumed run), then stop before any model loads")
    add_dataclass_arguments(p, MeZOConfig)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="evaluate a model or a run on a task split (prints JSON)",
                       description=EvalRunArguments.__doc__)
    add_dataclass_arguments(p, EvalRunArguments)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("export", help="base model + trajectory -> save_pretrained directory with a model card",
                       formatter_class=fmt)
    p.add_argument("--run-dir", required=True, help="a `mezo-rl train` output directory")
    p.add_argument("--output", required=True, help="directory to write (save_pretrained layout)")
    p.add_argument("--step", default="best", help="best, final or a step number")
    p.add_argument("--merge", action="store_true",
                   help="LoRA runs: fold the adapter into the weights (a plain from_pretrained model); default: the "
                   "PEFT adapter folder that peft.PeftModel.from_pretrained loads (a prefix is always an adapter)")
    p.add_argument("--push-to-hub", metavar="REPO_ID", default=None,
                   help="also upload the directory (weights, tokenizer, README.md model card) to this Hub repository")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("compare", help="compare objectives/configs on the same data and seed",
                       description="Train one run per --objective / --variant (all other options shared, as for "
                       "train) into OUTPUT_DIR/<name>, then write OUTPUT_DIR/comparison.md, "
                       "validation_vs_steps.png and validation_vs_time.png.")
    p.add_argument("--config", help="YAML/JSON file of shared train options")
    p.add_argument("--objective", action="append", type=_split_commas(str),
                   help="an objective to compare (repeat; 'a+b' combines rewards), e.g. --objective cross_entropy --objective accuracy")
    p.add_argument("--variant", action="append", help="a YAML/JSON file of train options overriding the shared ones (repeat)")
    p.add_argument("--runs", nargs="+", help="only write the report for these finished run directories")
    p.add_argument("--report-dir", default=None, help="with --runs: where the report goes (default: .)")
    add_dataclass_arguments(p, MeZOConfig, skip=("reward", "reward_weights", "resume", "overwrite_output_dir"))
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("baseline", help="zero-shot / ICL / linear probing / Adam fine-tuning",
                       description=BaselineArguments.__doc__)
    p.add_argument("--config", help="YAML/JSON file of option values")
    add_dataclass_arguments(p, BaselineArguments)
    p.set_defaults(func=cmd_baseline)

    p = sub.add_parser("report", help="summary of a run (before -> after with n, best step) and its curves.png",
                       description="Print a run's task, model, objective, steps, validation and test before -> after "
                       "with n, best step, wall time and peak memory (a prompt task's: a few completions before -> after), and write RUN_DIR/curves.png (training reward "
                       "per step with a running mean, validation metric at each evaluation). Works on unfinished runs.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a `mezo-rl train` output directory")
    p.add_argument("--plot", action=argparse.BooleanOptionalAction, default=True,
                   help="write RUN_DIR/curves.png (needs matplotlib)")
    p.add_argument("--pairs", type=int, default=3,
                   help="prompt tasks: how many test prompts to show with their completions before -> after (0: none)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("tasks", help="list the tasks")
    p.set_defaults(func=cmd_tasks)
    p = sub.add_parser("rewards", help="list the rewards")
    p.set_defaults(func=cmd_rewards)
    return parser


DEBUG_ENV = "MEZO_RL_DEBUG"


def command_options(parser: argparse.ArgumentParser, command: Optional[str]) -> list[str]:
    """The ``--options`` the command ``command`` of ``parser`` (or the parser itself) takes, dash spellings."""
    if command is not None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) and command in action.choices:
                parser = action.choices[command]
    return [s for action in parser._actions for s in action.option_strings if s.startswith("--") and "_" not in s]


def unrecognized(extra: list[str], command: Optional[str], options=()) -> str:
    """The one line for options ``command`` does not take: an earlier name says the field that replaced it; another
    mistyped one, the nearest of ``options`` (the command's)."""
    renamed = RENAMED_OPTIONS.get(command, {})
    olds = [a for a in extra if a.startswith("--") and a[2:].split("=")[0].replace("-", "_") in renamed]
    parts = [f"{a.split('=')[0]} is now {flag(renamed[a[2:].split('=')[0].replace('-', '_')])}" for a in olds]
    rest = [a for i, a in enumerate(extra) if a not in olds  # nor the value an earlier name was given
            and not (i and extra[i - 1] in olds and "=" not in extra[i - 1] and not a.startswith("--"))]
    if rest:
        near = [(a.split("=")[0], close[0]) for a in rest if a.startswith("--")
                for close in [difflib.get_close_matches(a.split("=")[0], options, n=1, cutoff=0.6)] if close]
        hint = near[0][1] if len(near) == 1 else ", ".join(f"{new} for {old}" for old, new in near)
        parts.append(f"unrecognized arguments: {' '.join(rest)}" + (f"; did you mean {hint}?" if near else ""))
    return "; ".join(parts) + f" (see `mezo-rl{' ' + command if command else ''} --help`)"


def _resume_command(argv: list[str]) -> str:
    """The command line that continues an interrupted ``train`` (the same options plus ``--resume``)."""
    return shlex.join(["mezo-rl", *[a for a in argv if a != "--resume"], "--resume"])


def main(argv: Optional[list[str]] = None, callbacks=()) -> int:
    """Run the command; returns the exit status (0 ok, 2 a user error, 130/143 interrupted). ``callbacks``: more
    training callbacks for ``train`` (for a script that drives the command line with its own)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get(DEBUG_ENV, "").lower() in ("1", "true", "yes", "on")
    argv = [a for a in argv if a != "--debug"]
    try:
        parser = build_parser()
        ns, extra = parser.parse_known_args(argv)
        if extra:
            command = getattr(ns, "command", None)
            raise UsageError(unrecognized(extra, command, command_options(parser, command)))
        if ns.func is cmd_train:
            return ns.func(ns, callbacks)
        if callbacks:
            raise UsageError(f"training callbacks were given to `{ns.command}`; only `train` takes them")
        return ns.func(ns)
    except UserError as err:
        if debug:
            traceback.print_exc()
        message = " ".join(str(err).split("\n")).strip() or type(err).__name__
        print(f"mezo-rl: error: {message}", file=sys.stderr)
        return 2
    except TrainingInterrupted as err:
        if debug:
            traceback.print_exc()
        signum = getattr(signal, err.signal_name or "SIGINT", signal.SIGINT)
        then = f"resume with: {_resume_command(argv)}" if argv[:1] == ["train"] else \
            f"resume that run with: mezo-rl train --config {pathlib.Path(err.output_dir) / rundir.CONFIG_FILE} --resume"
        print(f"mezo-rl: interrupted at step {err.step} of {err.steps} ({err.signal_name or 'SIGINT'}); weights restored, "
              f"checkpoint written to {err.output_dir}; {then}", file=sys.stderr)
        return 128 + int(signum)
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("mezo-rl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
