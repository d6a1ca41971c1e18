"""What data/ is asked for, as frozen values: the corpus (the `data` config group) and the
tokenizer (the `tokenizer` group). cli/ builds them from the composed config once; data/ never
sees the config itself. What each key means, and its default: configs/data/*.yaml and
configs/tokenizer/*.yaml."""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CorpusSpec:
    source: str  # stories, shakespeare or text (data/corpus.py)
    val_fraction: float  # the last fraction of the characters, held out
    cache_dir: str  # token ids, learned merges and downloads are kept here
    path: str | None = None  # text: the file or folder; shakespeare: a local copy
    seed: int | None = None  # stories: which stories
    n_chars: int | None = None  # stories: how many characters of them
    names: str = "common"  # stories: common or made-up names (a config from before data.names: common)
    word_games: float = 0  # stories: word games after each paragraph, on average (before data.word_games: none)
    text_field: str = "text"  # text: the field of a .jsonl line that holds the document
    url: str | None = None  # shakespeare: where it is downloaded from
    sha256: str | None = None  # shakespeare: the file's hash
    text_key: str | None = None  # a resumed run's: the hash of the documents it trained on (another text is refused)

    @classmethod
    def of(cls, group: Mapping[str, Any]) -> "CorpusSpec":
        """From the `data` group as plain values (a checkpoint's config, or one read from configs/)."""
        return cls(**group)


@dataclass(frozen=True)
class TokenizerSpec:
    kind: str  # char, bpe, gpt2, or pretrained (init_from's folder)
    vocab_size: int | None = None  # bpe: the most tokens it learns
    url: str | None = None  # gpt2: a mirror of its files
    path: str | None = None  # pretrained: the Hugging Face folder
    files_sha256: str | None = None  # pretrained: the hash of its tokenizer files

    @classmethod
    def of(cls, group: Mapping[str, Any]) -> "TokenizerSpec":
        return cls(**group)

    def settings(self) -> dict[str, Any]:
        """The keys this kind has, null ones too, as its `tokenizer` group holds them: part of the token
        cache's key, which must not change for the same choice."""
        return {key: getattr(self, key) for key in KIND_KEYS.get(self.kind, ("kind",))}


# The keys of each option of the `tokenizer` group (configs/tokenizer/, and init_from's folder).
KIND_KEYS = {"char": ("kind",), "bpe": ("kind", "vocab_size"), "gpt2": ("kind", "url"),
             "pretrained": ("kind", "path", "files_sha256")}
