"""The logit lens: what the model would predict if it stopped after each layer. The residual
stream leaving a block goes through the final norm and the LM head, as the last block's does.

After the last layer the lens is the model's own output, to the bit: the same two modules read
the same tensor. Earlier layers show when the right token rises to the top (often a layer or
two before the end) and which layer moves it most.
"""

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from data.tokenizer import Tokenizer
from inspection.logit_attribution import check_position
from model import GPT, eval_mode
from model.hooks import is_whole_number


@torch.no_grad()
def lens_layers(model: GPT, idx: torch.Tensor) -> Iterator[torch.Tensor]:
    """For idx (B, T), the log-probabilities (B, T, V) after each layer in turn, one layer at a
    time: a caller that keeps a summary never holds all L of them at once."""
    with eval_mode(model):
        _, cache = model.run_with_cache(idx, names=lambda name: name.endswith("hook_resid_post"))
    for layer in range(len(model.blocks)):
        stream = cache["resid_post", layer]  # (B, T, C)
        logits = model.lm_head(model.ln_f(stream))  # (B, T, C) -> (B, T, V), as GPT.forward does
        yield F.log_softmax(logits.float(), dim=-1)  # (B, T, V)


def logit_lens(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """idx (B, T) -> (L, B, T, V): the log-probabilities the model would give after each layer.
    [-1] equals log_softmax of the model's own logits exactly."""
    return torch.stack(list(lens_layers(model, idx)))  # (L, B, T, V)


@dataclass
class LensSummary:
    """The lens on one sequence, reduced to what the Attention tab draws (L layers, T tokens)."""

    next_log_prob: torch.Tensor  # (L, T - 1): log p(the token that came next) after each layer
    next_rank: torch.Tensor  # (L, T - 1): its rank among all tokens, 1 for the top one
    top_ids: torch.Tensor  # (L, T, k): the k likeliest tokens after each layer, likeliest first
    top_probs: torch.Tensor  # (L, T, k): their probabilities
    next_ids: torch.Tensor  # (T - 1,): the token that came next at each position, idx[0, 1:]

    def __repr__(self) -> str:
        """Its shapes, not its numbers (hundreds of them), and how to read them."""
        L, T, k = self.top_ids.shape
        return (f"LensSummary({L} layers, {T} tokens, the top {k}: next_log_prob and next_rank {(L, T - 1)}, top_ids and "
                f"top_probs {(L, T, k)}; .describe(tokenizer, position) says one position in words)")

    def describe(self, tokenizer: Tokenizer, position: int = -1) -> str:
        """The lens at one position, a line per layer: the top k tokens with their probabilities,
        and, where the sequence goes on past it, the token that came next, its rank and probability."""
        L, T, _ = self.top_ids.shape
        t = check_position(position, T)
        lines = [f"position {t}:"]
        for layer in range(L):
            pieces = tokenizer.token_strings(self.top_ids[layer, t].tolist())
            top = ", ".join(f"{piece!r} {p:.3f}" for piece, p in zip(pieces, self.top_probs[layer, t].tolist(), strict=True))
            line = f"  after layer {layer}: {top}"
            if t < T - 1:  # (the last position's next token is not in the sequence)
                came = tokenizer.token_strings([int(self.next_ids[t])])[0]
                line += (f"; next came {came!r}: rank {int(self.next_rank[layer, t])}, "
                         f"p {self.next_log_prob[layer, t].exp():.3f}")
            lines.append(line)
        return "\n".join(lines)


def lens_summary(model: GPT, idx: torch.Tensor, k: int = 5) -> LensSummary:
    """The lens on one sequence idx (1, T), layer by layer, for the token that really came next
    at each position and the top k."""
    model.check_token_ids(idx)
    if idx.shape[0] != 1:
        raise ValueError(f"lens_summary reads one sequence, idx of shape (1, T); got {tuple(idx.shape)}: "
                         "give one row, idx[i:i + 1], or logit_lens for the whole batch")
    if not is_whole_number(k) or k < 1:
        raise ValueError(f"k={k!r} must be a whole number of at least 1: how many of the likeliest tokens to keep, e.g. 5")
    next_ids = idx[0, 1:]  # (T - 1,)
    log_probs, ranks, top_ids, top_probs = [], [], [], []
    for layer_log_probs in lens_layers(model, idx):
        every = layer_log_probs[0]  # (T, V): log p of every token after this layer
        came_next = every[:-1].gather(1, next_ids.unsqueeze(1))  # (T - 1, 1)
        log_probs.append(came_next.squeeze(1))  # (T - 1,)
        ranks.append(1 + (every[:-1] > came_next).sum(dim=1))  # (T - 1,): the tokens strictly likelier, plus one
        top_log_probs, ids = every.topk(min(k, every.shape[-1]), dim=-1)  # (T, k) each
        top_ids.append(ids)  # (T, k)
        top_probs.append(top_log_probs.exp())  # (T, k)
    return LensSummary(torch.stack(log_probs), torch.stack(ranks), torch.stack(top_ids), torch.stack(top_probs),  # (L, ...)
                       next_ids)
