"""The learning rate at each step: linear warmup, then one of two shapes down to min_lr.

    cosine  a half cosine from lr to min_lr over all the steps after warmup
    wsd     warmup-stable-decay: lr held flat, then a straight line to min_lr over the last
            decay_fraction of the steps; the flat part learns fast, the decay settles it
            (configs/optim/default.yaml's choice)
"""

import math

SCHEDULES = ("cosine", "wsd")


def lr_at(
    step: int, lr: float, min_lr: float, warmup_steps: int, max_steps: int, schedule: str, decay_fraction: float,
) -> float:
    """The lr for update number step (0 to max_steps - 1). Warmup rises linearly from
    lr / warmup_steps to lr at step warmup_steps - 1; then the schedule falls to min_lr,
    which the last update (step max_steps - 1) uses, and any step after it."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    last = max_steps - 1
    if step >= last:
        return min_lr
    if schedule == "wsd":
        decay_start = max(warmup_steps, last - round(decay_fraction * max_steps))
        if step < decay_start:
            return lr
        return lr + (min_lr - lr) * (step - decay_start) / max(1, last - decay_start)
    progress = (step - warmup_steps) / max(1, last - warmup_steps)  # 0 -> 1
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))


def schedule_note(lr: float, min_lr: float, warmup_steps: int, max_steps: int, schedule: str, decay_fraction: float) -> str | None:
    """A note for the run's log where warmup takes the schedule's place: it outlasts the run (the
    learning rate never reaches lr), fills it (never decays to min_lr), or, with wsd, eats into
    the decay's share of the steps; None where the schedule runs as asked."""
    if max_steps < 1:
        return None
    if max_steps < warmup_steps:
        return (f"optim.warmup_steps={warmup_steps} is more than train.max_steps={max_steps}: the learning rate never "
                f"reaches optim.lr={lr:g}; lower optim.warmup_steps for so short a run")
    if max_steps == warmup_steps:
        return (f"optim.warmup_steps={warmup_steps} is all of train.max_steps={max_steps}: the learning rate rises to the "
                f"end and never decays to optim.min_lr={min_lr:g}; lower optim.warmup_steps")
    asked = min(round(decay_fraction * max_steps), max_steps - 1)  # lr_at's decay: all the steps after the first, at most
    if schedule == "wsd" and max_steps - 1 - warmup_steps < asked:
        return (f"optim.warmup_steps={warmup_steps} leaves the decay {max_steps - 1 - warmup_steps} of train.max_steps="
                f"{max_steps}'s steps, not the {asked} of optim.decay_fraction={decay_fraction:g}; lower optim.warmup_steps")
    return None

