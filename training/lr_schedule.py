"""The learning rate at each step: linear warmup, then cosine decay down to min_lr."""

import math


def lr_at(step: int, lr: float, min_lr: float, warmup_steps: int, max_steps: int) -> float:
    """The lr for update number step (0 to max_steps - 1). Warmup rises linearly from
    lr / warmup_steps to lr at step warmup_steps - 1; then a half cosine falls to min_lr,
    which the last update (step max_steps - 1) uses, and any step after it."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    last = max_steps - 1
    if step >= last:
        return min_lr
    progress = (step - warmup_steps) / max(1, last - warmup_steps)  # 0 -> 1
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))
