"""Take the README's screenshot of the Attention tab: `make docs` (the newest run) or
`python docs/attention_tab.py <run dir>`.

TensorBoard serves the run; headless Chromium opens the tab with a 1280 x 800 page, types a story
where a name comes back, knocks out the head with the most recall weight at the last logged step
(else induction), opens it in the token and matrix views and pins the query just before the name
comes back, then saves docs/attention_tab.png: your text's numbers beside the intact model's.
"""

import argparse
import base64
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attention_tab import browser  # noqa: E402
from attention_tab.page_settings import BADGE_METRICS  # noqa: E402
from cli.errors import exit_on_user_error  # noqa: E402
from inspection.tab_format import PLUGIN_NAME  # noqa: E402
from model_io.run_files import resolve_checkpoint  # noqa: E402
from user_error import UserError  # noqa: E402

TEXT = "Once upon a time, there was a kind boy named Leo. He lived near the sea with his dog. One day, Leo"
SCREENSHOT = Path(__file__).resolve().parent / "attention_tab.png"


def read(base: str, route: str, form: dict[str, str] | None = None):
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    try:
        with urllib.request.urlopen(f"{base}/data/plugin/{PLUGIN_NAME}/{route}", data=data) as response:
            return response.read()
    except urllib.error.HTTPError as refused:  # e.g. the text is longer than the run's block_size
        raise UserError(f"the Attention tab's {route} route refused: {refused.read().decode().strip()}") from None


def pick_head(base: str, run: dict) -> tuple[int, int]:
    """(layer, head): the head that looks back at earlier mentions most at the last logged step."""
    metrics, step = json.loads(read(base, f"metrics?run={run['run']}")), run["steps"][-1]
    metric = next((m for m in BADGE_METRICS if m in metrics), None)  # the model view's number, as the page picks it
    if metric is None:
        raise UserError(f"run {run['run']} logged no recall or induction metrics; train with train.attn_log_interval > 0")
    values = np.array(metrics[metric]["values"][metrics[metric]["steps"].index(step)], dtype=float)  # (L, H)
    layer, head = np.unravel_index(np.nanargmax(values), values.shape)
    return int(layer), int(head)


def take_screenshot(run_dir: Path, out: Path = SCREENSHOT) -> tuple[int, int, float, float]:
    """Returns the head knocked out and the loss of the name that comes back, intact and without it."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait

    with browser.tensorboard_server("--logdir", str(run_dir.parent)) as base, browser.headless_chromium(1280, 800) as driver:
        runs = browser.attention_runs(base, until=lambda runs: any(r["run"] == run_dir.name for r in runs))
        run = next((r for r in runs if r["run"] == run_dir.name), None)
        if run is None:
            raise UserError(f"{run_dir} has no attention data for the tab; train with train.attn_log_interval > 0")
        layer, head = pick_head(base, run)
        answer = json.loads(read(base, "text", {"run": run["run"], "text": TEXT, "knocked_out": f"{layer}:{head}"}))
        T = len(answer["labels"])
        query = T - 2  # the token before the name comes back
        weights = np.frombuffer(base64.b64decode(answer["weights"]), "<f2").reshape(answer["shape"])
        key = int(np.argmax(weights[layer, head, query, : query + 1].astype(np.float32)))
        browser.open_tab(driver, base)
        browser.choose_run(driver, run_dir.name)
        driver.find_element(By.CSS_SELECTOR, "input[aria-label='your text']").send_keys(TEXT, Keys.ENTER)
        wait = WebDriverWait(driver, 60, poll_frequency=0.05)
        wait.until(lambda d: d.execute_script("return document.body.dataset.drawnMode") == "text")
        driver.find_element(By.CSS_SELECTOR, f".head-cell[data-layer='{layer}'][data-head='{head}'] .knock").click()
        wait.until(lambda d: d.execute_script("return document.body.dataset.drawnKnockedOut") == f"{layer}:{head}")
        Select(driver.find_element(By.CSS_SELECTOR, "select[aria-label=layer]")).select_by_value(str(layer))
        driver.find_element(By.XPATH, f"//button[contains(@class, 'head-name')][normalize-space()='head {head}']").click()
        driver.find_element(By.XPATH, "//button[text()='all heads']").click()
        token = driver.find_element(By.CSS_SELECTOR, f".token[data-side=query][data-index='{query}']")
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", token)
        token.click()
        canvas = driver.find_element(By.CSS_SELECTOR, "canvas.matrix")
        cell = canvas.size["width"] / T
        x, y = ((key + 0.5) * cell - canvas.size["width"] / 2), ((query + 0.5) * cell - canvas.size["height"] / 2)
        ActionChains(driver, duration=0).move_to_element_with_offset(canvas, round(x), round(y)).perform()  # jump there, no glide
        browser.screenshot(driver, out)
    # A palette of 256 colours keeps the file small; the maps' colours are among them.
    Image.open(out).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    return layer, head, answer["intact"]["loss"][query], answer["next"]["loss"][query]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run dir, or latest")
    args = parser.parse_args()
    with exit_on_user_error():
        run_dir = resolve_checkpoint(args.run).parent
        layer, head, intact_loss, loss = take_screenshot(run_dir)
    print(f"wrote {SCREENSHOT}: layer {layer} head {head} knocked out; the name that comes back: "
          f"loss {intact_loss:.2f} intact, {loss:.2f} without the head")
