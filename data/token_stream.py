"""A corpus of any size tokenised as a stream, in bounded memory: it is read (data/corpus.py)
once to survey it, once more for a BPE sample when a vocabulary is to be learned, and once to
encode it, a few megabytes at a time, into ids that go straight to disk.

The ids are exactly those of encoding the whole corpus at once: the tokenizer's start token
(bos_id) before each document, and each document's text encoded as one string, except that the
train/val cut (the last val_fraction of the characters is val) encodes the two sides of a
document it falls in apart. Where the start token is not the end-of-text token (Llama's), an
eot_id also ends each document before the next one starts: `bos doc eot bos doc ...`. Long text
is handed to the tokenizer in segments cut where its pre-tokenisation starts a new piece whatever
follows (tokenizer.text_cuts): before a space between two non-space characters.
"""

import hashlib
import json
import logging
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import regex
from tqdm import tqdm

from data.corpus import Piece, corpus_bytes, read_corpus
from data.specs import CorpusSpec, TokenizerSpec
from data.tokenizer import Tokenizer

log = logging.getLogger(__name__)

CACHE_FORMAT = 4  # bump when the cache key, the layout or the ids a corpus gets change (4: rustbpe)
BATCH_CHARS = 4_000_000  # text encoded per batch (tiktoken spreads a batch over the cores)
MAX_SEGMENT_CHARS = 16_000_000  # text without a safe cut this long is cut anyway (no spaces at all)
# BPE learns from at most this much of the train split. rustbpe takes about 6 s per 100 MB on 2
# cores, holding only the distinct pre-tokens; a 2,048-token vocabulary gains little from more:
# learned from 95 MB of Python sources rather than 20 MB, it packs 1.1% more text in a token.
BPE_SAMPLE_CHARS = 100_000_000
SAFE_CUT = regex.compile(r"(?r)(?<=\S) (?=\S)")  # (?r): searched from the end


@dataclass
class Survey:
    """What one read of the corpus tells: its cache key, length and characters."""

    key: str
    text_key: str  # the documents alone, without the settings: whether a resumed run reads the text it trained on
    n_chars: int
    n_train: int  # the first n_train characters are the train split
    n_bytes: int  # of the files it was read from
    chars: set[str] = field(repr=False)
    has_text: bool


def survey_corpus(corpus: CorpusSpec, tokenizer: TokenizerSpec) -> Survey:
    """The key hashes the settings and the hash of each document in turn, so that where
    documents begin counts too, not only the text."""
    settings = {"format": CACHE_FORMAT, "val_fraction": corpus.val_fraction, "tokenizer": tokenizer.settings()}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    text_key = hashlib.sha256()
    document, n_documents, n_chars, n_bytes, chars, has_text = None, 0, 0, 0, set(), False
    started = time.perf_counter()
    with progress("reading the corpus", total=corpus_bytes(corpus)) as bar:
        for piece in shown(read_corpus(corpus), bar):
            if piece.starts_document:
                if document is not None:
                    key.update(document.digest())
                    text_key.update(document.digest())
                document, n_documents = hashlib.sha256(), n_documents + 1
            document.update(piece.text.encode("utf-8"))
            n_chars, n_bytes = n_chars + len(piece.text), piece.bytes_read
            chars.update(piece.text)
            has_text = has_text or bool(piece.text.strip())
    if document is not None:
        key.update(document.digest())
        text_key.update(document.digest())
    origin = "generated" if corpus.source == "stories" else "read from disk"  # the built-in stories are made as they are read
    log.info(f"read {n_documents:,} document{'s' if n_documents != 1 else ''}, {n_chars:,} characters "
             f"({tqdm.format_sizeof(n_bytes, 'B')} {origin}) in {time.perf_counter() - started:.1f} s")
    n_train = n_chars - int(n_chars * corpus.val_fraction)
    return Survey(key.hexdigest()[:24], text_key.hexdigest()[:24], n_chars, n_train, n_bytes, chars, has_text)


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
                yield "train", Piece(piece.text[:inside], piece.starts_document, piece.bytes_read)
            yield "val", Piece(piece.text[inside:], piece.starts_document and not inside, piece.bytes_read)
        position = end


def segments(pieces: Iterable[tuple[str, Piece]], cuts: str = "spaces") -> Iterator[tuple[str, str | None]]:
    """(split, text) in order, with (split, None) where a document starts (its start token).
    Each text ends at a safe cut, a document's end or the train/val cut, so encoding the texts
    one by one gives the ids of encoding each document (each side of the cut) at once (except
    where MAX_SEGMENT_CHARS without a safe cut force one).
    cuts (tokenizer.text_cuts): "spaces" cuts at safe_cut; "anywhere" hands each piece on whole
    (one token per character needs no safe cut); "nowhere" keeps each document whole."""
    carry, carry_split = "", "train"  # the end of a document not yet safe to hand on
    for split, piece in pieces:
        if (piece.starts_document or split != carry_split) and carry:
            yield carry_split, carry
            carry = ""
        if piece.starts_document:
            yield split, None
        text = carry + piece.text
        cut = len(text) if cuts == "anywhere" else safe_cut(text) if cuts == "spaces" else forced_cut(text)
        if cut:
            yield split, text[:cut]
        carry, carry_split = text[cut:], split
    if carry:
        yield carry_split, carry


def train_sample(corpus: CorpusSpec, survey: Survey) -> Iterator[str]:
    """The text BPE learns from, as segments (so its pre-tokens are those of whole documents): the
    whole train split when it has at most BPE_SAMPLE_CHARS characters, else about that many (one
    segment more at most), the segments taken whenever the sample falls behind its share,
    BPE_SAMPLE_CHARS / n_train, of what has been read: spread evenly from start to end."""
    share = min(1.0, BPE_SAMPLE_CHARS / max(survey.n_train, 1))
    taken = position = 0
    train_bytes = survey.n_bytes * survey.n_train // max(survey.n_chars, 1)  # about where the val split starts
    with progress("reading text for BPE", total=train_bytes) as bar:
        for split, text in segments(split_pieces(shown(read_corpus(corpus), bar), survey.n_train)):
            if split == "val":
                break
            if text is None:
                continue
            if taken <= share * position:  # the sample is behind its share of what has been read
                yield text
                taken += len(text)
            position += len(text)
    log.info(f"BPE learns from {taken:,} of the train split's {survey.n_train:,} characters")


def encoded_batches(tokenizer: Tokenizer, texts: Iterable[tuple[str, str | None]]) -> Iterator[tuple[str, np.ndarray]]:
    """(split, ids) for segments gathered into batches of about BATCH_CHARS characters, each
    encoded at once (tiktoken spreads a batch over the cores). A document starts with bos_id;
    when that is not eot_id, an eot_id ends the document before, in that document's split."""
    bos = np.array([tokenizer.bos_id], dtype=np.uint32)
    eot = np.array([tokenizer.eot_id], dtype=np.uint32)
    batch: list[tuple[str, str | np.ndarray]] = []
    n_chars, last_split = 0, None  # last_split: of the text before, None at the corpus's start
    for split, text in texts:
        if text is None and tokenizer.bos_id != tokenizer.eot_id and last_split is not None:
            batch.append((last_split, eot))
        batch.append((split, bos if text is None else text))
        n_chars += len(text or "")
        last_split = split
        if n_chars >= BATCH_CHARS:
            yield from encoded_batch(tokenizer, batch)
            batch, n_chars = [], 0
    yield from encoded_batch(tokenizer, batch)


def encoded_batch(tokenizer: Tokenizer, batch: list[tuple[str, str | np.ndarray]]) -> Iterator[tuple[str, np.ndarray]]:
    """The batch's ids, one array per run of segments of the same split; an array in batch is ids already."""
    encoded = iter(tokenizer.encode_batch([text for _, text in batch if isinstance(text, str)]))
    runs: list[tuple[str, list[np.ndarray]]] = []
    for split, text in batch:
        if not runs or runs[-1][0] != split:
            runs.append((split, []))
        runs[-1][1].append(next(encoded) if isinstance(text, str) else text)
    for split, arrays in runs:
        yield split, np.concatenate(arrays)


def safe_cut(text: str) -> int:
    """Where text can be cut without changing how BPE encodes it: the last space between two
    non-space characters (a pre-token starts there whatever follows). 0: nowhere yet, so the
    text waits for more, unless it is MAX_SEGMENT_CHARS long already."""
    found = SAFE_CUT.search(text)
    if found:
        return found.start()
    return forced_cut(text)


def forced_cut(text: str) -> int:
    """The whole text once it is MAX_SEGMENT_CHARS long (a cut that may change the ids), else 0: wait for more."""
    return len(text) if len(text) >= MAX_SEGMENT_CHARS else 0


def encoded_corpus(corpus: CorpusSpec, tokenizer: Tokenizer, survey: Survey) -> Iterator[tuple[str, np.ndarray]]:
    """(split, ids) through the whole corpus, in order, with a progress bar and a log line."""
    started = time.perf_counter()
    with progress(f"tokenising ({tokenizer.kind})", total=survey.n_bytes) as bar:
        pieces = split_pieces(shown(read_corpus(corpus), bar), survey.n_train)
        yield from encoded_batches(tokenizer, segments(pieces, cuts=tokenizer.text_cuts))
    seconds = time.perf_counter() - started
    log.info(f"tokenised {survey.n_chars:,} characters in {seconds:.1f} s ({survey.n_chars / seconds / 1e6:.1f} M chars/s)")


def shown(pieces: Iterator[Piece], bar: tqdm) -> Iterator[Piece]:
    """The pieces, moving the bar to how far into the corpus's files each one was read."""
    done = 0
    for piece in pieces:
        bar.update(piece.bytes_read - done)
        done = piece.bytes_read
        yield piece


def progress(description: str, total: int | None) -> tqdm:
    """A bar on a terminal (bytes of the corpus's files read, MB/s, time left); nothing in a pipe."""
    return tqdm(desc=description, total=total, unit="B", unit_scale=True, leave=False, file=sys.stderr,
                disable=not sys.stderr.isatty())
