"""Byte-level BPE (our trainer, tiktoken's encoder), the GPT-2 encoding's offline errors,
and the special <|endoftext|> token."""

import re
import subprocess
import sys
import time
from collections import Counter
from itertools import pairwise

import numpy as np
import pytest
import regex
import tiktoken.load
import torch

from data.bpe import GPT2_PATTERN, ranks_from_text, ranks_to_text, train_bpe
from data.corpus import load_documents
from data.gpt2_files import load_gpt2_encoding
from data.specs import CorpusSpec, TokenizerSpec
from data.stories import generate_stories
from data.token_cache import prepare_tokens
from data.tokenizer import EOT, bpe_encoding, build_tokenizer, learned_ranks, tokenizer_from_state, train_bpe_fast
from inspection.heatmap import readable_token
from tests.helpers import ROOT, limit_file_size, run_cli, split_documents, tiny_run
from user_error import UserError

HARD_TEXT = "Café naïve, Ærøskøbing! Emoji 🙂👍🏽 and 中文字符 and कि\n\n\ttabs   spaces\r\n 'quotes' don't 1234"
STORIES = "".join(generate_stories(seed=7, n_chars=60_000))


def bpe(text: str, vocab_size: int, tmp_path):
    return build_tokenizer(TokenizerSpec("bpe", vocab_size=vocab_size), set(text), lambda: [text], tmp_path, corpus_key="test")


def test_a_hand_worked_example_gives_the_expected_merges_and_tiktoken_applies_them():
    # "aaabdaaabac": pair counts aa=4, ab=2, ... so 'aa' is merged first. Then
    # (aa, a) and (a, b) both occur twice; the tie goes to the smaller bytes, 'ab'.
    # Then (aa, ab) occurs twice: 'aaab'.
    ranks = train_bpe("aaabdaaabac", vocab_size=259)
    learned = sorted((rank, token) for token, rank in ranks.items() if rank >= 256)
    assert learned == [(256, b"aa"), (257, b"ab"), (258, b"aaab")]
    encoding = bpe_encoding(ranks, GPT2_PATTERN)
    assert encoding.encode_ordinary("aaabdaaabac") == [258, ord("d"), 258, ord("a"), ord("c")]


def test_a_tie_between_merged_tokens_goes_to_the_smaller_bytes_not_the_older_token():
    # Guards the documented tie rule where bytes order and token-id order disagree: "zz" is
    # merged first (5 times) and gets id 256, "aa" later (257). Then (aa, b) and (zz, b) occur
    # 3 times each: by bytes "aab" comes first; ordering ties by token id would pick "zzb".
    ranks = train_bpe("zzb\n" * 3 + "aab\n" * 3 + "zz\n" * 2, vocab_size=260)
    learned = sorted((rank, token) for token, rank in ranks.items() if rank >= 256)
    assert learned == [(256, b"zz"), (257, b"aa"), (258, b"aab"), (259, b"zzb")]


def lowest_rank_first(chunk: str, ranks: dict[bytes, int]) -> list[int]:
    """An independent, slow byte-pair encoder: merge the adjacent pair whose glued bytes
    have the lowest rank until none is in the vocabulary."""
    parts = [bytes([b]) for b in chunk.encode("utf-8")]
    while True:
        candidates = [(ranks[a + b], i) for i, (a, b) in enumerate(zip(parts, parts[1:], strict=False)) if a + b in ranks]
        if not candidates:
            return [ranks[p] for p in parts]
        _, i = min(candidates)
        parts[i : i + 2] = [parts[i] + parts[i + 1]]


def test_tiktoken_encodes_exactly_as_the_learned_merges_say():
    ranks = train_bpe(STORIES, vocab_size=600)
    assert len(ranks) == 600
    encoding = bpe_encoding(ranks, GPT2_PATTERN)
    sample = STORIES[-5000:] + HARD_TEXT
    expected = [i for chunk in regex.findall(GPT2_PATTERN, sample) for i in lowest_rank_first(chunk, ranks)]
    assert encoding.encode_ordinary(sample) == expected
    assert len(expected) < len(sample.encode("utf-8")) / 2  # and the merges do compress


def test_bpe_training_is_deterministic_and_stops_when_merges_run_out():
    assert train_bpe(STORIES, 700) == train_bpe(STORIES, 700)
    tiny = train_bpe("abab abab", vocab_size=5000)
    assert len(tiny) < 300  # only a few merges exist in so little text


SOURCES = "".join(path.read_text() for path in sorted((ROOT / "data").glob("*.py")))  # code and prose


@pytest.mark.parametrize("text", [STORIES, SOURCES], ids=["stories", "sources"])
def test_the_fast_trainer_learns_the_lessons_merges_in_its_order_until_a_tie(text):
    lesson, fast = train_bpe(text, 1024), train_bpe_fast([text], 1024)
    assert len(fast) == 1024 and len(set(lesson) & set(fast)) > 850
    lesson_order, fast_order = sorted(lesson, key=lesson.get), sorted(fast, key=fast.get)
    first = next(rank for rank, (a, b) in enumerate(zip(lesson_order, fast_order, strict=True)) if a != b)
    assert first >= 256 + 20  # many merges agree first
    # Where they part, the two picks tie: each glues a pair that is among the most frequent.
    counts = pair_counts(text, {token: rank for rank, token in enumerate(lesson_order[:first])})
    most = max(counts.values())
    assert {lesson_order[first], fast_order[first]} <= {a + b for (a, b), n in counts.items() if n == most}


def pair_counts(text: str, ranks: dict[bytes, int]) -> Counter[tuple[bytes, bytes]]:
    """How often each adjacent pair of tokens occurs in text's pre-tokens, encoded with ranks."""
    tokens = {rank: token for token, rank in ranks.items()}
    counts: Counter[tuple[bytes, bytes]] = Counter()
    for chunk, n in Counter(regex.findall(GPT2_PATTERN, text)).items():
        for a, b in pairwise(lowest_rank_first(chunk, ranks)):
            counts[tokens[a], tokens[b]] += n
    return counts


def test_bpe_round_trips_any_text_and_rebuilds_from_its_state(tmp_path):
    tokenizer = bpe(STORIES, 512, tmp_path)
    assert tokenizer.vocab_size == 513 and tokenizer.eot_id == 512  # 512 byte tokens, then <|endoftext|>
    for text in (HARD_TEXT, STORIES[:3000], ""):
        assert tokenizer.decode(tokenizer.encode(text)) == text
    rebuilt = tokenizer_from_state(tokenizer.state())
    assert rebuilt.encode(HARD_TEXT) == tokenizer.encode(HARD_TEXT)
    assert rebuilt.vocab_size == tokenizer.vocab_size


def test_bpe_ranks_are_kept_as_a_tiktoken_file_in_the_cache_and_reused(tmp_path):
    tokenizer = bpe(STORIES, 400, tmp_path)
    (ranks_file,) = (tmp_path / "bpe").glob("*.tiktoken")
    assert tiktoken.load.load_tiktoken_bpe(str(ranks_file)) == tokenizer.encoding._mergeable_ranks
    assert ranks_from_text(ranks_to_text(tokenizer.encoding._mergeable_ranks)) == tokenizer.encoding._mergeable_ranks
    mtime = ranks_file.stat().st_mtime_ns
    again = bpe(STORIES, 400, tmp_path)
    assert ranks_file.stat().st_mtime_ns == mtime and again.encode(STORIES[:500]) == tokenizer.encode(STORIES[:500])
    # A file that does not read as ranks (a line cut, or ranks given twice, at which tiktoken's Rust
    # panics and takes the process down with a hundred lines) is learned again, as any cache entry.
    whole = ranks_file.read_text()
    for broken in ("garbage line\n" + whole, whole.replace(" 1\n", " 0\n", 1), whole[:1000] + "x"):
        ranks_file.write_text(broken)
        assert bpe(STORIES, 400, tmp_path).encode(STORIES[:500]) == tokenizer.encode(STORIES[:500])
        assert ranks_file.read_text() == whole


@pytest.mark.parametrize("ranks, problem", [
    ("YQ== 0\nYg== 0\n", "the BPE ranks are not each given once, from 0 up"),
    ("YQ== 0\nYg==\n", "line 2 of the BPE ranks is not 'base64-token rank': 'Yg=='"),
    ("YQ== 0\n!!! 1\n", "line 2 of the BPE ranks is not 'base64-token rank': '!!! 1'"),
])
def test_bpe_ranks_that_do_not_read_are_a_value_error_naming_what_is_wrong(ranks, problem):
    with pytest.raises(ValueError, match=f"^{re.escape(problem)}$"):
        ranks_from_text(ranks)


@pytest.mark.slow
def test_the_default_run_uses_a_bpe_vocabulary_learned_once_and_cached(trained_run):
    assert "(bpe)" in (trained_run / "train.log").read_text()
    (cached,) = (trained_run.parent / ".cache" / "bpe").glob("*.tiktoken")
    # Guards val text leaking into the vocabulary: the cached ranks, the checkpoint's, are the train split's alone.
    checkpoint = torch.load(trained_run / "ckpt_last.pt", weights_only=True)
    data, vocab_size = checkpoint["config"]["data"], checkpoint["config"]["tokenizer"]["vocab_size"]
    train_docs, _, _ = split_documents(load_documents(CorpusSpec.of(data)), data["val_fraction"])
    assert ranks_from_text(cached.read_text()) == train_bpe_fast(train_docs, vocab_size)
    assert checkpoint["tokenizer"]["ranks"] == cached.read_text()


def test_a_bpe_that_runs_out_of_merges_says_how_many_tokens_it_got(tmp_path):
    result = run_cli("train.py", *tiny_run(**{
        "data.n_chars": 10000, "tokenizer": "bpe", "tokenizer.vocab_size": 4096, "train.max_steps": 1,
        "train.attn_log_interval": 0, "train.sample_interval": 0, "hydra.run.dir": "run"}), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    vocab = int(re.search(r"vocab (\d+) \(bpe\)", result.stdout).group(1))
    assert vocab < 4096
    assert f"note: bpe has {vocab - 1} byte tokens, not the 4096 of tokenizer.vocab_size" in result.stdout
    assert "ns_dtype" not in result.stdout  # Muon in float32 on a CPU: nothing to say


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_the_end_of_text_token_round_trips_and_plain_text_cannot_inject_it(kind, tmp_path):
    text = STORIES[:2000] + EOT
    if kind == "char":
        tokenizer = build_tokenizer(TokenizerSpec("char"), set(text), lambda: [text], tmp_path, corpus_key="test")
    else:
        tokenizer = bpe(text, 300, tmp_path)
    ids = tokenizer.encode("The end." + EOT + "Once")
    assert tokenizer.eot_id not in ids
    assert tokenizer.decode(ids) == "The end." + EOT + "Once"
    assert tokenizer.decode([tokenizer.eot_id]) == EOT
    assert tokenizer.decode(tokenizer.encode("The end.") + [tokenizer.eot_id]) == "The end." + EOT
    # An id outside the vocabulary, a learner's -1 above all, is one line, not the last character
    # (a list's -1) or tiktoken's OverflowError or KeyError.
    for unknown in (-1, tokenizer.vocab_size):
        for call in (tokenizer.decode, tokenizer.token_strings):
            with pytest.raises(ValueError, match="^" + re.escape(f"token id {unknown} is not in this tokenizer's vocabulary: "
                                                                 f"ids run from 0 to {tokenizer.vocab_size - 1}")):
                call([*ids, unknown])


def test_bpe_pieces_are_labelled_readably(tmp_path):
    tokenizer = bpe(STORIES, 1000, tmp_path)
    pieces = tokenizer.token_strings(tokenizer.encode("Once upon a time,\nthe"))
    assert "".join(pieces) == "Once upon a time,\nthe"
    assert " upon" in pieces  # a whole word with its leading space
    labels = [readable_token(p) for p in pieces]
    assert "·upon" in labels and "\\n" in "".join(labels)
    assert readable_token(EOT) == "<eot>"
    # A token can hold part of a character: its bytes are shown, not a crash or a blank.
    split = tokenizer.token_strings(tokenizer.encode("中"))
    assert split == ["\\xe4", "\\xb8", "\\xad"]


def test_ids_are_stored_as_uint32_when_the_vocabulary_needs_it(tmp_path):
    corpus = tmp_path / "wide.txt"
    corpus.write_text("".join(chr(0x4E00 + i) for i in range(20_000)) + "".join(chr(0x20000 + i) for i in range(50_000)))
    cfg = CorpusSpec(source="text", path=str(corpus), val_fraction=0.1, cache_dir=str(tmp_path / "cache"))
    data = prepare_tokens(cfg, TokenizerSpec("char"))
    assert data.tokenizer.vocab_size == 70_001 and data.train.dtype == np.uint32
    assert data.tokenizer.decode(data.val[-3:].tolist()) == "".join(chr(0x20000 + i) for i in range(49_997, 50_000))
    assert prepare_tokens(cfg, TokenizerSpec("bpe", vocab_size=300)).train.dtype == np.uint16


def test_gpt2_without_network_or_cached_files_fails_fast_with_one_clear_line(tmp_path, closed_port_url):
    start = time.perf_counter()
    with pytest.raises(UserError) as caught:
        load_gpt2_encoding(tmp_path, mirror=closed_port_url)
    message = str(caught.value)
    assert time.perf_counter() - start < 5
    assert "\n" not in message
    assert "tokenizer=gpt2 needs its files from the internet once" in message
    assert "tokenizer=bpe and tokenizer=char work offline" in message
    assert list(tmp_path.rglob("*")) in ([], [tmp_path / "tiktoken"])  # nothing downloaded, nothing kept


def test_gpt2_files_with_the_wrong_hash_are_refused_and_not_kept(tmp_path, file_server):
    server_dir, url = file_server
    (server_dir / "vocab.bpe").write_text("#version: 0.2\nh e\n")
    (server_dir / "encoder.json").write_text("{}")
    with pytest.raises(UserError, match=r"vocab\.bpe has sha256 .* not the expected 1ce16647.*nothing was kept"):
        load_gpt2_encoding(tmp_path, mirror=url)
    assert list(tmp_path.rglob("*")) in ([], [tmp_path / "tiktoken"])


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_the_project_tokenizers_start_every_text_with_their_end_of_text_token(kind, tmp_path):
    tokenizer = build_tokenizer(TokenizerSpec(kind, vocab_size=300), set(STORIES), lambda: [STORIES], tmp_path, corpus_key="test")
    assert tokenizer.bos_id == tokenizer.eot_id
    assert tokenizer_from_state(tokenizer.state()).bos_id == tokenizer.eot_id


# Two processes learn the same BPE ranks into one cache folder, path after path, started together
# by a file that both wait for: two runs on the same corpus at once (a sweep's jobs, two terminals).
LEARN_TOGETHER = """
import sys, time
from pathlib import Path
from data.tokenizer import learned_ranks
folder = Path(sys.argv[1])
print("ready", flush=True)
while not (folder / "go").exists():
    time.sleep(0.001)
for i in range(300):
    learned_ranks(lambda: [sys.argv[2]], 300, folder / f"{i}.tiktoken")
"""


def test_two_runs_learning_the_same_bpe_ranks_at_once_both_finish_and_leave_whole_files(tmp_path):
    text = "the cat sat on the mat and the dog sat on the log " * 5
    runs = [subprocess.Popen([sys.executable, "-c", LEARN_TOGETHER, str(tmp_path), text], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for run in runs:
        assert run.stdout.readline() == "ready\n"
    (tmp_path / "go").touch()
    for run in runs:
        _, errors = run.communicate(timeout=120)
        assert run.returncode == 0, errors  # neither lost its staged file to the other
    whole = ranks_to_text(learned_ranks(lambda: [text], 300, tmp_path / "again" / "0.tiktoken"))
    assert sorted(path.name for path in tmp_path.glob("*.tiktoken*")) == sorted(f"{i}.tiktoken" for i in range(300))
    assert all((tmp_path / f"{i}.tiktoken").read_text() == whole for i in range(300))


def test_bpe_ranks_that_could_not_be_written_whole_leave_no_file_behind(tmp_path):
    learn = ("import sys; from pathlib import Path; from data.tokenizer import learned_ranks; "
             "learned_ranks(lambda: [sys.argv[2]], 300, Path(sys.argv[1]) / 'bpe' / 'ranks.tiktoken')")
    full_disk = subprocess.run([sys.executable, "-c", learn, str(tmp_path), "the cat sat on the mat " * 20], cwd=ROOT,
                               capture_output=True, text=True, preexec_fn=limit_file_size(100), timeout=60)
    assert "File too large" in full_disk.stderr  # the disk filled as the ranks were written
    assert list((tmp_path / "bpe").iterdir()) == []  # no ranks file, and no half-written one staged
