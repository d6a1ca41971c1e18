"""AdamW with weight decay on the 2-D weight matrices only.

Matrices (linear layers, embeddings) are decayed; biases and LayerNorm gains are not:
shrinking a gain towards 0 would only fight the normalisation it exists to undo.
"""

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


def build_optimizer(model: nn.Module, cfg: Mapping[str, Any], device: torch.device) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg["weight_decay"]},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    # The fused kernel is a CUDA speed-up; on CPU the default implementation is used.
    return torch.optim.AdamW(groups, lr=cfg["lr"], betas=tuple(cfg["betas"]), fused=device.type == "cuda")
