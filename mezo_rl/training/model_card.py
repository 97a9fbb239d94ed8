"""The model card (``README.md``) written beside saved weights, with Hugging Face Hub metadata, and pushing
the directory to the Hub.

``mezo-rl export`` and :meth:`~mezo_rl.training.trainer.MeZOTrainer.save_model` write it, as TRL's trainers
do on every save. Its YAML header carries ``base_model`` (the hub id of the model the run started from),
``library_name: mezo-rl``, ``tags`` (``mezo-rl``, ``zeroth-order``, the PEFT mode) and ``datasets`` (where
the task is a hub dataset); the body the rewards and their weights, each metric before -> after with
its number of examples, the best step, the command that repeats the run from its ``training_args.json``, and
the citation of the MeZO paper.

:func:`push_to_hub` uploads a saved directory through ``huggingface_hub``; offline (``HF_HUB_OFFLINE=1``,
or no network) it fails with one line saying so, and everything stays on disk.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
from typing import Optional

from mezo_rl.choices import HUB_STRATEGIES
from mezo_rl.errors import UserError
from mezo_rl.model.loading import SHORT_NAMES

__all__ = ["MODEL_CARD_FILE", "LIBRARY_NAME", "TAGS", "CITATION", "base_model_id", "model_card", "write_model_card",
           "read_card_metadata", "push_to_hub", "check_hub", "HubPushError", "HUB_STRATEGIES"]

#: what ``hub_strategy`` accepts, as transformers reads it: ``end`` (one upload, when training ends),
#: ``every_save`` (also the weights at each save), ``checkpoint`` (also the checkpoint, as last-checkpoint/)

MODEL_CARD_FILE = "README.md"
LIBRARY_NAME = "mezo-rl"
TAGS = ("mezo-rl", "zeroth-order")
CITATION = """@inproceedings{malladi2023mezo,
    title     = {Fine-Tuning Language Models with Just Forward Passes},
    author    = {Malladi, Sadhika and Gao, Tianyu and Nichani, Eshaan and Damian, Alex and Lee, Jason D. and
                 Chen, Danqi and Arora, Sanjeev},
    booktitle = {Advances in Neural Information Processing Systems},
    year      = {2023},
    url       = {https://arxiv.org/abs/2305.17333}
}"""
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class HubPushError(UserError, RuntimeError):
    """The directory could not be pushed to the Hub (offline, not logged in, refused); it stays on disk."""


def base_model_id(model: str) -> Optional[str]:
    """The hub id of a run's base model: a short name's model, a hub id itself, or None (a local path or file)."""
    if model in SHORT_NAMES:
        return SHORT_NAMES[model][2]
    return model if _HUB_ID.match(model or "") and not pathlib.Path(model).exists() else None


def _yaml_list(key: str, values) -> list[str]:
    return [f"{key}:"] + [f"- {json.dumps(str(v))}" for v in values] if values else []


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _results(summary: dict) -> list[str]:
    """before -> after for every metric of validation (best step) and test, with n."""
    rows = []
    for split, before_key, after_key in (("validation", "initial_validation", "validation"),
                                         ("test", "initial_test", "test")):
        before, after = summary.get(before_key) or {}, summary.get(after_key) or {}
        for metric in after:
            if metric == "n" or metric.endswith("/se"):
                continue
            rows.append(f"| {split} | {metric} | {_fmt(before.get(metric))} | {_fmt(after.get(metric))} | "
                        f"{_fmt(int(after['n'])) if after.get('n') is not None else '-'} |")
    if not rows:
        return []
    return ["| split | metric | before | after | n |", "|---|---|---|---|---|", *rows]


def model_card(config: dict, summary: Optional[dict] = None, step: Optional[int] = None,
               name: Optional[str] = None) -> str:
    """The card of a run whose ``training_args.json`` is ``config`` and ``summary.json`` is ``summary`` (None: still
    training), for the weights after ``step`` steps."""
    base = base_model_id(str(config.get("model", "")))
    task = str(config.get("task", ""))
    dataset = task if _HUB_ID.match(task) and not pathlib.Path(task).exists() else None
    peft = config.get("peft")
    tags = [*TAGS, *([f"peft-{peft}"] if peft and peft != "full" else [])]
    header = ["---", *([f"base_model: {base}"] if base else []), f"library_name: {LIBRARY_NAME}",
              *_yaml_list("tags", tags), *_yaml_list("datasets", [dataset] if dataset else []), "---"]
    rewards, weights = list(config.get("reward") or []), config.get("reward_weights")
    weights = weights or [1.0] * len(rewards)
    title = name or (f"{base.split('/')[-1]} fine-tuned with MeZO" if base else "A model fine-tuned with MeZO")
    body = [f"# {title}", "",
            f"Fine-tuned from {f'[{base}](https://huggingface.co/{base})' if base else repr(config.get('model'))} "
            f"with [mezo-rl](https://arxiv.org/abs/2305.17333) (MeZO: zeroth-order SGD, forward passes only), "
            f"training {peft!r} weights on task {task!r}"
            + (f"; these are the weights after {step} MeZO steps" if step is not None else "") + ".", "",
            "## Rewards", "", *[f"- `{r}` (weight {w:g})" for r, w in zip(rewards, weights)], ""]
    if summary:
        best = summary.get("best_step")
        body += ["## Results", "",
                 f"Before training and at the best validation step ({best} of {summary.get('steps')}; the metric "
                 f"that picks it: `{summary.get('metric_for_best')}`); n is the number of examples.", "",
                 *_results(summary), ""]
    settings = {k: config[k] for k in ("max_steps", "per_device_train_batch_size", "learning_rate", "eps",
                                       "n_spsa", "noise", "estimator", "seed") if k in config}
    body += ["## Training", "", "| option | value |", "|---|---|",
             *[f"| `{k}` | `{v}` |" for k, v in settings.items()], "",
             "Repeat the run from its configuration (every option, resolved):", "",
             "```bash", "mezo-rl train --config training_args.json", "```", "",
             "<details><summary>training_args.json</summary>", "", "```json", json.dumps(config, indent=2, sort_keys=True),
             "```", "", "</details>", "",
             "## Citation", "", "```bibtex", CITATION, "```", ""]
    return "\n".join(header + [""] + body)


def write_model_card(out_dir, config: dict, summary: Optional[dict] = None, step: Optional[int] = None) -> pathlib.Path:
    """Write ``out_dir/README.md`` and the run's configuration as ``training_args.json`` (the file a run directory
    keeps it in), which the card's command repeats."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / MODEL_CARD_FILE
    path.write_text(model_card(config, summary, step))
    (out / "training_args.json").write_text(json.dumps({**config, "resume": False}, indent=2, sort_keys=True) + "\n")
    return path


def read_card_metadata(path) -> dict:
    """The YAML header of a model card as a dict (``huggingface_hub.ModelCard`` reads the same)."""
    import yaml

    text = pathlib.Path(path).read_text()
    if not text.startswith("---\n"):
        return {}
    return yaml.safe_load(text[4:text.index("\n---", 4)]) or {}


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def check_hub(repo_id: str, *, private: Optional[bool] = None, token: Optional[str] = None) -> str:
    """What ``push_to_hub=True`` needs, checked before a run's first step as transformers' Trainer checks it when it
    starts: a valid repository id, the Hub reachable (not ``HF_HUB_OFFLINE``), a token that it accepts, and the
    repository (created if missing, as transformers does). Returns the full repository id (``user/name``); any
    failure is one :class:`HubPushError` line."""
    try:
        from huggingface_hub import HfApi, get_token
        from huggingface_hub.utils import validate_repo_id
    except ImportError:
        raise HubPushError("push_to_hub needs huggingface_hub: pip install huggingface_hub") from None
    try:
        validate_repo_id(repo_id)
    except ValueError as e:
        raise HubPushError(f"hub_model_id {repo_id!r} is not a Hub repository id: {str(e).splitlines()[0]}") from None
    if _offline():
        raise HubPushError(f"push_to_hub {repo_id!r}: HF_HUB_OFFLINE is set, so the run could not upload; unset it "
                           f"(and log in), or leave out push_to_hub")
    token = token or get_token()
    if not token:
        raise HubPushError(f"push_to_hub {repo_id!r}: no Hub token; run `hf auth login`, set HF_TOKEN, or give "
                           f"hub_token")
    api = HfApi(token=token)
    try:
        user = api.whoami()["name"]
        full = repo_id if "/" in repo_id else f"{user}/{repo_id}"
        api.create_repo(full, private=private, exist_ok=True)
    except Exception as e:  # noqa: BLE001 - network, auth and Hub errors all come back as one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise HubPushError(f"push_to_hub {repo_id!r}: the Hub cannot be reached or refuses this token "
                           f"({type(e).__name__}: {first}); fix that, or leave out push_to_hub") from None
    return full


def push_to_hub(out_dir, repo_id: str, *, private: Optional[bool] = None, token: Optional[str] = None,
                path_in_repo: Optional[str] = None) -> str:
    """Upload the saved directory ``out_dir`` (weights, tokenizer, model card) to the Hub repository ``repo_id``
    (into its folder ``path_in_repo``, default its root) through ``huggingface_hub``; returns the commit URL. Offline, or when the Hub refuses, one line
    (:class:`HubPushError`) says why; nothing on disk changes."""
    out = pathlib.Path(out_dir)
    if not out.is_dir():
        raise HubPushError(f"push_to_hub: {str(out)!r} is not a saved model directory; save the model first")
    if _offline():
        raise HubPushError(f"push_to_hub {repo_id!r}: HF_HUB_OFFLINE is set, so nothing was uploaded; the model and "
                           f"its card are in {str(out)!r} (unset HF_HUB_OFFLINE, log in, and push again)")
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise HubPushError("push_to_hub needs huggingface_hub: pip install huggingface_hub") from None
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        info = api.upload_folder(folder_path=str(out), repo_id=repo_id, path_in_repo=path_in_repo,
                                 commit_message="mezo-rl: upload " + ("model" if path_in_repo is None else path_in_repo))
    except Exception as e:  # noqa: BLE001 - network, auth and Hub errors all come back as one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise HubPushError(f"push_to_hub {repo_id!r} failed ({type(e).__name__}: {first}); the model and its card "
                           f"are in {str(out)!r}") from None
    return getattr(info, "commit_url", str(info))
