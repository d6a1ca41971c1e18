"""Where a run writes, and when: a new run's default folder is claimed when Hydra works out
hydra.run.dir (claimed, below), a given one Hydra makes; the run's record goes into it only
once the run has passed its checks, so a refused run leaves nothing behind.

The record: .hydra/ (config.yaml as composed, hydra.yaml, overrides.yaml; a resumed run's own
in .hydra/resumed-<time>/) and train.log, which also gets the lines logged before the checks passed.
"""

import atexit
import errno
import logging
import os
import sys
import time
from contextlib import suppress
from logging.handlers import MemoryHandler
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from cli.errors import exit_on_user_error, path_error_line
from model_io.run_files import AUTO, resolve_resume
from runtime.ranks import rank_zero_choice, said_once_per_machine
from user_error import UserError


def run_dir_for(resume: str | None, fresh_dir: str) -> str:
    """hydra.run.dir unless given: a resumed run goes on in its own folder, a new one gets
    fresh_dir (claimed: below); under torchrun, the one rank 0's first attempt claimed, so that
    every process, and every restart of them, writes to one run dir."""
    if resume == AUTO:  # a given hydra.run.dir never comes here
        raise UserError("resume=auto goes on with the run in hydra.run.dir, a new folder each time unless you name it: "
                        "add hydra.run.dir=<folder>, the same folder every time")
    if resume:
        return str(resolve_resume(resume).parent)
    return rank_zero_choice("train.py run dir", lambda: claimed(fresh_dir))


def claimed(fresh_dir: str) -> str:
    """fresh_dir (outputs/<date>/<time>), made here; or, when a run started in the same second
    made it first, fresh_dir_2, then _3 and on. Making it is what claims it (os.mkdir makes a folder
    once, whoever else tries), so that runs started together, as in `for s in 1 2; do python
    train.py train.seed=$s & done`, never share a run dir, where each would overwrite the other's
    checkpoints."""
    path, n = Path(fresh_dir), 1
    existed = deepest_existing(absolute(path).parent)  # (path itself may be another run's: then this run's is path_2)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                path.mkdir()
                break
            except FileExistsError:
                n += 1
                path = Path(f"{fresh_dir}_{n}")
    except OSError as err:  # a file in the way, no permission: said as the run dir's other errors are
        raise UserError(path_error_line(err)) from None
    # A command that ends with it still empty (`--cfg all --resolve` works the folder out and
    # runs nothing) takes it back, as a refused run does (RunRecord.close).
    EXISTED_BEFORE[absolute(path)] = existed
    atexit.register(take_back_empty_folders, absolute(path))
    return str(path)


# For each run dir of this process, the deepest of its folders that existed before the run: the ones
# below it were made for the run, and a run that writes nothing takes them back (take_back_empty_folders).
EXISTED_BEFORE: dict[Path, Path] = {}


def absolute(folder: str | Path) -> Path:
    """folder from the root, with any .. worked out (as Hydra writes hydra.runtime.output_dir)."""
    return Path(os.path.abspath(folder))


def deepest_existing(folder: Path) -> Path:
    """folder itself if it exists, else its nearest parent that does."""
    return next(path for path in [folder, *folder.parents] if path.is_dir())


class NoteGivenRunDir(Callback):
    """Before Hydra makes a hydra.run.dir given on the command line (with any missing parents), notes
    which of its folders already exist (configs/train.yaml, hydra.callbacks), so that a refused run
    takes back the folders made for it, outside the working folder too, and never one that was there
    (an empty folder you made and named). The default run dir is noted where it is claimed."""

    def on_run_start(self, config: DictConfig, **kwargs: object) -> None:
        written = OmegaConf.to_container(config.hydra.run)["dir"]  # as written, e.g. runs/${now:%H}: given too
        with exit_on_user_error(), said_once_per_machine():  # (Hydra makes a callback's exceptions warnings)
            refuse_empty_folder("hydra.run.dir", written, "run", "outputs/")
        if not str(written).startswith("${run_dir_for:"):  # the default's folder, run_dir_for notes it
            note_folders_there(config.hydra.run.dir)


def note_folders_there(run_dir: str | Path) -> None:
    """Before Hydra makes run_dir: the deepest of its folders there now (EXISTED_BEFORE), so that a
    run there that writes nothing takes back the folders made for it, wherever they are."""
    EXISTED_BEFORE[absolute(run_dir)] = deepest_existing(absolute(run_dir))


def refuse_empty_folder(key: str, written: object, kind: str, parent: str) -> None:
    """UserError for a folder given empty (hydra.run.dir=), which Hydra takes as the folder the
    command runs in: the project's own folder, as often as not. kind: run or sweep; parent: where
    a new one's folder goes when key is left out."""
    if not str(written).strip():
        raise UserError(f"{key}= is empty, which would put the {kind}'s files in the folder the command runs in; "
                        f"give a folder (or, for a new {kind}, leave {key} out: a new one under {parent})")


# Cached: the folder is claimed once for a composed config, however often Hydra reads the value.
OmegaConf.register_new_resolver("run_dir_for", run_dir_for, use_cache=True)


class ConsoleHandler(logging.StreamHandler):
    """The console's log handler (configs/hydra/job_logging/train.yaml). A console that cannot be
    written (`train.py | head`, whose reader left; `> out.txt` on a full disk) is said once, on
    stderr, and then left alone: logging's own handler prints a traceback for every line after.
    The run goes on, and train.log in its run dir keeps every line."""

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, OSError) or error.errno not in (errno.EPIPE, errno.ENOSPC, errno.EDQUOT, errno.EIO):
            super().handleError(record)  # (a stdout that is only busy for a moment, EAGAIN, is no reason to stop)
            return
        self.setLevel(logging.CRITICAL + 1)  # nothing more to the console
        with suppress(OSError):  # stderr gone as well: nowhere left to say it
            print(f"warning: the console's output could not be written ({error.strerror or error}); the run goes on, "
                  f"and train.log in its run dir keeps every line (Ctrl-C stops it, saving)", file=sys.stderr, flush=True)


class RunRecord:
    """Holds back the log's lines until write() puts them, and the config, into the run dir.
    close() without write() (a refused run, a shape walk, a rank other than 0) writes nothing,
    and takes back the empty folder made for the run."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.log_file = run_dir, None
        self.held = MemoryHandler(capacity=1_000, flushLevel=logging.CRITICAL + 1)  # flushed by write() only
        logging.getLogger().addHandler(self.held)

    def write(self, cfg: DictConfig, hydra_cfg: DictConfig, resumed: bool) -> None:
        probe = self.run_dir / f".can-write-{os.getpid()}"
        try:  # said now, before anything is written, not by TensorBoard's writer thread at its first event
            probe.touch()
            probe.unlink()
        except OSError as err:
            raise UserError(f"{os.path.relpath(self.run_dir)}: the run cannot make files in its run dir ({err.strerror}); "
                            "make it writable, or give another hydra.run.dir") from None
        record = self.run_dir / ".hydra" / (f"resumed-{time.strftime('%Y-%m-%d_%H-%M-%S')}" if resumed else "")
        record.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, record / "config.yaml")
        OmegaConf.save(OmegaConf.create({"hydra": hydra_cfg}), record / "hydra.yaml")
        OmegaConf.save(hydra_cfg.overrides.task, record / "overrides.yaml")
        self.log_file = logging.FileHandler(self.run_dir / "train.log", encoding="utf-8")
        self.log_file.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", datefmt="%H:%M:%S"))
        self.held.setTarget(self.log_file)
        self.held.flush()
        logging.getLogger().addHandler(self.log_file)
        self.stop_holding()

    def stop_holding(self) -> None:
        logging.getLogger().removeHandler(self.held)
        self.held.buffer.clear()
        self.held.close()

    def close(self) -> None:
        self.stop_holding()
        if self.log_file:
            logging.getLogger().removeHandler(self.log_file)
            self.log_file.close()
        else:
            take_back_empty_folders(self.run_dir)


def take_back_empty_folders(run_dir: Path) -> None:
    """Remove run_dir if it is empty, and its parents that are empty too, below the deepest of them
    that existed before the run (EXISTED_BEFORE; not noted: the folder the command ran in): they
    were made for this run."""
    run_dir = absolute(run_dir)
    start = EXISTED_BEFORE.pop(run_dir, None) or Path.cwd()
    for folder in [run_dir, *run_dir.parents]:
        if folder == start or not folder.is_relative_to(start):
            return
        try:
            folder.rmdir()  # only ever an empty folder
        except OSError:
            return  # not empty, or another process took it first
