"""The startup section: seconds from a process's start to its first useful line."""

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ROOT


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
