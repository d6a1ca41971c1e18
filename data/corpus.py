"""Corpora: where the training text comes from (the `data` config group's `source`), read as a
stream of pieces, so that a corpus of any size passes through in bounded memory.

    stories      the built-in generated stories (data/stories.py): no download, no files
    shakespeare  tiny shakespeare (1,115,394 bytes), downloaded once and checked against
                 its sha256, or read from a local copy given as data.path (checked too)
    text         data.path: a file, or a folder searched recursively for these files, in order:
                 .txt, .txt.gz      UTF-8 text, one document per file
                 .jsonl, .jsonl.gz  one JSON object per line, one document per line: the
                                    string in its data.text_field field ("text")

Documents that are only whitespace are left out; Windows line ends (CRLF) become "\\n".
"""

import codecs
import gzip
import json
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from data.download import check_sha256, verified_copy
from data.specs import CorpusSpec
from data.stories import iter_stories
from user_error import UserError, not_a_file_or_folder

SOURCES = ("stories", "shakespeare", "text")
TEXT_SUFFIXES = (".txt", ".txt.gz", ".jsonl", ".jsonl.gz")
CHUNK_BYTES = 1 << 20  # a long file is read, decoded and handed on a megabyte at a time


@dataclass(frozen=True)
class Piece:
    text: str
    starts_document: bool  # the first piece of a document; a long one comes in many pieces
    bytes_read: int = 0  # how far the corpus has been read with this piece, in bytes of its files


def read_corpus(corpus: CorpusSpec) -> Iterator[Piece]:
    if corpus.source == "stories":
        return generated_stories(corpus.seed, corpus.n_chars, corpus.names, corpus.word_games)
    if corpus.source == "shakespeare":
        text = checked_download(corpus)
        return iter([Piece(text, True, len(text.encode("utf-8")))])
    if corpus.source == "text":
        return read_text_files(corpus.path, corpus.text_field)
    raise UserError(f"data.source={corpus.source!r} is not known; use data=stories, data=shakespeare, or data=text data.path=<file>")


def corpus_bytes(corpus: CorpusSpec) -> int | None:
    """The size of the corpus in bytes, for a progress bar, where it is known before reading."""
    if corpus.source == "stories":
        return corpus.n_chars  # plain ASCII
    if corpus.source == "text":
        return sum(file.stat().st_size for file in corpus_files(corpus.path))
    return None


def generated_stories(seed: int, n_chars: int, names: str, word_games: float) -> Iterator[Piece]:
    n_bytes = 0
    for story in iter_stories(seed, n_chars, names, word_games):
        n_bytes += len(story)
        yield Piece(story, True, n_bytes)


def load_documents(corpus: CorpusSpec) -> list[str]:
    """The whole corpus in memory, one string per document: for small corpora and checks."""
    documents: list[str] = []
    for piece in read_corpus(corpus):
        if piece.starts_document:
            documents.append(piece.text)
        else:
            documents[-1] += piece.text
    return documents


def checked_download(corpus: CorpusSpec) -> str:
    """The corpus at corpus.url, whose sha256 must be corpus.sha256: from data.path if given,
    else from the cache, else downloaded into the cache. A file with the wrong hash is
    never kept."""
    expected = corpus.sha256
    if corpus.path:
        local = Path(corpus.path).expanduser()
        if not local.is_file():
            raise UserError(f"data.path={corpus.path} {not_a_file(local)}; give the path of a local copy of {corpus.url}")
        check_sha256(local.read_bytes(), expected, f"data.path={corpus.path}", "give an unchanged copy, or use data=text to train on it anyway")
        return read_utf8(local)
    return read_utf8(cached_copy(corpus, offline_advice="with a local copy of the file, use data=text data.path=<file> "
                                             "(or data.path=<file> here, which checks its hash)",
                                 mismatch_advice="Check data.url, or use data=text data.path=<a local copy>"))


def cached_copy(corpus: CorpusSpec, offline_advice: str, mismatch_advice: str) -> Path:
    """The file at corpus.url in the cache (cache_dir/corpora/), checked against corpus.sha256:
    downloaded first when it is not there, or not that file. The advice ends the error of a
    download that failed, or that brought another file."""
    cached = Path(corpus.cache_dir) / "corpora" / f"{corpus.sha256[:16]}-{Path(corpus.url).name}"
    return verified_copy(corpus.url, corpus.sha256, cached, offline_advice, mismatch_advice)


def read_utf8(file: Path) -> str:
    with open(file, "rb") as raw:
        return "".join(piece.text for piece in read_file(file, raw, text_field="text"))


def not_a_file(path: Path) -> str:
    """Why path is not a file to read: not there, a folder, or something else (a pipe, a device)."""
    if path.is_dir():
        return "is a folder, not a file"
    return not_a_file_or_folder(path)


def corpus_files(path: str | None) -> list[Path]:
    if not path:
        raise UserError("data=text needs a corpus: add data.path=<a .txt or .jsonl file, or a folder of them>")
    root = Path(path).expanduser()
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise UserError(f"data.path={path} {not_a_file(root)}; give a .txt or .jsonl file (or .gz), or a folder of them")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(TEXT_SUFFIXES))
    if not files:
        raise UserError(f"data.path={path} is a folder with no {', '.join(TEXT_SUFFIXES)} files in it; "
                        "point it at such a file or a folder of them")
    return files


def read_text_files(path: str | None, text_field: str) -> Iterator[Piece]:
    any_text, files_done = False, 0
    for file in corpus_files(path):
        with open(file, "rb") as raw:
            for piece in read_file(file, raw, text_field):
                any_text = True
                yield Piece(piece.text, piece.starts_document, files_done + raw.tell())
        files_done += file.stat().st_size
    if not any_text:
        raise UserError(f"data.path={path} holds no text (every file is empty or blank, or every {text_field!r} of its .jsonl lines); "
                        "give it a file with text in it")


def read_file(file: Path, raw: BinaryIO, text_field: str) -> Iterator[Piece]:
    with gzip_errors_said(file), (gzip.GzipFile(fileobj=raw) if file.name.endswith(".gz") else raw) as stream:
        if file.name.endswith((".jsonl", ".jsonl.gz")):
            yield from jsonl_documents(file, stream, text_field)
        else:
            yield from text_document(file, stream)


@contextmanager
def gzip_errors_said(file: Path) -> Iterator[None]:
    try:
        yield
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise UserError(f"{file} is not a readable gzip file ({err}); check the file, or unpack it") from None


def text_document(file: Path, stream: BinaryIO) -> Iterator[Piece]:
    """A text file as one document, in pieces; nothing at all if it is only whitespace. The byte
    order mark some Windows editors write first (U+FEFF) is not part of the text."""
    held = ""  # leading whitespace, or a last "\r" that may begin a CRLF
    started = False
    for number, text in enumerate(decoded_chunks(file, stream)):
        text = held + (text.removeprefix("\ufeff") if number == 0 else text)
        text, held = (text[:-1], "\r") if text.endswith("\r") else (text, "")
        text = text.replace("\r\n", "\n")
        if not started and not text.strip():
            held = text + held
            continue
        yield Piece(text, starts_document=not started)
        started = True
    if started and held:
        yield Piece(held, starts_document=False)


def decoded_chunks(file: Path, stream: BinaryIO) -> Iterator[str]:
    """UTF-8 text a chunk at a time (a character split between chunks is joined); a byte that is
    not UTF-8 or a NUL character stops it with its offset."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    done_bytes = done_chars = 0
    while True:
        raw = stream.read(CHUNK_BYTES)
        held = decoder.getstate()[0]
        try:
            text = decoder.decode(raw, final=not raw)
        except UnicodeDecodeError as err:
            offset = done_bytes - len(held) + err.start
            raise UserError(f"{file} is not UTF-8 text (byte {offset} is 0x{(held + raw)[err.start]:02x}); "
                            "save it as UTF-8 or pick another file") from None
        if "\x00" in text:
            raise UserError(f"{file} looks binary (it holds NUL bytes at {done_chars + text.index(chr(0))}); give a plain text file")
        done_bytes, done_chars = done_bytes + len(raw), done_chars + len(text)
        if text:
            yield text
        if not raw:
            return


def json_kind(value: object) -> str:
    """What a value read from JSON is, in JSON's words: "a JSON number", "null"."""
    if value is None:
        return "null"
    kind = {bool: "boolean", dict: "object", list: "array", str: "string"}.get(type(value), "number")
    return f"a JSON {kind}"


def jsonl_documents(file: Path, stream: BinaryIO, text_field: str) -> Iterator[Piece]:
    """One document per line of JSON: the string in its text_field."""
    for line_no, raw in enumerate(stream, start=1):
        where = f"{file}, line {line_no}"
        try:
            record = json.loads(raw)
        except UnicodeDecodeError:
            raise UserError(f"{where}: not UTF-8 text; save the file as UTF-8") from None
        except json.JSONDecodeError as err:
            if not raw.strip():
                continue  # a blank line
            raise UserError(f"{where}: not valid JSON ({err.msg}, column {err.colno}); fix or remove that line") from None
        if not isinstance(record, dict) or text_field not in record:
            fields = ", ".join(map(repr, record)) if isinstance(record, dict) else f"{json_kind(record)}, no fields"
            raise UserError(f"{where}: no {text_field!r} field (it has {fields}); "
                            "set data.text_field to the field that holds the text")
        text = record[text_field]
        if not isinstance(text, str):
            raise UserError(f"{where}: {text_field!r} holds {json_kind(text)}, not text; "
                            "set data.text_field to the field that holds the text")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise UserError(f"{where}: {text_field!r} holds a lone surrogate escape (\\ud800 to \\udfff), which is "
                            "not text; fix or remove that line") from None
        if text.strip():
            yield Piece(text.replace("\r\n", "\n"), starts_document=True)
