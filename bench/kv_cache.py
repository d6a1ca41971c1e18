"""The kv_cache section: the KV cache's bytes and generation's tokens/s at 1k, 4k and 16k tokens of
context, with a key/value head per query head (MHA), one per 4 (GQA 4:1), one in all (MQA), and
with a window of 256 tokens."""

import copy
import statistics
import time
from dataclasses import replace

import torch

from bench.sampling import DEFAULT_RUN_VOCAB
from cli.run_spec import composed_run_spec
from model import GPT, GPTConfig
from model.gpt import Caches
from model_io.checkpoint import build_model

CONTEXTS = (1024, 4096, 16384)
NEW_TOKENS = 32
# The default model (configs/model/gpt.yaml, whatever it holds: today 128 wide, 4 layers, Qwen3's shape) with
# 8 heads instead of 4, so that GQA 4:1 has 2 key/value heads. Full attention gets block_size =
# the context, whose slots its cache holds; the window model keeps block_size 1024 and generates
# past it in its ring of 256 slots.
N_HEAD = 8
WINDOW, WINDOW_BLOCK_SIZE = 256, 1024
VARIANTS = {"MHA": {}, "GQA 4:1": {"n_kv_head": 2}, "MQA": {"n_kv_head": 1}, "window 256": {"window": WINDOW}}


def kv_model(variant: dict, context: int) -> GPT:
    """The default model with N_HEAD heads and the variant's settings, sized for `context` tokens;
    random weights, the same for every context (seed 0)."""
    config = replace(composed_run_spec().model, n_head=N_HEAD, **variant)
    config = replace(config, block_size=WINDOW_BLOCK_SIZE if config.window else context)
    torch.manual_seed(0)
    return build_model(config, DEFAULT_RUN_VOCAB).eval()


def expected_cache_bytes(config: GPTConfig, element_bytes: int) -> int:
    """What a full cache holds: keys and values (2) x n_layer x K heads x S slots x D dims, S being
    block_size, or the window's W for a ring."""
    slots = min(config.window, config.block_size) if config.window else config.block_size
    return 2 * config.n_layer * config.kv_heads * slots * config.head_size * element_bytes


@torch.inference_mode()
def prefill(model: GPT, prompt: torch.Tensor) -> tuple[Caches, torch.Tensor]:
    """The caches after the prompt (1, T), fed in pieces of at most block_size tokens (only a
    window model takes more than one), and the greedy next token (1, 1)."""
    caches = model.new_caches()
    for start in range(0, prompt.shape[1], model.config.block_size):
        logits, _ = model(prompt[:, start : start + model.config.block_size], caches=caches)  # (1, T, V)
    return caches, logits[:, -1].argmax(-1, keepdim=True)


@torch.inference_mode()
def decode(model: GPT, caches: Caches, token: torch.Tensor, new_tokens: int) -> None:
    """new_tokens greedy steps with the caches, one token each, as generate_tokens takes them eagerly."""
    for _ in range(new_tokens):
        logits, _ = model(token, caches=caches)  # (1, 1, V)
        token = logits[:, -1].argmax(-1, keepdim=True)  # (1, 1)


def bench_kv_cache(repeats: int) -> dict:
    """For each context: every variant's prompt prefilled (timed once, not in the rate), then
    NEW_TOKENS decoding steps from a copy of its prefilled caches, the variants in turns, one
    warm-up turn and `repeats` timed (median); and the caches' bytes after the whole context."""
    rows: dict[str, dict] = {name: {"block_size": [], "prefill_seconds": [], "cache_bytes": [], "expected_cache_bytes": [],
                                    "decode_tokens_per_sec": []} for name in VARIANTS}
    for context in CONTEXTS:
        prefilled = {}
        for name, variant in VARIANTS.items():
            model = kv_model(variant, context)
            prompt = torch.randint(0, model.config.vocab_size, (1, context - NEW_TOKENS), generator=torch.Generator().manual_seed(0))
            started = time.perf_counter()
            prefilled[name] = (model, *prefill(model, prompt))
            rows[name]["prefill_seconds"].append(time.perf_counter() - started)
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        decoded: dict[str, Caches] = {}
        for _ in range(1 + repeats):
            for name, (model, caches, token) in prefilled.items():
                decoded[name] = copy.deepcopy(caches)
                started = time.perf_counter()
                decode(model, decoded[name], token, NEW_TOKENS)
                times[name].append(time.perf_counter() - started)
        for name, (model, _, _) in prefilled.items():
            assert decoded[name].length == context  # the whole context went through
            row = rows[name]
            row.update(kv_heads=model.config.kv_heads, window=model.config.window)
            row["block_size"].append(model.config.block_size)
            row["cache_bytes"].append(sum(cache.nbytes() for cache in decoded[name].layers))
            row["expected_cache_bytes"].append(expected_cache_bytes(model.config, next(model.parameters()).element_size()))
            row["decode_tokens_per_sec"].append(NEW_TOKENS / statistics.median(times[name][1:]))
    config = model.config
    return {"contexts": list(CONTEXTS), "new_tokens": NEW_TOKENS, "n_head": N_HEAD, "n_layer": config.n_layer,
            "n_embd": config.n_embd, "head_dim": config.head_size, "threads": torch.get_num_threads(), "variants": rows}
