"""Ctrl-C and `kill` stop a run cleanly: the loop finishes its step, saves, and says how to
resume. A second signal stops at once (the last checkpoint on disk is still whole).

    with StopSignals() as stop:
        ... if stop.requested: save and leave ...
"""

import signal
from types import FrameType


class StopSignals:
    HANDLED = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested: int | None = None  # the signal number, once one arrived
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopSignals":
        for signum in self.HANDLED:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None:  # asked twice: do not wait for the step
            raise KeyboardInterrupt
        self.requested = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.requested).name if self.requested else ""
