"""The training loop: the periodic jobs when due, one step, a log line now and then, a clean stop."""

import logging
import math
import signal
import time
from dataclasses import dataclass, field
from functools import partial

import yaml

from model_io.run_files import LAST
from training.build import Run
from training.data_parallel import memory_line
from training.interrupt import StopSignals
from training.jobs import AttentionMaps, Evaluation, Samples
from training.lr_schedule import lr_at
from training.progress import ProgressBar
from training.saving import Checkpoints, KeptCheckpoints, Saver
from training.state import TrainState
from training.step import StepResult, TrainStep
from training.tensorboard_log import RunLogger

log = logging.getLogger("train")


@dataclass
class Figures:
    """What a run measured, for the caller (train.py's last lines, bench/, tests)."""
    best_val_loss: float
    evaluations: list[dict[str, float]]  # {"step", "train", "val"}, in order ("train" only with eval_train)
    tokens_per_sec: list[float] = field(default_factory=list)  # one per logged window
    skipped: int = 0


def fit(run: Run, state: TrainState) -> Figures:
    """Train from state.step to train.max_steps. Ctrl-C or kill: save and exit 128 + signal."""
    loop, optim, ranks = run.spec.loop, run.spec.optim, run.ranks
    max_steps = loop.max_steps
    tb = open_tensorboard(run, state.step)
    saver = Saver(run)
    evaluation = Evaluation(run, tb)
    jobs = [evaluation, AttentionMaps(run, tb, fresh=state.step == 0), Samples(run, tb),
            KeptCheckpoints(run, evaluation, saver, state), Checkpoints(evaluation, saver, loop.save_interval)]
    train_step = TrainStep.of(run)
    schedule = partial(lr_at, lr=optim.lr, min_lr=optim.min_lr, warmup_steps=optim.warmup_steps,
                       max_steps=max_steps, schedule=optim.schedule, decay_fraction=optim.decay_fraction)
    step_log = StepLog(tb, loop.log_interval, max_steps, train_step.tokens_per_step)
    first_step = state.step
    with StopSignals() as stop, ProgressBar(max_steps, state.step, wanted=ranks.is_main) as bar:
        while True:
            last = state.step >= max_steps
            if not state.evaluated:  # (a resumed run's first step had its jobs before it was saved)
                for job in jobs:
                    if job.due(state.step, last):
                        job(state)
                tb.flush()
            state.evaluated = False
            if last:
                break

            started = time.perf_counter()
            lr = schedule(state.step)
            result = train_step(state.step, lr, run.batch_rng)
            state.step += 1
            if math.isfinite(result.loss):  # (an fp16 overflow's loss is a true one: only its gradient overflowed)
                state.add_to_window(result.loss)
            if not result.updated:  # fp16's overflow, or train.skip_nonfinite: this batch changed nothing
                state.skipped += 1
                tb.scalars(state.step, {"train/skipped_nonfinite": state.skipped})
            tokens_per_sec = step_log.record(state, result, lr, time.perf_counter() - started)
            if ranks.distributed and state.step == first_step + 1:  # the optimizer's state exists from now on
                log.info(memory_line(run.model, run.optimizer, ranks))
            bar.update(state.step, result.loss, tokens_per_sec)

            # Ctrl-C or kill: the step is done; save it and say how to go on. Under torchrun the
            # ranks agree first, so that all of them stop after the same step.
            stop_signal = int(ranks.max(stop.requested or 0))
            if stop_signal and state.step < max_steps:
                saver.save(LAST, state, evaluated=False)
                tb.close()
                log.info(f"stopped by {signal.Signals(stop_signal).name} after step {state.step}; saved "
                         f"{run.shown_dir}/{LAST}. Resume with: .venv/bin/python train.py resume={run.shown_dir}")
                raise SystemExit(128 + stop_signal)
    tb.hparams(hyperparameters(saver.config, ranks.world_size), {"hparams/best_val_loss": state.best_val_loss})
    tb.close()
    return Figures(state.best_val_loss, evaluation.history, step_log.history, state.skipped)


def open_tensorboard(run: Run, step: int) -> RunLogger:
    """Rank 0's event writer, for a run starting at step. It hides what an earlier attempt in the
    run dir logged after the checkpoint's step (all before it was logged before the save; a new
    run hides all of it), so that no step appears twice."""
    tb = RunLogger(run.dir if run.ranks.is_main else None, purge_step=step + 1 if step else 0)
    if not step:
        tb.text("config", yaml.safe_dump(run.config, sort_keys=False), 0)
    return tb


class StepLog:
    """The mean train loss, lr, grad norm and tokens/s of each window of log_interval steps
    (and of the last step's window), to TensorBoard and the log."""

    def __init__(self, tb: RunLogger, log_interval: int, max_steps: int, tokens_per_step: int) -> None:
        self.tb, self.log_interval, self.max_steps, self.tokens_per_step = tb, log_interval, max_steps, tokens_per_step
        self.timed_steps, self.seconds = 0, 0.0
        self.history: list[float] = []  # tokens/s of each logged window

    def record(self, state: TrainState, result: StepResult, lr: float, seconds: float) -> float:
        """Adds one step that took seconds; returns the tokens/s of the window so far."""
        self.timed_steps += 1
        self.seconds += seconds
        tokens_per_sec = self.timed_steps * self.tokens_per_step / self.seconds
        if (state.step % self.log_interval == 0 or state.step == self.max_steps) and state.window_steps:
            mean_loss = state.take_window()
            self.tb.scalars(state.step, {"train/batch_loss": mean_loss, "train/lr": lr, "train/grad_norm": result.grad_norm,
                                         "train/tokens_per_sec": tokens_per_sec})
            if result.loss_scale is not None:
                self.tb.scalars(state.step, {"train/loss_scale": result.loss_scale})
            log.info(f"step {state.step}/{self.max_steps} | loss {mean_loss:.4f} | lr {lr:.2e} | "
                     f"grad norm {result.grad_norm:.2f} | {tokens_per_sec:,.0f} tok/s", extra={"progress": True})
            self.history.append(tokens_per_sec)
            self.timed_steps, self.seconds = 0, 0.0
        return tokens_per_sec


def hyperparameters(config: dict, world_size: int) -> dict[str, int | float | str | bool]:
    """The settings a sweep compares, flattened ("model.n_head": 4, ...), for the HParams tab."""
    flat = {f"{group}.{key}": value for group in ("model", "optim", "train") for key, value in config[group].items()
            if isinstance(value, (int, float, str, bool))}
    return {**flat, "data.source": config["data"]["source"], "tokenizer.kind": config["tokenizer"]["kind"],
            "processes": world_size}
