"""The notebooks (notebooks/*.ipynb) run top to bottom in a real Jupyter kernel on a real run,
as make notebook opens them, and are stored without outputs."""

import io
import re
import subprocess
from contextlib import redirect_stdout
from pathlib import Path

import matplotlib
import nbformat
import pytest
import torch
from nbclient import NotebookClient

from inspection.heatmap import render_attention_map
from inspection.patching import SMALL_GAP
from tests.helpers import CIRCUIT_TOKENIZER, ROOT, tiny_gpt

matplotlib.use("Agg")  # pictures drawn off screen: plt.show() then shows nothing
from matplotlib import pyplot  # noqa: E402  (after the backend is chosen)

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# What each notebook prints, and how many pictures it draws at least, when it ran to its end.
PRINTS = {
    "look_inside.ipynb": (["by hand vs the module, largest difference", "second-copy loss:"], 3),  # the head's map, the induction head's map, the losses
    "name_swap.ipynb": (["the stories' form:", "the shares add up to", "output restored"], 3),  # the lens, the shares and knock-outs, the patches
}


def test_there_is_a_notebook_and_each_is_stored_without_outputs():
    assert NOTEBOOKS and sorted(PRINTS) == [path.name for path in NOTEBOOKS]
    for path in NOTEBOOKS:
        code = [cell for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]
        assert all(not cell.outputs and cell.execution_count is None for cell in code), f"{path.name}: clear its outputs"


def test_make_notebook_opens_a_notebook_by_name_or_file_and_refuses_another_in_one_line():
    # -o: take .venv as set up, without looking (the check comes before JupyterLab is needed).
    result = subprocess.run(["make", "-s", "-o", ".venv/.installed", "notebook", "NOTEBOOK=look_insde"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and not result.stdout
    assert result.stderr.splitlines()[0] == ("error: NOTEBOOK=look_insde is not a notebook here: pick one of "
                                             f"{', '.join(path.stem for path in NOTEBOOKS)} (make notebook NOTEBOOK=name_swap)")
    # Its name, its file name or its path: the same notebook opens (-n: the commands, not run).
    for given in ("name_swap", "name_swap.ipynb", "notebooks/name_swap.ipynb"):
        shown = subprocess.run(["make", "-s", "-n", "-o", ".venv/.installed", "notebook", f"NOTEBOOK={given}"], cwd=ROOT,
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and "jupyter lab notebooks/name_swap.ipynb " in shown.stdout, shown.stderr


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_each_notebook_runs_top_to_bottom_on_a_trained_run(path: Path, trained_run: Path):
    notebook = nbformat.read(path, as_version=4)
    parameters = next(cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", []))
    assert parameters.source.startswith('RUN = "latest"')  # what a user runs, unless they name a run
    parameters.source = parameters.source.replace('RUN = "latest"', f"RUN = {str(trained_run)!r}", 1)
    # The kernel starts in notebooks/, as Jupyter starts it; a cell that fails raises here with its traceback.
    NotebookClient(notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    printed = "".join(output.get("text", "") for cell in notebook.cells for output in cell.get("outputs", []))
    phrases, pictures = PRINTS[path.name]
    assert all(phrase in printed for phrase in phrases), printed
    images = [output for cell in notebook.cells for output in cell.get("outputs", []) if "image/png" in output.get("data", {})]
    assert len(images) >= pictures
    if path.name == "name_swap.ipynb":  # the direct shares add up to the metric they split, as the notebook prints them
        metric, total = re.search(r"metric (\S+); the shares add up to (\S+)", printed).groups()
        assert metric == total
        clean, corrupted = map(float, re.search(r"metric clean (\S+), corrupted (\S+);", printed).groups())
        if abs(abs(clean - corrupted) - SMALL_GAP) > 0.01:  # the printed figures are rounded: at the line itself, either way
            assert ("note: the metric moves by only" in printed) == (abs(clean - corrupted) < SMALL_GAP), printed  # patching's gap


@pytest.mark.parametrize("options", [{}, {"n_kv_head": 1, "window": 3}, {"n_kv_head": 2, "n_head": 4, "window": 5, "pos": "rope",
                                                                      "qk_norm": True}],
                         ids=["every head its keys", "one key head, a window of 3", "grouped queries, rotary, QK-norm"])
def test_look_insides_attention_by_hand_is_the_modules_with_grouped_queries_and_a_window(options):
    # Section 2's cell as the notebook holds it, on the cache section 1 makes, for model shapes the
    # notebook's own run (tests above) may not have: its assert compares the two.
    notebook = nbformat.read(ROOT / "notebooks" / "look_inside.ipynb", as_version=4)
    by_hand = next(cell.source for cell in notebook.cells if "by hand vs the module" in cell.source)
    model = tiny_gpt(**options).eval()
    idx = torch.randint(0, 65, (1, 14), generator=torch.Generator().manual_seed(0))  # (1, T), T past each window
    with torch.no_grad():
        _, cache = model.run_with_cache(idx)
    names = {"model": model, "config": model.config, "cache": cache, "labels": [str(i) for i in idx[0].tolist()],
             "torch": torch, "plt": pyplot, "render_attention_map": render_attention_map}
    exec(compile(by_hand, "look_inside.ipynb, section 2", "exec"), names)
    assert names["weights"].shape == (14, 14)
    pyplot.close("all")


@pytest.mark.parametrize(("n_head", "knocked_out"), [(1, 1), (2, 2), (4, 2)])
def test_look_insides_knock_outs_on_a_one_layer_run_are_of_different_heads(n_head, knocked_out):
    # Section 3 picks an induction head and a previous-token head, section 4 knocks each out. With
    # one layer there is no layer below: the previous-token head is another head of it, and a
    # model of one head has none (once, both picks were the same head, knocked out twice).
    notebook = nbformat.read(ROOT / "notebooks" / "look_inside.ipynb", as_version=4)
    picks, knock_outs = (next(cell.source for cell in notebook.cells if phrase in cell.source)
                         for phrase in ("induction_score(patterns, n)", "def second_copy_losses"))
    model = tiny_gpt(vocab_size=CIRCUIT_TOKENIZER.vocab_size, block_size=64, n_layer=1, n_head=n_head).eval()
    names = {"model": model, "config": model.config, "tokenizer": CIRCUIT_TOKENIZER, "torch": torch, "plt": pyplot,
             "render_attention_map": render_attention_map}
    printed = io.StringIO()
    with redirect_stdout(printed):
        exec(compile(picks, "look_inside.ipynb, section 3", "exec"), names)
        exec(compile(knock_outs, "look_inside.ipynb, section 4", "exec"), names)
    pyplot.close("all")
    heads = re.findall(r"without layer (\d+) head (\d+)", printed.getvalue())
    assert len(heads) == len(set(heads)) == knocked_out, printed.getvalue()
    assert ("the best previous-token score beside it" in printed.getvalue()) == (n_head > 1), printed.getvalue()
