"""A script's start (runtime/startup.py): Ctrl-C while it imports is one line, and once the
imports are in, the garbage collector is on again with what they made frozen."""

import gc
import subprocess
import sys

import pytest

from tests.helpers import ROOT

# Ctrl-C as the script starts importing torch: a finder that Python asks first sends it, so that it
# lands in the imports every time (a timer would land there only on a machine of the right speed).
# Ctrl-C reaches the script as from a terminal: a shell that runs the tests in the background
# starts them with it ignored, and the scripts leave an ignored Ctrl-C ignored.
CTRL_C_AT_TORCH = """
import os, runpy, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
class CtrlCAtTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, CtrlCAtTorch())
sys.argv = [sys.argv[1]]
sys.path[0] = os.path.dirname(sys.argv[0])  # as Python runs a script: its folder first
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("script", ["train.py", "sample.py", "export.py"])
def test_ctrl_c_while_a_script_imports_is_one_line_not_an_imports_traceback(tmp_path, script):
    result = subprocess.run([sys.executable, "-c", CTRL_C_AT_TORCH, str(ROOT / script)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (130, ""), result.stderr
    assert result.stderr == "stopped: interrupted while starting; nothing was written\n"
    assert not list(tmp_path.iterdir())

# Each command's imports, as it runs them, then what the collector does: the scripts are run
# under another name than __main__ (their imports alone), `python -m bench` with --help.
AFTER_THE_IMPORTS = """
import gc, os, runpy, sys
command = sys.argv[1]
sys.argv = [command, "--help"]
try:
    if command == "bench":
        runpy.run_module("bench", run_name="__main__")
    else:
        sys.path[0] = os.path.dirname(command)
        runpy.run_path(command, run_name="imported")
except SystemExit:
    pass
print(gc.isenabled(), gc.get_freeze_count())
"""


@pytest.mark.parametrize("command", ["train.py", "sample.py", "export.py", "bench"])
def test_after_its_imports_a_command_collects_garbage_again_with_what_they_made_frozen(command):
    target = command if command == "bench" else str(ROOT / command)
    result = subprocess.run([sys.executable, "-c", AFTER_THE_IMPORTS, target], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    enabled, frozen = result.stdout.split()[-2:]
    assert enabled == "True"  # off for good, a long run's reference cycles would pile up
    assert int(frozen) > 100_000  # torch's and the rest's objects, which no later collection walks


def test_the_tests_run_with_the_collector_on_and_the_collected_files_frozen():
    # tests/conftest.py turns it off while pytest imports the test files, then on again
    assert gc.isenabled() and gc.get_freeze_count() > 100_000
