"""training/jobs.py: when the loop's periodic jobs are due."""

from tensorboard.util.tensor_util import make_ndarray

from inspection.tab_format import WEIGHTS_TAG, read_probe
from tests.helpers import read_events, run_cli, tiny_run
from training.jobs import Every


def test_a_job_is_due_every_interval_and_at_the_last_step():
    every_10 = Every(10)
    assert [step for step in range(31) if every_10(step, last=False)] == [0, 10, 20, 30]
    assert every_10(17, last=True) and not every_10(17, last=False)  # the last step, whatever its number
    assert not Every(10, at_start=False)(0, last=False)  # train.eval_at_start=false
    assert not Every(0)(0, last=False) and not Every(0)(20, last=True)  # 0: off, even at the end


def test_attn_log_at_start_false_draws_no_maps_of_the_untrained_model_and_the_maps_say_the_models_window(tmp_path):
    # (Every's at_start is checked above; this is the option's way from the command line to the job.)
    # train.sample_tokens=0 is "no samples" too (they were logged, empty, at every sample_interval).
    result = run_cli("train.py", *tiny_run(**{
        "train.max_steps": 2, "train.eval_interval": 2, "train.attn_log_interval": 2, "train.sample_interval": 1,
        "train.sample_tokens": 0, "train.attn_log_at_start": False, "model.window": 4, "hydra.run.dir": "run"}), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    events = read_events(tmp_path / "run")
    assert "sample at step" not in result.stdout and not [tag for tag in events.Tags()["tensors"] if "sample" in tag]
    head_tags = [tag for tag in events.Tags()["scalars"] if tag.startswith("head_")]
    assert head_tags
    assert {event.step for event in events.Images("attention/all_heads")} == {2}
    assert {event.step for tag in head_tags for event in events.Scalars(tag)} == {2}
    (maps,) = events.Tensors(WEIGHTS_TAG)
    labels, window = read_probe(events.SummaryMetadata(WEIGHTS_TAG).plugin_data.content)
    assert window == 4 and len(labels) == make_ndarray(maps.tensor_proto).shape[-1] == 24  # the tab greys keys 4 or more back
