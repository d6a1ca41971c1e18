"""Byte-level BPE: learn a vocabulary from text, in the form tiktoken reads.

Training works on bytes, so every string can be encoded and nothing is ever unknown:

    1. Split the text into chunks with a GPT-style regex (words with their leading space,
       runs of digits, runs of punctuation, whitespace), so no merge crosses a word edge.
    2. Start from the 256 single bytes, each chunk a sequence of byte tokens.
    3. Repeatedly find the most frequent adjacent pair of tokens over all chunks, give
       the two bytes strings glued together the next free rank, and merge that pair
       everywhere. Stop when the vocabulary has vocab_size tokens.

The result, {token bytes: rank}, is exactly tiktoken's `mergeable_ranks`: tiktoken encodes
a chunk by merging, again and again, the adjacent pair whose glued bytes have the lowest
rank, which replays the merges in the order they were learned.

    train_bpe(text, vocab_size) -> dict[bytes, int]
    ranks_to_text(ranks) / ranks_from_text(text)   the .tiktoken file format

This file is the lesson. Training runs learn their vocabulary with rustbpe, the same algorithm in
Rust (data/tokenizer.py, train_bpe_fast): tests/test_tokenizers.py checks that the two learn the
same merges in the same order until two pairs tie, which they break differently.
"""

import base64
import heapq
from collections import Counter
from itertools import pairwise

import regex

# GPT-2's pre-tokenisation pattern: contractions, letters with an optional leading
# space, digits, other symbols, and whitespace (a run of spaces keeps its last space
# for the word that follows).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
N_BYTES = 256


def train_bpe(text: str, vocab_size: int, pattern: str = GPT2_PATTERN) -> dict[bytes, int]:
    """Learn vocab_size - 256 merges from text; returns {token bytes: rank} with the 256
    single bytes as ranks 0..255. Deterministic: ties go to the smaller byte strings."""
    if vocab_size < N_BYTES:
        raise ValueError(f"vocab_size={vocab_size} is below the 256 single bytes every byte-level BPE needs")
    chunk_counts = Counter(regex.findall(pattern, text))
    # Each distinct chunk once, as a list of token ids, with how often it occurs.
    words = [list(chunk.encode("utf-8")) for chunk in chunk_counts]
    freqs = list(chunk_counts.values())
    token_bytes = [bytes([b]) for b in range(N_BYTES)]  # id -> bytes; the id is the rank
    ids_of = {b: i for i, b in enumerate(token_bytes)}

    pair_counts: Counter[tuple[int, int]] = Counter()
    pair_words: dict[tuple[int, int], set[int]] = {}
    for w, word in enumerate(words):
        for pair in pairwise(word):
            pair_counts[pair] += freqs[w]
            pair_words.setdefault(pair, set()).add(w)

    # A max-heap of (count, pair), keyed so that ties pop the smallest bytes first. Counts
    # change as merges happen; stale entries are skipped when popped.
    def heap_key(pair: tuple[int, int]) -> tuple[int, bytes, bytes, tuple[int, int]]:
        return (-pair_counts[pair], token_bytes[pair[0]], token_bytes[pair[1]], pair)

    heap = [heap_key(pair) for pair in pair_counts]
    heapq.heapify(heap)

    while len(token_bytes) < vocab_size and heap:
        neg_count, _, _, pair = heapq.heappop(heap)
        if -neg_count != pair_counts.get(pair, 0) or neg_count == 0:
            continue  # stale entry, or a pair that no longer occurs
        glued = token_bytes[pair[0]] + token_bytes[pair[1]]
        if glued in ids_of:
            new_id = ids_of[glued]  # the same bytes were already made from another pair
        else:
            new_id = len(token_bytes)
            token_bytes.append(glued)
            ids_of[glued] = new_id
        touched: set[tuple[int, int]] = set()
        for w in sorted(pair_words.pop(pair, ())):
            word, freq = words[w], freqs[w]
            for old in pairwise(word):
                pair_counts[old] -= freq
                touched.add(old)
            words[w] = word = merge_pair(word, pair, new_id)
            for new in pairwise(word):
                pair_counts[new] += freq
                pair_words.setdefault(new, set()).add(w)
                touched.add(new)
        for changed in touched:
            if pair_counts[changed] > 0:
                heapq.heappush(heap, heap_key(changed))
            else:
                del pair_counts[changed]
                pair_words.pop(changed, None)
    return {b: rank for rank, b in enumerate(token_bytes)}


def merge_pair(word: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """word with every non-overlapping occurrence of pair, left to right, replaced by new_id."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def ranks_to_text(ranks: dict[bytes, int]) -> str:
    """The .tiktoken file format: one 'base64(token bytes) rank' line per token."""
    return "".join(f"{base64.b64encode(b).decode('ascii')} {rank}\n" for b, rank in sorted(ranks.items(), key=lambda kv: kv[1]))


def ranks_from_text(text: str) -> dict[bytes, int]:
    """ranks_to_text's file read back; ValueError naming what is wrong where it is not one (tiktoken
    would stop the process at ranks given twice, with a panic of its own)."""
    ranks = {}
    for number, line in enumerate(text.splitlines(), 1):
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError:  # binascii.Error is one
            raise ValueError(f"line {number} of the BPE ranks is not 'base64-token rank': {line[:40]!r}") from None
    if len(set(ranks.values())) < len(ranks) or min(ranks.values(), default=0) < 0:
        raise ValueError("the BPE ranks are not each given once, from 0 up")
    return ranks
