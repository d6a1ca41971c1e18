from runtime.startup import Starting

starting = Starting()  # Ctrl-C while importing is one line, and no garbage is collected (runtime/startup.py)
from bench.cli import main  # noqa: E402

starting.done()
main()
