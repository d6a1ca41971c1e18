"""The Attention tab's server side. TensorBoard finds it through the `tensorboard_plugins` entry
point (pyproject.toml; `make setup` installs it) and serves these routes under
data/plugin/tinyattn_attention/:

    static/<file>                   the page: index.js (the ES module the tab loads) and its parts
    runs                            JSON: each run with attention data, its steps, shape and labels, and
                                    whether it counts as trained (model_io/latest_run.py: the tab opens
                                    the newest such run first)
    weights?run=R&step=S[&tag=T]    one step's weights: float16 little-endian (n_layer, n_head, T, T)
    metrics?run=R                   JSON: the head metrics logged as scalars, per head and step
    text  (POST run, text[, knocked_out=L:H,...])
                                    JSON: the model of the run's checkpoint reads the text, with
                                    those heads knocked out (attention_tab/your_text.py)
    repeated?run=R[&n=N&seed=S&knocked_out=L:H,...]
                                    JSON: the same for n random tokens (32, or fewer where the model
                                    reads less), then the same n again, with each head's induction
                                    score and the mean loss over each copy

A bad run, tag, step, text, n or seed gets a 400 or 404 with one line saying what is wrong,
quoting at most the start of what was sent. The runs' models run on --attention_tab_device
(cpu); they stay cached up to --attention_tab_cache_mb.
"""

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tensorboard import errors, plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider
from tensorboard.plugins import base_plugin
from tensorboard.plugins.scalar import metadata as scalar_metadata
from werkzeug import wrappers

from attention_tab.run_folders import init_from, logdir_roots, run_folder
from inspection.attention_summary import PLUGIN_NAME, WEIGHTS_TAG, read_labels
from model_io.latest_run import is_trained
from user_error import UserError, quoted

STATIC = Path(__file__).parent / "static"
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css"}
# head_{metric}/, recall_heads/ and ablation/recall_name/ + layer_{l}/head_{h} (training/tensorboard_log.py):
# the metrics {metric}, "recall" and "ablation".
HEAD_SCALAR = re.compile(r"^(?:head_(?P<metric>\w+)|(?P<recall>recall)_heads|(?P<ablation>ablation)/recall_name)"
                         r"/layer_(?P<layer>\d+)/head_(?P<head>\d+)$")
HEAD_PAIR = re.compile(r"(\d{1,9}):(\d{1,9})")  # knocked_out=1:0,2:3
DEVICE = re.compile(r"(cpu|cuda|mps|xpu)(:\d+)?")


class AttentionLoader(base_plugin.TBLoader):
    """Keeps every logged step of the tab's data: TensorBoard otherwise keeps a random 10 tensors
    per tag, and the step slider would skip most of training. `--samples_per_plugin
    tinyattn_attention=N` still wins."""

    def define_flags(self, parser) -> None:
        group = parser.add_argument_group(PLUGIN_NAME)
        group.add_argument("--attention_tab_device", default="cpu", help="where the Attention tab's text box runs "
                           "a run's model: cpu (the default), cuda, cuda:1, mps")
        group.add_argument("--attention_tab_cache_mb", type=int, default=512, help="megabytes of models the "
                           "Attention tab keeps loaded for its text box, least recently used out first")

    def fix_flags(self, flags) -> None:
        flags.samples_per_plugin.setdefault(PLUGIN_NAME, 0)
        if not DEVICE.fullmatch(flags.attention_tab_device):
            raise base_plugin.FlagsError(f"--attention_tab_device={flags.attention_tab_device} is not a device; "
                                         "give cpu, cuda, cuda:<index> or mps")
        if flags.attention_tab_cache_mb < 0:
            raise base_plugin.FlagsError(f"--attention_tab_cache_mb={flags.attention_tab_cache_mb} must be at least 0")

    def load(self, context: base_plugin.TBContext) -> base_plugin.TBPlugin:
        return AttentionPlugin(context)


class AttentionPlugin(base_plugin.TBPlugin):
    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        self.data = context.data_provider
        self.flags = context.flags
        self.cache: dict[tuple[str, str], tuple[tuple, dict[int, np.ndarray]]] = {}
        self.models = None  # your_text.ModelCache, made on the first text

    def get_plugin_apps(self):
        return {"/static/*": self.serve_static, "/runs": self.serve_runs,
                "/weights": self.serve_weights, "/metrics": self.serve_metrics, "/text": self.serve_text,
                "/repeated": self.serve_repeated}

    def is_active(self) -> bool:
        return False  # the frontend asks the data provider (data_plugin_names) instead

    def data_plugin_names(self):
        return (PLUGIN_NAME,)

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(es_module_path="/static/index.js", tab_name="Attention")

    @wrappers.Request.application
    def serve_static(self, request):
        name = request.path.rsplit("/static/", 1)[-1]
        path = STATIC / name
        if "/" in name or path.suffix not in STATIC_TYPES or not path.is_file():
            raise errors.NotFoundError(f"no file {quoted(name)} in the Attention tab's static files")
        return http_util.Respond(request, path.read_bytes(), STATIC_TYPES[path.suffix])

    @wrappers.Request.application
    def serve_runs(self, request):
        ctx, experiment = request_context(request)
        listing = self.data.list_tensors(ctx, experiment_id=experiment, plugin_name=PLUGIN_NAME)
        scalars = self.data.list_scalars(ctx, experiment_id=experiment, plugin_name=scalar_metadata.PLUGIN_NAME)
        runs = []
        for run, tags in sorted(listing.items()):
            trained_steps = max((series.max_step for series in scalars.get(run, {}).values()), default=0)
            trained = is_trained(trained_steps, self.init_from(run))
            for tag, series in sorted(tags.items()):
                steps = self.steps(ctx, experiment, run, tag, series)
                shape = next(iter(steps.values())).shape
                runs.append({"run": run, "tag": tag, "steps": sorted(steps), "shape": list(shape),
                             "labels": read_labels(series.plugin_content), "trained": trained})
        return json_response(request, {"runs": runs})

    @wrappers.Request.application
    def serve_weights(self, request):
        ctx, experiment = request_context(request)
        run, tag = required(request, "run"), request.args.get("tag", WEIGHTS_TAG)
        step = integer(required(request, "step"), "step")
        steps = self.steps(ctx, experiment, run, tag, self.series(ctx, experiment, run, tag))
        if step not in steps:
            raise errors.NotFoundError(f"run {quoted(run)} logged no attention at step {step}; its steps are {sorted(steps)}")
        body = steps[step].astype("<f2").tobytes()
        return http_util.Respond(request, body, "application/octet-stream")

    @wrappers.Request.application
    def serve_metrics(self, request):
        """{metric: {"steps": [...], "values": [[[per head] per layer] per step]}}."""
        ctx, experiment = request_context(request)
        run = required(request, "run")
        scalar_tags = self.data.list_scalars(ctx, experiment_id=experiment, plugin_name=scalar_metadata.PLUGIN_NAME,
                                             run_tag_filter=provider.RunTagFilter(runs=[run])).get(run)
        if scalar_tags is None:
            if run not in {r.run_name for r in self.data.list_runs(ctx, experiment_id=experiment)}:
                raise errors.NotFoundError(f"no run {quoted(run)}; the runs are those /runs lists")
            scalar_tags = {}  # a run that logged no scalars
        heads = {tag: match for tag in scalar_tags if (match := HEAD_SCALAR.match(tag))}
        series = self.data.read_scalars(ctx, experiment_id=experiment, plugin_name=scalar_metadata.PLUGIN_NAME,
                                        downsample=100_000, run_tag_filter=provider.RunTagFilter([run], list(heads)))
        return json_response(request, head_metric_table(heads, series.get(run, {})))

    @wrappers.Request.application
    def serve_text(self, request):
        """The run's model reads the text: your_text.answer's JSON."""
        if request.method != "POST":
            raise errors.InvalidArgumentError("send the text as a POST form: run, text, knocked_out")
        run, text = form_field(request, "run"), form_field(request, "text")
        knocked_out = head_pairs(request.form.get("knocked_out", ""))
        return self.run_model(request, run, lambda models, folder: models.read(folder, run, text, knocked_out))

    @wrappers.Request.application
    def serve_repeated(self, request):
        """The run's model reads n random tokens twice: your_text.repeated_answer's JSON."""
        run, n = required(request, "run"), request.args.get("n", "")
        n, seed = integer(n, "n") if n else None, integer(request.args.get("seed", "0"), "seed")
        knocked_out = head_pairs(request.args.get("knocked_out", ""))
        return self.run_model(request, run, lambda models, folder: models.read_repeated(folder, run, n, seed, knocked_out))

    def run_model(self, request, run: str, read: Callable[[Any, Path], dict]):
        """read(models, the run's folder) with the run's model: JSON, or a 400 with read's one line."""
        ctx, experiment = request_context(request)
        if run not in {r.run_name for r in self.data.list_runs(ctx, experiment_id=experiment)}:
            raise errors.InvalidArgumentError(f"no run {quoted(run)}; the runs are those /runs lists")
        from attention_tab import your_text  # torch: loaded on the first such request, not at TensorBoard's start

        if self.models is None:
            self.models = your_text.ModelCache.in_tensorboard(self.flags)
        try:
            return json_response(request, read(self.models, run_folder(run, self.roots())))
        except UserError as err:
            raise errors.InvalidArgumentError(str(err)) from None

    def roots(self) -> dict[str, str | None]:
        return logdir_roots(self.flags.logdir, self.flags.logdir_spec)

    def init_from(self, run: str) -> str | None:
        """The pretrained weights the run started from, as its folder's config says; None when it
        says none, or the run has no folder here."""
        try:
            return init_from(run_folder(run, self.roots()))
        except UserError:
            return None

    def series(self, ctx, experiment: str, run: str, tag: str) -> provider.TensorTimeSeries:
        listing = self.data.list_tensors(ctx, experiment_id=experiment, plugin_name=PLUGIN_NAME,
                                         run_tag_filter=provider.RunTagFilter(runs=[run]))
        if run not in listing:
            raise errors.NotFoundError(f"no attention data for run {quoted(run)}; the runs are those /runs lists")
        if tag not in listing[run]:
            raise errors.NotFoundError(f"run {quoted(run)} has no tag {quoted(tag)}; its tags: {sorted(listing[run])}")
        return listing[run][tag]

    def steps(self, ctx, experiment: str, run: str, tag: str, series: provider.TensorTimeSeries) -> dict[int, np.ndarray]:
        """{step: weights} of one run and tag, read again only when the run has logged more."""
        version = (series.max_step, series.max_wall_time)
        cached = self.cache.get((run, tag))
        if cached is None or cached[0] != version:
            data = self.data.read_tensors(ctx, experiment_id=experiment, plugin_name=PLUGIN_NAME, downsample=1_000_000,
                                          run_tag_filter=provider.RunTagFilter(runs=[run], tags=[tag]))
            cached = self.cache[(run, tag)] = (version, {datum.step: datum.numpy for datum in data[run][tag]})
        return cached[1]


def head_metric_table(heads: dict[str, re.Match], series: dict[str, list[provider.ScalarDatum]]) -> dict:
    """Per-head scalars (HEAD_SCALAR) -> {metric: {"steps", "values" (step, layer, head)}}."""
    table: dict[str, dict[int, dict[tuple[int, int], float]]] = {}
    for tag, match in heads.items():
        metric = match["metric"] or match["recall"] or match["ablation"]
        where = (int(match["layer"]), int(match["head"]))
        for datum in series.get(tag, []):
            value = datum.value if math.isfinite(datum.value) else None  # a model gone non-finite
            table.setdefault(metric, {}).setdefault(datum.step, {})[where] = value
    result = {}
    for metric, by_step in table.items():
        n_layer = 1 + max(layer for values in by_step.values() for layer, _ in values)
        n_head = 1 + max(head for values in by_step.values() for _, head in values)
        steps = sorted(by_step)
        result[metric] = {"steps": steps, "values": [
            [[by_step[step].get((layer, head)) for head in range(n_head)] for layer in range(n_layer)] for step in steps
        ]}
    return result


def request_context(request) -> tuple:
    return plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)


def required(request, name: str) -> str:
    value = request.args.get(name)
    if value is None:
        raise errors.InvalidArgumentError(f"missing query parameter {name!r}")
    return value


def form_field(request, name: str) -> str:
    value = request.form.get(name)
    if value is None:
        raise errors.InvalidArgumentError(f"missing form field {name!r}")
    return value


def head_pairs(value: str) -> list[tuple[int, int]]:
    """"1:0,2:3" -> [(1, 0), (2, 3)]: (layer, head) pairs."""
    pairs = [HEAD_PAIR.fullmatch(item.strip()) for item in value.split(",") if item.strip()]
    if not all(pairs):
        raise errors.InvalidArgumentError(f"knocked_out takes layer:head pairs, e.g. 1:0,2:3; not {quoted(value)}")
    return [(int(pair[1]), int(pair[2])) for pair in pairs]


def integer(value: str, name: str) -> int:
    if not re.fullmatch(r"-?\d{1,18}", value):  # a longer one is no step, n or seed, and int() of 5,000 digits refuses
        raise errors.InvalidArgumentError(f"{name} must be a whole number, not {quoted(value)}")
    return int(value)


def json_response(request, value) -> wrappers.Response:
    return http_util.Respond(request, json.dumps(value, allow_nan=False), "application/json")
