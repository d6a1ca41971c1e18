"""Which file a run's name means, in one place: a run dir's checkpoints by name, `run=` of
sample.py, export.py and make docs (a run dir, a file, or "latest": the newest run that trained),
`resume=` (a run dir, a file, or "auto"), and the model-only checkpoints train.keep_checkpoints
kept, checkpoints/step_000250.pt. Found without loading torch (the Attention tab lists runs at
TensorBoard's start); only "latest" reads a checkpoint's step, and what is inside a file is
model_io/checkpoint.py's business."""

import functools
import os
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from user_error import UserError, not_a_file_or_folder

LAST, BEST = "ckpt_last.pt", "ckpt_best.pt"
KEPT = "checkpoints"  # the run dir's folder of model-only checkpoints, one per step of train.keep_checkpoints
LOG_SPACED = "log"  # train.keep_checkpoints=log: step 0, every power of two, and the last step
AUTO = "auto"  # resume=auto: the run in hydra.run.dir if it saved one, else a new run there
RUN_CONFIG = Path(".hydra") / "config.yaml"  # what train.py writes first into a run dir, before any checkpoint
WHEN_SAVED = ("a run saves its first checkpoint at its first evaluation after step 0 (every train.eval_interval "
              "steps); wait for it")
RUN_ROOTS = ("outputs", "multirun")  # where "latest" looks, relative to the working folder
# "The newest run" is the newest that trained at least MIN_STEPS steps or started from pretrained
# weights (init_from, even at step 0: GPT-2 as it came), so that a 1-step test run started after
# a real one does not win. When no run is such, the newest run.
MIN_STEPS = 100

RunT = TypeVar("RunT")  # a run as the caller names it (resolve_checkpoint: its run dir)


def model_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint a run's model is read from (sample.py, export.py, the tab): the first of
    model_checkpoints; None before the run has saved any."""
    return next(iter(model_checkpoints(run_dir)), None)


def model_checkpoints(run_dir: Path) -> list[Path]:
    """A run's checkpoints in the order its model is read from them: its ckpt_best.pt, its
    ckpt_last.pt, then (a run before its first evaluation's save) the checkpoints it kept
    (train.keep_checkpoints), newest first."""
    saved = [Path(run_dir) / name for name in (BEST, LAST) if (Path(run_dir) / name).is_file()]
    return [*saved, *reversed(kept_checkpoints(run_dir).values())]


def newest_checkpoint(run_dir: Path) -> Path | None:
    """Where a run is now: its ckpt_last.pt, else its ckpt_best.pt (every save writes the last;
    the best only when val improves, so the last is never older)."""
    return next((Path(run_dir) / name for name in (LAST, BEST) if (Path(run_dir) / name).is_file()), None)


def kept_checkpoint_path(run_dir: Path, step: int) -> Path:
    """Where the model-only checkpoint kept at `step` lives: checkpoints/step_000250.pt."""
    return Path(run_dir) / KEPT / f"step_{step:06d}.pt"


def kept_checkpoints(run_dir: Path) -> dict[int, Path]:
    """The model-only checkpoints a run kept along the way (train.keep_checkpoints), by step, in
    step order; {} for a run that kept none."""
    found = {}
    for path in (Path(run_dir) / KEPT).glob("step_*.pt"):
        digits = path.stem.removeprefix("step_")
        if digits.isdigit() and path.is_file():
            found[int(digits)] = path
    return dict(sorted(found.items()))


def where_runs_are(key: str, folder: Path, needs: tuple[str, ...] = (BEST, LAST)) -> str:
    """What to give key= instead of a folder without a checkpoint: the run dirs inside it that hold
    one of needs (a sweep's multirun/<date>/<time> holds one per value, 0, 1, ...), else a training
    run dir or a .pt file."""
    def in_order(child: Path) -> tuple[int, int, str]:  # a sweep's 0, 1, ..., 10 as numbers, then the rest by name
        return (0, int(child.name), "") if child.name.isdecimal() else (1, 0, child.name)

    try:
        runs = sorted((child for child in folder.iterdir() if any((child / name).is_file() for name in needs)), key=in_order)
    except OSError:  # a folder this user may not read
        runs = []
    if not runs and is_run_dir(folder):
        return f"it is a run dir that has saved none yet: {WHEN_SAVED}"
    if not runs:
        return f"point {key}= at a training run dir or a .pt file"
    names = ", ".join(child.name for child in runs[:4]) + (", ..." if len(runs) > 4 else "")
    return f"it holds {len(runs)} run dir{'s' if len(runs) > 1 else ''} ({names}): give one, e.g. {key}={runs[0]}"


def is_run_dir(folder: Path) -> bool:
    """Whether folder is a training run's dir (train.py writes its config there first), saved or not."""
    return (folder / RUN_CONFIG).is_file()


def is_trained(steps: int, init_from: str | None) -> bool:
    """Whether a run counts as trained: at least MIN_STEPS steps, or weights from elsewhere."""
    return steps >= MIN_STEPS or bool(init_from)


def newest_trained(newest_first: Iterable[RunT], facts: Callable[[RunT], tuple[int, str | None]]) -> RunT | None:
    """The first run of newest_first that is_trained by facts(run) = (steps, init_from), else the
    first run; None for no runs. facts is asked only as far as needed (it may read a checkpoint)."""
    first = None
    for run in newest_first:
        first = run if first is None else first
        if is_trained(*facts(run)):
            return run
    return first


def resolve_checkpoint(run: str | os.PathLike) -> Path:
    """A checkpoint file as given; in a run dir its model_checkpoint (ckpt_best.pt, ...); "latest":
    latest_checkpoint's. run: a str or a Path (a notebook's RUN)."""
    if not isinstance(run, str | os.PathLike):
        raise TypeError(f"run={run!r}: give a run dir or a .pt file, as a str or a Path, or 'latest'")
    run = os.fspath(run)
    if run == "latest":
        return latest_checkpoint()[0]
    if not run.strip():  # run=$RUN with RUN unset: not the working folder
        raise UserError("run= is empty; give a run dir (e.g. outputs/<date>/<time>), a .pt file, or latest")
    path = Path(run).expanduser()
    if path.is_dir():
        if found := model_checkpoint(path):
            return found
        raise UserError(f"run={run} has no checkpoint ({BEST}, {LAST} or one it kept); {where_runs_are('run', path)}")
    if not path.is_file():
        raise UserError(f"run={run} {not_a_file_or_folder(path)}; give a run dir (e.g. outputs/<date>/<time>), a .pt file, or latest")
    return path


def latest_checkpoint() -> tuple[Path, list[tuple[Path, int]]]:
    """run=latest: of the run dirs under outputs/ and multirun/, newest checkpoint first, the first
    that trained at least MIN_STEPS steps or started from pretrained weights, else the newest; and
    the newer runs passed over, (run dir, steps), newest first."""
    found = [p for root in RUN_ROOTS for name in (BEST, LAST) for p in Path(root).glob(f"**/{name}")]
    if not found:
        started = [p.parent.parent for root in RUN_ROOTS for p in Path(root).glob(f"**/{RUN_CONFIG}")]
        if started:
            newest = max(started, key=lambda run_dir: run_dir.stat().st_mtime)
            raise UserError(f"run=latest found no checkpoint under outputs/ or multirun/: the newest run, {newest}, "
                            f"has saved none yet: {WHEN_SAVED}")
        raise UserError("run=latest found no checkpoint under outputs/ or multirun/; train one first (make train)")
    written = {}  # run dir -> when its newest checkpoint was written
    for path in found:
        written[path.parent] = max(written.get(path.parent, 0), path.stat().st_mtime)
    newest_first = sorted(written, key=written.get, reverse=True)
    facts = functools.cache(run_facts)  # each run's checkpoint read once
    chosen = newest_trained(newest_first, facts)
    passed = [(run_dir, facts(run_dir)[0]) for run_dir in newest_first[:newest_first.index(chosen)]]
    return resolve_checkpoint(str(chosen)), passed


def checkpoint_and_note(run: str) -> tuple[Path, str | None]:
    """resolve_checkpoint(run), and for "latest" the line that names the newer runs it passed over
    (sample.py and export.py print it), else None."""
    if run != "latest":
        return resolve_checkpoint(run), None
    path, passed = latest_checkpoint()
    if not passed:
        return path, None
    runs = ", ".join(f"{run_dir} ({steps} step{'' if steps == 1 else 's'})" for run_dir, steps in passed[:3])
    more = f" and {len(passed) - 3} more" if len(passed) > 3 else ""
    return path, (f"note: run=latest passed over newer runs of fewer than {MIN_STEPS} steps: {runs}{more}; "
                  f"give run=<run dir> to use one")


def run_facts(run_dir: Path) -> tuple[int, str | None]:
    """(steps trained, init_from) of a run dir, from its newest checkpoint, without reading its
    weights (torch maps them from the file only when touched)."""
    from model_io.checkpoint import read_file  # torch, for "latest" alone

    saved = read_file(newest_checkpoint(run_dir), "cpu", mmap=True)
    if not isinstance(saved, dict):
        return 0, None  # not a checkpoint: Checkpoint.load says so should this run be the one
    return int(saved.get("step", 0)), saved.get("config", {}).get("init_from")


def checkpoint_to_resume(resume: str | None, run_dir: Path, restarted: bool) -> Path | None:
    """The checkpoint a run goes on from; None: a new run. With resume=auto, and in processes
    torchrun restarted, it is the run dir's ckpt_last.pt (the run's latest) if there is one. A run
    is refused a run dir whose checkpoints it would overwrite: a new run's, or one going on from
    another checkpoint than that dir's ckpt_last.pt (another run's, or an earlier point of this one)."""
    last = run_dir / LAST
    if (resume == AUTO or restarted) and last.is_file():
        return last
    held = newest_checkpoint(run_dir)  # what a run there would write over
    shown = os.path.relpath(run_dir)
    if resume in (None, AUTO):
        if held == last:  # (resume=auto has gone on from it above)
            raise UserError(f"{shown} already holds a run ({LAST}), which a new run there would overwrite; go on with "
                            f"it with resume={shown} (or resume=auto), or give the new run another hydra.run.dir")
        if held is not None:
            raise UserError(f"{shown} holds {BEST} but no {LAST}, and a new run there would overwrite it; give the new "
                            f"run another hydra.run.dir (to go on from that model: resume={held} hydra.run.dir=<a new folder>)")
        return None
    source = resolve_resume(resume)
    # (A file that is no checkpoint, train.log say, is said to be none as it is read: Checkpoint.load.)
    if held is not None and source.resolve() != last.resolve() and zipfile.is_zipfile(source):
        go_on = f", or resume={shown} to go on from its {LAST}" if last.is_file() else ""
        raise UserError(f"resume={resume} would go on in {shown} from {source.name}, overwriting the {held.name} there; "
                        f"to branch from it, add hydra.run.dir=<a new folder>{go_on}")
    return source


def resolve_resume(resume: str) -> Path:
    if not resume.strip():  # resume=$RUN with RUN unset: not the working folder
        raise UserError("resume= is empty; give a run dir (e.g. outputs/<date>/<time>), a .pt file or auto, or leave "
                        "resume out for a new run")
    path = Path(resume).expanduser()
    if path.is_dir():
        if os.path.lexists(path / LAST) and not (path / LAST).is_file():
            what = "is a folder" if (path / LAST).is_dir() else not_a_file_or_folder(path / LAST)
            raise UserError(f"resume={resume}: its {LAST} {what}, not the checkpoint train.py saves there; put the "
                            "run's checkpoint back in its place")
        if (path / BEST).is_file() and not (path / LAST).is_file():
            raise UserError(f"resume={resume} has no {LAST}, only {BEST}; to go on from that one, give "
                            f"resume={path / BEST} hydra.run.dir=<a new folder>")
        if not (path / LAST).is_file():
            raise UserError(f"resume={resume} has no {LAST}; {where_runs_are('resume', path, needs=(LAST,))}")
        return path / LAST
    if not path.is_file():
        raise UserError(f"resume={resume} {not_a_file_or_folder(path)}; give a run dir (e.g. outputs/<date>/<time>) or a .pt file")
    return path
