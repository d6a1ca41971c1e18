"""The learning rate at each step: linear warmup, then cosine decay down to min_lr."""

import math


def lr_at(step: int, lr: float, min_lr: float, warmup_steps: int, max_steps: int) -> float:
    """Step 0 starts at lr / warmup_steps and warmup ends at lr; from there a half cosine
    takes it to min_lr at max_steps (and it stays there past max_steps)."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)  # 0 -> 1
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))
