"""What the sections share: the project's folder, a median timer, and a run's logged figures."""

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parent.parent  # the project's folder, where train.py is
# The torch threads of the sections that time one token at a time (kv_cache, gpt2_sampling) unless
# --threads says otherwise: on a machine other jobs share, a second thread waits at each of a
# step's parallel loops while another process holds its core, and a run's time moves tenfold.
STEADY_THREADS = 1


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """The block with this many torch threads, then the ones before."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def median_time(run: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall time of run() in seconds, after warmup calls."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def logged(run_dir: Path, tag: str) -> list[float]:
    """The values a run logged under a TensorBoard tag, in step order, read back with
    TensorBoard's own reader (the same numbers fit() returns to train.py)."""
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [event.value for event in events.Scalars(tag)]

