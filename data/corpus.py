"""Corpora: where the training text comes from (the `data` config group's `source`).

    stories  the built-in generated stories (data/stories.py): no download, no files
    text     a UTF-8 .txt file, or a folder searched recursively for .txt files

    load_documents(cfg) -> list[str]   one string per story or file
    join_documents(docs) -> str        the whole corpus as one text
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from data.errors import DataError
from data.stories import generate_stories
from data.tokenizer import DOCUMENT_SEPARATOR

SOURCES = ("stories", "text")


def load_documents(cfg: Mapping[str, Any]) -> list[str]:
    if cfg["source"] == "stories":
        return generate_stories(seed=cfg["seed"], n_chars=cfg["n_chars"])
    if cfg["source"] == "text":
        return read_text_documents(cfg["path"])
    raise DataError(f"data.source={cfg['source']!r} is not known; use data=stories, or data=text data.path=<file>")


def join_documents(documents: list[str]) -> str:
    return DOCUMENT_SEPARATOR.join(documents)


def read_text_documents(path: str | None) -> list[str]:
    if not path:
        raise DataError("data=text needs a corpus: add data.path=<a .txt file or a folder of .txt files>")
    root = Path(path).expanduser()
    if root.is_dir():
        files = sorted(p for p in root.rglob("*.txt") if p.is_file())
        if not files:
            raise DataError(f"data.path={path} is a folder with no .txt files in it; point it at a .txt file or a folder of them")
    elif root.is_file():
        files = [root]
    else:
        raise DataError(f"data.path={path} does not exist; give a .txt file or a folder of .txt files")
    documents = [read_utf8(file) for file in files]
    documents = [doc for doc in documents if doc.strip()]
    if not documents:
        raise DataError(f"data.path={path} holds no text (every file is empty); give it a file with text in it")
    return documents


def read_utf8(file: Path) -> str:
    raw = file.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"{file} is not UTF-8 text (byte {err.start} is 0x{raw[err.start]:02x}); "
            "save it as UTF-8 or pick another file"
        ) from None
    if "\x00" in text:
        raise DataError(f"{file} looks binary (it holds NUL bytes at {text.index(chr(0))}); give a plain text file")
    return text.replace("\r\n", "\n")
