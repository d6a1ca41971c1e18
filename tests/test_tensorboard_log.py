"""training/tensorboard_log.py: what RunLogger writes, read back with TensorBoard's own reader."""

import pytest
import torch

from inspection.ablation import RecallAblation
from inspection.recall_probe import RecallScores
from tests.helpers import read_events, text_of
from training.tensorboard_log import RunLogger


def test_the_recall_and_ablation_logs_name_each_head_and_the_three_that_look_most_and_are_needed_most(tmp_path):
    weight = torch.tensor([[0.10, 0.50, 0.00], [0.30, 0.05, 0.20]], dtype=torch.float64)  # (L, H) = (2, 3)
    without = torch.tensor([[0.80, 0.85, 0.10], [0.84, 0.40, 0.83]], dtype=torch.float64)
    logger = RunLogger(tmp_path)
    logger.recall(5, RecallScores(0.5, {"name": 0.8, "item": 0.2}, weight))
    logger.ablation(5, RecallAblation("name", 0.83, without))
    logger.close()
    events = read_events(tmp_path)
    scalar = {tag: events.Scalars(tag)[0].value for tag in events.Tags()["scalars"]}
    for layer in range(2):
        for head in range(3):
            assert scalar[f"recall_heads/layer_{layer}/head_{head}"] == pytest.approx(weight[layer, head].item())
            assert scalar[f"ablation/recall_name/layer_{layer}/head_{head}"] == pytest.approx(without[layer, head].item())
    assert scalar["recall/accuracy_name"] == pytest.approx(0.8)
    assert text_of(events, "recall/top_heads") == ("weight on the earlier mention: "
                                                   "layer 0 head 1: 0.50, layer 1 head 0: 0.30, layer 1 head 2: 0.20")
    assert text_of(events, "ablation/top_heads") == ("name recall 0.83 with every head; without "
                                                     "layer 0 head 2: 0.10, layer 1 head 1: 0.40, layer 0 head 0: 0.80")


def test_a_resumed_runs_event_file_sorts_after_an_earlier_one_of_the_same_second_and_every_step_reads_back(tmp_path):
    earlier = RunLogger(tmp_path)
    for step in range(1, 6):
        earlier.scalars(step, {"train/batch_loss": float(step)})
    earlier.close()
    # As if made this second by another host's process (a torchrun restart), whose name sorts later
    (made,) = tmp_path.glob("events.out.tfevents.*")
    seconds = made.name.split(".")[3]
    made.rename(tmp_path / f"events.out.tfevents.{seconds}.zzzz.1.0")
    resumed = RunLogger(tmp_path, purge_step=6)
    for step in range(6, 11):
        resumed.scalars(step, {"train/batch_loss": float(step)})
    resumed.close()
    names = sorted(path.name for path in tmp_path.glob("events.out.tfevents.*"))
    assert names[0] == f"events.out.tfevents.{seconds}.zzzz.1.0"  # TensorBoard's order: the earlier file first
    assert [event.step for event in read_events(tmp_path).Scalars("train/batch_loss")] == list(range(1, 11))
