"""What makes a run resumable bit for bit and its best step restorable: the checkpoint (written at each
validation, at the end, and after Ctrl-C / SIGTERM at the last completed step), the resume from it (the
trajectory replayed), the frozen trunk's cache warmed in a fixed order, and the best step's weights rebuilt by
replay. A part of :class:`mezo_rl.training.trainer.MeZOTrainer` (its methods, on the trainer's attributes)."""
from __future__ import annotations

import dataclasses
import gc
import time

import torch

from mezo_rl import rewards
from mezo_rl.engine.trajectory import STATUS
from mezo_rl.training import rundir
from mezo_rl.training.kl import starting_point
from mezo_rl.training.outputs import autocast, model_outputs
from mezo_rl.training.rundir import TrainerState
from mezo_rl.training.setup import build_model

__all__ = ["Checkpointing"]


class Checkpointing:
    """:class:`~mezo_rl.training.trainer.MeZOTrainer`'s checkpoint, resume, trunk cache and best-step methods."""

    def save_checkpoint(self) -> None:
        """Write checkpoint/ (base identity + trajectory + optimizer + trainer state); main rank only."""
        if self.dist.is_main:
            with self._guard.deferred():
                rundir.save_checkpoint(self.output_dir, self._state_to_save(), rundir.model_identity(self.args, self.lm),
                                       self.optimizer, self.scheduler)

    def _state_to_save(self) -> TrainerState:
        # best_model_checkpoint relative to the run directory: the checkpoint's bytes do not depend on where it is
        best = rundir.CHECKPOINT_DIR if self.state.best_model_checkpoint else None
        return dataclasses.replace(self.state, wall_time_s=self.wall_time(), objective=self.objective.state_dict(),
                                   best_model_checkpoint=best)

    def _save_interrupted(self) -> None:
        """The checkpoint after Ctrl-C / SIGTERM: the state at the last completed step.

        The signal stops a step only inside its loss closure (``InterruptGuard``); the optimizer then
        restores the weights and logs the step as aborted, having drawn its seeds and changed nothing
        else. That step is left out of the checkpoint (its trajectory row, and its seeds from the
        sample counter), so ``--resume`` redoes it with the same seeds: the resumed run is the
        uninterrupted one, bit for bit.
        """
        if not self.dist.is_main or self.optimizer is None:
            return
        trajectory = self.optimizer.trajectory
        extra = len(trajectory) - self.step
        opt_state = self.optimizer.state_dict()
        if extra == 1 and int(trajectory.status[-1]) == STATUS["aborted"]:
            trajectory = trajectory[:self.step]
            opt_state["mezo"]["trajectory"] = trajectory.state_dict()
            opt_state["mezo"]["samples"] -= len(self.optimizer.trajectory.seeds[-1])  # the seeds it drew
        elif extra != 0:
            raise RuntimeError(f"interrupted with {len(trajectory)} trajectory rows at step {self.step}; cannot checkpoint")
        with self._guard.deferred():
            rundir.save_checkpoint(self.output_dir, self._state_to_save(), rundir.model_identity(self.args, self.lm),
                                   self.optimizer, self.scheduler, optimizer_state=opt_state, trajectory=trajectory)

    def _resume(self) -> None:
        """Restore a run from its checkpoint: replay the trajectory, restore optimizer and best step."""
        self.state = self._run_state(rundir.load_checkpoint(self.plan.resumed, self.optimizer, self.scheduler))
        rundir.replay_prefix(self.lm, self.optimizer.trajectory, self.step)
        self.objective.load_state_dict(self.state.objective)
        if self.dist.is_main:
            rundir.truncate_metrics(self.output_dir, self.step)

    def _warm_trunk_cache(self, splits=("train", "validation", "test")) -> None:
        """With the trunk frozen (``--peft norm``), run it over each whole split that will be scored,
        before anything else is (``LanguageModel.enable_trunk_cache``). Every cached value then comes
        from the same batch of sequences in any run, so a resumed run computes bit for bit what an
        uninterrupted one did; the work is what the first steps and evaluations would do anyway."""
        if not self.lm.trunk_cache_active:
            return
        t0 = time.perf_counter()
        eval_scores = any(rewards.get_reward(m).needs == "scores" for m in self.task.metrics)
        with torch.no_grad(), autocast(self.args.autocast, self.lm.device.type), self._guard.interruptible():
            for split in splits:
                examples = self.splits[split]
                if examples and ("scores" in self.objective.needs if split == "train" else eval_scores):
                    model_outputs(self.lm, examples, {"scores"})
        self.seconds["trunk"] += time.perf_counter() - t0

    def _restore_best(self) -> None:
        """Put the best step's weights in ``self.lm`` (replay of the trajectory prefix on a fresh base)."""
        if self.state.best_step == self.step:
            return
        # free the trained model first (the optimizer holds its parameters): never two models at once; the
        # frozen trunk's cached outputs (--peft norm) go on to the rebuilt model, whose trunk is the same
        t0, trunk = time.perf_counter(), self.lm.trunk_cache
        trunk = trunk.values_only() if trunk is not None else None
        self._optimizer = self._scheduler = self.start = None
        self._released = True
        del self.lm
        gc.collect()
        self.lm = build_model(self.args, self.lm_factory() if self.lm_factory is not None else None, self.plan.dtype,
                              max_memory=self.plan.max_memory)
        self.start = starting_point(self.lm, self.plan.reference)
        rundir.replay_prefix(self.lm, self.trajectory, self.state.best_step)
        self.lm.adopt_trunk_cache(trunk)
        self.seconds["load"] += time.perf_counter() - t0
        self._warm_trunk_cache(("test",))  # all that is left to score (nothing, once the cache is adopted)
