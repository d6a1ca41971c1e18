"""training/fit.py: fit() on a tiny run, in-process, and the figures it returns; the batches
training/evaluation.py evaluates on."""

import numpy as np
import pytest
import torch

from cli.config import plain_config
from cli.run_spec import run_spec
from data.batches import get_batch
from data.token_cache import TokenData
from data.tokenizer import CharTokenizer
from model import GPTConfig
from model_io.checkpoint import build_model
from runtime.precision import Precision
from tests.helpers import ARCHITECTURE_OPTIONS, ONE_PROCESS, curves, read_events, tiny_config
from training.build import build_data_and_model, build_run, parameter_count
from training.evaluation import evaluate
from training.fit import StepLog, fit
from training.lr_schedule import lr_at
from training.state import TrainState
from training.step import StepResult
from training.tensorboard_log import BATCH_LOSS, TOKENS_PER_SEC, RunLogger
from user_error import UserError


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


@pytest.mark.slow
def test_a_save_between_evaluations_keeps_the_last_model_and_never_the_best_without_a_val_loss_of_its_step(tmp_path):
    # save_interval=3 with evaluations at 0, 10 and 12 only: the saves at 3, 6 and 9 write ckpt_last.pt alone;
    # the val loss of step 0 is no val loss of theirs, so the first ckpt_best.pt is step 10's. At lr 0 the
    # weights never move, so step 12's evaluation is no better and it stays.
    cfg = tiny_config(**{"data.cache_dir": tmp_path / "cache", "train.max_steps": 12, "train.eval_interval": 10,
                         "train.save_interval": 3, "train.attn_log_interval": 0, "train.sample_interval": 0,
                         "optim.lr": 0.0, "optim.min_lr": 0.0})
    spec = run_spec(cfg)
    ranks, precision, data, model = build_data_and_model(spec)
    fit(build_run(spec, plain_config(cfg), tmp_path / "run", ranks, precision, data, model), TrainState())
    best = torch.load(tmp_path / "run" / "ckpt_best.pt", weights_only=True)
    assert best["step"] == 10 and torch.load(tmp_path / "run" / "ckpt_last.pt", weights_only=True)["step"] == 12


class BatchesSeen(torch.nn.Module):
    """Stands where the model does in evaluate(): notes each batch it is given, and predicts nothing
    (every logit 0, so every position's loss is log vocab_size)."""

    def __init__(self, vocab_size: int = 100) -> None:
        super().__init__()
        self.vocab_size, self.seen = vocab_size, []

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.seen.append(x.clone())
        return torch.zeros(*x.shape, self.vocab_size), torch.tensor(0.0)


def tokenizer_of(vocab_size: int) -> CharTokenizer:
    """A char tokenizer of vocab_size ids (its characters and the start token): the evaluation refuses
    ids past the vocabulary, and these tests tell windows apart by ids up to a million."""
    return CharTokenizer([chr(i) for i in range(0x20, 0x20 + vocab_size + 0x800) if not 0xD800 <= i <= 0xDFFF][:vocab_size - 1])


def evaluated_windows(data: TokenData, block_size: int, splits: tuple[str, ...] = ("train", "val"), seed: int = 1337):
    model = BatchesSeen()
    evaluated = evaluate(model, data, batch_size=4, block_size=block_size, eval_iters=5, ranks=ONE_PROCESS,
                         precision=Precision("fp32", torch.device("cpu")), seed=seed, splits=splits)
    return torch.cat(model.seen), evaluated


def test_the_evaluation_windows_are_the_same_each_time_and_none_is_one_the_first_steps_train_on():
    tokens = np.arange(1_000_000, dtype=np.uint32)  # every window is told apart by its first id
    data = TokenData(tokenizer_of(len(tokens)), train=tokens, val=tokens)
    windows, _ = evaluated_windows(data, 16, splits=("train",))
    assert torch.equal(evaluated_windows(data, 16, splits=("train",))[0], windows)  # fixed: the curve shows the model change
    # What the first 5 steps train on: training/build.py's batch_rng, np.random.default_rng(train.seed), 4 rows a step.
    rng = np.random.default_rng(1337)
    trained = torch.cat([get_batch(tokens, 4, 16, rng)[0] for _ in range(5)])
    assert not set(windows[:, 0].tolist()) & set(trained[:, 0].tolist())  # loss/train is not read off batches just trained on


def test_the_in_context_score_needs_a_window_of_3_tokens():
    data = TokenData(tokenizer_of(100), train=np.arange(100, dtype=np.uint16), val=np.arange(100, dtype=np.uint16))
    assert evaluated_windows(data, 3)[1].in_context == 0.0  # early and late at chance alike
    assert evaluated_windows(data, 2)[1].in_context is None


@pytest.mark.parametrize("options", ARCHITECTURE_OPTIONS)
def test_the_parameters_counted_from_one_layer_are_those_of_the_whole_model(options):
    # train.py's memory check counts a model from one of a single layer, built on the meta device.
    shape = GPTConfig(n_layer=3, n_head=2, n_embd=16, block_size=8, **options)
    assert parameter_count(shape, vocab_size=65) == build_model(shape, 65).num_parameters()


def test_a_token_cache_file_damaged_under_a_run_stops_it_with_the_line_that_names_the_entry(tmp_path):
    # Damaged after its entry was read (and checked at its ends): past the probe text's ids (which
    # probe_ids checks: tests/test_data.py), so that the evaluation's batches refuse it.
    cfg = tiny_config(**{"data.cache_dir": tmp_path / "cache", "train.max_steps": 2})
    spec = run_spec(cfg)
    ranks, precision, data, model = build_data_and_model(spec)
    [entry] = (tmp_path / "cache" / "tokens").iterdir()
    damaged = np.memmap(entry / "val.bin", dtype=data.val.dtype, mode="r+")
    damaged[100:] = data.tokenizer.vocab_size
    with pytest.raises(UserError, match=rf"^the token cache's val\.bin in {entry} holds id {data.tokenizer.vocab_size}, "):
        fit(build_run(spec, plain_config(cfg), tmp_path / "run", ranks, precision, data, model), TrainState())


def test_each_logged_window_has_its_own_mean_loss_and_tokens_per_second_and_the_last_short_one_is_logged(tmp_path):
    # 10 steps logged every 4: windows end at 4, 8 and 10, the last one short. Each window's
    # tokens/s is its own steps' (100 tokens a step: 0.5, 1 and 2 s a step), not the run's so far.
    tb = RunLogger(tmp_path)
    step_log, state = StepLog(tb, log_interval=4, max_steps=10, tokens_per_step=100), TrainState()
    for step in range(1, 11):
        state.add_to_window(float(step))  # the train loss of step `step`, as fit() adds it
        step_log.record(step, state, StepResult(loss=float(step), grad_norm=1.0, updated=True), lr=0.1,
                        seconds=0.5 if step <= 4 else 1.0 if step <= 8 else 2.0)
    tb.close()
    logged = curves(read_events(tmp_path))
    assert logged[BATCH_LOSS] == [(4, 2.5), (8, 6.5), (10, 9.5)]
    assert logged[TOKENS_PER_SEC] == [(4, 200.0), (8, 100.0), (10, 50.0)] and step_log.history == [200.0, 100.0, 50.0]
