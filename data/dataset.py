"""Token ids on disk, the train/val split, random training windows and the probe text.

The ids are cached under data.cache_dir in a folder named by a hash of the corpus, the split
and the tokenizer settings, so a second run starts at once and a changed corpus or tokenizer
never reuses stale ids.
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

from data.corpus import load_documents, split_documents
from data.tokenizer import Tokenizer, build_tokenizer, tokenizer_from_state
from training.errors import UserError

CACHE_FORMAT = 2  # bump when the cache layout changes, so old entries are not read
SPLITS = ("train", "val")


@dataclass
class TokenData:
    tokenizer: Tokenizer
    train: np.ndarray  # (N_train,) token ids, memory-mapped from the cache
    val: np.ndarray  # (N_val,)


def prepare_tokens(data_cfg: Mapping[str, Any], tokenizer_cfg: Mapping[str, Any]) -> TokenData:
    """The corpus as ids: its last val_fraction of characters is val, the tokenizer (BPE learns
    from the train part only) encodes both parts once, each document after an <|endoftext|>;
    uint16 when the vocabulary fits, else uint32. Cached."""
    documents = load_documents(data_cfg)
    if not any(doc.strip() for doc in documents):
        raise UserError("the corpus is empty; give data.path a file with text in it")
    cache_dir = Path(data_cfg["cache_dir"])
    entry = cache_dir / "tokens" / cache_key(documents, data_cfg["val_fraction"], tokenizer_cfg)
    if not is_complete(entry):
        shutil.rmtree(entry, ignore_errors=True)
        write_cache_entry(entry, documents, data_cfg["val_fraction"], tokenizer_cfg, cache_dir)
    meta = json.loads((entry / "meta.json").read_text())
    splits = {split: np.memmap(entry / f"{split}.bin", dtype=meta["dtype"], mode="r") for split in SPLITS}
    return TokenData(tokenizer_from_state(meta["tokenizer"], cache_dir), train=splits["train"], val=splits["val"])


def cache_key(documents: list[str], val_fraction: float, tokenizer_cfg: Mapping[str, Any]) -> str:
    settings = {"format": CACHE_FORMAT, "val_fraction": val_fraction, "tokenizer": dict(tokenizer_cfg)}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for doc in documents:  # the length first, so document boundaries count too
        raw = doc.encode("utf-8")
        digest.update(len(raw).to_bytes(8, "little") + raw)
    return digest.hexdigest()[:24]


def is_complete(entry: Path) -> bool:
    """A cache entry is used only if its meta.json exists and its ids files hold every token."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
        itemsize = np.dtype(meta["dtype"]).itemsize
        return all((entry / f"{split}.bin").stat().st_size == meta[f"n_{split}"] * itemsize for split in SPLITS)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def encode_documents(tokenizer: Tokenizer, documents: list[str], starts_mid_document: bool = False) -> list[int]:
    """<|endoftext|> doc <|endoftext|> doc ...: every document follows an end-of-text token,
    so generation from <|endoftext|> starts a new one. A leading piece that continues a
    document cut in two gets no token before it."""
    ids: list[int] = []
    for i, doc in enumerate(documents):
        if not (i == 0 and starts_mid_document):
            ids.append(tokenizer.eot_id)
        ids.extend(tokenizer.encode(doc))
    return ids


def write_cache_entry(
    entry: Path, documents: list[str], val_fraction: float, tokenizer_cfg: Mapping[str, Any], cache_dir: Path
) -> None:
    train_docs, val_docs, val_continues = split_documents(documents, val_fraction)
    tokenizer = build_tokenizer(tokenizer_cfg, train_text="".join(train_docs), full_text="".join(documents), cache_dir=cache_dir)
    dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32
    ids = {
        "train": np.array(encode_documents(tokenizer, train_docs), dtype=dtype),
        "val": np.array(encode_documents(tokenizer, val_docs, starts_mid_document=val_continues), dtype=dtype),
    }
    # Build the entry in a temporary folder and rename it into place, so a run that is
    # stopped half-way never leaves a partial entry that a later run would trust.
    staging = entry.with_name(f"{entry.name}.tmp-{os.getpid()}")
    staging.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        ids[split].tofile(staging / f"{split}.bin")
    meta = {"tokenizer": tokenizer.state(), "dtype": np.dtype(dtype).name, **{f"n_{s}": len(ids[s]) for s in SPLITS}}
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
    """The first n ids of the first document that starts in tokens, after its
    <|endoftext|> (or of tokens itself, when no document starts near the start)."""
    head = tokens[:50_000]
    starts = np.flatnonzero(head == tokenizer.eot_id)
    start = int(starts[0]) + 1 if len(starts) else 0
    start = min(start, max(len(tokens) - n, 0))  # keep n ids when the split is short
    return [int(t) for t in tokens[start : start + n]]


def check_splits_fit(data: TokenData, block_size: int) -> None:
    """Each split must hold at least one training window of block_size + 1 tokens."""
    for split, tokens in (("train", data.train), ("val", data.val)):
        if len(tokens) <= block_size:
            raise UserError(
                f"model.block_size={block_size} needs more than {block_size} tokens in each split, but the "
                f"{split} split has {len(tokens)}; use a longer corpus or a smaller model.block_size"
            )
