"""The gpt2_sampling section: greedy tokens/s at GPT-2 small's shape, sample.py's path against
transformers' generate, with the same random weights and a check that both choose the same tokens."""

import shutil
import statistics
import time
from pathlib import Path

import torch

from model import GPT, generate_tokens
from model.decode_step import CompiledDecodeStep
from model_io.hf_models import gpt_from_hf

# GPT-2 small (124M): GPT2Config's defaults, spelled out.
GPT2_SMALL = {"n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024, "vocab_size": 50257}
PROMPT_TOKENS, NEW_TOKENS = 32, 128


def gpt2_folder(shape: dict, folder: Path) -> Path:
    """A Hugging Face folder of GPT2LMHeadModel(GPT2Config(**shape)) with random weights (seed 0)."""
    from transformers import GPT2Config, GPT2LMHeadModel  # a dev requirement, like the nanogpt section's checkout

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(**shape)).save_pretrained(folder)
    return folder


def hf_greedy(hf_model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """transformers' generate(do_sample=False) for exactly new_tokens tokens: (1, T0 + new_tokens)."""
    # No end-of-text token: generate would stop there, and sample.py does not.
    return hf_model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)


def first_difference(ours: torch.Tensor, theirs: torch.Tensor) -> int | None:
    """The first position where two (1, T) token rows differ, or None where they are the same."""
    if ours.shape != theirs.shape:
        return min(ours.shape[1], theirs.shape[1])
    different = (ours != theirs).nonzero()
    return int(different[0, 1]) if len(different) else None


def bench_gpt2_sampling(repeats: int, work: Path) -> dict:
    """Paired runs, one after another in each repeat: our generate_tokens at temperature 0 with
    the KV cache, eager and with the compiled decode step, and transformers' generate, from the
    same prompt, each for NEW_TOKENS tokens."""
    from transformers import GPT2LMHeadModel

    folder = gpt2_folder(GPT2_SMALL, work / "gpt2-small")
    hf_model = GPT2LMHeadModel.from_pretrained(folder).eval()
    ours: GPT = gpt_from_hf(folder)[0].eval()
    shutil.rmtree(folder)
    prompt = torch.randint(0, GPT2_SMALL["vocab_size"], (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))

    started = time.perf_counter()
    decode_step = CompiledDecodeStep(ours, batch_size=1, temperature=0.0, top_k=None, top_p=None)
    compile_seconds = time.perf_counter() - started
    runs = {
        "eager": lambda: generate_tokens(ours, prompt, NEW_TOKENS, temperature=0.0),
        "compiled": lambda: generate_tokens(ours, prompt, NEW_TOKENS, temperature=0.0, decode_step=decode_step),
        "transformers": lambda: hf_greedy(hf_model, prompt, NEW_TOKENS),
    }
    tokens = {name: run() for name, run in runs.items()}  # the warm-up runs, whose tokens are compared
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - started)
    rates = {name: NEW_TOKENS / statistics.median(times) for name, times in seconds.items()}
    hf = rates["transformers"]
    return {
        "params": ours.num_parameters(), "prompt_tokens": PROMPT_TOKENS, "new_tokens": NEW_TOKENS,
        "threads": torch.get_num_threads(),
        "eager_tokens_per_sec": rates["eager"], "compiled_tokens_per_sec": rates["compiled"],
        "transformers_tokens_per_sec": hf, "eager_vs_transformers": rates["eager"] / hf,
        "compiled_vs_transformers": rates["compiled"] / hf, "compile_seconds": compile_seconds,
        "seconds": seconds,  # each run's, in the order they ran
        "eager_first_difference": first_difference(tokens["eager"], tokens["transformers"]),
        "compiled_first_difference": first_difference(tokens["compiled"], tokens["transformers"]),
        "same_greedy_tokens": all(first_difference(tokens[name], tokens["transformers"]) is None
                                  for name in ("eager", "compiled")),
    }
