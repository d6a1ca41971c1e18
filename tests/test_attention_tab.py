"""The Attention tab's server side: its routes on a real TensorBoard server (the `tensorboard`
entry point `make setup` installs) serving a real tiny run, under both of TensorBoard's loaders:
--logdir (what the training log prints; the Rust data server) and --logdir_spec (make tensorboard)."""

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import made_up_attention
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util.tensor_util import make_ndarray

from attention_tab.browser import attention_runs, tensorboard_server
from inspection.attention_summary import PLUGIN_NAME, WEIGHTS_TAG
from training.tensorboard_log import RunLogger

PLUGIN = f"/data/plugin/{PLUGIN_NAME}"


def get(url: str) -> tuple[int, str, bytes]:
    """(status, content type, body) of a GET, errors included."""
    try:
        with urllib.request.urlopen(url) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read()


def logged(run_dir: Path) -> EventAccumulator:
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


@pytest.fixture(scope="module", params=["logdir", "logdir_spec"])
def served(request, trained_run):
    """(base URL, the run's name there) for the tiny run, under one of the two loaders."""
    if request.param == "logdir":
        args, name = ["--logdir", str(trained_run.parent)], trained_run.name
    else:
        args, name = ["--logdir_spec", f"outputs:{trained_run.parent}"], f"outputs/{trained_run.name}"
    with tensorboard_server(*args) as base:
        attention_runs(base)
        yield base, name


def test_tensorboard_lists_the_attention_tab_and_serves_its_modules(served):
    base, _ = served
    listing = json.loads(get(base + "/data/plugins_listing")[2])[PLUGIN_NAME]
    assert listing["enabled"] and listing["tab_name"] == "Attention"
    assert listing["loading_mechanism"] == {"type": "IFRAME", "module_path": f"{PLUGIN}/static/index.js"}
    modules = sorted(p.name for p in (Path(__file__).parent.parent / "attention_tab" / "static").glob("*.js"))
    assert "index.js" in modules
    for name in modules:
        status, kind, body = get(f"{base}{PLUGIN}/static/{name}")
        assert (status, kind.split(";")[0]) == (200, "text/javascript"), name
        for imported in set(re.findall(r'from "\./([\w.]+)"', body.decode())):
            assert imported in modules, f"{name} imports {imported}, which is not served"


def test_runs_lists_the_logged_steps_shape_and_probe_labels(served, trained_run):
    base, name = served
    events = logged(trained_run)
    (run,) = attention_runs(base)
    labels = json.loads(events.SummaryMetadata(WEIGHTS_TAG).plugin_data.content)["labels"]
    assert run == {"run": name, "tag": WEIGHTS_TAG, "steps": [0, 10, 20], "shape": [2, 2, 24, 24], "labels": labels}


def test_each_steps_weights_come_back_byte_for_byte(served, trained_run):
    base, name = served
    for event in logged(trained_run).Tensors(WEIGHTS_TAG):
        status, kind, body = get(f"{base}{PLUGIN}/weights?run={name}&step={event.step}")
        assert (status, kind) == (200, "application/octet-stream")
        sent = np.frombuffer(body, dtype="<f2").reshape(2, 2, 24, 24)
        assert sent.tobytes() == make_ndarray(event.tensor_proto).astype("<f2").tobytes()


def test_metrics_are_the_logged_head_scalars_per_step_layer_and_head(served, trained_run):
    base, name = served
    events = logged(trained_run)
    metrics = json.loads(get(f"{base}{PLUGIN}/metrics?run={name}")[2])
    prefixes = {"entropy": "head_entropy", "distance": "head_distance", "previous_token": "head_previous_token",
                "induction": "head_induction", "recall": "recall_heads", "ablation": "ablation/recall_name"}
    assert set(metrics) == set(prefixes)
    heads_js = (Path(__file__).parent.parent / "attention_tab" / "static" / "heads.js").read_text()
    shown = re.findall(r"^  (\w+): \[", heads_js.split("export const METRICS = {")[1].split("};")[0], flags=re.M)
    assert set(shown) == set(prefixes)  # each one a column of the head table and a number for the model view
    for metric, table in metrics.items():
        prefix = prefixes[metric]
        assert table["steps"] == [0, 10, 20]
        for i, step in enumerate(table["steps"]):
            for layer, head in np.ndindex(2, 2):
                scalar = events.Scalars(f"{prefix}/layer_{layer}/head_{head}")[i]
                assert scalar.step == step and table["values"][i][layer][head] == pytest.approx(scalar.value, rel=1e-6)


@pytest.mark.parametrize("query, status, says", [
    ("weights?run=nope&step=0", 404, "no attention data for run 'nope'"),
    ("weights?run={run}&step=7", 404, "logged no attention at step 7; its steps are [0, 10, 20]"),
    ("weights?run={run}&step=ten", 400, "step must be a whole number, not 'ten'"),
    ("weights?run={run}", 400, "missing query parameter 'step'"),
    ("weights?run={run}&step=0&tag=attention/nope", 404, "has no tag 'attention/nope'"),
    ("metrics?run=nope", 404, "no run 'nope'"),
    ("static/../plugin.py", 404, ""),
    ("static/secret.txt", 404, "no file 'secret.txt'"),
])
def test_bad_run_tag_or_step_gets_a_400_or_404_with_one_line(served, query, status, says):
    base, name = served
    code, _, body = get(f"{base}{PLUGIN}/{query.format(run=name)}")
    text = body.decode()
    assert code == status and says in text
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1


def weights_at(step: int) -> torch.Tensor:
    return made_up_attention(step, n_layer=2, n_head=3, T=5)


@pytest.mark.parametrize("loader", ["logdir", "logdir_spec"])
def test_every_step_is_kept_and_a_run_still_writing_shows_its_new_steps(tmp_path, loader):
    """TensorBoard keeps a few random tensors of a tag unless told otherwise: the tab's loader tells
    it to keep them all. Steps written while the server runs appear in /runs."""
    n_steps = 60
    logger = RunLogger(tmp_path / "live")
    for step in range(n_steps):
        logger.attention_weights(step, weights_at(step), list("abcde"))
    logger.flush()
    args, name = (["--logdir", str(tmp_path)], "live") if loader == "logdir" else (["--logdir_spec", f"x:{tmp_path}"], "x/live")
    with tensorboard_server(*args) as base:
        runs = attention_runs(base, lambda runs: runs and len(runs[0]["steps"]) == n_steps)
        assert runs[0]["steps"] == list(range(n_steps))
        for step in (n_steps, n_steps + 1):
            logger.attention_weights(step, weights_at(step), list("abcde"))
        logger.flush()
        (run,) = attention_runs(base, lambda runs: len(runs[0]["steps"]) == n_steps + 2)
        assert run["steps"] == list(range(n_steps + 2)) and run["labels"] == list("abcde")
        body = get(f"{base}{PLUGIN}/weights?run={name}&step={n_steps + 1}")[2]
        assert np.frombuffer(body, "<f2").tobytes() == weights_at(n_steps + 1).half().numpy().tobytes()
    logger.close()
