"""The nanogpt section: nanoGPT's own train.py, side by side with this project, on the same corpus."""

import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.training import TOKENS_PER_STEP
from user_error import UserError

# nanoGPT's README CPU recipe, as its own command line (its config file plus these flags).
NANOGPT_RECIPE = ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=20",
                  "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4",
                  "--n_embd=128", "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"]
NANOGPT_FILES = ("train.py", "model.py", "configurator.py", "config", "data/shakespeare_char/prepare.py")
# What each section reads of a nanoGPT checkout: the recipe's runs its training script, config and data
# preparation; the fine-tuning steps its model.py alone.
NANOGPT_NEEDS = {"nanogpt": NANOGPT_FILES, "gpt2_finetune": ("model.py",), "nanogpt_gpu": NANOGPT_FILES}


def check_checkout(checkout: Path | None, sections: list[str]) -> None:
    """UserError, said before any section runs, unless checkout holds what the sections read of nanoGPT."""
    wanting = [section for section in sections if section in NANOGPT_NEEDS]
    if not wanting:
        return
    if checkout is None:
        raise UserError(f"--only {','.join(wanting)} needs --nanogpt <a checkout of karpathy/nanoGPT>; clone it and give its folder")
    needed = list(dict.fromkeys(name for section in wanting for name in NANOGPT_NEEDS[section]))
    if not all((checkout / name).exists() for name in needed):
        raise UserError(f"--nanogpt {checkout} is not a nanoGPT checkout (it needs {', '.join(needed)}); "
                        "clone karpathy/nanoGPT and give its folder")


def bench_nanogpt(repeats: int, steps: int, corpus: Path, checkout: Path, work: Path) -> dict:
    """nanoGPT's own train.py in a copy of its files, on the same corpus."""
    copy = prepared_copy(corpus, checkout, work)
    ms = []
    for _ in range(repeats):
        iterations = nanogpt_run(copy, [f"--max_iters={steps}", "--eval_interval=100000"])[0]
        ms.append(statistics.mean(iterations[len(iterations) // 6:]))  # the first sixth: warming up
    recipes = [nanogpt_run(copy, []) for _ in range(repeats)]
    return {"ms_per_iter": statistics.median(ms), "tokens_per_sec": TOKENS_PER_STEP / statistics.median(ms) * 1e3,
            "recipe_seconds": statistics.median(seconds for _, _, seconds in recipes),
            "recipe_val_loss": statistics.median(val for _, val, _ in recipes)}


def prepared_copy(corpus: Path, checkout: Path, work: Path) -> Path:
    """A copy of nanoGPT's files in work (check_checkout found them), its char data prepared from corpus
    (its prepare.py reads input.txt when present, so nothing is downloaded)."""
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
    return copy


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

