"""Train and val loss on fixed batches, shared out over the ranks."""

import math

import numpy as np
import torch

from data.dataset import TokenData, get_batch
from model import eval_mode
from training.distributed import Ranks
from training.precision import Precision


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, data: TokenData, batch_size: int, block_size: int, eval_iters: int, ranks: Ranks,
    precision: Precision, seed: int, splits: tuple[str, ...] = ("train", "val"), lockstep: bool = False,
) -> dict[str, float]:
    """Mean loss over eval_iters batches of each split in splits. The batches are the same at every
    evaluation (a fixed seed), so the curve shows the model changing, not the batches. Under
    torchrun the ranks share them out (batch i to rank i mod ranks) and add up their sums, so
    the result does not depend on how many processes there are. A split left out of splits
    still has its batches drawn (not run), so the other split's batches stay the same.
    lockstep (FSDP, where each forward is a collective): every rank runs as many forwards, a
    rank short of batches repeating its last, unused."""
    rng = np.random.default_rng(seed + 1)
    losses = {}
    with eval_mode(model):
        for split, tokens in (("train", data.train), ("val", data.val)):
            total = 0.0
            for i in range(eval_iters):
                x, y = get_batch(tokens, batch_size, block_size, rng)  # every rank draws every batch: the rng stays in step
                if split in splits and i % ranks.world_size == ranks.rank:
                    with precision.autocast():
                        total += model(x.to(ranks.device), y.to(ranks.device))[1].item()
            if split in splits and lockstep:
                for _ in range(math.ceil(eval_iters / ranks.world_size) - len(range(ranks.rank, eval_iters, ranks.world_size))):
                    with precision.autocast():
                        model(x.to(ranks.device), y.to(ranks.device))
            if split in splits:
                losses[split] = ranks.sum(total) / eval_iters
    return losses
