"""Direct logit attribution: which part of the model wrote a token's logit.

The residual stream the final norm reads is a sum: the embeddings, then what every head and
every MLP added (model/gpt.py's Block: x + attn, then x + mlp). Freeze the final norm's scale at
the value the forward used and the norm is linear, so the logit splits into one share per part,
and the shares add up to the logit. A head's share is what it wrote directly; a head that only
feeds later heads has a share near 0 here, and shows in a knock-out (knock_out_effects).

A head's whole effect, through later layers too, is what knocking it out costs:
inspection/patching.py's knock_out_effects.

The labels are TransformerLens's: "embed", "pos_embed", "L{l}H{h}", "{l}_mlp_out", "bias"; and
"smear" for the smear's addition (model.smear=true).
"""

import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from model import GPT, eval_mode
from user_error import UserError, quoted

Tokens = int | Sequence[int] | torch.Tensor  # one token id, or one per row of the batch


@dataclass
class LogitAttribution:
    """Each part's direct share of a logit (or logit difference), one value per row of the batch."""

    shares: dict[str, torch.Tensor]  # part label -> (B,), in the order the forward adds them
    logit: torch.Tensor  # (B,): the model's own logit (difference); the shares sum to it
    n_layer: int
    n_head: int

    def heads(self) -> torch.Tensor:
        """The heads' shares as a grid: (L, H, B)."""
        return torch.stack([torch.stack([self.shares[f"L{layer}H{head}"] for head in range(self.n_head)])
                            for layer in range(self.n_layer)])  # (L, H, B)

    def total(self) -> torch.Tensor:
        """The shares added up: (B,), the logit within float error."""
        return torch.stack(list(self.shares.values())).sum(dim=0)  # (P, B) -> (B,)


def check_position(position: int, T: int) -> int:
    """position as an index 0 .. T - 1 (a negative one counts from the end); UserError outside."""
    try:
        position = operator.index(position)  # an int, numpy's or torch's too; not a float
    except TypeError:
        raise UserError(f"position {position!r} is not a whole number: give the token's index, e.g. -1 for the last") from None
    if not -T <= position < T:
        raise UserError(f"position {position} is out of range: the sequence has {T} tokens "
                        f"(positions 0 to {T - 1}, or -{T} to -1 from the end)")
    return position % T


def token_ids(ids: Tokens, V: int, B: int, name: str = "token") -> torch.Tensor:
    """ids as a (B,) tensor of token ids, one per row of the batch (one id serves every row);
    UserError for an id outside 0 .. V - 1 or a count that is neither 1 nor B."""
    if (text := text_among(ids)) is not None:
        raise UserError(f"{name}={quoted(text)} is text: give its token id, e.g. tokenizer.encode({quoted(text)})[0] "
                        "for a text of one token")
    try:
        ids = torch.as_tensor(ids).reshape(-1)  # (1,) or (B,)
    except (TypeError, RuntimeError, ValueError):  # None, or what no tensor holds
        raise UserError(f"{name}={ids!r} is not a token id: give one, e.g. {name}=tokenizer.encode(' Mia')[0], "
                        "or one per row of the batch") from None
    if ids.numel() not in (1, B):
        raise UserError(f"{name} gives {ids.numel()} token ids for a batch of {B}: give one id, or one per row")
    shown = ids.tolist() if ids.numel() > 1 else ids.item()  # 9999, not [9999], for the id given alone
    if ids.is_floating_point() or ids.dtype == torch.bool:  # 5.0 and True are no ids, though 5 and 1 are
        raise UserError(f"{name}={shown} is not a token id: an id is a whole number ({ids.dtype} given), e.g. "
                        f"{name}=tokenizer.encode(' Mia')[0]")
    if not bool(((ids >= 0) & (ids < V)).all()):
        raise UserError(f"{name}={shown} is not a token id of this model: ids run from 0 to {V - 1}")
    return ids.expand(B)  # (B,)


def text_among(ids: object) -> str | None:
    """The text a learner typed in place of a token id (ids itself, or one item of a list), else None."""
    if isinstance(ids, str):
        return ids
    if isinstance(ids, Sequence):
        return next((item for item in ids if isinstance(item, str)), None)
    return None


def token_direction(model: GPT, token: Tokens, other: Tokens | None, B: int) -> torch.Tensor:
    """The LM head's row of token, less other's when given: (B, C), one per row of the batch.
    A logit (difference) is this direction's dot product with the final norm's output."""
    W_U = model.lm_head.weight  # (V, C)
    tokens = token_ids(token, W_U.shape[0], B)  # (B,)
    direction = W_U[tokens.to(W_U.device)]  # (B, C)
    if other is not None:
        others = token_ids(other, W_U.shape[0], B, "other")  # (B,)
        check_different(tokens, others)
        direction = direction - W_U[others.to(W_U.device)]  # (B, C)
    return direction


@torch.no_grad()
def residual_parts(model: GPT, idx: torch.Tensor) -> tuple[list[str], torch.Tensor, torch.Tensor, torch.Tensor]:
    """idx (B, T) -> (labels, parts, scale, logits): parts (P, B, T, C) add up to the stream that
    leaves the last block; scale (B, T, 1) is what the final norm divided that stream by, and
    logits (B, T, V) the output of that same forward.

    "bias" holds the attention output projections' biases (shared by a layer's heads); an MLP's
    own bias is inside its {l}_mlp_out, as in TransformerLens."""
    wanted = ("hook_embed", "smear.hook_out", "hook_pos_embed", "attn.hook_z", "hook_mlp_out", "ln_final.hook_scale")
    with eval_mode(model):
        logits, cache = model.run_with_cache(idx, names=lambda name: name.endswith(wanted))
    labels, parts = cache.embedding_parts()  # embed, smear, pos_embed: (B, T, C) each
    heads, head_labels = cache.stack_head_results(return_labels=True)  # (L * H, B, T, C)
    H = model.config.n_head
    bias = torch.zeros_like(parts[0])  # (B, T, C)
    for layer, block in enumerate(model.blocks):
        labels += head_labels[layer * H : (layer + 1) * H]
        parts += list(heads[layer * H : (layer + 1) * H])  # H x (B, T, C)
        if block.attn.proj.bias is not None:
            bias = bias + block.attn.proj.bias  # (B, T, C) + (C,)
        labels.append(f"{layer}_mlp_out")
        parts.append(cache["mlp_out", layer])  # (B, T, C)
    labels.append("bias")
    parts.append(bias)
    return labels, torch.stack(parts), cache["ln_final.hook_scale"], logits  # (P, B, T, C)


@torch.no_grad()
def logit_attribution(model: GPT, idx: torch.Tensor, position: int, token: Tokens,
                      other: Tokens | None = None) -> LogitAttribution:
    """Each part's direct share of the logit of `token` at `position` of idx (B, T), or of the
    difference token - other: the part through the final norm (its scale frozen at the
    forward's) and the LM head. The final norm's own bias joins "bias"."""
    model.check_token_ids(idx)
    B, T = idx.shape
    position = check_position(position, T)
    direction = token_direction(model, token, other, B)  # (B, C)
    labels, parts, scale, logits = residual_parts(model, idx)
    parts, scale = parts[:, :, position], scale[:, position]  # (P, B, C), (B, 1)
    if isinstance(model.ln_f, torch.nn.LayerNorm):
        parts = parts - parts.mean(dim=-1, keepdim=True)  # (P, B, C): centring is linear too
    normed = parts / scale * model.ln_f.weight  # (P, B, C): each part as the norm passes it on
    shares = (normed * direction).sum(dim=-1)  # (P, B)
    if getattr(model.ln_f, "bias", None) is not None:
        shares[-1] += direction @ model.ln_f.bias  # (B,): the final norm's bias, straight to the logits
    logit = real_logit(logits[:, position], token, other)  # (B,)
    return LogitAttribution(dict(zip(labels, shares, strict=True)), logit, len(model.blocks), model.config.n_head)


def check_different(tokens: torch.Tensor, others: torch.Tensor) -> None:
    """UserError where a row scores a token against itself: a difference that is 0 on any text."""
    if bool((others == tokens).any()):
        same = int(tokens[others == tokens][0])
        raise UserError(f"token and other are both id {same}: their difference is 0 whatever the model does; "
                        "give other a token that competes with it")


def real_logit(logits: torch.Tensor, token: Tokens, other: Tokens | None) -> torch.Tensor:
    """logits (B, V) at one position -> (B,): token's logit, less other's when given."""
    B, V = logits.shape

    def logit_of(rows: torch.Tensor) -> torch.Tensor:
        return logits.gather(1, rows.to(logits.device).unsqueeze(1)).squeeze(1)  # (B, V) -> (B,)

    tokens = token_ids(token, V, B)  # (B,)
    if other is None:
        return logit_of(tokens).float()
    others = token_ids(other, V, B, "other")  # (B,)
    check_different(tokens, others)
    return (logit_of(tokens) - logit_of(others)).float()
