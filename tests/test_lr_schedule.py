"""The learning-rate schedule (training/lr_schedule.py): warmup then cosine or WSD decay. (The loop's
use of it, each update at its own step: tests/test_fit.py.)"""

import pytest

from training.lr_schedule import lr_at


def test_lr_warms_up_linearly_then_decays_by_cosine_to_min_lr():
    kwargs = dict(lr=1e-3, min_lr=1e-4, warmup_steps=10, max_steps=111, schedule="cosine", decay_fraction=0.2)  # updates 0..110
    assert lr_at(0, **kwargs) == pytest.approx(1e-4)
    assert lr_at(4, **kwargs) == pytest.approx(5e-4)
    assert lr_at(9, **kwargs) == pytest.approx(1e-3)  # warmup's last step reaches lr
    assert lr_at(10, **kwargs) == pytest.approx(1e-3)
    assert lr_at(60, **kwargs) == pytest.approx(0.5 * (1e-3 + 1e-4))  # half way down the cosine
    assert lr_at(110, **kwargs) == pytest.approx(1e-4)  # the last update uses min_lr
    assert lr_at(500, **kwargs) == pytest.approx(1e-4)
    lrs = [lr_at(s, **kwargs) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:], strict=False))


def test_wsd_holds_lr_flat_then_decays_in_a_straight_line_over_the_last_fifth():
    kwargs = dict(lr=1e-3, min_lr=1e-4, warmup_steps=10, max_steps=111, schedule="wsd", decay_fraction=0.2)
    assert lr_at(9, **kwargs) == pytest.approx(1e-3)
    assert lr_at(50, **kwargs) == lr_at(88, **kwargs) == pytest.approx(1e-3)  # stable
    assert lr_at(98, **kwargs) == pytest.approx(1e-3 + (1e-4 - 1e-3) * 10 / 22)  # decay: steps 88..110
    assert lr_at(110, **kwargs) == pytest.approx(1e-4)


def test_short_runs_warm_up_in_full_and_still_end_at_min_lr():
    # A decay that would start inside warmup starts after it; a run whose warmup takes all but one
    # update gives that last update min_lr, as every schedule does.
    wsd = dict(lr=1e-3, min_lr=1e-4, warmup_steps=10, max_steps=12, schedule="wsd", decay_fraction=0.5)
    assert [lr_at(step, **wsd) for step in (9, 10, 11)] == pytest.approx([1e-3, 1e-3, 1e-4])
    for schedule in ("cosine", "wsd"):
        short = dict(lr=1e-3, min_lr=1e-4, warmup_steps=9, max_steps=10, schedule=schedule, decay_fraction=0.2)
        assert [lr_at(step, **short) for step in (8, 9)] == pytest.approx([1e-3, 1e-4])
