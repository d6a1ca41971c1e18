"""Which packages each command pulls in, read from a fresh interpreter's sys.modules after it has
done its work: sampling, exporting and the Attention tab share runtime/ (devices, precision, ranks)
with training, and import nothing of the training loop's package."""

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT

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

from attention_tab.your_text import ModelCache, text_answer
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


def test_sampling_exporting_and_the_tab_import_runtime_and_nothing_of_the_training_loop(trained_run: Path, tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-c", THREE_COMMANDS, str(trained_run), str(ROOT)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    line = next((line for line in result.stderr.splitlines() if line.startswith("IMPORTED ")), None)
    assert line is not None, result.stdout + result.stderr
    seen = json.loads(line.removeprefix("IMPORTED "))
    assert (tmp_path / "exported" / "config.json").is_file() and "wrote exported as a Qwen3ForCausalLM" in result.stdout
    for command, modules in seen.items():
        assert [m for m in modules if m.startswith("training")] == [], command
    # What they share with training comes from runtime/: the device and precision choices.
    assert {"runtime.devices", "runtime.precision"} <= set(seen["sample.py"]) and "runtime.precision" in seen["the tab"]
