"""One forward on a learner's own text, for the Attention tab: every head's attention weights
on its tokens, the model's likeliest next tokens after each one, and the loss of the token that
really came next; with heads knocked out, the same numbers beside the intact model's."""

from collections.abc import Collection
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from data.tokenizer import Tokenizer
from inspection.heatmap import readable_token
from model import GPT, eval_mode
from model.hooks import is_pattern
from user_error import UserError, quoted

TOP_K = 5
CHARS_PER_TOKEN = 32  # a text with more characters than this per token it may hold is too long before tokenizing


@dataclass
class Predictions:
    """What the model says after each of T tokens, k next-token guesses each."""

    top_ids: torch.Tensor  # (T, k) the likeliest next tokens, likeliest first
    top_probs: torch.Tensor  # (T, k) their probabilities
    next_loss: torch.Tensor  # (T - 1,) -log p(the token that came next), in nats
    log_probs: torch.Tensor  # (T, vocab_size)


@dataclass
class TextForward:
    ids: list[int]  # (T,) the start token (<|endoftext|>), then the text's tokens
    labels: list[str]  # (T,) each token as the tab prints it
    weights: torch.Tensor  # (L, H, T, T) attention weights, with the heads knocked_out out
    predictions: Predictions
    knocked_out: list[tuple[int, int]]  # (layer, head), sorted
    intact: Predictions | None  # the intact model's, when heads are knocked out
    intact_top_probs: torch.Tensor | None  # (T, k) the intact model's probabilities of predictions.top_ids


def text_ids(tokenizer: Tokenizer, text: str, block_size: int) -> list[int]:
    """The start token (tokenizer.bos_id: <|endoftext|>, or Llama's <|begin_of_text|>) and the text's
    ids, as a document starts in training; UserError when the text is empty or does not fit in
    block_size tokens."""
    if not text.strip():
        raise UserError("the text is empty: type a sentence")
    if block_size < 2:  # "at most 0 tokens after the <eot>": no text at all fits
        raise UserError(f"this model's block_size={block_size} leaves no room for a text after the <eot> each one starts "
                        "with: use a run of model.block_size=2 or more")
    if len(text) > CHARS_PER_TOKEN * block_size:  # tokenizing a megabyte to say it is too long would take long
        raise UserError(f"the text is too long: {len(text):,} characters, and this model reads at most "
                        f"{block_size} tokens (its block_size); shorten it")
    ids = [tokenizer.bos_id, *tokenizer.encode(text)]
    if len(ids) > block_size:
        raise UserError(f"the text is too long: {len(ids) - 1} tokens, and this model reads at most {block_size - 1} "
                        f"after the <eot> it starts with ({block_size} in all, its block_size); shorten it")
    return ids


def single_token(tokenizer: Tokenizer, text: str) -> int:
    """The id of a text the tokenizer reads as one token (" Mary", its leading space part of it);
    UserError naming the pieces when it makes several, or none."""
    if not text:
        raise UserError("the token is empty: type one, e.g. ' Mary' (a word's token starts with its space)")
    if len(text) > CHARS_PER_TOKEN:  # no token is that long: say so before tokenizing a megabyte
        raise UserError(f"{quoted(text, 32)} is not one token: {len(text):,} characters; type a single token, e.g. ' Mary'")
    ids = tokenizer.encode(text)
    if len(ids) != 1:
        pieces = ", ".join(f"'{readable_token(piece)}'" for piece in tokenizer.token_strings(ids))  # escaped once, as labels are
        raise UserError(f"{quoted(text)} is {len(ids)} tokens to this model ({pieces}), not one: type a single token")
    return ids[0]


def check_heads(model: GPT, heads: Collection[tuple[int, int]]) -> None:
    """UserError unless every (layer, head) of heads is one of model's: GPT.check_heads, with a
    pair spelt as the tab writes it (2:0)."""
    try:
        model.check_heads(heads, spelt=lambda layer, head: f"{layer}:{head}")
    except ValueError as error:
        raise UserError(str(error)) from None


@torch.no_grad()
def predict(model: GPT, idx: torch.Tensor, k: int) -> tuple[torch.Tensor, Predictions]:
    """idx (1, T): the attention weights (L, H, T, T) and the predictions, from one forward
    (with whatever functions an enclosing model.hooks() block attached)."""
    with eval_mode(model):
        logits, cache = model.run_with_cache(idx, names=is_pattern)  # (1, T, vocab_size)
    logits = logits[0].float()  # (T, vocab_size)
    log_probs = F.log_softmax(logits, dim=-1)  # (T, vocab_size)
    top_log_probs, top_ids = log_probs.topk(min(k, log_probs.shape[-1]), dim=-1)  # (T, k), (T, k)
    next_ids = idx[0, 1:]  # (T - 1,) the tokens that really came next
    next_loss = -log_probs[:-1].gather(1, next_ids.unsqueeze(1)).squeeze(1)  # (T - 1,)
    weights = cache.stack_activation("pattern")[:, 0]  # (L, H, T, T)
    return weights, Predictions(top_ids, top_log_probs.exp(), next_loss, log_probs)


def forward_text(model: GPT, tokenizer: Tokenizer, text: str, knocked_out: Collection[tuple[int, int]] = (),
                 k: int = TOP_K, intact: Predictions | None = None) -> TextForward:
    """The model reads text after the start token, with the heads in knocked_out switched off.
    intact: the intact model's predictions on this text, when the caller kept them from an
    earlier read (the tab: type a text, then knock heads out); else a second forward makes them."""
    return forward_ids(model, tokenizer, text_ids(tokenizer, text, model.config.block_size), knocked_out, k, intact)


def forward_ids(model: GPT, tokenizer: Tokenizer, ids: list[int], knocked_out: Collection[tuple[int, int]] = (),
                k: int = TOP_K, intact: Predictions | None = None) -> TextForward:
    """forward_text on token ids (at most block_size of them) rather than on a text."""
    heads = sorted(set(knocked_out))
    check_heads(model, heads)
    device = next(model.parameters()).device
    idx = torch.tensor([ids], device=device)  # (1, T)
    with model.hooks(model.knock_out(heads)):
        weights, predictions = predict(model, idx, k)
    intact_top_probs = None
    if not heads:
        intact = None
    else:
        if intact is None:
            _, intact = predict(model, idx, k)
        intact_top_probs = intact.log_probs.gather(1, predictions.top_ids).exp()  # (T, k)
    labels = [readable_token(piece) for piece in tokenizer.token_strings(ids)]
    return TextForward(ids, labels, weights, predictions, heads, intact, intact_top_probs)
