"""The Attention tab's data in an event file: at each attention logging step, one tensor summary

    tag attention/weights, plugin tinyattn_attention
    tensor   (n_layer, n_head, T, T) float16: the probe's attention weights, rows are queries
    content  JSON {"version": 1, "labels": [T token labels, as the heatmaps print them],
                   "window": the model's window W (a query sees the W most recent keys), or null}

and one scalar per head for each metric the tab shows, under {prefix}/layer_{l}/head_{h}
(head_scalar_tag writes the name, head_scalar_of reads it back); TAB_METRICS names them.
"""

import json
import re
from dataclasses import dataclass

import numpy as np
from tensorboard.compat.proto.summary_pb2 import DATA_CLASS_TENSOR, Summary, SummaryMetadata
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.compat.proto.types_pb2 import DT_HALF

PLUGIN_NAME = "tinyattn_attention"
WEIGHTS_TAG = "attention/weights"
FORMAT_VERSION = 1

REPEATED_N = 32  # the repeated random tokens' n when none is asked for (fewer where the model reads less)

RECALL_HEADS = "recall_heads"  # the recall probe's weight on the earlier mention (inspection/recall_probe.py)
# The repeated tokens' copy loss with each head knocked out alone, under {INDUCTION_ABLATION}/layer_{l}/head_{h},
# and with every head at {INDUCTION_ABLATION}/intact (inspection/ablation.py).
INDUCTION_ABLATION = "ablation/induction_loss"


def head_metric_prefix(metric: str) -> str:
    """The tags of one of inspection/head_metrics.py's METRICS."""
    return f"head_{metric}"


def ablation_prefix(kind: str) -> str:
    """The tags of recall/accuracy_{kind} with each head knocked out alone (inspection/ablation.py)."""
    return f"ablation/recall_{kind}"


def head_scalar_tag(prefix: str, layer: int, head: int) -> str:
    return f"{prefix}/layer_{layer}/head_{head}"


@dataclass(frozen=True)
class TabMetric:
    prefix: str  # the tags: {prefix}/layer_{l}/head_{h}
    label: str  # its column in the head table, its name in the model view's menu
    meaning: str  # the column's tooltip


# The per-head metrics the tab shows, in its columns' order.
TAB_METRICS = {
    "entropy": TabMetric(head_metric_prefix("entropy"), "entropy",
                         "how spread out a query's weights are, in nats (0: all on one key)"),
    "distance": TabMetric(head_metric_prefix("distance"), "distance", "how many tokens back the weight lies, on average"),
    "previous_token": TabMetric(head_metric_prefix("previous_token"), "prev-token", "weight on the token just before"),
    "induction": TabMetric(head_metric_prefix("induction"), "induction",
                           "on a random sequence seen twice: weight on the token after the earlier copy"),
    "recall": TabMetric(RECALL_HEADS, "recall",
                        "weight on the earlier mention of a name or item that comes back (stories)"),
    "ablation": TabMetric(ablation_prefix("name"), "without it: name recall", "the recall probe's name recall with "
                          "this head knocked out alone (with every head: recall/accuracy_name)"),
}
HEAD_SCALAR = re.compile(r"^(?P<prefix>.+)/layer_(?P<layer>\d+)/head_(?P<head>\d+)$")  # head_scalar_tag's names
METRIC_OF_PREFIX = {m.prefix: name for name, m in TAB_METRICS.items()}


def head_scalar_parts(tag: str) -> tuple[str, int, int] | None:
    """(prefix, layer, head) of a name head_scalar_tag wrote; None for any other tag."""
    match = HEAD_SCALAR.match(tag)
    return (match["prefix"], int(match["layer"]), int(match["head"])) if match else None


def head_scalar_of(tag: str) -> tuple[str, int, int] | None:
    """(metric, layer, head) of one of TAB_METRICS' scalars; None for any other tag."""
    parts = head_scalar_parts(tag)
    if parts is None or parts[0] not in METRIC_OF_PREFIX:
        return None
    return METRIC_OF_PREFIX[parts[0]], parts[1], parts[2]


def weights_summary(weights: np.ndarray, labels: list[str], window: int | None = None) -> Summary:
    """weights: (n_layer, n_head, T, T); labels: the T probe tokens; window: the model's."""
    content = json.dumps({"version": FORMAT_VERSION, "labels": labels, "window": window}).encode()
    metadata = SummaryMetadata(
        plugin_data=SummaryMetadata.PluginData(plugin_name=PLUGIN_NAME, content=content),
        data_class=DATA_CLASS_TENSOR,  # without it TensorBoard's data provider does not list the tensor
    )
    return Summary(value=[Summary.Value(tag=WEIGHTS_TAG, metadata=metadata, tensor=half_tensor(weights))])


def half_tensor(values: np.ndarray) -> TensorProto:
    """values as a float16 TensorProto holding their bytes (tensor_content, which TensorBoard's
    make_ndarray reads back). TensorBoard's make_tensor_proto writes a float16 array one number at
    a time, in Python: seconds for a 12-layer, 12-head model's maps of 128 tokens, where this
    takes milliseconds (docs/speed.md, The Attention tab)."""
    shape = TensorShapeProto(dim=[TensorShapeProto.Dim(size=n) for n in values.shape])
    return TensorProto(dtype=DT_HALF, tensor_shape=shape, tensor_content=values.astype("<f2").tobytes())


def read_probe(content: bytes) -> tuple[list[str], int | None]:
    """(the probe's token labels, the model's window or None) from a summary's plugin content."""
    probe = json.loads(content)
    return probe["labels"], probe.get("window")  # event files written before the window have none
