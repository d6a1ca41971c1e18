"""training/step.py: one optimizer update, in-process: the batch it draws, gradient accumulation,
and what a NaN loss does."""

import math

import numpy as np
import pytest
import torch

from data.batches import get_batch
from model import GPT, GPTConfig
from runtime.precision import Precision
from tests.helpers import ONE_PROCESS, optim_spec
from training.optimizer import build_optimizer
from training.specs import StepSpec
from training.step import TrainStep
from user_error import UserError


def tiny_step(tmp_path, skip_nonfinite=False, accum=1, batch_size=4, grad_clip=1.0) -> TrainStep:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16))
    tokens = np.random.default_rng(0).integers(0, 50, size=2000).astype(np.uint16)
    optimizer = build_optimizer(model, optim_spec(), torch.device("cpu"))
    spec = StepSpec(batch_size, block_size=16, grad_accum_steps=accum, grad_clip=grad_clip, skip_nonfinite=skip_nonfinite)
    return TrainStep(spec, model, model, None, optimizer, Precision("fp32", torch.device("cpu")), ONE_PROCESS, tokens,
                     last_checkpoint=tmp_path / "ckpt_last.pt")


def test_a_step_refuses_a_batch_with_an_id_past_the_models_vocabulary(tmp_path):
    step = tiny_step(tmp_path)
    step.tokens = np.full(2000, 50, dtype=np.uint16)  # the model's vocabulary is 0 to 49
    with pytest.raises(UserError, match=r"^the token ids hold 50, past the vocabulary's 50 ids \(0 to 49\)$"):
        step(0, 1e-3, np.random.default_rng(7))


def test_a_step_trains_on_the_batch_its_rng_draws_and_reports_that_batchs_loss(tmp_path):
    step = tiny_step(tmp_path)
    x, y = get_batch(step.tokens, 4, 16, np.random.default_rng(7))  # the batch the step will draw
    expected_loss = step.model(x, y)[1].item()
    before = [p.detach().clone() for p in step.model.parameters()]
    result = step(0, 1e-3, np.random.default_rng(7)).result()
    assert result.updated and result.loss == pytest.approx(expected_loss, rel=1e-6) and result.grad_norm > 0
    assert all(group["lr"] == 1e-3 for group in step.optimizer.param_groups)
    assert any(not torch.equal(a, b) for a, b in zip(before, step.model.parameters(), strict=True))  # it did update


def test_gradients_over_grad_clip_are_scaled_down_to_it_and_the_norm_before_is_reported(tmp_path):
    # At this model's first step the gradients' norm is well over 1e-3 (and under 1.0, the other tests' clip).
    step = tiny_step(tmp_path, grad_clip=1e-3)
    result = step(0, 1e-3, np.random.default_rng(7)).result()
    clipped = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in step.model.parameters()]))
    assert result.grad_norm > 0.1 and clipped.item() == pytest.approx(1e-3, rel=1e-3)


def test_two_micro_steps_of_2_take_the_same_step_as_one_batch_of_4(tmp_path):
    whole, halves = tiny_step(tmp_path, batch_size=4), tiny_step(tmp_path, batch_size=2, accum=2)
    whole_result, halves_result = whole(0, 1e-2, np.random.default_rng(3)).result(), halves(0, 1e-2, np.random.default_rng(3)).result()
    assert halves_result.loss == pytest.approx(whole_result.loss, rel=1e-5)
    for a, b in zip(whole.model.parameters(), halves.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_nan_loss_stops_with_the_step_and_what_is_kept_or_is_skipped_without_an_update(tmp_path):
    stopping = tiny_step(tmp_path)
    with torch.no_grad():
        stopping.model.lm_head.weight[0, 0] = math.nan  # every logit row holds a NaN now
    queued = stopping(4, 1e-3, np.random.default_rng(0))  # the update is queued unchecked; reading it stops
    with pytest.raises(UserError, match=r"^the loss became nan at step 5; stopped without saving, and no "
                                        r"checkpoint had been saved yet\. Lower optim\.lr"):
        queued.result()
    (tmp_path / "ckpt_last.pt").write_bytes(b"a checkpoint")
    with pytest.raises(UserError, match=r"ckpt_last\.pt from before it is kept"):
        stopping(4, 1e-3, np.random.default_rng(0)).result()

    skipping = tiny_step(tmp_path, skip_nonfinite=True)
    with torch.no_grad():
        skipping.model.lm_head.weight[0, 0] = math.nan
    before = [p.detach().clone() for p in skipping.model.parameters()]
    result = skipping(4, 1e-3, np.random.default_rng(0)).result()
    assert not result.updated and math.isnan(result.loss)
    assert all(torch.allclose(a, b, rtol=0, atol=0, equal_nan=True) for a, b in zip(before, skipping.model.parameters(), strict=True))  # no update
