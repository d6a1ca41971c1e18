"""Which heads the model needs: the recall probe's score, or the loss on a repeated random
sequence's second copy, with each head knocked out alone.

Where a head looks (head metrics, the recall probe's look-back weights) is not what the model
needs it for. Taking a head away and scoring the probe again says that directly.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inspection.recall_probe import RecallProbe, accuracy
from model import GPT, eval_mode


@dataclass
class RecallAblation:
    kind: str  # the recall points scored: "name" or "item"
    intact: float  # accuracy with every head in
    without: torch.Tensor  # (L, H): accuracy with that head knocked out alone


@torch.no_grad()
def recall_without_each_head(model: GPT, probe: RecallProbe, kind: str = "name", chunk: int = 16) -> RecallAblation:
    """The probe's accuracy on recall points of one kind, intact and with each head knocked out
    alone: the numbers probe.evaluate(model).accuracy_by_kind[kind] gives with the hooks of
    model.knock_out({(layer, head)}) attached, at a fraction of the cost: only the windows that
    hold such points are run, and the LM head reads only the positions that predict them."""
    L, H = model.config.n_layer, model.config.n_head
    device = next(model.parameters()).device
    windows = sorted({window for window, *_, point_kind in probe.targets if point_kind == kind})
    intact: list[bool] = []
    without = [[[] for _ in range(H)] for _ in range(L)]  # L x H lists of hits

    def hits(idx: torch.Tensor, part: list[int]) -> list[bool]:
        """Whether the model, as hooked now, predicts each recall point of the windows part, idx (n, T)."""
        x, targets = probe.before_points(model.hidden_states(idx), part, kind)  # (n, T, C) -> (P, C)
        return probe.right(model.lm_head(x), targets).tolist()  # (P, C) -> (P, vocab) -> P

    with eval_mode(model):
        for lo in range(0, len(windows), chunk):
            part = windows[lo : lo + chunk]
            idx = probe.windows[part].to(device)  # (n, T)
            intact += hits(idx, part)
            for layer in range(L):
                for head in range(H):
                    with model.hooks(model.knock_out({(layer, head)})):
                        without[layer][head] += hits(idx, part)
    return RecallAblation(kind, accuracy(intact), torch.tensor(
        [[accuracy(without[layer][head]) for head in range(H)] for layer in range(L)], dtype=torch.float64))


@dataclass
class InductionAblation:
    intact: float  # mean loss on the second copies, every head in
    without: torch.Tensor  # (L, H): the same with that head knocked out alone


@torch.no_grad()
def second_copy_loss(model: GPT, repeated: torch.Tensor) -> float:
    """repeated: (B, 2n), each row n tokens then the same n again (head_metrics.induction_probe).
    The mean loss on the second copy's tokens from its second on: each was seen before, right
    after the token the model has just read, so a model that copies from context predicts it.
    (The copy's first token followed nothing the first time: no context gives it away.)"""
    n = repeated.shape[1] // 2
    with eval_mode(model):
        logits, _ = model(repeated)  # (B, 2n, vocab_size)
    return F.cross_entropy(logits[:, n:-1].flatten(0, 1), repeated[:, n + 1:].flatten()).item()  # (B * (n - 1),)


def induction_loss_without_each_head(model: GPT, repeated: torch.Tensor) -> InductionAblation:
    """second_copy_loss intact and with model.knock_out({(layer, head)}) attached, for each head:
    the heads an induction circuit is made of are those whose loss brings the loss back up."""
    L, H = model.config.n_layer, model.config.n_head
    without = torch.zeros(L, H, dtype=torch.float64)
    for layer in range(L):
        for head in range(H):
            with model.hooks(model.knock_out({(layer, head)})):
                without[layer, head] = second_copy_loss(model, repeated)
    return InductionAblation(second_copy_loss(model, repeated), without)
