"""Windows of token ids read from a split: random training batches, the probe text, and the check that
each split holds a window."""

from pathlib import Path

import numpy as np
import torch

from data.token_cache import TokenData
from data.tokenizer import Tokenizer
from user_error import UserError


def get_batch(
    tokens: np.ndarray, batch_size: int, block_size: int, rng: np.random.Generator, vocab_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x and y, both (batch_size, block_size) int64: y[b, t] is the token after x[b, t]. With
    vocab_size, an id past the vocabulary is refused here, where the ids' file can be named: the
    model would fail on it as a traceback, or a GPU's kernel as a device-side assert."""
    starts = rng.integers(0, len(tokens) - block_size, size=batch_size)  # (B,)
    offsets = starts[:, None] + np.arange(block_size + 1)  # (B, T + 1)
    windows = torch.from_numpy(tokens[offsets].astype(np.int64))  # (B, T + 1)
    if vocab_size is not None:
        check_in_vocabulary(tokens, int(windows.max()), vocab_size)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()  # (B, T), (B, T)


def check_in_vocabulary(tokens: np.ndarray, top: int, vocab_size: int) -> None:
    """UserError where top, the largest id read from tokens, is past the vocabulary: a token cache
    file damaged after it was written (its entry's check reads the ids at both ends of each file alone)."""
    if top < vocab_size:
        return
    file = getattr(tokens, "filename", None)  # a memory-mapped cache file's path
    if file is None:
        raise UserError(f"the token ids hold {top}, past the vocabulary's {vocab_size} ids (0 to {vocab_size - 1})")
    entry = Path(file).parent
    raise UserError(f"the token cache's {Path(file).name} in {entry} holds id {top}, past the vocabulary's {vocab_size} "
                    f"ids: the file is damaged; delete {entry} and run again (the ids are made again from the corpus)")


def probe_ids(tokens: np.ndarray, tokenizer: Tokenizer, n: int) -> list[int]:
    """The first n ids of the first document that starts in tokens, after its start token
    (or of tokens itself, when no document starts near the start); an id past the tokenizer's
    vocabulary is refused as get_batch refuses it."""
    head = tokens[:50_000]
    starts = np.flatnonzero(head == tokenizer.bos_id)
    start = int(starts[0]) + 1 if len(starts) else 0
    start = min(start, max(len(tokens) - n, 0))  # keep n ids when the split is short
    ids = [int(t) for t in tokens[start : start + n]]
    if ids:
        check_in_vocabulary(tokens, max(ids), tokenizer.vocab_size)
    return ids


def check_splits_fit(data: TokenData, block_size: int) -> None:
    """Each split must hold at least one training window of block_size + 1 tokens. The refusal
    names every split that is too short, and a block_size it suggests fits both."""
    sizes = {"train": len(data.train), "val": len(data.val)}
    short = [f"the {split} split has {size}" for split, size in sizes.items() if size <= block_size]
    if not short:
        return
    fits = min(sizes.values())  # a window of fits tokens (block_size fits - 1) is the longest both splits hold
    if sizes["train"] > block_size:  # the val split alone: the share held out is the lever
        fix = "raise data.val_fraction (the share of the text held out for it), " + (
            f"use a longer corpus, or a model.block_size under {fits}" if fits >= 2 else "or use a longer corpus")
    elif sizes["val"] > block_size:  # the train split alone: it gets what is not held out
        fix = "lower data.val_fraction (the share of the text held out for validation), " + (
            f"use a longer corpus, or a model.block_size under {fits}" if fits >= 2 else "or use a longer corpus")
    elif fits < 2:  # no window fits in one of them, whatever its size
        fix = "use a longer corpus"
    else:
        fix = f"use a longer corpus, or a model.block_size under {fits}"
    raise UserError(f"model.block_size={block_size} needs more than {block_size} tokens in each split, but "
                    f"{' and '.join(short)}; {fix}")
