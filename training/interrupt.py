"""Ctrl-C and `kill` stop a run cleanly: the loop finishes its step, saves, and says how to
resume. A second signal stops at once (the last checkpoint on disk is still whole), unless
it comes within a second of the first: under torchrun one Ctrl-C reaches each process twice,
from the terminal and relayed by torchrun, and that is still one request to stop cleanly.

    with StopSignals() as stop:
        ... if stop.requested: save and leave ...
"""

import signal
import time
from types import FrameType


class StopSignals:
    HANDLED = (signal.SIGINT, signal.SIGTERM)
    SAME_REQUEST_SECONDS = 1.0

    def __init__(self) -> None:
        self.requested: int | None = None  # the signal number, once one arrived
        self._first_at = 0.0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopSignals":
        for signum in self.HANDLED:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None:
            if time.monotonic() - self._first_at > self.SAME_REQUEST_SECONDS:
                raise KeyboardInterrupt  # asked twice: do not wait for the step
            return
        self.requested, self._first_at = signum, time.monotonic()

    @property
    def name(self) -> str:
        return signal.Signals(self.requested).name if self.requested else ""
