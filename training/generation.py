"""Prompt text in, generated text out: the one path from a prompt to decoded samples,
used by train.py (logged samples) and sample.py."""

import torch

from data.tokenizer import Tokenizer
from model import GPT


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
    tokens = model.generate(batch, max_new_tokens, temperature, top_k, top_p, generator=generator, use_kv_cache=use_kv_cache)
    return [tokenizer.decode(row[len(context) :].tolist()) for row in tokens]
