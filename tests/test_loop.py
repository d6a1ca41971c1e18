"""The training loop's parts, each on its own and in-process: the state, one step, when the
periodic jobs are due, the step log, and fit() with the figures it returns."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cli.config import plain_config
from data.batches import get_batch
from model import GPT, GPTConfig
from model_io.checkpoint import Checkpoint, upgrade
from runtime.precision import Precision
from runtime.ranks import Ranks
from tests.helpers import read_events, tiny_config
from training.build import build_data_and_model, build_run
from training.fit import fit
from training.jobs import Every
from training.lr_schedule import lr_at
from training.optimizer import build_optimizer
from training.saving import Checkpoints
from training.state import RunState, TrainState
from training.step import TrainStep
from user_error import UserError

ONE_PROCESS = Ranks(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def test_a_job_is_due_every_interval_and_at_the_last_step():
    every_10 = Every(10)
    assert [step for step in range(31) if every_10(step, last=False)] == [0, 10, 20, 30]
    assert every_10(17, last=True) and not every_10(17, last=False)  # the last step, whatever its number
    assert not Every(10, at_start=False)(0, last=False)  # train.eval_at_start=false
    assert not Every(0)(0, last=False) and not Every(0)(20, last=True)  # 0: off, even at the end


def test_the_last_model_is_saved_at_each_evaluation_and_every_save_interval_steps_between():
    evaluation = SimpleNamespace(due=Every(10))  # here only when it is due matters

    def saves(save_interval: int) -> list[int]:
        checkpoints = Checkpoints(evaluation, saver=None, save_interval=save_interval)
        return [step for step in range(23) if checkpoints.due(step, last=step == 22)]
    assert saves(0) == [10, 20, 22]  # the default: at evaluations only (not the one before training)
    assert saves(4) == [4, 8, 10, 12, 16, 20, 22]


def test_the_state_comes_back_from_a_checkpoint_file_as_it_was_saved(tmp_path):
    state = TrainState(step=30, best_val_loss=2.5, skipped=2, window_loss=7.5, window_steps=3)
    rng = [{"torch": torch.get_rng_state()}, {"torch": torch.get_rng_state() + 1}]  # two ranks'
    for evaluated in (True, False):
        run_state = RunState.of(state, rng, world_size=2, grad_scaler={"scale": 1024.0}, evaluated=evaluated)
        Checkpoint(model={}, config={}, tokenizer={}, step=state.step, best_val_loss=state.best_val_loss,
                   run_state=run_state.to_dict()).save(tmp_path / "ckpt.pt")
        loaded = Checkpoint.load(tmp_path / "ckpt.pt")  # weights_only, and upgrade()
        back = RunState.from_dict(loaded.run_state)
        assert back.train_state(loaded.step, loaded.best_val_loss) == TrainState(30, 2.5, 2, 7.5, 3, evaluated=evaluated)
        assert (back.world_size, back.grad_scaler, len(back.rng)) == (2, {"scale": 1024.0}, 2)
        assert torch.equal(back.rng[1]["torch"], rng[1]["torch"])


def test_the_log_window_gives_its_mean_once_and_starts_again():
    state = TrainState()
    for loss in (1.0, 2.0, 6.0):
        state.add_to_window(loss)
    assert state.take_window() == 3.0
    assert (state.window_loss, state.window_steps) == (0.0, 0)


def test_an_older_checkpoints_run_state_is_brought_up_to_date_in_one_place():
    old = {"rng": {"torch": "state"}, "evaluated": True, "skipped": 0, "window_loss": 0.0, "window_steps": 0}
    upgraded = upgrade(Checkpoint(model={}, config={}, tokenizer={}, run_state=old)).run_state
    assert upgraded["rng"] == [{"torch": "state"}]  # one RNG state per rank, as a single process saved it
    assert upgraded["world_size"] == 1 and upgraded["grad_scaler"] is None
    assert upgrade(Checkpoint(model={}, config={}, tokenizer={}, run_state=upgraded)).run_state == upgraded  # today's form stays


def tiny_step(tmp_path, skip_nonfinite=False, accum=1, batch_size=4) -> TrainStep:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16))
    tokens = np.random.default_rng(0).integers(0, 50, size=2000).astype(np.uint16)
    optimizer = build_optimizer(model, tiny_config().optim, torch.device("cpu"))
    return TrainStep(model, model, None, optimizer, Precision("fp32", torch.device("cpu")), ONE_PROCESS, tokens,
                     batch_size, 16, accum, grad_clip=1.0, skip_nonfinite=skip_nonfinite, last_checkpoint=tmp_path / "ckpt_last.pt")


def test_a_step_trains_on_the_batch_its_rng_draws_and_reports_that_batchs_loss(tmp_path):
    step = tiny_step(tmp_path)
    x, y = get_batch(step.tokens, 4, 16, np.random.default_rng(7))  # the batch the step will draw
    expected_loss = step.model(x, y)[1].item()
    before = [p.detach().clone() for p in step.model.parameters()]
    result = step(0, 1e-3, np.random.default_rng(7))
    assert result.updated and result.loss == pytest.approx(expected_loss, rel=1e-6) and result.grad_norm > 0
    assert all(group["lr"] == 1e-3 for group in step.optimizer.param_groups)
    assert any(not torch.equal(a, b) for a, b in zip(before, step.model.parameters(), strict=True))  # it did update


def test_two_micro_steps_of_2_take_the_same_step_as_one_batch_of_4(tmp_path):
    whole, halves = tiny_step(tmp_path, batch_size=4), tiny_step(tmp_path, batch_size=2, accum=2)
    whole_result, halves_result = whole(0, 1e-2, np.random.default_rng(3)), halves(0, 1e-2, np.random.default_rng(3))
    assert halves_result.loss == pytest.approx(whole_result.loss, rel=1e-5)
    for a, b in zip(whole.model.parameters(), halves.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_nan_loss_stops_with_the_step_and_what_is_kept_or_is_skipped_without_an_update(tmp_path):
    stopping = tiny_step(tmp_path)
    with torch.no_grad():
        stopping.model.lm_head.weight[0, 0] = math.nan  # every logit row holds a NaN now
    with pytest.raises(UserError, match=r"^the loss became nan at step 5; stopped without saving, and no "
                                        r"checkpoint had been saved yet\. Lower optim\.lr"):
        stopping(4, 1e-3, np.random.default_rng(0))
    (tmp_path / "ckpt_last.pt").write_bytes(b"a checkpoint")
    with pytest.raises(UserError, match=r"ckpt_last\.pt from before it is kept"):
        stopping(4, 1e-3, np.random.default_rng(0))

    skipping = tiny_step(tmp_path, skip_nonfinite=True)
    with torch.no_grad():
        skipping.model.lm_head.weight[0, 0] = math.nan
    before = [p.detach().clone() for p in skipping.model.parameters()]
    result = skipping(4, 1e-3, np.random.default_rng(0))
    assert not result.updated and math.isnan(result.loss)
    assert all(torch.allclose(a, b, rtol=0, atol=0, equal_nan=True) for a, b in zip(before, skipping.model.parameters(), strict=True))  # no update


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """fit() on a tiny run, in-process: (run dir, figures)."""
    workdir = tmp_path_factory.mktemp("fit")
    cfg = tiny_config(**{"data.cache_dir": workdir / "cache", "train.max_steps": 12, "train.eval_interval": 5,
                         "train.log_interval": 1})
    ranks, precision, data, model = build_data_and_model(cfg)
    run = build_run(cfg, plain_config(cfg), workdir, ranks, precision, data, model)
    return workdir, fit(run, TrainState())


@pytest.mark.slow
def test_eval_train_false_evaluates_the_val_split_alone_to_the_same_val_loss(fitted, tmp_path):
    cfg = tiny_config(**{"data.cache_dir": fitted[0] / "cache", "train.max_steps": 12, "train.eval_interval": 5,
                         "train.log_interval": 1, "train.eval_train": False})
    ranks, precision, data, model = build_data_and_model(cfg)
    figures = fit(build_run(cfg, plain_config(cfg), tmp_path, ranks, precision, data, model), TrainState())
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
