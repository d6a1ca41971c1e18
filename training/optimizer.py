"""The optimizer: Muon for the hidden weight matrices with AdamW for the rest (the default,
optim.name=muon), or AdamW for everything (optim.name=adamw).

AdamW decays the 2-D weight matrices only: biases and norm gains are not decayed, since
shrinking a gain towards 0 would only fight the normalisation it exists to undo.

Muon (torch.optim.Muon) updates each hidden matrix (the attention and MLP projections of the
blocks) with an orthogonalised momentum: every direction of the matrix moves by a similar
amount, which often learns faster per step. The embeddings, the LM head, and the biases and
gains stay with AdamW, as Muon is meant for hidden 2-D layers only. Its learning rate is
scaled to match AdamW's update size (adjust_lr_fn="match_rms_adamw"), so optim.lr and its
schedule serve both.
"""

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

OPTIMIZERS = ("adamw", "muon")


class Optimizers:
    """Several optimizers that step, zero and save as one."""

    def __init__(self, *optimizers: torch.optim.Optimizer) -> None:
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for optimizer in self.optimizers:
            optimizer.step()

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": [optimizer.state_dict() for optimizer in self.optimizers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for optimizer, saved in zip(self.optimizers, state["optimizers"], strict=True):
            optimizer.load_state_dict(saved)


def is_hidden_matrix(name: str, param: nn.Parameter) -> bool:
    """A 2-D weight inside a transformer block (not an embedding, not the head)."""
    return param.dim() == 2 and name.startswith("blocks.")


def build_optimizer(model: nn.Module, cfg: Mapping[str, Any], device: torch.device) -> Optimizers:
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    use_muon = cfg.get("name", "adamw") == "muon"
    for_muon = [p for name, p in named if use_muon and is_hidden_matrix(name, p)]
    for_adamw = [(name, p) for name, p in named if not (use_muon and is_hidden_matrix(name, p))]
    groups = [
        {"params": [p for _, p in for_adamw if p.dim() >= 2], "weight_decay": cfg["weight_decay"]},
        {"params": [p for _, p in for_adamw if p.dim() < 2], "weight_decay": 0.0},
    ]
    # The fused kernel is a CUDA speed-up; on CPU the default implementation is used.
    optimizers = [torch.optim.AdamW(groups, lr=cfg["lr"], betas=tuple(cfg["betas"]), fused=device.type == "cuda")]
    if for_muon:
        optimizers.append(torch.optim.Muon(
            for_muon, lr=cfg["lr"], weight_decay=cfg["weight_decay"], adjust_lr_fn="match_rms_adamw",
        ))
    return Optimizers(*optimizers)
