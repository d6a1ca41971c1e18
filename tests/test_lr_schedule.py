"""The learning-rate schedule (training/lr_schedule.py): warmup then cosine or WSD decay. (The loop's
use of it, each update at its own step: tests/test_fit.py.)"""

import pytest

from cli.run_spec import run_spec
from tests.helpers import ROOT, composed_train_config
from training.lr_schedule import lr_at, schedule_note


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


def test_a_warmup_that_takes_the_schedules_place_is_noted_and_no_preset_has_one():
    # A warmup as long as the run never decayed, and one eating into wsd's decay squeezed it: no word.
    settings = {"lr": 3e-3, "min_lr": 3e-4, "schedule": "wsd", "decay_fraction": 0.2}
    assert schedule_note(warmup_steps=5, max_steps=3, **settings) == (
        "optim.warmup_steps=5 is more than train.max_steps=3: the learning rate never reaches optim.lr=0.003; lower "
        "optim.warmup_steps for so short a run")
    assert schedule_note(warmup_steps=4, max_steps=4, **settings) == (
        "optim.warmup_steps=4 is all of train.max_steps=4: the learning rate rises to the end and never decays to "
        "optim.min_lr=0.0003; lower optim.warmup_steps")
    assert schedule_note(warmup_steps=90, max_steps=100, **settings) == (
        "optim.warmup_steps=90 leaves the decay 9 of train.max_steps=100's steps, not the 20 of optim.decay_fraction=0.2; "
        "lower optim.warmup_steps")
    assert lr_at(90, warmup_steps=90, max_steps=100, **settings) == 3e-3 and lr_at(99, warmup_steps=90, max_steps=100, **settings) == 3e-4
    assert schedule_note(warmup_steps=79, max_steps=100, **settings) is None  # the decay's 20 steps whole: 79 to 99
    assert schedule_note(warmup_steps=90, max_steps=100, **{**settings, "schedule": "cosine"}) is None  # all after warmup decays
    for warmup, max_steps in ((0, 100), (0, 3)):  # a decay of all the steps it can have is no shorter than asked
        assert schedule_note(warmup_steps=warmup, max_steps=max_steps, **{**settings, "decay_fraction": 1.0}) is None
    for preset in [None, *sorted(path.stem for path in (ROOT / "configs" / "experiment").glob("*.yaml"))]:
        spec = run_spec(composed_train_config([f"experiment={preset}"] if preset else []))
        assert schedule_note(spec.optim.lr, spec.optim.min_lr, spec.optim.warmup_steps, spec.loop.max_steps,
                             spec.optim.schedule, spec.optim.decay_fraction) is None, preset
