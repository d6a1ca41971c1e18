"""What the loop saves and when: the run for an exact resume (last and best, after each evaluation
and every save_interval steps), and the model alone at the steps of train.keep_checkpoints."""

import logging
import os
from pathlib import Path
from typing import Any

import torch

from model_io.checkpoint import Checkpoint
from model_io.run_files import BEST, KEPT, LAST, LOG_SPACED, kept_checkpoint_path, kept_checkpoints
from training.build import Run
from training.jobs import Evaluation, Every
from training.state import RunState, TrainState, capture_rng_states

log = logging.getLogger("train")


class Saver:
    """Saves the run as it is now, for an exact resume, or the model alone. Every rank must call
    save() and save_model() (each rank hands over its RNG states, and under FSDP its shard);
    rank 0 writes the file."""

    def __init__(self, run: Run) -> None:
        self.run, self.config = run, run.config

    def save(self, name: str, state: TrainState, evaluated: bool) -> None:
        run = self.run
        rng_states = run.ranks.gather(capture_rng_states(run.batch_rng))
        weights, optimizer = run.parallel.model_state(), run.parallel.optimizer_state(run.optimizer)  # FSDP: gathered to rank 0
        if not run.ranks.is_main:
            return  # one copy of the model is enough
        run_state = RunState.of(state, rng_states, run.ranks.world_size, run.precision.scaler.state_dict(), evaluated,
                                run.data.text_key)
        self.write(run.dir / name, weights, state.step, state.best_val_loss, optimizer, run_state.to_dict())

    def save_model(self, path: Path, step: int, best_val_loss: float) -> None:
        """The weights, config and tokenizer alone (no optimizer, no RNG states): a model to load, not a run to resume."""
        weights = self.run.parallel.model_state()  # FSDP: gathered to rank 0
        if not self.run.ranks.is_main:
            return
        path.parent.mkdir(exist_ok=True)
        self.write(path, weights, step, best_val_loss)

    def write(self, path: Path, weights: dict[str, torch.Tensor], step: int, best_val_loss: float,
              optimizer: dict | None = None, run_state: dict | None = None) -> None:
        Checkpoint(
            model=weights, config=self.config, tokenizer=self.run.data.tokenizer.state(), step=step,
            best_val_loss=best_val_loss, optimizer=optimizer, run_state=run_state,
        ).save(path)


class Checkpoints:
    """After each evaluation but the one before training: keeps the last model, and the best
    one when its val loss is the lowest yet (every rank has the same losses: they are summed).
    Also keeps the last model every save_interval steps between evaluations (0: never). It is
    the last job of a step, so a run resumed from one of its saves skips that step's jobs: they
    ran before the save."""

    def __init__(self, evaluation: Evaluation, saver: Saver, save_interval: int) -> None:
        self.evaluation, self.saver = evaluation, saver
        self.between_evaluations = Every(save_interval, at_start=False)

    def due(self, step: int, last: bool) -> bool:
        # Step 0 is saved only when it is also the last (train.max_steps=0: weights as they came).
        return (step > 0 or last) and (self.evaluation.due(step, last) or self.between_evaluations(step, last))

    def __call__(self, state: TrainState) -> None:
        if self.evaluation.val_loss_at(state.step) < state.best_val_loss:
            state.best_val_loss = self.evaluation.val_loss_at(state.step)
            self.saver.save(BEST, state, evaluated=True)
        self.saver.save(LAST, state, evaluated=True)


class KeptCheckpoints:
    """The model alone at each step of train.keep_checkpoints (step 0: before any update), in the
    run dir's checkpoints/, to look back at how it learnt (the Attention tab's slider). It draws
    no random number and evaluates nothing: the run computes what it would without. It comes
    before Checkpoints, so that a run resumed from a save at a kept step has kept it already.
    Due on every rank: under FSDP every rank hands over its shard."""

    def __init__(self, run: Run, evaluation: Evaluation, saver: Saver, state: TrainState) -> None:
        self.dir, self.evaluation, self.saver = run.dir, evaluation, saver
        keep, max_steps = run.spec.loop.keep_checkpoints, run.spec.loop.max_steps
        self.steps = kept_steps(keep, max_steps)
        if not keep:
            return
        # A resumed run starts after the steps before its own, and after its own one too where the
        # jobs of that step ran before the save (state.evaluated); a file it kept then stays.
        passed = [step for step in self.steps if step < state.step or (step == state.step and state.evaluated)]
        missed = [step for step in passed if step not in kept_checkpoints(run.dir)]
        beyond = [] if keep == LOG_SPACED else sorted({step for step in keep if step > max_steps})
        log.info(keeping_line([step for step in self.steps if step not in missed], os.path.join(run.shown_dir, KEPT),
                              model_only_bytes(run), beyond, max_steps, missed, state.step))

    def due(self, step: int, last: bool) -> bool:
        return step in self.steps

    def __call__(self, state: TrainState) -> None:
        best_val_loss = min(state.best_val_loss, self.evaluation.val_loss_at(state.step))  # with this step's evaluation
        self.saver.save_model(kept_checkpoint_path(self.dir, state.step), state.step, best_val_loss)


def kept_steps(keep: Any, max_steps: int) -> list[int]:
    """The steps train.keep_checkpoints keeps, in order, up to max_steps: those of a list (cli/config.py
    has checked it), or for "log" step 0, every power of two up to max_steps, and max_steps."""
    if keep == LOG_SPACED:
        return sorted({0, *(2**i for i in range(max_steps.bit_length())), max_steps})
    return sorted({step for step in keep or [] if step <= max_steps})


def keeping_line(steps: list[int], folder: str, per_file: int, beyond: list[int], max_steps: int,
                 missed: list[int], start_step: int) -> str:
    """'keeping model-only checkpoints at 13 steps (0, 1, 2, 4, ..., 2000) in <folder>: about 13 x 3.8 MB
    = 49 MB', and the listed steps the run will not keep."""
    n = len(steps)
    said = (f"keeping model-only checkpoints at {n} step{'s' if n != 1 else ''} ({steps_text(steps)}) in {folder}: "
            f"about {n} x {size_text(per_file)} = {size_text(n * per_file)}") if steps else "keeping no model-only checkpoints"
    if beyond:
        said += f"; {steps_text(beyond)} {'are' if len(beyond) > 1 else 'is'} past train.max_steps={max_steps}, not reached"
    if missed:
        said += f"; {steps_text(missed)} {'come' if len(missed) > 1 else 'comes'} before this run resumes at step {start_step}, not kept"
    return said


def steps_text(steps: list[int]) -> str:
    """'0, 50, 100' or, for more than 6 steps, '0, 1, 2, 4, ..., 2000'."""
    shown = [*steps[:4], "...", steps[-1]] if len(steps) > 6 else steps
    return ", ".join(str(step) for step in shown)


def model_only_bytes(run: Run) -> int:
    """About what a model-only checkpoint takes on disk: every distinct weight (the tied head once, as
    torch.save stores it) and the tokenizer."""
    weights = sum(p.numel() * p.element_size() for p in run.model.parameters())  # FSDP's shards count whole
    return weights + len(repr(run.data.tokenizer.state()))


def size_text(n_bytes: float) -> str:
    """'110 kB', '3.8 MB', '49 MB'."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= size:
            value = n_bytes / size
            return f"{value:.1f} {unit}" if value < 10 else f"{value:,.0f} {unit}"
    return f"{n_bytes:.0f} B"
