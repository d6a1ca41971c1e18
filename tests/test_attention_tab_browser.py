"""The Attention tab in a real browser: TensorBoard on 127.0.0.1 serving a real tiny run and the
induction circuit built by hand, the tab opened in headless Chromium on a 1280 x 800 page
(Debian's chromium and chromium-driver, through Selenium). What the tab draws is checked against
the numbers in the run's event file, and for your own text and the repeated random tokens against
the routes' answers (tests/test_attention_tab.py checks those against the models)."""

import base64
import io
import json
import math
import urllib.parse
import urllib.request

import numpy as np
import pytest
import torch
from PIL import Image
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait
from tensorboard.util.tensor_util import make_ndarray

from attention_tab.browser import attention_runs, choose_run, headless_chromium, open_tab, tensorboard_server
from attention_tab.page_settings import MIN_LINE_WEIGHT
from data.tokenizer import special_ids
from inspection.head_metrics import induction_probe
from inspection.heatmap import COLORMAP, FUTURE, colour_level, hidden_cells
from inspection.logit_attribution import logit_attribution
from inspection.logit_lens import lens_summary
from inspection.name_swap import name_swap, one_token_names
from inspection.patching import knock_out_effects, logit_difference, patch_heads, patch_residual
from inspection.tab_format import PLUGIN_NAME, WEIGHTS_TAG
from model_io.checkpoint import Checkpoint
from model_io.run_files import BEST, kept_checkpoint_path
from tests.helpers import (
    CIRCUIT_N,
    CIRCUIT_SEED,
    CIRCUIT_TOKENIZER,
    INDUCTION_HEAD,
    circuit_run_with_maps,
    made_up_attention,
    made_up_runs,
    read_events,
    tiny_run_events,
)
from training.tensorboard_log import RunLogger

pytestmark = pytest.mark.browser  # every test drives the tab's page in headless Chromium



# The tiny run's event file and best checkpoint, runs of made-up weights, and the circuit with its
# maps on repeated tokens: tests/helpers.py's builders.
LOGDIR = [tiny_run_events, made_up_runs, circuit_run_with_maps]


@pytest.fixture(scope="module")
def live(logdir):
    """A run that has logged steps 0 and 1, and goes on logging while the tab is open."""
    logger = RunLogger(logdir / "live")
    for step in (0, 1):
        logger.attention_weights(step, made_up_attention(step, 2, 2, 6), list("abcdef"))
    logger.flush()
    yield logger
    logger.close()


# The tab asks for new steps every 30 s; in this browser every 0.5 s (its timers made shorter in
# the tab's frame only), so that a test can watch a run still training.
SHORT_TIMERS = """if (location.pathname.endsWith("/plugin_entry.html")) {
  const every = window.setInterval;
  window.setInterval = (callback, ms, ...args) => every(callback, Math.min(ms, 500), ...args);
}"""


@pytest.fixture(scope="module")
def browser(logdir, live):
    with tensorboard_server("--logdir", str(logdir)) as base, headless_chromium(1280, 800) as driver:
        attention_runs(base, until=lambda runs: len(runs) == 7)
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": SHORT_TIMERS})
        open_tab(driver, base)
        driver.opened_first = js(driver, "return document.body.dataset.drawnRun")
        choose_run(driver, "run")
        driver.opening_log = driver.get_log("browser")  # what opening the tab logged, before any test's own requests
        yield driver


# What the tab fixture clicks, in one script: a setup, not what the tests look at (five clicks through
# Selenium took 0.6 s before every test).
RESET = """
document.querySelector(".tool-tab[data-tool=model]").click();
document.querySelector("input[type=radio][value=probe]").click();
const layer = document.querySelector("select[aria-label=layer]");
if (layer.value !== "0") { layer.value = "0"; layer.dispatchEvent(new Event("change", {bubbles: true})); }
[...document.querySelectorAll("button")].find(b => b.textContent === "all heads").click();
[...document.querySelectorAll("button.head-name")].find(b => b.textContent.trim() === "head 0").click();
"""


@pytest.fixture
def tab(browser):
    """The browser inside the tab's frame, showing the tiny run's probe at layer 0 with all heads
    drawn, head 0 in the matrix and the model view beside, whatever the test before left it at."""
    browser.switch_to.default_content()
    browser.switch_to.frame(browser.find_element(By.CSS_SELECTOR, "iframe"))
    if browser.execute_script("return document.body.dataset.drawnRun") != "run":
        choose_run(browser, "run")
    # The pointer off the tokens (a test may have left it on one): the views drawn anew would take it
    # for the reader pointing at the token that comes under it.
    tool_tab = browser.find_element(By.CSS_SELECTOR, ".tool-tab[data-tool=model]")
    ActionChains(browser, duration=0).move_to_element(tool_tab).perform()
    browser.execute_script(RESET)
    return browser


@pytest.fixture(scope="module")
def logged(trained_run) -> dict[int, np.ndarray]:
    """{step: (L, H, T, T) float32} as the run's event file holds them."""
    events = read_events(trained_run)
    return {event.step: make_ndarray(event.tensor_proto).astype(np.float32) for event in events.Tensors(WEIGHTS_TAG)}


def shown(value: float, digits: int) -> str:
    """value as the tab writes it: with a minus sign (U+2212) rather than a hyphen when negative."""
    return f"{value:.{digits}f}".replace("-", "−")


def js(driver, script: str):
    return driver.execute_script(script)


def drawn_step(driver) -> int:
    return int(js(driver, "return document.body.dataset.drawnStep"))


def waiting(driver, timeout: float = 30) -> WebDriverWait:
    """A wait that looks every 50 ms (Selenium's default is every 500 ms)."""
    return WebDriverWait(driver, timeout, poll_frequency=0.05)


def click(driver, element) -> None:
    """A real click on element: the pointer moved onto it, pressed and released. (element.click()
    and ActionChains' default 250 ms glide of the pointer each take a tenth of a second or more.)"""
    ActionChains(driver, duration=0).click(element).perform()


def point_at(driver, side: str, index: int) -> None:
    token = driver.find_element(By.CSS_SELECTOR, f".token[data-side={side}][data-index='{index}']")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", token)
    ActionChains(driver, duration=0).move_to_element(token).perform()


def hover_cell(driver, T: int, query: int, key: int) -> None:
    """The pointer onto the matrix view's cell (query, key) of its T x T, from the canvas's centre."""
    canvas = driver.find_element(By.CSS_SELECTOR, "canvas.matrix")
    cell = canvas.size["width"] / T
    x, y = (key + 0.5) * cell - canvas.size["width"] / 2, (query + 0.5) * cell - canvas.size["height"] / 2
    ActionChains(driver, duration=0).move_to_element_with_offset(canvas, round(x), round(y)).perform()


def top_marks(driver, side: str) -> dict[int, int]:
    """{head: token index} of the tokens marked as a head's top weight, on one side."""
    marks = js(driver, f"return [...document.querySelectorAll('.token.top[data-side={side}]')]"
                       ".map(b => [b.dataset.index, b.dataset.topHeads])")
    return {int(head): int(index) for index, heads in marks for head in heads.split()}


def lines_land_on_their_tokens(driver) -> bool:
    """Whether each line of the token view starts at its query's row and ends at its key's row, on screen."""
    return js(driver, """
      const svg = document.querySelector("svg.lines").getBoundingClientRect();
      const row = (side, index) => document.querySelector(`.token[data-side=${side}][data-index="${index}"]`).getBoundingClientRect();
      const inside = (y, box) => box.top <= y && y <= box.bottom;
      return [...document.querySelectorAll("svg.lines line")].every((line) =>
        inside(svg.top + Number(line.getAttribute("y1")), row("query", line.dataset.query)) &&
        inside(svg.top + Number(line.getAttribute("y2")), row("key", line.dataset.key)));""")


def drawn_lines(driver) -> set[tuple[int, int, int, float]]:
    """(head, query, key, weight) of every line the token view draws."""
    lines = js(driver, "return [...document.querySelectorAll('svg.lines line')]"
                       ".map(l => [l.dataset.head, l.dataset.query, l.dataset.key, l.dataset.weight])")
    return {(int(h), int(q), int(k), float(w)) for h, q, k, w in lines}


def expected_lines(weights: np.ndarray, layer: int, heads, query: int) -> set[tuple[int, int, int, float]]:
    return {(h, query, k, float(weights[layer, h, query, k]))
            for h in heads for k in range(query + 1) if weights[layer, h, query, k] >= MIN_LINE_WEIGHT}


def test_the_page_is_as_large_as_headless_chromium_was_asked(browser):
    browser.switch_to.default_content()
    assert js(browser, "return [innerWidth, innerHeight]") == [1280, 800]


PANEL_BOXES = """const box = s => document.querySelector(s).getBoundingClientRect();
const [map, view] = [box("canvas.matrix"), box(".matrix-view")];
return {page: [innerWidth, document.documentElement.scrollWidth],
        panels: [".token-view", ".matrix-view", ".side"].map(s => [Math.round(box(s).left), Math.round(box(s).width)]),
        mapInside: map.width > 0 && map.left >= view.left && map.right <= view.right,
        tokensScroll: getComputedStyle(document.querySelector(".token-scroll")).overflowY,
        tokensHeight: box(".token-scroll").height, viewHeight: innerHeight, pageHeight: document.documentElement.scrollHeight,
        widths: [box(".matrix-view").width, box(".side").width],
        bottoms: [box("body").bottom, box(".side").bottom]};"""


def test_a_page_too_narrow_for_the_three_panels_side_by_side_stacks_them_and_cuts_none(tab):
    try:
        for width, height in ((800, 600), (1024, 768), (1199, 800), (1200, 800)):  # the panels side by side need 1,192 px
            tab.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
            boxes = js(tab, PANEL_BOXES)
            (token, _), (matrix, _), (side, _) = boxes["panels"]
            assert boxes["page"] == [width, width], boxes  # nothing runs off the right edge
            assert all(left >= 0 and left + size <= width and size >= 300 for left, size in boxes["panels"]), boxes
            assert boxes["mapInside"] and boxes["tokensScroll"] == "auto", boxes  # the map whole; the tokens scroll
            assert (token < matrix < side) == (width >= 1200), boxes  # side by side, else one under another
            if width < 1200:  # stacked: the side panel as wide as the matrix view, the page grown to hold the
                # stack (it scrolls, rather than cut the last panel), the tokens a scroll of their own under 70% of it
                assert boxes["widths"][0] == boxes["widths"][1] and boxes["bottoms"][0] >= boxes["bottoms"][1], boxes
                assert boxes["tokensHeight"] <= 0.7 * boxes["viewHeight"] + 1 and boxes["pageHeight"] > boxes["viewHeight"], boxes
    finally:
        tab.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False})


def test_the_tab_opens_the_newest_run_that_trained_not_a_run_named_later_that_trained_20_steps(browser):
    assert browser.opened_first == "a-trained"  # 150 steps; "run" (20), "uniform" and the others logged less


def test_the_tab_appears_in_tensorboard_and_draws_the_newest_step(browser, logged):
    browser.switch_to.default_content()
    tabs = [tab.get_attribute("textContent").strip() for tab in browser.find_elements(By.CSS_SELECTOR, "[role=tab] .plugin-name")]
    assert "Attention" in tabs and "scalars" in tabs  # TensorBoard's own dashboards stay
    browser.switch_to.frame(browser.find_element(By.CSS_SELECTOR, "iframe"))
    assert drawn_step(browser) == max(logged) == 20
    assert browser.find_element(By.CSS_SELECTOR, ".model-view h2").text == "Model view · step 20"


def test_pointing_at_a_query_marks_exactly_the_top_weight_key_of_each_head(tab, logged):
    weights, seen = logged[drawn_step(tab)], []
    for query in (23, 14, 6):
        point_at(tab, "query", query)
        expected = {h: int(np.argmax(weights[0, h, query, : query + 1])) for h in range(2)}
        assert top_marks(tab, "key") == expected
        assert drawn_lines(tab) == expected_lines(weights, 0, range(2), query)
        assert lines_land_on_their_tokens(tab)
        seen.append(expected)
    assert len({tuple(sorted(marks.values())) for marks in seen}) > 1  # the marks moved with the pointer


def test_pointing_at_a_key_marks_the_later_query_that_looks_at_it_most(tab, logged):
    weights = logged[drawn_step(tab)]
    point_at(tab, "key", 4)
    assert top_marks(tab, "query") == {h: 4 + int(np.argmax(weights[0, h, 4:, 4])) for h in range(2)}
    lines = drawn_lines(tab)
    assert lines and {key for _, _, key, _ in lines} == {4} and lines_land_on_their_tokens(tab)


def test_the_step_slider_draws_the_weights_logged_at_that_step(tab, logged):
    slider = tab.find_element(By.CSS_SELECTOR, "input[type=range]")
    for keys, step in ((Keys.HOME, 0), (Keys.ARROW_RIGHT, 10), (Keys.END, 20)):
        slider.send_keys(keys)
        waiting(tab, 10).until(lambda d, step=step: drawn_step(d) == step)
        point_at(tab, "query", 20)
        assert drawn_lines(tab) == expected_lines(logged[step], 0, range(2), 20)
        assert top_marks(tab, "key") == {h: int(np.argmax(logged[step][0, h, 20, :21])) for h in range(2)}


def test_the_head_metrics_beside_your_text_are_the_ones_of_the_checkpoint_that_read_it(tab):
    def metrics_table() -> tuple[str, list[str]]:
        return (tab.find_element(By.CSS_SELECTOR, ".head-metrics h3").text,
                js(tab, "return [...document.querySelectorAll('.head-metrics td.number')].map(c => c.textContent)"))

    slider = tab.find_element(By.CSS_SELECTOR, "input[type=range]")
    slider.send_keys(Keys.END)
    waiting(tab, 10).until(lambda d: drawn_step(d) == 20)
    title, at_20 = metrics_table()
    assert title == "Heads of layer 0 at step 20"
    slider.send_keys(Keys.HOME)  # the probe at step 0, whose metrics differ
    waiting(tab, 10).until(lambda d: drawn_step(d) == 0)
    assert metrics_table()[1] != at_20
    type_text(tab, SENTENCE)  # read by ckpt_best.pt, saved at step 20
    wait_for_text(tab)
    assert metrics_table() == ("Heads of layer 0 at step 20", at_20)


def test_the_matrix_view_reads_out_the_weight_under_the_pointer(tab, logged):
    weights = logged[drawn_step(tab)]
    for query, key in ((20, 3), (7, 7), (2, 9)):
        hover_cell(tab, 24, query, key)
        readout = tab.find_element(By.CSS_SELECTOR, ".readout")
        assert (int(readout.get_attribute("data-query")), int(readout.get_attribute("data-key"))) == (query, key)
        if key > query:
            assert "masked" in readout.text and readout.get_attribute("data-weight") == ""
        else:
            assert float(readout.get_attribute("data-weight")) == float(weights[0, 0, query, key])


def test_clicking_a_head_in_the_model_view_opens_it_in_the_other_views(tab, logged):
    weights = logged[drawn_step(tab)]
    click(tab, tab.find_element(By.CSS_SELECTOR, ".head-cell[data-layer='1'][data-head='0']"))
    assert tab.find_element(By.CSS_SELECTOR, ".matrix-view h2").text == "Matrix view · layer 1 · head 0"
    assert tab.find_element(By.CSS_SELECTOR, ".token-view h2").text == "Token view · layer 1"
    pressed = js(tab, "return [...document.querySelectorAll('.chip')].map(c => c.getAttribute('aria-pressed'))")
    assert pressed == ["true", "false"]
    point_at(tab, "query", 17)
    assert top_marks(tab, "key") == {0: int(np.argmax(weights[1, 0, 17, :18]))}
    assert drawn_lines(tab) == expected_lines(weights, 1, [0], 17)


def test_the_arrow_keys_move_from_token_to_token(tab, logged):
    weights = logged[drawn_step(tab)]
    point_at(tab, "query", 10)
    tab.find_element(By.CSS_SELECTOR, ".token[data-side=query][data-index='10']").send_keys(Keys.ARROW_UP)
    focused = js(tab, "return [document.activeElement.dataset.side, document.activeElement.dataset.index]")
    assert focused == ["query", "9"]
    assert top_marks(tab, "key") == {h: int(np.argmax(weights[0, h, 9, :10])) for h in range(2)}
    tab.switch_to.active_element.send_keys(Keys.ARROW_RIGHT)
    assert top_marks(tab, "query") == {h: 9 + int(np.argmax(weights[0, h, 9:, 9])) for h in range(2)}


def test_the_arrow_keys_move_a_pinned_token_and_it_stays_pinned(tab, logged):
    weights = logged[drawn_step(tab)]
    click(tab, tab.find_element(By.CSS_SELECTOR, ".token[data-side=query][data-index='10']"))
    tab.switch_to.active_element.send_keys(Keys.ARROW_UP)
    assert top_marks(tab, "key") == {h: int(np.argmax(weights[0, h, 9, :10])) for h in range(2)}
    assert "pinned" in tab.find_element(By.CSS_SELECTOR, ".token[data-side=query][data-index='9']").get_attribute("class")
    tab.switch_to.active_element.send_keys(Keys.ESCAPE)


def test_a_12_by_12_model_on_128_tokens_is_drawn_whole(tab, logdir):
    choose_run(tab, "big")
    weights = made_up_attention(10, 12, 12, 128).half().float().numpy()
    assert len(tab.find_elements(By.CSS_SELECTOR, ".head-cell")) == 144
    point_at(tab, "query", 127)
    assert top_marks(tab, "key") == {h: int(np.argmax(weights[0, h, 127])) for h in range(12)}


def test_among_equal_weights_the_earliest_key_is_the_top_one(tab):
    choose_run(tab, "uniform")  # every query weighs each visible token 1 / (q + 1), up to float16
    point_at(tab, "query", 5)
    assert top_marks(tab, "key") == {0: 0, 1: 0}
    point_at(tab, "key", 2)
    assert top_marks(tab, "query") == {0: 2, 1: 2}


def test_a_window_models_maps_grey_the_keys_too_far_back_and_the_readout_says_why(tab):
    choose_run(tab, "windowed")  # each query weighs its 3 most recent keys 1 / 3 (fewer at the start)
    assert "the keys 3 or more back (the model's window)" in tab.find_element(By.CSS_SELECTOR, ".matrix-view .hint").text
    pixels = js(tab, """const c = document.querySelector("canvas.matrix");
      return Array.from(c.getContext("2d").getImageData(0, 0, c.width, c.height).data);""")
    image = np.array(pixels, dtype=np.uint8).reshape(6, 6, 4)[..., :3]
    visible_weight = 1 / np.minimum(np.arange(1, 7), 3)  # (6,): each query's weight on each key it sees
    for query, key in np.ndindex(6, 6):
        expected = FUTURE if hidden_cells(6, 3)[query, key] else COLORMAP[colour_level(np.float16(visible_weight[query]))]
        assert tuple(image[query, key]) == tuple(expected), (query, key)
    for (query, key), said in {(5, 1): "masked (3 or more back: outside the window)", (1, 4): "masked (the future)"}.items():
        hover_cell(tab, 6, query, key)
        readout = tab.find_element(By.CSS_SELECTOR, ".readout")
        assert readout.text.endswith(said) and readout.get_attribute("data-weight") == ""


def test_a_run_still_training_shows_its_new_steps_and_the_slider_follows(tab, live):
    choose_run(tab, "live")
    assert drawn_step(tab) == 1
    live.attention_weights(2, made_up_attention(2, 2, 2, 6), list("abcdef"))
    live.flush()
    waiting(tab).until(lambda d: drawn_step(d) == 2)
    slider = tab.find_element(By.CSS_SELECTOR, "input[type=range]")
    assert slider.get_attribute("max") == "2" and tab.find_element(By.CSS_SELECTOR, ".step-label").text.startswith("2 ")
    point_at(tab, "query", 5)
    weights = made_up_attention(2, 2, 2, 6).half().float().numpy()
    assert drawn_lines(tab) == expected_lines(weights, 0, range(2), 5)


def test_the_screenshot_shows_the_maps_and_no_script_failed(browser):
    image = Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("RGB")
    assert image.width == 1280
    pixels = np.asarray(image).reshape(-1, 3)
    assert len(np.unique(pixels, axis=0)) > 200  # maps, lines and text, not a blank or an error page
    packed = lambda rgb: (rgb[:, 0].astype(int) << 16) | (rgb[:, 1].astype(int) << 8) | rgb[:, 2]  # noqa: E731
    assert np.isin(packed(pixels), packed(COLORMAP)).mean() > 0.03  # maps, in the heatmaps' exact colours
    errors = [entry for entry in browser.opening_log if entry["level"] == "SEVERE"]  # (later tests send bad input on purpose)
    assert not errors, errors


SENTENCE = "Once upon a time, a girl named Alice met a dog. Alice"


def text_route(driver, text: str, knocked_out: str = "") -> dict:
    """The text route's answer for the tiny run, fetched here (not by the tab); its weights as
    (L, H, T, T) float32 from float16, as the tab decodes them."""
    driver.switch_to.default_content()
    base = driver.current_url.split("/#")[0]
    driver.switch_to.frame(driver.find_element(By.CSS_SELECTOR, "iframe"))
    form = urllib.parse.urlencode({"run": "run", "text": text, "knocked_out": knocked_out}).encode()
    with urllib.request.urlopen(f"{base}/data/plugin/{PLUGIN_NAME}/text", data=form) as response:
        answer = json.load(response)
    weights = np.frombuffer(base64.b64decode(answer["weights"]), "<f2").astype(np.float32)
    return {**answer, "weights": weights.reshape(answer["shape"])}


def type_text(driver, text: str) -> None:
    box = driver.find_element(By.CSS_SELECTOR, "input[aria-label='your text']")
    box.clear()
    box.send_keys(text, Keys.ENTER)


def wait_for_text(driver, knocked_out: str = "") -> None:
    waiting(driver).until(lambda d: js(
        d, "return [document.body.dataset.drawnMode, document.body.dataset.drawnKnockedOut]") == ["text", knocked_out])


def next_tokens(driver) -> list[list[str]]:
    """The next-token box's rows: token, probability (and the intact model's)."""
    return js(driver, "return [...document.querySelectorAll('.next-tokens tbody tr')]"
                      ".map(r => [...r.children].map(c => c.textContent))")


def losses_beside_queries(driver) -> list[str]:
    return js(driver, "return [...document.querySelectorAll('.token[data-side=query] .loss')].map(s => s.textContent)")


def test_your_text_is_drawn_in_every_view_with_the_top_5_and_the_loss_beside_each_token(tab):
    answer = text_route(tab, SENTENCE)
    type_text(tab, SENTENCE)
    wait_for_text(tab)
    T = len(answer["labels"])
    assert js(tab, "return [...document.querySelectorAll('.token[data-side=key] .label')].map(s => s.textContent)") == answer["labels"]
    assert tab.find_element(By.CSS_SELECTOR, ".token-view h2").text == "Token view · layer 0 · your text"
    assert tab.find_element(By.CSS_SELECTOR, ".model-view h2").text == "Model view · your text · ckpt_best.pt (step 20)"
    assert js(tab, "return document.querySelector('canvas.matrix').width") == T
    for query in (T - 1, 6):
        point_at(tab, "query", query)
        assert drawn_lines(tab) == expected_lines(answer["weights"], 0, range(2), query) and lines_land_on_their_tokens(tab)
        assert top_marks(tab, "key") == {h: int(np.argmax(answer["weights"][0, h, query, : query + 1])) for h in range(2)}
    assert next_tokens(tab) == [[token, f"{p:.3f}"] for token, p in zip(answer["next"]["tokens"][6], answer["next"]["probs"][6], strict=True)]
    came = tab.find_element(By.CSS_SELECTOR, ".next-loss").text
    assert came == f"came next: “{answer['labels'][7]}”, loss {answer['next']['loss'][6]:.2f} nats"
    assert losses_beside_queries(tab) == [f"{loss:.2f}" for loss in answer["next"]["loss"]] + [""]
    assert tab.find_element(By.CSS_SELECTOR, ".column-heads span").text == "next-token loss · queries"


def test_knocking_a_head_out_changes_the_numbers_and_the_later_maps_and_a_second_click_brings_it_back(tab):
    intact, out = text_route(tab, SENTENCE), text_route(tab, SENTENCE, "0:1")
    type_text(tab, SENTENCE)
    wait_for_text(tab)
    cell = tab.find_element(By.CSS_SELECTOR, ".head-cell[data-layer='0'][data-head='1']")
    knock = cell.find_element(By.CSS_SELECTOR, ".knock")
    click(tab, knock)
    wait_for_text(tab, "0:1")
    assert "knocked" in cell.get_attribute("class") and knock.get_attribute("aria-pressed") == "true"
    point_at(tab, "query", 6)
    assert next_tokens(tab) == [[token, f"{p:.3f}", f"{p_intact:.3f}"] for token, p, p_intact in zip(
        out["next"]["tokens"][6], out["next"]["probs"][6], out["intact"]["probs_of_top"][6], strict=True)]
    changes = [loss - intact_loss for loss, intact_loss in zip(out["next"]["loss"], intact["next"]["loss"], strict=True)]
    assert losses_beside_queries(tab) == [f"{abs(c):.2f}" if f"{abs(c):.2f}" == "0.00" else f"{'+' if c > 0 else '−'}{abs(c):.2f}"
                                          for c in changes] + [""]
    assert max(abs(c) for c in changes) > 0.01  # the numbers moved
    assert tab.find_element(By.CSS_SELECTOR, ".column-heads span").text == "Δ loss vs intact · queries"
    Select(tab.find_element(By.CSS_SELECTOR, "select[aria-label=layer]")).select_by_value("1")
    point_at(tab, "query", 12)
    assert drawn_lines(tab) == expected_lines(out["weights"], 1, range(2), 12)  # layer 1 reads the changed layer 0
    assert drawn_lines(tab) != expected_lines(intact["weights"], 1, range(2), 12)
    click(tab, knock)
    wait_for_text(tab, "")
    assert "knocked" not in cell.get_attribute("class")
    assert drawn_lines(tab) == expected_lines(intact["weights"], 1, range(2), 12)
    assert losses_beside_queries(tab) == [f"{loss:.2f}" for loss in intact["next"]["loss"]] + [""]


def test_your_text_stays_a_click_away_with_its_knocked_out_heads_after_the_probe_is_shown(tab):
    type_text(tab, SENTENCE)
    wait_for_text(tab)
    click(tab, tab.find_element(By.CSS_SELECTOR, ".head-cell[data-layer='0'][data-head='1'] .knock"))
    wait_for_text(tab, "0:1")
    click(tab, tab.find_element(By.CSS_SELECTOR, "input[type=radio][value=probe]"))
    assert js(tab, "return document.body.dataset.drawnMode") == "probe"
    text_mode = tab.find_element(By.CSS_SELECTOR, "input[type=radio][value=text]")
    assert text_mode.is_enabled()
    click(tab, text_mode)
    wait_for_text(tab, "0:1")
    click(tab, tab.find_element(By.CSS_SELECTOR, ".head-cell[data-layer='0'][data-head='1'] .knock"))  # back, for the tests after
    wait_for_text(tab, "")


def test_a_too_long_text_gets_its_error_under_the_box_and_the_views_stay_as_they_were(tab):
    type_text(tab, SENTENCE)
    wait_for_text(tab)
    labels = js(tab, "return [...document.querySelectorAll('.token[data-side=key] .label')].map(s => s.textContent)")
    type_text(tab, SENTENCE * 3)
    error = waiting(tab).until(lambda d: d.find_element(By.CSS_SELECTOR, ".source-error:not([hidden])"))
    assert error.text.startswith("the text is too long: ") and "this model reads at most 31 after the <eot> it starts with (32 in all" in error.text
    assert error.is_displayed() and error.location["y"] > tab.find_element(By.CSS_SELECTOR, "input[aria-label='your text']").location["y"]
    with pytest.raises(NoAlertPresentException):
        tab.switch_to.alert.text  # noqa: B018  # in place, not in an alert
    assert js(tab, "return [...document.querySelectorAll('.token[data-side=key] .label')].map(s => s.textContent)") == labels
    type_text(tab, SENTENCE)  # a good text again: the error goes
    waiting(tab).until(lambda d: not d.find_element(By.CSS_SELECTOR, ".source-error").is_displayed())


def test_a_keyboard_cursor_past_a_shorter_text_is_dropped_and_the_shorter_text_is_drawn_whole(tab):
    tab.get_log("browser")  # what earlier tests left there (a refused text's 400, say)
    type_text(tab, SENTENCE)
    wait_for_text(tab)
    tab.find_element(By.CSS_SELECTOR, "canvas.matrix").send_keys(Keys.ARROW_UP)  # the cursor on the last query but one
    readout = tab.find_element(By.CSS_SELECTOR, ".readout")
    assert int(readout.get_attribute("data-query")) == len(text_route(tab, SENTENCE)["labels"]) - 2
    short = text_route(tab, "Once upon")
    type_text(tab, "Once upon")  # fewer tokens than that query's number
    waiting(tab).until(lambda d: js(d, "return document.querySelector('canvas.matrix').width") == len(short["labels"]))
    assert js(tab, "return [...document.querySelectorAll('.token[data-side=key] .label')].map(s => s.textContent)") == short["labels"]
    assert readout.text == "Point at a cell: its query, key and weight." and readout.get_attribute("data-query") == ""
    assert not tab.find_element(By.CSS_SELECTOR, ".source-error").is_displayed()
    assert [entry for entry in tab.get_log("browser") if entry["level"] == "SEVERE"] == []


def test_the_error_line_pushes_the_panels_down_and_covers_no_title(tab):
    type_text(tab, SENTENCE * 3)
    waiting(tab).until(lambda d: d.find_element(By.CSS_SELECTOR, ".source-error").is_displayed())
    covered = js(tab, """const e = document.querySelector(".source-error").getBoundingClientRect();
      return [...document.querySelectorAll("h2, .panel")].filter((title) => { const r = title.getBoundingClientRect();
        return r.left < e.right && e.left < r.right && r.top < e.bottom && e.top < r.bottom; }).map((t) => t.className || t.textContent);""")
    assert covered == []
    type_text(tab, SENTENCE)
    waiting(tab).until(lambda d: not d.find_element(By.CSS_SELECTOR, ".source-error").is_displayed())


def test_a_click_on_a_head_opens_it_on_every_source_and_its_cross_knocks_it_out(tab):
    cross = tab.find_element(By.CSS_SELECTOR, ".head-cell[data-layer='1'][data-head='1'] .knock")
    assert not cross.is_displayed()  # on the probe nothing reads: nothing to knock out
    assert "To knock heads out, show your text or repeated random tokens" in tab.find_element(By.CSS_SELECTOR, ".model-view .hint").text
    type_text(tab, SENTENCE)
    wait_for_text(tab)
    click(tab, tab.find_element(By.CSS_SELECTOR, ".head-cell[data-layer='1'][data-head='1']"))
    assert tab.find_element(By.CSS_SELECTOR, ".matrix-view h2").text == "Matrix view · layer 1 · head 1"
    assert js(tab, "return document.body.dataset.drawnKnockedOut") == ""  # opened, not knocked out
    assert "its ✕ knocks it out (again: back)" in tab.find_element(By.CSS_SELECTOR, ".model-view .hint").text
    assert cross.is_displayed() and cross.get_attribute("aria-label") == "knock out layer 1 head 1"
    click(tab, cross)
    wait_for_text(tab, "1:1")
    assert cross.get_attribute("aria-label") == "bring back layer 1 head 1"
    click(tab, cross)
    wait_for_text(tab, "")


def repeated_route(driver, run: str, n: int, seed: int, knocked_out: str = "") -> dict:
    """The repeated route's answer, fetched here (not by the tab)."""
    driver.switch_to.default_content()
    base = driver.current_url.split("/#")[0]
    driver.switch_to.frame(driver.find_element(By.CSS_SELECTOR, "iframe"))
    query = urllib.parse.urlencode({"run": run, "n": n, "seed": seed, "knocked_out": knocked_out})
    with urllib.request.urlopen(f"{base}/data/plugin/{PLUGIN_NAME}/repeated?{query}") as response:
        return json.load(response)


def show_repeated(driver, n: int, seed: int) -> None:
    for label, value in (("n random tokens", n), ("seed", seed)):
        box = driver.find_element(By.CSS_SELECTOR, f"input[aria-label='{label}']")
        box.clear()
        box.send_keys(str(value))
    click(driver, driver.find_element(By.XPATH, "//button[text()='show']"))
    wait_for_repeated(driver, n)


def wait_for_repeated(driver, n: int, knocked_out: str = "") -> None:
    waiting(driver).until(lambda d: js(
        d, "return [document.body.dataset.drawnMode, document.body.dataset.drawnTokens, document.body.dataset.drawnKnockedOut]")
        == ["repeated", str(2 * n + 1), knocked_out])


def curves(driver) -> dict[str, list[tuple[float, float]]]:
    """{curve name: its (x, y) points in px} of the loss plot."""
    drawn = js(driver, "return [...document.querySelectorAll('.loss-plot polyline')].map(l => [l.dataset.curve, l.getAttribute('points')])")
    return {name: [tuple(map(float, point.split(","))) for point in points.split()] for name, points in drawn}


def plot_bottom(driver) -> float:
    """The y in px of a loss of 0: the x axis."""
    return float(js(driver, "return document.querySelector('.loss-plot line.axis').getAttribute('y1')"))


def test_repeated_tokens_on_the_circuit_show_the_stripe_the_collapse_of_the_loss_and_the_scores(tab):
    N = CIRCUIT_N
    choose_run(tab, "circuit")
    click(tab, tab.find_element(By.CSS_SELECTOR, "input[type=radio][value=repeated]"))  # the default n: as many as the model reads
    wait_for_repeated(tab, 19)
    show_repeated(tab, N, CIRCUIT_SEED)
    answer = repeated_route(tab, "circuit", N, CIRCUIT_SEED)
    assert tab.find_element(By.CSS_SELECTOR, ".model-view h2").text == "Model view · repeated tokens · ckpt_best.pt (step 0)"
    score = tab.find_element(By.CSS_SELECTOR, ".induction-grid .score[data-layer='1'][data-head='0']")
    assert float(score.get_attribute("data-score")) == answer["induction"][1][0] >= 0.9 and score.text == f"{answer['induction'][1][0]:.2f}"
    click(tab, score)  # opens the head, as a click in the model view does
    assert tab.find_element(By.CSS_SELECTOR, ".matrix-view h2").text == "Matrix view · layer 1 · head 0"
    assert tab.find_element(By.CSS_SELECTOR, ".token-view h2").text == "Token view · layer 1 · repeated tokens"
    # The stripe: each query of the second copy (row N + 1 + i) on the token after its first occurrence (column 2 + i).
    pixels = js(tab, """const c = document.querySelector("canvas.matrix");
      return Array.from(c.getContext("2d").getImageData(0, 0, c.width, c.height).data);""")
    image = np.array(pixels, dtype=np.uint8).reshape(2 * N + 1, 2 * N + 1, 4)[..., :3]
    brightest = COLORMAP[-1]
    assert all((image[N + 1 + i, 2 + i] == brightest).all() for i in range(N))
    assert not any((image[N + 1 + i, N + 1 + i] == brightest).all() for i in range(N))  # not on the diagonal
    loss, bottom = curves(tab)["loss"], plot_bottom(tab)
    assert len(loss) == 2 * N
    assert all(bottom - y < 1 for _, y in loss[N + 1 :])  # the second copy after its first token: a loss of ~0
    assert all(bottom - y > 20 for _, y in loss[:N])  # the first copy: a guess
    means = tab.find_element(By.CSS_SELECTOR, ".copy-means").text
    assert means == f"mean loss: first copy {answer['copy_loss']['first']:.2f}, second {answer['copy_loss']['second']:.2f} nats"


def test_knocking_out_the_copy_head_on_repeated_tokens_draws_its_loss_against_the_intact_curve(tab):
    N = CIRCUIT_N
    choose_run(tab, "circuit")
    show_repeated(tab, N, CIRCUIT_SEED)
    intact = curves(tab)["loss"]
    cross = tab.find_element(By.CSS_SELECTOR, ".head-cell[data-layer='1'][data-head='0'] .knock")
    click(tab, cross)
    wait_for_repeated(tab, N, "1:0")
    drawn, bottom = curves(tab), plot_bottom(tab)
    assert set(drawn) == {"intact", "knocked-out"}
    answer = repeated_route(tab, "circuit", N, CIRCUIT_SEED, "1:0")
    assert all(bottom - y > 20 for _, y in drawn["knocked-out"][N + 1 :])  # the loss came back (log 64 = 4.16 nats)
    top = max(answer["next"]["loss"] + answer["intact"]["loss"])
    assert all(bottom - y < 1 for _, y in drawn["intact"][N + 1 :]) and len(drawn["intact"]) == 2 * N
    assert top > 4  # the axis grew to hold the curves
    means = tab.find_element(By.CSS_SELECTOR, ".copy-means").text
    assert means == (f"without L1H0: first copy {answer['copy_loss']['first']:.2f}, second {answer['copy_loss']['second']:.2f}"
                     f" · intact: first copy {answer['intact_copy_loss']['first']:.2f}, second {answer['intact_copy_loss']['second']:.2f} nats")
    assert "knocked" in tab.find_element(By.CSS_SELECTOR, ".induction-grid .score[data-layer='1'][data-head='0']").get_attribute("class")
    click(tab, cross)
    wait_for_repeated(tab, N, "")
    assert set(curves(tab)) == {"loss"} and [y for _, y in curves(tab)["loss"]][N + 1 :] == [y for _, y in intact][N + 1 :]


def test_a_bad_n_gets_its_one_line_under_the_sources_and_the_views_stay(tab):
    choose_run(tab, "circuit")
    show_repeated(tab, CIRCUIT_N, CIRCUIT_SEED)
    box = tab.find_element(By.CSS_SELECTOR, "input[aria-label='n random tokens']")
    box.clear()
    box.send_keys("1", Keys.ENTER)
    error = waiting(tab).until(lambda d: d.find_element(By.CSS_SELECTOR, ".source-error:not([hidden])"))
    assert error.text == "n=1 is out of range: give 2 to 19 random tokens (this model reads at most 40 tokens, <eot> and the n tokens twice)"
    assert js(tab, "return [document.body.dataset.drawnMode, document.body.dataset.drawnTokens]") == ["repeated", str(2 * CIRCUIT_N + 1)]
    # What the browser cannot read as a number (its value is then "", the default n's) is refused too.
    box.clear()
    box.send_keys("1e", Keys.ENTER)
    waiting(tab).until(lambda d: d.find_element(By.CSS_SELECTOR, ".source-error").text.startswith("n must"))
    assert error.text == "n must be a whole number; the box holds something else"
    assert js(tab, "return [document.body.dataset.drawnMode, document.body.dataset.drawnTokens]") == ["repeated", str(2 * CIRCUIT_N + 1)]
    box.clear()
    box.send_keys(str(CIRCUIT_N))
    seed = tab.find_element(By.CSS_SELECTOR, "input[aria-label='seed']")
    for typed in ("1e3", "2.5"):  # numbers the browser takes, but no whole numbers: the same words
        seed.clear()
        seed.send_keys(typed, Keys.ENTER)
        waiting(tab).until(lambda d: d.find_element(By.CSS_SELECTOR, ".source-error").text.startswith("seed must"))
        assert error.text == "seed must be a whole number; the box holds something else"
    click(tab, tab.find_element(By.CSS_SELECTOR, "input[type=radio][value=probe]"))  # another source: the line goes with it
    waiting(tab).until(lambda d: js(d, "return document.body.dataset.drawnMode") == "probe")
    assert not error.is_displayed()


def open_tool(driver, name: str):
    """Shows a tool in the right-hand column and waits for its answer."""
    click(driver, driver.find_element(By.CSS_SELECTOR, f".tool-tab[data-tool={name}]"))
    return wait_for_tool(driver, name)


def wait_for_tool(driver, name: str, state: str = "ready"):
    return waiting(driver).until(
        lambda d: d.find_element(By.CSS_SELECTOR, f".tool.{name}[data-state={state}]"))


def grid(driver, table: str) -> np.ndarray:
    """A tool's grid as the page holds it: each cell's data-value, (rows, columns)."""
    return np.array(js(driver, f"return [...document.querySelectorAll('table.{table} tr')].slice(1)"
                               ".map(r => [...r.querySelectorAll('td.cell')].map(c => Number(c.dataset.value)))"))


def circuit_model(logdir, step: int | None = None):
    """The circuit as the test loads it (its best checkpoint, or the one kept at step), and the repeated tokens."""
    path = logdir / "circuit" / "ckpt_best.pt" if step is None else kept_checkpoint_path(logdir / "circuit", step)
    model, _ = Checkpoint.load(path).build_model()
    ids = [CIRCUIT_TOKENIZER.eot_id, *induction_probe(CIRCUIT_TOKENIZER.vocab_size, CIRCUIT_N, CIRCUIT_SEED, special_ids(CIRCUIT_TOKENIZER))]
    return model.eval(), torch.tensor([ids])  # (1, 2N + 1)


def test_patching_beside_the_probe_asks_the_runs_best_checkpoint_not_the_one_the_slider_was_at_before(tab, logdir):
    choose_run(tab, "circuit")
    show_repeated(tab, CIRCUIT_N, CIRCUIT_SEED)  # read by the run's checkpoints: the slider moves over them
    tab.find_element(By.CSS_SELECTOR, "input[type=range]").send_keys(Keys.HOME)
    waiting(tab).until(lambda d: js(d, "return document.body.dataset.drawnCheckpoint") == "step_000000.pt")
    click(tab, tab.find_element(By.CSS_SELECTOR, "input[type=radio][value=probe]"))  # the slider is over logged steps again
    waiting(tab).until(lambda d: js(d, "return document.body.dataset.drawnMode") == "probe")
    click(tab, tab.find_element(By.CSS_SELECTOR, ".tool-tab[data-tool=patching]"))
    for label, value in {"clean prompt": "abcdefghabcdefg", "corrupted prompt": "abcdefXhabcdefg", "metric token": "h",
                         "metric against token": "a"}.items():
        box = tab.find_element(By.CSS_SELECTOR, f"input[aria-label='{label}']")
        box.clear()
        box.send_keys(value)
    click(tab, tab.find_element(By.XPATH, "//button[text()='patch']"))
    root = wait_for_tool(tab, "patching")
    best = Checkpoint.load(logdir / "circuit" / BEST)
    assert root.find_element(By.CSS_SELECTOR, "h2").text == f"Activation patching · ckpt_best.pt (step {best.step})"


def test_the_lens_and_attribution_show_the_python_numbers_at_the_pinned_query_and_follow_the_checkpoint_slider(tab, logdir):
    N, query = CIRCUIT_N, CIRCUIT_N + 4  # a query of the second copy: the token after it is the copy's
    choose_run(tab, "circuit")
    show_repeated(tab, N, CIRCUIT_SEED)
    model, idx = circuit_model(logdir)
    lens = lens_summary(model, idx)
    open_tool(tab, "lens")
    picture = js(tab, "return [...document.querySelectorAll('.lens-picture .cell')].map(c => [c.dataset.layer, c.dataset.query, Number(c.dataset.logProb)])")
    assert [(int(layer), int(q)) for layer, q, _ in picture] == [(layer, q) for layer in range(2) for q in range(2 * N)]
    np.testing.assert_allclose([v for *_, v in picture], lens.next_log_prob.flatten(), atol=1e-6)
    cell = tab.find_element(By.CSS_SELECTOR, f".lens-picture .cell[data-layer='1'][data-query='{query}']")
    log_prob = lens.next_log_prob[1, query].item()
    assert cell.get_attribute("title").endswith(f"log p {shown(log_prob, 4)} (p {math.exp(log_prob):.4f}), rank 1")
    click(tab, cell)  # pins that query
    assert "pinned" in tab.find_element(By.CSS_SELECTOR, f".token[data-side=query][data-index='{query}']").get_attribute("class")
    rows = js(tab, "return [...document.querySelectorAll('.lens-table tr[data-layer]')].map(r => [Number(r.children[1].dataset.rank), "
                   "Number(r.children[2].dataset.logProb), [...r.querySelectorAll('.top-token .token-text')].map(s => s.textContent)])")
    assert [rank for rank, _, _ in rows] == lens.next_rank[:, query].tolist()
    np.testing.assert_allclose([log_prob for _, log_prob, _ in rows], lens.next_log_prob[:, query], atol=1e-6)
    assert [top for *_, top in rows] == [CIRCUIT_TOKENIZER.token_strings(ids) for ids in lens.top_ids[:, query].tolist()]

    for step, head_share in ((None, 12.0), (0, None)):  # the run's best, then the checkpoint it kept at step 0
        if step is not None:
            tab.find_element(By.CSS_SELECTOR, "input[type=range]").send_keys(Keys.HOME)
            waiting(tab).until(lambda d: js(d, "return document.body.dataset.drawnCheckpoint") == "step_000000.pt")
            assert tab.find_element(By.CSS_SELECTOR, ".step-label").text == "step_000000.pt, step 0 (1 of 3)"
            model, _ = circuit_model(logdir, step)
            root = wait_for_tool(tab, "attribution")
        else:
            root = open_tool(tab, "attribution")
        copied = idx[0, query + 1].item()
        expected = logit_attribution(model, idx, query, copied)
        shares = grid(tab, "shares")  # (L, H + 1): the heads, then the MLP
        np.testing.assert_allclose(shares[:, :2], expected.heads()[..., 0], atol=1e-5)
        np.testing.assert_allclose(grid(tab, "knock-out"), knock_out_effects(model, idx, logit_difference(query, copied)), atol=1e-5)
        logit = float(root.find_element(By.CSS_SELECTOR, ".tool-summary").get_attribute("data-logit"))
        assert logit == pytest.approx(expected.logit.item(), abs=1e-5)
        if head_share:  # the induction head carries the copied token's whole logit
            assert shares[INDUCTION_HEAD] == pytest.approx(logit, abs=1e-4) == head_share
        else:  # before it formed: a share of a blur
            assert shares[INDUCTION_HEAD] < 1


def test_patching_two_prompts_fills_both_grids_with_patch_heads_and_patch_residuals_numbers(tab, logdir):
    choose_run(tab, "circuit")
    click(tab, tab.find_element(By.CSS_SELECTOR, ".tool-tab[data-tool=patching]"))
    prompts = {"clean prompt": "abcdefghabcdefg", "corrupted prompt": "abcdefXhabcdefg", "metric token": "h", "metric against token": "a"}
    for label, value in prompts.items():
        box = tab.find_element(By.CSS_SELECTOR, f"input[aria-label='{label}']")
        box.clear()
        box.send_keys(value)
    click(tab, tab.find_element(By.XPATH, "//button[text()='patch']"))
    root = wait_for_tool(tab, "patching")
    model, _ = circuit_model(logdir)
    clean, corrupted = (torch.tensor([[CIRCUIT_TOKENIZER.eot_id, *CIRCUIT_TOKENIZER.encode(prompts[f"{which} prompt"])]])
                        for which in ("clean", "corrupted"))
    metric = logit_difference(-1, *CIRCUIT_TOKENIZER.encode("ha"))
    heads, residual = patch_heads(model, clean, corrupted, metric), patch_residual(model, clean, corrupted, metric)
    np.testing.assert_allclose(grid(tab, "patch-heads"), heads.fraction, atol=1e-6)
    np.testing.assert_allclose(grid(tab, "patch-residual"), residual.fraction, atol=1e-6)
    cells = {(c.get_attribute("data-layer"), c.get_attribute("data-head")): c.text
             for c in root.find_elements(By.CSS_SELECTOR, ".patch-heads td.cell")}
    assert cells[("1", "0")] == "1.00" and cells[("0", "1")] == "0.00"  # the induction head: all of it; a head that writes nothing
    assert root.find_element(By.CSS_SELECTOR, ".tool-summary").text == (
        f"logit of “h” − “a” at the last token: clean {shown(heads.clean, 2)}, corrupted {shown(heads.corrupted, 2)}")
    box = tab.find_element(By.CSS_SELECTOR, "input[aria-label='corrupted prompt']")
    box.clear()
    box.send_keys("abcdefXXhabcdefg", Keys.ENTER)  # a token longer than the clean prompt
    wait_for_tool(tab, "patching", "refused")
    assert root.find_element(By.CSS_SELECTOR, ".tool-error").text == ("the clean prompt is 15 tokens and the corrupted one 16: "
                                                                      "patching swaps activations position by position, so give prompts of the same length")
    assert not root.find_element(By.CSS_SELECTOR, ".tool-grids").is_displayed()
    choose_run(tab, "run")  # another run: nothing of the circuit's patch is sent there or shown
    assert root.get_attribute("data-state") == ""  # not busy with a patch nobody asked of this run
    assert root.find_element(By.CSS_SELECTOR, "h2").text == "Activation patching"  # no checkpoint of the circuit's
    assert not root.find_element(By.CSS_SELECTOR, ".tool-error").is_displayed()
    assert not root.find_element(By.CSS_SELECTOR, ".tool-grids").is_displayed()
    assert not root.find_element(By.CSS_SELECTOR, ".caution").is_displayed()  # (the circuit's metric moved by 12)
    # The name swap, which this run of 20 steps barely tells apart: said beside the shares.
    model, tokenizer = Checkpoint.load(logdir / "run" / BEST).build_model()
    swap = name_swap(tokenizer, *one_token_names(tokenizer)[:2])
    typed = {"clean prompt": tokenizer.decode(swap.clean[0, 1:].tolist()), "metric token": tokenizer.decode([swap.answer]),
             "corrupted prompt": tokenizer.decode(swap.corrupted[0, 1:].tolist()), "metric against token": tokenizer.decode([swap.other])}
    for label, value in typed.items():
        box = tab.find_element(By.CSS_SELECTOR, f"input[aria-label='{label}']")
        box.clear()
        box.send_keys(value)
    click(tab, tab.find_element(By.XPATH, "//button[text()='patch']"))
    wait_for_tool(tab, "patching")
    caution = root.find_element(By.CSS_SELECTOR, ".caution")
    assert caution.is_displayed() and caution.text == patch_heads(model, swap.clean, swap.corrupted, swap.metric()).caution
    choose_run(tab, "circuit")
