"""A sweep's values, checked before its first job trains: a Hydra callback (configs/train.yaml,
hydra.callbacks). Hydra itself composes every job's config before the first one runs, so a
misspelt key or a value of the wrong type stops a sweep at once; the project's own range checks
(validate_train_config) run inside each job, where a bad value in the third job would stop the
sweep after two whole trainings. Here every job's config gets those checks first."""

import itertools
from typing import Any

from hydra import compose
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from user_error import UserError


def job_overrides(task_overrides: list[str]) -> list[list[str]]:
    """Each job's overrides, in the order Hydra's basic sweeper runs them: every combination of the
    swept values (model.n_head=2,4 train.batch_size=8,16: four jobs)."""
    each = [[f"{override.get_key_element()}={value}" for value in override.sweep_string_iterator()]
            if override.is_sweep_override() else [f"{override.get_key_element()}={override.get_value_element_as_str()}"]
            for override in OverridesParser.create().parse_overrides(task_overrides)]
    return [list(job) for job in itertools.product(*each)]


class SweepCheck(Callback):
    def on_multirun_start(self, config: DictConfig, config_name: str | None = None, **kwargs: Any) -> None:
        """Before the sweep writes anything: the first job whose config fails a check is one line
        and exit status 2. (Hydra turns a callback's exceptions into warnings, but not an exit.)"""
        from cli.config import validate_train_config  # here: it imports torch, which a callback's import should not
        from cli.errors import exit_on_user_error

        try:
            jobs = job_overrides(list(config.hydra.overrides.task))
        except Exception:  # a sweep this cannot expand (a glob over config files): each job checks its own
            return
        with exit_on_user_error():  # a config Hydra refuses (a value of the wrong type) is one line too
            for number, job in enumerate(jobs):
                cfg = compose(config_name=config_name, overrides=job)
                if cfg.resume or cfg.init_from:  # checked with the files they name, when the job starts
                    continue
                try:
                    validate_train_config(cfg)
                except UserError as error:
                    raise UserError(f"job #{number} of the sweep ({' '.join(job)}): {error}; no job has run") from None
