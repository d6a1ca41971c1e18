"""Tokenizers in and out of Hugging Face's formats: a byte-level BPE trained by the `tokenizers`
library (the independent reference) read as a tiktoken encoding with its ids; tiny tokenizers built
the way GPT-2, Llama 3, SmolLM2, TinyLlama and Qwen3 configure theirs, saved by transformers 5 and
read with AutoTokenizer's ids and start and end tokens; and each project tokenizer written as a
folder that transformers' AutoTokenizer loads and that gives our ids."""

import json
import random
import re
import shutil
from pathlib import Path

import pytest
from tiktoken_ext.openai_public import r50k_pat_str
from tokenizers import (
    AddedToken,
    ByteLevelBPETokenizer,
    Regex,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from tokenizers import Tokenizer as HFTokenizer
from transformers import AutoTokenizer, GPT2Tokenizer, PreTrainedTokenizerFast

from attention_tab.live_model import LoadedModel
from attention_tab.tools import patch_example
from data.bpe import GPT2_PATTERN, N_BYTES
from data.hf_tokenizer import (
    LLAMA3_PATTERN,
    QWEN2_PATTERN,
    TokenizersTokenizer,
    encoding_from_hf_folder,
    pretrained_tokenizer,
    write_hf_tokenizer,
)
from data.specs import TokenizerSpec
from data.stories import ITEMS, generate_stories
from data.tokenizer import (
    EOT,
    CharTokenizer,
    TiktokenTokenizer,
    bpe_encoding,
    build_tokenizer,
    tokenizer_from_state,
    train_bpe_fast,
)
from inspection.name_swap import name_swap, one_token_names
from inspection.recall_probe import NAME_PATTERN, RecallProbe
from inspection.repeated_tokens import repeated_ids
from inspection.text_forward import text_ids
from model.generation import EOT_SHOWN, decode, generate_text
from tests.helpers import one_line_error, streamed_pieces, tiny_gpt
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


# Tokenizers as the real models configure theirs (their published tokenizer.json and tokenizer_config.json),
# trained tiny here by the tokenizers library, and saved by transformers 5's save_pretrained.
BYTE_LEVEL_TEXTS = [STORIES, HARD_TEXT]
FAMILY_TEXTS = [HARD_TEXT, STORIES[:2000], "digits 1234567890, 3.14159 and 2026", "a\n\n\n  b   \t c  \r\n",
                "日本語のテキスト 🙂👍🏽 Ærøskøbing", "ends with spaces   "]
LEADING_SPACE_TEXTS = ["  two spaces first", " one space first", "\nnewline first"]


def trained_bpe(pre_tokenizer, normalizer=None, special_tokens=(), ignore_merges=False) -> HFTokenizer:
    """A byte-level BPE of 600 tokens learned from the stories; special_tokens come first (ids 0, 1, ...)."""
    tokenizer = HFTokenizer(models.BPE(ignore_merges=ignore_merges))
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=list(special_tokens), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(BYTE_LEVEL_TEXTS, trainer)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def special(*names: str) -> list[AddedToken]:
    return [AddedToken(name, special=True, normalized=False) for name in names]


def llama3() -> HFTokenizer:
    """meta-llama/Llama-3.2-1B: Split with its pattern, then ByteLevel without its own regex; ignore_merges;
    its 256 special tokens after the vocabulary (4 here); a post-processor that puts <|begin_of_text|> first."""
    tokenizer = trained_bpe(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_PATTERN), "isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
                            ignore_merges=True)
    tokenizer.add_special_tokens(special("<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|eot_id|>"))
    bos = ("<|begin_of_text|>", tokenizer.token_to_id("<|begin_of_text|>"))
    tokenizer.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                                      special_tokens=[bos])])
    return tokenizer


def smollm2() -> HFTokenizer:
    """HuggingFaceTB/SmolLM2-135M: each digit alone, then GPT-2's ByteLevel; <|endoftext|> is id 0."""
    tokenizer = trained_bpe(pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]),
                            special_tokens=special(EOT, "<|im_start|>", "<|im_end|>"))
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def qwen3() -> HFTokenizer:
    """Qwen/Qwen3-0.6B: NFC, Split with its pattern, ByteLevel; special tokens after the vocabulary and an
    added token that is not special (<think>); no start token."""
    tokenizer = trained_bpe(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_PATTERN), "isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False,
                                                                              trim_offsets=False)]),
                            normalizer=normalizers.NFC())
    tokenizer.add_special_tokens(special(EOT, "<|im_start|>", "<|im_end|>"))
    tokenizer.add_tokens([AddedToken("<think>", special=False, normalized=False)])
    tokenizer.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tokenizer


def tinyllama() -> HFTokenizer:
    """TinyLlama/TinyLlama-1.1B-Chat-v1.0 (Llama 2's SentencePiece BPE): <unk>, <s>, </s>, then the 256 byte
    tokens <0x00>.. for byte fallback, then pieces learned on words with "▁" for a space; the normalizer puts
    "▁" first and for each space; a post-processor that puts <s> first."""
    learner = HFTokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.Metaspace()  # SentencePiece learns within words
    learner.train_from_iterator([STORIES], trainers.BpeTrainer(vocab_size=500, show_progress=False))
    learned = json.loads(learner.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{byte:02X}>": 3 + byte for byte in range(256)}
    for piece, _ in sorted(learned["vocab"].items(), key=lambda item: item[1]):
        vocab.setdefault(piece, len(vocab))
    tokenizer = HFTokenizer(models.BPE(vocab=vocab, merges=[tuple(merge) for merge in learned["merges"]], unk_token="<unk>",
                                       fuse_unk=True, byte_fallback=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])
    tokenizer.add_special_tokens(special("<unk>", "<s>", "</s>"))
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s>:1 $B:1", special_tokens=[("<s>", 1)])
    return tokenizer


# name: (tokenizer, tokenizer_config.json as the model's has it, config.json's model_type)
FAMILIES = {
    "llama3": (llama3, {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
                        "eos_token": "<|end_of_text|>"}, "llama"),
    "smollm2": (smollm2, {"tokenizer_class": "GPT2Tokenizer", "bos_token": EOT, "eos_token": EOT, "unk_token": EOT}, "llama"),
    "qwen3": (qwen3, {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>", "pad_token": EOT}, "qwen3"),
    "tinyllama": (tinyllama, {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                              "pad_token": "</s>", "add_bos_token": True, "add_eos_token": False, "legacy": False}, "llama"),
}
# (start token, end-of-text token) each family's folder must give.
START_AND_END = {"llama3": ("<|begin_of_text|>", "<|end_of_text|>"), "smollm2": (EOT, EOT), "qwen3": (EOT, EOT),
                 "tinyllama": ("<s>", "</s>"), "tinyllama_saved_by_transformers": ("<s>", "</s>")}


def save_family(name: str, folder):
    """The family's tokenizer saved by transformers' save_pretrained, with its tokenizer_config.json settings and a
    config.json naming its model type (AutoTokenizer reads both, as for a downloaded model folder)."""
    build, config, model_type = FAMILIES[name]
    named = {key: value for key, value in config.items() if key.endswith("_token") and value is not None}
    PreTrainedTokenizerFast(tokenizer_object=build(), **named).save_pretrained(folder)
    saved = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(saved | config, indent=2))
    architecture = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[model_type]
    (folder / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": [architecture]}))
    return folder


@pytest.fixture(scope="module")
def family_folders(tmp_path_factory) -> dict:
    """Each family's folder; and TinyLlama's loaded by AutoTokenizer and saved again, as transformers 5 rewrites
    it (a Metaspace pre-tokenizer in place of the normalizer)."""
    root = tmp_path_factory.mktemp("families")
    folders = {name: save_family(name, root / name) for name in FAMILIES}
    again = root / "tinyllama_saved_by_transformers"
    AutoTokenizer.from_pretrained(folders["tinyllama"]).save_pretrained(again)
    shutil.copy(folders["tinyllama"] / "config.json", again)
    return folders | {again.name: again}


@pytest.fixture(scope="module")
def family_references(family_folders) -> dict:
    return {name: AutoTokenizer.from_pretrained(folder) for name, folder in family_folders.items()}


@pytest.fixture(scope="module")
def family_tokenizers(family_folders) -> dict:
    return {name: pretrained_tokenizer(folder) for name, folder in family_folders.items()}


def test_a_gpt2_tokenizer_saved_by_transformers_5_is_read_by_tiktoken_with_hugging_faces_ids(hf_folder, tmp_path):
    spec = json.loads((hf_folder / "tokenizer.json").read_text())["model"]
    GPT2Tokenizer(vocab=spec["vocab"], merges=[tuple(merge) for merge in spec["merges"]]).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "tokenizer.json").read_text())["post_processor"]["type"] == "TemplateProcessing"  # adds nothing
    ours, reference = pretrained_tokenizer(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    assert isinstance(ours, TiktokenTokenizer)
    for text in (HARD_TEXT, WIDE_TEXT):
        assert ours.encode(text) == reference(text, add_special_tokens=False)["input_ids"]
    assert ours.bos_id == ours.eot_id == reference.convert_tokens_to_ids(EOT)


@pytest.mark.parametrize("eot_text", [EOT_SHOWN, None], ids=["ends shown", "as decoded"])
@pytest.mark.parametrize("name", [*FAMILIES, "tinyllama_saved_by_transformers"])
def test_each_familys_text_streamed_token_by_token_adds_up_to_the_text(name, eot_text, family_tokenizers):
    # TinyLlama writes a character its vocabulary lacks as byte tokens, which its decoder reads as one
    # run: a character shown too early could turn back into U+FFFD once the next byte token comes.
    tokenizer = family_tokenizers[name]
    ids = [tokenizer.bos_id, *tokenizer.encode(HARD_TEXT[:60]), tokenizer.eot_id, *tokenizer.encode("  two spaces, " + WIDE_TEXT[:40])]
    whole = decode(tokenizer, ids[1:], eot_text)
    pieces = streamed_pieces(tokenizer, ids, eot_text, whole)
    assert "".join(pieces) == whole
    assert len(pieces) > 30  # it streamed: a piece for most characters, not the text at the end


def test_a_stray_byte_token_turns_the_characters_before_it_in_its_run_into_u_fffd_and_none_was_shown_early(
        family_tokenizers, family_references):
    # "日" as TinyLlama's three byte tokens decodes as 日; one more byte token (the first of another
    # character), then a word, and the decoder reads the four bytes as one broken run: four U+FFFD.
    tokenizer = family_tokenizers["tinyllama"]
    stray = family_references["tinyllama"].convert_tokens_to_ids("<0xE6>")
    ids = [tokenizer.bos_id, *tokenizer.encode("Hi 日"), stray, *tokenizer.encode(" there and more")]
    whole = decode(tokenizer, ids[1:], EOT_SHOWN)
    assert "日" not in whole and "".join(streamed_pieces(tokenizer, ids, EOT_SHOWN, whole)) == whole
    # So too a byte that is a whole character alone ("F", as the model may write it), then a stray one.
    f_byte = family_references["tinyllama"].convert_tokens_to_ids("<0x46>")
    ids = [tokenizer.bos_id, *tokenizer.encode("Hi"), f_byte, stray, *tokenizer.encode(" there and more")]
    whole = decode(tokenizer, ids[1:], EOT_SHOWN)
    assert tokenizer.decode([f_byte]) == "F" and "F" not in whole  # the decoder read F and the stray byte as one run
    assert "".join(streamed_pieces(tokenizer, ids, EOT_SHOWN, whole)) == whole


@pytest.mark.parametrize("name", [*FAMILIES, "tinyllama_saved_by_transformers"])
def test_each_family_gives_autotokenizers_ids_and_decodes_back(name, family_tokenizers, family_references):
    ours, reference = family_tokenizers[name], family_references[name]
    assert isinstance(ours, TokenizersTokenizer)
    # TinyLlama's own file puts "▁" before every text, as SentencePiece does, and so do we; transformers 5 reads it
    # as LlamaTokenizer with a Metaspace that adds none before a text that starts with a space (" a" -> "▁a").
    leading = [] if name == "tinyllama" else LEADING_SPACE_TEXTS
    for text in [*FAMILY_TEXTS, *leading, WIDE_TEXT]:
        assert ours.encode(text) == reference(text, add_special_tokens=False)["input_ids"], text[:40]
    for text in FAMILY_TEXTS:  # NFC already, and not starting with a space (which Metaspace may drop)
        assert ours.decode(ours.encode(text)) == text
    assert ours.vocab_size == len(reference)


def test_a_gpt2_tokenizer_with_added_tokens_that_are_not_special_matches_them_in_text_as_transformers_does(
        hf_folder, tmp_path):
    # tiktoken's ordinary encoding never matches an added token, so such a folder goes to the tokenizers library.
    reference = AutoTokenizer.from_pretrained(hf_folder)
    reference.add_tokens(["<think>", " mango"])
    reference.save_pretrained(tmp_path)
    ours, reference = pretrained_tokenizer(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    text = "I like mango and<think> fruit"
    assert ours.encode(text) == reference(text, add_special_tokens=False)["input_ids"]
    assert reference.convert_tokens_to_ids("<think>") in ours.encode(text) and ours.vocab_size == len(reference)


def test_tokens_added_beside_vocab_json_and_merges_txt_are_one_line_not_left_out(hf_folder, tmp_path):
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(hf_folder / name, tmp_path)
    (tmp_path / "added_tokens.json").write_text(json.dumps({"<think>": 400}))
    assert one_line_error(pretrained_tokenizer, tmp_path) == (
        f"{tmp_path / 'added_tokens.json'}: tokens added to a vocab.json and merges.txt BPE are not read here; save the "
        "tokenizer with transformers' save_pretrained, which writes them into a tokenizer.json")


@pytest.mark.parametrize("name", [*FAMILIES, "tinyllama_saved_by_transformers"])
def test_the_start_token_is_the_one_autotokenizer_adds_and_the_end_token_ends_pretraining_documents(
        name, family_tokenizers, family_references):
    ours, reference = family_tokenizers[name], family_references[name]
    start, end = START_AND_END[name]
    assert (ours.bos_id, ours.eot_id) == (reference.convert_tokens_to_ids(start), reference.convert_tokens_to_ids(end))
    plain = reference("Once upon a time", add_special_tokens=False)["input_ids"]
    added = [] if ours.bos_id == ours.eot_id else [ours.bos_id]  # Qwen3 and SmolLM2 add none
    assert reference("Once upon a time")["input_ids"] == [*added, *plain]
    # Decoded, the start and end tokens are their text, as transformers decodes them by default.
    ids = [ours.bos_id, *ours.encode("Hi"), ours.eot_id]
    assert ours.decode(ids) == reference.decode(ids) and ours.decode([ours.eot_id]) == end


@pytest.mark.parametrize("add_bos_token, post_processor", [(True, "none"), (False, "llama3's")])
def test_the_post_processor_decides_the_start_token_not_tokenizer_configs_add_bos_token_as_in_transformers_5(
        add_bos_token, post_processor, family_folders, tmp_path):
    folder = shutil.copytree(family_folders["llama3"], tmp_path / "llama3")
    if post_processor == "none":
        tokenizer = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
        tokenizer.save(str(folder / "tokenizer.json"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"add_bos_token": add_bos_token}))
    ours, reference = pretrained_tokenizer(folder), AutoTokenizer.from_pretrained(folder)
    added = reference("Once")["input_ids"][: -len(reference("Once", add_special_tokens=False)["input_ids"])]
    assert ours.bos_id == (added[0] if added else ours.eot_id)
    assert (ours.bos_id == ours.eot_id) == (post_processor == "none")


def test_typed_special_tokens_are_plain_text_but_an_added_token_that_is_not_special_is_matched(family_tokenizers,
                                                                                                 family_references):
    qwen, reference = family_tokenizers["qwen3"], family_references["qwen3"]
    text = f"the end{EOT}<think>Once"
    assert qwen.eot_id in reference(text, add_special_tokens=False)["input_ids"]
    assert qwen.eot_id not in qwen.encode(text) and qwen.decode(qwen.encode(text)) == text
    assert reference.convert_tokens_to_ids("<think>") in qwen.encode(text)  # as transformers matches it
    llama = family_tokenizers["llama3"]
    ids = llama.encode("<|begin_of_text|>Hi<|end_of_text|>")
    assert not {llama.bos_id, llama.eot_id} & set(ids) and llama.decode(ids) == "<|begin_of_text|>Hi<|end_of_text|>"


def test_token_strings_spell_each_token_with_its_own_spaces_and_bytes(family_tokenizers):
    for name in ("llama3", "qwen3", "smollm2"):
        tokenizer = family_tokenizers[name]
        assert "".join(tokenizer.token_strings(tokenizer.encode(STORIES[:500]))) == STORIES[:500]
    tinyllama = family_tokenizers["tinyllama"]
    pieces = tinyllama.token_strings(tinyllama.encode("Once upon é"))
    assert "".join(pieces) == " Once upon \\xc3\\xa9"  # "▁" first; é spelt by its two byte-fallback tokens
    assert tinyllama.token_strings([tinyllama.bos_id, tinyllama.eot_id]) == ["<s>", "</s>"]


def test_the_stream_may_cut_before_spaces_only_where_the_pre_tokenizer_starts_a_piece_there(family_tokenizers):
    cuts = {name: tokenizer.text_cuts for name, tokenizer in family_tokenizers.items()}
    assert cuts == {"llama3": "spaces", "smollm2": "spaces", "qwen3": "spaces", "tinyllama": "nowhere",
                    "tinyllama_saved_by_transformers": "nowhere"}


@pytest.mark.parametrize("name", ["llama3", "tinyllama"])
def test_a_library_run_tokenizer_rebuilds_from_its_state_without_its_folder(name, family_folders, tmp_path):
    folder = shutil.copytree(family_folders[name], tmp_path / name)
    tokenizer = pretrained_tokenizer(folder)
    state = json.loads(json.dumps(tokenizer.state()))  # plain data, as a checkpoint stores it
    shutil.rmtree(folder)
    rebuilt = tokenizer_from_state(state)
    facts = lambda t: (t.kind, t.eot_id, t.bos_id, t.vocab_size, t.text_cuts, t.encode(WIDE_TEXT), t.token_strings(range(300)))  # noqa: E731
    assert facts(rebuilt) == facts(tokenizer)
    assert rebuilt.kind == "pretrained"


def test_a_library_run_tokenizer_exports_as_its_own_tokenizer_json_with_its_start_and_end_tokens(family_tokenizers,
                                                                                                    tmp_path):
    ours = family_tokenizers["llama3"]
    write_hf_tokenizer(ours, tmp_path, model_max_length=64)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in (HARD_TEXT, WIDE_TEXT):
        assert loaded(text, add_special_tokens=False)["input_ids"] == ours.encode(text)
    assert (loaded.bos_token_id, loaded.eos_token_id) == (ours.bos_id, ours.eot_id)
    assert loaded("Once")["input_ids"] == [ours.bos_id, *ours.encode("Once")]


def test_merges_out_of_id_order_are_run_by_the_tokenizers_library_as_listed(tmp_path):
    vocab = full_byte_vocab() | {"ab": 256, "bc": 257, EOT: 258}
    save_byte_level_bpe(tmp_path / "bpe", vocab, [("b", "c"), ("a", "b")])  # tiktoken would join "ab" first
    tokenizer = pretrained_tokenizer(tmp_path / "bpe")
    assert isinstance(tokenizer, TokenizersTokenizer)
    assert tokenizer.encode("abc") == [vocab["a"], vocab["bc"]] and tokenizer.bos_id == tokenizer.eot_id == 258
    with pytest.raises(ValueError, match="^" + re.escape("token id 259 is not in this tokenizer's vocabulary: ids run from 0 to 258")):
        tokenizer.decode([vocab["a"], 259])  # the tokenizers library's own would be a panic or silence


def test_generation_starts_after_the_start_token_and_shows_an_end_then_a_start_as_one_break(family_tokenizers):
    tokenizer = family_tokenizers["llama3"]
    model = tiny_gpt(vocab_size=tokenizer.vocab_size)
    fed = []
    model.register_forward_pre_hook(lambda module, args: fed.append(args[0][0].tolist()))
    sample = generate_text(model, tokenizer, "Once", 3, temperature=1.0)[0]
    assert fed[0] == [tokenizer.bos_id, *tokenizer.encode("Once")] and sample.startswith("Once")
    end, once = tokenizer.encode("The end."), tokenizer.encode(" Once")
    bos, eot = tokenizer.bos_id, tokenizer.eot_id
    assert decode(tokenizer, [*end, eot, bos, *once], EOT_SHOWN) == "The end." + EOT_SHOWN + " Once"
    assert decode(tokenizer, [bos, *once], EOT_SHOWN) == " Once"  # a start token first adds nothing
    assert decode(tokenizer, [*end, bos, *once], EOT_SHOWN) == "The end." + EOT_SHOWN + " Once"  # a start without an end


def test_the_inspection_tools_start_each_text_with_the_start_token(family_tokenizers):
    tokenizer = family_tokenizers["llama3"]
    bos = tokenizer.bos_id
    assert text_ids(tokenizer, "Once upon a time", 64) == [bos, *tokenizer.encode("Once upon a time")]
    assert repeated_ids(tokenizer, 4, seed=0, block_size=64)[0] == bos
    for seed in range(50):  # and the random tokens after it are never a special one, the start token included
        assert not {bos, tokenizer.eot_id} & set(repeated_ids(tokenizer, 31, seed=seed, block_size=64)[1:])
    answer, other = one_token_names(tokenizer)[:2]
    swap = name_swap(tokenizer, answer, other)
    assert swap.clean[0, 0] == swap.corrupted[0, 0] == bos
    spaced = name_swap(tokenizer, f" {answer}", f"{other}\n")  # a name typed with the space before it: the same swap
    assert (spaced.clean.tolist(), spaced.answer, spaced.other) == (swap.clean.tolist(), swap.answer, swap.other)
    probe = RecallProbe.build(tokenizer, block_size=64, seed=1, max_windows=1)
    assert probe.windows[0, 0] == bos and probe.targets  # the first window starts a story


def test_a_name_swap_longer_than_the_models_block_size_is_one_line_and_the_tab_offers_no_example(family_tokenizers):
    tokenizer = family_tokenizers["llama3"]
    names = one_token_names(tokenizer)[:2]
    fits = name_swap(tokenizer, *names).clean.shape[1]  # the start token and the story's sentence
    assert name_swap(tokenizer, *names, block_size=fits).clean.shape == (1, fits)
    too_short = f"the name swap's prompt is {fits - 1} tokens after the start token, and this model reads at most {fits - 2} "
    with pytest.raises(UserError, match="^" + re.escape(too_short + f"(its block_size is {fits - 1}): use shorter prompts")):
        name_swap(tokenizer, *names, block_size=fits - 1)
    # A template of one's own (the line above suggests one) that asks for other fields: one line each.
    for template, error in (("{foo}", "KeyError: 'foo'"), ("{answer} {other} {0}", "IndexError: Replacement index 0 out of range"),
                            ("{answer} { {other}", "ValueError: ")):
        with pytest.raises(UserError, match="^" + re.escape(f"the template {template!r} cannot be filled ({error}")):
            name_swap(tokenizer, *names, template=template)
    # One that reads the same either way round (no names in it), or with a name where no space comes before it.
    with pytest.raises(UserError, match="^" + re.escape("the template 'Once upon a time' reads the same with the names "
                                                        "swapped, so there is nothing to patch: name {answer} and {other}")):
        name_swap(tokenizer, *names, template="Once upon a time")  # the clean and corrupted prompts were the same
    # Two names one token each after a space, of unlike lengths without one (at the template's start):
    # the line said "pick names that are one token each", which they were.
    unlike = next((a, b) for a in one_token_names(tokenizer) for b in one_token_names(tokenizer)
                  if len(tokenizer.encode(a)) != len(tokenizer.encode(b)))
    with pytest.raises(UserError, match=re.escape("put a space before each {answer} and {other} in the template (not at "
                                                  "its start)")):
        name_swap(tokenizer, *unlike, template="{answer} and {other} went to the shop")
    with pytest.raises(UserError, match="^" + re.escape("names='Mia' is one text: give a list of names, e.g. ['Mia']")):
        one_token_names(tokenizer, "Mia")  # whose letters were the names
    # The tab's patching tool then fills in no example (its Patch would be refused), and says why.
    for block_size, why in ((fits, None), (fits - 1, too_short)):
        loaded = LoadedModel(tiny_gpt(block_size=block_size), tokenizer, Path("ckpt_best.pt"), 0, (0, 0), 0)
        example = patch_example("run", loaded)
        assert (example["clean"] is None) == (why is not None) and (example["why"] or "").startswith(why or ""), example


@pytest.mark.parametrize("name", ["llama3", "tinyllama"])
def test_each_recall_point_is_the_token_that_starts_the_repeated_word(name, family_tokenizers):
    tokenizer = family_tokenizers[name]
    probe = RecallProbe.build(tokenizer, block_size=128, seed=1, max_windows=8)
    words = set(NAME_PATTERN.pattern.strip(r"\b()").split("|")) | {item.name for item in ITEMS}
    for window, position, first, last, _ in probe.targets:
        token = tokenizer.token_strings([probe.windows[window, position]])[0].lstrip()
        earlier = "".join(tokenizer.token_strings(probe.windows[window, first:last].tolist())).strip()  # "Grace."
        word = max((word for word in words if earlier.startswith(word)), key=len, default="")
        assert token and word.startswith(token), (token, earlier)


def folder_we_do_not_read(case: str, family_folders, tmp_path):
    """A family folder changed in one way that the reader refuses."""
    base = {"model is WordPiece": "llama3", "no byte fallback": "tinyllama", "no end of text": "qwen3"}.get(case, "llama3")
    folder = shutil.copytree(family_folders[base], tmp_path / case.replace(" ", "_"))
    tokenizer = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    spec = None
    if case == "model is WordPiece":
        tokenizer = HFTokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
        tokenizer.add_special_tokens(special("<|end_of_text|>"))
    elif case == "lowercase normalizer":
        tokenizer.normalizer = normalizers.Lowercase()
    elif case == "whitespace pre-tokenizer":
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    elif case == "an end token after each text":
        tokenizer.post_processor = processors.TemplateProcessing(
            single="$A <|end_of_text|>", special_tokens=[("<|end_of_text|>", tokenizer.token_to_id("<|end_of_text|>"))])
    elif case == "two start tokens":
        names = ("<|begin_of_text|>", "<|reserved_special_token_0|>")
        tokenizer.post_processor = processors.TemplateProcessing(
            single=" ".join(names) + " $A", special_tokens=[(name, tokenizer.token_to_id(name)) for name in names])
    elif case == "no byte fallback":
        spec = json.loads(tokenizer.to_str())
        spec["model"]["byte_fallback"] = False
    elif case == "no end of text":  # Qwen3 without its <|endoftext|>, and no eos_token
        spec = json.loads(tokenizer.to_str())
        for token in spec["added_tokens"]:
            token["content"] = token["content"].replace("endoftext", "reserved")
        del config["eos_token"]
    (folder / "tokenizer.json").write_text(json.dumps(spec) if spec else tokenizer.to_str())
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("case, message", [
    ("model is WordPiece", "model is WordPiece; only a BPE"),
    ("lowercase normalizer", "normalizer Lowercase is not one we read"),
    ("whitespace pre-tokenizer", "pre-tokenizer Whitespace is not one we read"),
    ("an end token after each text", "puts <|end_of_text|> after every text"),
    ("two start tokens", r"puts 2 tokens \(<\|begin_of_text\|>, <\|reserved_special_token_0\|>\) before every text"),
    ("no byte fallback", "tokenizer.json has neither byte-level pieces nor byte_fallback, so it cannot spell every text"),
    ("no end of text", r"no end-of-text token: .* names no eos_token"),
])
def test_a_tokenizer_json_we_do_not_read_gets_one_line_naming_why(case, message, family_folders, tmp_path):
    with pytest.raises(UserError, match=message) as caught:
        pretrained_tokenizer(folder_we_do_not_read(case, family_folders, tmp_path))
    assert "\n" not in str(caught.value)


def test_a_run_whose_tokenizer_folder_is_gone_says_it_needs_that_folder_back(tmp_path):
    # A resumed init_from run reads its corpus again (its token cache gone) with the folder's tokenizer.
    spec = TokenizerSpec(kind="pretrained", path=str(tmp_path / "moved"))
    with pytest.raises(UserError, match="^" + re.escape(f"{tmp_path / 'moved'} is not a folder: this run's tokenizer comes from "
                                                        "the folder init_from started it from")):
        build_tokenizer(spec, "", lambda: [], tmp_path / "cache", "corpus")
