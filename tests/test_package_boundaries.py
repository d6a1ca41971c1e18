"""Which packages each command pulls in, read from a fresh interpreter's sys.modules after it has
done its work: sampling, exporting and the Attention tab share runtime/ (devices, precision, ranks)
with training, and import nothing of the training loop's package."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, pythonpath_with_root

# In one fresh interpreter (each its own would cost seconds of start-up): sample.py, then
# export.py, as `python <script> <args>` runs them, then the tab's routes that run a model, as
# TensorBoard's process calls them; after each, the training.* and runtime.* modules imported so far.
THREE_COMMANDS = """
import json, runpy, sys
from pathlib import Path
run, root = sys.argv[1], Path(sys.argv[2])
seen = {}

def imported(name):
    seen[name] = sorted(m for m in sys.modules if m.split(".")[0] in ("training", "runtime"))

for script, *args in (("sample.py", "max_new_tokens=5"), ("export.py", "out=exported")):
    sys.argv = [script, f"run={run}", *args]
    try:
        runpy.run_path(str(root / script), run_name="__main__")
    except SystemExit as exit_:
        assert not exit_.code, (script, exit_.code)
    imported(script)

from attention_tab.live_model import ModelCache, text_answer
from attention_tab.tools import attribution_answer, lens_answer, patch_answer, patch_example
import attention_tab.plugin
loaded = ModelCache(2**30, "cpu", "fp32").get(Path(run), "run")
text = {"text": "Once upon a time, Mia met Leo. Mia"}
text_answer("run", loaded, text["text"], [(0, 1)])
lens_answer("run", loaded, text, [])
attribution_answer("run", loaded, text, [], 3)
example = patch_example("run", loaded)
patch_answer("run", loaded, example["clean"], example["corrupted"], example["token"])
imported("the tab")
print("IMPORTED", json.dumps(seen), file=sys.stderr)
"""


@pytest.mark.slow  # three new Python processes: sample.py, export.py and the tab's loader
def test_sampling_exporting_and_the_tab_import_runtime_and_nothing_of_the_training_loop(trained_run: Path, tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-c", THREE_COMMANDS, str(trained_run), str(ROOT)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300, env={"PYTHONPATH": pythonpath_with_root(), "PATH": "/usr/bin:/bin"})
    line = next((line for line in result.stderr.splitlines() if line.startswith("IMPORTED ")), None)
    assert line is not None, result.stdout + result.stderr
    seen = json.loads(line.removeprefix("IMPORTED "))
    assert (tmp_path / "exported" / "config.json").is_file() and "wrote exported as a Qwen3ForCausalLM" in result.stdout
    for command, modules in seen.items():
        assert [m for m in modules if m.startswith("training")] == [], command
    # What they share with training comes from runtime/: the device and precision choices.
    assert {"runtime.devices", "runtime.precision"} <= set(seen["sample.py"]) and "runtime.precision" in seen["the tab"]


CONFIG_LIBRARIES = ("hydra", "omegaconf")
# The command line's layer and the three scripts read the config; everything below them takes
# plain values (a checkpoint's config, a run's settings), so it runs without Hydra.
MAY_READ_THE_COMMAND_LINE = {"cli", "train.py", "sample.py", "export.py"}


def imports_of(source: str) -> set[str]:
    """The top-level packages a Python file imports, anywhere in it (a function's lazy import too)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_no_module_outside_cli_and_the_three_scripts_imports_hydra_or_omegaconf():
    skipped = {"tests", "outputs", "multirun", "notebooks"}  # and hidden folders: .venv, .git, .cache, ...
    sources = [path for path in ROOT.rglob("*.py")
               if not any(part in skipped or part.startswith(".") for part in path.relative_to(ROOT).parts)]
    assert ROOT / "training" / "fit.py" in sources and ROOT / "bench" / "text.py" in sources  # the walk sees them
    readers = {str(path.relative_to(ROOT)) for path in sources if imports_of(path.read_text()) & set(CONFIG_LIBRARIES)}
    assert {reader for reader in readers if reader.split("/")[0] not in MAY_READ_THE_COMMAND_LINE} == set()
    assert {"cli/schema.py", "train.py"} <= readers


def test_the_import_walk_sees_a_lazy_import_inside_a_function():
    assert imports_of("def f():\n    from omegaconf import OmegaConf\n") == {"omegaconf"}
    assert imports_of("import hydra.utils as h\nfrom . import x\n") == {"hydra"}


# The packages below cli/: they take specs (training/specs.py, data/specs.py, model/gpt.py's GPTConfig).
BELOW_THE_DOOR = ("training", "data", "model", "model_io", "inspection", "runtime", "attention_tab")


def config_readers(source: str) -> set[str]:
    """What in source takes or reads a config itself: a parameter named cfg or *_cfg, or .cfg read."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.arg) and (node.arg == "cfg" or node.arg.endswith("_cfg")):
            found.add(f"parameter {node.arg}")
        elif isinstance(node, ast.Attribute) and node.attr == "cfg":
            found.add(".cfg")
    return found


def test_below_cli_no_function_takes_the_config_and_none_reads_run_cfg():
    readers = {str(path.relative_to(ROOT)): config_readers(path.read_text())
               for package in BELOW_THE_DOOR for path in (ROOT / package).glob("*.py")}
    assert "training/fit.py" in readers and "data/token_cache.py" in readers  # the walk sees them
    assert {path: found for path, found in readers.items() if found} == {}
    assert config_readers("def f(data_cfg):\n    return run.cfg.train\n") == {"parameter data_cfg", ".cfg"}
