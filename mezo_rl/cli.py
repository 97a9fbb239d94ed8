"""The ``mezo-rl`` command (also ``python -m mezo_rl``).

Subcommands::

    mezo-rl train     fine-tune with MeZO (options: the fields of TrainingArguments)
    mezo-rl eval      evaluate a model, or a run's best/final weights, on a task split; prints JSON
    mezo-rl export    base model + trajectory -> a save_pretrained directory
    mezo-rl compare   train several objectives/configs on the same data and seed; table + plots
    mezo-rl baseline  zero-shot, ICL, linear probing or Adam fine-tuning on the same data
    mezo-rl tasks     list the tasks
    mezo-rl rewards   list the rewards

Options come from dataclasses, in the style of Hugging Face's ``HfArgumentParser``: every field is
``--field-name`` (``--field_name`` works too), booleans take ``--flag`` / ``--no-flag``, list fields
are repeatable (``--reward accuracy --reward cross_entropy``; ``--reward accuracy,cross_entropy``
also works). ``--config file.yaml`` (or .json) supplies values; options on the command line win.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import typing
from typing import Any, Optional

import yaml

from mezo_rl.arguments import BaselineArguments, EvalRunArguments, TrainingArguments, parse_step
from mezo_rl.baselines import run_baseline
from mezo_rl.compare import compare, objective_variants, write_report
from mezo_rl.evaluation import evaluate
from mezo_rl.models import load_model
from mezo_rl.peft import PEFT_METHODS
from mezo_rl.rundir import load_run, save_model
from mezo_rl.trainer import Trainer
from rewards import describe_rewards
from tasks import get_task, list_tasks


# ---------------------------------------------------------------------- dataclass -> argparse
def _unwrap_optional(tp):
    if typing.get_origin(tp) is typing.Union or type(tp).__name__ == "UnionType":
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _split_commas(item_type):
    def parse(text: str):
        return [item_type(t) for t in text.split(",") if t.strip()]
    parse.__name__ = item_type.__name__
    return parse


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls, skip=()) -> None:
    """Add one option per field of the dataclass ``cls`` (defaults suppressed: see :func:`parse_into`)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        tp = _unwrap_optional(hints[f.name])
        names = [f"--{f.name.replace('_', '-')}"] + ([f"--{f.name}"] if "_" in f.name else [])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        help_text = f.metadata.get("help", "") + f" (default: {default})"
        kw: dict[str, Any] = dict(dest=f.name, default=argparse.SUPPRESS, help=help_text)
        if "choices" in f.metadata:
            kw["choices"] = f.metadata["choices"]
        if tp is bool:
            parser.add_argument(*names, action=argparse.BooleanOptionalAction, **kw)
        elif typing.get_origin(tp) is list:
            (item,) = typing.get_args(tp)
            kw.pop("choices", None)
            parser.add_argument(*names, action="append", type=_split_commas(item), metavar=item.__name__.upper(), **kw)
        else:
            parser.add_argument(*names, type=tp, metavar=tp.__name__.upper(), **kw)


def load_config_file(path: str) -> dict:
    """Read a YAML or JSON file of option values (keys as field names; dashes allowed)."""
    if not os.path.isfile(path):
        raise SystemExit(f"--config: file not found: {path}")
    with open(path) as fh:
        if path.endswith(".json"):
            data = json.load(fh)
        else:
            data = yaml.safe_load(fh)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SystemExit(f"--config {path}: expected a mapping of option: value, got {type(data).__name__}")
    return {k.replace("-", "_"): v for k, v in data.items()}


def parse_into(cls, ns: argparse.Namespace, config: Optional[dict] = None, skip=()):
    """Build ``cls`` from dataclass defaults < config file < command line (``ns``)."""
    fields = {f.name for f in dataclasses.fields(cls)} - set(skip)
    values = {}
    unknown = sorted(set(config or {}) - fields)
    if unknown:
        raise SystemExit(f"config file: unknown option(s) {unknown}; accepted: {sorted(fields)}")
    values.update(config or {})
    for name in fields:
        if hasattr(ns, name):
            v = getattr(ns, name)
            if isinstance(v, list) and v and isinstance(v[0], list):  # appended comma-lists
                v = [x for part in v for x in part]
            values[name] = v
    for name in ("reward",):
        if isinstance(values.get(name), str):
            values[name] = [s.strip() for s in values[name].split(",") if s.strip()]
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise SystemExit(f"invalid options: {e}")


# ---------------------------------------------------------------------- subcommands
def cmd_train(ns) -> int:
    args = parse_into(TrainingArguments, ns, _config(ns))
    trainer = Trainer(args)
    summary = trainer.train()
    if trainer.dist.is_main:  # under torchrun, one report
        _print_summary(summary, args.output_dir)
    return 0


def _print_summary(summary: dict, output_dir) -> None:
    metric = summary["metric_for_best"]
    before = summary["initial_validation"].get(metric)
    best = (summary["validation"] or {}).get(metric)
    test = (summary["test"] or {}).get(metric)
    print(f"validation {metric}: {before:.4f} -> {best:.4f} (best step {summary['best_step']} of {summary['steps']}); "
          f"test {metric}: {test if test is None else round(test, 4)}; {summary['wall_time_s']:.0f} s; "
          f"results in {output_dir}")


def cmd_eval(ns) -> int:
    args = parse_into(EvalRunArguments, ns)
    if args.run_dir:
        lm, run_args, step = load_run(args.run_dir, args.step)
        task_name = args.task or run_args.task
        info = {"run_dir": args.run_dir, "step": step}
    else:
        lm = load_model(args.model, dtype=args.dtype)
        task_name = args.task or "sst2"
        info = {"model": args.model}
    task = get_task(task_name)
    examples = task.load_split(args.split, data_dir=args.data_dir, n=args.n, seed=args.seed)
    metrics = evaluate(lm, task, examples, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens)
    print(json.dumps({**info, "task": task_name, "split": args.split, "n": len(examples),
                      "metrics": {k: float(v) for k, v in metrics.items()}}, indent=2))
    return 0


def cmd_export(ns) -> int:
    lm, args, step = load_run(ns.run_dir, parse_step(ns.step))
    merged = ns.merged if ns.merged is not None else args.peft == "lora"
    save_model(lm, args.peft, ns.output, merged=merged)
    print(f"wrote {ns.output} ({args.model} + {step} MeZO steps from {ns.run_dir}"
          + (f", {args.peft} {'merged' if merged else 'adapter'}" if args.peft in PEFT_METHODS else "") + ")")
    return 0


def cmd_compare(ns) -> int:
    if ns.runs:
        names = [os.path.basename(os.path.normpath(r)) for r in ns.runs]
        paths = write_report(dict(zip(names, ns.runs)), ns.report_dir or ".")
    else:
        base = parse_into(TrainingArguments, ns, _config(ns))
        variants = {}
        if ns.objective:
            variants.update(objective_variants(base, [o for part in ns.objective for o in part]))
        for path in ns.variant or []:
            name = os.path.splitext(os.path.basename(path))[0]
            overrides = load_config_file(path)
            unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(TrainingArguments)})
            if unknown:
                raise SystemExit(f"--variant {path}: unknown option(s) {unknown}; use `mezo-rl train` option names")
            try:
                variants[name] = dataclasses.replace(base, **overrides, resume=False)
            except (TypeError, ValueError) as e:
                raise SystemExit(f"--variant {path}: {e}")
        if len(variants) < 2:
            raise SystemExit("compare: give at least two variants (--objective cross_entropy --objective accuracy, "
                             "and/or --variant a.yaml --variant b.yaml), or --runs DIR DIR to report finished runs")
        compare(variants, base.output_dir)
        paths = {k: os.path.join(base.output_dir, n) for k, n in
                 (("table", "comparison.md"), ("validation_vs_steps.png", "validation_vs_steps.png"),
                  ("validation_vs_time.png", "validation_vs_time.png"))}
    print(open(paths["table"]).read())
    print("plots:", paths["validation_vs_steps.png"], paths["validation_vs_time.png"])
    return 0


def cmd_baseline(ns) -> int:
    args = parse_into(BaselineArguments, ns, _config(ns))
    print(json.dumps(run_baseline(args), indent=2))
    return 0


def cmd_tasks(ns) -> int:
    for name in list_tasks():
        task = get_task(name)
        doc = (getattr(task, "description", None) or (type(task).__doc__ or "")).strip().splitlines()
        print(f"{name:12s} {task.kind:16s} {doc[0] if doc else ''}")
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
    parser = argparse.ArgumentParser(prog="mezo-rl", description="Fine-tune language models on any objective with MeZO "
                                     "(Malladi et al., 2023): forward passes only, inference memory.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fmt = argparse.ArgumentDefaultsHelpFormatter

    p = sub.add_parser("train", help="fine-tune with MeZO", description=TrainingArguments.__doc__)
    p.add_argument("--config", help="YAML/JSON file of option values (command-line options win)")
    add_dataclass_arguments(p, TrainingArguments)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="evaluate a model or a run on a task split (prints JSON)",
                       description=EvalRunArguments.__doc__)
    add_dataclass_arguments(p, EvalRunArguments)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("export", help="base model + trajectory -> save_pretrained directory", formatter_class=fmt)
    p.add_argument("--run-dir", required=True, help="a `mezo-rl train` output directory")
    p.add_argument("--output", required=True, help="directory to write (save_pretrained layout)")
    p.add_argument("--step", default="best", help="best, final or a step number")
    p.add_argument("--merged", action=argparse.BooleanOptionalAction, default=None,
                   help="PEFT runs: --merged folds a LoRA adapter into the weights (a plain model), --no-merged "
                   "writes the adapter only (default: merged for LoRA; a prefix is always exported as an adapter)")
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
    add_dataclass_arguments(p, TrainingArguments, skip=("reward", "reward_weights", "resume"))
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("baseline", help="zero-shot / ICL / linear probing / Adam fine-tuning",
                       description=BaselineArguments.__doc__)
    p.add_argument("--config", help="YAML/JSON file of option values")
    add_dataclass_arguments(p, BaselineArguments)
    p.set_defaults(func=cmd_baseline)

    p = sub.add_parser("tasks", help="list the tasks")
    p.set_defaults(func=cmd_tasks)
    p = sub.add_parser("rewards", help="list the rewards")
    p.set_defaults(func=cmd_rewards)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    return ns.func(ns)


if __name__ == "__main__":
    sys.exit(main())
