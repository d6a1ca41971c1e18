"""The sampling section: tokens/s with and without the KV cache, and with the compiled decode step."""

import time
from dataclasses import replace

import torch

from bench.common import median_time
from cli.run_spec import composed_run_spec
from model import GPT, GPTConfig, generate_tokens
from model.decode_step import CompiledDecodeStep
from model_io.checkpoint import build_model

# The models sampled from, both at block_size 256: nanoGPT's shakespeare-char model (its
# train_shakespeare_char config: GPT-2 blocks, 6 layers, 6 heads, 384 dims, 10.7 M parameters)
# and this project's default model (configs/model/gpt.yaml, with the default run's BPE
# vocabulary of 1,274 tokens), whose cached steps are so small that per-operation overhead, not
# arithmetic, sets their speed.
DEFAULT_RUN_VOCAB = 1274


def sampling_models() -> dict[str, GPT]:
    default = replace(composed_run_spec().model, block_size=256)
    return {"L6_H6_C384": GPT(GPTConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384)),
            "default": build_model(default, DEFAULT_RUN_VOCAB)}


def bench_sampling(repeats: int, new_tokens: int) -> dict:
    results = {}
    torch.manual_seed(0)
    for name, model in sampling_models().items():
        model.eval()
        prompt = torch.zeros(1, 1, dtype=torch.long)

        def tokens_per_sec(use_kv_cache: bool, model: GPT = model, prompt: torch.Tensor = prompt,
                           decode_step: CompiledDecodeStep | None = None) -> float:
            def generate() -> None:
                generator = torch.Generator().manual_seed(1)
                generate_tokens(model, prompt, new_tokens, temperature=1.0, generator=generator, use_kv_cache=use_kv_cache,
                                decode_step=decode_step)
            # Recomputing takes seconds per run, so one-off start-up costs do not matter there.
            return new_tokens / median_time(generate, repeats, warmup=1 if use_kv_cache else 0)

        started = time.perf_counter()
        decode_step = CompiledDecodeStep(model, batch_size=1, temperature=1.0, top_k=None, top_p=None)
        build_seconds = time.perf_counter() - started
        cached, recomputed = tokens_per_sec(True), tokens_per_sec(False)
        compiled = tokens_per_sec(True, decode_step=decode_step)
        results[name] = {"params": model.num_parameters(), "kv_cache_tokens_per_sec": cached,
                         "kv_cache_ms_per_token": 1e3 / cached, "recompute_tokens_per_sec": recomputed,
                         "speedup": cached / recomputed, "compiled_tokens_per_sec": compiled,
                         "compiled_ms_per_token": 1e3 / compiled, "compiled_speedup": compiled / recomputed,
                         "compile_seconds": build_seconds}
    return results

