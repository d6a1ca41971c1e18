"""Tokenizers: text <-> token ids.

Every tokenizer offers the same small interface, so train.py, sample.py and the
TensorBoard labels never care which one is in use:

    kind                    the name used in config (`tokenizer=char`)
    vocab_size              ids run from 0 to vocab_size - 1
    encode(text)            -> list[int]
    decode(ids)             -> str
    token_strings(ids)      -> list[str], the text of each token on its own (heatmap labels)
    state()                 -> plain dict (str, int, list) that rebuilds it: stored in
                               checkpoints and in the token cache

    build_tokenizer(cfg, text)  a new tokenizer for a corpus, from the `tokenizer` config
    tokenizer_from_state(state) the tokenizer a checkpoint or cache entry stored
    document_start_ids(tokenizer)  the ids a new document follows (generation starts there)
"""

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from data.errors import DataError

# Documents (stories, files) are joined with a blank line; generation starts after one.
DOCUMENT_SEPARATOR = "\n\n"


class Tokenizer(Protocol):
    kind: str
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def token_strings(self, ids: Sequence[int]) -> list[str]: ...
    def state(self) -> dict[str, Any]: ...


class CharTokenizer:
    """One token per character; the vocabulary is every character of the corpus, sorted."""

    kind = "char"

    def __init__(self, chars: Sequence[str]) -> None:
        self.chars = list(chars)
        self.vocab_size = len(self.chars)
        self.char_to_id = {ch: i for i, ch in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        return cls(sorted(set(text)))

    def encode(self, text: str) -> list[int]:
        try:
            return [self.char_to_id[ch] for ch in text]
        except KeyError:
            unknown = sorted(set(text) - self.char_to_id.keys())
            raise DataError(
                f"the text has characters the model never saw in training: {''.join(unknown)!r}; "
                f"use only characters from its vocabulary: {''.join(self.chars)!r}"
            ) from None

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        return [self.chars[i] for i in ids]

    def state(self) -> dict[str, Any]:
        return {"kind": self.kind, "chars": "".join(self.chars)}


def build_tokenizer(cfg: Mapping[str, Any], text: str) -> Tokenizer:
    """A tokenizer for this corpus, as the `tokenizer` config group asks."""
    if cfg["kind"] == "char":
        return CharTokenizer.from_text(text)
    raise DataError(f"tokenizer.kind={cfg['kind']!r} is not known; use tokenizer=char")


def tokenizer_from_state(state: dict[str, Any]) -> Tokenizer:
    if state.get("kind") == "char":
        return CharTokenizer(list(state["chars"]))
    raise DataError(f"a stored tokenizer of kind {state.get('kind')!r} is not known to this version")


def document_start_ids(tokenizer: Tokenizer) -> list[int]:
    """What a new document follows in the training text: the separator's ids (empty when
    the vocabulary cannot spell it, e.g. a corpus of one single-line file)."""
    try:
        return tokenizer.encode(DOCUMENT_SEPARATOR)
    except DataError:
        return []
