"""Tokenizers in and out of Hugging Face's formats.

In: a folder's tokenizer with exactly Hugging Face's ids. A GPT-2-style byte-level BPE becomes a
tiktoken encoding (as fast as the bpe kind); any other BPE tokenizer.json (Llama 3, SmolLM2, Llama 2 /
TinyLlama, Qwen) is run by the tokenizers library itself, as written. The folder also says which token
ends a document (eot_id) and which one the post-processor puts before every text (bos_id).
Out: any project tokenizer becomes a tokenizer.json (built with the `tokenizers` library) that
transformers' AutoTokenizer loads with no custom code and that gives the project's ids.

Both directions rest on one fact. Hugging Face merges the adjacent pair listed first in its merge
list; tiktoken merges the adjacent pair whose joined bytes have the lowest rank, and its rank is
also the token's id. The two agree when the merge list is exactly, in id order, the pair tiktoken
itself joins last to make each token (last_merge); reading a folder checks that, and writing one
lists those pairs.
"""

import json
import re
from collections.abc import Mapping, Sequence
from itertools import zip_longest
from pathlib import Path
from typing import Any

import numpy as np
import tiktoken
from tiktoken_ext.openai_public import r50k_pat_str
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from data.bpe import GPT2_PATTERN
from data.tokenizer import EOT, CharTokenizer, TiktokenTokenizer, Tokenizer, bpe_encoding, known_ids
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
# The Split patterns of Llama 3 and of Qwen 2 and 3. Like GPT-2's, no piece they make holds a space
# after a non-space character, so the token stream may cut text before such a space.
LLAMA3_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
CUT_SAFE_PATTERNS = (*GPT2_PATTERNS, LLAMA3_PATTERN, QWEN2_PATTERN)
# The tokens that end a pretraining document, taken before tokenizer_config.json's eos_token: an
# instruct model's eos_token is often the end of a chat turn (Qwen3's <|im_end|>, Llama 3's <|eot_id|>).
DOCUMENT_ENDS = (EOT, "<|end_of_text|>")
# What the tokenizers library runs for us: pieces that keep every character (decode gives the text back).
READ_NORMALIZERS = ("NFC", "Prepend", "Replace")  # Prepend and Replace: Llama 2's "▁" before and for spaces
READ_PRE_TOKENIZERS = ("ByteLevel", "Split", "Digits", "Metaspace")
BYTE_FALLBACK_TOKEN = re.compile(r"<0x([0-9A-F]{2})>")


class NotExactInTiktoken(UserError):
    """A BPE whose merges tiktoken, ranking by id, would apply in another order: the tokenizers library runs it."""


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
    merges.txt) with exactly Hugging Face's ids; a vocabulary tiktoken cannot run exactly is refused.
    The ids of plain text only: which token starts a text is pretrained_tokenizer's business."""
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
            raise NotExactInTiktoken(f"{folder}: merge {n} is {shown[0]!r} where tiktoken, which ranks a merge by the id "
                                     f"of the token it makes, would apply {shown[1]!r}; only a BPE whose merges make new "
                                     "tokens in id order (as GPT-2's and the tokenizers library's trainers do) can be run "
                                     "exactly")
    unmade = [token for token, pair in implied.items() if pair is None]
    if unmade and not whole_pieces_first:
        raise NotExactInTiktoken(f"{folder}: no merge makes the token {token_text(unmade[0])!r}, which tiktoken would "
                                 "give for that text and Hugging Face would not; use a vocabulary whose every token a "
                                 "merge makes")


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
    if (folder / "added_tokens.json").is_file():
        raise UserError(f"{folder / 'added_tokens.json'}: tokens added to a vocab.json and merges.txt BPE are not read "
                        "here; save the tokenizer with transformers' save_pretrained, which writes them into a tokenizer.json")
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
    problems = tiktoken_problems(spec)
    if problems:
        raise UserError(f"{path}: {problems[0]}; only a GPT-2-style byte-level BPE can be read (ByteLevel "
                        "pre-tokenizer with its regex, add_prefix_space false, no normalizer)")
    model = spec["model"]
    merges = [tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge) for merge in model.get("merges", [])]
    special_tokens = {token["content"]: token["id"] for token in spec.get("added_tokens", [])}
    return model.get("vocab", {}), merges, special_tokens, bool(model.get("ignore_merges"))


def tiktoken_problems(spec: Mapping[str, Any]) -> list[str]:
    """Why tiktoken, splitting text with GPT-2's pattern, could not give this tokenizer.json's ids (none: it can).
    The post-processor is not among them: it adds tokens only where asked, never to plain text."""
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    problems = [
        (model.get("type") != "BPE", f"its model is {model.get('type')}, not BPE"),
        (spec.get("normalizer") is not None, f"it has a normalizer ({spec['normalizer'] and spec['normalizer'].get('type')})"),
        (pre.get("type") != "ByteLevel", f"its pre-tokenizer is {pre.get('type')}, not ByteLevel"),
        (not pre.get("use_regex", True), "its ByteLevel pre-tokenizer does not use GPT-2's regex"),
        (pre.get("add_prefix_space", False), "its ByteLevel pre-tokenizer adds a prefix space"),
        (any(model.get(key) for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback")),
         "its BPE uses dropout, subword affixes or byte fallback"),
    ]
    return [problem for wrong, problem in problems if wrong]


def read_json(path: Path) -> Any:
    """A JSON file of a Hugging Face folder (config.json, tokenizer.json, ...); one line if it is not JSON."""
    return read_json_and_text(path)[0]


def read_json_and_text(path: Path) -> tuple[Any, str]:
    try:
        text = path.read_text(encoding="utf-8")
        return json.loads(text), text
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{path} is not valid JSON ({err}); the folder's files may be damaged: download it again") from None


def pretrained_tokenizer(folder: Path | str) -> Tokenizer:
    """The tokenizer in a Hugging Face folder with exactly Hugging Face's ids: tiktoken runs a GPT-2-style
    byte-level BPE that starts texts with <|endoftext|>; the tokenizers library runs any other BPE tokenizer.json."""
    folder = Path(folder)
    spec_path = folder / "tokenizer.json"
    if not spec_path.is_file():  # GPT-2's vocab.json and merges.txt (read_hf_bpe names what is missing)
        return TiktokenTokenizer("pretrained", encoding_from_hf_folder(folder))
    config_json = folder / "tokenizer_config.json"
    config = read_json(config_json) if config_json.is_file() else {}
    spec, spec_text = read_json_and_text(spec_path)
    check_readable(spec, config, folder)
    backend = HFTokenizer.from_str(spec_text)
    eot_id, bos_id = end_and_start_ids(backend, spec, config, folder)
    # tiktoken where it gives the same ids (read_hf_bpe refuses add_bos_token, which transformers 5 ignores
    # beside a tokenizer.json: the tokenizers library runs such a folder). An added token that is not
    # special is matched in plain text, which tiktoken's encode_ordinary never does.
    only_special_added = all(token.get("special") for token in spec.get("added_tokens", []))
    if (eot_id == bos_id == backend.token_to_id(EOT) and not tiktoken_problems(spec) and not config.get("add_bos_token")
            and only_special_added):
        try:
            return TiktokenTokenizer("pretrained", encoding_from_hf_folder(folder))
        except NotExactInTiktoken:
            pass  # merges listed out of id order: the tokenizers library applies them as listed
    return TokenizersTokenizer(spec_text, eot_id, bos_id, str(folder))


def parts(step: Mapping[str, Any] | None, key: str) -> list[Mapping[str, Any]]:
    """The steps of a normalizer, pre-tokenizer or post-processor, a Sequence's (under key) opened up."""
    if step is None:
        return []
    if step.get("type") == "Sequence":
        return [part for inner in step[key] for part in parts(inner, key)]
    return [step]


def check_readable(spec: Mapping[str, Any], config: Mapping[str, Any], folder: Path) -> None:
    """One line for a tokenizer.json we do not read: a model other than BPE, a lossy piece, or a setting
    transformers applies on top of the file."""
    model = spec.get("model") or {}
    normalizers = [part.get("type") for part in parts(spec.get("normalizer"), "normalizers")]
    pre_tokenizers = [part.get("type") for part in parts(spec.get("pre_tokenizer"), "pretokenizers")]
    wrong_normalizer = next((name for name in normalizers if name not in READ_NORMALIZERS), None)
    wrong_pre_tokenizer = next((name for name in pre_tokenizers if name not in READ_PRE_TOKENIZERS), None)
    problems = [
        (model.get("type") != "BPE", f"tokenizer.json's model is {model.get('type')}; only a BPE (as GPT-2, Llama, "
                                     "SmolLM2 and Qwen use) can be read, not WordPiece, Unigram or WordLevel"),
        (bool(model.get("dropout")), "tokenizer.json's BPE uses dropout (other ids on each call); set dropout to null"),
        (wrong_normalizer is not None, f"tokenizer.json's normalizer {wrong_normalizer} is not one we read "
                                       f"({', '.join(READ_NORMALIZERS)}, or none)"),
        (wrong_pre_tokenizer is not None, f"tokenizer.json's pre-tokenizer {wrong_pre_tokenizer} is not one we read "
                                          f"({', '.join(READ_PRE_TOKENIZERS)}, or none)"),
        (bool(config.get("add_prefix_space")), "tokenizer_config.json's add_prefix_space is true, which transformers "
                                               "applies on top of tokenizer.json; set it to false"),
    ]
    for wrong, problem in problems:
        if wrong:
            raise UserError(f"{folder}: {problem}")
    vocab = model.get("vocab") or {}
    if "ByteLevel" not in pre_tokenizers and not model.get("byte_fallback"):  # e.g. export.py's form of a char run
        raise UserError(f"{folder}: tokenizer.json has neither byte-level pieces nor byte_fallback, so it cannot spell "
                        "every text; only a BPE with one of them can be read (a tokenizer=char run's export has neither)")
    if "ByteLevel" in pre_tokenizers:
        missing = [char for char in BYTE_CHAR.values() if char not in vocab]
    else:
        missing = [f"<0x{byte:02X}>" for byte in range(256) if f"<0x{byte:02X}>" not in vocab]
    if missing:
        raise UserError(f"{folder}: tokenizer.json cannot spell every text: its vocabulary lacks {len(missing)} "
                        f"byte token(s) (the first: {missing[0]}); only a byte-level BPE or one with byte_fallback "
                        "can be read")


def token_content(token: str | Mapping[str, Any] | None) -> str | None:
    """A token named in tokenizer_config.json: a string, or an AddedToken written as a dict."""
    return token.get("content") if isinstance(token, Mapping) else token


def end_and_start_ids(backend: HFTokenizer, spec: Mapping[str, Any], config: Mapping[str, Any], folder: Path) -> tuple[int, int]:
    """(eot_id, bos_id). The end of a document: <|endoftext|> or <|end_of_text|> if the vocabulary has one as a
    special token, else tokenizer_config.json's eos_token. The start of a text: the one token tokenizer.json's
    post-processor puts before it (transformers 5 takes that, not tokenizer_config.json's add_bos_token), else
    the end token."""
    specials = {token["content"] for token in spec.get("added_tokens", []) if token.get("special")}
    eos = token_content(config.get("eos_token"))
    eot = next((name for name in DOCUMENT_ENDS if name in specials), eos)
    eot_id = backend.token_to_id(eot) if eot else None
    if eot_id is None:
        named = f"names {eos!r}, which is not a token of the vocabulary" if eos else "names no eos_token"
        raise UserError(f"{folder}: no end-of-text token: the vocabulary has no special {' or '.join(DOCUMENT_ENDS)} "
                        f"and tokenizer_config.json {named}; the project needs one to end each document")
    before = tokens_added_around(backend, folder)
    if len(before) > 1:
        raise UserError(f"{folder}: the post-processor puts {len(before)} tokens ({', '.join(map(backend.id_to_token, before))}) "
                        "before every text; only one start token can be read")
    return eot_id, before[0] if before else eot_id


def tokens_added_around(backend: HFTokenizer, folder: Path) -> list[int]:
    """The ids the post-processor puts before a text; UserError if it puts any after it, or changes its own ids."""
    plain = backend.encode("a", add_special_tokens=False).ids
    added = backend.encode("a", add_special_tokens=True).ids
    start = next((i for i in range(len(added) - len(plain) + 1) if added[i : i + len(plain)] == plain), None)
    if start is None:
        raise UserError(f"{folder}: the post-processor changes a text's own ids ({plain} becomes {added}); "
                        "only one that adds a start token can be read")
    after = added[start + len(plain) :]
    if after:
        raise UserError(f"{folder}: the post-processor puts {', '.join(map(backend.id_to_token, after))} after every "
                        "text; only one that adds a start token before it can be read")
    return added[:start]


def text_cuts(spec: Mapping[str, Any]) -> str:
    """"spaces" when the pre-tokenizer splits text with a pattern that starts a piece before a space between two
    non-space characters (GPT-2's, Llama 3's, Qwen's) and the rest (NFC, Digits, ByteLevel without a prefix space)
    changes nothing across such a cut; else "nowhere": each document is encoded whole."""
    normalizer = spec.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        return "nowhere"  # Llama 2's Prepend puts a "▁" before each text encoded: a cut would add one

    def splits_safely(step: Mapping[str, Any]) -> bool:
        if step.get("type") == "ByteLevel":
            return step.get("use_regex", True)  # GPT-2's pattern
        pattern = (step.get("pattern") or {}).get("Regex")
        return step.get("type") == "Split" and pattern in CUT_SAFE_PATTERNS and step.get("behavior") == "Isolated" \
            and not step.get("invert")

    steps = parts(spec.get("pre_tokenizer"), "pretokenizers")
    harmless = all(splits_safely(step) or step.get("type") in ("Digits", "ByteLevel") for step in steps)
    no_prefix = not any(step.get("add_prefix_space") for step in steps if step.get("type") == "ByteLevel")
    return "spaces" if harmless and no_prefix and any(map(splits_safely, steps)) else "nowhere"


class TokenizersTokenizer:
    """A tokenizer.json run by Hugging Face's tokenizers library behind the common interface (the pretrained
    kind, where tiktoken cannot run it exactly). Special tokens typed in a text are spelt out as ordinary text,
    as tiktoken's encode_ordinary does; an added token that is not special (Qwen's <think>) is still matched,
    as transformers matches it."""

    kind = "pretrained"

    def __init__(self, spec_text: str, eot_id: int, bos_id: int, name: str) -> None:
        self.spec_text, self.eot_id, self.bos_id, self.name = spec_text, eot_id, bos_id, name
        self.backend = HFTokenizer.from_str(spec_text)
        self.backend.encode_special_tokens = True  # "<|endoftext|>" in a text is text, not the token
        spec = json.loads(spec_text)
        self.vocab_size = max(self.backend.get_vocab(with_added_tokens=True).values()) + 1
        self.text_cuts = text_cuts(spec)
        self.added = {token["id"]: token["content"] for token in spec.get("added_tokens", [])}
        self.byte_level = "ByteLevel" in [step.get("type") for step in parts(spec.get("pre_tokenizer"), "pretokenizers")]
        self.byte_fallback = bool(spec["model"].get("byte_fallback"))

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "TokenizersTokenizer":
        return cls(state["tokenizer_json"], state["eot_id"], state["bos_id"], state["name"])

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """encode of each text; the library spreads a batch over every core."""
        return [np.array(encoding.ids, dtype=np.uint32) for encoding in self.backend.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.backend.decode(known_ids(ids, self.vocab_size), skip_special_tokens=False)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        # A token can hold part of a multi-byte character; show such bytes as \xNN, as TiktokenTokenizer does.
        return [self.token_bytes(i).decode("utf-8", errors="backslashreplace") for i in known_ids(ids, self.vocab_size)]

    def in_byte_run(self, token_id: int) -> bool:
        """Whether this is one of Llama 2's byte tokens (<0x46>), which the decoder reads as one run with
        the byte tokens beside it: a valid byte in a run that holds a broken character turns to U+FFFD too."""
        return self.byte_fallback and BYTE_FALLBACK_TOKEN.fullmatch(self.backend.id_to_token(token_id) or "") is not None

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for on its own (decode would drop a lone Llama 2 token's leading space)."""
        if token_id in self.added:
            return self.added[token_id].encode()
        token = self.backend.id_to_token(token_id) or ""
        if self.byte_level and all(char in CHAR_BYTE for char in token):
            return bytes(CHAR_BYTE[char] for char in token)
        byte = BYTE_FALLBACK_TOKEN.fullmatch(token) if self.byte_fallback else None
        return bytes([int(byte[1], 16)]) if byte else token.replace("▁", " ").encode()

    def state(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "tokenizer_json": self.spec_text, "eot_id": self.eot_id,
                "bos_id": self.bos_id}


def write_hf_tokenizer(tokenizer: Tokenizer, folder: Path, model_max_length: int | None = None) -> None:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json in folder: transformers'
    AutoTokenizer loads them with no custom code and gives the project's ids on any text (a folder's
    tokenizer the tokenizers library runs is written as it came, its start and end tokens named)."""
    if isinstance(tokenizer, TokenizersTokenizer):
        hf_tokenizer = HFTokenizer.from_str(tokenizer.spec_text)
    else:
        if isinstance(tokenizer, CharTokenizer):
            hf_tokenizer, special_tokens = hf_char_tokenizer(tokenizer), {EOT: tokenizer.eot_id}
        else:
            hf_tokenizer, special_tokens = hf_byte_level_tokenizer(tokenizer.encoding), tokenizer.encoding._special_tokens
        hf_tokenizer.add_special_tokens([AddedToken(text, special=True, normalized=False) for text in special_tokens])
    named = {"bos_token": hf_tokenizer.id_to_token(tokenizer.bos_id), "eos_token": hf_tokenizer.id_to_token(tokenizer.eot_id)}
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
