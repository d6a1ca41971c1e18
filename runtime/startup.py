"""A script's first second, while it imports torch and the rest and has done nothing yet.

train.py, sample.py, export.py and `python -m bench` open with `starting = Starting()` and call
`starting.done()` once their imports are in. In between:
- Ctrl-C ends the script with one line and exit status 130 instead of an import's traceback
  (nothing is written yet). done() puts the handler back, so that Ctrl-C raises KeyboardInterrupt
  again, which the commands handle (cli/errors.py, the training loop). A Ctrl-C the shell had the
  process ignore stays ignored.
- No garbage is collected. The imports make hundreds of thousands of objects that live as long
  as the process, and little garbage (some thousands of objects, kept), yet each full collection
  walks all of them: left on, the collector ran several times over them during the imports.
  done() turns it back on (unless it was off before: a test process that imports a script) and
  freezes what the imports made (gc.freeze), so that no later collection walks those objects
  again; what the run makes from then on is collected as usual.

docs/speed.md ("Start-up") has the figures; tests/test_startup.py checks that each script leaves
the collector on.
"""

import gc
import signal
import sys


class Starting:
    """From here until done(): Ctrl-C is one line, and no garbage collection runs."""

    def __init__(self) -> None:
        self.collecting_before = gc.isenabled()
        gc.disable()
        self.ctrl_c_before = signal.getsignal(signal.SIGINT)
        if self.ctrl_c_before is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, stopped_while_starting)

    def done(self) -> None:
        """The imports are in: Ctrl-C raises KeyboardInterrupt again, and the collector runs again,
        over what is made from now on."""
        signal.signal(signal.SIGINT, self.ctrl_c_before)
        if self.collecting_before:
            gc.enable()
        gc.freeze()


def stopped_while_starting(signum: int, frame: object) -> None:
    print("stopped: interrupted while starting; nothing was written", file=sys.stderr, flush=True)
    sys.exit(130)
