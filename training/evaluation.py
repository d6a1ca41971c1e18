"""Train and val loss on fixed batches, shared out over the ranks, and the in-context-learning score."""

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from data.batches import get_batch
from data.token_cache import TokenData
from model import eval_mode
from runtime.precision import Precision
from runtime.ranks import Ranks


@dataclass
class Evaluated:
    losses: dict[str, float]  # {split: mean loss} of each split evaluated
    in_context: float | None  # val: in_context_positions' late loss minus their early loss (None: block_size < 3)


def in_context_positions(block_size: int) -> tuple[slice, slice]:
    """(early, late): the second tenth of a window's positions and its last tenth (at least one
    position each). Olsson et al. (2022) compare the loss at token 500 with that at token 50 in
    windows of 8,192; here the two are a tenth and the whole of block_size into the window, so
    the score means the same thing for a window of any length: how much later tokens gain from
    the context before them, past what the first few tokens already tell."""
    tenth = max(1, block_size // 10)
    return slice(tenth, 2 * tenth), slice(block_size - tenth, block_size)


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, data: TokenData, batch_size: int, block_size: int, eval_iters: int, ranks: Ranks,
    precision: Precision, seed: int, splits: tuple[str, ...] = ("train", "val"), lockstep: bool = False,
) -> Evaluated:
    """Mean loss over eval_iters batches of each split in splits, and on val the in-context score.
    The batches are the same at every evaluation (a fixed seed), so the curve shows the model
    changing, not the batches. Under torchrun the ranks share them out (batch i to rank i mod
    ranks) and add up their sums, so the result does not depend on how many processes there are.
    A split left out of splits still has its batches drawn (not run), so the other split's
    batches stay the same. lockstep (FSDP, where each forward is a collective): every rank runs
    as many forwards, a rank short of batches repeating its last, unused. An id past the tokenizer's
    vocabulary is refused, naming its file (a damaged token cache)."""
    rng = np.random.default_rng(seed + 1)
    early, late = in_context_positions(block_size)
    scores_in_context = "val" in splits and block_size >= 3  # (shorter windows have no early and late apart)
    losses, in_context = {}, 0.0
    with eval_mode(model):
        for split, tokens in (("train", data.train), ("val", data.val)):
            total = 0.0
            for i in range(eval_iters):
                x, y = get_batch(tokens, batch_size, block_size, rng, data.tokenizer.vocab_size)  # every rank draws every batch: the rng stays in step
                if split in splits and i % ranks.world_size == ranks.rank:
                    x, y = x.to(ranks.device), y.to(ranks.device)  # (B, T), (B, T)
                    with precision.autocast():
                        logits, loss = model(x, y)  # (B, T, vocab_size), ()
                    total += loss.item()
                    if split == "val" and scores_in_context:
                        in_context += position_loss(logits[:, late], y[:, late]) - position_loss(logits[:, early], y[:, early])
            if split in splits and lockstep:
                for _ in range(math.ceil(eval_iters / ranks.world_size) - len(range(ranks.rank, eval_iters, ranks.world_size))):
                    with precision.autocast():
                        model(x.to(ranks.device), y.to(ranks.device))
            if split in splits:
                losses[split] = ranks.sum(total) / eval_iters
    return Evaluated(losses, ranks.sum(in_context) / eval_iters if scores_in_context else None)


def position_loss(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean cross-entropy of logits (B, P, vocab_size) against targets (B, P)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()).item()
