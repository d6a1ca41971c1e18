"""A run's state beyond its weights and optimizer: where the loop is (TrainState, live), and
what a checkpoint keeps of it for an exact resume (RunState, saved as the checkpoint's run_state).

A run resumed from a checkpoint must draw the same batches, the same dropout masks and the same
everything else as the run left alone, so RunState also holds every random number generator's
state, each rank's: python, numpy (global, and the batch sampler's), torch (the CPU's, and
CUDA's or MPS's when present). Only ints, floats, lists, strings and tensors go in, so
torch.load(weights_only=True) reads it.
"""

import math
import random
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from user_error import UserError


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


@dataclass
class RunState:
    """A checkpoint's run_state: what an exact resume needs besides the weights, the optimizer,
    the step and the best val loss (the checkpoint's own fields)."""

    rng: list[dict[str, Any]]  # each rank's RNG states (capture_rng_states), by rank
    world_size: int  # the processes that saved it
    grad_scaler: dict[str, Any] | None  # fp16's loss scale; None for fp32 and bf16
    evaluated: bool  # this step's jobs (its evaluation, if due) ran and were saved with it
    skipped: int
    window_loss: float
    window_steps: int
    text_key: str | None  # the corpus's documents, hashed (data/token_stream.py); None in older checkpoints

    @classmethod
    def of(cls, state: TrainState, rng: list[dict[str, Any]], world_size: int, grad_scaler: dict[str, Any] | None,
           evaluated: bool, text_key: str | None) -> "RunState":
        return cls(rng, world_size, grad_scaler or None, evaluated, state.skipped, state.window_loss, state.window_steps,
                   text_key)

    def to_dict(self) -> dict[str, Any]:
        """As a checkpoint saves it (asdict would copy every tensor of the RNG states)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> "RunState":
        """A checkpoint's run_state, as upgrade() leaves an old one (model_io/checkpoint.py); UserError for
        one that is not as train.py saves it (a file edited by hand)."""
        missing = [f.name for f in fields(cls) if f.name not in saved]
        rng = saved.get("rng")
        if missing or not isinstance(rng, list) or not rng or \
                not all(isinstance(states, dict) and states.keys() >= RNG_NAMES for states in rng):
            wrong = f"no {', '.join(missing)}" if missing else "its rng is not a list of each rank's generator states"
            raise UserError(f"the checkpoint's run state is not as train.py saves it ({wrong}); resume from a "
                            "checkpoint train.py saved, as it saved it")
        return cls(**{f.name: saved[f.name] for f in fields(cls)})

    def train_state(self, step: int, best_val_loss: float) -> TrainState:
        """Where the loop was, with the checkpoint's step and best val loss."""
        return TrainState(step=step, best_val_loss=best_val_loss, skipped=self.skipped, window_loss=self.window_loss,
                          window_steps=self.window_steps, evaluated=self.evaluated)


RNG_NAMES = {"python", "numpy", "batches", "torch"}  # what capture_rng_states saves on any machine


def capture_rng_states(batch_rng: np.random.Generator) -> dict[str, Any]:
    """This process's RNG states: python, numpy (global and the batch sampler), torch (CPU, and
    CUDA or MPS when present)."""
    version, internal, gauss = random.getstate()
    legacy = np.random.get_state(legacy=False)
    states = {
        "python": [version, list(internal), gauss],
        "numpy": {**legacy, "state": {"key": legacy["state"]["key"].tolist(), "pos": int(legacy["state"]["pos"])}},
        "batches": batch_rng.bit_generator.state,  # plain ints and strings (PCG64)
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    if torch.backends.mps.is_available():
        states["mps"] = torch.mps.get_rng_state()
    return states


def restore_rng_states(states: dict[str, Any], batch_rng: np.random.Generator) -> None:
    """Puts back what capture_rng_states took."""
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    legacy = states["numpy"]
    np.random.set_state({**legacy, "state": {"key": np.array(legacy["state"]["key"], dtype=np.uint32), "pos": legacy["state"]["pos"]}})
    batch_rng.bit_generator.state = states["batches"]
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    if "mps" in states and torch.backends.mps.is_available():
        torch.mps.set_rng_state(states["mps"])
