"""What the loop does every so many steps, besides training: each job says when it is due."""

import logging
import math
import os
from pathlib import Path
from typing import Any

import torch

from data.batches import probe_ids
from inspection.ablation import induction_loss_without_each_head, recall_without_each_head
from inspection.head_metrics import head_metrics, induction_probe, induction_score
from inspection.recall_probe import RecallProbe
from model.generation import EOT_SHOWN, generate_text
from model_io.checkpoint import Checkpoint
from model_io.run_files import BEST, KEPT, LAST, LOG_SPACED, kept_checkpoint_path, kept_checkpoints
from training.build import Run
from training.evaluation import evaluate
from training.state import RunState, TrainState, capture_rng_states
from training.tensorboard_log import RunLogger

log = logging.getLogger("train")

# The recall probe reads at most 96 windows, and at most this many tokens of held-out stories
# (96 windows of the default 128; 12 of GPT-2's 1,024), and
# the ablations, a probe's forward per knocked-out head, run for models of at most this many heads:
# at GPT-2 small's 144 heads of 1,024 tokens they would take hours on a CPU at every attention step.
RECALL_PROBE_WINDOWS, RECALL_PROBE_TOKENS = 96, 96 * 128
ABLATION_MAX_HEADS = 64
INDUCTION_ROWS = 8  # repeated random sequences whose second copies the induction ablation scores


class Every:
    """Due every interval steps and at the last step; interval 0: never. at_start=False
    leaves out step 0."""

    def __init__(self, interval: int, at_start: bool = True) -> None:
        self.interval, self.at_start = interval, at_start

    def __call__(self, step: int, last: bool) -> bool:
        if not self.interval:
            return False
        return (step % self.interval == 0 and (step > 0 or self.at_start)) or last


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
        run_state = RunState.of(state, rng_states, run.ranks.world_size, run.precision.scaler.state_dict(), evaluated)
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


class Evaluation:
    """Train and val loss (val alone with train.eval_train=false) and the in-context score, to
    TensorBoard; the losses to the log."""

    def __init__(self, run: Run, tb: RunLogger) -> None:
        self.run, self.tb = run, tb
        self.due = Every(run.cfg.train.eval_interval, at_start=run.cfg.train.eval_at_start)
        self.history: list[dict[str, float]] = []  # {"step", "train", "val"} of every evaluation ("train" only with eval_train)

    def __call__(self, state: TrainState) -> None:
        run, train = self.run, self.run.cfg.train
        splits = ("train", "val") if train.eval_train else ("val",)
        evaluated = evaluate(run.eval_model, run.data, train.batch_size, run.cfg.model.block_size, train.eval_iters,
                             run.ranks, run.precision, train.seed, splits, lockstep=run.parallel.collective_forwards)
        losses = evaluated.losses
        self.tb.scalars(state.step, {f"loss/{split}": loss for split, loss in losses.items()})
        if evaluated.in_context is not None:
            self.tb.scalars(state.step, {"loss/in_context": evaluated.in_context})
        log.info(f"step {state.step}: " + ", ".join(f"{split} loss {loss:.4f}" for split, loss in losses.items()))
        self.history.append({"step": state.step, **losses})

    def val_loss_at(self, step: int) -> float:
        """The val loss of this step's evaluation; inf where it had none."""
        return self.history[-1]["val"] if self.history and self.history[-1]["step"] == step else math.inf


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
        keep, max_steps = run.cfg.train.keep_checkpoints, run.cfg.train.max_steps
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


class AttentionMaps:
    """Rank 0: the probe text's attention maps, drawn from the weights the model uses right now,
    and what each head does in numbers (on the probe, the induction probe and the recall probe),
    and with each head knocked out alone: the recall probe's name recall, and the loss on the
    second copy of repeated random tokens. Due on every rank: under FSDP every rank gathers the
    whole model for it."""

    def __init__(self, run: Run, tb: RunLogger, fresh: bool) -> None:
        cfg, tokenizer, device = run.cfg, run.data.tokenizer, run.ranks.device
        self.model, self.tb, self.parallel, self.is_main = run.model, tb, run.parallel, run.ranks.is_main
        self.due = Every(cfg.train.attn_log_interval)
        n_probe = min(cfg.train.probe_tokens, cfg.model.block_size)
        probe = probe_ids(run.data.val, tokenizer, n_probe)
        self.probe = torch.tensor([probe], device=device)  # (1, T_probe)
        self.labels = tokenizer.token_strings(probe)
        if fresh:
            tb.probe_tokens(self.labels)
        # Random tokens, repeated once (see inspection/head_metrics.py): the first row's attention
        # gives the induction scores, all rows the loss on the second copy that the ablation reads.
        n_induction = n_probe // 2
        self.repeated = torch.tensor(
            [induction_probe(tokenizer.vocab_size, n_induction, cfg.train.seed + i, avoid=tokenizer.eot_id)
             for i in range(INDUCTION_ROWS)], device=device,
        ) if n_induction >= 2 else None  # (INDUCTION_ROWS, 2n)
        self.induction = self.repeated[:1] if self.repeated is not None else None  # (1, 2n)
        # Held-out stories (another seed), where names and items come back.
        max_windows = min(RECALL_PROBE_WINDOWS, max(1, RECALL_PROBE_TOKENS // cfg.model.block_size))
        self.recall = (RecallProbe.build(tokenizer, cfg.model.block_size, seed=cfg.data.seed + 1, max_windows=max_windows)
                       if self.due.interval and cfg.data.source == "stories" and self.is_main else None)
        if self.recall is not None and not self.recall.targets:
            self.recall = None  # block_size too short for a name to come back inside one window
        n_heads = cfg.model.n_layer * cfg.model.n_head
        self.ablate = n_heads <= ABLATION_MAX_HEADS
        if not self.ablate and fresh and self.due.interval:
            log.info(f"note: no ablation/... scalars: this model has {n_heads} heads, and knocking each out alone "
                     f"costs a probe's forward per head (they run for at most {ABLATION_MAX_HEADS} heads)")

    def __call__(self, state: TrainState) -> None:
        with self.parallel.whole_model():
            if self.is_main:
                self.draw(state)

    def draw(self, state: TrainState) -> None:
        weights = self.model.attention_weights(self.probe)[:, 0]  # (L, H, T, T)
        self.tb.attention_maps(state.step, weights, self.labels)
        self.tb.head_grid(state.step, weights)
        self.tb.attention_weights(state.step, weights, self.labels)
        metrics = head_metrics(weights)
        if self.induction is not None:
            induction_weights = self.model.attention_weights(self.induction)[:, 0]  # (L, H, 2n, 2n)
            metrics["induction"] = induction_score(induction_weights, self.induction.shape[1] // 2)
        self.tb.head_metrics(state.step, metrics)
        if self.repeated is not None and self.ablate:
            self.tb.induction_ablation(state.step, induction_loss_without_each_head(self.model, self.repeated))
        if self.recall is not None:
            scores = self.recall.evaluate(self.model)
            self.tb.recall(state.step, scores)
            if "name" in scores.accuracy_by_kind and self.ablate:
                self.tb.ablation(state.step, recall_without_each_head(self.model, self.recall, "name"))


class Samples:
    """Rank 0: a generated sample, to read how the model writes. Due on every rank: under FSDP
    every rank gathers the whole model for it."""

    def __init__(self, run: Run, tb: RunLogger) -> None:
        self.run, self.tb = run, tb
        self.due = Every(run.cfg.train.sample_interval)

    def __call__(self, state: TrainState) -> None:
        with self.run.parallel.whole_model():
            if self.run.ranks.is_main:
                self.write(state)

    def write(self, state: TrainState) -> None:
        train = self.run.cfg.train
        try:
            sample = generate_text(self.run.model, self.run.data.tokenizer, "", train.sample_tokens,
                                   temperature=train.sample_temperature, seed=train.seed, eot_text=EOT_SHOWN)[0]
        except FloatingPointError as error:  # only after train.skip_nonfinite let NaN in
            sample = f"(no sample: {error})"
        self.tb.text("samples", sample, state.step)
        log.info(f"sample at step {state.step}:\n{sample}\n")
