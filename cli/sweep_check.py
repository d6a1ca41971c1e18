"""A sweep's jobs, checked before anything of the sweep is written or trained: a Hydra callback
(configs/train.yaml, hydra.callbacks), called before Hydra's sweeper starts. The sweeper composes
every job's config too, but after it has made the sweep's folder, and the project's own range
checks (validate_train_config) run inside each job, where a bad value in the third job would stop
the sweep after two whole trainings. Here each job's config is composed as the sweeper composes
it, and checked, first; and a sweep under torchrun (one run of several processes) is refused."""

import itertools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from model_io.run_files import AUTO, BEST, LAST, checkpoint_to_resume, newest_checkpoint
from user_error import UserError, as_typed, command_argument


def job_overrides(task_overrides: list[str], params: dict | None = None) -> list[list[str]]:
    """Each job's overrides, in the order Hydra's basic sweeper runs them: every combination of the
    swept values (model.n_head=2,4 train.batch_size=8,16: four jobs). params: hydra.sweeper.params,
    the sweep a config file gives, which the sweeper puts before the command line's."""
    each: dict[str, list[str]] = {}  # a key given twice: its last values, in its first place (as Hydra does)
    swept = [f"{key}={value}" for key, value in (params or {}).items()] + task_overrides
    for override in OverridesParser.create().parse_overrides(swept):
        key = override.get_key_element()
        each[key] = ([f"{key}={value}" for value in override.sweep_string_iterator()] if override.is_sweep_override()
                     else [f"{key}={override.get_value_element_as_str()}"])
    return [list(job) for job in itertools.product(*each.values())]


class SweepCheck(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Before the sweep writes anything: the first job whose config fails a check is one line
        and exit status 2. (Hydra turns a callback's exceptions into warnings, but not an exit.)"""
        # Here, not at the top: they import torch, which a callback's import should not.
        from cli.errors import exit_on_user_error
        from cli.run_dir import note_folders_there, refuse_empty_folder
        from runtime.ranks import env_world_size, said_once_per_machine

        loader = GlobalHydra.instance().hydra.config_loader  # the one Hydra's sweeper composes each job with
        # A config Hydra would refuse (a value of the wrong type) is one line too; under torchrun,
        # said by one process of each machine.
        with exit_on_user_error(), said_once_per_machine():
            if env_world_size() > 1:
                raise UserError("a sweep (-m) cannot run under torchrun; start one torchrun per configuration instead")
            refuse_empty_folder("hydra.sweep.dir", OmegaConf.to_container(config.hydra.sweep)["dir"], "sweep", "multirun/")
            try:
                jobs = job_overrides(list(config.hydra.overrides.task), config.hydra.sweeper.get("params"))
            except Exception:  # a sweep this cannot expand (a glob over config files): each job checks its own
                return
            values: dict[str, set[str]] = {}
            for override in itertools.chain(*jobs):
                values.setdefault(override.split("=", 1)[0], set()).add(override)
            swept = {key for key, given in values.items() if len(given) > 1}  # the keys the sweep gives several values
            by_number = OmegaConf.to_container(config.hydra.sweep)["subdir"] == "${hydra.job.num}"  # Hydra's default, unresolved
            sweep_dir = Path(config.hydra.sweep.dir)  # the runs of a sweep there before:
            held = sorted({*sweep_dir.glob(f"**/{LAST}"), *sweep_dir.glob(f"**/{BEST}")})
            named = any(override.split("=", 1)[0] == "hydra.sweep.dir" for override in config.hydra.overrides.hydra)
            if by_number:  # a job refused as it starts takes back its folder, outside the working folder too
                for number in range(len(jobs)):
                    note_folders_there(sweep_dir / str(number))
            resolved: dict[str, Path] = {}  # each init_from's folder
            for number, job in enumerate(jobs):
                cfg = loader.load_sweep_config(config, job)  # as the sweeper checks each job, before it writes
                if cfg.resume == AUTO and not named:  # as cli/run_dir.py refuses it a single run
                    raise UserError("resume=auto in a sweep goes on with the runs in hydra.sweep.dir, a new folder each "
                                    "time unless you name it: add hydra.sweep.dir=<folder>, the same folder every time; "
                                    "no job has run")
                if held and cfg.resume != AUTO:  # a new run, or one going on from another checkpoint, would overwrite them
                    raise UserError(f"hydra.sweep.dir={config.hydra.sweep.dir} already holds runs ({held[0]}, ...), "
                                    "which the sweep's new runs would overwrite; give the sweep another hydra.sweep.dir, "
                                    "or add resume=auto to go on with them; no job has run")
                if cfg.resume == AUTO and by_number:  # job n goes on with <dir>/n
                    check_same_values(number, job, swept, cfg, sweep_dir / str(number) / LAST)
                try:
                    check_job(cfg, job, sweep_dir / str(number) if by_number else None, resolved)
                except UserError as error:
                    raise UserError(f"job #{number} of the sweep ({' '.join(job)}): {error}; no job has run") from None


def check_job(cfg: DictConfig, job: list[str], run_dir: Path | None, resolved: dict[str, Path]) -> None:
    """The checks train.py makes of a job's config as the job starts (checked_run_config), made
    before the first job runs: UserError for the first that fails. run_dir: the job's own folder,
    None where hydra.sweep.subdir is not the job's number (a job going on from a checkpoint is then
    checked when it starts). resolved: each init_from's folder, found once for the whole sweep (a
    Hub id asks the Hub). What only the job's start can tell is said then: a text's contents, a
    run already at its train.max_steps, a checkpoint that holds no run state."""
    from cli.config import checked_run_config
    from data.corpus import corpus_files
    from model_io.hf_models import resolve_pretrained

    saved, text_hashed, folder = None, False, None
    if cfg.resume:
        if run_dir is None:
            return
        if (source := checkpoint_to_resume(cfg.resume, run_dir, restarted=False)) is not None:  # None: auto, no run yet
            if (found := saved_config(source)) is None:
                return
            saved, text_hashed = found
    if cfg.init_from and saved is None:  # the weights' shape and tokenizer, as the job takes them (config.json alone)
        if cfg.init_from not in resolved:
            resolved[cfg.init_from] = resolve_pretrained(cfg.init_from)
        folder = resolved[cfg.init_from]
    checked, _, _ = checked_run_config(cfg, job, saved, text_hashed, folder)
    # The files it would read: one missing is said now, not after the jobs before it (a resumed run's
    # own text, where it moved, checked_run_config has said).
    if checked.data.source == "text" and (saved is None or checked.data.path != saved.get("data", {}).get("path")):
        corpus_files(checked.data.path)


def saved_config(source: Path) -> tuple[dict[str, Any], bool] | None:
    """The config of the run saved in source, as Checkpoint.load upgrades it, and whether it keeps
    its text's hash; None for a file train.py did not save (Checkpoint.load names what is wrong as
    the job starts). Its weights are mapped, not read."""
    from model_io.checkpoint import Checkpoint, read_file, upgrade

    saved = read_file(source, "cpu", mmap=True)
    try:
        config = upgrade(Checkpoint(model={}, config=saved["config"], tokenizer={})).config
        return config, bool((saved.get("run_state") or {}).get("text_key"))
    except (AttributeError, KeyError, TypeError):
        return None


def check_same_values(number: int, job: list[str], swept: set[str], cfg: DictConfig, last: Path) -> None:
    """resume=auto takes job n's run by its number: refused where that run trained with another of
    the swept values (the values given in another order, or a new one among them), which the
    resumed run would otherwise take silently as a change of its settings."""
    from cli.config import changes_setting, plain
    from model_io.checkpoint import read_file  # torch: only for a sweep that goes on

    if not last.is_file():
        return
    saved = read_file(last, "cpu", mmap=True)
    trained = OmegaConf.create(saved.get("config", {}) if isinstance(saved, dict) else {})
    for key in sorted(swept):
        old, new = plain(OmegaConf.select(trained, key)), plain(OmegaConf.select(cfg, key))
        if changes_setting(key, new, old):
            shown = " ".join(override for override in job if override.split("=", 1)[0] in swept)  # its swept values
            raise UserError(f"job #{number} of the sweep ({shown}) would go on with {last.parent}, which trained "
                            f"with {key}={as_typed(old)}: resume=auto takes each job's run by its number, so give the "
                            "swept values as the first sweep had them; no job has run")


def sweep_job(hydra_config: DictConfig) -> str | None:
    """How a job of a sweep (-m) names itself: 'job #1 of the sweep (top_k=5 seed=2)', its number
    and its overrides; None in a run of its own."""
    if hydra_config.mode != RunMode.MULTIRUN:
        return None
    return f"job #{hydra_config.job.num} of the sweep ({' '.join(hydra_config.overrides.task)})"


@contextmanager
def said_as_its_job(hydra_config: DictConfig, resume: str | None = None, trains: bool = True) -> Iterator[None]:
    """A job of a sweep (-m) that stops on a UserError the checks above could not foresee (a corpus too
    short for its block_size, a loss gone nan; sample.py's top_k over the vocabulary) says which job
    it was and what ran: the sweep stops there. A training job that saved nothing, where the sweep
    starts afresh or goes on by itself (resume null or auto), says how to go on: resume=auto finds the
    jobs that ran and starts the others. So does a training job stopped by a signal (Ctrl-C), which
    saved its run (training/fit.py says how to go on with that job alone) and ends the sweep."""
    goes_on_by_itself = trains and resume in (None, AUTO)  # resume=auto would find the jobs that ran
    try:
        yield
    except SystemExit as stop:
        signalled = isinstance(stop.code, int) and stop.code > 128  # 128 + the signal's number
        if signalled and goes_on_by_itself and (job := sweep_job(hydra_config)) is not None:
            before, again = jobs_before_and_again(hydra_config)
            logging.getLogger("train").info(f"{job} was stopped, and the sweep with it ({before} ran before it): to go "
                                            f"on with every job, run the same -m command again with {again}")
        raise
    except UserError as error:
        if (job := sweep_job(hydra_config)) is None:
            raise
        before, again = jobs_before_and_again(hydra_config)
        ran = "no job had run" if before == "no job" else f"{before} ran"
        saved = newest_checkpoint(Path(hydra_config.runtime.output_dir)) is not None
        go_on = f": fix its values, then run the sweep again with {again} (what ran is kept)" if goes_on_by_itself and not saved else ""
        raise UserError(f"{job}: {error}; {ran}, the rest did not{go_on}") from None


def jobs_before_and_again(hydra_config: DictConfig) -> tuple[str, str]:
    """A sweep's job: the jobs before it ('no job', 'job #0', 'jobs #0 to #2'), and the options that
    run the sweep again going on with what ran (resume=auto hydra.sweep.dir=<its folder>)."""
    number = hydra_config.job.num
    before = {0: "no job", 1: "job #0"}.get(number, f"jobs #0 to #{number - 1}")
    return before, f"resume=auto {command_argument('hydra.sweep.dir', str(hydra_config.sweep.dir))}"
