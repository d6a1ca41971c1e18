"""Tokenizers in and out of Hugging Face's formats: a byte-level BPE trained by the `tokenizers`
library (the independent reference) read as a tiktoken encoding with its ids, and each project
tokenizer written as a folder that transformers' AutoTokenizer loads and that gives our ids."""

import json
import random
import shutil

import pytest
from tiktoken_ext.openai_public import r50k_pat_str
from tokenizers import ByteLevelBPETokenizer, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from transformers import AutoTokenizer

from data.bpe import GPT2_PATTERN, N_BYTES
from data.hf_tokenizer import encoding_from_hf_folder, write_hf_tokenizer
from data.stories import generate_stories
from data.tokenizer import EOT, CharTokenizer, TiktokenTokenizer, bpe_encoding, tokenizer_from_state, train_bpe_fast
from user_error import UserError

STORIES = "".join(generate_stories(seed=11, n_chars=30_000))
HARD_TEXT = ("Café naïve, Straße, 日本語 and 🙂👍🏽 emoji\n\n\ttabs\t\tand   runs of    spaces \r\n"
             "digits 1234567890 and 3.14, don't 'quote' it , so . it is ! is it ? it 's do n't \n")
rng = random.Random(0)
WIDE_CHARS = [chr(c) for c in range(0x20, 0x30000, 7) if not 0xD800 <= c < 0xE000]  # letters, digits, marks, spaces of many scripts
WIDE_TEXT = "".join(rng.choice([*WIDE_CHARS, " ", "  ", "\n", "\t", " the", "e"]) for _ in range(6000))


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A tiny byte-level BPE trained by `tokenizers`, <|endoftext|> first (id 0), saved both ways."""
    trained = ByteLevelBPETokenizer()
    trained.train_from_iterator([STORIES, HARD_TEXT], vocab_size=400, special_tokens=[EOT], show_progress=False)
    folder = tmp_path_factory.mktemp("hf_bpe")
    trained.save(str(folder / "tokenizer.json"))
    trained.save_model(str(folder))  # vocab.json and merges.txt, GPT-2's own layout
    return folder


@pytest.fixture(scope="module")
def reference(hf_folder):
    return AutoTokenizer.from_pretrained(hf_folder)


def gpt2_files_only(hf_folder, tmp_path):
    folder = tmp_path / "gpt2_style"
    folder.mkdir()
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(hf_folder / name, folder / name)
    return folder


@pytest.mark.parametrize("layout", ["tokenizer.json", "vocab.json and merges.txt"])
def test_a_hugging_face_bpe_folder_gives_hugging_faces_ids_on_any_text(layout, hf_folder, reference, tmp_path):
    folder = hf_folder if layout == "tokenizer.json" else gpt2_files_only(hf_folder, tmp_path)
    ours = TiktokenTokenizer("pretrained", encoding_from_hf_folder(folder))
    for text in (HARD_TEXT, STORIES[:3000], WIDE_TEXT):
        ids = ours.encode(text)
        assert ids == reference(text)["input_ids"]
        assert ours.decode(ids) == text
    assert (ours.eot_id, ours.vocab_size) == (reference.convert_tokens_to_ids(EOT), len(reference)) == (0, 400)


def test_typed_endoftext_is_plain_text_for_us_but_the_special_id_for_hugging_face(hf_folder, reference):
    ours = TiktokenTokenizer("pretrained", encoding_from_hf_folder(hf_folder))
    text = f"the end{EOT}Once"
    theirs = reference(text)["input_ids"]
    assert ours.eot_id in theirs and ours.eot_id not in ours.encode(text)
    assert ours.decode(ours.encode(text)) == text
    # Around it both spell the text the same way.
    assert ours.encode("the end") + [ours.eot_id] + ours.encode("Once") == theirs


def test_pretrained_state_rebuilds_the_tokenizer_without_its_folder(hf_folder, tmp_path):
    folder = gpt2_files_only(hf_folder, tmp_path)
    tokenizer = TiktokenTokenizer("pretrained", encoding_from_hf_folder(folder))
    state = json.loads(json.dumps(tokenizer.state()))  # plain data, as a checkpoint stores it
    shutil.rmtree(folder)
    rebuilt = tokenizer_from_state(state)
    assert (rebuilt.kind, rebuilt.eot_id, rebuilt.vocab_size) == ("pretrained", tokenizer.eot_id, tokenizer.vocab_size)
    assert rebuilt.encoding.name == str(folder)
    assert rebuilt.encode(WIDE_TEXT) == tokenizer.encode(WIDE_TEXT)


def test_merges_rebuilt_from_the_ids_are_the_trainers_own(hf_folder, tmp_path):
    write_hf_tokenizer(TiktokenTokenizer("pretrained", encoding_from_hf_folder(hf_folder)), tmp_path)
    [trained, written] = [json.loads((folder / "tokenizer.json").read_text())["model"] for folder in (hf_folder, tmp_path)]
    assert written["merges"] == trained["merges"]
    assert written["vocab"] == trained["vocab"]


def project_tokenizer(kind: str, hf_folder):
    if kind == "char":
        return CharTokenizer.from_text(STORIES + HARD_TEXT)
    if kind == "bpe":
        return TiktokenTokenizer("bpe", bpe_encoding(train_bpe_fast([STORIES], vocab_size=400), GPT2_PATTERN))
    if kind == "gpt2":  # tiktoken's gpt2 encoding writes GPT-2's pattern its own way; tiny ranks stand in for its files
        return TiktokenTokenizer("gpt2", bpe_encoding(train_bpe_fast([STORIES], vocab_size=400), r50k_pat_str))
    return TiktokenTokenizer("pretrained", encoding_from_hf_folder(hf_folder))  # the gpt2 kind's path, offline


@pytest.mark.parametrize("kind", ["char", "bpe", "gpt2", "pretrained"])
def test_an_exported_tokenizer_loads_in_transformers_and_gives_our_ids(kind, hf_folder, tmp_path):
    tokenizer = project_tokenizer(kind, hf_folder)
    write_hf_tokenizer(tokenizer, tmp_path / "out", model_max_length=64)
    loaded = AutoTokenizer.from_pretrained(tmp_path / "out")
    texts = (HARD_TEXT, STORIES[:2000]) if kind == "char" else (HARD_TEXT, STORIES[:2000], WIDE_TEXT)
    for text in texts:
        ids = loaded(text)["input_ids"]
        assert ids == tokenizer.encode(text)
        assert loaded.decode(ids) == text
    assert loaded.eos_token_id == loaded.bos_token_id == tokenizer.eot_id
    assert loaded.decode([tokenizer.eot_id]) == EOT
    assert (len(loaded), loaded.model_max_length) == (tokenizer.vocab_size, 64)


def test_the_exported_char_tokenizer_drops_characters_outside_its_vocabulary(tmp_path):
    tokenizer = CharTokenizer.from_text("abc ")
    write_hf_tokenizer(tokenizer, tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded("ab日 c")["input_ids"] == tokenizer.encode("ab c")  # ours refuses such text; theirs drops it
    with pytest.raises(UserError, match="never saw"):
        tokenizer.encode("ab日 c")


def test_a_token_no_merge_makes_is_still_given_for_a_whole_piece_as_tiktoken_does(tmp_path):
    # "abc" is in the vocabulary, but neither "ab" nor "bc" is: no pair of tokens joins to make it.
    # tiktoken gives it when a whole piece of text is "abc"; the export must too (ignore_merges).
    ranks = {bytes([b]): b for b in range(N_BYTES)} | {b"abc": N_BYTES}
    tokenizer = TiktokenTokenizer("bpe", bpe_encoding(ranks, GPT2_PATTERN))
    write_hf_tokenizer(tokenizer, tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in ("abc", "abc abc", "xabc"):
        assert loaded(text)["input_ids"] == tokenizer.encode(text)
    assert tokenizer.encode("abc") == [N_BYTES]


def save_byte_level_bpe(folder, vocab: dict[str, int], merges: list[tuple[str, str]]) -> None:
    hf_tokenizer = HFTokenizer(models.BPE(vocab=vocab, merges=merges))
    hf_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf_tokenizer.decoder = decoders.ByteLevel()
    hf_tokenizer.add_special_tokens([EOT])
    folder.mkdir()
    hf_tokenizer.save(str(folder / "tokenizer.json"))


def test_merges_out_of_id_order_are_refused_because_tiktoken_would_split_differently(tmp_path):
    # Hugging Face joins "b c" first (it is listed first); tiktoken would join "ab" (the lower id).
    vocab = full_byte_vocab() | {"ab": 256, "bc": 257, EOT: 258}
    save_byte_level_bpe(tmp_path / "bpe", vocab, [("b", "c"), ("a", "b")])
    theirs = HFTokenizer.from_file(str(tmp_path / "bpe" / "tokenizer.json")).encode("abc").ids
    assert theirs == [vocab["a"], vocab["bc"]]  # and tiktoken, by rank, would give [ab, c]
    with pytest.raises(UserError, match=r"merge 1 is 'b \+ c' where tiktoken.* would apply 'a \+ b'"):
        encoding_from_hf_folder(tmp_path / "bpe")


def full_byte_vocab() -> dict[str, int]:
    trained = ByteLevelBPETokenizer()
    trained.train_from_iterator(["abc"], vocab_size=N_BYTES, show_progress=False)
    return trained.get_vocab()


def bad_folder(case: str, hf_folder, tmp_path):
    folder = tmp_path / case.replace(" ", "_")
    if case == "missing merges.txt":
        folder.mkdir()
        shutil.copy(hf_folder / "vocab.json", folder)
    elif case == "no endoftext":
        folder.mkdir()
        vocab = json.loads((hf_folder / "vocab.json").read_text())
        del vocab[EOT]
        (folder / "vocab.json").write_text(json.dumps(vocab))
        shutil.copy(hf_folder / "merges.txt", folder)
    elif case == "not byte-level":
        hf_tokenizer = HFTokenizer(models.WordLevel({"hello": 0, EOT: 1}, unk_token=EOT))
        hf_tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        folder.mkdir()
        hf_tokenizer.save(str(folder / "tokenizer.json"))
    elif case == "prefix space":
        shutil.copytree(hf_folder, folder)
        spec = json.loads((folder / "tokenizer.json").read_text())
        spec["pre_tokenizer"]["add_prefix_space"] = True
        (folder / "tokenizer.json").write_text(json.dumps(spec))
    elif case == "bos added":
        shutil.copytree(hf_folder, folder)
        (folder / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True}))
    elif case == "bytes missing":
        save_byte_level_bpe(folder, {"a": 0, "b": 1, "ab": 2, EOT: 3}, [("a", "b")])
    elif case == "a token no merge makes":
        save_byte_level_bpe(folder, full_byte_vocab() | {"abc": 300, EOT: 301}, [])
    return folder


@pytest.mark.parametrize("case, message", [
    ("missing merges.txt", "has vocab.json but no merges.txt"),
    ("no endoftext", f"has no special token {EOT}"),
    ("not byte-level", "its model is WordLevel, not BPE"),
    ("prefix space", "adds a prefix space"),
    ("bos added", "add_bos_token is true"),
    ("bytes missing", "lacks 254 of the 256 single bytes"),
    ("a token no merge makes", "no merge makes the token 'abc'"),
])
def test_a_folder_we_cannot_read_exactly_gets_one_line(case, message, hf_folder, tmp_path):
    with pytest.raises(UserError, match=message) as caught:
        encoding_from_hf_folder(bad_folder(case, hf_folder, tmp_path))
    assert "\n" not in str(caught.value)
