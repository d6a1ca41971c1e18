"""The training loop's progress bar: tqdm on a terminal, nothing in a pipe.

On a terminal the bar redraws in place and console log lines print above it (tqdm's logging
redirect); the per-step lines, logged with extra={"progress": True}, then go to the log file
only, since the bar shows them. When stderr or the console log is not a terminal (CI, a
pipe, `> out.txt`) there is no bar and every log line prints as usual.
"""

import logging
import sys
from contextlib import ExitStack
from typing import TextIO

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm


def console_handlers() -> list[logging.StreamHandler]:
    return [handler for handler in logging.getLogger().handlers
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)]


def not_a_step_line(record: logging.LogRecord) -> bool:
    return not getattr(record, "progress", False)


class ProgressBar:
    """with ProgressBar(total, start) as bar: ... bar.update(step, loss, tokens_per_sec) ...
    wanted=False (a rank other than 0 under torchrun) draws nothing anywhere."""

    def __init__(self, total: int, start: int = 0, stream: TextIO | None = None, wanted: bool = True) -> None:
        stream = stream or sys.stderr  # the one of the moment, not of import time
        self.enabled = wanted and stream.isatty() and all(handler.stream.isatty() for handler in console_handlers())
        self.bar = tqdm(total=total, initial=start, file=stream, disable=not self.enabled, unit="step",
                        bar_format="step {n_fmt}/{total_fmt} |{bar:24}| {desc} | {remaining} left")
        self.redirect = ExitStack()
        if self.enabled:
            for handler in console_handlers():
                handler.addFilter(not_a_step_line)  # the redirect copies the filter to tqdm's handler
                self.redirect.callback(handler.removeFilter, not_a_step_line)
            self.redirect.enter_context(logging_redirect_tqdm())

    def update(self, step: int, loss: float, tokens_per_sec: float) -> None:
        if self.enabled:
            self.bar.set_description_str(f"loss {loss:.3f} | {tokens_per_sec / 1000:.1f}k tok/s", refresh=False)
            self.bar.update(step - self.bar.n)

    def close(self) -> None:
        self.bar.close()
        self.redirect.close()

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
