"""The checkpoint's one home, model_io/checkpoint.py: loading a model for sampling, the tab or
an export needs the weights, the shape and the tokenizer, never the loop or the config schema."""

import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow  # the shared trained run, and a fresh Python process

LOAD_AND_LIST_MODULES = """
import sys
from pathlib import Path
from model_io.checkpoint import Checkpoint
from model_io.run_files import resolve_checkpoint
model, tokenizer = Checkpoint.load(resolve_checkpoint(sys.argv[1])).build_model()
assert model.num_parameters() > 0 and tokenizer.decode(tokenizer.encode("Once")) == "Once"
print(" ".join(sorted({name.split(".")[0] for name in sys.modules})))
"""


def test_loading_a_model_imports_neither_hydra_nor_omegaconf_nor_the_loop(trained_run):
    # A fresh interpreter: this process has imported Hydra for the other tests.
    loaded = subprocess.run([sys.executable, "-c", LOAD_AND_LIST_MODULES, str(trained_run)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    modules = set(loaded.stdout.split())
    assert {"model", "model_io", "data"} <= modules  # the list is real: what loading needs is in it
    assert not modules & {"hydra", "omegaconf", "training", "cli"}, modules & {"hydra", "omegaconf", "training", "cli"}
