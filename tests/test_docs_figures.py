"""The pictures `make docs` draws from a run (docs/figures.py)."""

import os
import re
import subprocess
import sys

import pytest
from PIL import Image

from inspection.tab_format import RECALL_HEADS, head_scalar_tag
from tests.helpers import ROOT, assert_one_error_line, read_events, run_script
from user_error import UserError


@pytest.mark.slow  # the shared trained run
def test_the_docs_picture_shows_the_name_copying_head_beside_another(trained_run, tmp_path):
    import docs.figures  # the script behind `make docs`
    from docs.drawing import SHOWN_WIDTH

    out = tmp_path / "maps.png"
    (copier, _), (other, _) = [((layer, head), role) for layer, head, role in
                               docs.figures.attention_maps_figure(str(trained_run / "ckpt_last.pt"), out=out)]
    # The run logged each head's weight on the earlier mention at step 20, from the same weights.
    events = read_events(trained_run)
    logged = {(layer, head): events.Scalars(head_scalar_tag(RECALL_HEADS, layer, head))[-1].value
              for layer in range(2) for head in range(2)}
    assert copier == max(logged, key=logged.get) and other != copier
    width, height = Image.open(out).size
    assert 1.5 * height < width <= SHOWN_WIDTH  # two square maps side by side, shown at their own size


@pytest.mark.slow  # the shared trained run
def test_a_run_of_another_shape_than_make_trains_is_one_line_and_the_picture_is_left_as_it_was(trained_run, tmp_path):
    # The tests' tiny run: 2 x 2 heads and a context of 32, too short for the pages' own text.
    # make docs wrote docs/attention_maps.png over, then stopped with a traceback.
    import docs.figures

    with pytest.raises(UserError, match=re.escape(f"RUN={trained_run}: make docs draws the pictures and numbers of a run "
                                                  "of make train's settings, and this run lacks what they need (")):
        docs.figures.figures_of(str(trained_run), tmp_path / "staged.png")  # (main replaces the picture only after)


def test_the_docs_picture_of_a_missing_run_is_one_clear_line(tmp_path):
    result = run_script(ROOT / "docs" / "figures.py", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert_one_error_line(result, "does not exist")


@pytest.mark.parametrize(("given", "said"), [("", "RUN= is empty"), ("no where", "RUN=no where does not exist")])
def test_make_docs_names_the_run_as_it_was_typed_before_it_draws_anything(given, said):
    # The scripts' own line named run=, which make docs users never type. -o: .venv and the browser
    # taken as set up, without looking (the checks come before either is needed).
    result = subprocess.run(["make", "-s", "-o", ".venv/.installed", "-o", "browser", "docs", f"RUN={given}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and not result.stdout
    assert result.stderr.splitlines()[0] == f"error: {said}; give make docs RUN=<run dir>, or leave RUN out for the newest run"


def test_make_sample_finds_a_run_under_home_as_typed_with_a_tilde(tmp_path):
    # zsh passes RUN=~/... on unexpanded, and the scripts expand it: the check must find the run as they do.
    (tmp_path / "runs" / "a").mkdir(parents=True)
    result = subprocess.run(["make", "-s", "-o", ".venv/.installed", "sample", "RUN=~/runs/a", "ARGS=max_new_tokens=nope",
                             f"PY={sys.executable}"],  # this interpreter, where no .venv was made (a GPU machine's image)
                            cwd=ROOT, capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": str(tmp_path)})
    assert "error: max_new_tokens=nope must be a whole number" in result.stderr, result.stderr  # past make's check: sample.py's own
