"""training/fit.py: fit() on a tiny run, in-process, and the figures it returns."""

import pytest
import torch

from cli.config import plain_config
from cli.run_spec import run_spec
from tests.helpers import read_events, tiny_config
from training.build import build_data_and_model, build_run
from training.fit import fit
from training.lr_schedule import lr_at
from training.state import TrainState


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """fit() on a tiny run, in-process: (run dir, figures)."""
    workdir = tmp_path_factory.mktemp("fit")
    cfg = tiny_config(**{"data.cache_dir": workdir / "cache", "train.max_steps": 12, "train.eval_interval": 5,
                         "train.log_interval": 1})
    spec = run_spec(cfg)
    ranks, precision, data, model = build_data_and_model(spec)
    run = build_run(spec, plain_config(cfg), workdir, ranks, precision, data, model)
    return workdir, fit(run, TrainState())


@pytest.mark.slow
def test_eval_train_false_evaluates_the_val_split_alone_to_the_same_val_loss(fitted, tmp_path):
    cfg = tiny_config(**{"data.cache_dir": fitted[0] / "cache", "train.max_steps": 12, "train.eval_interval": 5,
                         "train.log_interval": 1, "train.eval_train": False})
    spec = run_spec(cfg)
    ranks, precision, data, model = build_data_and_model(spec)
    figures = fit(build_run(spec, plain_config(cfg), tmp_path, ranks, precision, data, model), TrainState())
    assert [sorted(e) for e in figures.evaluations] == [["step", "val"]] * 4
    assert [e["val"] for e in figures.evaluations] == [e["val"] for e in fitted[1].evaluations]  # the same batches
    events = read_events(tmp_path)
    assert "loss/val" in events.Tags()["scalars"] and "loss/train" not in events.Tags()["scalars"]


@pytest.mark.slow
def test_fit_returns_every_evaluation_and_the_best_val_loss_it_saved(fitted):
    run_dir, figures = fitted
    assert [e["step"] for e in figures.evaluations] == [0, 5, 10, 12]  # every 5 steps, and the last
    assert figures.best_val_loss == min(e["val"] for e in figures.evaluations[1:])  # step 0 is no candidate
    assert figures.evaluations[-1]["val"] < figures.evaluations[0]["val"]
    saved = torch.load(run_dir / "ckpt_best.pt", weights_only=True)
    assert saved["best_val_loss"] == figures.best_val_loss and figures.skipped == 0
    assert torch.load(run_dir / "ckpt_last.pt", weights_only=True)["step"] == 12


@pytest.mark.slow
def test_fit_logs_each_steps_lr_loss_and_speed_as_it_returns_them(fitted):
    run_dir, figures = fitted
    events = read_events(run_dir)
    assert [e.step for e in events.Scalars("train/batch_loss")] == list(range(1, 13))  # train.log_interval=1
    assert [e.value for e in events.Scalars("train/tokens_per_sec")] == pytest.approx(figures.tokens_per_sec)
    # Update number s (logged at step s) uses the schedule's lr for s - 1: warmup, flat, decay.
    cfg = tiny_config()
    expected_lr = [lr_at(step - 1, cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps, 12, cfg.optim.schedule,
                         cfg.optim.decay_fraction) for step in range(1, 13)]
    assert [e.value for e in events.Scalars("train/lr")] == pytest.approx(expected_lr, rel=1e-6)
    assert len(set(expected_lr)) == 4  # two warmup steps, flat, decay: an update one step off would log other values


@pytest.mark.slow
def test_a_save_between_log_lines_holds_every_step_before_it_though_each_is_recorded_after_the_next(tmp_path):
    """The loop reads a step's numbers after queuing the next (StepBook), so before a job saves it
    must record the step it has not yet: the checkpoint of step 6, with log lines at 4 and 8,
    holds the losses of steps 5 and 6 for the next line. At lr 0 the weights never move, so the
    evaluation at step 8 is no better and ckpt_best.pt keeps step 6."""
    cfg = tiny_config(**{"data.cache_dir": tmp_path / "cache", "train.max_steps": 8, "train.eval_interval": 6,
                         "train.eval_at_start": False, "train.log_interval": 4, "optim.lr": 0.0, "optim.min_lr": 0.0})
    spec = run_spec(cfg)
    ranks, precision, data, model = build_data_and_model(spec)
    fit(build_run(spec, plain_config(cfg), tmp_path / "run", ranks, precision, data, model), TrainState())
    saved = torch.load(tmp_path / "run" / "ckpt_best.pt", weights_only=True)
    assert saved["step"] == 6 and saved["run_state"]["window_steps"] == 2
    losses = [e.value for e in read_events(tmp_path / "run").Scalars("train/batch_loss")]
    assert len(losses) == 2 and saved["run_state"]["window_loss"] > 0
