"""Tokenizers: text <-> token ids.

Every tokenizer offers the same small interface, so train.py, sample.py and the
TensorBoard labels never care which one is in use:

    kind                    the name used in config (`tokenizer=char`, `bpe`, `gpt2`), or `pretrained`
    vocab_size              ids run from 0 to vocab_size - 1, the special tokens included
    eot_id                  the end-of-text token (<|endoftext|>): it ends a document, before the next
    bos_id                  the start token, put before every text (training documents, prompts,
                            probes): eot_id itself, except for a pretrained tokenizer whose folder
                            starts texts with a token of its own (Llama's <|begin_of_text|> or <s>)
    encode(text)            -> list[int]; plain text never produces a special token (eot_id, bos_id),
                               even if it contains the characters "<|endoftext|>"
    decode(ids)             -> str (a special token decodes to its text, "<|endoftext|>")
    token_strings(ids)      -> list[str], the text of each token on its own (heatmap labels)
    text_cuts               where data/token_stream.py may cut a document's text and encode the parts
                            apart with the same ids: "anywhere" (char), "spaces" (before a space
                            between two non-space characters, where the pre-tokenisation starts a
                            new piece anyway) or "nowhere" (each document whole)
    state()                 -> plain dict (str, int) that rebuilds it: stored in
                               checkpoints and in the token cache

The kinds:
    char   one token per character of the corpus, plus <|endoftext|>.
    bpe    byte-level BPE learned from the training split by rustbpe (data/bpe.py is the same
           algorithm as a lesson), run by tiktoken.
    gpt2   tiktoken's GPT-2 encoding (50,257 tokens); its files are downloaded once.
    pretrained  a Hugging Face tokenizer folder (data/hf_tokenizer.py reads it): a GPT-2-style
           byte-level BPE is run by tiktoken with Hugging Face's ids; any other BPE tokenizer.json
           (Llama 3, SmolLM2, Llama 2 / TinyLlama, Qwen) by the tokenizers library itself.

    build_tokenizer(spec, corpus_chars, train_texts, cache_dir, corpus_key)  a new one, as data/specs.py's spec asks
    tokenizer_from_state(state, cache_dir)                                  the one a checkpoint stored
"""

import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import rustbpe
import tiktoken

from data.bpe import GPT2_PATTERN, N_BYTES, ranks_from_text, ranks_to_text
from data.gpt2_files import load_gpt2_encoding
from data.specs import TokenizerSpec
from data.staging import write_staged
from user_error import UserError

log = logging.getLogger(__name__)

EOT = "<|endoftext|>"
KINDS = ("char", "bpe", "gpt2", "pretrained")
TRAINER_BUFFER_TEXTS = 64  # texts rustbpe holds at once (a text is a segment: usually about 1M characters at most)


class Tokenizer(Protocol):
    kind: str
    vocab_size: int
    eot_id: int
    bos_id: int
    text_cuts: str

    def encode(self, text: str) -> list[int]: ...
    def encode_batch(self, texts: list[str]) -> list[np.ndarray]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def token_strings(self, ids: Sequence[int]) -> list[str]: ...
    def in_byte_run(self, token_id: int) -> bool: ...
    def state(self) -> dict[str, Any]: ...


def encoded_if_writable(tokenizer: Tokenizer, text: str) -> list[int]:
    """text's ids, or [] where tokenizer cannot write it (a character tokenizer, a character it never saw)."""
    try:
        return tokenizer.encode(text)
    except UserError:
        return []


def special_ids(tokenizer: Tokenizer) -> set[int]:
    """The ids plain text never encodes to: the end of text and the start token (one id, or Llama 3's two)."""
    return {tokenizer.eot_id, tokenizer.bos_id}


def known_ids(ids: Sequence[int], vocab_size: int) -> list[int]:
    """ids as a list, each one a token of this vocabulary (0 .. vocab_size - 1); ValueError in one
    line for one that is not (a learner's -1, or an id of another model's vocabulary)."""
    ids = [int(i) for i in ids]
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        unknown = next(i for i in ids if not 0 <= i < vocab_size)
        raise ValueError(f"token id {unknown} is not in this tokenizer's vocabulary: ids run from 0 to {vocab_size - 1}")
    return ids


class CharTokenizer:
    """One token per character; the vocabulary is every character of the corpus, sorted,
    then <|endoftext|> as the last id."""

    kind = "char"
    text_cuts = "anywhere"  # one token per character: any cut gives the same ids

    def __init__(self, chars: Sequence[str]) -> None:
        self.chars = list(chars)
        self.eot_id = len(self.chars)
        self.bos_id = self.eot_id
        self.vocab_size = len(self.chars) + 1
        self.char_to_id = {ch: i for i, ch in enumerate(self.chars)}
        self.id_of_code_point: np.ndarray | None = None  # built on first encode_batch

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        return cls(sorted(set(text)))

    def encode(self, text: str) -> list[int]:
        try:
            return [self.char_to_id[ch] for ch in text]
        except KeyError:
            unknown = sorted(set(text) - self.char_to_id.keys())
            raise UserError(
                f"the text has characters the model never saw in training: {', '.join(map(repr, unknown))}; "
                f"use only characters from its vocabulary: {''.join(self.chars)!r}"
            ) from None

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's ids as a uint32 array, through a table from code point to id."""
        if self.id_of_code_point is None:
            code_points = np.array([ord(ch) for ch in self.chars], dtype=np.int64)
            self.id_of_code_point = np.full(max(code_points, default=0) + 1, -1, dtype=np.int64)
            self.id_of_code_point[code_points] = np.arange(len(code_points))
        arrays = []
        for text in texts:
            code_points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
            ids = self.id_of_code_point[np.minimum(code_points, len(self.id_of_code_point) - 1)]
            if (ids < 0).any() or (code_points >= len(self.id_of_code_point)).any():
                self.encode(text)  # raises, naming the characters the vocabulary lacks
            arrays.append(ids.astype(np.uint32))
        return arrays

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.token_strings(ids))

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        return [EOT if i == self.eot_id else self.chars[i] for i in known_ids(ids, self.vocab_size)]

    def in_byte_run(self, token_id: int) -> bool:
        """Whether decode reads this token together with its neighbours (TokenizersTokenizer's byte tokens): never."""
        return False

    def state(self) -> dict[str, Any]:
        return {"kind": self.kind, "chars": "".join(self.chars)}


class TiktokenTokenizer:
    """A tiktoken Encoding behind the common interface (the bpe, gpt2 and pretrained kinds)."""

    text_cuts = "spaces"  # GPT-2's pre-tokenisation starts a new piece before such a space

    def __init__(self, kind: str, encoding: tiktoken.Encoding) -> None:
        self.kind = kind
        self.encoding = encoding
        self.eot_id = encoding.eot_token
        self.bos_id = self.eot_id
        self.vocab_size = encoding.n_vocab

    def encode(self, text: str) -> list[int]:
        # encode_ordinary never emits special tokens: "<|endoftext|>" in the text is
        # spelt out as ordinary bytes.
        return self.encoding.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """encode of each text, spread over every core."""
        batch = self.encoding.encode_ordinary_batch(texts, num_threads=os.cpu_count() or 1)
        return [np.array(ids, dtype=np.uint32) for ids in batch]

    def decode(self, ids: Sequence[int]) -> str:
        return self.encoding.decode(known_ids(ids, self.vocab_size))

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        # A token can hold part of a multi-byte character; show such bytes as \xNN.
        return [self.encoding.decode_single_token_bytes(i).decode("utf-8", errors="backslashreplace")
                for i in known_ids(ids, self.vocab_size)]

    def in_byte_run(self, token_id: int) -> bool:
        """Whether decode reads this token together with its neighbours (TokenizersTokenizer's byte tokens):
        never; a byte of a broken character turns to U+FFFD alone, the characters before it stay."""
        return False

    def state(self) -> dict[str, Any]:
        if self.kind == "gpt2":
            return {"kind": "gpt2", "name": self.encoding.name, "ranks_sha256": ranks_digest(self.encoding)}
        state = {"kind": self.kind, "pattern": self.encoding._pat_str, "ranks": ranks_to_text(self.encoding._mergeable_ranks)}
        if self.kind == "pretrained":  # ids as the folder had them: the special tokens may come anywhere
            state |= {"name": self.encoding.name, "special_tokens": dict(self.encoding._special_tokens)}
        return state


def bpe_encoding(ranks: Mapping[bytes, int], pattern: str, special_tokens: Mapping[str, int] | None = None,
                 name: str | None = None) -> tiktoken.Encoding:
    """tiktoken running these ranks; <|endoftext|> is the id after them unless special_tokens say otherwise."""
    return tiktoken.Encoding(
        name=name or f"bpe_{len(ranks)}", pat_str=pattern, mergeable_ranks=dict(ranks),
        special_tokens=dict(special_tokens or {EOT: len(ranks)}),
    )


def ranks_digest(encoding: tiktoken.Encoding) -> str:
    """A fingerprint of an encoding's vocabulary, to tell a changed cached file apart."""
    digest = hashlib.sha256()
    for token, rank in sorted(encoding._mergeable_ranks.items(), key=lambda kv: kv[1]):
        digest.update(rank.to_bytes(4, "little") + len(token).to_bytes(2, "little") + token)
    return digest.hexdigest()


def build_tokenizer(spec: TokenizerSpec, corpus_chars: Iterable[str], train_texts: Callable[[], Iterable[str]],
                    cache_dir: Path, corpus_key: str) -> Tokenizer:
    """A tokenizer for this corpus, as the spec asks (data/specs.py). The char vocabulary is
    every character of the corpus; BPE learns its merges from train_texts() (called for bpe only:
    it reads the corpus again), which holds train-split text only, and is cached by corpus_key."""
    if spec.kind == "char":
        return CharTokenizer(sorted(set(corpus_chars)))
    if spec.kind == "bpe":
        ranks = learned_ranks(train_texts, spec.vocab_size, cache_dir / "bpe" / f"{corpus_key}.tiktoken")
        return TiktokenTokenizer("bpe", bpe_encoding(ranks, GPT2_PATTERN))
    if spec.kind == "gpt2":
        return TiktokenTokenizer("gpt2", load_gpt2_encoding(cache_dir, mirror=spec.url))
    if spec.kind == "pretrained":
        from data.hf_tokenizer import pretrained_tokenizer  # the tokenizers library only when needed

        if not Path(spec.path).is_dir():  # a resumed init_from run whose folder moved, with its token cache gone
            raise UserError(f"{spec.path} is not a folder: this run's tokenizer comes from the folder init_from "
                            "started it from, and tokenising the corpus again needs it; put it back at this path "
                            "(a Hub model's download puts it there)")
        return pretrained_tokenizer(spec.path)
    raise UserError(f"tokenizer.kind={spec.kind!r} is not known; use tokenizer=char, tokenizer=bpe or tokenizer=gpt2")


def learned_ranks(train_texts: Callable[[], Iterable[str]], vocab_size: int, path: Path) -> dict[bytes, int]:
    """BPE ranks learned once from train_texts() and kept as a .tiktoken file at path."""
    if path.is_file():
        try:
            return ranks_from_text(path.read_text())
        except (ValueError, UnicodeDecodeError) as err:  # a cache: what does not read is learned again
            log.warning(f"warning: {path} does not read as BPE ranks ({err}); learning them again")
    started = time.perf_counter()
    ranks = train_bpe_fast(train_texts(), vocab_size)  # <|endoftext|> comes on top of these
    log.info(f"learned {len(ranks) - N_BYTES:,} BPE merges in {time.perf_counter() - started:.1f} s")
    write_staged(path, ranks_to_text(ranks))  # two runs learning the same ranks at once each rename a whole file in
    return ranks


def train_bpe_fast(texts: Iterable[str], vocab_size: int, pattern: str = GPT2_PATTERN) -> dict[bytes, int]:
    """data/bpe.py's train_bpe, done by rustbpe (nanochat's trainer, in Rust, on every core) over a
    stream of texts, each pre-tokenised on its own. The same merges in the same order up to the
    first tie in pair counts: rustbpe gives a tie to the smaller token ids, train_bpe to the
    smaller bytes."""
    trainer = rustbpe.Tokenizer()
    trainer.train_from_iterator(iter(texts), vocab_size, buffer_size=TRAINER_BUFFER_TEXTS, pattern=pattern)
    ranks: dict[bytes, int] = {}
    for token, _ in sorted(trainer.get_mergeable_ranks(), key=lambda token_rank: token_rank[1]):
        ranks.setdefault(token, len(ranks))  # bytes made again from another pair keep their first rank
    return ranks


def tokenizer_from_state(state: Mapping[str, Any], cache_dir: Path = Path(".cache")) -> Tokenizer:
    kind = state.get("kind")
    if kind == "char":
        return CharTokenizer(list(state["chars"]))
    if kind == "bpe":
        return TiktokenTokenizer("bpe", bpe_encoding(ranks_from_text(state["ranks"]), state["pattern"]))
    if kind == "gpt2":
        encoding = load_gpt2_encoding(cache_dir)
        if ranks_digest(encoding) != state["ranks_sha256"]:
            raise UserError(
                "the cached GPT-2 encoding differs from the one this model was trained with; "
                f"delete {cache_dir / 'tiktoken'} so it is downloaded again"
            )
        return TiktokenTokenizer("gpt2", encoding)
    if kind == "pretrained" and "tokenizer_json" in state:  # a folder the tokenizers library runs
        from data.hf_tokenizer import TokenizersTokenizer

        return TokenizersTokenizer.from_state(state)
    if kind == "pretrained":
        encoding = bpe_encoding(ranks_from_text(state["ranks"]), state["pattern"], state["special_tokens"], state["name"])
        return TiktokenTokenizer("pretrained", encoding)
    raise UserError(f"a stored tokenizer of kind {kind!r} is not known to this version; use a checkpoint made with tokenizer={'|'.join(KINDS)}")
