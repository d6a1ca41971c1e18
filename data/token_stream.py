"""A corpus of any size tokenised as a stream, in bounded memory: it is read (data/corpus.py)
once to survey it, once more for a BPE sample when a vocabulary is to be learned, and once to
encode it, a few megabytes at a time, into ids that go straight to disk.

The ids are exactly those of encoding the whole corpus at once: an <|endoftext|> before each
document, and each document's text encoded as one string, except that the train/val cut (the
last val_fraction of the characters is val) encodes the two sides of a document it falls in
apart. Long text is handed to the tokenizer in segments cut where BPE's pre-tokenisation starts
a new piece whatever follows: before a space between two non-space characters.
"""

import hashlib
import json
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import regex
from tqdm import tqdm

from data.corpus import Piece, read_corpus
from data.tokenizer import Tokenizer

log = logging.getLogger(__name__)

CACHE_FORMAT = 3  # bump when the cache key or layout changes, so old entries are not read
BATCH_CHARS = 4_000_000  # text encoded per batch (tiktoken spreads a batch over the cores)
MAX_SEGMENT_CHARS = 16_000_000  # text without a safe cut this long is cut anyway (no spaces at all)
BPE_SAMPLE_CHARS = 20_000_000  # at most this much train text teaches BPE; see train_sample
SAMPLE_BLOCK_CHARS = 1_000_000
SAFE_CUT = regex.compile(r"(?r)(?<=\S) (?=\S)")  # (?r): searched from the end


@dataclass
class Survey:
    """What one read of the corpus tells: its cache key, length and characters."""

    key: str
    n_chars: int
    n_train: int  # the first n_train characters are the train split
    chars: set[str] = field(repr=False)
    has_text: bool


def survey_corpus(data_cfg: Mapping[str, Any], tokenizer_cfg: Mapping[str, Any]) -> Survey:
    """The key hashes the settings and the hash of each document in turn, so that where
    documents begin counts too, not only the text."""
    settings = {"format": CACHE_FORMAT, "val_fraction": data_cfg["val_fraction"], "tokenizer": dict(tokenizer_cfg)}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    document, n_chars, chars, has_text = None, 0, set(), False
    with progress("reading the corpus", unit="char") as bar:
        for piece in read_corpus(data_cfg):
            if piece.starts_document:
                if document is not None:
                    key.update(document.digest())
                document = hashlib.sha256()
            document.update(piece.text.encode("utf-8"))
            n_chars += len(piece.text)
            chars.update(piece.text)
            has_text = has_text or bool(piece.text.strip())
            bar.update(len(piece.text))
    if document is not None:
        key.update(document.digest())
    n_train = n_chars - int(n_chars * data_cfg["val_fraction"])
    return Survey(key.hexdigest()[:24], n_chars, n_train, chars, has_text)


def split_pieces(pieces: Iterator[Piece], n_train: int) -> Iterator[tuple[str, Piece]]:
    """("train" | "val", piece): the piece the cut falls in is given as its two sides; the val
    side starts a document only if the whole document is val."""
    position = 0
    for piece in pieces:
        end = position + len(piece.text)
        if end <= n_train:
            yield "train", piece
        elif position >= n_train:
            yield "val", piece
        else:
            inside = n_train - position
            if inside:
                yield "train", Piece(piece.text[:inside], piece.starts_document)
            yield "val", Piece(piece.text[inside:], piece.starts_document and not inside)
        position = end


def train_sample(data_cfg: Mapping[str, Any], survey: Survey) -> str:
    """The text BPE learns from: the whole train split when it has at most BPE_SAMPLE_CHARS
    characters, else that many in blocks spread evenly over it, so a large corpus is learned
    from in bounded time and memory (the pure-Python trainer holds every pre-token of its text)."""
    stride = -(-survey.n_train // BPE_SAMPLE_CHARS)  # take one block in every `stride`
    taken: list[str] = []
    position = 0
    for split, piece in split_pieces(read_corpus(data_cfg), survey.n_train):
        if split == "val":
            break
        text, start = piece.text, position
        while text:
            block, offset = divmod(start, SAMPLE_BLOCK_CHARS)
            part = text[: SAMPLE_BLOCK_CHARS - offset]
            if block % stride == 0:
                taken.append(part)
            text, start = text[len(part):], start + len(part)
        position = start
    return "".join(taken)


@dataclass
class EncodedSplits:
    """Encodes (split, piece) pairs in order into (split, ids) arrays: segments are gathered into
    batches of about BATCH_CHARS characters and encoded together."""

    tokenizer: Tokenizer
    batch: list[tuple[str, str | None]] = field(default_factory=list)  # (split, text), None: <|endoftext|>
    carry: str = ""  # the end of a document not yet safe to encode
    carry_split: str = "train"
    batch_chars: int = 0

    def feed(self, split: str, piece: Piece) -> Iterator[tuple[str, np.ndarray]]:
        if piece.starts_document or split != self.carry_split:
            self.add(self.carry_split, self.carry)  # the rest of the document, or of the train side
            self.carry = ""
        if piece.starts_document:
            self.add(split, None)
        text = self.carry + piece.text
        cut = safe_cut(text) if self.tokenizer.kind != "char" else len(text)
        self.add(split, text[:cut])
        self.carry, self.carry_split = text[cut:], split
        if self.batch_chars >= BATCH_CHARS:
            yield from self.encode()

    def finish(self) -> Iterator[tuple[str, np.ndarray]]:
        self.add(self.carry_split, self.carry)
        self.carry = ""
        yield from self.encode()

    def add(self, split: str, text: str | None) -> None:
        if text is None or text:
            self.batch.append((split, text))
            self.batch_chars += len(text or "")

    def encode(self) -> Iterator[tuple[str, np.ndarray]]:
        """The batch's ids, one array per run of segments of the same split."""
        encoded = iter(self.tokenizer.encode_batch([text for _, text in self.batch if text is not None]))
        eot = np.array([self.tokenizer.eot_id], dtype=np.uint32)
        runs: list[tuple[str, list[np.ndarray]]] = []
        for split, text in self.batch:
            if not runs or runs[-1][0] != split:
                runs.append((split, []))
            runs[-1][1].append(eot if text is None else next(encoded))
        for split, arrays in runs:
            yield split, np.concatenate(arrays)
        self.batch, self.batch_chars = [], 0


def safe_cut(text: str) -> int:
    """Where text can be cut without changing how BPE encodes it: the last space between two
    non-space characters (a pre-token starts there whatever follows). 0: nowhere yet, so the
    text waits for more, unless it is MAX_SEGMENT_CHARS long already."""
    found = SAFE_CUT.search(text)
    if found:
        return found.start()
    return len(text) if len(text) >= MAX_SEGMENT_CHARS else 0


def encoded_corpus(data_cfg: Mapping[str, Any], tokenizer: Tokenizer, survey: Survey) -> Iterator[tuple[str, np.ndarray]]:
    """(split, ids) through the whole corpus, in order, with a progress bar and a log line."""
    encoder = EncodedSplits(tokenizer)
    started = time.perf_counter()
    with progress(f"tokenising ({tokenizer.kind})", unit="char", total=survey.n_chars) as bar:
        for split, piece in split_pieces(read_corpus(data_cfg), survey.n_train):
            yield from encoder.feed(split, piece)
            bar.update(len(piece.text))
        yield from encoder.finish()
    seconds = time.perf_counter() - started
    log.info(f"tokenised {survey.n_chars:,} characters in {seconds:.1f} s ({survey.n_chars / seconds / 1e6:.1f} M chars/s)")


def progress(description: str, unit: str, total: int | None = None) -> tqdm:
    """A bar on a terminal (characters done, rate, time left when the total is known); nothing in a pipe."""
    return tqdm(desc=description, total=total, unit=unit, unit_scale=True, leave=False, file=sys.stderr,
                disable=not sys.stderr.isatty())
