"""Train a small GPT: config -> data -> model -> loop, logging to TensorBoard as it learns.

    python train.py                                   the defaults in configs/
    python train.py model.n_head=8 optim.lr=3e-3      any config value
    python train.py data=text data.path=book.txt      your own text
    python train.py -m model.n_head=1,2,4             a sweep: one run dir per value
    torchrun --standalone --nproc_per_node=4 train.py one run on 4 processes (GPUs), see
                                                      runtime/ranks.py
    python train.py resume=outputs/<date>/<time>      go on where a run stopped; resume=auto with a
                                                      fixed hydra.run.dir, and torchrun's restarts:
                                                      docs/resume.md

The run dir (outputs/<date>/<time>, <time>_2 for a second run started in the same second, or
multirun/<date>/<time>/<n> in a sweep) receives
.hydra/ (the config as composed), train.log, TensorBoard event files, ckpt_last.pt and
ckpt_best.pt (and checkpoints/ with train.keep_checkpoints); a run refused at its checks writes nothing.
Watch it with `make tensorboard`; sample from it with `python sample.py run=<run dir>`.
"""

import gc
import logging
import math
import os
import shlex
import sys
from pathlib import Path

from runtime.startup import Starting
from user_error import UserError, command_argument, not_installed

try:  # what make setup installs into .venv: another python gets one line, not a traceback
    starting = Starting()  # Ctrl-C while importing is one line too, and no garbage is collected (runtime/startup.py)
    import hydra
    import numpy as np
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig
except ModuleNotFoundError as missing:
    sys.exit(not_installed(missing, "train.py"))

from cli.config import checked_run_config, plain_config
from cli.errors import compile_failure, exit_on_user_error, run_cli
from cli.run_dir import RunRecord
from cli.run_spec import run_spec
from cli.sweep_check import said_as_its_job
from data.batches import get_batch
from data.token_cache import TokenData
from data.tokenizer import Tokenizer, encoded_if_writable
from inspection.shape_trace import trace_shapes
from model import GPT
from model_io.checkpoint import Checkpoint
from model_io.run_files import AUTO, LAST, checkpoint_to_resume
from runtime.devices import is_out_of_memory
from runtime.ranks import (
    Ranks,
    ended_by_sigterm,
    env_rank,
    env_world_size,
    leave_process_group,
    lost_contact,
    lost_contact_said,
    restart_count,
    said_once_per_machine,
)
from training.build import Run, build_data_and_model, build_run, describe, ran_out_of_memory, restore
from training.data_parallel import forget_dtensor_shardings
from training.fit import Figures, fit
from training.specs import RunSpec
from training.state import RunState, TrainState

starting.done()  # Ctrl-C raises KeyboardInterrupt again; the collector runs over what is made from here

log = logging.getLogger("train")


@hydra.main(config_path=str(Path(__file__).resolve().parent / "configs"), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    if env_rank() > 0:
        logging.getLogger().setLevel(logging.ERROR)  # errors only: rank 0 logs for all
    try:
        # ended_by_sigterm: torchrun stopping this process (another one failed) leaves through train()'s
        # finally, which takes back the empty run dir Hydra made for it.
        with exit_on_user_error(), said_as_its_job(HydraConfig.get(), cfg.resume), ended_by_sigterm():
            ended = None  # a stop or an error said in one line, raised again below without its traceback
            try:
                return train(cfg, HydraConfig.get())
            except SystemExit as stop:  # stopped by a signal, the run saved (training/fit.py)
                ended = SystemExit(stop.code)
            except UserError as error:  # e.g. a checkpoint that this process alone could not save
                ended = UserError(str(error))
            except RuntimeError as error:
                if (reason := compile_failure(error)) is not None:  # only train.compile=true gets here
                    raise UserError(f"train.compile=true: torch.compile could not build the model ({reason}); "
                                    "run with train.compile=false") from None
                if not lost_contact(error):
                    raise
                lost_contact_said(env_rank())
            raise ended
    finally:
        # DistributedDataParallel holds the process group from inside reference cycles, and DTensor's
        # caches hold FSDP's device mesh, which holds it: free both, once the process has said how it
        # ended, so that leaving the group ends its threads and connections now. Left to the exit,
        # the threads now and then kept a rank of a stopped run alive until torchrun killed it 30 s
        # later; and the others, waiting for a rank that failed, heard of it only as it exited, which
        # is when torchrun stops them: too late to say why. The loop's frames, which hold the group
        # too, must be gone, as they are with a stop or an error raised again above (an error with a
        # traceback keeps them to the exit). One process has no group.
        if env_world_size() > 1:
            forget_dtensor_shardings()
            gc.collect()
        leave_process_group()


def train(cfg: DictConfig, hydra_cfg: DictConfig) -> float:
    """One training run in Hydra's run dir; returns the best val loss (what a sweeper would minimise).
    The run's record goes into the run dir once the config and the data have passed their checks."""
    run_dir = Path(hydra_cfg.runtime.output_dir)
    record = RunRecord(run_dir)
    try:
        spec, config, checkpoint = checked_config(cfg, run_dir, hydra_cfg.overrides.task)
        if finished(spec, checkpoint):  # resume=auto, or a restart, found nothing left to do
            return checkpoint.best_val_loss
        ranks, precision, data, model = build_data_and_model(spec)
        if checkpoint is not None:
            check_same_tokenizer(data.tokenizer, checkpoint, cfg.resume)
        if spec.debug == "shapes":  # the shape walk of this model instead of a run
            show_shapes(spec, ranks, data, model)
            return math.nan
        if ranks.is_main:
            record.write(cfg, hydra_cfg, resumed=checkpoint is not None)
        run = build_run(spec, config, run_dir, ranks, precision, data, model)
        describe(run)
        state = restore(run, checkpoint) if checkpoint else TrainState()
        try:
            figures = fit(run, state)
        except (RuntimeError, MemoryError) as error:  # torch.OutOfMemoryError is a RuntimeError
            if not is_out_of_memory(error):
                raise
            raise UserError(ran_out_of_memory(spec, ranks.device, error)) from None
        report(run, figures)
        return figures.best_val_loss
    finally:
        record.close()


def checked_config(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> tuple[RunSpec, dict, Checkpoint | None]:
    """The run's spec and config (as plain values: what its checkpoints and TensorBoard keep),
    checked, and the checkpoint it resumes from (None for a new run). These checks read the
    config and the run dir alone: every process would fail them alike."""
    checkpoint, changes, weights, text_key = None, [], None, None
    restarted = restart_count() > 0  # by torchrun, after a process failed: go on from the run's last checkpoint
    with said_once_per_machine():
        if source := checkpoint_to_resume(cfg.resume, run_dir, restarted):
            checkpoint = Checkpoint.load(source)
            if checkpoint.run_state is None:
                raise UserError(f"resume={cfg.resume}: this checkpoint holds the model alone, without what an exact "
                                "resume needs (a file of train.keep_checkpoints, or one an older version saved); resume "
                                "from its run dir (the run's ckpt_last.pt), or sample from it")
            if checkpoint.optimizer is None:
                raise UserError(f"resume={cfg.resume}: this checkpoint holds no optimizer state, which an exact resume "
                                "needs; resume from a checkpoint train.py saved, as it saved it")
            text_key = RunState.from_dict(checkpoint.run_state).text_key  # checked now, before the run dir is written to
        cfg, changes, weights = checked_run_config(cfg, overrides, checkpoint.config if checkpoint else None, bool(text_key))
        spec = run_spec(cfg, weights, text_key)
        if finished(spec, checkpoint) and cfg.resume != AUTO and not restarted:  # resume=<run> asks for more steps
            raise UserError(f"resume={cfg.resume}: the run is already at step {checkpoint.step}, and "
                            f"train.max_steps={cfg.train.max_steps}; give a larger train.max_steps to train on")
    say_where_it_starts(spec, cfg.resume, checkpoint, changes, os.path.relpath(run_dir), restarted)
    config = plain_config(cfg)
    if checkpoint is None and config["data"]["path"]:  # its checkpoints keep the text's whole path: it goes on from any folder
        config["data"]["path"] = str(Path(config["data"]["path"]).expanduser().absolute())
    return spec, config, checkpoint


def check_same_tokenizer(tokenizer: Tokenizer, checkpoint: Checkpoint, resume: str | None) -> None:
    """A resumed run's corpus is read again (its ids from the token cache; a text other than the run's is
    refused as it is read: data/token_cache.py): UserError, before the run is written to, if it gives
    another tokenizer than the run's, whose ids its weights learnt."""
    with said_once_per_machine():
        if tokenizer.state() != checkpoint.build_tokenizer().state():
            asked = f"resume={resume}" if resume else "resume"  # (a torchrun restart resumes without resume=)
            raise UserError(f"{asked}: the tokenizer the corpus gives now differs from the one this run was trained "
                            "with (the text of data.path, or the folder its tokenizer came from, changed since); give "
                            "the run its corpus as it was, or start a new run")


def finished(spec: RunSpec, checkpoint: Checkpoint | None) -> bool:
    return checkpoint is not None and checkpoint.step >= spec.loop.max_steps


def say_where_it_starts(spec: RunSpec, resume: str | None, checkpoint: Checkpoint | None, changes: list[str],
                        shown_dir: str, restarted: bool) -> None:
    if restarted:
        log.info(f"torchrun restarted the processes (restart {restart_count()} of "
                 f"{os.environ.get('TORCHELASTIC_MAX_RESTARTS', '?')})")
    if finished(spec, checkpoint):
        log.info(f"{shown_dir} finished at step {checkpoint.step} (train.max_steps={spec.loop.max_steps}); nothing to train")
    elif checkpoint:
        log.info(f"resuming {shown_dir} at step {checkpoint.step}" + "".join(f"; {c}" for c in changes))
    elif resume == AUTO or restarted:
        log.info(f"no {LAST} in {shown_dir} yet: a new run there")
    if spec.start.weights:
        log.info(f"init_from={spec.start.init_from}: weights, shape and tokenizer from {spec.start.weights}"
                 + "".join(f"; {note}" for note in changes))


def show_shapes(spec: RunSpec, ranks: Ranks, data: TokenData, model: GPT) -> None:
    x, y = get_batch(data.train, 2, spec.model.block_size, np.random.default_rng(spec.loop.seed))  # (2, T) each
    if ranks.is_main:
        print("\n".join(trace_shapes(model, x.to(ranks.device), y.to(ranks.device))))


def report(run: Run, figures: Figures) -> None:
    if figures.skipped and run.precision.scaler.is_enabled():
        log.info(f"note: {figures.skipped} of {run.spec.loop.max_steps} updates were skipped for an fp16 gradient "
                 "overflow, each halving the loss scale (a few while it finds its level are normal)")
    elif figures.skipped:
        log.info(f"warning: {figures.skipped} of {run.spec.loop.max_steps} batches were skipped for a non-finite "
                 "loss or gradient")
    shown = run.shown_dir
    recalled = ""
    if figures.recall is not None and "name" in figures.recall[1]:  # the stories' names, the default run's headline
        step, accuracy = figures.recall
        recalled = f", name recall {accuracy['name']:.1%} at step {step}"
    log.info(f"done: best val loss {figures.best_val_loss:.4f}{recalled}; checkpoints, logs and TensorBoard events in {shown}")
    log.info(f"  watch:  .venv/bin/tensorboard --logdir {shlex.quote(os.path.dirname(shown) or '.')}")  # to paste, spaces too
    example = "Once upon a time"  # unless a character tokenizer's corpus lacks one of its letters
    prompt = f" prompt='{example}'" if encoded_if_writable(run.data.tokenizer, example) else ""
    log.info(f"  sample: .venv/bin/python sample.py {command_argument('run', shown)}{prompt}")


if __name__ == "__main__":
    run_cli(main)
    # The run is over, saved and closed (an error exits above): spare the exit a last garbage
    # collection over all of torch's modules, a second or more for every process.
    gc.freeze()
