"""Train a small GPT: config -> data -> model -> loop, logging to TensorBoard as it learns.

    python train.py                                   the defaults in configs/
    python train.py model.n_head=8 optim.lr=3e-3      any config value
    python train.py data=text data.path=book.txt      your own text
    python train.py -m model.n_head=1,2,4             a sweep: one run dir per value
    torchrun --standalone --nproc_per_node=4 train.py one run on 4 processes (GPUs), see
                                                      training/distributed.py

The run dir (outputs/<date>/<time>, or multirun/<date>/<time>/<n> in a sweep) receives
.hydra/ (the resolved config), train.log, TensorBoard event files, ckpt_last.pt and
ckpt_best.pt. Watch it with `tensorboard --logdir outputs`; sample from it with
`python sample.py run=<run dir>`.
"""

import gc
import logging
import math
import os
import shutil
import tempfile
from pathlib import Path

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from data.dataset import TokenData, get_batch
from data.errors import DataError
from model import GPT
from training.checkpoint import load_checkpoint, resolve_resume
from training.config import resumed_config, validate_train_config
from training.distributed import Ranks, env_rank, env_world_size, leave_process_group, lost_contact
from training.errors import UserError, exit_on_user_error, run_cli, said_once_per_machine
from training.fit import Figures, fit
from training.run import Run, build_data_and_model, build_run, describe, restore
from training.shape_trace import trace_shapes
from training.state import TrainState

log = logging.getLogger("train")


def run_dir_for(resume: str | None, fresh_dir: str) -> str:
    """hydra.run.dir: a resumed run goes on in its own folder, a new one gets fresh_dir.
    Under torchrun only rank 0 writes the run; the others get a scratch folder Hydra can use."""
    if env_rank() > 0:
        return scratch_dir_of_rank()
    return str(resolve_resume(resume).parent) if resume else fresh_dir


def config_subdir_for(resume: str | None, stamp: str) -> str | None:
    """hydra.output_subdir: a resumed run records its config beside the original one.
    Ranks other than 0 record nothing (None)."""
    if env_rank() > 0:
        return None
    return f".hydra/resumed-{stamp}" if resume else ".hydra"


def scratch_dir_of_rank() -> str:
    return os.path.join(tempfile.gettempdir(), f"tinyattn-rank{env_rank()}-{os.getpid()}")


OmegaConf.register_new_resolver("run_dir_for", run_dir_for)
OmegaConf.register_new_resolver("config_subdir_for", config_subdir_for)


@hydra.main(config_path=str(Path(__file__).resolve().parent / "configs"), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    if env_rank() > 0:
        quiet_other_rank()
    hydra_cfg = HydraConfig.get()
    with exit_on_user_error():
        try:
            best_val_loss = train(cfg, Path(hydra_cfg.runtime.output_dir), hydra_cfg.overrides.task,
                                  sweep=hydra_cfg.mode == RunMode.MULTIRUN, record=hydra_cfg.output_subdir)
            # DistributedDataParallel holds the process group from inside reference cycles: free
            # it now, or it goes only as Python shuts down, when Gloo's threads can no longer stop
            # cleanly (a rare "terminate called without an active exception" after a finished run).
            gc.collect()
            return best_val_loss
        except (UserError, DataError):
            if env_rank() == 0:  # the other ranks have no record to take back
                forget_refused_run(Path(hydra_cfg.runtime.output_dir), hydra_cfg.output_subdir)
            raise
        except torch._dynamo.exc.BackendCompilerFailed as error:  # only train.compile=true gets here
            reason = str(error).strip().splitlines()[0]
            raise UserError(f"train.compile=true: torch.compile could not build the model ({reason}); "
                            "run with train.compile=false") from None
        except RuntimeError as error:
            if not lost_contact(error):
                raise
            raise UserError(f"rank {env_rank()} lost contact with the other processes: one of them stopped "
                            "(its own message says why)") from None
        finally:
            leave_process_group()
            if env_rank() > 0:
                shutil.rmtree(scratch_dir_of_rank(), ignore_errors=True)


def quiet_other_rank() -> None:
    """Ranks other than 0 print errors only, and write no log file (rank 0 logs for all)."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(logging.ERROR)


def forget_refused_run(run_dir: Path, record: str) -> None:
    """Hydra writes the config record (.hydra/, or .hydra/resumed-<time>/ on resume) and a log
    before train() can check anything. When the run was refused (or only traced its shapes)
    before it trained a step, take back that record, and a new run dir left with nothing else."""
    config_file = run_dir / record / "config.yaml"
    if not config_file.is_file():
        return
    if any(events.stat().st_mtime_ns >= config_file.stat().st_mtime_ns for events in run_dir.glob("events.out.*")):
        return  # it did train: keep the record of how
    shutil.rmtree(run_dir / record)
    if {path.name for path in run_dir.iterdir()} <= {"train.log"}:
        shutil.rmtree(run_dir)
        if run_dir.parent.name != "outputs" and not any(run_dir.parent.iterdir()):
            run_dir.parent.rmdir()  # outputs/<date>/, when this was its only run


def train(cfg: DictConfig, run_dir: Path, overrides: list[str], sweep: bool = False, record: str | None = None) -> float:
    """One training run in run_dir; returns the best val loss (what a sweeper would minimise).
    overrides: the command line's (a resumed run takes the allowed ones); sweep: part of a -m
    sweep; record: the run's config record in run_dir (.hydra), taken back by debug=shapes."""
    cfg, checkpoint = checked_config(cfg, run_dir, overrides, sweep)
    ranks, precision, data, model = build_data_and_model(cfg)
    if cfg.debug == "shapes":  # the shape walk of this model instead of a run
        show_shapes(cfg, ranks, data, model)
        if ranks.is_main and record:
            forget_refused_run(run_dir, record)
        return math.nan
    run = build_run(cfg, run_dir, ranks, precision, data, model)
    describe(run)
    state = restore(run, checkpoint) if checkpoint else TrainState()
    figures = fit(run, state)
    report(run, figures)
    return figures.best_val_loss


def checked_config(cfg: DictConfig, run_dir: Path, overrides: list[str], sweep: bool) -> tuple[DictConfig, dict | None]:
    """The run's config, checked, and the checkpoint it resumes from (None for a new run).
    These checks read the config alone: every process would fail them alike."""
    checkpoint = None
    with said_once_per_machine():
        if cfg.resume:
            checkpoint = load_checkpoint(resolve_resume(cfg.resume))
            cfg, changes = resumed_config(cfg, checkpoint["config"], overrides)
            if "run_state" not in checkpoint:
                raise UserError(f"resume={cfg.resume}: this checkpoint lacks what an exact resume needs (it was "
                                "saved by an older version); start a new run, or sample from it")
        validate_train_config(cfg)
        if checkpoint and checkpoint["step"] >= cfg.train.max_steps:
            raise UserError(f"resume={cfg.resume}: the run is already at step {checkpoint['step']}, and "
                            f"train.max_steps={cfg.train.max_steps}; give a larger train.max_steps to train on")
        if sweep and env_world_size() > 1:
            raise UserError("a sweep (-m) cannot run under torchrun; start one torchrun per configuration instead")
    if checkpoint:
        log.info(f"resuming {os.path.relpath(run_dir)} at step {checkpoint['step']}" + "".join(f"; {c}" for c in changes))
    return cfg, checkpoint


def show_shapes(cfg: DictConfig, ranks: Ranks, data: TokenData, model: GPT) -> None:
    x, y = get_batch(data.train, 2, cfg.model.block_size, np.random.default_rng(cfg.train.seed))  # (2, T) each
    if ranks.is_main:
        print("\n".join(trace_shapes(model, x.to(ranks.device), y.to(ranks.device))))


def report(run: Run, figures: Figures) -> None:
    if figures.skipped:
        log.info(f"warning: {figures.skipped} of {run.cfg.train.max_steps} batches were skipped for a non-finite "
                 "loss or gradient")
    shown = run.shown_dir
    log.info(f"done: best val loss {figures.best_val_loss:.4f}; checkpoints, logs and TensorBoard events in {shown}")
    log.info(f"  watch:  .venv/bin/tensorboard --logdir {os.path.dirname(shown) or '.'}")
    log.info(f"  sample: .venv/bin/python sample.py run={shown} prompt='Once upon a time'")


if __name__ == "__main__":
    run_cli(main)
