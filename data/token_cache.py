"""Token ids on disk: the corpus split into train and val, tokenised once and cached.

The ids are cached under data.cache_dir in a folder named by a hash of the corpus, the split
and the tokenizer settings, so a second run starts at once and a changed corpus or tokenizer
never reuses stale ids. The corpus is tokenised as a stream (data/token_stream.py), so its size
is bounded by the disk, not the memory.
"""

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.specs import CorpusSpec, TokenizerSpec
from data.staging import remove_abandoned_staging, staging_path
from data.token_stream import Survey, encoded_corpus, survey_corpus, train_sample
from data.tokenizer import Tokenizer, build_tokenizer, tokenizer_from_state
from user_error import UserError

SPLITS = ("train", "val")
CHECKED_IDS = 4096  # at each end of each split, against the vocabulary, as an entry is read


@dataclass
class TokenData:
    tokenizer: Tokenizer
    train: np.ndarray  # (N_train,) token ids, memory-mapped from the cache
    val: np.ndarray  # (N_val,)
    text_key: str | None = None  # a hash of the corpus's documents (None: ids made some other way)


def prepare_tokens(corpus: CorpusSpec, tokenizer_spec: TokenizerSpec) -> TokenData:
    """The corpus as ids: its last val_fraction of characters is val, the tokenizer (BPE learns
    from the train part only) encodes both parts once, each document after the start token;
    uint16 when the vocabulary fits, else uint32. Cached."""
    survey = survey_corpus(corpus, tokenizer_spec)
    if not survey.has_text:
        raise UserError("the corpus is empty; give data.path a file with text in it")
    if corpus.text_key is not None and survey.text_key != corpus.text_key:  # before a tokenizer is learnt from it
        which = (f"the text of data.path={corpus.path}" if corpus.path else
                 "the built-in stories (another version of this project writes them otherwise)"
                 if corpus.source == "stories" else f"the {corpus.source} corpus")
        raise UserError(f"resume: {which} differs from the text this run trained on; give the run its corpus as it "
                        "was, or start a new run")
    cache_dir = Path(corpus.cache_dir)
    entry = cache_dir / "tokens" / survey.key
    remove_abandoned_staging(entry)
    entry_read = read_entry(entry, cache_dir)
    if entry_read is None:
        shutil.rmtree(entry, ignore_errors=True)
        built = build_tokenizer(tokenizer_spec, survey.chars, lambda: train_sample(corpus, survey), cache_dir, survey.key)
        write_cache_entry(entry, corpus, built, survey)
        entry_read = read_entry(entry, cache_dir)  # as a later run reads it back
        if entry_read is None:
            raise RuntimeError(f"the token cache entry {entry} just written does not read back")
    tokenizer, splits = entry_read
    return TokenData(tokenizer, train=splits["train"], val=splits["val"], text_key=survey.text_key)


def read_entry(entry: Path, cache_dir: Path) -> tuple[Tokenizer, dict[str, np.ndarray]] | None:
    """A cache entry's tokenizer and ids, where it can be used: its meta.json reads, its tokenizer
    builds, its ids files hold every token, and the ids at both ends of each are in the vocabulary
    (files of another vocabulary, or of noise, show there). None for any other (missing, half-written
    or damaged): it is made again."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
        itemsize = np.dtype(meta["dtype"]).itemsize
        if not all((entry / f"{split}.bin").stat().st_size == meta[f"n_{split}"] * itemsize for split in SPLITS):
            return None
        tokenizer = tokenizer_from_state(meta["tokenizer"], cache_dir)
        # A split of no tokens (a corpus of a few characters) is an empty array: mmap refuses an empty
        # file, and check_splits_fit then says what the split needs.
        splits = {split: np.memmap(entry / f"{split}.bin", dtype=meta["dtype"], mode="r") if meta[f"n_{split}"]
                  else np.zeros(0, dtype=meta["dtype"]) for split in SPLITS}
        if any(len(ids) and max(ids[:CHECKED_IDS].max(), ids[-CHECKED_IDS:].max()) >= tokenizer.vocab_size
               for ids in splits.values()):
            return None
        return tokenizer, splits
    except (OSError, ValueError, KeyError, TypeError, UserError):
        return None


def is_complete(entry: Path) -> bool:
    """Whether a cache entry can be used (read_entry)."""
    return read_entry(entry, entry.parent.parent) is not None


def write_cache_entry(entry: Path, corpus: CorpusSpec, tokenizer: Tokenizer, survey: Survey) -> None:
    """The ids, appended to the two files as they come. The entry is built in a temporary folder
    and renamed into place, so a run stopped half-way never leaves a partial entry that a later
    run would trust."""
    dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32
    staging = staging_path(entry)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    counts = dict.fromkeys(SPLITS, 0)
    try:
        with open(staging / "train.bin", "wb") as train_file, open(staging / "val.bin", "wb") as val_file:
            files = {"train": train_file, "val": val_file}
            for split, ids in encoded_corpus(corpus, tokenizer, survey):
                ids.astype(dtype).tofile(files[split])
                counts[split] += len(ids)
        meta = {"tokenizer": tokenizer.state(), "dtype": np.dtype(dtype).name, **{f"n_{s}": counts[s] for s in SPLITS}}
        (staging / "meta.json").write_text(json.dumps(meta))
        os.replace(staging, entry)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not is_complete(entry):  # not a race lost to another run writing the same entry
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # a refused or interrupted run keeps nothing
        raise
