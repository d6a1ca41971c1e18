"""Generation: from a model's next-token logits to new tokens, and from a prompt to text."""

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from model.decode_step import CompiledDecodeStep
from model.gpt import GPT, Caches, eval_mode
from model.sampling import DIVERGED, check_sampling_settings, choose_next_token, sampling_problem, uniform_noise

# How a printed text shows an <|endoftext|> the model wrote (sample.py, the training log's
# samples): the text it ended and the next it started, apart and readable.
EOT_SHOWN = "\n\n--- end of text ---\n\n"
# The characters a printed text shows as escapes (terminal_text): the control characters but the
# tab, the newline and a carriage return before a newline (a Windows line end); and the marks that
# reorder right-to-left text, which a terminal would obey unseen (U+061C, U+200E, U+200F, U+202A to
# U+202E, U+2066 to U+2069).
UNPRINTED = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]|\r(?!\n)")


def terminal_text(text: str) -> str:
    """text as sample.py prints it and the training log writes it: each control character other than
    a tab or a line end, and each mark that reorders text, as its escape (\\x1b, \\x07, \\u202e, ...).
    A young or random model writes any byte it has a token for, and an ESC or BEL printed as it is
    would move the terminal's cursor, change its colours or ring it. (TensorBoard's samples keep the
    text as the model wrote it.)"""
    return UNPRINTED.sub(lambda control: ascii(control.group())[1:-1], text)


# The attention kernels an eager generation step may use: all but cuDNN's. On recent NVIDIA GPUs
# PyTorch tries cuDNN's first for bf16 and fp16 with a mask, and cuDNN builds a plan for each new
# shape; generating, the keys grow by one at every token, so every token would wait for a build
# (on an H200, eager bf16 sampling ran 7 to 11 times slower than fp32: docs/speed.md). A CPU has
# no cuDNN kernel, so there nothing changes. The compiled decode step keeps one shape: not wrapped.
GROWING_SHAPE_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


# Whether this CPU has AMX, Intel's matrix tiles (Xeons since Sapphire Rapids), which oneDNN's
# bfloat16 matmuls use. There oneDNN read one bfloat16 row's weights a little faster than torch's own
# loop; on the AMD EPYC VMs without it, half as fast (docs/speed.md).
ONEDNN_HAS_AMX: bool = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()


@contextmanager
def one_bfloat16_row_without_onednn(model: GPT, rows: int) -> Iterator[None]:
    """oneDNN off inside, for a step whose matmuls have one row (rows == 1) of bfloat16 on a CPU
    without AMX: torch's own matrix-vector loop then reads the weights from memory about twice as
    fast (GPT-2 small decoded about 1.9x faster, the same tokens: docs/speed.md). More rows, and a CPU
    with AMX, keep oneDNN, faster there. The switch is process-wide: a thread computing meanwhile
    runs without oneDNN too."""
    weight = model.lm_head.weight
    if (rows != 1 or weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or ONEDNN_HAS_AMX
            or not torch.backends.mkldnn.enabled):
        yield
        return
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = True


class Tokenizer(Protocol):
    """What generate_text needs of a tokenizer; every tokenizer in data/tokenizer.py has it."""

    eot_id: int  # the end of a text
    bos_id: int  # the token every text starts after: eot_id itself, or Llama's <|begin_of_text|>

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def in_byte_run(self, token_id: int) -> bool: ...  # decoded together with the tokens beside it (TextStream)


def lay_out_for_decoding(model: GPT) -> None:
    """Store each float32 nn.Linear weight (out, in) of model, the tied LM head's with them, as
    its transpose (in, out) in memory, GPT-2's Conv1D layout: the same tensor, shape, values and
    name, so everything that reads it computes the same numbers, but W.T is now the contiguous one.

    Why: eager decoding spends most of a token in one-row matmuls x (1, in) @ W.T, which read every
    weight once, and MKL's float32 call reads (in, out) much faster than (out, in) (docs/speed.md,
    with the figures). bfloat16 weights stay as they are: torch's loop for one bfloat16 row
    (one_bfloat16_row_without_onednn) reads (out, in) far faster than (in, out), and oneDNN a little faster.

    Done once, in place: no second copy is kept. For a model that only generates, eagerly, on a CPU
    (sample.py with compile=false): not for one that trains or is saved again (safetensors refuses
    the strided tensors), nor for a CompiledDecodeStep's, whose loops are built for (out, in)."""
    with torch.no_grad():
        for module in model.modules():
            weight = module.weight if isinstance(module, nn.Linear) else None  # (out, in)
            if weight is not None and weight.dtype == torch.float32 and weight.is_contiguous():
                weight.data = weight.t().contiguous().t()  # still (out, in), its memory (in, out)


@torch.inference_mode()  # like no_grad, with less bookkeeping per op: decoding runs many tiny ops
def generate_tokens(
    model: GPT,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    use_kv_cache: bool = True,
    decode_step: CompiledDecodeStep | None = None,
    on_token: Callable[[torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """Continue idx (B, T) by max_new_tokens tokens; returns (B, T + max_new_tokens). temperature 0
    is greedy decoding; top_k keeps the k likeliest tokens; top_p the smallest set whose
    probabilities add up to p (ValueError for settings it cannot sample with: check_sampling_settings).

    The model sees a window of the text, at most its last block_size tokens: the
    whole text while it fits, and once one more token would not fit, the window slides by
    jumping to the last 3/4 of block_size tokens, then grows again one token at a time.

    use_kv_cache: feed each new token alone, with the window's earlier keys and values kept in a
    KVCache per layer, instead of recomputing the whole window every step. It changes the speed,
    never the tokens: both ways see the same window. (A model with a window and rotary positions
    keeps its ring caches past block_size instead of sliding; without the cache it still slides,
    which gives the same tokens while what the last token reads, n_layer * (window - 1) + 1 tokens
    (one more with smear), fits in the 3/4 of block_size a slide keeps.) The window jumps rather than
    moving a token at a time: with learned positions, moving would give every kept token a new
    position and stale cached keys and values; a jump rebuilds the cache once per block_size / 4 tokens.

    decode_step: a CompiledDecodeStep built for this model, batch size and sampling settings, which
    computes every step that feeds one token into the caches (use_kv_cache only). on_token: called
    after each new token with the tokens so far, (B, T + tokens made): sample.py's TextStream.
    """
    model.check_token_ids(idx)
    check_sampling_settings(max_new_tokens, temperature, top_k, top_p)
    check_generator_and_on_token(generator, on_token)
    B, T0 = idx.shape
    if decode_step is not None:
        decode_step.check_fits(model, B, temperature, top_k, top_p, use_kv_cache)
    block_size, vocab_size = model.config.block_size, model.config.vocab_size
    keep = max(1, block_size * 3 // 4)  # tokens the window keeps when it slides
    tokens = torch.empty(B, T0 + max_new_tokens, dtype=idx.dtype, device=idx.device)  # (B, T0 + max_new_tokens)
    tokens[:, :T0] = idx  # the rest is written one column per step
    start = max(0, T0 - block_size)  # the window is tokens[:, start:end]
    caches = None  # the KV caches (model.new_caches()) of the current window
    with eval_mode(model):
        for end in range(T0, T0 + max_new_tokens):  # tokens[:, :end] are known; this step writes tokens[:, end]
            if end - start > block_size and not (caches is not None and model.generates_past_block_size):
                # The window is full: slide it, start a new cache. (A window model with rotary
                # positions goes on with its ring caches instead: nothing in them goes stale.)
                start, caches = end - keep, None
            uniform = uniform_noise(B, vocab_size, temperature, generator, idx.device)  # (B, vocab_size) or None
            if decode_step is not None and caches is not None:
                tokens[:, end : end + 1] = decode_step(tokens[:, end - 1 : end], caches, uniform)  # (B, 1), compiled
            else:
                next_logits, caches = eager_step(model, tokens, start, end, caches, use_kv_cache)  # (B, vocab_size)
                tokens[:, end : end + 1] = choose_next_token(next_logits, temperature, top_k, top_p, uniform)  # (B, 1)
            if on_token is not None:
                on_token(tokens[:, : end + 1])
    return tokens


def eager_step(model: GPT, tokens: torch.Tensor, start: int, end: int, caches: Caches | None,
               use_kv_cache: bool) -> tuple[torch.Tensor, Caches | None]:
    """One step of generate_tokens, eager: the logits (B, vocab_size) for tokens[:, end], whose
    window is tokens[:, start:end], and the caches to go on with. FloatingPointError where the
    logits are NaN or inf."""
    # Only the last position predicts: the head runs there alone (last_only).
    with sdpa_kernel(GROWING_SHAPE_KERNELS):
        if not use_kv_cache:
            logits, _ = model(tokens[:, start:end], last_only=True)  # (B, 1, vocab_size): the whole window, again
        elif caches is None:
            caches = model.new_caches()
            logits, _ = model(tokens[:, start:end], caches=caches, last_only=True)  # (B, 1, vocab_size), filling the caches
        else:
            with one_bfloat16_row_without_onednn(model, rows=len(tokens)):  # one matmul row per sample
                logits, _ = model(tokens[:, end - 1 : end], caches=caches)  # (B, 1, vocab_size): the newest token alone
    next_logits = logits[:, -1, :]  # (B, vocab_size)
    if not torch.isfinite(next_logits).all():
        raise FloatingPointError(DIVERGED)
    return next_logits, caches


def check_generator_and_on_token(generator: object, on_token: object) -> None:
    """ValueError, in one line, for a generator or on_token of generate_tokens that is not one
    (torch's own words came from inside rand(), or after the first token)."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator={generator!r} is no torch.Generator: give torch.Generator().manual_seed(seed), "
                         "or None for torch's own")
    if on_token is not None and not callable(on_token):
        raise ValueError(f"on_token={on_token!r} is not a function: give a function of the tokens so far, or None")


def prompt_ids(tokenizer: Tokenizer, prompt: str) -> list[int]:
    """What generate_text feeds the model first: the start token (<|endoftext|>, or Llama's
    <|begin_of_text|>), where every training document starts, so that the model knows it is at the
    beginning; then the prompt's ids."""
    return [tokenizer.bos_id, *tokenizer.encode(prompt)]


def generate_text(
    model: GPT,
    tokenizer: Tokenizer,
    prompt: str,
    max_new_tokens: int,
    temperature: float = 0.6,
    top_k: int | None = None,
    top_p: float | None = None,
    num_samples: int = 1,
    seed: int = 0,
    use_kv_cache: bool = True,
    compile: bool = False,
    eot_text: str | None = None,
    on_text: Callable[[str], None] | None = None,
) -> list[str]:
    """num_samples continuations of prompt, each returned as prompt + new text. The same
    seed gives the same samples. compile: build a CompiledDecodeStep first (seconds), then
    generate with it (faster per token; the same tokens unless rounding flips a near tie).
    eot_text: what each end of text (eot_id) the model writes reads as (None: as the tokenizer decodes it).
    on_text: called with the first sample's text as it grows, a piece at a time (the prompt first):
    the pieces add up to the text returned for it."""
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be a text (a str); got a {type(prompt).__name__}: token ids go to generate_tokens")
    for setting, value in (("num_samples", num_samples), ("seed", seed)):  # generate_tokens checks the rest
        if problem := sampling_problem(setting, value):
            raise ValueError(problem)
    device = next(model.parameters()).device
    ids = prompt_ids(tokenizer, prompt)
    context = ids[:1]  # the start token, not part of the output
    batch = torch.tensor([ids] * num_samples, dtype=torch.long, device=device)  # (num_samples, T0)
    generator = torch.Generator(device=device).manual_seed(seed)
    # Only steps after the first one run compiled: with one new token there is nothing to compile for.
    decode_step = CompiledDecodeStep(model, num_samples, temperature, top_k, top_p) if compile and max_new_tokens > 1 else None
    stream = TextStream(tokenizer, len(context), eot_text, on_text) if on_text is not None else None
    if stream is not None:
        stream(batch)  # the prompt, at once
    tokens = generate_tokens(model, batch, max_new_tokens, temperature, top_k, top_p, generator=generator,
                             use_kv_cache=use_kv_cache, decode_step=decode_step, on_token=stream)
    texts = [decode(tokenizer, row[len(context) :].tolist(), eot_text) for row in tokens]
    if stream is not None:
        stream.finish(texts[0])
    return texts


class TextStream:
    """Hands on_text the first row's text as it grows: after each token, what its decoded text has
    gained since the last call. Text that a later token could still change is held back until it
    cannot: the trailing tokens that decode alone to a broken character (a BPE token's share of a
    character's bytes), and Llama 2's byte tokens, which its decoder reads as one run (a valid byte
    before a broken one turns to U+FFFD with it), wait for a token that decodes whole, and a carriage
    return for what follows it (terminal_text shows a lone one as an escape).

    With eot_text, each call decodes the tokens since the last end of text the model wrote, not
    the whole text: decode() splits the text there, so what follows decodes alone to the same
    characters."""

    def __init__(self, tokenizer: Tokenizer, skip: int, eot_text: str | None, on_text: Callable[[str], None]) -> None:
        self.tokenizer, self.eot_text, self.on_text = tokenizer, eot_text, on_text
        self.start = skip  # the first token of the text being written: after the start token(s), then after each end of text
        self.shown = ""  # what on_text has been given of the text since `start`
        self.shown_before = 0  # characters given for the texts before `start`
        self.looked_at = 0  # of the tokens since `start`, those whose own decoding was looked at
        self.whole = 0  # ... and the first `whole` of them end with one that decodes alone to whole characters

    def __call__(self, tokens: torch.Tensor) -> None:
        """tokens: (B, T) the tokens so far, the start token(s) first."""
        ids = tokens[0, self.start :].tolist()
        for i in range(self.looked_at, len(ids)):  # each new token, decoded alone once
            if "\ufffd" not in self.tokenizer.decode(ids[i : i + 1]) and not self.tokenizer.in_byte_run(ids[i]):
                self.whole = i + 1
        self.looked_at = len(ids)
        text = decode(self.tokenizer, ids[: self.whole], self.eot_text)
        settled = text.rstrip("\r")
        if len(settled) > len(self.shown) and settled.startswith(self.shown):
            self.on_text(settled[len(self.shown) :])
            self.shown = settled
        ended = self.whole == len(ids) > 0 and ids[-1] == self.tokenizer.eot_id
        if ended and self.eot_text is not None and self.shown == text:  # a text ended, all of it shown
            self.start += len(ids)
            self.shown_before += len(self.shown)
            self.shown, self.looked_at, self.whole = "", 0, 0

    def finish(self, text: str) -> None:
        """The rest of text, the first sample's whole text, at the end."""
        self.on_text(text[self.shown_before + len(self.shown) :])


def decode(tokenizer: Tokenizer, ids: list[int], eot_text: str | None = None) -> str:
    """tokenizer.decode(ids), each end of text written as eot_text if given. The pieces between
    them are decoded apart, so a prompt that holds the characters "<|endoftext|>" keeps them.
    Where the start token is another token (Llama's), it starts the next text: after an end of
    text (or at the start) it shows nothing more, elsewhere it ends the text before as eot does."""
    if eot_text is None:
        return tokenizer.decode(ids)
    bos = tokenizer.bos_id
    pieces, piece = [], []
    for token in ids:
        if token == tokenizer.eot_id or (token == bos and piece):  # a text ends
            pieces.append(piece)
            piece = []
        elif token != bos:  # a start token first, or right after an end, adds nothing
            piece.append(token)
    return eot_text.join(tokenizer.decode(piece) for piece in [*pieces, piece])
