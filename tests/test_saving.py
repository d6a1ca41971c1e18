"""training/saving.py: when the loop saves the run (train.keep_checkpoints has tests/test_keep_checkpoints.py)."""

from types import SimpleNamespace

from training.jobs import Every
from training.saving import Checkpoints


def test_the_last_model_is_saved_at_each_evaluation_and_every_save_interval_steps_between():
    evaluation = SimpleNamespace(due=Every(10))  # here only when it is due matters

    def saves(save_interval: int) -> list[int]:
        checkpoints = Checkpoints(evaluation, saver=None, save_interval=save_interval)
        return [step for step in range(23) if checkpoints.due(step, last=step == 22)]
    assert saves(0) == [10, 20, 22]  # the default: at evaluations only (not the one before training)
    assert saves(4) == [4, 8, 10, 12, 16, 20, 22]
