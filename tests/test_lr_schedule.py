"""The learning-rate schedule (training/lr_schedule.py): warmup then cosine or WSD decay, and the
loop's use of it, each update at its own step."""

import pytest
import yaml

from tests.helpers import read_events, run_cli, tiny_run
from training.lr_schedule import lr_at


def test_lr_warms_up_linearly_then_decays_by_cosine_to_min_lr():
    kwargs = dict(lr=1e-3, min_lr=1e-4, warmup_steps=10, max_steps=111)  # updates 0..110
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


def test_each_update_uses_and_logs_the_schedules_lr_for_its_own_step(tmp_path):
    # Guards the loop's call of the schedule: the update that ends at step s is update s - 1.
    result = run_cli("train.py", *tiny_run(**{
        "train.max_steps": 8, "train.log_interval": 1, "optim.warmup_steps": 3, "train.eval_interval": 8,
        "train.attn_log_interval": 0, "train.sample_interval": 0, "hydra.run.dir": "run"}), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    optim = yaml.safe_load((tmp_path / "run" / ".hydra" / "config.yaml").read_text())["optim"]
    logged = read_events(tmp_path / "run").Scalars("train/lr")
    assert [e.step for e in logged] == list(range(1, 9))
    expected = [lr_at(e.step - 1, optim["lr"], optim["min_lr"], 3, 8, optim["schedule"], optim["decay_fraction"])
                for e in logged]
    assert [e.value for e in logged] == pytest.approx(expected, rel=1e-6)
    assert len(set(expected)) >= 5  # warmup, flat and decay: an update one step off would log other values
