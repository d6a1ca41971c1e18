"""Ctrl-C and `kill` stop a run cleanly: the loop finishes its step, saves, and says how to
resume (the first signal is answered with a line at once). A second signal stops at once (the
last checkpoint on disk is still whole), unless it comes within a second of the first: under
torchrun one Ctrl-C reaches each process twice, from the terminal and relayed by torchrun, and
that is still one request to stop cleanly.

    with StopSignals() as stop:
        ... if stop.requested: save and leave ...

"At once" holds even in the middle of one long PyTorch operation (a huge block_size can make
a single attention call run for minutes). Python runs a signal handler only between two
bytecodes, so the handler alone would wait for that operation to end. A watcher thread hears
each signal through signal.set_wakeup_fd instead, and can act while the operation runs (PyTorch
lets other threads run during its operations).
"""

import os
import signal
import sys
import threading
import time
from contextlib import suppress
from types import FrameType


class StopSignals:
    HANDLED = (signal.SIGINT, signal.SIGTERM)
    SAME_REQUEST_SECONDS = 1.0
    GRACE_SECONDS = 2.0  # after a second signal, how long the watcher leaves the handler to end the run

    def __init__(self) -> None:
        self.requested: int | None = None  # the signal number, once one arrived
        self._first_at = 0.0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopSignals":
        for signum in self.HANDLED:
            self._previous[signum] = signal.signal(signum, self._handle)
        heard, wakeup = os.pipe()  # the C-level handler writes each signal's number into wakeup
        os.set_blocking(wakeup, False)
        self._previous_wakeup = signal.set_wakeup_fd(wakeup, warn_on_full_buffer=False)
        self._wakeup, self._left = wakeup, threading.Event()
        threading.Thread(target=self._watch, args=(heard, self._left), name="stop-signals", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._left.set()  # the block is over: the watcher must not end the process any more
        signal.set_wakeup_fd(self._previous_wakeup)
        os.close(self._wakeup)  # the watcher reads end-of-file and ends
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _is_second_request(self, now: float) -> bool:
        return self.requested is not None and now - self._first_at > self.SAME_REQUEST_SECONDS

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        """The Python-level handler: runs between bytecodes of the main thread."""
        if self._is_second_request(time.monotonic()):
            raise KeyboardInterrupt  # asked twice: do not wait for the step
        if self.requested is None:
            self.requested, self._first_at = signum, time.monotonic()

    def _watch(self, heard: int, left: threading.Event) -> None:
        """The watcher thread: when a second request finds the main thread stuck inside one
        operation for GRACE_SECONDS, end the process from here. Files being saved go to a
        temporary name first, so the last checkpoint on disk stays whole."""
        first_at = None
        while received := os.read(heard, 64):
            stops = [signum for signum in received if signum in self.HANDLED]  # any signal with a handler is written
            if not stops:
                continue
            now = time.monotonic()
            if first_at is None:
                first_at = now
                self._say_heard(stops[0])
            elif now - first_at > self.SAME_REQUEST_SECONDS:
                if left.wait(self.GRACE_SECONDS):
                    break  # the handler ended the run, and its own exit is under way
                print("stopped: interrupted in the middle of an operation (files already saved are whole)",
                      file=sys.stderr, flush=True)
                os._exit(128 + stops[-1])
        os.close(heard)

    @staticmethod
    def _say_heard(signum: int) -> None:
        """The first request's line, said at once from the watcher (an evaluation of many batches, or
        one long operation, may keep the run from stopping for minutes), by one process of a torchrun
        run: rank 0. Written to the file descriptor, not through sys.stderr, which the main thread may
        be writing to."""
        if os.environ.get("RANK", "0") != "0":
            return
        name = signal.Signals(signum).name
        line = (f"heard {name}: the run saves and stops once the work under way ends (a step, an evaluation, a sample); "
                f"{name} again, a second or more later, stops at once (files already saved are whole)\n")
        with suppress(OSError):  # a console gone (a closed pipe) must not end the watcher, which the second signal needs
            os.write(2, (("\n" if os.isatty(2) else "") + line).encode())  # on a terminal, below the progress bar's line

    @property
    def name(self) -> str:
        return signal.Signals(self.requested).name if self.requested else ""
