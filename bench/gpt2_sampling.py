"""The gpt2_sampling section: greedy tokens/s at GPT-2 small's shape against the limit memory sets,
sample.py's path (eager and compiled) beside transformers' generate at fp32 and bf16, with the same
random weights and a check that all of them choose the same tokens."""

import copy
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from model import GPT, generate_tokens
from model.decode_step import CompiledDecodeStep
from model.generation import lay_out_for_decoding
from model_io.hf_models import gpt_from_hf
from runtime.devices import cpu_multiplies_bf16
from runtime.huge_pages import huge_page_memory, huge_pages_possible, move_to_huge_pages

# GPT-2 small (124M): GPT2Config's defaults, spelled out.
GPT2_SMALL = {"n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024, "vocab_size": 50257}
PROMPT_TOKENS, NEW_TOKENS = 32, 48
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}
PATHS = ("compiled", "eager", "transformers")  # the order of each turn's runs, per precision
READ_BYTES = 1 << 30  # the bandwidth probe's array: far more than the CPU's caches hold
READS_PER_TURN = 3


def gpt2_folder(shape: dict, folder: Path) -> Path:
    """A Hugging Face folder of GPT2LMHeadModel(GPT2Config(**shape)) with random weights (seed 0),
    its biases too: GPT-2's initialisation zeroes them, and a path that dropped one would pass."""
    from transformers import GPT2Config, GPT2LMHeadModel  # a dev requirement, like the nanogpt section's checkout

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(**shape))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):
                parameter.normal_(std=model.config.initializer_range)
    model.save_pretrained(folder)
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


def read_bandwidth(array: torch.Tensor) -> float:
    """GB/s of one array.sum(): a read of every byte once, with this process's torch threads,
    the way a decoding step reads the weights."""
    started = time.perf_counter()
    array.sum()
    return array.nbytes / (time.perf_counter() - started) / 1e9


def at_precision(model: GPT, dtype: torch.dtype, eager: bool = False) -> GPT:
    """A copy of model with its weights in dtype, as sample.py would compute in it, and where
    sample.py puts them on a CPU (move_to_huge_pages); eager: laid out as sample.py lays them out
    for eager generation on a CPU (lay_out_for_decoding)."""
    copied = copy.deepcopy(model).to(dtype).eval()
    if eager:
        lay_out_for_decoding(copied)
    move_to_huge_pages(copied)
    return copied


def bench_gpt2_sampling(repeats: int, work: Path) -> dict:
    """In each of `repeats` turns: the read bandwidth, then two runs of each path at each precision
    (our generate_tokens at temperature 0 with the KV cache, with the compiled decode step and
    eager, and transformers' generate) from the same prompt: NEW_TOKENS tokens, and 1 (the
    prompt's forward and the first choice). Their difference is the decoding alone, the part the
    limit bounds: the bandwidth over the bytes of weights one token reads (all of them, once)."""
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # its bars for writing and reading the folder: noise here
    folder = gpt2_folder(GPT2_SMALL, work / "gpt2-small")
    ours_fp32: GPT = gpt_from_hf(folder)[0].eval()
    models = {name: (at_precision(ours_fp32, dtype), at_precision(ours_fp32, dtype, eager=True),
                     GPT2LMHeadModel.from_pretrained(folder, dtype=dtype).eval())
              for name, dtype in PRECISIONS.items()}  # ours for the compiled step, ours for eager, theirs
    del ours_fp32
    shutil.rmtree(folder)
    prompt = torch.randint(0, GPT2_SMALL["vocab_size"], (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))

    runs: dict[tuple[str, str], Callable[[int], torch.Tensor]] = {}  # each takes the number of new tokens
    compile_seconds = {}
    for name, (ours, ours_eager, theirs) in models.items():
        started = time.perf_counter()
        step = CompiledDecodeStep(ours, batch_size=1, temperature=0.0, top_k=None, top_p=None)
        compile_seconds[name] = time.perf_counter() - started
        paths = {"compiled": lambda new, ours=ours, step=step: generate_tokens(ours, prompt, new, temperature=0.0,
                                                                               decode_step=step),
                 "eager": lambda new, ours_eager=ours_eager: generate_tokens(ours_eager, prompt, new, temperature=0.0),
                 "transformers": lambda new, theirs=theirs: hf_greedy(theirs, prompt, new)}
        runs.update({(name, path): paths[path] for path in PATHS})

    tokens = {key: run(NEW_TOKENS) for key, run in runs.items()}  # the warm-up runs, whose tokens are compared
    array, on_huge_pages = read_probe()
    bandwidth, seconds, prompt_seconds = timed_turns(runs, repeats, array)
    del array
    gb_per_s = statistics.median(bandwidth)
    result = {"params": models["fp32"][0].num_parameters(), "prompt_tokens": PROMPT_TOKENS, "new_tokens": NEW_TOKENS,
              "threads": torch.get_num_threads(), "native_bf16": cpu_multiplies_bf16(), "huge_pages": on_huge_pages, "read_bytes": READ_BYTES, "read_gb_per_s": gb_per_s,
              "read_gb_per_s_each": bandwidth, "precisions": {}}
    for name, (ours, _, _) in models.items():
        result["precisions"][name] = precision_figures(
            sum(p.nbytes for p in ours.parameters()), gb_per_s, compile_seconds[name],
            {path: seconds[name, path] for path in PATHS}, {path: prompt_seconds[name, path] for path in PATHS},
            {path: tokens[name, path] for path in PATHS})
    return result


Key = tuple[str, str]  # (precision, path)


def read_probe() -> tuple[torch.Tensor, bool]:
    """READ_BYTES of float32 ones to time reads over, on huge pages where the system gives them (as
    it gives them to our models' weights, which read faster there: the limit is the faster read),
    and whether they are on them."""
    if huge_pages_possible():
        try:
            return huge_page_memory(READ_BYTES).view(torch.float32).fill_(1), True
        except OSError:  # the mapping refused: ordinary memory, as for the weights
            pass
    return torch.ones(READ_BYTES // 4), False


def timed_turns(runs: dict[Key, Callable[[int], torch.Tensor]], repeats: int,
                array: torch.Tensor) -> tuple[list[float], dict[Key, list[float]], dict[Key, list[float]]]:
    """In each of repeats turns: the read bandwidth (READS_PER_TURN reads of array), then every run
    for 1 new token and for NEW_TOKENS; returns the GB/s of each read, and each run's seconds for
    NEW_TOKENS and for 1."""
    array.sum()  # once untimed, so its pages are there
    bandwidth: list[float] = []
    seconds: dict[Key, list[float]] = {key: [] for key in runs}  # NEW_TOKENS tokens
    prompt_seconds: dict[Key, list[float]] = {key: [] for key in runs}  # 1 token
    for _ in range(repeats):
        bandwidth += [read_bandwidth(array) for _ in range(READS_PER_TURN)]
        for key, run in runs.items():
            for new_tokens, times in ((1, prompt_seconds[key]), (NEW_TOKENS, seconds[key])):
                started = time.perf_counter()
                run(new_tokens)
                times.append(time.perf_counter() - started)
    return bandwidth, seconds, prompt_seconds


def precision_figures(weight_bytes: int, gb_per_s: float, compile_seconds: float, seconds: dict[str, list[float]],
                      prompt_seconds: dict[str, list[float]], tokens: dict[str, torch.Tensor]) -> dict:
    """One precision's figures from each path's timings (NEW_TOKENS and 1 token) and tokens: rates,
    decoding alone, its share of the limit the bandwidth sets, the ratio to transformers, the same tokens."""
    limit = gb_per_s * 1e9 / weight_bytes
    rates = {path: NEW_TOKENS / statistics.median(seconds[path]) for path in PATHS}
    decoding = {path: [whole - first for whole, first in zip(seconds[path], prompt_seconds[path], strict=True)]
                for path in PATHS}  # each turn's NEW_TOKENS - 1 tokens after the first
    decode_rates = {path: (NEW_TOKENS - 1) / statistics.median(decoding[path]) for path in PATHS}
    differences = {path: first_difference(tokens[path], tokens["transformers"]) for path in ("compiled", "eager")}
    return {
        "weight_bytes": weight_bytes, "limit_tokens_per_sec": limit, "compile_seconds": compile_seconds,
        **{f"{path}_tokens_per_sec": rates[path] for path in PATHS},
        **{f"{path}_decode_tokens_per_sec": decode_rates[path] for path in PATHS},
        **{f"{path}_share_of_limit": decode_rates[path] / limit for path in PATHS},
        **{f"{path}_vs_transformers": rates[path] / rates["transformers"] for path in ("compiled", "eager")},
        **{f"{path}_first_difference": differences[path] for path in ("compiled", "eager")},
        "same_greedy_tokens": all(difference is None for difference in differences.values()),
        "seconds": seconds,  # each run's, in the order they ran
        "prompt_seconds": prompt_seconds,
    }
