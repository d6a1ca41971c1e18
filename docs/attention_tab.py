"""Take the README's screenshot of the Attention tab: `make docs` (the newest run) or
`python docs/attention_tab.py <run dir>`.

TensorBoard serves the run; headless Chromium opens the tab in a 1280 x 800 window at the last
logged step, opens the head with the most recall weight (else induction) in every view, and pins
the query where that head looks furthest back, then saves docs/attention_tab.png.
"""

import argparse
import json
import sys
import urllib.request
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attention_tab import browser  # noqa: E402
from inspection.attention_summary import PLUGIN_NAME  # noqa: E402
from training.checkpoint import resolve_checkpoint  # noqa: E402
from training.errors import exit_on_user_error  # noqa: E402
from user_error import UserError  # noqa: E402

SCREENSHOT = Path(__file__).resolve().parent / "attention_tab.png"


def read(base: str, route: str):
    with urllib.request.urlopen(f"{base}/data/plugin/{PLUGIN_NAME}/{route}") as response:
        return response.read()


def pick_head_and_query(base: str, run: dict) -> tuple[int, int, int, int]:
    """(layer, head, query, key): the head that copies most at the last step, and its query whose
    top weight lies furthest back (not on itself or the token just before)."""
    metrics, step = json.loads(read(base, f"metrics?run={run['run']}")), run["steps"][-1]
    metric = next((m for m in ("recall", "induction") if m in metrics), None)
    if metric is None:
        raise UserError(f"run {run['run']} logged no recall or induction metrics; train with train.attn_log_interval > 0")
    values = np.array(metrics[metric]["values"][metrics[metric]["steps"].index(step)], dtype=float)  # (L, H)
    layer, head = np.unravel_index(np.nanargmax(values), values.shape)
    weights = np.frombuffer(read(base, f"weights?run={run['run']}&step={step}"), "<f2").reshape(run["shape"])
    far_back = np.tril(weights[layer, head].astype(np.float32), k=-2)  # (T, T): keys at least 2 tokens back
    query = int(far_back.max(axis=1).argmax())
    return int(layer), int(head), query, int(far_back[query].argmax())


def take_screenshot(run_dir: Path, out: Path = SCREENSHOT) -> tuple[int, int, int]:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    with browser.tensorboard_server("--logdir", str(run_dir.parent)) as base, browser.headless_chromium(1280, 800) as driver:
        runs = browser.attention_runs(base, until=lambda runs: any(r["run"] == run_dir.name for r in runs))
        run = next((r for r in runs if r["run"] == run_dir.name), None)
        if run is None:
            raise UserError(f"{run_dir} has no attention data for the tab; train with train.attn_log_interval > 0")
        layer, head, query, key = pick_head_and_query(base, run)
        browser.open_tab(driver, base)
        browser.choose_run(driver, run_dir.name)
        driver.find_element(By.CSS_SELECTOR, f".head-cell[data-layer='{layer}'][data-head='{head}']").click()
        driver.find_element(By.XPATH, "//button[text()='all heads']").click()
        token = driver.find_element(By.CSS_SELECTOR, f".token[data-side=query][data-index='{query}']")
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", token)
        token.click()
        between = driver.find_element(By.CSS_SELECTOR, f".token[data-side=key][data-index='{(query + key) // 2}']")
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", between)  # the query and its key
        canvas = driver.find_element(By.CSS_SELECTOR, "canvas.matrix")
        cell = canvas.size["width"] / len(run["labels"])
        x, y = ((key + 0.5) * cell - canvas.size["width"] / 2), ((query + 0.5) * cell - canvas.size["height"] / 2)
        ActionChains(driver).move_to_element_with_offset(canvas, round(x), round(y)).perform()
        browser.screenshot(driver, out)
    # A palette of 256 colours keeps the file small; the maps' colours are among them.
    Image.open(out).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    return layer, head, query


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run dir, or latest")
    args = parser.parse_args()
    with exit_on_user_error():
        run_dir = resolve_checkpoint(args.run).parent
        layer, head, query = take_screenshot(run_dir)
    print(f"wrote {SCREENSHOT}: layer {layer} head {head}, query token {query} pinned")
