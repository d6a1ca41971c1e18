"""What a run logs to TensorBoard, read back with TensorBoard's own reader: the scalars train.log
prints, attention maps for every head, the Attention tab's weights, each head's metrics, and the
recall and ablation scalars, recomputed from the run's checkpoint."""

import json
import math
import re

import numpy as np
import pytest
import torch
from PIL import Image
from tensorboard.util.tensor_util import make_ndarray

from inspection.head_metrics import head_metrics
from inspection.recall_probe import recall_points
from tests.helpers import last_values, read_events, recomputed_last_step_scalars, text_of

pytestmark = pytest.mark.slow  # every test reads the shared trained run


def test_tensorboard_has_the_scalars_samples_and_config(trained_run):
    events = read_events(trained_run)
    scalars = set(events.Tags()["scalars"])
    assert {"loss/train", "loss/val", "train/batch_loss", "train/lr", "train/grad_norm", "train/tokens_per_sec"} <= scalars
    assert [e.step for e in events.Scalars("loss/val")] == [0, 10, 20]
    # Guards swapped or mislabelled scalars: each logged value is the one train.log printed for its step.
    log = (trained_run / "train.log").read_text()
    evals = re.findall(r"step (\d+): train loss ([\d.]+), val loss ([\d.]+)", log)
    windows = re.findall(r"step (\d+)/20 \| loss ([\d.]+) \| lr [^|]+\| grad norm ([\d.]+)", log)
    for tag, printed, rounding in (("loss/train", {int(s): float(t) for s, t, _ in evals}, 1e-4),
                                   ("loss/val", {int(s): float(v) for s, _, v in evals}, 1e-4),
                                   ("train/batch_loss", {int(s): float(loss) for s, loss, _ in windows}, 1e-4),
                                   ("train/grad_norm", {int(s): float(g) for s, _, g in windows}, 1e-2)):
        assert {e.step: e.value for e in events.Scalars(tag)} == pytest.approx(printed, abs=rounding), tag
    assert all(e.value > 0 for e in events.Scalars("train/tokens_per_sec"))
    text_tags = set(events.Tags()["tensors"])
    assert {"samples/text_summary", "config/text_summary", "attention/probe/text_summary"} <= text_tags
    labels = text_of(events, "attention/probe").split(" | ")
    assert len(labels) == 24 and "·was" in labels  # 24 BPE tokens, whole words, the leading space shown as ·
    probe = "".join(labels).replace("·", " ")
    assert re.match(r"(Once upon|There once|Long ago|[A-Z][a-z]+ was a)", probe), probe
    assert any(point.kind == "name" for point in recall_points(probe)), probe  # a name comes back: the copying shows
    samples = events.Tensors("samples/text_summary")
    assert [s.step for s in samples] == [0, 10, 20]
    config_text = text_of(events, "config")
    assert "n_layer: 2" in config_text


def test_tensorboard_has_attention_maps_for_every_layer_and_head(trained_run):
    events = read_events(trained_run)
    expected = {f"attention/layer_{layer}/head_{head}" for layer in range(2) for head in range(2)}
    assert expected <= set(events.Tags()["images"])
    for tag in expected:
        images = events.Images(tag)
        assert [image.step for image in images] == [0, 10, 20]
        assert images[-1].width > 24 * 4 and images[-1].height > 24 * 4  # 24 probe tokens, labelled


def test_attention_maps_show_a_causal_pattern(trained_run, tmp_path):
    events = read_events(trained_run)
    encoded = events.Images("attention/layer_0/head_0")[-1].encoded_image_string
    (tmp_path / "map.png").write_bytes(encoded)
    pixels = np.asarray(Image.open(tmp_path / "map.png").convert("RGB")).astype(int)
    # The pale grey of "future" cells fills the upper-right triangle of the grid; the lower
    # triangle is coloured by the weights. Count grey pixels in each half of the image.
    grey = (np.abs(pixels - 236).sum(axis=-1) < 6)
    height, width = grey.shape
    upper_right = grey[: height // 2, width // 2 :].mean()
    lower_left = grey[height // 2 :, : width // 2].mean()
    assert upper_right > 0.3 and lower_left < 0.05


def test_every_head_has_its_metrics_and_all_heads_share_one_grid_image(trained_run, tmp_path):
    events = read_events(trained_run)
    scalars = set(events.Tags()["scalars"])
    for metric in ("entropy", "distance", "previous_token", "induction"):
        for layer in range(2):
            for head in range(2):
                values = events.Scalars(f"head_{metric}/layer_{layer}/head_{head}")
                assert [v.step for v in values] == [0, 10, 20], (metric, layer, head)
                assert all(math.isfinite(v.value) and v.value >= 0 for v in values)
    assert all(v.value <= 1 for v in events.Scalars("head_previous_token/layer_0/head_0"))
    assert not any(tag.startswith("head_") and "layer_2" in tag for tag in scalars)  # 2 layers only
    # The recall probe (the stories corpus): accuracy on repeated names, and every head's look back.
    assert [v.step for v in events.Scalars("recall/accuracy")] == [0, 10, 20]
    assert all(0 <= v.value <= 1 for v in events.Scalars("recall/accuracy"))
    assert "weight on the earlier mention: layer " in text_of(events, "recall/top_heads")
    # And its name recall with each head knocked out alone, at the same steps.
    for layer, head in np.ndindex(2, 2):
        assert [v.step for v in events.Scalars(f"ablation/recall_name/layer_{layer}/head_{head}")] == [0, 10, 20]
    assert re.match(r"name recall \d\.\d\d with every head; without layer \d head \d: ", text_of(events, "ablation/top_heads"))
    # Guards logging another probe's numbers, or a head under another's tag: recomputed from ckpt_last.pt.
    expected = recomputed_last_step_scalars(trained_run)
    assert last_values(events, expected) == pytest.approx(expected, abs=1e-5)
    grids = events.Images("attention/all_heads")
    assert [g.step for g in grids] == [0, 10, 20]
    (tmp_path / "grid.png").write_bytes(grids[-1].encoded_image_string)
    pixels = np.asarray(Image.open(tmp_path / "grid.png").convert("RGB")).astype(int)
    grey = (np.abs(pixels - 236).sum(axis=-1) < 6)  # the future cells of 2 x 2 maps
    assert grey.mean() > 0.15 and pixels.shape[0] > 2 * 24 * 6  # two rows of maps of 24 tokens


def test_the_attention_tabs_data_is_every_logged_steps_weights_with_the_probes_labels(trained_run):
    events = read_events(trained_run)
    metadata = events.SummaryMetadata("attention/weights")
    assert metadata.plugin_data.plugin_name == "tinyattn_attention"
    labels = json.loads(metadata.plugin_data.content)["labels"]
    assert " | ".join(labels) == text_of(events, "attention/probe")  # the heatmaps' labels
    logged = events.Tensors("attention/weights")
    assert [t.step for t in logged] == [0, 10, 20]
    for event in logged:
        weights = make_ndarray(event.tensor_proto)
        assert weights.dtype == np.float16 and weights.shape == (2, 2, 24, 24)  # (L, H, T, T) of the probe
        assert (np.triu(weights, k=1) == 0).all() and np.allclose(weights.astype(np.float32).sum(-1), 1, atol=1e-2)
        # The same weights the head metrics of that step were computed from (guards a stale or
        # shuffled tensor): recomputed from the logged numbers, they match the logged scalars.
        metrics = head_metrics(torch.from_numpy(weights.astype(np.float32)))
        for layer, head in np.ndindex(2, 2):
            scalar = events.Scalars(f"head_previous_token/layer_{layer}/head_{head}")[logged.index(event)]
            assert metrics["previous_token"][layer, head].item() == pytest.approx(scalar.value, abs=2e-3)
