"""A one-line progress bar for the training loop.

On a terminal it redraws in place (step, bar, loss, tokens/s, time left), and console log
lines print above it. Records logged with extra={"progress": True} (the per-step lines)
then go to the log file only, since the bar already shows them. When the bar's stream or
the console log's stream is not a terminal (CI, a pipe, `> out.txt`), the bar is off and
every log line is printed as usual.
"""

import logging
import sys
import time
from typing import TextIO


class ProgressBar:
    def __init__(self, total: int, start: int = 0, stream: TextIO = sys.stderr, width: int = 24) -> None:
        self.total, self.start, self.stream, self.width = total, start, stream, width
        self.started_at = time.perf_counter()
        self.last_draw = 0.0
        self.line = ""
        self.console_handlers = [
            handler
            for handler in logging.getLogger().handlers
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
        ]
        self.enabled = stream.isatty() and all(h.stream.isatty() for h in self.console_handlers)
        for handler in self.console_handlers:
            handler.addFilter(self.before_console_record)

    def before_console_record(self, record: logging.LogRecord) -> bool:
        """Clear the bar so the log line prints on a clean line; drop per-step lines."""
        if not self.enabled:
            return True
        self.clear()
        return not getattr(record, "progress", False)

    def update(self, step: int, loss: float, tokens_per_sec: float) -> None:
        now = time.perf_counter()
        if not self.enabled or (now - self.last_draw < 0.1 and step < self.total):
            return
        self.last_draw = now
        done = step / self.total
        filled = int(self.width * done)
        steps_per_sec = (step - self.start) / max(now - self.started_at, 1e-9)
        remaining = (self.total - step) / steps_per_sec if steps_per_sec > 0 else 0.0
        self.line = (
            f"step {step}/{self.total} |{'█' * filled}{'·' * (self.width - filled)}| "
            f"loss {loss:.3f} | {tokens_per_sec / 1000:.1f}k tok/s | {format_duration(remaining)} left"
        )
        self.stream.write("\r\033[K" + self.line)
        self.stream.flush()

    def clear(self) -> None:
        if self.enabled and self.line:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.line = ""

    def close(self) -> None:
        self.clear()
        for handler in self.console_handlers:
            handler.removeFilter(self.before_console_record)


def format_duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
