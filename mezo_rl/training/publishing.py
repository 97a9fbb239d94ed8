"""What transformers' ``Trainer`` offers to save and publish, on a MeZO run: ``save_model`` (the weights with
their model card), ``push_to_hub`` (as ``hub_strategy`` says, at each save or at the end), ``log_metrics``,
``save_metrics``, ``save_state``. A part of :class:`mezo_rl.training.trainer.MeZOTrainer` (its methods, on the
trainer's attributes); the card and the Hub calls themselves: :mod:`mezo_rl.training.model_card`."""
from __future__ import annotations

import pathlib
from typing import Optional

from mezo_rl import rewards
from mezo_rl.training import rundir
from mezo_rl.training.model_card import push_to_hub, write_model_card
from mezo_rl.training.reporting import metric_key

__all__ = ["Publishing"]


class Publishing:
    """:class:`~mezo_rl.training.trainer.MeZOTrainer`'s saving and publishing methods, transformers' names."""

    def _saved(self) -> None:
        """A save during training: the callbacks' ``on_save``; with ``push_to_hub``, ``hub_strategy`` every_save
        and checkpoint upload the weights (checkpoint: the checkpoint too, as last-checkpoint/), as transformers."""
        self._event("on_save")
        a = self.args
        if a.push_to_hub and a.hub_strategy != "end" and self.dist.is_main:
            push_to_hub(self.save_model(), self.hub_repo or self.hub_repo_id, private=a.hub_private_repo,
                        token=a.hub_token)
            if a.hub_strategy == "checkpoint":
                push_to_hub(self.output_dir / rundir.CHECKPOINT_DIR, self.hub_repo or self.hub_repo_id,
                            private=a.hub_private_repo, token=a.hub_token, path_in_repo="last-checkpoint")

    def save_model(self, output_dir=None, _internal_call: bool = False) -> pathlib.Path:
        """Write the current weights as a ``from_pretrained`` directory (``mezo_rl.training.rundir.save_model``:
        an adapter as the PEFT adapter folder, LoRA folded into the weights with ``args.merge``) with their model card (``README.md`` with Hub metadata:
        :mod:`mezo_rl.training.model_card`; the results once the run has its summary.json), into ``output_dir``
        (default: ``args.output_dir``, as transformers)."""
        out = pathlib.Path(output_dir) if output_dir is not None else self.output_dir
        rundir.save_model(self.lm, self.args.peft, out, merged=self.args.merge and self.args.peft == "lora")
        summary_path = self.output_dir / rundir.SUMMARY_FILE
        summary = rundir.read_json(summary_path) if summary_path.is_file() else None
        write_model_card(out, self.args.to_dict(), summary, step=self.weights_step)
        if self.dist.is_main:
            print(f"mezo-rl: save_model wrote the weights of step {self.weights_step} ({self._weights_of()}) to {out}")
        return out

    @property
    def weights_step(self) -> int:
        """The step whose weights the model holds: the best step's once :meth:`train` ends with
        ``load_best_model_at_end``, else the last step trained."""
        return self.state.best_step if self._best_loaded else self.step

    def _weights_of(self) -> str:
        if self._best_loaded:
            name = metric_key(self.metric_for_best, rewards.trl_names(self.objective.names))
            return f"the best step by eval_{name}, load_best_model_at_end=True"
        if self.step == self.args.max_steps or self.control.should_training_stop:
            return "the final step; load_best_model_at_end=True would write the best step's"
        return "the current step"

    def push_to_hub(self, commit_message: Optional[str] = None, blocking: bool = True, token: Optional[str] = None,
                    revision: Optional[str] = None, **kwargs) -> str:
        """Save the model with its card into ``args.output_dir`` and upload that directory to the Hub
        repository ``args.hub_model_id`` (default: the output directory's name; under the user's namespace once
        checked), as transformers' ``Trainer.push_to_hub``; offline, one line says why and everything stays on disk.
        A run with ``push_to_hub=True`` checks the repository, the token and the network when the trainer is built
        (:func:`mezo_rl.training.model_card.check_hub`), and uploads when training ends (and, by ``hub_strategy``,
        at each save)."""
        a = self.args
        repo_id = self.hub_repo or self.hub_repo_id
        return push_to_hub(self.save_model(), repo_id, private=a.hub_private_repo, token=token or a.hub_token)

    def log_metrics(self, split: str, metrics: dict) -> None:
        """Print ``metrics`` as transformers' ``Trainer.log_metrics`` does (main process only)."""
        if not self.dist.is_main:
            return
        print(f"***** {split} metrics *****")
        shown = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in metrics.items()}
        k_width = max((len(str(k)) for k in shown), default=0)
        v_width = max((len(str(v)) for v in shown.values()), default=0)
        for key in sorted(shown):
            print(f"  {key: <{k_width}} = {shown[key]:>{v_width}}")

    def save_metrics(self, split: str, metrics: dict, combined: bool = True) -> None:
        """Write ``metrics`` to ``OUTPUT_DIR/<split>_results.json`` and, ``combined``, merge them into
        ``all_results.json``, as transformers' ``Trainer.save_metrics`` (main process only)."""
        if not self.dist.is_main:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        rundir.write_json(self.output_dir / f"{split}_results.json", metrics)
        if combined:
            path = self.output_dir / "all_results.json"
            rundir.write_json(path, {**(rundir.read_json(path) if path.is_file() else {}), **metrics})

    def save_state(self) -> None:
        """Write ``trainer.state`` to ``OUTPUT_DIR/trainer_state.json``, as transformers' ``Trainer.save_state``."""
        if self.dist.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self.state.save_to_json(self.output_dir / rundir.STATE_FILE)

    def is_world_process_zero(self) -> bool:
        return self.dist.is_main
