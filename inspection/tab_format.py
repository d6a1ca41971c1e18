"""The Attention tab's data in an event file: at each attention logging step, one tensor summary

    tag attention/weights, plugin tinyattn_attention
    tensor   (n_layer, n_head, T, T) float16: the probe's attention weights, rows are queries
    content  JSON {"version": 1, "labels": [T token labels, as the heatmaps print them]}
"""

import json

import numpy as np
from tensorboard.compat.proto.summary_pb2 import DATA_CLASS_TENSOR, Summary, SummaryMetadata
from tensorboard.util.tensor_util import make_tensor_proto

PLUGIN_NAME = "tinyattn_attention"
WEIGHTS_TAG = "attention/weights"
FORMAT_VERSION = 1


def weights_summary(weights: np.ndarray, labels: list[str]) -> Summary:
    """weights: (n_layer, n_head, T, T); labels: the T probe tokens."""
    content = json.dumps({"version": FORMAT_VERSION, "labels": labels}).encode()
    metadata = SummaryMetadata(
        plugin_data=SummaryMetadata.PluginData(plugin_name=PLUGIN_NAME, content=content),
        data_class=DATA_CLASS_TENSOR,  # without it TensorBoard's data provider does not list the tensor
    )
    tensor = make_tensor_proto(weights.astype(np.float16))
    return Summary(value=[Summary.Value(tag=WEIGHTS_TAG, metadata=metadata, tensor=tensor)])


def read_labels(content: bytes) -> list[str]:
    """The probe's token labels from a summary's plugin content."""
    return json.loads(content)["labels"]
