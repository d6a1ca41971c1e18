"""Checkpoints: the one place that saves, finds and loads them.

A checkpoint is a plain dict that torch.load(weights_only=True) can read, so loading one
never runs code from the file:

    model          state_dict
    optimizer      state_dict
    step           optimizer updates done
    best_val_loss  the lowest val loss seen so far
    config         the run's resolved config as plain dicts (config["model"] rebuilds the net)
    tokenizer      the tokenizer's state(): sample.py needs no corpus
    run_state      what an exact resume needs besides: RNG states, where in the step the
                   loop stopped, the open log window (training/state.py, training/run_state.py)

A save goes to a temporary file, is fsynced, then renamed into place: a crash mid-save
leaves the previous file intact.
"""

import os
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import nn

from data.tokenizer import Tokenizer, tokenizer_from_state
from model import GPT
from training.config import build_model
from user_error import UserError

LAST, BEST = "ckpt_last.pt", "ckpt_best.pt"
AUTO = "auto"  # resume=auto: the run in hydra.run.dir if it saved one, else a new run there
RUN_ROOTS = ("outputs", "multirun")  # where "latest" looks, relative to the working folder


def save_checkpoint(
    path: Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    best_val_loss: float,
    config: dict[str, Any],
    tokenizer: Tokenizer,
    run_state: dict[str, Any],
) -> None:
    checkpoint = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "best_val_loss": best_val_loss,
        "config": config,
        "tokenizer": tokenizer.state(),
        "run_state": run_state,
    }
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            writer = WriteErrorKeeper(f)
            try:
                torch.save(checkpoint, writer)
            except RuntimeError:
                if writer.error is None:
                    raise
                raise writer.error from None
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:  # a full disk, a file size limit, a folder gone read-only
        tmp.unlink(missing_ok=True)
        kept = f"the previous {path.name} is kept" if path.exists() else f"no {path.name} was written"
        raise UserError(f"could not save {os.path.relpath(path)} ({err.strerror or err}); {kept}. Free some disk space and resume") from None


class WriteErrorKeeper:
    """A file's write() that keeps the OSError it raised: torch.save swallows it and then fails
    with an unrelated RuntimeError ("unexpected pos"), which would hide a full disk."""

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.error = file, None

    def write(self, data: bytes) -> int:
        try:
            return self.file.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        self.file.flush()


def resolve_checkpoint(run: str) -> Path:
    """A checkpoint file as given; in a run dir its ckpt_best.pt (else ckpt_last.pt);
    "latest" is the run dir under outputs/ and multirun/ whose checkpoint was written last."""
    if run == "latest":
        found = [p for root in RUN_ROOTS for name in (BEST, LAST) for p in Path(root).glob(f"**/{name}")]
        if not found:
            raise UserError("run=latest found no checkpoint under outputs/ or multirun/; train one first (make train)")
        newest_dir = max(found, key=lambda p: p.stat().st_mtime).parent
        return resolve_checkpoint(str(newest_dir))
    path = Path(run).expanduser()
    if path.is_dir():
        for name in (BEST, LAST):
            if (path / name).is_file():
                return path / name
        raise UserError(f"run={run} has no {BEST} or {LAST}; point run= at a training run dir or a .pt file")
    if not path.is_file():
        raise UserError(f"run={run} does not exist; give a run dir (e.g. outputs/<date>/<time>), a .pt file, or latest")
    return path


def checkpoint_to_resume(resume: str | None, run_dir: Path, restarted: bool) -> Path | None:
    """The checkpoint a run goes on from; None: a new run. With resume=auto, and in processes
    torchrun restarted, it is the run dir's ckpt_last.pt (the run's latest) if there is one."""
    if (resume == AUTO or restarted) and (run_dir / LAST).is_file():
        return run_dir / LAST
    if resume in (None, AUTO):
        return None
    return resolve_resume(resume)


def resolve_resume(resume: str) -> Path:
    path = Path(resume).expanduser()
    if path.is_dir():
        if not (path / LAST).is_file():
            raise UserError(f"resume={resume} has no {LAST}; give the run dir of a run that saved one, or a .pt file")
        return path / LAST
    if not path.is_file():
        raise UserError(f"resume={resume} does not exist; give a run dir (e.g. outputs/<date>/<time>) or a .pt file")
    return path


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except PermissionError as err:  # the file is there, but not for us to read
        raise UserError(f"could not read {path} ({err.strerror or err})") from None
    except Exception as err:  # a broken file fails in many ways (zip, unpickler, storage): all mean the same
        if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; PyTorch's own words would mislead
            raise UserError(f"{path} is not a readable checkpoint (not a zip file, as torch.save writes); "
                            "it may be truncated or not a checkpoint") from None
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        if len(first_line) > 120:
            first_line = first_line[:120].rsplit(" ", 1)[0] + " ..."
        detail = f"{type(err).__name__}: {first_line}" if first_line else type(err).__name__
        raise UserError(f"{path} is not a readable checkpoint ({detail}); it may be truncated or not a checkpoint") from None
    required = ("model", "config", "tokenizer", "step")
    if not isinstance(checkpoint, dict) or any(key not in checkpoint for key in required):
        raise UserError(f"{path} is not a checkpoint of this project (it lacks {', '.join(required)})")
    return checkpoint


def model_from_checkpoint(checkpoint: dict[str, Any]) -> tuple[GPT, Tokenizer]:
    cache_dir = Path(checkpoint["config"].get("data", {}).get("cache_dir", ".cache"))  # gpt2's files live there
    tokenizer = tokenizer_from_state(checkpoint["tokenizer"], cache_dir)
    model = build_model(checkpoint["config"]["model"], tokenizer.vocab_size)
    load_weights(model, checkpoint["model"])
    return model, tokenizer


def load_weights(model: GPT, weights: dict[str, torch.Tensor]) -> None:
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:
        detail = str(err).strip().splitlines()[1].strip() if len(str(err).strip().splitlines()) > 1 else "shapes differ"
        raise UserError(f"the checkpoint's weights do not fit the model its config describes ({detail})") from None
