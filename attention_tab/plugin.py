"""The Attention tab's server side. TensorBoard finds it through the `tensorboard_plugins` entry
point (pyproject.toml; `make setup` installs it) and serves these routes under
data/plugin/tinyattn_attention/:

    static/<file>                   the page: index.js (the ES module the tab loads) and its parts
    settings                        JSON: what the page is told once, at load: the colour map, the metrics'
                                    labels, the token view's row height... (attention_tab/page_settings.py)
    runs                            JSON: each run with attention data, its steps, shape and labels,
                                    its model's window (null: none; the page greys the keys it hides),
                                    whether it counts as trained (model_io/run_files.py: the tab opens
                                    the newest such run first), and kept: the steps of the checkpoints
                                    it kept along the way (train.keep_checkpoints)
    weights?run=R&step=S[&tag=T]    one step's weights: float16 little-endian (n_layer, n_head, T, T)
    metrics?run=R                   JSON: the head metrics logged as scalars (inspection/tab_format.py's
                                    TAB_METRICS), per head and step
    text  (POST run, text[, knocked_out=L:H,...][, step])
                                    JSON: the model of the run's checkpoint reads the text, with
                                    those heads knocked out (attention_tab/live_model.py)
    repeated?run=R[&n=N&seed=S&knocked_out=L:H,...&step=S]
                                    JSON: the same for n random tokens (32, or fewer where the model
                                    reads less), then the same n again, with each head's induction
                                    score and the mean loss over each copy
    lens  (POST run, source=text&text=... or source=repeated[&n][&seed][, knocked_out][, step])
                                    JSON: the logit lens on the tokens the text or repeated route
                                    reads (attention_tab/tools.py)
    attribution  (POST as lens, and position[, token][, other])
                                    JSON: each head's, MLP's and embedding's direct share of the logit
                                    of the token after position (or of token, less other's), and
                                    what knocking out each head alone costs it
    patch  (POST run, clean, corrupted, token[, other][, step])
                                    JSON: how much of the logit difference token - other at the last
                                    token each head, and the residual stream at each layer and
                                    position, restores when patched from the clean prompt into the
                                    corrupted one
    patch_example  (POST run[, step])
                                    JSON: the prompts and tokens the patching tool starts from, in
                                    words the run's tokenizer reads (inspection/name_swap.py); null,
                                    with `why`, for a tokenizer that has no such words

The routes that run a model run the run's ckpt_best.pt (else ckpt_last.pt), or with step the
checkpoint it kept at that step. A bad run, tag, step, text, n, seed, head, position or token gets a 400
or 404 with one line saying what is wrong, quoting at most the start of what was sent. The runs' models run on --attention_tab_device
(cpu) in --attention_tab_dtype (fp32); they stay cached up to --attention_tab_cache_mb.
"""

import json
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import numpy as np
from tensorboard import errors, plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider
from tensorboard.plugins import base_plugin
from tensorboard.plugins.scalar import metadata as scalar_metadata
from werkzeug import wrappers

from attention_tab.run_folders import init_from, kept_checkpoint_steps, logdir_roots, run_folder
from inspection.tab_format import PLUGIN_NAME, WEIGHTS_TAG, head_scalar_of, read_probe
from model_io.run_files import is_trained
from user_error import UserError, quoted

STATIC = Path(__file__).parent / "static"
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css"}
HEAD_PAIR = re.compile(r"([0-9]{1,9}):([0-9]{1,9})")  # knocked_out=1:0,2:3
TAB_DEVICE_TYPES = ("cpu", "cuda", "mps")  # runtime/devices.py's DEVICE_TYPES, written without torch (a test keeps them equal)
DEVICE = re.compile(rf"({'|'.join(TAB_DEVICE_TYPES)})(:[0-9]+)?")
DTYPES = ("fp32", "bf16", "fp16")  # runtime.precision.WEIGHT_DTYPES' names: torch is not imported at TensorBoard's start


class AttentionLoader(base_plugin.TBLoader):
    """Keeps every logged step of the tab's data: TensorBoard otherwise keeps a random 10 tensors
    per tag, and the step slider would skip most of training. `--samples_per_plugin
    tinyattn_attention=N` still wins."""

    def define_flags(self, parser) -> None:
        group = parser.add_argument_group(PLUGIN_NAME)
        group.add_argument("--attention_tab_device", default="cpu", help="where the Attention tab's text box runs "
                           "a run's model: cpu (the default), cuda, cuda:1, mps")
        group.add_argument("--attention_tab_dtype", default="fp32", choices=DTYPES, help="the "
                           "precision of the Attention tab's models: fp32 (the default: the tools' sums are exact "
                           "to 1e-4 there), or bf16 and fp16, half the bytes and, on a GPU or a CPU with native "
                           "bf16, about twice the speed, with numbers to two or three digits")
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
        self.models = None  # live_model.ModelCache, made on the first request that runs a model

    def get_plugin_apps(self) -> dict[str, Callable[..., wrappers.Response]]:
        return {"/static/*": self.serve_static, "/settings": self.serve_settings, "/runs": self.serve_runs,
                "/weights": self.serve_weights, "/metrics": self.serve_metrics, "/text": self.serve_text,
                "/repeated": self.serve_repeated, "/lens": self.serve_lens, "/attribution": self.serve_attribution,
                "/patch": self.serve_patch, "/patch_example": self.serve_patch_example}

    def is_active(self) -> bool:
        return False  # the frontend asks the data provider (data_plugin_names) instead

    def data_plugin_names(self) -> tuple[str, ...]:
        return (PLUGIN_NAME,)

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/static/index.js", tab_name="Attention")

    @wrappers.Request.application
    def serve_static(self, request: wrappers.Request) -> wrappers.Response:
        name = request.path.rsplit("/static/", 1)[-1]
        path = STATIC / name
        if "/" in name or path.suffix not in STATIC_TYPES or not is_file(path):
            raise errors.NotFoundError(f"no file {quoted(name)} in the Attention tab's static files")
        return http_util.Respond(request, path.read_bytes(), STATIC_TYPES[path.suffix])

    @wrappers.Request.application
    def serve_settings(self, request: wrappers.Request) -> wrappers.Response:
        # The heatmaps' module (Pillow, the tokenizers) loads when a page first opens, not at TensorBoard's start.
        from attention_tab.page_settings import page_settings

        return json_response(request, page_settings())

    @wrappers.Request.application
    def serve_runs(self, request: wrappers.Request) -> wrappers.Response:
        ctx, experiment = request_context(request)
        listing = self.data.list_tensors(ctx, experiment_id=experiment, plugin_name=PLUGIN_NAME)
        scalars = self.data.list_scalars(ctx, experiment_id=experiment, plugin_name=scalar_metadata.PLUGIN_NAME)
        runs = []
        for run, tags in sorted(listing.items()):
            trained_steps = max((series.max_step for series in scalars.get(run, {}).values()), default=0)
            trained, kept = is_trained(trained_steps, self.init_from(run)), self.kept_checkpoint_steps(run)
            for tag, series in sorted(tags.items()):
                steps = self.steps(ctx, experiment, run, tag, series)
                shape = next(iter(steps.values())).shape
                labels, window = read_probe(series.plugin_content)
                runs.append({"run": run, "tag": tag, "steps": sorted(steps), "shape": list(shape), "labels": labels,
                             "window": window, "trained": trained, "kept": kept})
        return json_response(request, {"runs": runs})

    @wrappers.Request.application
    def serve_weights(self, request: wrappers.Request) -> wrappers.Response:
        ctx, experiment = request_context(request)
        run, tag = required(request, "run"), request.args.get("tag", WEIGHTS_TAG)
        step = integer(required(request, "step"), "step")
        steps = self.steps(ctx, experiment, run, tag, self.series(ctx, experiment, run, tag))
        if step not in steps:
            raise errors.NotFoundError(f"run {quoted(run)} logged no attention at step {step}; its steps are {sorted(steps)}")
        body = steps[step].astype("<f2").tobytes()
        return http_util.Respond(request, body, "application/octet-stream")

    @wrappers.Request.application
    def serve_metrics(self, request: wrappers.Request) -> wrappers.Response:
        """{metric: {"steps": [...], "values": [[[per head] per layer] per step]}}."""
        ctx, experiment = request_context(request)
        run = required(request, "run")
        scalar_tags = self.data.list_scalars(ctx, experiment_id=experiment, plugin_name=scalar_metadata.PLUGIN_NAME,
                                             run_tag_filter=provider.RunTagFilter(runs=[run])).get(run)
        if scalar_tags is None:
            if run not in {r.run_name for r in self.data.list_runs(ctx, experiment_id=experiment)}:
                raise errors.NotFoundError(f"no run {quoted(run)}; the runs are those /runs lists")
            scalar_tags = {}  # a run that logged no scalars
        heads = {tag: where for tag in scalar_tags if (where := head_scalar_of(tag))}
        series = self.data.read_scalars(ctx, experiment_id=experiment, plugin_name=scalar_metadata.PLUGIN_NAME,
                                        downsample=100_000, run_tag_filter=provider.RunTagFilter([run], list(heads)))
        return json_response(request, head_metric_table(heads, series.get(run, {})))

    @wrappers.Request.application
    def serve_text(self, request: wrappers.Request) -> wrappers.Response:
        """The run's model reads the text: live_model.answer's JSON."""
        form = post_form(request, "text", "run, text, knocked_out, step")
        run, step, text = form_field(form, "run"), kept_step(form), form_field(form, "text")
        knocked_out = head_pairs(form.get("knocked_out", ""))

        def answer(loaded):
            from attention_tab.live_model import text_answer
            return text_answer(run, loaded, text, knocked_out)

        return self.run_model(request, run, step, answer)

    @wrappers.Request.application
    def serve_repeated(self, request: wrappers.Request) -> wrappers.Response:
        """The run's model reads n random tokens twice: live_model.repeated_answer's JSON."""
        run, step, (n, seed) = required(request, "run"), kept_step(request.args), repeated_fields(request.args)
        knocked_out = head_pairs(request.args.get("knocked_out", ""))

        def answer(loaded):
            from attention_tab.live_model import repeated_tokens_answer
            return repeated_tokens_answer(run, loaded, n, seed, knocked_out)

        return self.run_model(request, run, step, answer)

    @wrappers.Request.application
    def serve_lens(self, request: wrappers.Request) -> wrappers.Response:
        """The logit lens on the text or the repeated tokens: tools.lens_answer's JSON."""
        form = post_form(request, "lens", "run, source (text: text; repeated: n, seed), knocked_out, step")
        run, step, source = form_field(form, "run"), kept_step(form), token_source(form)
        knocked_out = head_pairs(form.get("knocked_out", ""))

        def answer(loaded):
            from attention_tab.tools import lens_answer
            return lens_answer(run, loaded, source, knocked_out)

        return self.run_model(request, run, step, answer)

    @wrappers.Request.application
    def serve_attribution(self, request: wrappers.Request) -> wrappers.Response:
        """Who wrote a logit, at one query of the text or the repeated tokens: tools.attribution_answer's JSON."""
        form = post_form(request, "attribution", "run, source (text: text; repeated: n, seed), position, token, "
                         "other, knocked_out, step")
        run, step, source = form_field(form, "run"), kept_step(form), token_source(form)
        position, knocked_out = integer(form_field(form, "position"), "position"), head_pairs(form.get("knocked_out", ""))
        token, other = form.get("token", ""), form.get("other", "")

        def answer(loaded):
            from attention_tab.tools import attribution_answer
            return attribution_answer(run, loaded, source, knocked_out, position, token, other)

        return self.run_model(request, run, step, answer)

    @wrappers.Request.application
    def serve_patch(self, request: wrappers.Request) -> wrappers.Response:
        """Activation patching from a clean prompt into a corrupted one: tools.patch_answer's JSON."""
        form = post_form(request, "patch", "run, clean, corrupted, token, other, step")
        run, step, clean, corrupted = form_field(form, "run"), kept_step(form), form_field(form, "clean"), form_field(form, "corrupted")
        token, other = form_field(form, "token"), form.get("other", "")

        def answer(loaded):
            from attention_tab.tools import patch_answer
            return patch_answer(run, loaded, clean, corrupted, token, other)

        return self.run_model(request, run, step, answer)

    @wrappers.Request.application
    def serve_patch_example(self, request: wrappers.Request) -> wrappers.Response:
        """The patching tool's first prompts for the run: tools.patch_example's JSON."""
        form = post_form(request, "patch example", "run, step")
        run, step = form_field(form, "run"), kept_step(form)

        def answer(loaded):
            from attention_tab.tools import patch_example
            return patch_example(run, loaded)

        return self.run_model(request, run, step, answer)

    def run_model(self, request: wrappers.Request, run: str, step: int | None,
                  answer: Callable[[Any], dict]) -> wrappers.Response:
        """answer(the model of the run's checkpoint, or of the one it kept at step): JSON, or a 400
        with the one line of its UserError."""
        ctx, experiment = request_context(request)
        if run not in {r.run_name for r in self.data.list_runs(ctx, experiment_id=experiment)}:
            raise errors.InvalidArgumentError(f"no run {quoted(run)}; the runs are those /runs lists")
        from attention_tab import live_model  # torch: loaded on the first such request, not at TensorBoard's start

        if self.models is None:
            self.models = live_model.ModelCache.in_tensorboard(self.flags)
        try:
            return json_response(request, self.models.ask(run_folder(run, self.roots()), run, step, answer))
        except UserError as err:
            raise errors.InvalidArgumentError(str(err)) from None

    def roots(self) -> dict[str, str | None]:
        return logdir_roots(self.flags.logdir, self.flags.logdir_spec)

    def kept_checkpoint_steps(self, run: str) -> list[int]:
        """The steps of the checkpoints the run kept (run_folders.kept_checkpoint_steps); none where it has no folder here."""
        try:
            return kept_checkpoint_steps(run_folder(run, self.roots()))
        except UserError:
            return []

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


def head_metric_table(heads: dict[str, tuple[str, int, int]], series: dict[str, list[provider.ScalarDatum]]) -> dict:
    """Per-head scalars, {tag: (metric, layer, head)} (tab_format.head_scalar_of) -> {metric: {"steps", "values"
    (step, layer, head)}}."""
    table: dict[str, dict[int, dict[tuple[int, int], float]]] = {}
    for tag, (metric, layer, head) in heads.items():
        for datum in series.get(tag, []):
            value = datum.value if math.isfinite(datum.value) else None  # a model gone non-finite
            table.setdefault(metric, {}).setdefault(datum.step, {})[(layer, head)] = value
    result = {}
    for metric, by_step in table.items():
        n_layer = 1 + max(layer for values in by_step.values() for layer, _ in values)
        n_head = 1 + max(head for values in by_step.values() for _, head in values)
        steps = sorted(by_step)
        result[metric] = {"steps": steps, "values": [
            [[by_step[step].get((layer, head)) for head in range(n_head)] for layer in range(n_layer)] for step in steps
        ]}
    return result


def is_file(path: Path) -> bool:
    """path.is_file(), False too for a name the file system refuses (a 10,000-character one: ENAMETOOLONG)."""
    try:
        return path.is_file()
    except OSError:
        return False


def request_context(request: wrappers.Request) -> tuple:
    return plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)


def required(request: wrappers.Request, name: str) -> str:
    value = request.args.get(name)
    if value is None:
        raise errors.InvalidArgumentError(f"missing query parameter {name!r}")
    return value


FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")  # what a browser's form sends


def post_form(request: wrappers.Request, route: str, fields: str) -> Mapping[str, str]:
    """The form of a POST; a 400 saying what to send for anything else: a GET, another body (JSON),
    or a form whose bytes are not UTF-8, which would read as a form without fields."""
    if request.method != "POST" or request.mimetype not in FORM_TYPES:
        sent = f", not {request.mimetype}" if request.method == "POST" and request.mimetype else ""
        raise errors.InvalidArgumentError(f"send the {route} as a POST form{sent}: {fields}")
    if request.mimetype == FORM_TYPES[0]:
        body = request.get_data(cache=True)  # cached: the form below is parsed from it
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as error:
            raise errors.InvalidArgumentError(f"the form's byte {error.start} is not UTF-8: percent-encode the text as "
                                              "UTF-8 (%C3%A9 for é), as a browser's form does") from None
        try:  # werkzeug keeps the escapes of percent-encoded bytes that are not UTF-8: %FF%FE read as that text
            parse_qsl(text, keep_blank_values=True, errors="strict")
        except UnicodeDecodeError:
            raise errors.InvalidArgumentError("the form's percent-encoded bytes are not UTF-8: percent-encode the text as "
                                              "UTF-8 (%C3%A9 for é), as a browser's form does") from None
    return request.form


def form_field(form: Mapping[str, str], name: str) -> str:
    value = form.get(name)
    if value is None:
        raise errors.InvalidArgumentError(f"missing form field {name!r}")
    return value


def kept_step(values: Mapping[str, str]) -> int | None:
    """step: a step at which the run kept a checkpoint; None (absent or empty): its best, else last."""
    step = values.get("step", "")
    return integer(step, "step") if step else None


def repeated_fields(values: Mapping[str, str]) -> tuple[int | None, int]:
    """(n, seed) of the repeated tokens: n None (absent or empty) for the route's default, seed 0."""
    n = values.get("n", "")
    return (integer(n, "n") if n else None), integer(values.get("seed", "") or "0", "seed")


def token_source(values: Mapping[str, str]) -> dict:
    """What a tool reads: {"text": ...} (source=text), or {"n", "seed"} of the repeated tokens (source=repeated)."""
    source = values.get("source", "")
    if source == "text":
        return {"text": form_field(values, "text")}
    if source == "repeated":
        n, seed = repeated_fields(values)
        return {"n": n, "seed": seed}
    raise errors.InvalidArgumentError(f"source is text (with text) or repeated (with n and seed), not {quoted(source)}")


def head_pairs(value: str) -> list[tuple[int, int]]:
    """"1:0,2:3" -> [(1, 0), (2, 3)]: (layer, head) pairs."""
    pairs = [HEAD_PAIR.fullmatch(item.strip()) for item in value.split(",") if item.strip()]
    if not all(pairs):
        raise errors.InvalidArgumentError(f"knocked_out takes layer:head pairs, e.g. 1:0,2:3; not {quoted(value)}")
    return [(int(pair[1]), int(pair[2])) for pair in pairs]


def integer(value: str, name: str) -> int:
    if not re.fullmatch(r"-?[0-9]+", value):  # ASCII digits alone: Python's \d also takes ３ and ٣
        raise errors.InvalidArgumentError(f"{name} must be a whole number, not {quoted(value)}")
    if len(value.lstrip("-")) > 100:  # past any step, n or seed (each caller says its range), and int() of 5,000 digits refuses
        raise errors.InvalidArgumentError(f"{name}={quoted(value)} is out of range: it has {len(value.lstrip('-')):,} digits")
    return int(value)


def json_response(request: wrappers.Request, value: object) -> wrappers.Response:
    return http_util.Respond(request, json.dumps(value, allow_nan=False), "application/json")
