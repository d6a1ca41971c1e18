"""The nanogpt_gpu section: nanoGPT's GPU recipe (its config/train_shakespeare_char.py, unchanged)
against `train.py experiment=shakespeare_char_gpu`, on the same GPU, one after the other: wall
time from each command's start to the first evaluation whose val loss reaches the target."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ROOT
from bench.nanogpt import prepared_copy

TARGET_VAL_LOSS = 1.47  # nanoGPT's README: val 1.4697 after its 5,000 iterations on an A100
NANOGPT_VAL = re.compile(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)")
OUR_VAL = re.compile(r"^step (\d+): val loss ([\d.]+)")
TIMELINE_LINES = 60


def bench_nanogpt_gpu(corpus: Path, checkout: Path, work: Path, steps: list[int]) -> dict:
    """nanoGPT's recipe, then ours: the preset as it is when steps is empty, else once for each
    max_steps in steps, evaluating every 100 steps; each stops at its first val loss at or under
    the target, or at its end."""
    copy = prepared_copy(corpus, checkout, work)
    nanogpt = time_to_target("nanoGPT", [sys.executable, "train.py", "config/train_shakespeare_char.py"], copy, NANOGPT_VAL)
    ours = {}
    for max_steps in steps or [None]:
        args = ["experiment=shakespeare_char_gpu", "data=text", f"data.path={corpus}",
                f"hydra.run.dir={work / f'shakespeare_char_gpu-{max_steps}'}"]
        if max_steps:
            # every 100 steps, so that the first val loss under the target shows when it comes
            args += [f"train.max_steps={max_steps}", "train.eval_interval=100", f"train.attn_log_interval={max_steps}"]
        name = str(max_steps or "preset")
        ours[name] = time_to_target(f"ours ({name})", [sys.executable, str(ROOT / "train.py"), *args], ROOT, OUR_VAL)
    reached = [run["seconds_to_target"] for run in ours.values() if run["seconds_to_target"] is not None]
    best = min(reached) if reached else None
    return {"target": TARGET_VAL_LOSS, "nanogpt": nanogpt, "ours": ours,
            "ratio": best / nanogpt["seconds_to_target"] if best and nanogpt["seconds_to_target"] else None}


def time_to_target(name: str, command: list[str], cwd: Path, val_line: re.Pattern) -> dict:
    """Runs command, reading its output as it comes: the seconds from its start to the first val
    loss at or under the target (then it is stopped; None if never), every val loss with its time,
    and each line's time (the first TIMELINE_LINES: where the start-up goes)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    curve, tail, timeline, seconds_to_target = [], [], [], None
    for line in process.stdout:
        tail = [*tail[-40:], line]
        if len(timeline) < TIMELINE_LINES:
            timeline.append((round(time.perf_counter() - started, 2), line.strip()[:120]))
        if line.startswith(("model:", "data:", "precision:", "number of parameters", "tokens per iteration")):
            print(f"  {name}: {line.strip()}", flush=True)  # what each side ran: its shape, device and precision
        if match := val_line.match(line.strip()):
            seconds = time.perf_counter() - started
            curve.append((seconds, int(match[1]), float(match[2])))
            print(f"  {name}: {seconds:6.1f} s, step {match[1]}, val loss {match[2]}", flush=True)
            if float(match[2]) <= TARGET_VAL_LOSS:
                seconds_to_target = seconds
                process.terminate()
                break
    process.stdout.close()
    returncode = process.wait()
    if seconds_to_target is None and returncode != 0:
        sys.exit(f"error: the {name} run failed:\n{''.join(tail)}")
    return {"seconds_to_target": seconds_to_target, "seconds": time.perf_counter() - started,
            "best_val_loss": min((val for _, _, val in curve), default=None), "curve": curve,
            "last_lines": [line.strip() for line in tail[-6:]], "timeline": timeline}  # its last step lines: ms per step, tokens/s
