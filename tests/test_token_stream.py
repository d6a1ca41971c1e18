"""The corpus tokenised as a stream equals the corpus tokenised at once (tests/helpers.py's
reference), id for id, when the stream's pieces and batches are cut small enough to split
multi-byte characters, words, line ends and documents; and a run killed while it writes the
token cache leaves nothing a later run trusts."""

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest
import regex

from data import corpus, token_stream
from data.bpe import GPT2_PATTERN
from data.corpus import load_documents
from data.specs import CorpusSpec, TokenizerSpec
from data.token_cache import CHECKED_IDS, is_complete, prepare_tokens
from data.tokenizer import train_bpe_fast
from tests.helpers import ROOT, encode_documents, pythonpath_with_root, split_documents, stop_while
from tests.test_hf_tokenizer import save_family

LONG_TEXT = ("Naïve Zoë said: «ça va?» — ☃ snow, 雪.\r\n" * 30) + "x" * 700 + " end of a run with no spaces\n"


@pytest.fixture
def mixed_corpus(tmp_path):
    """A folder of every format, with long documents and short ones."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_bytes(LONG_TEXT.encode())
    (folder / "b.jsonl").write_text("\n".join(json.dumps({"text": f"Story {i}: Tom met Ana. Ana waved at Tom."}) for i in range(40)))
    (folder / "c.txt.gz").write_bytes(gzip.compress(("another file, with words " * 50).encode()))
    return folder


@pytest.fixture
def small_cuts(monkeypatch):
    monkeypatch.setattr(corpus, "CHUNK_BYTES", 61)  # inside characters, words and CRLFs
    monkeypatch.setattr(token_stream, "BATCH_CHARS", 97)  # many batches, cut anywhere in a document


@pytest.mark.parametrize("val_fraction", [0.1, 0.37])
@pytest.mark.parametrize("tokenizer_spec", [TokenizerSpec("char"), TokenizerSpec("bpe", vocab_size=400)], ids=["char", "bpe"])
def test_the_stream_gives_the_ids_of_encoding_the_corpus_at_once(tmp_path, mixed_corpus, small_cuts, tokenizer_spec, val_fraction):
    cfg = CorpusSpec(source="text", path=str(mixed_corpus), val_fraction=val_fraction, cache_dir=str(tmp_path / "cache"))
    data = prepare_tokens(cfg, tokenizer_spec)
    train_docs, val_docs, val_continues = split_documents(load_documents(cfg), val_fraction)
    assert data.train.tolist() == encode_documents(data.tokenizer, train_docs)
    assert data.val.tolist() == encode_documents(data.tokenizer, val_docs, starts_mid_document=val_continues)
    if tokenizer_spec.kind == "bpe":  # learned from the train split's documents, all of them here
        assert data.tokenizer.encoding._mergeable_ranks == train_bpe_fast(train_docs, 400)


def start_and_end_layout(tokenizer, documents: list[str], starts_mid_document: bool = False) -> list[int]:
    """bos doc eot bos doc ...: each document after the start token, an end-of-text token between two."""
    ids: list[int] = []
    for i, doc in enumerate(documents):
        ids += [tokenizer.eot_id] if i else []
        ids += [] if i == 0 and starts_mid_document else [tokenizer.bos_id]
        ids += tokenizer.encode(doc)
    return ids


@pytest.mark.parametrize("val_fraction", [0.1, 0.37])
@pytest.mark.parametrize("family", ["llama3", "tinyllama"])  # cut before spaces; each document whole
def test_a_llama_tokenizer_streams_bos_doc_eot_bos_doc_as_encoding_each_document_at_once(
        tmp_path, mixed_corpus, small_cuts, family, val_fraction):
    cfg = CorpusSpec(source="text", path=str(mixed_corpus), val_fraction=val_fraction,
                     cache_dir=str(tmp_path / "cache"))
    data = prepare_tokens(cfg, TokenizerSpec("pretrained", path=str(save_family(family, tmp_path / family))))
    assert data.tokenizer.bos_id != data.tokenizer.eot_id
    train_docs, val_docs, val_continues = split_documents(load_documents(cfg), val_fraction)
    assert data.train.tolist() == start_and_end_layout(data.tokenizer, train_docs)
    # The end of the document the cut fell in is val's: so is the end-of-text token after it.
    assert data.val.tolist() == start_and_end_layout(data.tokenizer, val_docs, starts_mid_document=val_continues)


def test_a_document_that_ends_the_train_split_ends_there_with_its_end_of_text_token(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("Tom met Ana. " * 7 + "x")  # 92 characters: train
    (tmp_path / "corpus" / "b.txt").write_text("Ana waved.")  # 10 characters: val (the last 10 of 102)
    cfg = CorpusSpec(source="text", path=str(tmp_path / "corpus"), val_fraction=0.1,
                     cache_dir=str(tmp_path / "cache"))
    data = prepare_tokens(cfg, TokenizerSpec("pretrained", path=str(save_family("llama3", tmp_path / "llama3"))))
    tokenizer = data.tokenizer
    assert data.train.tolist() == [tokenizer.bos_id, *tokenizer.encode("Tom met Ana. " * 7 + "x"), tokenizer.eot_id]
    assert data.val.tolist() == [tokenizer.bos_id, *tokenizer.encode("Ana waved.")]


def test_bpe_learns_from_every_document_of_the_train_split_cut_only_where_pre_tokens_start(tmp_path, small_cuts):
    cfg = CorpusSpec(source="text", path=str(tmp_path), val_fraction=0.4, cache_dir=".cache")
    (tmp_path / "a.txt").write_text(LONG_TEXT)
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"text": f"Tom met Ana {i} times."}) for i in range(20)))
    survey = token_stream.survey_corpus(cfg, TokenizerSpec("bpe"))
    train_docs, _, _ = split_documents(load_documents(cfg), 0.4)
    sample = list(token_stream.train_sample(cfg, survey))
    assert "".join(sample) == "".join(train_docs) and len(sample) > 2 * len(train_docs)
    assert [regex.findall(GPT2_PATTERN, text) for text in train_docs] == pre_tokens_by_document(sample, train_docs)


def pre_tokens_by_document(texts: list[str], documents: list[str]) -> list[list[str]]:
    """The pre-tokens of texts that together make up documents, gathered per document."""
    by_document, texts = [], iter(texts)
    for document in documents:
        chunks, covered = [], 0
        while covered < len(document):
            text = next(texts)
            chunks += regex.findall(GPT2_PATTERN, text)
            covered += len(text)
        by_document.append(chunks)
    return by_document


@pytest.mark.parametrize("cap", [8_000, 30_000])  # a fifth of the train split, and most of it
def test_a_large_train_split_teaches_bpe_from_a_sample_of_its_length_spread_over_it(monkeypatch, cap):
    cfg = CorpusSpec(source="stories", seed=1, n_chars=40_000, val_fraction=0.1, cache_dir=".cache")
    survey = token_stream.survey_corpus(cfg, TokenizerSpec("bpe"))
    every_text = list(token_stream.train_sample(cfg, survey))  # all of the train split: under the cap
    monkeypatch.setattr(token_stream, "BPE_SAMPLE_CHARS", cap)
    sample = list(token_stream.train_sample(cfg, survey))
    longest = max(map(len, every_text))
    assert cap - longest < sum(map(len, sample)) <= cap + longest
    quarters = Counter()  # characters of the sample from each quarter of the train split
    segments = iter(zip(np.cumsum([0] + [len(text) for text in every_text]), every_text, strict=False))
    for text in sample:
        start = next(start for start, segment in segments if segment == text)  # whole segments, in order
        quarters[4 * start // survey.n_train] += len(text)
    assert all(0.15 * cap < quarters[q] < 0.35 * cap for q in range(4)), quarters  # evenly spread


@pytest.mark.slow
def test_a_run_killed_while_it_writes_the_token_cache_leaves_nothing_a_later_run_trusts(tmp_path):
    cfg = CorpusSpec(source="stories", seed=3, n_chars=20_000_000, val_fraction=0.1, cache_dir=str(tmp_path / "cache"))
    script = f"from data.specs import *; from data.token_cache import prepare_tokens; prepare_tokens({cfg!r}, TokenizerSpec('char'))"
    writer = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env={**os.environ, "PYTHONPATH": pythonpath_with_root()})
    tokens = tmp_path / "cache" / "tokens"

    def writing() -> bool:  # the ids are being written into the staging folder
        return bool(list(tokens.glob("*.tmp-*/train.bin")))

    deadline = time.monotonic() + 120
    # Stopped (SIGSTOP) while it writes, it cannot finish between the look and the kill.
    while not (writing() and stop_while(writer, writing)) and writer.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    writer.send_signal(signal.SIGKILL)  # in the middle of writing the ids
    assert writer.wait() == -signal.SIGKILL, "the writer finished before it could be killed"
    (staging,) = tokens.iterdir()
    assert ".tmp-" in staging.name and not is_complete(staging)
    data = prepare_tokens(cfg, TokenizerSpec("char"))  # starts again, and clears what the killed run left
    (entry,) = tokens.iterdir()
    assert is_complete(entry) and ".tmp-" not in entry.name
    assert len(data.train) + len(data.val) > 20_000_000 and (np.asarray(data.val[:1000]) < data.tokenizer.vocab_size).all()


def test_the_cache_key_changes_with_where_documents_begin_not_only_with_the_text(tmp_path):
    def key(*documents: str, val_fraction: float = 0.1) -> str:
        folder = tmp_path / "-".join(documents)
        folder.mkdir(exist_ok=True)
        for i, text in enumerate(documents):
            (folder / f"{i}.txt").write_text(text)
        cfg = CorpusSpec(source="text", path=str(folder), val_fraction=val_fraction, cache_dir=".cache")
        return token_stream.survey_corpus(cfg, TokenizerSpec("char")).key

    assert len({key("ab", "c"), key("a", "bc"), key("abc"), key("ab", "d"), key("ab", "c", val_fraction=0.3)}) == 5


@pytest.mark.parametrize("n_chars", [65_535, 65_536])
def test_ids_take_two_bytes_while_the_vocabulary_fits_in_them_and_four_after_and_read_back_as_written(tmp_path, n_chars):
    # n_chars letters, each once, and the end-of-text token: 65,536 ids (0 to 65,535) fit uint16, one more does not.
    letters = [chr(c) for c in range(0x100, 0xD800)] + [chr(c) for c in range(0xE000, 0x11000)]  # no surrogates
    (tmp_path / "letters.txt").write_text("".join(letters[:n_chars]), encoding="utf-8")
    cfg = CorpusSpec(source="text", path=str(tmp_path / "letters.txt"), val_fraction=0.1, cache_dir=str(tmp_path / "cache"))
    data = prepare_tokens(cfg, TokenizerSpec("char"))
    ids = np.concatenate([data.train, data.val]).astype(np.int64)
    assert data.tokenizer.vocab_size == n_chars + 1 and len(np.unique(ids)) == n_chars + 1 and ids.max() == n_chars
    assert data.train.itemsize == (2 if n_chars + 1 <= 2**16 else 4)


@pytest.mark.parametrize("damage", ["one id short", "one id more", "the last id past the vocabulary"])
def test_a_cache_entry_whose_val_ids_were_cut_short_grew_or_were_damaged_at_the_end_is_made_again(tmp_path, damage):
    cfg = CorpusSpec(source="stories", seed=1, n_chars=20_000, val_fraction=0.1, cache_dir=str(tmp_path / "cache"))
    first = prepare_tokens(cfg, TokenizerSpec("char"))
    train, val = np.array(first.train), np.array(first.val)
    (entry,) = (tmp_path / "cache" / "tokens").iterdir()
    assert len(train) > 2 * CHECKED_IDS  # the checks at its two ends read different ids
    with open(entry / ("train.bin" if damage == "the last id past the vocabulary" else "val.bin"), "r+b") as ids:
        if damage == "one id short":  # as a full disk or a copy cut off leaves it
            ids.truncate(len(val) * first.val.itemsize - 2)
        elif damage == "one id more":  # the memory map would read it as text
            ids.seek(0, os.SEEK_END)
            ids.write(val[:1].tobytes())
        else:
            ids.seek(-first.train.itemsize, os.SEEK_END)
            ids.write(np.array([60000], dtype=first.train.dtype).tobytes())
    assert not is_complete(entry)
    again = prepare_tokens(cfg, TokenizerSpec("char"))
    assert is_complete(entry) and np.array_equal(again.train, train) and np.array_equal(again.val, val)


@pytest.mark.parametrize("damage", [
    lambda state: state.pop("chars"),  # a KeyError, with a traceback
    lambda state: state.update(kind="nope"),  # a line about checkpoints, of a cache entry
    lambda state: state.update(kind="bpe", pattern="x", ranks="YQ== 0\nYg== 0\n"),  # tiktoken's Rust panic
], ids=["no chars", "an unknown kind", "a rank given twice"])
def test_a_cache_entry_whose_tokenizer_does_not_build_is_made_again(tmp_path, damage):
    cfg = CorpusSpec(source="stories", seed=1, n_chars=20_000, val_fraction=0.1, cache_dir=str(tmp_path / "cache"))
    first = prepare_tokens(cfg, TokenizerSpec("char"))
    (entry,) = (tmp_path / "cache" / "tokens").iterdir()
    meta = json.loads((entry / "meta.json").read_text())
    damage(meta["tokenizer"])
    (entry / "meta.json").write_text(json.dumps(meta))
    again = prepare_tokens(cfg, TokenizerSpec("char"))
    assert again.tokenizer.state() == first.tokenizer.state() and np.array_equal(again.train, first.train)


def test_a_cache_entry_of_ids_past_its_vocabulary_is_made_again(tmp_path):
    # Noise of the right size (a damaged disk, a copy gone wrong): the model refused its first batch
    # with a traceback, after the run dir was written.
    cfg = CorpusSpec(source="stories", seed=1, n_chars=20_000, val_fraction=0.1, cache_dir=str(tmp_path / "cache"))
    first = prepare_tokens(cfg, TokenizerSpec("char"))
    train = np.array(first.train)
    (entry,) = (tmp_path / "cache" / "tokens").iterdir()
    noise = np.random.default_rng(0).integers(0, 2**16, len(train), dtype=np.uint16)
    noise.tofile(entry / "train.bin")
    assert not is_complete(entry)
    assert np.array_equal(prepare_tokens(cfg, TokenizerSpec("char")).train, train) and is_complete(entry)
