"""What train.py shows as it works: a progress bar on a terminal, plain step lines in a pipe."""

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from tests.helpers import NO_PROBES, ROOT, run_cli, tiny_run

pytestmark = pytest.mark.slow  # a real training run under a pseudo-terminal


def run_on_a_terminal(args: list[str], cwd: Path) -> tuple[int, str]:
    """train.py with a real pseudo-terminal as its stdout and stderr: (exit status, what it showed)."""
    terminal, child_end = pty.openpty()
    fcntl.ioctl(child_end, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # 40 rows, 120 columns
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], cwd=cwd, env=env,
                               stdin=subprocess.DEVNULL, stdout=child_end, stderr=child_end)
    os.close(child_end)
    shown = b""
    while True:
        try:
            chunk = os.read(terminal, 4096)
        except OSError:  # EIO: the process closed its end
            break
        if not chunk:
            break
        shown += chunk
    os.close(terminal)
    return process.wait(timeout=300), shown.decode(errors="replace")


def test_a_terminal_gets_a_progress_bar_instead_of_step_lines_and_a_pipe_gets_the_lines(tmp_path):
    args = tiny_run(NO_PROBES)
    status, shown = run_on_a_terminal([*args, "hydra.run.dir=tty"], tmp_path)
    assert status == 0, shown
    assert re.search(r"step 20/20 \|█{24}\| loss [\d.]+ \| [\d.]+k tok/s \| 00:00 left", shown), shown
    assert "| lr " not in shown  # the per-step lines went to the log file only...
    assert "step 20/20 | loss" in (tmp_path / "tty" / "train.log").read_text()
    assert "step 20: train loss" in shown and "done: best val loss" in shown  # ...the others print above the bar
    for reading in ("reading the corpus", "reading text for BPE", r"tokenising \(bpe\)"):  # bytes of a known total
        assert re.search(reading + r": +0%\|.*\| 0\.00/[12]\d\.\dk \[00:00<\?, \?B/s\]", shown), shown
    assert "read 17 documents, 21,443 characters (21.4kB generated)" in shown and "merges in" in shown
    assert "Progress:" not in shown  # nor the trainer's own steps
    piped = run_cli("train.py", *args, "hydra.run.dir=piped", cwd=tmp_path)  # its output is no terminal either
    assert "step 20/20 | loss" in piped.stdout and "| lr " in piped.stdout
    assert "█" not in piped.stdout + piped.stderr and "\r" not in piped.stderr  # no bar in a pipe
