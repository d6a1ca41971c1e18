"""The notebooks (notebooks/*.ipynb) run top to bottom in a real Jupyter kernel on a real run,
as make notebook opens them, and are stored without outputs."""

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.helpers import ROOT

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
