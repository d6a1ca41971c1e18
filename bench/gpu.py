"""The gpu and gpu_sampling sections: this project's trainer (TrainStep, built by training/build.py's
build_run as train.py builds it) and its sampler (generate_tokens, CompiledDecodeStep) on a CUDA GPU,
against the GPU's bf16 matmul rate as measured here and as NVIDIA states it."""

import gc
import math
import statistics
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from bench.common import median_time
from bench.gpt2_sampling import at_precision, first_difference
from bench.sampling import DEFAULT_RUN_VOCAB
from bench.training import training_flops_per_token
from cli.run_spec import composed_run_spec
from data.token_cache import TokenData
from model import GPT, generate_tokens
from model.decode_step import CompiledDecodeStep
from model_io.checkpoint import build_model
from model_io.hf_models import gpt_from_hf, save_hf_model
from runtime.precision import Precision
from runtime.ranks import Ranks
from training.build import build_run
from training.specs import RunSpec
from training.step import TrainStep

# NVIDIA's datasheets (H100, H200, A100 Tensor Core GPU) give bf16 Tensor Core rates "with
# sparsity"; the dense rate, the one a training step's matmuls can reach, is half of it. H100 SXM
# and H200 SXM: 1,979 -> 989 TFLOP/s; H100 PCIe 1,513 -> 756; the NVL cards 1,671 -> 835; A100:
# 312 dense. The first name found in the GPU's wins, so the PCIe and NVL cards come first.
STATED_BF16_TFLOPS = (("H100 PCIe", 756), ("H100 NVL", 835), ("H200 NVL", 835), ("H100", 989), ("H200", 989),
                      ("A100", 312))
GOAL_MFU = 0.45  # the team's goal: GPT-2 small, bf16, compiled, on an H100, against the stated peak
MODES = ("eager", "compiled")  # train.compile=false, true
PROFILED_MODE = "compiled"  # the mode profiled: GPT-2 small's where it misses GOAL_MFU, or each shape's if asked
SAMPLING_PATHS = ("kv_cache", "recompute", "compiled")  # the default; use_kv_cache=false; sample.py's compile=true
SAMPLING_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}  # sample.py's dtype=, as weights_dtype gives it
# Compiling a decode step takes tens of seconds a model: bf16's alone, sample.py's dtype=auto on a GPU.
COMPILED_DTYPES = ("bf16",)
RANDOM_IDS = 1_000_000  # the "corpus" of random token ids the batches are drawn from


@dataclass(frozen=True)
class Shape:
    overrides: tuple[str, ...]  # train.py's overrides on the default run's config
    vocab_size: int


# Each section's shapes, in the order they are reported.
SHAPES = {
    # configs/model/gpt.yaml (block_size 128) and configs/train/default.yaml (batch 16), Muon, the
    # default run's vocabulary.
    "default": Shape((), DEFAULT_RUN_VOCAB),
    # nanoGPT's shakespeare-char size (6 x 6 x 384, block 256, batch 64, 65 characters) with the
    # default model's options (rope, QK-norm, RMSNorm, SwiGLU) and optimizer (Muon).
    "shakespeare_char": Shape(("model.n_layer=6", "model.n_head=6", "model.n_embd=384", "model.block_size=256",
                               "train.batch_size=64"), 65),
    # GPT-2 small (124M) with GPT-2's blocks (experiment=gpt2_shape: learned positions, LayerNorm,
    # tanh GELU, biases), trained as nanoGPT's train.py does: AdamW at 6e-4, betas (0.9, 0.95),
    # weight decay 0.1, 50,304 tokens (GPT-2's 50,257 padded to a multiple of 64). 16 x 1,024
    # tokens a step: nanoGPT's 12 rounded up, a fraction of the GPU's memory.
    "gpt2_small": Shape(("experiment=gpt2_shape", "model.n_layer=12", "model.n_head=12", "model.n_embd=768",
                         "model.block_size=1024", "train.batch_size=16", "optim.name=adamw", "optim.lr=6e-4",
                         "optim.betas=[0.9,0.95]"), 50304),
}
SAMPLED = ("default", "gpt2_small")  # gpu_sampling's shapes, with random weights
# gpu_finetune's model: GPT-2 small as init_from builds it, from a Hugging Face folder (written here
# with random weights) read by gpt_from_hf, so with GPT-2's own 50,257 tokens, not padded; and
# experiment=finetune_gpt2's optimizer (AdamW at a flat 3e-5, weight decay 0.1, clipping at 1.0).
FINETUNED = Shape((*SHAPES["gpt2_small"].overrides, "optim.lr=3e-5", "optim.min_lr=3e-5", "optim.weight_decay=0.1",
                   "optim.grad_clip=1.0"), 50257)
# Its runs, in the order reported: (model, dtype). "padded" is the gpu section's GPT-2 small (random
# weights, 50,304 tokens), timed beside it in the same process.
FINETUNE_RUNS = (("from_folder", "bf16"), ("from_folder", "fp16"), ("padded", "bf16"))


@dataclass(frozen=True)
class Sizes:
    """How big and how long: the full figures for a GPU, or QUICK, which runs every path on a CPU."""
    matmul_n: int = 8192  # the bf16 products' side: n x n times n x n
    matmul_calls: int = 50  # products per timing, after as many untimed
    warmup_steps: int = 5  # untimed training steps; compiling happens in the first
    timed_steps: int = 20  # training steps per timing, or more where these take under min_timed_seconds
    min_timed_seconds: float = 1.0
    profile_steps: int = 3
    prompt_tokens: int = 32
    new_tokens: int = 200
    warmup_tokens: int = 8  # an untimed generation first, of this many tokens
    shrink: tuple[str, ...] = ()  # overrides on every shape


QUICK = Sizes(matmul_n=256, matmul_calls=2, warmup_steps=1, timed_steps=2, min_timed_seconds=0.0, profile_steps=1,
              prompt_tokens=4, new_tokens=8, warmup_tokens=2,
              shrink=("model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=32", "train.batch_size=2"))


def stated_bf16_tflops(device_name: str) -> float | None:
    """The GPU's dense bf16 rate by NVIDIA's datasheet, or None for a device not in the table."""
    return next((tflops for name, tflops in STATED_BF16_TFLOPS if name.lower() in device_name.lower()), None)


def mfu(tokens_per_sec: float, flops_per_token: float, peak_tflops: float | None) -> float | None:
    """Model FLOP/s over the peak: the share of the hardware's rate the model's own arithmetic uses."""
    return tokens_per_sec * flops_per_token / (peak_tflops * 1e12) if peak_tflops else None


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued work: a clock read after it counts that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def attempt(what: str, measure: Callable[[], dict]) -> dict:
    """measure()'s figures, or {"error": why} with the traceback on stderr: one failure (out of
    memory, a compile that breaks) must not cost a one-off GPU run its other figures. Each result
    goes to stderr as it comes, so a run stopped by a time limit still shows what it measured."""
    try:
        figures = measure()
    except Exception as err:  # noqa: BLE001  (any failure: reported, and the next figure measured)
        traceback.print_exc(file=sys.stderr)
        figures = {"error": f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:300]}"}
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    shown = ", ".join(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
                      for key, value in figures.items() if isinstance(value, (int, float)) or
                      (isinstance(value, str) and "\n" not in value))
    print(f"{what}: {shown}", file=sys.stderr, flush=True)
    return figures


@contextmanager
def tf32_matmuls(device: torch.device) -> Iterator[None]:
    """fp32 matmuls as a training run makes them (TF32 on a GPU: build_data_and_model), then as before."""
    before = torch.get_float32_matmul_precision()
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def run_config(shape: Shape, sizes: Sizes, device: torch.device, compiled: bool, dtype: str = "bf16") -> RunSpec:
    """The run's spec as train.py builds it from these overrides, in dtype (bf16 unless told) on device."""
    overrides = [*shape.overrides, *sizes.shrink, f"train.device={device}", f"train.dtype={dtype}",
                 f"train.compile={str(compiled).lower()}"]
    return composed_run_spec(*overrides)


def matmul_tflops(n: int, calls: int, repeats: int, device: torch.device) -> float:
    """TFLOP/s of calls bf16 products (n x n) @ (n x n), the median of repeats timings."""
    a, b = (torch.randn(n, n, dtype=torch.bfloat16, device=device) for _ in range(2))

    def products() -> None:
        for _ in range(calls):
            a @ b
        synchronize(device)

    return 2 * n**3 * calls / median_time(products, repeats) / 1e12


def build_train_step(spec: RunSpec, vocab_size: int, device: torch.device, model: GPT | None = None) -> TrainStep:
    """The step fit() runs, on model or a new one: build_run wraps, compiles (train.compile=true)
    and builds the optimizer as for train.py; random token ids stand in for the training split, as
    in the gpt2_finetune section (nothing asks for a tokenizer)."""
    torch.manual_seed(spec.loop.seed)
    model = (model if model is not None else build_model(spec.model, vocab_size)).to(device)
    ids = np.random.default_rng(0).integers(0, vocab_size, size=RANDOM_IDS).astype(np.uint16)
    ranks = Ranks(rank=0, local_rank=0, world_size=1, device=device)
    data = TokenData(tokenizer=None, train=ids, val=ids)
    precision = Precision(spec.device.dtype, device)  # run_config's bf16 or fp16
    run = build_run(spec, {}, Path("unused"), ranks, precision, data, model)  # (it saves nothing)
    return run.train_step()


def time_training(shape: Shape, compiled: bool, sizes: Sizes, repeats: int, device: torch.device,
                  peaks: dict[str, float | None], profile: str | None, dtype: str = "bf16",
                  load: Callable[[], GPT] | None = None) -> dict:
    """Warm-up steps (compiling, for compiled), then repeats timings of as many steps; then
    torch.profiler over profile_steps steps: with profile "always", or "below goal" where the MFU
    (against the stated peak, else the measured one) misses GOAL_MFU. The model is load()'s
    (timed), or a new one of shape's."""
    torch._dynamo.reset()  # a fresh compile: no guards, no dynamic shapes from an earlier shape
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    spec = run_config(shape, sizes, device, compiled, dtype)
    started = time.perf_counter()
    model = load() if load is not None else None
    load_seconds = time.perf_counter() - started if load is not None else None
    step = build_train_step(spec, shape.vocab_size, device, model)
    lr, rng, number = spec.optim.lr, np.random.default_rng(1), 0
    started = time.perf_counter()
    for number in range(sizes.warmup_steps):
        step_started = time.perf_counter()
        step(number, lr, rng).result()  # waits for the GPU
    last_step = time.perf_counter() - step_started
    warmup_seconds = time.perf_counter() - started
    steps = max(sizes.timed_steps, min(1000, math.ceil(sizes.min_timed_seconds / last_step)))
    seconds = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        queued = None
        for _ in range(steps):
            number += 1
            before, queued = queued, step(number, lr, rng)
            if before is not None:
                before.result()  # each step's numbers read after the next is queued, as fit() reads them
        result = queued.result()
        synchronize(device)
        seconds.append(time.perf_counter() - started)
    ms_per_step = statistics.median(seconds) / steps * 1e3
    tokens_per_sec = step.tokens_per_step / ms_per_step * 1e3
    flops_per_token = training_flops_per_token(step.model)
    figures = {
        "tokens_per_sec": tokens_per_sec, "ms_per_step": ms_per_step,
        "model_tflops": tokens_per_sec * flops_per_token / 1e12,
        "mfu_stated": mfu(tokens_per_sec, flops_per_token, peaks["stated"]),
        "mfu_measured": mfu(tokens_per_sec, flops_per_token, peaks["measured"]),
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "warmup_seconds": warmup_seconds, "warmup_steps": sizes.warmup_steps, "timed_steps": steps,
        "seconds": seconds, "last_loss": result.loss,
        "params": step.model.num_parameters(), "flops_per_token": flops_per_token,
        "tokens_per_step": step.tokens_per_step, "load_seconds": load_seconds,
        "loss_scale": step.precision.loss_scale,  # fp16's after the timed steps (None otherwise)
    }
    share = figures["mfu_stated"] if figures["mfu_stated"] is not None else figures["mfu_measured"]
    if profile == "always" or (profile == "below goal" and share is not None and share < GOAL_MFU):
        figures["profile"] = attempt("gpu:   its profile", lambda: profile_steps(lambda: step(number, lr, rng),
                                                                             sizes.profile_steps, device))
    torch._dynamo.reset()  # the compiled graphs freed with the model
    return figures


def profile_steps(one_step: Callable[[], object], steps: int, device: torch.device, top: int = 15) -> dict:
    """Where the time of `steps` steps goes, by torch.profiler: on a GPU the kernels (and copies)
    with the most GPU time, and how much of the wall time the GPU was busy at all; on a CPU the
    operations with the most CPU time of their own. The key_averages table comes with them."""
    on_gpu = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if on_gpu else [])
    synchronize(device)
    started = time.perf_counter()
    with torch.profiler.profile(activities=activities) as profiler:
        for _ in range(steps):
            one_step()
        synchronize(device)
    wall_ms = (time.perf_counter() - started) * 1e3
    averages = profiler.key_averages()
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])  # [microseconds, calls] by kernel or operation
    if on_gpu:  # the GPU's own events: the operations that launched them would count their time again
        for event in profiler.events():
            # Not the spans of user annotations (Optimizer.step#Muon.step, say) on the GPU's
            # timeline: the kernels inside them are counted already.
            if event.device_type == torch.autograd.DeviceType.CUDA and not getattr(event, "is_user_annotation", False):
                totals[event.name][0] += event.time_range.elapsed_us()
                totals[event.name][1] += 1
    else:
        for event in averages:
            totals[event.key] = [event.self_cpu_time_total, event.count]
    busy_ms = sum(us for us, _ in totals.values()) / 1e3
    ranked = sorted(totals.items(), key=lambda item: item[1][0], reverse=True)[:top]
    return {
        "steps": steps, "wall_ms": wall_ms, "busy_ms": busy_ms, "by": "GPU time" if on_gpu else "CPU time of their own",
        "top": [{"name": name, "ms": us / 1e3, "share": us / 1e3 / busy_ms if busy_ms else None, "calls": calls}
                for name, (us, calls) in ranked],
        "table": averages.table(sort_by="self_device_time_total" if on_gpu else "self_cpu_time_total", row_limit=top),
    }


def bench_gpu(repeats: int, device: torch.device, sizes: Sizes, profile_all: bool) -> dict:
    """The bf16 matmul peak, then training tokens/s and MFU at each shape, eager, then compiled
    (GPT-2 small first): the costliest figures come last, so a run cut short keeps the most.
    GPT-2 small's compiled steps are profiled where they miss GOAL_MFU; every shape's with profile_all."""
    name = device_name(device)
    result: dict = {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "repeats": repeats,
                    "goal_mfu": GOAL_MFU, "stated_bf16_tflops": stated_bf16_tflops(name) if device.type == "cuda" else None,
                    "matmul_n": sizes.matmul_n}
    matmul = attempt(f"gpu: bf16 matmul {sizes.matmul_n}^3 on {name}",
                     lambda: {"tflops": matmul_tflops(sizes.matmul_n, sizes.matmul_calls, repeats, device)})
    result["measured_bf16_tflops"] = matmul.get("tflops")
    peaks = {"stated": result["stated_bf16_tflops"], "measured": result["measured_bf16_tflops"]}
    result["shapes"] = {}
    for shape_name, shape in SHAPES.items():
        spec = run_config(shape, sizes, device, compiled=False)
        result["shapes"][shape_name] = {**{key: getattr(spec.model, key) for key in ("n_layer", "n_head", "n_embd", "block_size")},
                                        "batch_size": spec.step.batch_size, "vocab_size": shape.vocab_size,
                                        "optimizer": spec.optim.name}
    with tf32_matmuls(device):
        for mode in MODES:
            for shape_name in reversed(SHAPES) if mode == "compiled" else SHAPES:
                profile = None if mode != PROFILED_MODE else "always" if profile_all else (
                    "below goal" if shape_name == "gpt2_small" else None)
                measure = partial(time_training, SHAPES[shape_name], mode == "compiled", sizes, repeats, device, peaks, profile)
                result["shapes"][shape_name][mode] = attempt(f"gpu: {shape_name}, {mode}", measure)
    return result


def bench_gpu_finetune(repeats: int, device: torch.device, sizes: Sizes, work: Path) -> dict:
    """Training steps of GPT-2 small as init_from builds it (FINETUNED), at bf16 and at fp16 with
    its loss scaler, beside the gpu section's GPT-2 small (vocabulary padded), eager then compiled."""
    name = device_name(device)
    peaks = {"stated": stated_bf16_tflops(name) if device.type == "cuda" else None, "measured": None}
    spec = run_config(FINETUNED, sizes, device, compiled=False)
    result: dict = {"device": name, "torch": torch.__version__, "repeats": repeats,
                    "stated_bf16_tflops": peaks["stated"], "runs": {}}
    result.update({key: getattr(spec.model, key) for key in ("n_layer", "n_head", "n_embd", "block_size")})
    result["batch_size"] = spec.step.batch_size
    folder = work / "gpt2-small-hf"  # kept beside the results, as the loading section keeps its folder
    torch.manual_seed(0)
    eot = FINETUNED.vocab_size - 1  # GPT-2's <|endoftext|> is its last id
    save_hf_model(build_model(spec.model, FINETUNED.vocab_size), folder, bos_id=eot, eos_id=eot)
    with tf32_matmuls(device):
        for mode in MODES:
            for model_from, dtype in FINETUNE_RUNS:
                shape = FINETUNED if model_from == "from_folder" else SHAPES["gpt2_small"]
                load = (lambda: gpt_from_hf(folder)[0]) if model_from == "from_folder" else None
                run = result["runs"].setdefault(f"{model_from}, {dtype}", {"vocab_size": shape.vocab_size})
                measure = partial(time_training, shape, mode == "compiled", sizes, repeats, device, peaks, profile=None,
                                  dtype=dtype, load=load)
                run[mode] = attempt(f"gpu_finetune: {model_from}, {dtype}, {mode}", measure)
    return result


def sampling_model(shape: Shape, sizes: Sizes, device: torch.device) -> GPT:
    """The shape's model with random weights (seed 0), fp32, on device, for sampling."""
    spec = run_config(shape, sizes, device, compiled=False)
    torch.manual_seed(0)
    return build_model(spec.model, shape.vocab_size).to(device).eval()


def time_sampling(model: GPT, prompt: torch.Tensor, sizes: Sizes, repeats: int, device: torch.device,
                  use_kv_cache: bool = True, decode_step: CompiledDecodeStep | None = None) -> tuple[dict, torch.Tensor]:
    """ms per new token of greedy generate_tokens (the prompt's forward counted in), the median of
    repeats after an untimed run of warmup_tokens; and the tokens the last run chose, (1, T)."""
    def generate(new_tokens: int) -> torch.Tensor:
        return generate_tokens(model, prompt, new_tokens, temperature=0.0, use_kv_cache=use_kv_cache, decode_step=decode_step)

    generate(sizes.warmup_tokens)
    seconds = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        tokens = generate(sizes.new_tokens)
        synchronize(device)
        seconds.append(time.perf_counter() - started)
    ms = statistics.median(seconds) / sizes.new_tokens * 1e3
    return {"ms_per_token": ms, "tokens_per_sec": 1e3 / ms, "seconds": seconds}, tokens


def bench_gpu_sampling(repeats: int, device: torch.device, sizes: Sizes) -> dict:
    """Greedy generation at each SAMPLED shape and dtype: with the KV cache, recomputing the window
    for each token, and with the compiled decode step (sample.py's compile=true, KV cache only),
    each path's tokens against the cache's. The eager paths first, then the compiles (bf16 and GPT-2
    small first): a run cut short keeps the most."""
    result: dict = {"device": device_name(device), "repeats": repeats, "prompt_tokens": sizes.prompt_tokens,
                    "new_tokens": sizes.new_tokens, "shapes": {}}
    models: dict[tuple[str, str], GPT] = {}  # by (shape, dtype)
    prompts: dict[str, torch.Tensor] = {}  # by shape, (1, prompt_tokens)
    for shape_name in SAMPLED:
        model = sampling_model(SHAPES[shape_name], sizes, device)
        prompts[shape_name] = torch.randint(0, model.config.vocab_size, (1, sizes.prompt_tokens),
                                            generator=torch.Generator().manual_seed(0)).to(device)
        models.update({(shape_name, name): at_precision(model, dtype) for name, dtype in SAMPLING_DTYPES.items()})
        result["shapes"][shape_name] = {
            "params": model.num_parameters(), "n_layer": model.config.n_layer, "n_embd": model.config.n_embd,
            "block_size": model.config.block_size, "vocab_size": model.config.vocab_size,
            "precisions": {name: {"weight_bytes": sum(p.nbytes for p in models[shape_name, name].parameters())}
                           for name in SAMPLING_DTYPES}}
        del model
    cached: dict[tuple[str, str], torch.Tensor] = {}  # the tokens the KV cache path chose

    def measure(key: tuple[str, str], path: str) -> dict:
        model, prompt = models[key], prompts[key[0]]
        started, decode_step = time.perf_counter(), None
        if path == "compiled":
            decode_step = CompiledDecodeStep(model, batch_size=1, temperature=0.0, top_k=None, top_p=None)
        compile_seconds = time.perf_counter() - started
        figures, tokens = time_sampling(model, prompt, sizes, repeats, device, use_kv_cache=path != "recompute",
                                        decode_step=decode_step)
        if path == "kv_cache":
            cached[key] = tokens
        elif key in cached:  # greedy: the same tokens, unless rounding flips a near tie
            figures["first_difference_from_kv_cache"] = first_difference(tokens, cached[key])
        if decode_step is not None:
            figures["compile_seconds"] = compile_seconds
        return figures

    keys = [(shape_name, dtype_name) for dtype_name in SAMPLING_DTYPES for shape_name in reversed(SAMPLED)]
    failed_compile = None
    for path in SAMPLING_PATHS:
        for key in keys:
            if path == "compiled" and key[1] not in COMPILED_DTYPES:
                continue
            if path == "compiled" and failed_compile:  # the same failure again would cost as long
                figures = {"error": f"not tried: the decode step of {failed_compile} failed to compile or run"}
            else:
                figures = attempt(f"gpu_sampling: {key[0]}, {key[1]}, {path}", partial(measure, key, path))
            if path == "compiled" and "error" in figures:
                failed_compile = failed_compile or f"{key[0]} at {key[1]}"
            result["shapes"][key[0]]["precisions"][key[1]][path] = figures
    return result
