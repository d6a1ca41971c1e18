"""What the sections share: the project's folder, tiny shakespeare, a median timer, and a run's logged figures."""

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cli.run_spec import composed_run_spec
from data.corpus import cached_copy, not_a_file
from data.download import sha256_of
from data.specs import CorpusSpec
from user_error import UserError

ROOT = Path(__file__).resolve().parent.parent  # the project's folder, where train.py is
# The torch threads of the sections that time one token at a time (kv_cache, gpt2_sampling) unless
# --threads says otherwise: on a machine other jobs share, a second thread waits at each of a
# step's parallel loops while another process holds its core, and a run's time moves tenfold.
STEADY_THREADS = 1
# Where the training, quality, recipe and nanogpt sections look for tiny shakespeare before they
# download it: a copy beside the project's folder, as this project's own machines keep one.
SHARED_SHAKESPEARE = ROOT.parent / "shared/corpora/tinyshakespeare.txt"


def published_shakespeare() -> CorpusSpec:
    """data=shakespeare's corpus as train.py composes it: where tiny shakespeare is downloaded from, and its hash."""
    return composed_run_spec("data=shakespeare").corpus


def tiny_shakespeare(given: Path | None) -> Path:
    """The corpus of the sections that train on tiny shakespeare: --corpus if given, else the copy
    beside the project, else the one `data=shakespeare` downloads into .cache/corpora/ (its hash
    checked), fetched now if it is not there yet; or one line saying how to give it."""
    published = published_shakespeare()
    if given is not None:
        if not given.is_file():
            raise UserError(f"--corpus {given} {not_a_file(given)}; give tiny shakespeare's input.txt")
        if sha256_of(given.read_bytes()) != published.sha256:  # taken all the same: a file of yours may be the point
            print(f"note: --corpus {given} is not tiny shakespeare as published (its sha256 differs): the figures of the "
                  "sections that train on it are not comparable with nanoGPT's or with those in docs/speed.md", flush=True)
        return given.resolve()
    if SHARED_SHAKESPEARE.is_file():
        return SHARED_SHAKESPEARE
    corpus = replace(published, cache_dir=str(ROOT / published.cache_dir))
    give = 'give --corpus <file> (make bench ARGS="--corpus <file>")'
    try:
        return cached_copy(corpus, offline_advice=f"with a copy of it, {give}", mismatch_advice=f"With a copy of it, {give}")
    except UserError as err:
        raise UserError(f"tiny shakespeare, which the training sections train on: {err}") from None


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

