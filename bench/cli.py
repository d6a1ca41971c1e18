"""The command line: which sections run, then the table and the JSON record."""

import argparse
import json
import os
import platform
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import NoReturn

import torch

import bench
from bench.attention import bench_attention
from bench.common import ROOT, STEADY_THREADS, tiny_shakespeare, torch_threads
from bench.corpora import bench_data
from bench.gpt2_finetune import bench_gpt2_finetune
from bench.gpt2_sampling import bench_gpt2_sampling
from bench.gpu import QUICK, Sizes, bench_gpu, bench_gpu_finetune, bench_gpu_sampling
from bench.gpu_recipe import bench_nanogpt_gpu
from bench.kv_cache import bench_kv_cache
from bench.loading import bench_loading
from bench.nanogpt import bench_nanogpt, check_checkout
from bench.sampling import bench_sampling
from bench.startup import bench_startup
from bench.tab import bench_tab
from bench.table import print_table
from bench.text import bench_gpt2_text, bench_text
from bench.training import LOG_INTERVAL, bench_compile, bench_peak, bench_quality, bench_recipe, bench_training
from cli.errors import exit_on_user_error, path_error_line
from user_error import UserError

SECTIONS = ("peak", "training", "quality", "recipe", "compile", "sampling", "kv_cache", "attention", "startup", "data", "nanogpt",
            "tab", "text", "gpt2_text", "loading", "gpt2_sampling", "gpt2_finetune", "gpu", "gpu_sampling",
            "gpu_finetune", "nanogpt_gpu")
GPU_SECTIONS = ("gpu", "gpu_sampling", "gpu_finetune")
CORPUS_SECTIONS = ("training", "quality", "recipe", "compile", "nanogpt", "nanogpt_gpu")  # train on tiny shakespeare
DEFAULT_SECTIONS = ("peak", "training", "quality", "sampling", "kv_cache", "attention", "startup", "text")


def main() -> None:
    """`python -m bench`. What it is given is refused in one line with exit status 2, as train.py
    refuses a config; a section whose own run fails stops it with that run's output and status 1."""
    with exit_on_user_error():
        benchmark(command_line().parse_args())


def benchmark(args: argparse.Namespace) -> None:
    """The sections asked for, their table, then the JSON record."""
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if not sections:
        raise UserError(f"--only {args.only!r} names no section; choose from {', '.join(SECTIONS)}")
    if unknown or args.repeats < 1:
        raise UserError(f"--only {','.join(unknown)} is not a section (choose from {', '.join(SECTIONS)})"
                        if unknown else f"--repeats {args.repeats} must be at least 1")
    if args.threads is not None:
        if args.threads < 1:
            raise UserError(f"--threads {args.threads} must be at least 1")
        torch.set_num_threads(args.threads)
    gpu_device = gpu_section_device(args.gpu_device, [s for s in sections if s in GPU_SECTIONS])
    gpu_sizes = QUICK if args.gpu_quick else Sizes()
    recipe_steps(args.gpu_recipe_steps)  # its bad value stops the run before any section
    check_checkout(args.nanogpt, sections)
    if args.steps <= LOG_INTERVAL and any(s in ("training", "compile") for s in sections):
        raise UserError(f"--steps {args.steps} must be more than {LOG_INTERVAL}: the training sections leave the "
                        f"first {LOG_INTERVAL} steps' tokens/s out (start-up and compiling), and need a window after them")
    if any(s in CORPUS_SECTIONS for s in sections):
        args.corpus = tiny_shakespeare(args.corpus)  # found, or fetched, before any section runs

    stamp = datetime.now()
    out = args.out or ROOT / "bench_results" / f"bench-{stamp:%Y-%m-%d_%H-%M-%S}.json"
    check_out(out, given=args.out is not None)  # before the sections run, not after minutes of them
    work = out.parent / f"runs-{stamp:%Y-%m-%d_%H-%M-%S}"  # the training section's run dirs
    results = run_sections(sections, args, work, gpu_device, gpu_sizes)
    print_table(results)
    record = {
        "date": stamp.isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                    "python": platform.python_version()},
        "repeats": args.repeats,
        "results": results,
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written: {out}")


class OneLineParser(argparse.ArgumentParser):
    """argparse's refusals (a misspelt flag, a value of the wrong type) in one line, as the project's
    other commands say theirs, instead of its usage text and the line."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message}; `python -m bench --help` lists the options")


def command_line() -> argparse.ArgumentParser:
    """The benchmark's options."""
    parser = OneLineParser(prog="python -m bench", description=bench.__doc__.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(DEFAULT_SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS)}; by default {', '.join(DEFAULT_SECTIONS)} "
                        "(each other one takes minutes or needs more, e.g. gpt2_sampling about 2 minutes on 2 busy cores, "
                        "gpt2_finetune about 8 and --nanogpt: docs/speed.md)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure; the median is reported")
    parser.add_argument("--threads", type=int, help="torch threads for the sections that run in this process (default: "
                        f"torch's, one per core, and {STEADY_THREADS} for kv_cache and gpt2_sampling, steady on a shared machine)")
    parser.add_argument("--steps", type=int, default=300, help=f"training steps per throughput run (more than {LOG_INTERVAL})")
    parser.add_argument("--preset-steps", type=int, help="a quick check: the preset for this many steps, evaluated "
                        "on 10 batches instead of 200 (the quality figure then no longer measures time to quality)")
    parser.add_argument("--new-tokens", type=int, default=1000, help="tokens per sampling run")
    parser.add_argument("--data-mb", type=int, default=100, help="megabytes of text for the data section")
    parser.add_argument("--corpus", type=Path, help="tiny shakespeare's input.txt, for the training, quality, recipe, "
                        "compile, nanogpt and nanogpt_gpu sections (default: ../shared/corpora/tinyshakespeare.txt if there, else "
                        "the copy data=shakespeare downloads into .cache/corpora/, fetched once)")
    parser.add_argument("--nanogpt", type=Path, help="a checkout of karpathy/nanoGPT, for the nanogpt, nanogpt_gpu and gpt2_finetune sections")
    parser.add_argument("--gpu-device", default="cuda", help="the device of the gpu sections (gpu, gpu_sampling, gpu_finetune; default cuda; "
                        "cpu with --gpu-quick checks their code on a machine without a GPU)")
    parser.add_argument("--gpu-quick", action="store_true", help="the gpu sections at tiny shapes and a few steps: "
                        "every path in a minute or two on a CPU, no figure worth keeping")
    parser.add_argument("--gpu-profile", action="store_true", help="the gpu section profiles every shape's compiled "
                        "steps (by default GPT-2 small's alone, where its MFU misses the goal of 45%%)")
    parser.add_argument("--gpu-recipe-steps", default="", help="nanogpt_gpu: comma-separated train.max_steps of "
                        "experiment=shakespeare_char_gpu to run, one run each (default: the preset's own)")
    parser.add_argument("--out", type=Path, help="JSON file to write (default: bench_results/bench-<date>_<time>.json)")
    return parser


def announcer(sections: list[str]) -> Callable[[str], bool]:
    """wanted(section): whether it was asked for, with a line on stderr as it starts (a run of several
    takes minutes, and the table comes once all are done), numbered in the order they run."""
    order = [section for section in SECTIONS if section in sections]

    def wanted(section: str) -> bool:
        if section not in sections:
            return False
        print(f"bench: {section} ({order.index(section) + 1} of {len(order)})", file=sys.stderr, flush=True)
        return True

    return wanted


def run_sections(sections: list[str], args: argparse.Namespace, work: Path, gpu_device: torch.device | None,
                 gpu_sizes: Sizes) -> dict:
    """Each section asked for, in the order of SECTIONS' table above: its figures by name."""
    results: dict = {}
    wanted = announcer(sections)
    if wanted("peak"):
        results["peak"] = bench_peak(args.repeats)
    if wanted("training"):
        peak = results.get("peak", {}).get("matmul_gflops")
        results["training"] = bench_training(args.repeats, args.steps, args.corpus, peak, work)
    if wanted("quality"):
        results["quality"] = bench_quality(args.repeats, args.corpus, work, args.preset_steps)
    if wanted("recipe"):
        results["recipe"] = bench_recipe(args.repeats, args.corpus, work)
    if wanted("compile"):
        peak = results.get("peak", {}).get("matmul_gflops")
        results["compile"] = bench_compile(args.repeats, args.steps, args.corpus, peak, work)
    if wanted("sampling"):
        results["sampling"] = bench_sampling(args.repeats, args.new_tokens)
    if wanted("kv_cache"):
        with torch_threads(args.threads or STEADY_THREADS):
            results["kv_cache"] = bench_kv_cache(args.repeats)
    if wanted("attention"):
        results["attention"] = bench_attention(args.repeats)
    if wanted("startup"):
        results["startup"] = bench_startup(args.repeats, work)
    if wanted("data"):
        results["data"] = bench_data(args.repeats, work, args.data_mb)
    if wanted("nanogpt"):
        results["nanogpt"] = bench_nanogpt(args.repeats, args.steps, args.corpus, args.nanogpt, work)
    if wanted("tab"):
        results["tab"] = bench_tab(args.repeats, work)
    if wanted("text"):
        results["text"] = bench_text(args.repeats, work)
    if wanted("gpt2_text"):
        results["gpt2_text"] = bench_gpt2_text(args.repeats)
    if wanted("loading"):
        results["loading"] = bench_loading(work)
    if wanted("gpt2_sampling"):
        with torch_threads(args.threads or STEADY_THREADS):
            results["gpt2_sampling"] = bench_gpt2_sampling(args.repeats, work)
    if wanted("gpt2_finetune"):
        results["gpt2_finetune"] = bench_gpt2_finetune(args.repeats, args.nanogpt)
    if wanted("gpu"):
        results["gpu"] = bench_gpu(args.repeats, gpu_device, gpu_sizes, args.gpu_profile)
    if wanted("gpu_sampling"):
        results["gpu_sampling"] = bench_gpu_sampling(args.repeats, gpu_device, gpu_sizes)
    if wanted("gpu_finetune"):
        results["gpu_finetune"] = bench_gpu_finetune(args.repeats, gpu_device, gpu_sizes, work)
    if wanted("nanogpt_gpu"):
        results["nanogpt_gpu"] = bench_nanogpt_gpu(args.corpus, args.nanogpt, work,
                                                   recipe_steps(args.gpu_recipe_steps))

    return results


def check_out(out: Path, given: bool) -> None:
    """UserError unless the JSON record can be written to out (its folder made now)."""
    named = f"--out {out}" if given else f"the record {out}"
    if out.is_dir():
        raise UserError(f"{named} is a folder; give the path of a .json file to write")
    if out.exists():  # said now, not after minutes of sections, and never written over
        raise UserError(f"{named} already exists (an earlier record?); give a new path, or move it away first")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{named}: {path_error_line(err)}") from None
    try:  # a file made and removed: os.access passes what root may write but the kernel refuses (/proc)
        out.open("x").close()
        out.unlink()
    except OSError as err:
        raise UserError(f"{named} cannot be written ({err.strerror}); give a path this user may write in") from None


def recipe_steps(text: str) -> list[int]:
    """--gpu-recipe-steps as train.max_steps values, or one line saying what is wrong."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not all(part.isdigit() and int(part) > 0 for part in parts):
        raise UserError(f"--gpu-recipe-steps {text} must be whole numbers of steps above 0, comma-separated, e.g. 600,1000")
    return [int(part) for part in parts]


def gpu_section_device(name: str, gpu_sections: list[str]) -> torch.device | None:
    """The device of the gpu sections asked for (None without any), or one line saying why it cannot be."""
    if not gpu_sections:
        return None
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--gpu-device {name} is not a device; use cuda, cuda:<index> or cpu") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--only {','.join(gpu_sections)} needs a CUDA GPU; PyTorch {torch.__version__} sees none here. "
                        "Run it on a machine with one, or check its code here with --gpu-device cpu --gpu-quick")
    if device.type not in ("cuda", "cpu"):
        raise UserError(f"--gpu-device {name} is neither a CUDA GPU nor the CPU; use cuda, cuda:<index> or cpu")
    return device


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()

