"""training/jobs.py: when the loop's periodic jobs are due."""

from training.jobs import Every


def test_a_job_is_due_every_interval_and_at_the_last_step():
    every_10 = Every(10)
    assert [step for step in range(31) if every_10(step, last=False)] == [0, 10, 20, 30]
    assert every_10(17, last=True) and not every_10(17, last=False)  # the last step, whatever its number
    assert not Every(10, at_start=False)(0, last=False)  # train.eval_at_start=false
    assert not Every(0)(0, last=False) and not Every(0)(20, last=True)  # 0: off, even at the end
