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
