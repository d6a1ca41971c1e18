"""Everything beyond the weights that an exact resume needs, as plain data.

A run resumed from a checkpoint must draw the same batches, the same dropout masks and
the same everything else as the run left alone, so the checkpoint also stores every
random number generator's state and where the loop was:

    capture_rng_states(batch_rng) -> dict   python, numpy (global and the batch sampler),
                                            torch (CPU, and CUDA or MPS when present)
    restore_rng_states(states, batch_rng)   puts them all back

Only ints, lists, strings and tensors go in, so torch.load(weights_only=True) reads it.
"""

import random
from typing import Any

import numpy as np
import torch


def capture_rng_states(batch_rng: np.random.Generator) -> dict[str, Any]:
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
