"""The text sections: the Attention tab's answer to your own text on the CPU, for the default model
(text, with the answer to the repeated random tokens and the three tools' answers beside it) and
at GPT-2 small's shape (gpt2_text)."""

import json
from dataclasses import replace
from pathlib import Path

import torch

from attention_tab.live_model import THREADS, LoadedModel, answer, model_bytes, repeated_answer
from attention_tab.tools import attribution_answer, lens_answer, patch_answer, patch_example
from bench.common import median_time, torch_threads
from cli.run_spec import composed_run_spec
from data.batches import probe_ids
from data.bpe import GPT2_PATTERN
from data.stories import generate_stories
from data.token_cache import prepare_tokens
from data.tokenizer import TiktokenTokenizer, Tokenizer, bpe_encoding
from inspection.repeated_tokens import largest_n
from inspection.text_forward import text_ids
from model import GPT, GPTConfig
from model_io.checkpoint import build_model

ANSWERS_PER_RUN = 10
TOOL_ANSWERS_PER_RUN = 3  # each takes a tenth of a second or less: three are enough to time, and keep the bench's test short


def default_run_data(cache_dir: Path):
    """The default run's corpus and tokenizer (stories, BPE: 1,274 tokens), built as train.py builds them."""
    default = composed_run_spec()
    return prepare_tokens(replace(default.corpus, cache_dir=str(cache_dir)), default.tokenizer)


def bench_text(repeats: int, work: Path) -> dict:
    """ms per answer to a text of block_size tokens (<|endoftext|> and 127 of a held-out story) for
    the default model at random init (the same work as a trained one); to the longest repeated
    random tokens it reads (<|endoftext|> and 63 tokens twice); and the tools' answers: the lens
    and attribution on that text, patching on the tab's example (the name swap)."""
    data = default_run_data(work / "cache")
    torch.manual_seed(0)
    model = build_model(composed_run_spec().model, data.tokenizer.vocab_size).eval()
    text = data.tokenizer.decode(probe_ids(data.val, data.tokenizer, model.config.block_size - 1))
    return {**time_answers(model, data.tokenizer, text, repeats, ANSWERS_PER_RUN),
            **time_repeated_answers(model, data.tokenizer, repeats, ANSWERS_PER_RUN),
            **time_tools(model, data.tokenizer, text, repeats, TOOL_ANSWERS_PER_RUN)}


def bench_gpt2_text(repeats: int) -> dict:
    """The same at GPT-2 small's shape (124 M parameters: 12 layers x 12 heads x 768, 1,024
    positions, 50,257 tokens), random weights, on a text of 128 tokens."""
    tokenizer = TiktokenTokenizer("bpe", bpe_encoding(made_up_ranks(50_256), GPT2_PATTERN))  # 50,257 with <|endoftext|>
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=1024, n_layer=12, n_head=12, n_embd=768,
                       bias=True, pos="learned", mlp="gelu_tanh")
    torch.manual_seed(0)
    model = GPT(config).eval()
    story = "".join(generate_stories(seed=1, n_chars=5_000))
    text = tokenizer.decode(tokenizer.encode(story)[:127])
    return time_answers(model, tokenizer, text, repeats, answers_per_run=2)


def made_up_ranks(n: int) -> dict[bytes, int]:
    """n byte-level BPE tokens: the 256 bytes, then pairs of bytes (printable ones first), for a
    vocabulary of GPT-2's size without GPT-2's files."""
    ranks = {bytes([b]): b for b in range(256)}
    order = [*range(32, 127), *range(256)]
    for first in order:
        for second in order:
            if len(ranks) == n:
                return ranks
            ranks.setdefault(bytes([first, second]), len(ranks))
    return ranks


def loaded_as_the_tab_holds_it(model: GPT, tokenizer: Tokenizer) -> LoadedModel:
    """model as the tab's cache holds a run's checkpoint (no file behind it: the bench built it)."""
    return LoadedModel(model, tokenizer, Path("ckpt_best.pt"), 0, (0, 0), model_bytes(model))


def time_answers(model: GPT, tokenizer: Tokenizer, text: str, repeats: int, answers_per_run: int) -> dict:
    """The tab's answer to text, as the tab makes it (LoadedModel.read, then the JSON the route
    sends), on the threads the tab runs torch on: intact, and with one head knocked out after the
    text was read intact (the tab keeps those numbers: one forward)."""
    loaded = loaded_as_the_tab_holds_it(model, tokenizer)

    def answers(knocked_out: list[tuple[int, int]]) -> None:
        for _ in range(answers_per_run):
            json.dumps(answer("run", loaded, loaded.read(text, knocked_out)), allow_nan=False)

    with torch_threads(THREADS):
        tokens = len(loaded.read(text, []).ids)
        intact_s, knocked_out_s = (median_time(lambda heads=heads: answers(heads), repeats) for heads in ([], [(1, 0)]))
    return {"tokens": tokens, "params": model.num_parameters(), "threads": THREADS, "model_mb": model_bytes(model) / 2**20,
            "answer_ms": 1e3 * intact_s / answers_per_run, "knocked_out_answer_ms": 1e3 * knocked_out_s / answers_per_run}


def time_repeated_answers(model: GPT, tokenizer: Tokenizer, repeats: int, answers_per_run: int) -> dict:
    """The tab's answer to the longest repeated random tokens the model reads, as the repeated
    route makes it: intact, and with one head knocked out after reading them intact."""
    loaded = loaded_as_the_tab_holds_it(model, tokenizer)
    n = largest_n(model.config.block_size)

    def answers(knocked_out: list[tuple[int, int]]) -> None:
        for _ in range(answers_per_run):
            json.dumps(repeated_answer("run", loaded, loaded.read_repeated(n, 0, knocked_out)), allow_nan=False)

    with torch_threads(THREADS):
        intact_s, knocked_out_s = (median_time(lambda heads=heads: answers(heads), repeats) for heads in ([], [(1, 0)]))
    return {"repeated_tokens": 2 * n + 1, "repeated_answer_ms": 1e3 * intact_s / answers_per_run,
            "repeated_knocked_out_answer_ms": 1e3 * knocked_out_s / answers_per_run}


def time_tools(model: GPT, tokenizer: Tokenizer, text: str, repeats: int, answers_per_run: int) -> dict:
    """The three tools' answers as their routes make them (attention_tab/tools.py, then the JSON),
    on the tab's torch threads: the lens on the text, attribution at its middle query (each
    head's knock-out included), and patching every head and every layer and position of the tab's
    first prompts (patch_example: the name swap in the stories' words)."""
    loaded = loaded_as_the_tab_holds_it(model, tokenizer)
    source = {"text": text}
    prompts = {key: value for key, value in patch_example("run", loaded).items() if key in ("clean", "corrupted", "token", "other")}
    middle = len(loaded.read(text, []).ids) // 2
    asks = {"lens_ms": lambda: lens_answer("run", loaded, source, []),
            "attribution_ms": lambda: attribution_answer("run", loaded, source, [], middle),
            "patch_ms": lambda: patch_answer("run", loaded, **prompts)}

    def answers(ask) -> None:
        for _ in range(answers_per_run):
            json.dumps(ask(), allow_nan=False)

    with torch_threads(THREADS):
        times = {name: 1e3 * median_time(lambda ask=ask: answers(ask), repeats) / answers_per_run for name, ask in asks.items()}
    return {**times, "patch_tokens": len(text_ids(tokenizer, prompts["clean"], model.config.block_size))}
