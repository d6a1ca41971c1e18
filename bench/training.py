"""The peak, training, quality, recipe and compile sections: train.py itself, in fresh processes."""

import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.common import ROOT, logged, median_time
from model import GPT
from model_io.checkpoint import Checkpoint
from training.tensorboard_log import TOKENS_PER_SEC, VAL_LOSS

TARGET_VAL_LOSS = 1.886  # nanoGPT's README CPU recipe on tiny shakespeare

# nanoGPT's README CPU recipe as this project's config overrides: char-level, GPT-2's blocks
# (learned positions, LayerNorm, GELU, no QK-norm) and AdamW on a cosine schedule.
NANOGPT_CPU_SHAPE = [
    "tokenizer=char", "model.n_layer=4", "model.n_head=4", "model.n_embd=128", "model.block_size=64", "model.dropout=0.0",
    "model.pos=learned", "model.norm=layernorm", "model.mlp=gelu", "model.qk_norm=false", "model.smear=false",
    "train.batch_size=12", "optim.name=adamw", "optim.lr=1e-3", "optim.min_lr=1e-4", "optim.schedule=cosine",
    "train.device=cpu",  # as nanoGPT's --device=cpu: on a GPU machine auto would take the GPU
]
TOKENS_PER_STEP = 12 * 64  # batch x block


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


# train.py logs tokens/s over windows of this many steps; the first, which holds the start-up and
# any compiling, is left out, so a throughput run needs more steps than one window (--steps).
LOG_INTERVAL = 50


def bench_training(repeats: int, steps: int, corpus: Path, peak_gflops: float | None, work: Path,
                   extra: tuple[str, ...] = (), name: str = "throughput") -> dict:
    """train.py on nanoGPT's CPU shape: tokens/s as it logged them (the first window, which
    holds the start-up and any compiling, left out), wall time start to exit, peak memory."""
    rates, seconds, max_rss = [], [], 0
    for i in range(repeats):
        run_dir = work / f"{name}-{i}"
        args = [
            *NANOGPT_CPU_SHAPE, "data=text", f"data.path={corpus}", f"train.max_steps={steps}",
            f"train.eval_interval={steps}", "train.eval_iters=1", f"train.log_interval={LOG_INTERVAL}",
            "train.attn_log_interval=0", "train.sample_interval=0", f"hydra.run.dir={run_dir}", *extra,
        ]
        # Each run compiles from scratch (an empty kernel cache), as a first run does.
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(work / f"{name}-{i}-inductor-cache")}
        started = time.perf_counter()
        result = subprocess.run([sys.executable, str(ROOT / "train.py"), *args], capture_output=True, text=True, env=env)
        seconds.append(time.perf_counter() - started)
        if result.returncode != 0:
            sys.exit(f"error: the {name} benchmark run failed:\n{result.stderr}")
        rates.append(statistics.median(logged(run_dir, TOKENS_PER_SEC)[1:]))
        max_rss = max(max_rss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    model, _ = Checkpoint.load(run_dir / "ckpt_last.pt").build_model()
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


def bench_compile(repeats: int, steps: int, corpus: Path, peak_gflops: float | None, work: Path) -> dict:
    """The training section's runs once eager and once with train.compile=true, side by side."""
    eager = bench_training(repeats, steps, corpus, peak_gflops, work, name="eager")
    compiled = bench_training(repeats, steps, corpus, peak_gflops, work, ("train.compile=true",), name="compiled")
    return {"eager": eager, "compiled": compiled, "speedup": compiled["tokens_per_sec"] / eager["tokens_per_sec"]}


def timed_training_runs(name: str, args: list[str], repeats: int, corpus: Path, work: Path) -> dict:
    """Runs train.py repeats times; median wall time (start to exit) and final val loss."""
    seconds, losses = [], []
    for i in range(repeats):
        run_dir = work / f"{name}-{i}"
        command = [sys.executable, str(ROOT / "train.py"), *args, f"hydra.run.dir={run_dir}"]
        started = time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True)
        seconds.append(time.perf_counter() - started)
        if result.returncode != 0:
            sys.exit(f"error: the {name} benchmark run failed:\n{result.stderr}")
        losses.append(logged(run_dir, VAL_LOSS)[-1])
    val_loss = statistics.median(losses)
    return {"seconds": statistics.median(seconds), "val_loss": val_loss, "val_losses": losses,
            "reached_target": val_loss <= TARGET_VAL_LOSS}


def bench_quality(repeats: int, corpus: Path, work: Path, steps: int | None) -> dict:
    # data=text reads the file as it is (data=shakespeare would insist on the exact bytes).
    args = ["experiment=shakespeare_char_cpu", "data=text", f"data.path={corpus}", "train.attn_log_interval=0",
            "train.device=cpu"]  # a CPU figure, also on a machine with a GPU
    if steps:
        args += [f"train.max_steps={steps}", f"train.eval_interval={steps}", "train.eval_iters=10"]
    return timed_training_runs("quality", args, repeats, corpus, work)


def bench_recipe(repeats: int, corpus: Path, work: Path) -> dict:
    args = [*NANOGPT_CPU_SHAPE, "data=text", f"data.path={corpus}", "optim.warmup_steps=100", "train.max_steps=2000",
            "train.eval_interval=2000", "train.eval_iters=200", "train.eval_at_start=false",
            "train.attn_log_interval=0", "train.sample_interval=0", "train.log_interval=100"]
    return timed_training_runs("recipe", args, repeats, corpus, work)

