"""Token ids on disk, the train/val split, and random training windows.

    prepare_tokens(data_cfg, tokenizer_cfg) -> TokenData
        Loads the corpus, builds the tokenizer and encodes the text once; the ids are
        cached under data.cache_dir in a folder named by a hash of the corpus text and the
        tokenizer settings, so a second run starts at once and a changed corpus or
        tokenizer never reuses stale ids. The last val_fraction of the ids is val.
    get_batch(tokens, batch_size, block_size, rng) -> (x, y)
        Random contiguous windows of block_size + 1 ids; y is x shifted left by one.
    probe_ids(tokens, tokenizer, n) -> list[int]
        n ids from the start of the first document in tokens (the attention probe); a
        document starts after a separator (a blank line), or at the start of tokens.
    check_splits_fit(data, block_size)
        DataError unless each split holds a window of block_size + 1 tokens.
"""

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from data.corpus import join_documents, load_documents
from data.errors import DataError
from data.tokenizer import Tokenizer, build_tokenizer, document_start_ids, tokenizer_from_state

CACHE_FORMAT = 1  # bump when the cache layout changes, so old entries are not read


@dataclass
class TokenData:
    tokenizer: Tokenizer
    train: np.ndarray  # (N_train,) token ids, memory-mapped from the cache
    val: np.ndarray  # (N_val,)


def prepare_tokens(data_cfg: Mapping[str, Any], tokenizer_cfg: Mapping[str, Any]) -> TokenData:
    text = join_documents(load_documents(data_cfg))
    if not text.strip():
        raise DataError("the corpus is empty; give data.path a file with text in it")
    entry = Path(data_cfg["cache_dir"]) / "tokens" / cache_key(text, tokenizer_cfg)
    if not is_complete(entry):
        shutil.rmtree(entry, ignore_errors=True)
        write_cache_entry(entry, text, tokenizer_cfg)
    meta = json.loads((entry / "meta.json").read_text())
    ids = np.memmap(entry / "tokens.bin", dtype=meta["dtype"], mode="r")
    n_val = int(len(ids) * data_cfg["val_fraction"])
    return TokenData(tokenizer_from_state(meta["tokenizer"]), train=ids[: len(ids) - n_val], val=ids[len(ids) - n_val :])


def cache_key(text: str, tokenizer_cfg: Mapping[str, Any]) -> str:
    settings = json.dumps({"format": CACHE_FORMAT, "tokenizer": dict(tokenizer_cfg)}, sort_keys=True)
    digest = hashlib.sha256(settings.encode())
    digest.update(text.encode("utf-8"))
    return digest.hexdigest()[:24]


def is_complete(entry: Path) -> bool:
    """A cache entry is used only if its meta.json exists and its ids file has every token."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
        return (entry / "tokens.bin").stat().st_size == meta["n_tokens"] * np.dtype(meta["dtype"]).itemsize
    except (OSError, ValueError, KeyError):
        return False


def write_cache_entry(entry: Path, text: str, tokenizer_cfg: Mapping[str, Any]) -> None:
    tokenizer = build_tokenizer(tokenizer_cfg, text)
    dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32
    ids = np.array(tokenizer.encode(text), dtype=dtype)
    # Build the entry in a temporary folder and rename it into place, so a run that is
    # stopped half-way never leaves a partial entry that a later run would trust.
    staging = entry.with_name(f"{entry.name}.tmp-{os.getpid()}")
    staging.mkdir(parents=True, exist_ok=True)
    ids.tofile(staging / "tokens.bin")
    meta = {"tokenizer": tokenizer.state(), "dtype": np.dtype(dtype).name, "n_tokens": len(ids)}
    (staging / "meta.json").write_text(json.dumps(meta))
    try:
        os.replace(staging, entry)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not is_complete(entry):  # not a race lost to another run writing the same entry
            raise


def get_batch(
    tokens: np.ndarray, batch_size: int, block_size: int, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """x and y, both (batch_size, block_size) int64: y[b, t] is the token after x[b, t]."""
    starts = rng.integers(0, len(tokens) - block_size, size=batch_size)  # (B,)
    offsets = starts[:, None] + np.arange(block_size + 1)  # (B, T + 1)
    windows = torch.from_numpy(tokens[offsets].astype(np.int64))  # (B, T + 1)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()  # (B, T), (B, T)


def probe_ids(tokens: np.ndarray, tokenizer: Tokenizer, n: int) -> list[int]:
    """The first n ids of the first document that starts in tokens (or of tokens itself,
    when no document separator is found near the start)."""
    separator = document_start_ids(tokenizer)
    k = len(separator)
    head = tokens[:50_000].tolist()
    start = next((i + k for i in range(len(head) - k) if k and head[i : i + k] == separator), 0)
    start = min(start, max(len(tokens) - n, 0))  # keep n ids when the split is short
    return [int(t) for t in tokens[start : start + n]]


def check_splits_fit(data: TokenData, block_size: int) -> None:
    """Each split must hold at least one training window of block_size + 1 tokens."""
    for split, tokens in (("train", data.train), ("val", data.val)):
        if len(tokens) <= block_size:
            raise DataError(
                f"model.block_size={block_size} needs more than {block_size} tokens in each split, but the "
                f"{split} split has {len(tokens)}; use a longer corpus or a smaller model.block_size"
            )
