"""How fast is this project on this machine? Prints a table and writes the figures to JSON.

    python bench.py                              the default sections (about 6 minutes on 2 CPU cores)
    python bench.py --only sampling,attention    some sections
    python bench.py --only recipe                nanoGPT's full recipe in this trainer (slow)
    python bench.py --only compile               train.compile=true against eager (slow)
    make bench                                   the same as python bench.py

Sections (each figure is the median of --repeats runs):
    peak       fp32 matmul rate of this machine (1024 x 1024 x 1024), the yardstick for MFU
    training   train.py itself on nanoGPT's CPU recipe shape (char-level tiny shakespeare,
               4 layers, 4 heads, 128 dims, block 64, batch 12, AdamW): tokens/s as the run
               logged it to TensorBoard, model FLOP/s and MFU against the measured peak, peak memory
    quality    time to quality: wall time of `train.py experiment=shakespeare_char_cpu`, start
               to exit, and the val loss it ends with (200 batches); the target is 1.886,
               nanoGPT's README CPU recipe's val loss
    recipe     (not by default) nanoGPT's CPU recipe itself in this trainer: 2,000 steps of
               AdamW at lr 1e-3 with a cosine schedule, learned positions, GELU; wall time and val loss
    compile    (not by default) the training section's runs eager and with train.compile=true:
               tokens/s after the first log window, and wall time with compiling from scratch
    startup    seconds from a process's start: train.py (the default run) to its first step,
               sample.py to its text (50 tokens), and python -c 'import torch' alone
    sampling   1,000 new tokens at block_size 256, with and without the KV cache, and with the
               compiled decode step (compile=true; also its compile time), for nanoGPT's
               shakespeare-char model (6 layers, 6 heads, 384 dims) and this project's default
               model (configs/model/gpt.yaml, vocabulary 1,274)
    attention  forward + backward of the sdpa and manual paths against the same projections
               around a bare scaled_dot_product_attention call
    data       (not by default) tokenising a corpus of --data-mb megabytes (the .py files of this
               Python's installed packages, concatenated) from an empty cache, char and BPE (2,048
               tokens): each phase's time, MB/s and peak memory, beside the nanoGPT way (the whole
               file read into memory and encoded at once; BPE with the same learned vocabulary; up
               to 200 MB); and learning 2,048 BPE tokens from its first 10 MB, by rustbpe and by
               data/bpe.py
    nanogpt    (not by default; needs --nanogpt <a checkout of karpathy/nanoGPT>) nanoGPT itself,
               side by side with this project: its README CPU recipe's ms per iteration over
               --steps iterations (after the first sixth), and the whole recipe (2,000 iterations)
               start to exit with the val loss it prints; with the training and quality sections
               in the same run, the ratios
    tab        (not by default; needs Chromium, see make browser) the Attention tab in headless
               Chromium at 1280 x 800, for a short real run of the default model and of a 12 x 12
               one on a 128-token probe (5 logged steps each): time from navigation to the first
               drawn view (a fresh browser each time), and, once the tab has fetched every step,
               the slowest move of the step slider to its redrawn views

Results go to bench_results/bench-<date>_<time>.json (git-ignored) unless --out says otherwise;
the training section's run dirs go beside it.
"""

import argparse
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from data.bpe import train_bpe
from data.tokenizer import train_bpe_fast
from model import GPT, GPTConfig, generate_tokens
from model.attention import CausalSelfAttention
from model.decode_step import CompiledDecodeStep
from training.checkpoint import load_checkpoint, model_from_checkpoint
from training.config import build_model

ROOT = Path(__file__).resolve().parent
SECTIONS = ("peak", "training", "quality", "recipe", "compile", "sampling", "attention", "startup", "data", "nanogpt", "tab")
DEFAULT_SECTIONS = ("peak", "training", "quality", "sampling", "attention", "startup")
TARGET_VAL_LOSS = 1.886  # nanoGPT's README CPU recipe on tiny shakespeare

# nanoGPT's README CPU recipe as this project's config overrides: char-level, GPT-2's blocks
# (learned positions, LayerNorm, GELU, no QK-norm) and AdamW on a cosine schedule.
NANOGPT_CPU_SHAPE = [
    "tokenizer=char", "model.n_layer=4", "model.n_head=4", "model.n_embd=128", "model.block_size=64", "model.dropout=0.0",
    "model.pos=learned", "model.norm=layernorm", "model.mlp=gelu", "model.qk_norm=false", "model.smear=false",
    "train.batch_size=12", "optim.name=adamw", "optim.lr=1e-3", "optim.min_lr=1e-4", "optim.schedule=cosine",
]
TOKENS_PER_STEP = 12 * 64  # batch x block


def median_time(run: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall time of run() in seconds, after warmup calls."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def bench_peak(repeats: int) -> dict:
    n, calls = 1024, 20
    a, b = torch.randn(n, n), torch.randn(n, n)

    def matmuls() -> None:
        for _ in range(calls):
            a @ b

    seconds = median_time(matmuls, repeats)
    return {"matmul_gflops": 2 * n**3 * calls / seconds / 1e9}


def matmul_params(model: GPT) -> int:
    """Weights used in matrix multiplies: every Linear (the tied LM head once); embedding
    lookups are not multiplies."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def training_flops_per_token(model: GPT) -> float:
    """6 FLOPs per matmul weight (forward 2, backward 4), plus the attention's own
    matmuls, Q K^T and weights @ V, over the full T x T square: 12 * layers * T * C."""
    c = model.config
    return 6 * matmul_params(model) + 12 * c.n_layer * c.block_size * c.n_embd


def bench_training(repeats: int, steps: int, corpus: Path, peak_gflops: float | None, work: Path,
                   extra: tuple[str, ...] = (), name: str = "throughput") -> dict:
    """train.py on nanoGPT's CPU shape: tokens/s as it logged them (the first window, which
    holds the start-up and any compiling, left out), wall time start to exit, peak memory."""
    if not corpus.is_file():
        sys.exit(f"error: --corpus {corpus} does not exist; give tiny shakespeare's input.txt")
    rates, seconds, max_rss = [], [], 0
    for i in range(repeats):
        run_dir = work / f"{name}-{i}"
        args = [
            *NANOGPT_CPU_SHAPE, "data=text", f"data.path={corpus}", f"train.max_steps={steps}",
            f"train.eval_interval={steps}", "train.eval_iters=1", "train.log_interval=50",
            "train.attn_log_interval=0", "train.sample_interval=0", f"hydra.run.dir={run_dir}", *extra,
        ]
        # Each run compiles from scratch (an empty kernel cache), as a first run does.
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(work / f"{name}-{i}-inductor-cache")}
        started = time.perf_counter()
        result = subprocess.run([sys.executable, str(ROOT / "train.py"), *args], capture_output=True, text=True, env=env)
        seconds.append(time.perf_counter() - started)
        if result.returncode != 0:
            sys.exit(f"error: the {name} benchmark run failed:\n{result.stderr}")
        rates.append(statistics.median(logged(run_dir, "train/tokens_per_sec")[1:]))
        max_rss = max(max_rss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    model, _ = model_from_checkpoint(load_checkpoint(run_dir / "ckpt_last.pt"))
    tokens_per_sec = statistics.median(rates)
    model_gflops = tokens_per_sec * training_flops_per_token(model) / 1e9
    return {
        "tokens_per_sec": tokens_per_sec,
        "ms_per_step": TOKENS_PER_STEP / tokens_per_sec * 1e3,
        "model_gflops": model_gflops,
        "mfu": model_gflops / peak_gflops if peak_gflops else None,
        "params": model.num_parameters(),
        "steps": steps,
        "seconds": statistics.median(seconds),
        "peak_rss_mib": max_rss / 1024,  # the largest train.py run so far (getrusage keeps the maximum)
    }


def logged(run_dir: Path, tag: str) -> list[float]:
    """The values a run logged under a TensorBoard tag, in step order, read back with
    TensorBoard's own reader (the same numbers fit() returns to train.py)."""
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [event.value for event in events.Scalars(tag)]


def bench_compile(repeats: int, steps: int, corpus: Path, peak_gflops: float | None, work: Path) -> dict:
    """The training section's runs once eager and once with train.compile=true, side by side."""
    eager = bench_training(repeats, steps, corpus, peak_gflops, work, name="eager")
    compiled = bench_training(repeats, steps, corpus, peak_gflops, work, ("train.compile=true",), name="compiled")
    return {"eager": eager, "compiled": compiled, "speedup": compiled["tokens_per_sec"] / eager["tokens_per_sec"]}


def timed_training_runs(name: str, args: list[str], repeats: int, corpus: Path, work: Path) -> dict:
    """Runs train.py repeats times; median wall time (start to exit) and final val loss."""
    if not corpus.is_file():
        sys.exit(f"error: --corpus {corpus} does not exist; give tiny shakespeare's input.txt")
    seconds, losses = [], []
    for i in range(repeats):
        run_dir = work / f"{name}-{i}"
        command = [sys.executable, str(ROOT / "train.py"), *args, f"hydra.run.dir={run_dir}"]
        started = time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True)
        seconds.append(time.perf_counter() - started)
        if result.returncode != 0:
            sys.exit(f"error: the {name} benchmark run failed:\n{result.stderr}")
        losses.append(logged(run_dir, "loss/val")[-1])
    val_loss = statistics.median(losses)
    return {"seconds": statistics.median(seconds), "val_loss": val_loss, "val_losses": losses,
            "reached_target": val_loss <= TARGET_VAL_LOSS}


def bench_quality(repeats: int, corpus: Path, work: Path, steps: int | None) -> dict:
    # data=text reads the file as it is (data=shakespeare would insist on the exact bytes).
    args = ["experiment=shakespeare_char_cpu", "data=text", f"data.path={corpus}", "train.attn_log_interval=0"]
    if steps:
        args += [f"train.max_steps={steps}", f"train.eval_interval={steps}"]
    return timed_training_runs("quality", args, repeats, corpus, work)


def bench_recipe(repeats: int, corpus: Path, work: Path) -> dict:
    args = [*NANOGPT_CPU_SHAPE, "data=text", f"data.path={corpus}", "optim.warmup_steps=100", "train.max_steps=2000",
            "train.eval_interval=2000", "train.eval_iters=200", "train.eval_at_start=false",
            "train.attn_log_interval=0", "train.sample_interval=0", "train.log_interval=100"]
    return timed_training_runs("recipe", args, repeats, corpus, work)


# The models sampled from, both at block_size 256: nanoGPT's shakespeare-char model (its
# train_shakespeare_char config: GPT-2 blocks, 6 layers, 6 heads, 384 dims, 10.7 M parameters)
# and this project's default model (configs/model/gpt.yaml, with the default run's BPE
# vocabulary of 1,274 tokens), whose cached steps are so small that per-operation overhead, not
# arithmetic, sets their speed.
DEFAULT_RUN_VOCAB = 1274


def sampling_models() -> dict[str, GPT]:
    default = OmegaConf.load(ROOT / "configs/model/gpt.yaml")
    default.block_size = 256
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


def seconds_to_line(command: list[str], starts_with: str) -> float:
    """Wall time from starting command to the first line it prints (stdout and stderr together)
    that starts with starts_with; the process then runs to its end, which must be a success."""
    started, seconds = time.perf_counter(), None
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as process:
        output = []
        for line in process.stdout:
            if seconds is None and line.startswith(starts_with):
                seconds = time.perf_counter() - started
            output.append(line)
    if process.returncode != 0 or seconds is None:
        sys.exit(f"error: the start-up benchmark's {Path(command[1]).name} run failed:\n{''.join(output)}")
    return seconds


def bench_startup(repeats: int, work: Path) -> dict:
    """Seconds from the start of the process: python -c 'import torch' to its end, train.py (the
    default run, logging every step) to its first step's line, and sample.py to its text."""
    torch_import, first_step, sample_text = [], [], []
    for i in range(repeats):
        run_dir = work / f"startup-{i}"
        torch_import.append(seconds_to_line([sys.executable, "-c", "import torch; print('done')"], "done"))
        first_step.append(seconds_to_line(
            [sys.executable, str(ROOT / "train.py"), "train.max_steps=1", "train.log_interval=1", "train.eval_at_start=false",
             "train.eval_iters=1", "train.sample_interval=0", "train.attn_log_interval=0", f"hydra.run.dir={run_dir}"],
            "step 1/"))
        sample_text.append(seconds_to_line(
            [sys.executable, str(ROOT / "sample.py"), f"run={run_dir}", "max_new_tokens=50", "prompt=Once"], "Once"))
    return {"import_torch_seconds": statistics.median(torch_import), "train_first_step_seconds": statistics.median(first_step),
            "sample_seconds": statistics.median(sample_text)}


def bare_sdpa(module: CausalSelfAttention, x: torch.Tensor) -> torch.Tensor:
    """The same projections as the module around one scaled_dot_product_attention call:
    the floor the module's sdpa path is measured against."""
    B, T, C = x.shape
    H, D = module.n_head, module.head_dim
    q, k, v = module.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))  # 3 x (B, H, T, D)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
    return module.proj(out.transpose(1, 2).contiguous().view(B, T, C))  # (B, T, C)


def attention_timings(B: int, T: int, C: int, H: int, repeats: int, iterations: int = 20) -> dict:
    """Milliseconds per forward + backward of each path on x (B, T, C), same weights."""
    torch.manual_seed(0)
    sdpa = CausalSelfAttention(C, H, bias=False, attention="sdpa")
    manual = CausalSelfAttention(C, H, bias=False, attention="manual")
    manual.load_state_dict(sdpa.state_dict())
    x = torch.randn(B, T, C, requires_grad=True)
    upstream = torch.randn(B, T, C)
    paths = {"bare_sdpa": lambda: bare_sdpa(sdpa, x), "sdpa": lambda: sdpa(x)[0], "manual": lambda: manual(x)[0]}
    ms = {}
    for name, forward in paths.items():
        def run(forward: Callable[[], torch.Tensor] = forward) -> None:
            for _ in range(iterations):
                (forward() * upstream).sum().backward()
        ms[name] = median_time(run, repeats) / iterations * 1e3
    return {
        **{f"{name}_ms": value for name, value in ms.items()},
        "sdpa_vs_bare": ms["sdpa"] / ms["bare_sdpa"],
        "manual_vs_bare": ms["manual"] / ms["bare_sdpa"],
    }


def bench_attention(repeats: int) -> dict:
    return {f"B{B}_T{T}_C{C}_H{H}": attention_timings(B, T, C, H, repeats) for B, T, C, H in ((8, 256, 384, 6), (12, 64, 128, 4))}


# The data section: one tokenisation in a fresh process, whose peak memory is then its own.
STREAMED_SCRIPT = """
import json, resource, sys, time
from data.dataset import write_cache_entry
from data.token_stream import survey_corpus, train_sample
from data.tokenizer import build_tokenizer
from pathlib import Path
data_cfg, tokenizer_cfg = json.loads(sys.argv[1]), json.loads(sys.argv[2])
times = [time.perf_counter()]
survey = survey_corpus(data_cfg, tokenizer_cfg)
times.append(time.perf_counter())
cache = Path(data_cfg["cache_dir"])
tokenizer = build_tokenizer(tokenizer_cfg, survey.chars, lambda: train_sample(data_cfg, survey), cache, survey.key)
times.append(time.perf_counter())
write_cache_entry(cache / "tokens" / survey.key, data_cfg, tokenizer, survey)
times.append(time.perf_counter())
phases = dict(zip(("survey_s", "tokenizer_s", "encode_s"), [b - a for a, b in zip(times, times[1:])]))
meta = json.loads((cache / "tokens" / survey.key / "meta.json").read_text())
print(json.dumps({**phases, "seconds": times[-1] - times[0], "tokens": meta["n_train"] + meta["n_val"],
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""
IN_MEMORY_SCRIPT = """
import json, resource, sys, time
import numpy as np
from data.tokenizer import tokenizer_from_state
path, state = sys.argv[1], json.loads(sys.argv[2])
started = time.perf_counter()
text = open(path, encoding="utf-8").read()
if state["kind"] == "char":  # nanoGPT's shakespeare_char/prepare.py
    stoi = {ch: i for i, ch in enumerate(sorted(set(text)))}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
else:  # its openwebtext/prepare.py: encode_ordinary, here with the vocabulary the stream learned
    ids = np.array(tokenizer_from_state(state).encode(text), dtype=np.uint16)
print(json.dumps({"seconds": time.perf_counter() - started, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "tokens": len(ids)}))
"""


def python_sources_corpus(path: Path, megabytes: int) -> int:
    """About `megabytes` of text made from local files: the .py files of the installed packages."""
    site = Path(torch.__file__).resolve().parent.parent
    written = 0
    with open(path, "w", encoding="utf-8") as out:
        while written < megabytes * 1e6:
            for source in sorted(site.rglob("*.py")):
                try:
                    text = source.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    continue
                out.write(text)
                written += len(text.encode())
                if written >= megabytes * 1e6:
                    break
    return written


def run_json(script: str, *args: str) -> dict:
    result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    if result.returncode != 0:
        sys.exit(f"error: the data benchmark's run failed:\n{result.stderr}")
    return json.loads(result.stdout.splitlines()[-1])


AT_ONCE_MAX_MB = 200  # nanoGPT's way holds ~14 bytes per character: above this it would need many GB
TRAINERS_MB = 10  # the lesson trainer learns from this much text in the trainers' comparison


def bench_data(repeats: int, work: Path, megabytes: int) -> dict:
    corpus = work / "data-corpus.txt"
    work.mkdir(parents=True, exist_ok=True)
    n_bytes = python_sources_corpus(corpus, megabytes)
    results = {"corpus_mb": n_bytes / 1e6}
    for kind, tokenizer_cfg in (("char", {"kind": "char"}), ("bpe", {"kind": "bpe", "vocab_size": 2048})):
        runs = []
        for i in range(repeats):
            data_cfg = {"source": "text", "path": str(corpus), "text_field": "text", "val_fraction": 0.0,
                        "cache_dir": str(work / f"data-cache-{kind}-{i}")}
            runs.append(run_json(STREAMED_SCRIPT, json.dumps(data_cfg), json.dumps(tokenizer_cfg)))
        streamed = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        results[kind] = {"streamed": {**streamed, "mb_per_s": n_bytes / 1e6 / streamed["seconds"]}}
        if megabytes <= AT_ONCE_MAX_MB:
            entry = next((work / f"data-cache-{kind}-0" / "tokens").iterdir())
            state = json.loads((entry / "meta.json").read_text())["tokenizer"]
            in_memory = [run_json(IN_MEMORY_SCRIPT, str(corpus), json.dumps(state)) for _ in range(repeats)]
            seconds = statistics.median(r["seconds"] for r in in_memory)
            results[kind]["in_memory"] = {"tokens": in_memory[0]["tokens"], "seconds": seconds,
                                          "peak_mib": statistics.median(r["peak_mib"] for r in in_memory),
                                          "mb_per_s": n_bytes / 1e6 / seconds}
    results["trainers"] = bpe_trainers(corpus, repeats)
    return results


def megabyte_pieces(text: str) -> list[str]:
    """text in 1 MB pieces, as the stream hands them to rustbpe (which splits its pieces over the cores)."""
    return [text[i : i + 1_000_000] for i in range(0, len(text), 1_000_000)]


def bpe_trainers(corpus: Path, repeats: int) -> dict:
    """rustbpe beside data/bpe.py, the lesson trainer, learning 2,048 tokens from the same text."""
    with open(corpus, encoding="utf-8") as file:
        text = file.read(TRAINERS_MB * 1_000_000)
    return {"mb": len(text.encode()) / 1e6,
            "rustbpe_s": median_time(lambda: train_bpe_fast(megabyte_pieces(text), 2048), repeats, warmup=0),
            "lesson_s": median_time(lambda: train_bpe(text, 2048), repeats, warmup=0)}


# nanoGPT's README CPU recipe, as its own command line (its config file plus these flags).
NANOGPT_RECIPE = ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=20",
                  "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4",
                  "--n_embd=128", "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"]
NANOGPT_FILES = ("train.py", "model.py", "configurator.py", "config", "data/shakespeare_char/prepare.py")


def bench_nanogpt(repeats: int, steps: int, corpus: Path, checkout: Path | None, work: Path) -> dict:
    """nanoGPT's own train.py in a copy of its files, on the same corpus (its prepare.py reads
    input.txt when present, so nothing is downloaded)."""
    if checkout is None:
        sys.exit("error: --only nanogpt needs --nanogpt <a checkout of karpathy/nanoGPT>; clone it and give its folder")
    if not all((checkout / name).exists() for name in NANOGPT_FILES):
        sys.exit(f"error: --nanogpt {checkout} is not a nanoGPT checkout (it needs {', '.join(NANOGPT_FILES)}); "
                 "clone karpathy/nanoGPT and give its folder")
    if not corpus.is_file():
        sys.exit(f"error: --corpus {corpus} does not exist; give tiny shakespeare's input.txt")
    copy = work / "nanogpt"
    for name in NANOGPT_FILES:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        if (checkout / name).is_dir():
            shutil.copytree(checkout / name, copy / name, dirs_exist_ok=True)
        else:
            shutil.copy(checkout / name, copy / name)
    shutil.copy(corpus, copy / "data/shakespeare_char/input.txt")
    prepared = subprocess.run([sys.executable, "data/shakespeare_char/prepare.py"], cwd=copy, capture_output=True, text=True)
    if prepared.returncode != 0:
        sys.exit(f"error: nanoGPT's data/shakespeare_char/prepare.py failed:\n{prepared.stderr[-2000:]}")
    ms = []
    for _ in range(repeats):
        iterations = nanogpt_run(copy, [f"--max_iters={steps}", "--eval_interval=100000"])[0]
        ms.append(statistics.mean(iterations[len(iterations) // 6:]))  # the first sixth: warming up
    recipes = [nanogpt_run(copy, []) for _ in range(repeats)]
    return {"ms_per_iter": statistics.median(ms), "tokens_per_sec": TOKENS_PER_STEP / statistics.median(ms) * 1e3,
            "recipe_seconds": statistics.median(seconds for _, _, seconds in recipes),
            "recipe_val_loss": statistics.median(val for _, val, _ in recipes)}


def nanogpt_run(copy: Path, flags: list[str]) -> tuple[list[float], float, float]:
    """nanoGPT's recipe with flags on top: (ms of each iteration, the last val loss it printed,
    wall seconds start to exit)."""
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "train.py", *NANOGPT_RECIPE, *flags, "--always_save_checkpoint=False"],
                            cwd=copy, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"error: nanoGPT's run failed:\n{result.stderr[-2000:]}")
    ms = [float(m) for m in re.findall(r"^iter \d+: loss [\d.]+, time ([\d.]+)ms", result.stdout, re.M)]
    if len(ms) < 2:
        sys.exit("error: nanoGPT's run printed fewer than 2 'iter N: loss ..., time ...ms' lines; "
                 "give --steps 100 or more, with a nanoGPT whose train.py prints them")
    vals = re.findall(r"val loss ([\d.]+)", result.stdout)
    return ms, float(vals[-1]) if vals else float("nan"), seconds


# The tab section's runs: config overrides on top of a short run that logs attention 5 times.
TAB_RUNS = {
    "default model (4 x 4, 64-token probe)": [],
    "12 x 12 model (128-token probe)": ["model.n_layer=12", "model.n_head=12", "model.n_embd=192",
                                        "model.block_size=128", "train.probe_tokens=128", "train.batch_size=4"],
}
TAB_RUN_SHORT = ["train.max_steps=20", "train.attn_log_interval=5", "train.eval_interval=20", "train.eval_iters=1",
                 "train.sample_interval=0"]
# Moves the slider to each logged step in turn; resolves with the slowest input-to-drawn time, in ms.
SLIDER_SCRIPT = """
const done = arguments[arguments.length - 1], slider = document.querySelector("input[type=range]");
const times = [];
const move = (index) => {
  if (index < 0) return done(Math.max(...times));
  const started = performance.now();
  slider.value = index;
  slider.dispatchEvent(new Event("input"));
  const step = document.querySelector(".step-label").textContent.split(" ")[0];  // set at once, drawn later
  const wait = () => {
    if (document.body.dataset.drawnStep !== step) return setTimeout(wait, 0);
    times.push(performance.now() - started);
    move(index - 1);
  };
  wait();
};
move(Number(slider.max) - 1);
"""


def bench_tab(repeats: int, work: Path) -> dict:
    from selenium.webdriver.support.ui import WebDriverWait

    from attention_tab.browser import attention_runs, headless_chromium, open_tab, tensorboard_server

    results = {}
    for name, extra in TAB_RUNS.items():
        run_dir = work / f"tab-{len(results)}" / "run"
        result = subprocess.run([sys.executable, str(ROOT / "train.py"), *TAB_RUN_SHORT, *extra, f"hydra.run.dir={run_dir}"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"error: the tab benchmark's run failed:\n{result.stderr}")
        first, slider = [], []
        with tensorboard_server("--logdir", str(run_dir.parent)) as base:
            attention_runs(base, until=lambda runs: runs and len(runs[0]["steps"]) == 5)
            for _ in range(repeats):
                with headless_chromium(1280, 800) as driver:
                    first.append(open_tab(driver, base))
                    WebDriverWait(driver, 60).until(lambda d: d.execute_script("return document.body.dataset.prefetched"))
                    slider.append(driver.execute_async_script(SLIDER_SCRIPT) / 1000)
        results[name] = {"first_render_s": statistics.median(first), "step_change_s": statistics.median(slider)}
    return results


def print_table(results: dict) -> None:
    rows = []
    if "peak" in results:
        rows.append(("fp32 matmul peak (1024^3)", f"{results['peak']['matmul_gflops']:.1f} GFLOP/s"))
    if "training" in results:
        t = results["training"]
        mfu = f", MFU {t['mfu']:.0%}" if t["mfu"] else ""
        rows += [
            ("training, nanoGPT CPU shape", f"{t['tokens_per_sec']:,.0f} tokens/s ({t['ms_per_step']:.1f} ms/step)"),
            ("  model FLOP/s", f"{t['model_gflops']:.1f} GFLOP/s{mfu}"),
            ("  peak memory (train.py)", f"{t['peak_rss_mib']:.0f} MiB"),
        ]
    for key, label in (("quality", "time to quality (preset)"), ("recipe", "nanoGPT's recipe, this trainer")):
        if key in results:
            q = results[key]
            rows.append((label, f"{q['seconds']:.1f} s wall, val loss {q['val_loss']:.4f} "
                                f"({'reaches' if q['reached_target'] else 'misses'} {TARGET_VAL_LOSS})"))
    if "compile" in results:
        e, c = results["compile"]["eager"], results["compile"]["compiled"]
        rows += [
            ("training, train.compile=true", f"{c['tokens_per_sec']:,.0f} tokens/s ({results['compile']['speedup']:.2f}x "
                                             f"eager's {e['tokens_per_sec']:,.0f})"),
            (f"  wall time, {c['steps']} steps", f"{c['seconds']:.1f} s compiled, {e['seconds']:.1f} s eager"),
        ]
    for shape, s in results.get("sampling", {}).items():
        rows += [
            (f"sampling, {shape} model, block 256", f"{s['kv_cache_tokens_per_sec']:,.0f} tokens/s with KV cache "
                                                   f"({s['kv_cache_ms_per_token']:.2f} ms/token), "
                                                   f"{s['recompute_tokens_per_sec']:,.0f} recomputing ({s['speedup']:.1f}x)"),
            ("  compiled decode step (compile=true)", f"{s['compiled_tokens_per_sec']:,.0f} tokens/s "
                                                     f"({s['compiled_ms_per_token']:.2f} ms/token, {s['compiled_speedup']:.1f}x "
                                                     f"recomputing), after {s['compile_seconds']:.1f} s compiling"),
        ]
    for shape, a in results.get("attention", {}).items():
        rows.append((
            f"attention fwd+bwd {shape}",
            f"bare {a['bare_sdpa_ms']:.2f} ms, sdpa {a['sdpa_ms']:.2f} ms ({a['sdpa_vs_bare']:.2f}x), "
            f"manual {a['manual_ms']:.2f} ms ({a['manual_vs_bare']:.2f}x)",
        ))
    if "startup" in results:
        u = results["startup"]
        rows.append(("start-up, seconds from the process's start", f"train.py to its first step {u['train_first_step_seconds']:.1f}, "
                     f"sample.py to its text {u['sample_seconds']:.1f}, python -c 'import torch' {u['import_torch_seconds']:.1f}"))
    if "data" in results:
        rows += data_rows(results["data"])
    if "nanogpt" in results:
        rows += nanogpt_rows(results)
    for shape, t in results.get("tab", {}).items():
        rows.append((f"Attention tab, {shape}", f"first render {t['first_render_s']:.2f} s, "
                                                 f"step change {t['step_change_s'] * 1e3:.0f} ms at most"))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def data_rows(d: dict) -> list[tuple[str, str]]:
    rows = []
    for kind in ("char", "bpe"):
        st, mem = d[kind]["streamed"], d[kind].get("in_memory")
        learn = f", of which learning the vocabulary {st['tokenizer_s']:.1f} s" if kind == "bpe" else ""
        rows.append((f"tokenising {d['corpus_mb']:.0f} MB, {kind}, streamed",
                     f"{st['seconds']:.1f} s ({st['mb_per_s']:.1f} MB/s){learn}; peak memory {st['peak_mib']:.0f} MiB"))
        rows.append(("  the same at once (nanoGPT's way)",
                     f"{mem['seconds']:.1f} s ({mem['mb_per_s']:.1f} MB/s); peak memory {mem['peak_mib']:.0f} MiB"
                     if mem else f"not run above {AT_ONCE_MAX_MB} MB (it holds the whole corpus in memory)"))
    t = d["trainers"]
    rows.append((f"learning 2,048 BPE tokens from {t['mb']:.0f} MB",
                 f"rustbpe {t['rustbpe_s']:.1f} s, data/bpe.py {t['lesson_s']:.1f} s ({t['lesson_s'] / t['rustbpe_s']:.0f}x)"))
    return rows


def nanogpt_rows(results: dict) -> list[tuple[str, str]]:
    """nanoGPT's figures, and the ratios to this project's when its sections ran too."""
    n = results["nanogpt"]
    ours, quality = results.get("training", {}).get("ms_per_step"), results.get("quality", {}).get("seconds")
    return [
        ("nanoGPT itself, same shape", f"{n['tokens_per_sec']:,.0f} tokens/s ({n['ms_per_iter']:.1f} ms/iteration)"
         + (f"; this trainer {n['ms_per_iter'] / ours:.2f}x its speed" if ours else "")),
        ("nanoGPT itself, its CPU recipe", f"{n['recipe_seconds']:.1f} s to val {n['recipe_val_loss']:.4f}"
         + (f"; the preset takes {quality / n['recipe_seconds']:.2f}x its time" if quality else "")),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(DEFAULT_SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS)}")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure; the median is reported")
    parser.add_argument("--steps", type=int, default=300, help="training steps per throughput run")
    parser.add_argument("--preset-steps", type=int, help="a quick check: override the preset's train.max_steps "
                        "(the quality figure then no longer measures time to quality)")
    parser.add_argument("--new-tokens", type=int, default=1000, help="tokens per sampling run")
    parser.add_argument("--data-mb", type=int, default=100, help="megabytes of text for the data section")
    parser.add_argument("--corpus", type=Path, default=ROOT.parent / "shared/corpora/tinyshakespeare.txt",
                        help="tiny shakespeare's input.txt, for the training, quality and recipe sections")
    parser.add_argument("--nanogpt", type=Path, help="a checkout of karpathy/nanoGPT, for the nanogpt section")
    parser.add_argument("--out", type=Path, help="JSON file to write (default: bench_results/bench-<time>.json)")
    args = parser.parse_args()
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown or args.repeats < 1:
        sys.exit(f"error: --only {','.join(unknown)} is not a section (choose from {', '.join(SECTIONS)})"
                 if unknown else f"error: --repeats {args.repeats} must be at least 1")

    stamp = datetime.now()
    out = args.out or ROOT / "bench_results" / f"bench-{stamp:%Y-%m-%d_%H-%M-%S}.json"
    work = out.parent / f"runs-{stamp:%Y-%m-%d_%H-%M-%S}"  # the training section's run dirs
    results: dict = {}
    if "peak" in sections:
        results["peak"] = bench_peak(args.repeats)
    if "training" in sections:
        peak = results.get("peak", {}).get("matmul_gflops")
        results["training"] = bench_training(args.repeats, args.steps, args.corpus.resolve(), peak, work)
    if "quality" in sections:
        results["quality"] = bench_quality(args.repeats, args.corpus.resolve(), work, args.preset_steps)
    if "recipe" in sections:
        results["recipe"] = bench_recipe(args.repeats, args.corpus.resolve(), work)
    if "compile" in sections:
        peak = results.get("peak", {}).get("matmul_gflops")
        results["compile"] = bench_compile(args.repeats, args.steps, args.corpus.resolve(), peak, work)
    if "sampling" in sections:
        results["sampling"] = bench_sampling(args.repeats, args.new_tokens)
    if "attention" in sections:
        results["attention"] = bench_attention(args.repeats)
    if "startup" in sections:
        results["startup"] = bench_startup(args.repeats, work)
    if "data" in sections:
        results["data"] = bench_data(args.repeats, work, args.data_mb)
    if "nanogpt" in sections:
        results["nanogpt"] = bench_nanogpt(args.repeats, args.steps, args.corpus.resolve(), args.nanogpt, work)
    if "tab" in sections:
        results["tab"] = bench_tab(args.repeats, work)

    print_table(results)
    record = {
        "date": stamp.isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_name(), "cores": torch.get_num_threads(), "torch": torch.__version__,
                    "python": platform.python_version()},
        "repeats": args.repeats,
        "results": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written: {out}")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
