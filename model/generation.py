"""Generation: from a model's next-token logits to new tokens, and from a prompt to text."""

from typing import Protocol

import torch

from model.gpt import GPT, eval_mode


class Tokenizer(Protocol):
    """What generate_text needs of a tokenizer; every tokenizer in data/tokenizer.py has it."""

    eot_id: int

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Set to -inf every logit outside the top_k likeliest and outside the smallest set
    whose probabilities reach top_p. logits: (B, V); returns (B, V).
    top_k keeps tokens tied with the k-th likeliest too. top_k None or 0 and top_p None or
    1.0 leave the logits unchanged."""
    if top_k:
        k = min(top_k, logits.size(-1))
        kth_largest = torch.topk(logits, k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))  # (B, V)
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)  # (B, V), (B, V)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)  # (B, V)
        # Probability mass of the tokens ranked before each token: a token stays while that
        # mass is below top_p. The likeliest token always stays, whatever top_p is.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # (B, V)
        drop_sorted = mass_before >= top_p  # (B, V)
        drop_sorted[:, 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # (B, V) back in vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))  # (B, V)
    return logits


@torch.inference_mode()  # like no_grad, with less bookkeeping per op: decoding runs many tiny ops
def generate_tokens(
    model: GPT,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    use_kv_cache: bool = True,
) -> torch.Tensor:
    """Continue idx (B, T) by max_new_tokens tokens; returns (B, T + max_new_tokens).

    temperature 0 is greedy decoding; top_k keeps the k likeliest tokens; top_p keeps
    the smallest set whose probabilities add up to p.

    The model sees a window of the text, idx[:, start:], at most block_size tokens: the
    whole text while it fits, and once one more token would not fit, the window slides by
    jumping to the last 3/4 of block_size tokens, then grows again one token at a time.

    use_kv_cache: feed each new token alone, with the window's earlier keys and values
    kept in a KVCache per layer, instead of recomputing the whole window every step. It
    changes the speed, never the tokens: both ways see the same window. (The window jumps
    rather than moving one token at a time because, with learned positions, moving it
    would give every kept token a new position and make its cached keys and values
    stale; jumping by a quarter rebuilds the cache once per block_size / 4 new tokens.)
    """
    block_size = model.config.block_size
    keep = max(1, block_size * 3 // 4)  # tokens the window keeps when it slides
    start = max(0, idx.shape[1] - block_size)  # the window is idx[:, start:]
    caches = None  # the KV caches (model.new_caches()) of the current window
    with eval_mode(model):
        for _ in range(max_new_tokens):
            if idx.shape[1] - start > block_size:  # the window is full: slide it, start a new cache
                start, caches = idx.shape[1] - keep, None
            if not use_kv_cache:
                logits, _ = model(idx[:, start:])  # (B, T, vocab_size): the whole window, again
            elif caches is None:
                caches = model.new_caches()
                logits, _ = model(idx[:, start:], caches=caches)  # (B, T, vocab_size), filling the caches
            else:
                logits, _ = model(idx[:, -1:], caches=caches)  # (B, 1, vocab_size): the newest token alone
            next_logits = logits[:, -1, :]  # (B, vocab_size): only the last position predicts
            if not torch.isfinite(next_logits).all():
                raise FloatingPointError("the model's next-token logits are NaN or inf: its weights have diverged")
            if temperature == 0:
                next_token = next_logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:
                next_logits = filter_logits(next_logits / temperature, top_k, top_p)  # (B, vocab_size)
                probs = torch.softmax(next_logits, dim=-1)  # (B, vocab_size)
                next_token = torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)
            idx = torch.cat([idx, next_token], dim=1)  # (B, T + 1)
    return idx


def generate_text(
    model: GPT,
    tokenizer: Tokenizer,
    prompt: str,
    max_new_tokens: int,
    temperature: float = 0.6,
    top_k: int | None = None,
    top_p: float | None = None,
    num_samples: int = 1,
    seed: int = 0,
    use_kv_cache: bool = True,
) -> list[str]:
    """num_samples continuations of prompt, each returned as prompt + new text. The same
    seed gives the same samples."""
    device = next(model.parameters()).device
    # Start where every training document starts, after <|endoftext|>, so the model knows
    # it is at the beginning; that token is not part of the output.
    context = [tokenizer.eot_id]
    ids = context + tokenizer.encode(prompt)
    batch = torch.tensor([ids] * num_samples, dtype=torch.long, device=device)  # (num_samples, T0)
    generator = torch.Generator(device=device).manual_seed(seed)
    tokens = generate_tokens(model, batch, max_new_tokens, temperature, top_k, top_p, generator=generator, use_kv_cache=use_kv_cache)
    return [tokenizer.decode(row[len(context) :].tolist()) for row in tokens]
