"""The tab section: the Attention tab in headless Chromium, first render and step changes."""

import statistics
import subprocess
import sys
from pathlib import Path

from bench.common import ROOT

# The tab section's runs: config overrides on top of a short run that logs attention 5 times.
TAB_RUNS = {
    "default model (4 x 4, 64-token probe)": [],
    "12 x 12 model (128-token probe)": ["model.n_layer=12", "model.n_head=12", "model.n_embd=192",
                                        "model.block_size=128", "train.probe_tokens=128", "train.batch_size=4"],
}
TAB_RUN_SHORT = ["train.max_steps=20", "train.attn_log_interval=5", "train.eval_interval=20", "train.eval_iters=1",
                 "train.sample_interval=0"]
# Moves the slider to each logged step in turn; resolves with the slowest input-to-drawn time, in ms.
SLIDER_SCRIPT = """
const done = arguments[arguments.length - 1], slider = document.querySelector("input[type=range]");
const times = [];
const move = (index) => {
  if (index < 0) return done(Math.max(...times));
  const started = performance.now();
  slider.value = index;
  slider.dispatchEvent(new Event("input"));
  const step = document.querySelector(".step-label").textContent.split(" ")[0];  // set at once, drawn later
  const wait = () => {
    if (document.body.dataset.drawnStep !== step) return setTimeout(wait, 0);
    times.push(performance.now() - started);
    move(index - 1);
  };
  wait();
};
move(Number(slider.max) - 1);
"""


def bench_tab(repeats: int, work: Path) -> dict:
    from selenium.webdriver.support.ui import WebDriverWait

    from attention_tab.browser import attention_runs, headless_chromium, open_tab, tensorboard_server

    results = {}
    for name, extra in TAB_RUNS.items():
        run_dir = work / f"tab-{len(results)}" / "run"
        result = subprocess.run([sys.executable, str(ROOT / "train.py"), *TAB_RUN_SHORT, *extra, f"hydra.run.dir={run_dir}"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"error: the tab benchmark's run failed:\n{result.stderr}")
        first, slider = [], []
        with tensorboard_server("--logdir", str(run_dir.parent)) as base:
            attention_runs(base, until=lambda runs: runs and len(runs[0]["steps"]) == 5)
            for _ in range(repeats):
                with headless_chromium(1280, 800) as driver:
                    first.append(open_tab(driver, base))
                    WebDriverWait(driver, 60).until(lambda d: d.execute_script("return document.body.dataset.prefetched"))
                    slider.append(driver.execute_async_script(SLIDER_SCRIPT) / 1000)
        results[name] = {"first_render_s": statistics.median(first), "step_change_s": statistics.median(slider)}
    return results

