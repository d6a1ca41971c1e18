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
from training.step import QueuedStep, StepResult
from training.tensorboard_log import BATCH_LOSS, TOKENS_PER_SEC, RunLogger
from user_error import command_argument

log = logging.getLogger("train")


@dataclass
class Figures:
    """What a run measured, for the caller (train.py's last lines, bench/, tests)."""
    best_val_loss: float
    evaluations: list[dict[str, float]]  # {"step", "train", "val"}, in order ("train" only with eval_train)
    tokens_per_sec: list[float] = field(default_factory=list)  # one per logged window
    skipped: int = 0
    recall: tuple[int, dict[str, float]] | None = None  # the recall probe's last (step, accuracy by kind); rank 0


def fit(run: Run, state: TrainState) -> Figures:
    """Train from state.step to train.max_steps. Ctrl-C or kill: save and exit 128 + signal."""
    loop, optim, ranks = run.spec.loop, run.spec.optim, run.ranks
    max_steps = loop.max_steps
    tb = open_tensorboard(run, state.step)
    saver = Saver(run)
    evaluation = Evaluation(run, tb)
    maps = AttentionMaps(run, tb, fresh=state.step == 0)
    kept = KeptCheckpoints(run, evaluation, saver, state)
    jobs = [evaluation, maps, Samples(run, tb), kept, Checkpoints(evaluation, saver, loop.save_interval)]
    train_step = run.train_step()
    schedule = partial(lr_at, lr=optim.lr, min_lr=optim.min_lr, warmup_steps=optim.warmup_steps,
                       max_steps=max_steps, schedule=optim.schedule, decay_fraction=optim.decay_fraction)
    with StopSignals() as stop, ProgressBar(max_steps, state.step, wanted=ranks.is_main) as bar:
        book = StepBook(run, state, tb, StepLog(tb, loop.log_interval, max_steps, train_step.tokens_per_step), bar)
        while True:
            last = state.step >= max_steps
            if last or (not state.evaluated and any(job.due(state.step, last) for job in jobs)):
                book.catch_up()  # the jobs see, and save, every step's numbers
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
            queued = train_step(state.step, lr, run.batch_rng)  # on a GPU: queued, still running
            state.step += 1
            book.add(queued, lr, started)  # records the step before this one, whose numbers are in by now

            # Ctrl-C or kill: the step is done; save it and say how to go on. Under torchrun the
            # ranks agree first, so that all of them stop after the same step.
            stop_signal = int(ranks.max(stop.requested or 0))
            if stop_signal and state.step < max_steps:
                book.catch_up()
                if kept.due(state.step, last=False):  # the model at a kept step now; the resumed run, which runs
                    kept(state)                         # this step's jobs, writes it again with their val loss
                saver.save(LAST, state, evaluated=False)
                tb.close()
                resume = command_argument("resume", run.shown_dir)  # a command to paste: a folder may hold a space
                again = (f".venv/bin/python train.py {resume}" if ranks.world_size == 1 else
                         f"the same torchrun command ({ranks.world_size} processes), with {resume}")
                log.info(f"stopped by {signal.Signals(stop_signal).name} after step {state.step}; saved "
                         f"{run.shown_dir}/{LAST}. Resume with: {again}")
                raise SystemExit(128 + stop_signal)
    tb.hparams(hyperparameters(saver.config, ranks.world_size), {"hparams/best_val_loss": state.best_val_loss})
    tb.close()
    return Figures(state.best_val_loss, evaluation.history, book.step_log.history, state.skipped, maps.last_recall)


def open_tensorboard(run: Run, step: int) -> RunLogger:
    """Rank 0's event writer, for a run starting at step. It hides what an earlier attempt in the
    run dir logged after the checkpoint's step (all before it was logged before the save; a new
    run hides all of it), so that no step appears twice."""
    tb = RunLogger(run.dir if run.ranks.is_main else None, purge_step=step + 1 if step else 0)
    if not step:
        tb.text("config", yaml.safe_dump(run.config, sort_keys=False), 0)
    return tb


class StepBook:
    """Records each step's numbers (the train loss window, skipped updates, the log, the progress
    bar) one step late, after the next step is queued: by then a GPU has them. A CPU's step has
    finished when it returns; the same order there keeps one path for both."""

    def __init__(self, run: Run, state: TrainState, tb: RunLogger, step_log: "StepLog", bar: ProgressBar) -> None:
        self.run, self.state, self.tb, self.step_log, self.bar = run, state, tb, step_log, bar
        self.first = state.step + 1  # this process's first update
        # The step not yet recorded: it, its lr, when it started, and when it finished if known.
        self.waiting: tuple[QueuedStep, float, float, float | None] | None = None
        self.last_end = 0.0  # when the step recorded last finished (or its numbers were read)

    def add(self, queued: QueuedStep, lr: float, started: float) -> None:
        """Records the step waiting, if any; then queued, begun at time started, waits."""
        finished = time.perf_counter() if queued.done else None  # (a step still running ends when its numbers are read)
        self.catch_up()
        self.waiting = queued, lr, started, finished

    def catch_up(self) -> None:
        """Records the step waiting: its numbers (UserError if one is not finite and the run stops on it)."""
        if self.waiting is None:
            return
        (queued, lr, started, finished), self.waiting = self.waiting, None
        result = queued.result()
        end = finished or time.perf_counter()
        # A step's time: from its start, or where steps overlap (queued on a GPU) from the end of the one before.
        seconds, self.last_end = end - max(started, self.last_end), end
        state, number = self.state, queued.number
        if math.isfinite(result.loss):  # (an fp16 overflow's loss is a true one: only its gradient overflowed)
            state.add_to_window(result.loss)
        if not result.updated:  # fp16's overflow, or train.skip_nonfinite: this batch changed nothing
            state.skipped += 1
            self.tb.scalars(number, {"train/skipped_nonfinite": state.skipped})
        tokens_per_sec = self.step_log.record(number, state, result, lr, seconds)
        if self.run.ranks.distributed and number == self.first:  # the optimizer's state exists from now on
            log.info(memory_line(self.run.model, self.run.optimizer, self.run.ranks))
        self.bar.update(number, result.loss, tokens_per_sec)


class StepLog:
    """The mean train loss, lr, grad norm and tokens/s of each window of log_interval steps
    (and of the last step's window), to TensorBoard and the log."""

    def __init__(self, tb: RunLogger, log_interval: int, max_steps: int, tokens_per_step: int) -> None:
        self.tb, self.log_interval, self.max_steps, self.tokens_per_step = tb, log_interval, max_steps, tokens_per_step
        self.timed_steps, self.seconds = 0, 0.0
        self.history: list[float] = []  # tokens/s of each logged window

    def record(self, step: int, state: TrainState, result: StepResult, lr: float, seconds: float) -> float:
        """Adds update number step, which took seconds; returns the tokens/s of the window so far."""
        self.timed_steps += 1
        self.seconds += seconds
        tokens_per_sec = self.timed_steps * self.tokens_per_step / self.seconds
        if (step % self.log_interval == 0 or step == self.max_steps) and state.window_steps:
            mean_loss = state.take_window()
            self.tb.scalars(step, {BATCH_LOSS: mean_loss, "train/lr": lr, "train/grad_norm": result.grad_norm,
                                   TOKENS_PER_SEC: tokens_per_sec})
            if result.loss_scale is not None:
                self.tb.scalars(step, {"train/loss_scale": result.loss_scale})
            log.info(f"step {step}/{self.max_steps} | loss {mean_loss:.4f} | lr {lr:.2e} | "
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
