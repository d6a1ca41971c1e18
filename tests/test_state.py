"""training/state.py: the loop's state, saved in every checkpoint and read back, its log window,
and the random generators' states for an exact resume."""

import random

import numpy as np
import torch

from data.tokenizer import CharTokenizer
from model import GPT, GPTConfig
from model_io.checkpoint import Checkpoint
from training.state import RunState, TrainState, capture_rng_states, restore_rng_states


def test_the_state_comes_back_from_a_checkpoint_file_as_it_was_saved(tmp_path):
    state = TrainState(step=30, best_val_loss=2.5, skipped=2, window_loss=7.5, window_steps=3)
    rng = [capture_rng_states(np.random.default_rng(rank)) for rank in range(2)]  # two ranks'
    rng[1]["torch"] = rng[1]["torch"] + 1
    for evaluated in (True, False):
        run_state = RunState.of(state, rng, world_size=2, grad_scaler={"scale": 1024.0}, evaluated=evaluated,
                                text_key="0123abcd")
        Checkpoint(model={}, config={}, tokenizer={}, step=state.step, best_val_loss=state.best_val_loss,
                   run_state=run_state.to_dict()).save(tmp_path / "ckpt.pt")
        loaded = Checkpoint.load(tmp_path / "ckpt.pt")  # weights_only, and upgrade()
        back = RunState.from_dict(loaded.run_state)
        assert back.train_state(loaded.step, loaded.best_val_loss) == TrainState(30, 2.5, 2, 7.5, 3, evaluated=evaluated)
        assert (back.world_size, back.grad_scaler, len(back.rng), back.text_key) == (2, {"scale": 1024.0}, 2, "0123abcd")
        assert torch.equal(back.rng[1]["torch"], rng[1]["torch"])


def test_the_log_window_gives_its_mean_once_and_starts_again():
    state = TrainState()
    for loss in (1.0, 2.0, 6.0):
        state.add_to_window(loss)
    assert state.take_window() == 3.0
    assert (state.window_loss, state.window_steps) == (0.0, 0)


def test_every_random_generator_draws_the_same_after_a_checkpoint_round_trip(tmp_path):
    def draws(batch_rng):
        return (random.random(), np.random.rand(), batch_rng.integers(1 << 30), torch.rand(1).item(),
                torch.nn.functional.dropout(torch.ones(64), 0.5).tolist())

    batch_rng = np.random.default_rng(3)
    batch_rng.integers(10, size=5)  # move it away from its seed
    path = tmp_path / "ckpt_last.pt"
    model = GPT(GPTConfig(vocab_size=5, n_layer=1, n_head=1, n_embd=4, block_size=4))
    Checkpoint(model=model.state_dict(), optimizer=torch.optim.AdamW(model.parameters()).state_dict(), step=1,
               best_val_loss=1.0, config={}, tokenizer=CharTokenizer.from_text("abcd").state(),
               run_state={"rng": capture_rng_states(batch_rng)}).save(path)
    expected = draws(batch_rng)
    assert draws(batch_rng) != expected  # the generators really moved on

    fresh_rng = np.random.default_rng(99)
    restore_rng_states(Checkpoint.load(path).run_state["rng"][0], fresh_rng)  # weights_only=True inside
    assert draws(fresh_rng) == expected
