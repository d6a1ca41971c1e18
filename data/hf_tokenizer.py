"""Tokenizers in and out of Hugging Face's formats.

In: a GPT-2-style byte-level BPE folder becomes a tiktoken encoding with exactly Hugging Face's ids.
Out: any project tokenizer becomes a tokenizer.json (built with the `tokenizers` library) that
transformers' AutoTokenizer loads with no custom code and that gives the project's ids.

Both directions rest on one fact. Hugging Face merges the adjacent pair listed first in its merge
list; tiktoken merges the adjacent pair whose joined bytes have the lowest rank, and its rank is
also the token's id. The two agree when the merge list is exactly, in id order, the pair tiktoken
itself joins last to make each token (last_merge); reading a folder checks that, and writing one
lists those pairs.
"""

import json
from collections.abc import Mapping
from itertools import zip_longest
from pathlib import Path
from typing import Any

import tiktoken
from tiktoken_ext.openai_public import r50k_pat_str
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from data.bpe import GPT2_PATTERN
from data.tokenizer import EOT, CharTokenizer, Tokenizer, bpe_encoding
from user_error import UserError


def gpt2_byte_chars() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, as vocab.json and merges.txt spell tokens: printable
    Latin-1 bytes stand for themselves, the other 68 take the characters from U+0100 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [byte for byte in range(256) if byte not in printable]
    return {byte: chr(byte) for byte in printable} | {byte: chr(256 + n) for n, byte in enumerate(others)}


# GPT-2's pre-tokenisation as data/bpe.py writes it, and as tiktoken's gpt2 encoding does (possessive
# quantifiers, the same pieces): Hugging Face's ByteLevel pre-tokenizer runs either.
GPT2_PATTERNS = (GPT2_PATTERN, r50k_pat_str)
BYTE_CHAR = gpt2_byte_chars()
CHAR_BYTE = {char: byte for byte, char in BYTE_CHAR.items()}


def token_text(token: bytes) -> str:
    return "".join(BYTE_CHAR[byte] for byte in token)


def token_bytes(text: str, source: Path) -> bytes:
    try:
        return bytes(CHAR_BYTE[char] for char in text)
    except KeyError:
        raise UserError(f"{source}: the token {text!r} is not byte-level (GPT-2's 256 byte characters); "
                        "only a byte-level BPE can be read") from None


def last_merge(token: bytes, ranks: Mapping[bytes, int]) -> tuple[bytes, bytes] | None:
    """The two tokens tiktoken joins last to make token from its bytes: it joins the adjacent pair
    whose joined bytes have the lowest rank, leftmost first, until two are left. None if they never
    come down to two (tiktoken then gives the token only for a piece of text that is all of it)."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        joins = [(ranks[a + b], i) for i, (a, b) in enumerate(zip(parts, parts[1:], strict=False)) if a + b in ranks]
        if not joins:
            return None
        _, i = min(joins)
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    return parts[0], parts[1]


def merges_from_ranks(ranks: Mapping[bytes, int]) -> dict[bytes, tuple[bytes, bytes] | None]:
    """last_merge of each token of two bytes or more, in rank order: Hugging Face's merge list for these ranks."""
    longer = sorted((token for token in ranks if len(token) > 1), key=ranks.__getitem__)
    return {token: last_merge(token, ranks) for token in longer}


def encoding_from_hf_folder(folder: Path | str, name: str | None = None) -> tiktoken.Encoding:
    """tiktoken running the byte-level BPE in folder (tokenizer.json, or GPT-2's vocab.json and
    merges.txt) with exactly Hugging Face's ids; a vocabulary tiktoken cannot run exactly is refused."""
    folder = Path(folder)
    vocab, merges, special_tokens, whole_pieces_first = read_hf_bpe(folder)
    if EOT not in special_tokens:
        raise UserError(f"{folder}: the vocabulary has no special token {EOT}, the project's document separator; "
                        f"use a tokenizer trained with {EOT} among its special tokens")
    ranks = {token_bytes(text, folder): token_id for text, token_id in vocab.items() if text not in special_tokens}
    missing = [byte for byte in range(256) if bytes([byte]) not in ranks]
    if missing:
        raise UserError(f"{folder}: the vocabulary lacks {len(missing)} of the 256 single bytes (the first: "
                        f"{bytes(missing[:1])!r}), so some text has no tokens; train it with "
                        "initial_alphabet=pre_tokenizers.ByteLevel.alphabet()")
    ids = [*ranks.values(), *special_tokens.values()]
    if len(set(ids)) != len(ids):
        raise UserError(f"{folder}: two tokens of the vocabulary share an id; each token needs its own")
    check_merges(folder, [(token_bytes(a, folder), token_bytes(b, folder)) for a, b in merges], ranks, whole_pieces_first)
    return bpe_encoding(ranks, GPT2_PATTERN, special_tokens, name or str(folder))


def check_merges(folder: Path, merges: list[tuple[bytes, bytes]], ranks: dict[bytes, int], whole_pieces_first: bool) -> None:
    """Refuse merges that tiktoken, ranking a merge by the id of the token it makes, would not apply the same way."""
    implied = merges_from_ranks(ranks)
    tiktoken_merges = [pair for pair in implied.values() if pair is not None]
    for n, (theirs, ours) in enumerate(zip_longest(merges, tiktoken_merges), start=1):
        if theirs != ours:
            shown = [" + ".join(map(token_text, pair)) if pair else "none" for pair in (theirs, ours)]
            raise UserError(f"{folder}: merge {n} is {shown[0]!r} where tiktoken, which ranks a merge by the id of "
                            f"the token it makes, would apply {shown[1]!r}; only a BPE whose merges make new tokens "
                            "in id order (as GPT-2's and the tokenizers library's trainers do) can be run exactly")
    unmade = [token for token, pair in implied.items() if pair is None]
    if unmade and not whole_pieces_first:
        raise UserError(f"{folder}: no merge makes the token {token_text(unmade[0])!r}, which tiktoken would give "
                        "for that text and Hugging Face would not; use a vocabulary whose every token a merge makes")


def read_hf_bpe(folder: Path) -> tuple[dict[str, int], list[tuple[str, str]], dict[str, int], bool]:
    """vocab, merges, special tokens and whether whole words are looked up before merging (ignore_merges)."""
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder; give a folder holding tokenizer.json, or vocab.json and merges.txt")
    config_json = folder / "tokenizer_config.json"
    config = read_json(config_json) if config_json.is_file() else {}
    for key in ("add_prefix_space", "add_bos_token"):  # transformers applies these on top of the files
        if config.get(key):
            raise UserError(f"{config_json}: {key} is true, which GPT-2's tokenizer does not do; set it to false")
    if (folder / "tokenizer.json").is_file():
        return read_tokenizer_json(folder / "tokenizer.json")
    vocab_json, merges_txt = folder / "vocab.json", folder / "merges.txt"
    if not vocab_json.is_file() and not merges_txt.is_file():
        raise UserError(f"{folder} holds no tokenizer: it needs tokenizer.json, or vocab.json and merges.txt")
    for present, absent in ((vocab_json, merges_txt), (merges_txt, vocab_json)):
        if not absent.is_file():
            raise UserError(f"{folder} has {present.name} but no {absent.name}; a GPT-2-style BPE needs both "
                            "(or a tokenizer.json)")
    vocab = read_json(vocab_json)
    merges = []
    for n, line in enumerate(merges_txt.read_text(encoding="utf-8").splitlines(), start=1):
        if line and not line.startswith("#version"):
            pair = line.split(" ")
            if len(pair) != 2:
                raise UserError(f"{merges_txt}: line {n} is {line!r}, not two tokens separated by one space")
            merges.append((pair[0], pair[1]))
    return vocab, merges, ({EOT: vocab[EOT]} if EOT in vocab else {}), False


def read_tokenizer_json(path: Path) -> tuple[dict[str, int], list[tuple[str, str]], dict[str, int], bool]:
    spec = read_json(path)
    model, pre, post = spec.get("model") or {}, spec.get("pre_tokenizer") or {}, spec.get("post_processor")
    problems = [
        (model.get("type") != "BPE", f"its model is {model.get('type')}, not BPE"),
        (spec.get("normalizer") is not None, f"it has a normalizer ({spec['normalizer'] and spec['normalizer'].get('type')})"),
        (pre.get("type") != "ByteLevel", f"its pre-tokenizer is {pre.get('type')}, not ByteLevel"),
        (not pre.get("use_regex", True), "its ByteLevel pre-tokenizer does not use GPT-2's regex"),
        (pre.get("add_prefix_space", False), "its ByteLevel pre-tokenizer adds a prefix space"),
        (any(model.get(key) for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback")),
         "its BPE uses dropout, subword affixes or byte fallback"),
        (post is not None and post.get("type") != "ByteLevel", f"its post-processor ({post and post.get('type')}) adds tokens"),
    ]
    for wrong, problem in problems:
        if wrong:
            raise UserError(f"{path}: {problem}; only a GPT-2-style byte-level BPE can be read (ByteLevel "
                            "pre-tokenizer with its regex, add_prefix_space false, no normalizer)")
    merges = [tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge) for merge in model.get("merges", [])]
    special_tokens = {token["content"]: token["id"] for token in spec.get("added_tokens", [])}
    return model.get("vocab", {}), merges, special_tokens, bool(model.get("ignore_merges"))


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{path} is not valid JSON ({err}); the folder's tokenizer files may be damaged") from None


def write_hf_tokenizer(tokenizer: Tokenizer, folder: Path, model_max_length: int | None = None) -> None:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json in folder: transformers'
    AutoTokenizer loads them with no custom code and gives the project's ids on any text."""
    if isinstance(tokenizer, CharTokenizer):
        hf_tokenizer, special_tokens = hf_char_tokenizer(tokenizer), {EOT: tokenizer.eot_id}
    else:
        hf_tokenizer, special_tokens = hf_byte_level_tokenizer(tokenizer.encoding), tokenizer.encoding._special_tokens
    hf_tokenizer.add_special_tokens([AddedToken(text, special=True, normalized=False) for text in special_tokens])
    named = {"bos_token": EOT, "eos_token": EOT}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **named, "clean_up_tokenization_spaces": False}
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    folder.mkdir(parents=True, exist_ok=True)
    hf_tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(named, indent=2) + "\n")


def hf_char_tokenizer(tokenizer: CharTokenizer) -> HFTokenizer:
    """A BPE with no merges: one token per character. A character outside the vocabulary is dropped,
    as Hugging Face's BPE does with no unknown token (the project refuses such text)."""
    vocab = {char: token_id for token_id, char in enumerate(tokenizer.chars)} | {EOT: tokenizer.eot_id}
    hf_tokenizer = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    hf_tokenizer.decoder = decoders.Fuse()  # join the characters as they are (no decoder joins with spaces)
    return hf_tokenizer


def hf_byte_level_tokenizer(encoding: tiktoken.Encoding) -> HFTokenizer:
    """GPT-2's byte-level BPE with the encoding's ranks as ids and the merges tiktoken applies."""
    if encoding._pat_str not in GPT2_PATTERNS:
        raise UserError(f"the tokenizer splits text with {encoding._pat_str!r}; only GPT-2's pattern can be written "
                        "for Hugging Face")
    ranks = encoding._mergeable_ranks
    vocab = {token_text(token): rank for token, rank in ranks.items()}
    clashes = [text for text in encoding._special_tokens if text in vocab]
    if clashes:
        raise UserError(f"the special token {clashes[0]!r} is also an ordinary token of the vocabulary; "
                        "Hugging Face's vocabulary can give one spelling only one id")
    merges = [(token_text(a), token_text(b)) for a, b in filter(None, merges_from_ranks(ranks).values())]
    # ignore_merges: a piece of text that is a whole token gives that token, as in tiktoken.
    model = models.BPE(vocab=vocab | dict(encoding._special_tokens), merges=merges, ignore_merges=True)
    hf_tokenizer = HFTokenizer(model)
    hf_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf_tokenizer.decoder = decoders.ByteLevel()
    return hf_tokenizer
