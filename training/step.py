"""One optimizer update: this rank's share of a batch in micro-steps, clipped, with the
non-finite policy (stop, or skip and count) and fp16's loss scaling (an overflow skips the update;
a scale that collapses stops the run). Unless fp16 or skipping must read the step's numbers
first, the update is queued at once and they are read later (QueuedStep), so one GPU never waits."""

import math
import os
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from data.batches import get_batch
from runtime.precision import MIN_LOSS_SCALE, Precision
from runtime.ranks import Ranks
from training.data_parallel import Replicated, whole
from training.specs import StepSpec
from user_error import UserError


@dataclass
class StepResult:
    loss: float  # the mean over every rank's batches
    grad_norm: float
    updated: bool  # False: skipped, for fp16's overflow or a non-finite value (train.skip_nonfinite)
    loss_scale: float | None = None  # fp16's loss scale after the step; None for fp32 and bf16


class QueuedStep:
    """A step the device may still be running: its loss and gradient norm, (2,), travel to the
    host as soon as the device has them, and result() waits for them alone, not for any work
    queued after them. A non-finite one stops the run there (its update was applied unchecked,
    and nothing saves it: the loop reads every step before it saves)."""

    def __init__(self, train_step: "TrainStep", number: int, numbers: torch.Tensor, settled: StepResult | None = None) -> None:
        """number: the update's number (1 for the first); numbers: (2,) loss and gradient norm,
        on the device; settled: the result already, where the step had to read it to decide."""
        self.train_step, self.number, self.settled = train_step, number, settled
        self.host, self.copied = numbers, None  # a CPU's numbers are there already (Apple's MPS waits in .cpu())
        if settled is None and numbers.device.type == "cuda":  # a copy into pinned memory, queued behind the step
            self.host = torch.empty(numbers.shape, dtype=numbers.dtype, pin_memory=True)  # (2,)
            self.host.copy_(numbers, non_blocking=True)
            self.copied = torch.cuda.Event()
            self.copied.record()
        elif settled is None:
            self.host = numbers.cpu()

    @property
    def done(self) -> bool:
        """Whether the step has finished already (on a CPU, at once): its numbers wait for nothing."""
        return self.settled is not None or self.copied is None

    def result(self) -> StepResult:
        """The step's numbers, waiting for them if the device has not got there yet; UserError
        (train.skip_nonfinite=false) where the loss or gradient norm is not finite."""
        if self.settled is None:
            if self.copied is not None:
                self.copied.synchronize()
            loss, grad_norm = self.host.tolist()
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                raise self.train_step.stopped(loss, grad_norm, self.number)
            self.settled = StepResult(loss, grad_norm, updated=True)
        return self.settled


class TrainStep:
    def __init__(
        self, spec: StepSpec, model: nn.Module, step_model: nn.Module, parallel: Replicated | None,
        optimizer: torch.optim.Optimizer, precision: Precision, ranks: Ranks, tokens: np.ndarray, last_checkpoint: Path,
    ) -> None:
        """One update as spec says (training/specs.py), on batches drawn from tokens. step_model
        runs forward and backward: model itself, or DDP or torch.compile around it; parallel syncs
        the gradients over the ranks (None: one process). last_checkpoint: the file a stop for a
        non-finite value says is kept."""
        self.model, self.step_model, self.parallel, self.optimizer = model, step_model, parallel, optimizer
        self.precision, self.ranks, self.tokens = precision, ranks, tokens
        self.batch_size, self.block_size, self.accum = spec.batch_size, spec.block_size, spec.grad_accum_steps
        self.grad_clip, self.skip_nonfinite = spec.grad_clip or math.inf, spec.skip_nonfinite
        self.last_checkpoint = last_checkpoint

    @property
    def tokens_per_step(self) -> int:
        return self.accum * self.ranks.world_size * self.batch_size * self.block_size

    @property
    def decides_first(self) -> bool:
        """Whether an update waits for its step's numbers: fp16's loss scale skips an overflowing
        one, and train.skip_nonfinite a NaN. Otherwise a NaN stops the run, so the update can go
        ahead unchecked and the numbers be read later (QueuedStep)."""
        return self.precision.scaler.is_enabled() or self.skip_nonfinite

    def __call__(self, step: int, lr: float, batch_rng: np.random.Generator) -> QueuedStep:
        """Queues update number step + 1 at this lr (on a CPU: runs it); batch_rng draws its batch."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr  # AdamW and Muon alike: Muon scales its own update to match
        x, y = self.rank_share(batch_rng)  # (A, B, T) each, on the device
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=self.ranks.device)
        for micro in range(self.accum):
            loss_sum += self.forward_backward(x[micro], y[micro], last=micro == self.accum - 1)
        self.precision.scaler.unscale_(self.optimizer)  # fp16: back to true gradients before clipping
        grad_norm = whole(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip))  # () on the device
        loss = self.ranks.sum_on_device(loss_sum) / (self.accum * self.ranks.world_size)  # ()
        numbers = torch.stack([loss, grad_norm.to(loss.dtype)])  # (2,): the same on every rank, so all decide alike
        if not self.decides_first:
            self.optimizer.step()
            return QueuedStep(self, step + 1, numbers)
        loss_value, norm_value = numbers.tolist()  # waits for the device
        updated = self.update(loss_value, norm_value, step)
        return QueuedStep(self, step + 1, numbers, StepResult(loss_value, norm_value, updated, self.precision.loss_scale))

    def update(self, loss: float, grad_norm: float, step: int) -> bool:
        """Steps the optimizers unless the loss or gradient is not finite; returns whether it did.
        fp16's loss scale makes an overflowing gradient routine: the scaler skips that update
        and halves the scale. Anywhere else a NaN or inf stops the run (or is skipped)."""
        scaler = self.precision.scaler
        if not math.isfinite(loss) or not (math.isfinite(grad_norm) or scaler.is_enabled()):
            if not self.skip_nonfinite:
                raise self.stopped(loss, grad_norm, step + 1)
            return False
        scale = self.precision.loss_scale
        scaler.step(self.optimizer)  # optimizer.step(), unless fp16's gradient overflowed
        scaler.update()
        if scale is not None and self.precision.loss_scale < MIN_LOSS_SCALE:
            raise self.collapsed(step + 1)
        return scale is None or self.precision.loss_scale >= scale  # the scale drops only after an overflow

    def rank_share(self, batch_rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank draws the same global batch of accum x ranks x batch_size sequences and
        takes its own batch_size rows for each micro-step. So 2 ranks x batch b, or 2
        micro-steps x b, see exactly the sequences one batch of 2b would."""
        A, W, B, T = self.accum, self.ranks.world_size, self.batch_size, self.block_size
        x, y = get_batch(self.tokens, A * W * B, T, batch_rng, self.model.config.vocab_size)  # (A*W*B, T) each
        x, y = x.view(A, W, B, T)[:, self.ranks.rank], y.view(A, W, B, T)[:, self.ranks.rank]  # (A, B, T) each
        return to_device(x, self.ranks.device), to_device(y, self.ranks.device)

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, last: bool) -> torch.Tensor:
        """One micro-step on x, y (B, T); returns its loss, detached. Gradients add up over the
        micro-steps; DDP or FSDP averages them over ranks only in the last one's backward()."""
        with nullcontext() if self.parallel is None else self.parallel.gradient_sync(last):
            with self.precision.autocast():
                _, loss = self.step_model(x, y)  # loss: mean over B x T
            # Dividing by accum makes the summed gradient that of the mean over all micro-batches.
            self.precision.scaler.scale(loss / self.accum).backward()
        return loss.detach()

    def stopped(self, loss: float, grad_norm: float, step: int) -> UserError:
        what, bad = ("loss", loss) if not math.isfinite(loss) else ("gradient norm", grad_norm)
        return UserError(
            f"the {what} became {bad} at step {step}; stopped without saving, and {self.kept()}. "
            "Lower optim.lr, or set train.skip_nonfinite=true to skip such batches"
        )

    def collapsed(self, step: int) -> UserError:
        return UserError(
            f"fp16's loss scale fell to {self.precision.loss_scale:g} at step {step}: the gradients overflow fp16 "
            f"even unscaled, so every update is skipped; stopped without saving, and {self.kept()}. "
            "Use train.dtype=bf16 (on a GPU with it) or fp32, or lower optim.lr"
        )

    def kept(self) -> str:
        """What a stop leaves of the run: its last checkpoint, if one was saved."""
        if self.last_checkpoint.exists():
            return f"{os.path.relpath(self.last_checkpoint)} from before it is kept"
        return "no checkpoint had been saved yet"


def to_device(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU batch on device. To a GPU through pinned memory, without waiting: a copy from
    ordinary memory would first wait for every kernel queued before it."""
    if device.type != "cuda":
        return batch.to(device)
    return batch.contiguous().pin_memory().to(device, non_blocking=True)
