"""Which run "the newest" means, for `run=latest` (make sample, export.py, make docs) and for the
run the Attention tab opens first: the newest run that trained at least MIN_STEPS steps or
started from pretrained weights (init_from, even at step 0: GPT-2 as it came), so that a 1-step
test run started after a real one does not win. When no run is such, the newest run."""

from collections.abc import Callable, Iterable
from typing import TypeVar

MIN_STEPS = 100

Run = TypeVar("Run")


def is_trained(steps: int, init_from: str | None) -> bool:
    """Whether a run counts as trained: at least MIN_STEPS steps, or weights from elsewhere."""
    return steps >= MIN_STEPS or bool(init_from)


def newest_trained(newest_first: Iterable[Run], facts: Callable[[Run], tuple[int, str | None]]) -> Run | None:
    """The first run of newest_first that is_trained by facts(run) = (steps, init_from), else the
    first run; None for no runs. facts is asked only as far as needed (it may read a checkpoint)."""
    first = None
    for run in newest_first:
        first = run if first is None else first
        if is_trained(*facts(run)):
            return run
    return first
