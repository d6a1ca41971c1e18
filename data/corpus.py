"""Corpora: where the training text comes from (the `data` config group's `source`).

    stories      the built-in generated stories (data/stories.py): no download, no files
    shakespeare  tiny shakespeare (1,115,394 bytes), downloaded once and checked against
                 its sha256, or read from a local copy given as data.path (checked too)
    text         a UTF-8 .txt file, or a folder searched recursively for .txt files

    load_documents(cfg) -> list[str]   one string per story or file
    split_documents(docs, val_fraction) -> (train_docs, val_docs, val_starts_mid_document)
                                       the last val_fraction of the characters is val
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from data.download import fetch_verified, sha256_of
from data.stories import generate_stories
from training.errors import UserError

SOURCES = ("stories", "shakespeare", "text")


def load_documents(cfg: Mapping[str, Any]) -> list[str]:
    if cfg["source"] == "stories":
        return generate_stories(seed=cfg["seed"], n_chars=cfg["n_chars"])
    if cfg["source"] == "shakespeare":
        return [checked_download(cfg)]
    if cfg["source"] == "text":
        return read_text_documents(cfg["path"])
    raise UserError(f"data.source={cfg['source']!r} is not known; use data=stories, data=shakespeare, or data=text data.path=<file>")


def split_documents(documents: list[str], val_fraction: float) -> tuple[list[str], list[str], bool]:
    """Cut the corpus, read as one text, so the last val_fraction of its characters is val.
    The cut may fall inside a document: then its tail starts the val split, and the third
    value is True (that tail does not start a document)."""
    total = sum(len(doc) for doc in documents)
    remaining = total - int(total * val_fraction)  # characters that go to train
    for i, doc in enumerate(documents):
        if remaining < len(doc):
            head, tail = doc[:remaining], doc[remaining:]
            train = documents[:i] + ([head] if head else [])
            return train, [tail, *documents[i + 1 :]], bool(head)
        remaining -= len(doc)
    return documents, [], False


def checked_download(cfg: Mapping[str, Any]) -> str:
    """The corpus at cfg['url'], whose sha256 must be cfg['sha256']: from data.path if given,
    else from the cache, else downloaded into the cache. A file with the wrong hash is
    never kept."""
    expected = cfg["sha256"]
    if cfg.get("path"):
        local = Path(cfg["path"]).expanduser()
        if not local.is_file():
            raise UserError(f"data.path={cfg['path']} does not exist; give the path of a local copy of {cfg['url']}")
        check_sha256(local.read_bytes(), expected, f"data.path={cfg['path']}", "give an unchanged copy, or use data=text to train on it anyway")
        return read_utf8(local)
    cached = Path(cfg["cache_dir"]) / "corpora" / f"{expected[:16]}-{Path(cfg['url']).name}"
    if not cached.is_file() or sha256_of(cached.read_bytes()) != expected:
        fetch_verified(
            cfg["url"], expected, cached,
            offline_advice="with a local copy of the file, use data=text data.path=<file> "
            "(or data.path=<file> here, which checks its hash)",
            mismatch_advice="Check data.url, or use data=text data.path=<a local copy>",
        )
    return read_utf8(cached)


def check_sha256(payload: bytes, expected: str, where: str, advice: str) -> None:
    actual = sha256_of(payload)
    if actual != expected:
        raise UserError(f"{where} has sha256 {actual}, not the expected {expected}; {advice}")


def read_text_documents(path: str | None) -> list[str]:
    if not path:
        raise UserError("data=text needs a corpus: add data.path=<a .txt file or a folder of .txt files>")
    root = Path(path).expanduser()
    if root.is_dir():
        files = sorted(p for p in root.rglob("*.txt") if p.is_file())
        if not files:
            raise UserError(f"data.path={path} is a folder with no .txt files in it; point it at a .txt file or a folder of them")
    elif root.is_file():
        files = [root]
    else:
        raise UserError(f"data.path={path} does not exist; give a .txt file or a folder of .txt files")
    documents = [read_utf8(file) for file in files]
    documents = [doc for doc in documents if doc.strip()]
    if not documents:
        raise UserError(f"data.path={path} holds no text (every file is empty); give it a file with text in it")
    return documents


def read_utf8(file: Path) -> str:
    raw = file.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(
            f"{file} is not UTF-8 text (byte {err.start} is 0x{raw[err.start]:02x}); "
            "save it as UTF-8 or pick another file"
        ) from None
    if "\x00" in text:
        raise UserError(f"{file} looks binary (it holds NUL bytes at {text.index(chr(0))}); give a plain text file")
    return text.replace("\r\n", "\n")
