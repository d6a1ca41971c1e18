"""The folder of a run TensorBoard names, and what the tab reads there without loading a model:
kept apart from live_model.py (torch), so that listing the runs does not import torch."""

import os
from pathlib import Path

import yaml
from tensorboard.backend.event_processing.data_ingester import _parse_event_files_spec

from model_io.run_files import RUN_CONFIG, kept_checkpoints
from user_error import UserError, quoted


def logdir_roots(logdir: str, logdir_spec: str) -> dict[str, str | None]:
    """{folder: the name its runs are prefixed with, or None}, as TensorBoard reads --logdir or
    --logdir_spec (its own parser: the run names then match the ones it lists)."""
    if logdir:
        return {os.path.expanduser(logdir): None}
    return _parse_event_files_spec(logdir_spec or None)


def run_folder(run: str, roots: dict[str, str | None]) -> Path:
    """The folder of a run TensorBoard lists, inside one of the roots; never a folder outside
    them, whatever the name holds ("..", an absolute path, a link out)."""
    for root, prefix in roots.items():
        if "://" in root:
            continue  # gs:// and the like: the tab loads checkpoints from local folders only
        if prefix is None:
            relative = run
        elif run == prefix or run.startswith(prefix + "/"):
            relative = run[len(prefix) + 1:] or "."
        else:
            continue
        folder = os.path.realpath(os.path.join(root, relative))
        if is_inside(folder, root) and os.path.isdir(folder):
            return Path(folder)
    raise UserError(f"run {quoted(run)} is not a folder under TensorBoard's logdir")


def is_inside(path: str, root: str) -> bool:
    root = os.path.realpath(root)
    return os.path.commonpath([os.path.realpath(path), root]) == root


def init_from(folder: Path) -> str | None:
    """The pretrained weights a run started from (init_from in the config Hydra saved), or None."""
    try:
        config = yaml.safe_load((folder / RUN_CONFIG).read_text())
    except (OSError, yaml.YAMLError):
        return None  # not a run train.py made, or its config is unreadable: nothing says it was pretrained
    return config.get("init_from") if isinstance(config, dict) else None


def kept_checkpoint_steps(folder: Path) -> list[int]:
    """The steps at which the run kept a model-only checkpoint (train.keep_checkpoints)."""
    return list(kept_checkpoints(folder))
