"""Where the training loop is: saved with every checkpoint and restored from it as one object."""

import math
from dataclasses import dataclass
from typing import Any

from model_io.checkpoint import Checkpoint


@dataclass
class TrainState:
    step: int = 0  # optimizer updates done
    best_val_loss: float = math.inf
    skipped: int = 0  # updates skipped: an fp16 overflow, or a non-finite value (train.skip_nonfinite)
    window_loss: float = 0.0  # the sum of the train losses not yet logged...
    window_steps: int = 0  # ...over this many steps
    evaluated: bool = False  # restored at a step whose jobs (evaluation, maps, samples) ran before its save: skip them

    def add_to_window(self, loss: float) -> None:
        self.window_loss += loss
        self.window_steps += 1

    def take_window(self) -> float:
        """The mean train loss since the last call; starts a new window."""
        mean = self.window_loss / self.window_steps
        self.window_loss, self.window_steps = 0.0, 0
        return mean

    def run_state(self, evaluated: bool) -> dict[str, Any]:
        """The loop's part of a checkpoint's run_state (its step and best_val_loss are the
        checkpoint's own); evaluated: this step's jobs (its evaluation, if due) are done and saved with it."""
        return {"evaluated": evaluated, "skipped": self.skipped,
                "window_loss": self.window_loss, "window_steps": self.window_steps}

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> "TrainState":
        run_state = checkpoint.run_state
        return cls(
            step=checkpoint.step, best_val_loss=checkpoint.best_val_loss, skipped=run_state["skipped"],
            window_loss=run_state["window_loss"], window_steps=run_state["window_steps"],
            evaluated=run_state["evaluated"],
        )

