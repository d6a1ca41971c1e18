"""The Attention tab's server side: its routes on a real TensorBoard server (the `tensorboard`
entry point `make setup` installs) serving a real tiny run, and the induction circuit built by
hand saved as a run's checkpoint, under both of TensorBoard's loaders: --logdir (what the
training log prints; the Rust data server) and --logdir_spec (make tensorboard, through the
`tensorboard` command it runs, from a folder outside the project)."""

import base64
import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tensorboard.util.tensor_util import make_ndarray

from attention_tab.browser import attention_runs, tensorboard_server
from attention_tab.page_settings import page_settings
from data.tokenizer import special_ids
from inspection.head_metrics import induction_probe
from inspection.heatmap import readable_token
from inspection.logit_attribution import logit_attribution
from inspection.logit_lens import lens_summary
from inspection.name_swap import name_swap, one_token_names
from inspection.patching import SMALL_GAP, knock_out_effects, logit_difference, patch_heads, patch_residual
from inspection.tab_format import PLUGIN_NAME, TAB_METRICS, WEIGHTS_TAG, head_scalar_tag
from model_io.checkpoint import Checkpoint
from model_io.run_files import BEST, kept_checkpoint_path
from tests.helpers import (
    CIRCUIT_N,
    CIRCUIT_SEED,
    CIRCUIT_TOKENIZER,
    INDUCTION_HEAD,
    PREVIOUS_TOKEN_HEAD,
    circuit_run,
    made_up_attention,
    read_events,
    whole_tiny_run,
    young_run,
)
from training.tensorboard_log import RunLogger

pytestmark = pytest.mark.slow  # every test asks a TensorBoard server started on the shared trained run

PLUGIN = f"/data/plugin/{PLUGIN_NAME}"


def get(url: str, form: dict[str, str] | None = None) -> tuple[int, str, bytes]:
    """(status, content type, body) of a GET, or a POST of form, errors included."""
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    try:
        with urllib.request.urlopen(url, data=data) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read()


# The tiny run whole, "young" beside it, and the circuit: tests/helpers.py's builders.
LOGDIR = [whole_tiny_run, young_run, circuit_run]


@pytest.fixture(scope="module", params=["logdir", "logdir_spec"])
def served(request, logdir):
    """(base URL, the run's name there) for the tiny run, under one of the two loaders."""
    if request.param == "logdir":
        args, name = ["--logdir", str(logdir)], "run"
    else:
        args, name = ["--logdir_spec", f"outputs:{logdir}"], "outputs/run"
    with tensorboard_server(*args, console_script=request.param == "logdir_spec") as base:
        attention_runs(base)
        deadline = time.monotonic() + 30
        while len(json.loads(get(f"{base}/data/runs")[2])) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)  # "young" and "circuit" too
        assert len(json.loads(get(f"{base}/data/runs")[2])) == 3, "TensorBoard listed fewer than 3 runs in 30 s"
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


def test_the_settings_route_hands_the_page_the_constants_python_holds(served):
    base, _ = served
    status, kind, body = get(f"{base}{PLUGIN}/settings")
    assert (status, kind) == (200, "application/json")
    assert json.loads(body) == page_settings()  # what it holds: tests/test_tab_format.py


def test_runs_lists_the_logged_steps_shape_probe_labels_and_kept_checkpoints(served, trained_run, logdir):
    base, name = served
    events = read_events(trained_run)
    (run,) = attention_runs(base)
    labels = json.loads(events.SummaryMetadata(WEIGHTS_TAG).plugin_data.content)["labels"]
    assert run == {"run": name, "tag": WEIGHTS_TAG, "steps": [0, 10, 20], "shape": [2, 2, 24, 24], "labels": labels,
                   "window": None, "trained": False, "kept": [10]}  # 20 steps: a test run (model_io/run_files.py, MIN_STEPS); the fixture kept step 10


def test_each_steps_weights_come_back_byte_for_byte(served, trained_run):
    base, name = served
    for event in read_events(trained_run).Tensors(WEIGHTS_TAG):
        status, kind, body = get(f"{base}{PLUGIN}/weights?run={name}&step={event.step}")
        assert (status, kind) == (200, "application/octet-stream")
        sent = np.frombuffer(body, dtype="<f2").reshape(2, 2, 24, 24)
        assert sent.tobytes() == make_ndarray(event.tensor_proto).astype("<f2").tobytes()


def test_metrics_are_the_logged_head_scalars_per_step_layer_and_head(served, trained_run):
    base, name = served
    events = read_events(trained_run)
    metrics = json.loads(get(f"{base}{PLUGIN}/metrics?run={name}")[2])
    assert set(metrics) == set(TAB_METRICS)  # the run logged each metric the tab shows
    for metric, table in metrics.items():
        assert table["steps"] == [0, 10, 20]
        for i, step in enumerate(table["steps"]):
            for layer, head in np.ndindex(2, 2):
                scalar = events.Scalars(head_scalar_tag(TAB_METRICS[metric].prefix, layer, head))[i]
                assert scalar.step == step and table["values"][i][layer][head] == pytest.approx(scalar.value, rel=1e-6)


@pytest.mark.parametrize("query, status, says", [
    ("weights?run=nope&step=0", 404, "no attention data for run 'nope'"),
    ("weights?run={run}&step=7", 404, "logged no attention at step 7; its steps are [0, 10, 20]"),
    ("weights?run={run}&step=ten", 400, "step must be a whole number, not 'ten'"),
    ("weights?run={run}&step=%EF%BC%91", 400, "step must be a whole number, not '\uff11'"),  # a full-width 1: was step 1
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


def test_runs_say_which_count_as_trained_100_steps_or_from_pretrained_weights_and_each_models_window(tmp_path):
    """The tab opens the newest such run first (tests/test_attention_tab_browser.py), as run=latest picks."""
    for name, steps, window in (("short", 1, None), ("long", 150, 3), ("pretrained", 0, None)):
        logger = RunLogger(tmp_path / name)
        logger.scalars(steps, {"loss/train": 3.0})
        logger.scalars(0, {"a/at_step_0": 1.0, "z/at_step_0": 1.0})  # the furthest step of any tag counts
        logger.attention_weights(steps, weights_at(0), list("abcde"), window)
        logger.close()
    (tmp_path / "pretrained" / ".hydra").mkdir()
    (tmp_path / "pretrained" / ".hydra" / "config.yaml").write_text("init_from: gpt2\ntrain:\n  max_steps: 0\n")
    with tensorboard_server("--logdir", str(tmp_path)) as base:
        runs = attention_runs(base, lambda runs: len(runs) == 3)
    assert {run["run"]: run["trained"] for run in runs} == {"short": False, "long": True, "pretrained": True}
    assert {run["run"]: run["window"] for run in runs} == {"short": None, "long": 3, "pretrained": None}


SENTENCE = "Once upon a time, a girl named Alice met a dog. Alice"


def sibling(name: str, run: str) -> str:
    """The name TensorBoard gives another run of the logdir, under the same loader."""
    return name.removesuffix("run") + run


@pytest.fixture(scope="module")
def run_model(trained_run):
    """The tiny run's best checkpoint as a model and its tokenizer, loaded here, not by the tab."""
    model, tokenizer = Checkpoint.load(trained_run / "ckpt_best.pt").build_model()
    return model.eval(), tokenizer


def read_text(base: str, form: dict[str, str]) -> dict:
    status, kind, body = get(f"{base}{PLUGIN}/text", form)
    assert (status, kind) == (200, "application/json"), body
    return json.loads(body)


def expected_numbers(model, tokenizer, idx: torch.Tensor) -> tuple[list, np.ndarray, np.ndarray, np.ndarray]:
    """The top 5 next tokens (labels) and probabilities, the losses, the float16 weights of the model as it is."""
    with torch.no_grad():
        logits = model(idx)[0][0]  # (T, vocab_size)
    probs, top = logits.softmax(-1).topk(5, dim=-1)  # (T, 5) each
    labels = [[readable_token(piece) for piece in tokenizer.token_strings(row)] for row in top.tolist()]
    loss = F.cross_entropy(logits[:-1], idx[0, 1:], reduction="none")  # (T - 1,)
    return labels, probs.numpy(), loss.numpy(), model.attention_weights(idx)[:, 0].half().numpy()


def sent_weights(answer: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(answer["weights"]), "<f2").reshape(answer["shape"])


def test_your_text_comes_back_with_the_numbers_of_the_runs_best_checkpoint(served, run_model, trained_run):
    base, name = served
    model, tokenizer = run_model
    answer = read_text(base, {"run": name, "text": SENTENCE})
    idx = torch.tensor([[tokenizer.eot_id, *tokenizer.encode(SENTENCE)]])  # (1, T)
    T = idx.shape[1]
    assert (answer["run"], answer["checkpoint"], answer["step"]) == (name, "ckpt_best.pt", Checkpoint.load(trained_run / "ckpt_best.pt").step)
    assert answer["shape"] == [2, 2, T, T] and answer["knocked_out"] == [] and answer["intact"] is None
    assert answer["labels"] == [readable_token(piece) for piece in tokenizer.token_strings(idx[0].tolist())]
    labels, probs, loss, weights = expected_numbers(model, tokenizer, idx)
    assert answer["next"]["tokens"] == labels
    np.testing.assert_allclose(answer["next"]["probs"], probs, rtol=1e-5, atol=1e-6)  # the tab takes attention's manual path
    np.testing.assert_allclose(answer["next"]["loss"], loss, rtol=1e-5)
    np.testing.assert_allclose(sent_weights(answer), weights, atol=1e-3)  # float16 of weights equal to ~1e-6


def test_your_text_with_heads_knocked_out_has_the_knocked_out_models_numbers_beside_the_intact_ones(served, run_model):
    base, name = served
    model, tokenizer = run_model
    answer = read_text(base, {"run": name, "text": SENTENCE, "knocked_out": "1:0, 0:1"})
    idx = torch.tensor([[tokenizer.eot_id, *tokenizer.encode(SENTENCE)]])
    with model.hooks(model.knock_out({(1, 0), (0, 1)})):
        labels, probs, loss, weights = expected_numbers(model, tokenizer, idx)
    intact_labels, intact_probs, intact_loss, _ = expected_numbers(model, tokenizer, idx)
    assert answer["knocked_out"] == [[0, 1], [1, 0]]
    assert answer["next"]["tokens"] == labels and answer["intact"]["tokens"] == intact_labels
    np.testing.assert_allclose(answer["next"]["probs"], probs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(answer["next"]["loss"], loss, rtol=1e-5)
    np.testing.assert_allclose(answer["intact"]["probs"], intact_probs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(answer["intact"]["loss"], intact_loss, rtol=1e-5)
    with torch.no_grad(), model.hooks(model.knock_out({(1, 0), (0, 1)})):
        top = model(idx)[0][0].topk(5, dim=-1).indices  # (T, 5) the knocked-out model's likeliest
    with torch.no_grad():
        intact_probs_of_top = model(idx)[0][0].softmax(-1).gather(1, top)  # (T, 5)
    np.testing.assert_allclose(answer["intact"]["probs_of_top"], intact_probs_of_top, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sent_weights(answer), weights, atol=1e-3)
    assert np.abs(np.array(answer["next"]["loss"]) - intact_loss).max() > 1e-3  # the heads mattered


@pytest.mark.parametrize("form, says", [
    ({"run": "{run}", "text": ""}, "the text is empty: type a sentence"),
    ({"run": "{run}", "text": SENTENCE * 3}, "the text is too long: "),
    ({"run": "{run}", "text": "x" * 100_000}, "the text is too long: 100,000 characters"),
    ({"run": "nope", "text": "Hi"}, "no run 'nope'; the runs are those /runs lists"),
    ({"run": "../run", "text": "Hi"}, "no run '../run'"),
    ({"run": "{young}", "text": "Hi"}, "has no checkpoint yet (ckpt_best.pt or ckpt_last.pt, or one it keeps)"),
    ({"run": "{run}", "text": "Hi", "knocked_out": "1-0"}, "knocked_out takes layer:head pairs, e.g. 1:0,2:3; not '1-0'"),
    ({"run": "{run}", "text": "Hi", "knocked_out": "2:0"}, "no layer 2 (in 2:0): this model has layers 0 to 1"),
    ({"run": "{run}"}, "missing form field 'text'"),
    (None, "send the text as a POST form: run, text, knocked_out"),
])
def test_a_bad_text_gets_a_400_with_one_line_and_the_server_goes_on(served, form, says):
    base, name = served
    if form is not None:
        form = {key: value.format(run=name, young=sibling(name, "young")) for key, value in form.items()}
    code, _, body = get(f"{base}{PLUGIN}/text?run={name}&text=Hi", form)
    text = body.decode()
    assert code == 400 and says in text
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1
    assert read_text(base, {"run": name, "text": "Hi"})["labels"][0] == "<eot>"


def test_a_text_posted_as_json_or_as_bytes_that_are_not_utf_8_gets_a_400_that_says_so(served):
    # Both read as a form without fields: "missing form field 'run'", a field that was sent.
    base, name = served
    for body, content_type, says in ((json.dumps({"run": name, "text": "Hi"}).encode(), "application/json",
                                      "send the text as a POST form, not application/json: run, text, knocked_out"),
                                     (f"run={name}&text=caf\xe9".encode("latin-1"), "application/x-www-form-urlencoded",
                                      f"the form's byte {len(name) + 13} is not UTF-8: percent-encode the text as UTF-8"),
                                     (f"run={name}&text=%ff%fe".encode(), "application/x-www-form-urlencoded",  # read as "%FF%FE"
                                      "the form's percent-encoded bytes are not UTF-8: percent-encode the text as UTF-8")):
        request = urllib.request.Request(f"{base}{PLUGIN}/text", data=body, headers={"Content-Type": content_type})
        try:
            urllib.request.urlopen(request)
            code, text = 200, ""
        except urllib.error.HTTPError as error:
            code, text = error.code, error.read().decode()
        assert code == 400 and says in text and len(text.strip().splitlines()) == 1, text
    assert read_text(base, {"run": name, "text": "caf\xe9"})["labels"][0] == "<eot>"  # percent-encoded, as urlencode does


def test_an_error_quotes_only_the_start_of_a_5000_character_run_name(served):
    base, _ = served
    long_name = "r" * 5000
    for route, form in ((f"weights?run={long_name}&step=0", None), (f"metrics?run={long_name}", None),
                        ("text", {"run": long_name, "text": "Hi"}), (f"repeated?run={long_name}&n=4", None)):
        code, _, body = get(f"{base}{PLUGIN}/{route}", form)
        text = body.decode()
        assert code in (400, 404) and f"'{'r' * 80}'... (5,000 characters)" in text, route
        assert len(text) < 300, route


N, DISTINCT = CIRCUIT_N, CIRCUIT_SEED


def read_repeated(base: str, run: str, knocked_out: str = "", n: int = N, seed: int = DISTINCT, step: str = "") -> dict:
    status, kind, body = get(f"{base}{PLUGIN}/repeated?run={run}&n={n}&seed={seed}&knocked_out={knocked_out}&step={step}")
    assert (status, kind) == (200, "application/json"), body
    return json.loads(body)


@pytest.fixture(scope="module")
def circuit(logdir):
    """The hand-built circuit as the test loads it, not the tab: (model, the ids it reads)."""
    model, tokenizer = Checkpoint.load(logdir / "circuit" / BEST).build_model()
    ids = [tokenizer.eot_id, *induction_probe(tokenizer.vocab_size, N, DISTINCT, avoid=special_ids(tokenizer))]
    return model.eval(), torch.tensor([ids])  # (1, 2N + 1)


def test_repeated_tokens_on_the_hand_built_circuit_score_above_0_9_and_the_second_copy_loss_collapses(served, circuit):
    base, name = served
    model, idx = circuit
    answer = read_repeated(base, sibling(name, "circuit"))
    assert (answer["n"], answer["seed"], answer["shape"]) == (N, DISTINCT, [2, 2, 2 * N + 1, 2 * N + 1])
    assert answer["labels"][0] == "<eot>" and answer["labels"][1 : N + 1] == answer["labels"][N + 1 :]
    induction = np.array(answer["induction"])  # (L, H)
    weights = model.attention_weights(idx)[:, 0]  # (L, H, 2N + 1, 2N + 1)
    i = torch.arange(N)  # the second copy's token i (at N + 1 + i) first came at 1 + i, followed by 2 + i
    np.testing.assert_allclose(induction, weights[:, :, N + 1 + i, 2 + i].mean(-1), atol=1e-6)
    assert induction[INDUCTION_HEAD] >= 0.9
    assert np.delete(induction.flatten(), 2).max() < 0.1  # the other three heads
    with torch.no_grad():
        loss = F.cross_entropy(model(idx)[0][0, :-1], idx[0, 1:], reduction="none")  # (2N,): the model's own
    np.testing.assert_allclose(answer["next"]["loss"], loss, rtol=1e-4, atol=1e-5)
    first, second = answer["copy_loss"]["first"], answer["copy_loss"]["second"]
    assert first > math.log(64) and second < 0.1  # nats per token: a blur copied over the first copy, the token over the second
    assert max(answer["next"]["loss"][N + 1 :]) < 0.1  # every token of the second copy after its first
    np.testing.assert_allclose(sent_weights(answer), weights.half().numpy(), atol=1e-3)


def test_without_n_the_tab_reads_32_tokens_twice_or_as_many_as_the_model_reads(served):
    base, name = served
    answer = json.loads(get(f"{base}{PLUGIN}/repeated?run={sibling(name, 'circuit')}")[2])
    assert (answer["n"], answer["seed"]) == (19, 0)  # block_size 40: <eot> and 19 tokens twice
    answer = json.loads(get(f"{base}{PLUGIN}/repeated?run={name}")[2])
    assert answer["n"] == 15  # the tiny run's block_size is 32


@pytest.mark.parametrize("head", [PREVIOUS_TOKEN_HEAD, INDUCTION_HEAD])
def test_knocking_out_either_head_of_the_circuit_brings_the_second_copy_loss_back(served, head):
    base, name = served
    intact = read_repeated(base, sibling(name, "circuit"))
    out = read_repeated(base, sibling(name, "circuit"), knocked_out="{}:{}".format(*head))
    assert out["knocked_out"] == [list(head)] and out["intact_copy_loss"] == intact["copy_loss"]
    assert out["intact"]["loss"] == intact["next"]["loss"]  # the curve the tab draws beside the knocked-out one
    assert out["copy_loss"]["second"] > intact["copy_loss"]["second"] + 3.0
    if head == INDUCTION_HEAD:  # nothing copied: every logit 0
        assert out["copy_loss"]["second"] == pytest.approx(math.log(64), abs=1e-3)
        assert np.array(out["induction"])[INDUCTION_HEAD] >= 0.9  # knocked out, it would still look there
    unused = read_repeated(base, sibling(name, "circuit"), knocked_out="0:1")  # a head that writes nothing
    assert unused["copy_loss"]["second"] == pytest.approx(intact["copy_loss"]["second"], abs=1e-6)


@pytest.mark.parametrize("query, says", [
    ("n=1", "n=1 is out of range: give 2 to 19 random tokens (this model reads at most 40 tokens, <eot> and the n tokens twice)"),
    ("n=20", "n=20 is out of range: give 2 to 19 random tokens"),
    ("n=sixteen", "n must be a whole number, not 'sixteen'"),
    ("n=" + "9" * 5000, "n='" + "9" * 80 + "'... (5,000 characters) is out of range: it has 5,000 digits"),
    ("n=4&seed=" + "9" * 20, "seed=" + "9" * 20 + " is out of range: give a whole number from 0 to 2147483647"),
    ("n=4&seed=-1", "seed=-1 is out of range: give a whole number from 0 to 2147483647"),
    ("n=4&knocked_out=2:0", "no layer 2 (in 2:0): this model has layers 0 to 1"),
])
def test_a_bad_n_seed_or_head_gets_a_400_with_one_line(served, query, says):
    base, name = served
    code, _, body = get(f"{base}{PLUGIN}/repeated?run={sibling(name, 'circuit')}&{query}")
    text = body.decode()
    assert code == 400 and says in text
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1


def ask(base: str, route: str, form: dict[str, str]) -> dict:
    status, kind, body = get(f"{base}{PLUGIN}/{route}", form)
    assert (status, kind) == (200, "application/json"), body
    return json.loads(body)


def test_a_step_reads_the_checkpoint_the_run_kept_there_and_no_step_its_best(served, trained_run):
    base, name = served
    kept, best = (read_text(base, {"run": name, "text": "Hi", **step}) for step in ({"step": "10"}, {}))
    assert (kept["checkpoint"], kept["step"]) == ("step_000010.pt", 10)
    assert (best["checkpoint"], best["step"]) == ("ckpt_best.pt", Checkpoint.load(trained_run / BEST).step)


REPEATED = {"source": "repeated", "n": str(N), "seed": str(DISTINCT)}


def test_the_lens_route_gives_lens_summarys_numbers_with_the_heads_knocked_out_that_the_views_show(served, circuit):
    base, name = served
    model, idx = circuit
    for knocked_out in ("", "1:0"):
        answer = ask(base, "lens", {"run": sibling(name, "circuit"), **REPEATED, "knocked_out": knocked_out})
        with model.hooks(model.knock_out({INDUCTION_HEAD} if knocked_out else set())):
            lens = lens_summary(model, idx)
        np.testing.assert_allclose(answer["next_log_prob"], lens.next_log_prob, atol=1e-5)
        assert answer["next_rank"] == lens.next_rank.tolist() and answer["vocab_size"] == 64
        np.testing.assert_allclose(answer["top"]["probs"], lens.top_probs, atol=1e-6)
        assert answer["top"]["tokens"][1][N + 4] == CIRCUIT_TOKENIZER.token_strings(lens.top_ids[1, N + 4].tolist())
    second = np.array(ask(base, "lens", {"run": sibling(name, "circuit"), **REPEATED})["next_log_prob"])[:, N + 1 :]
    assert (second[0] < -4).all() and (second[1] > -1e-3).all()  # after layer 0 a guess; the induction head copies


def test_attribution_gives_the_induction_head_the_copied_tokens_logit_and_the_previous_token_head_its_knock_out(served, circuit):
    base, name = served
    model, idx = circuit
    position = N + 4  # in the second copy: the token after it is the copy's
    answer = ask(base, "attribution", {"run": sibling(name, "circuit"), **REPEATED, "position": str(position)})
    copied = idx[0, position + 1].item()
    expected = logit_attribution(model, idx, position, copied)
    assert answer["token"] == {"id": copied, "label": CIRCUIT_TOKENIZER.token_strings([copied])[0]} and answer["other"] is None
    np.testing.assert_allclose(answer["heads"], expected.heads()[..., 0], atol=1e-5)
    np.testing.assert_allclose(answer["mlp"], [expected.shares[f"{layer}_mlp_out"].item() for layer in range(2)], atol=1e-5)
    assert [label for label, _ in answer["parts"]] == ["embed", "pos_embed", "bias"]
    assert answer["heads"][1][0] == pytest.approx(answer["logit"], abs=1e-4) and answer["logit"] == pytest.approx(12, abs=1e-3)
    np.testing.assert_allclose(answer["knock_out"], knock_out_effects(model, idx, logit_difference(position, copied)), atol=1e-5)
    assert answer["heads"][0][0] == 0 and answer["knock_out"][0][0] > 10  # the previous-token head: all through layer 1
    typed = ask(base, "attribution", {"run": sibling(name, "circuit"), **REPEATED, "position": str(position), "token": "a",
                                      "other": CIRCUIT_TOKENIZER.token_strings([copied])[0]})
    a = CIRCUIT_TOKENIZER.encode("a")[0]
    np.testing.assert_allclose(typed["heads"], logit_attribution(model, idx, position, a, copied).heads()[..., 0], atol=1e-5)
    assert typed["logit"] == pytest.approx(-12, abs=1e-3)  # "a" is no token of this copy: 0 - 12


def test_over_the_kept_checkpoints_the_induction_heads_attribution_appears_with_its_score(served, circuit, logdir):
    base, name = served
    _, idx = circuit
    position, copied = N + 4, idx[0, N + 5].item()
    by_step = {}
    for step in (0, 100):
        model, _ = Checkpoint.load(kept_checkpoint_path(logdir / "circuit", step)).build_model()
        answer = ask(base, "attribution", {"run": sibling(name, "circuit"), **REPEATED, "position": str(position), "step": str(step)})
        assert (answer["checkpoint"], answer["step"]) == (f"step_{step:06d}.pt", step)
        np.testing.assert_allclose(answer["heads"], logit_attribution(model.eval(), idx, position, copied).heads()[..., 0], atol=1e-5)
        by_step[step] = (answer["heads"][1][0], read_repeated(base, sibling(name, "circuit"), step=str(step))["induction"][1][0])
    assert by_step[0][0] < 1 and by_step[0][1] < 0.2  # before: the head looks everywhere, copies a blur
    assert by_step[100][0] == pytest.approx(12, abs=1e-3) and by_step[100][1] >= 0.9


# The second copy's "g" should be followed by "h", the token after "g" in the first copy; with
# the first copy's "g" corrupted to "X" there is no earlier "g" to copy after.
PATCH = {"clean": "abcdefghabcdefg", "corrupted": "abcdefXhabcdefg", "token": "h", "other": "a"}


def test_patching_restores_all_of_the_metric_with_either_head_of_the_circuit_and_none_with_a_head_that_writes_nothing(served, circuit):
    base, name = served
    model, _ = circuit
    answer = ask(base, "patch", {"run": sibling(name, "circuit"), **PATCH})
    clean, corrupted = (torch.tensor([[CIRCUIT_TOKENIZER.eot_id, *CIRCUIT_TOKENIZER.encode(PATCH[key])]]) for key in ("clean", "corrupted"))
    metric = logit_difference(-1, *CIRCUIT_TOKENIZER.encode("ha"))
    heads, residual = patch_heads(model, clean, corrupted, metric), patch_residual(model, clean, corrupted, metric)
    np.testing.assert_allclose(answer["heads"], heads.fraction, atol=1e-6)
    np.testing.assert_allclose(answer["residual"], residual.fraction, atol=1e-6)
    assert (answer["clean"], answer["corrupted"]) == (pytest.approx(heads.clean), pytest.approx(heads.corrupted))
    assert answer["caution"] is None  # the metric moves by 12: no caution
    assert answer["labels"]["corrupted"][7] == "X" and answer["token"]["label"] == "h" and answer["other"]["label"] == "a"
    assert np.array(answer["heads"]) == pytest.approx(np.array([[1, 0], [1, 0]]), abs=1e-6)  # both heads of the circuit carry it
    # The stream entering layer 0 carries it at the corrupted "g"; the one entering layer 1, one
    # token later, where the previous-token head has written that "g" came before the "h" (to 1e-3:
    # the hand-set scores leave each other key a weight of about e^-30 times the sharp ones').
    assert [row[7:9] for row in answer["residual"]] == [pytest.approx([1, 0], abs=1e-3), pytest.approx([0, 1], abs=1e-3)]


def test_the_patching_example_is_the_name_swap_in_words_the_runs_tokenizer_reads_and_patches(served, run_model):
    base, name = served
    _, tokenizer = run_model
    example = ask(base, "patch_example", {"run": name})
    swap = name_swap(tokenizer, *one_token_names(tokenizer)[:2])
    assert [tokenizer.eot_id, *tokenizer.encode(example["clean"])] == swap.clean[0].tolist()
    assert [tokenizer.eot_id, *tokenizer.encode(example["corrupted"])] == swap.corrupted[0].tolist()
    assert [tokenizer.encode(example[key]) for key in ("token", "other")] == [[swap.answer], [swap.other]]
    patched = ask(base, "patch", {"run": name, **{key: example[key] for key in ("clean", "corrupted", "token", "other")}})
    assert np.array(patched["heads"]).shape == (2, 2)
    gap = patched["clean"] - patched["corrupted"]  # the tiny run barely tells the names apart: said beside the shares
    assert abs(gap) < SMALL_GAP and patched["caution"] == (
        f"the metric moves by only {gap:+.3g} between the two prompts, and each fraction divides by that: they say "
        "little where the model barely tells the prompts apart")
    # A character model's names are no tokens of their own: no example, and why (the page asks for every run).
    none = ask(base, "patch_example", {"run": sibling(name, "circuit")})
    assert [none[key] for key in ("clean", "corrupted", "token", "other")] == [None] * 4
    assert none["why"].startswith("this run's tokenizer makes no two of the stories' names one token each")


@pytest.mark.parametrize("route, form, says", [
    ("patch", {**PATCH, "corrupted": "abcdefXXhabcdefg"}, "the clean prompt is 15 tokens and the corrupted one 16: "),
    ("patch", {**PATCH, "clean": "abcdefghhabcdefg"}, "the clean prompt is 16 tokens and the corrupted one 15: "),
    ("patch", {**PATCH, "token": "hh"}, "token: 'hh' is 2 tokens to this model ('h', 'h'), not one: type a single token"),
    ("patch", {**PATCH, "other": "Xy"}, "against: 'Xy' is 2 tokens to this model ('X', 'y'), not one"),
    ("patch", {**PATCH, "corrupted": PATCH["clean"]}, "on both prompts: there is nothing to restore"),
    ("patch", {**PATCH, "other": PATCH["token"]}, f"against: {PATCH['token']!r} is the token scored, and a logit less "
                                                  "itself is 0; type another token, or leave against empty"),
    ("patch", {**PATCH, "clean": ""}, "the clean prompt: the text is empty"),
    ("patch", {**PATCH, "token": "h" * 5000}, "'" + "h" * 32 + "'... (5,000 characters) is not one token"),
    ("patch", {"clean": "ab", "corrupted": "ba"}, "missing form field 'token'"),
    ("attribution", {**REPEATED, "position": "33"}, "position 33 is out of range: the sequence has 33 tokens"),
    ("attribution", {**REPEATED, "position": "32"}, "token 32 is the last one: nothing came after it"),
    ("attribution", {**REPEATED, "position": "5", "token": "a", "other": "a"}, "against: 'a' is the token scored, and a logit "
     "less itself is 0; type another token, or leave against empty"),
    ("attribution", {**REPEATED, "position": "5", "knocked_out": "2:0"}, "no layer 2 (in 2:0): this model has layers 0 to 1"),
    ("attribution", {**REPEATED, "position": "five"}, "position must be a whole number, not 'five'"),
    ("lens", {**REPEATED, "knocked_out": "0:5"}, "no head 5 in layer 0"),
    ("lens", {**REPEATED, "step": "7"}, "run '{circuit}' kept no checkpoint at step 7; its kept steps are [0, 100]"),
    ("lens", {"source": "probe"}, "source is text (with text) or repeated (with n and seed), not 'probe'"),
    ("lens", None, "send the lens as a POST form"),
    ("text", {"text": "Hi", "run": "{run}", "step": "7"}, "run '{run}' kept no checkpoint at step 7; its kept steps are [10]"),
])
def test_a_bad_tool_request_gets_a_400_with_one_line(served, route, form, says):
    base, name = served
    names = {"circuit": sibling(name, "circuit"), "run": name}
    if form is not None:
        form = {"run": names["circuit"], **{key: value.format(**names) for key, value in form.items()}}
    code, _, body = get(f"{base}{PLUGIN}/{route}", form)
    text = body.decode()
    assert code == 400 and says.format(**names) in text
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1 and len(text) < 300


# Every parameter of every route, as a request that succeeds with a good value: the circuit
# (a char model reading letters) and the tiny run, at their kept steps.
GOOD_REQUESTS = {
    "weights": ("GET", {"run": "{run}", "step": "0", "tag": WEIGHTS_TAG}),
    "metrics": ("GET", {"run": "{run}"}),
    "text": ("POST", {"run": "{circuit}", "text": "abcab", "knocked_out": "0:1", "step": "100"}),
    "repeated": ("GET", {"run": "{circuit}", "n": "4", "seed": "1", "knocked_out": "0:1", "step": "100"}),
    "lens": ("POST", {"run": "{circuit}", "source": "text", "text": "abcab", "knocked_out": "0:1", "step": "100"}),
    "attribution": ("POST", {"run": "{circuit}", "source": "text", "text": "abcab", "position": "2", "token": "a",
                             "other": "b", "knocked_out": "0:1", "step": "100"}),
    "patch": ("POST", {"run": "{circuit}", **PATCH, "step": "100"}),
    "patch_example": ("POST", {"run": "{run}", "step": "10"}),
}
REPEATED_SOURCE = {"source": "repeated", "n": "4", "seed": "1"}  # for n and seed of the tools, which read text unless told
LONG_BAD_VALUES = ["x" * 10_000, "9" * 10_000, "9:9," * 2_500, "1:0," * 2_499 + "1-0,"]  # letters, digits, head pairs


def long_bad_requests(names: dict[str, str]):
    """(route, method, params, what was spoilt) for each parameter of each route, that parameter
    given each of LONG_BAD_VALUES in a request otherwise good; and the static file route's name."""
    for route, (method, good) in GOOD_REQUESTS.items():
        for key in good:
            base = {**good, **REPEATED_SOURCE} if route in ("lens", "attribution") and key in ("n", "seed") else good
            base = {k: v for k, v in base.items() if not (k == "text" and base.get("source") == "repeated")}
            for bad in LONG_BAD_VALUES:
                params = {k: v.format(**names) for k, v in base.items()}
                yield route, method, {**params, key: bad}, f"{route} {key}={bad[:8]}..."
    for bad in LONG_BAD_VALUES:
        yield f"static/{bad}.js", "GET", {}, f"static/{bad[:8]}....js"


def test_every_error_of_every_route_quotes_at_most_the_start_of_a_10000_character_value(served):
    base, name = served
    names = {"run": name, "circuit": sibling(name, "circuit")}
    for route, (method, good) in GOOD_REQUESTS.items():  # each request is good as it stands
        params = {k: v.format(**names) for k, v in good.items()}
        query = "" if method == "POST" else "?" + urllib.parse.urlencode(params)
        status, _, body = get(f"{base}{PLUGIN}/{route}{query}", params if method == "POST" else None)
        assert status == 200, (route, body[:300])
    for route, method, params, spoilt in long_bad_requests(names):
        query = "" if method == "POST" or not params else "?" + urllib.parse.urlencode(params)
        status, _, body = get(f"{base}{PLUGIN}/{route}{query}", params if method == "POST" else None)
        text = body.decode()
        assert status in (400, 404), (spoilt, status, text[:300])
        assert len(text) < 300 and len(text.strip().splitlines()) == 1 and "Traceback" not in text, (spoilt, text[:600])
