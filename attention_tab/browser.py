"""A real TensorBoard server and a headless Chromium to look at the Attention tab with: for its
tests (tests/test_attention_tab.py), its screenshot in the README (docs/attention_tab.py) and
its first-render time (bench/tab.py). Chromium and its driver are Debian's `chromium` and
`chromium-driver` packages (`make browser` installs them); Selenium drives them."""

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from inspection.tab_format import PLUGIN_NAME

TAB_URL = "{base}/#" + PLUGIN_NAME
BROWSER_MISSING = ("the Attention tab's browser tests need Chromium and its driver: run `make browser` "
                   "(Debian/Ubuntu: apt-get install chromium chromium-driver)")


@contextmanager
def tensorboard_server(*logdir_args: str, timeout: float = 60, console_script: bool = False) -> Iterator[str]:
    """`tensorboard <logdir_args>` on 127.0.0.1 and a free port, as a subprocess of this
    interpreter's environment: yields its base URL, stops it at the end. console_script: run the
    environment's `tensorboard` command (what make tensorboard runs) from a folder outside the
    project, so the tab works from the installed packages alone; else `python -m tensorboard.main`."""
    command = [str(Path(sys.executable).parent / "tensorboard")] if console_script else [sys.executable, "-m", "tensorboard.main"]
    command += [*logdir_args, "--host", "127.0.0.1", "--port", "0", "--reload_interval", "1"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              cwd=tempfile.gettempdir() if console_script else None)
    try:
        yield wait_for_url(server, timeout)
    finally:
        server.terminate()
        server.wait(timeout=10)


def wait_for_url(server: subprocess.Popen, timeout: float) -> str:
    """The URL TensorBoard prints once it serves ("TensorBoard 2.x at http://127.0.0.1:port/")."""
    deadline, said = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        line = server.stdout.readline()
        if not line and server.poll() is not None:
            break
        said.append(line)
        if found := re.search(r"(http://127\.0\.0\.1:\d+)/", line):
            return found[1]
    raise RuntimeError("TensorBoard did not start:\n" + "".join(said))


def attention_runs(base_url: str, until: Callable[[list], bool] = bool, timeout: float = 30) -> list[dict]:
    """The tab's /runs once `until` holds for them (TensorBoard loads event files in the background,
    so a server just started may list nothing yet), or as they are after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(f"{base_url}/data/plugin/{PLUGIN_NAME}/runs") as response:
            runs = json.load(response)["runs"]
        if until(runs) or time.monotonic() > deadline:
            return runs
        time.sleep(0.2)


def chromium_paths() -> tuple[str, str]:
    """(browser, driver) on PATH, or a RuntimeError that says how to install them."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (browser and driver):
        raise RuntimeError(BROWSER_MISSING)
    return browser, driver


@contextmanager
def headless_chromium(width: int = 1280, height: int = 800):
    """A Selenium WebDriver on headless Chromium whose page is width x height CSS pixels."""
    from selenium import webdriver  # a development requirement: only the tests, docs and bench use it
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={width},{height}", "--hide-scrollbars", "--force-device-scale-factor=1"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        # --window-size is the window's: its own frame takes 143 px of the height (a 1280 x 657 page).
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        yield driver
    finally:
        driver.quit()


def open_tab(driver, base_url: str, timeout: float = 60) -> float:
    """Opens the Attention tab and waits until it has drawn a step, inside the tab's frame (the
    driver stays switched into it). Returns the time from navigation to the first drawn view, in s."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(TAB_URL.format(base=base_url))
    frame = WebDriverWait(driver, timeout).until(lambda d: d.find_element(By.CSS_SELECTOR, "iframe"))
    started = driver.execute_script("return performance.timeOrigin")
    driver.switch_to.frame(frame)
    drawn = WebDriverWait(driver, timeout, poll_frequency=0.05).until(
        lambda d: d.execute_script("return document.body && document.body.dataset.firstDrawnAt"))
    return (float(drawn) - started) / 1000


def choose_run(driver, run: str, timeout: float = 30) -> None:
    """Picks a run in the tab's run menu and waits until the views show it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    Select(driver.find_element(By.CSS_SELECTOR, "select[aria-label=run]")).select_by_visible_text(run)
    WebDriverWait(driver, timeout, poll_frequency=0.05).until(
        lambda d: d.execute_script("return document.body.dataset.drawnRun") == run)


def screenshot(driver, path: Path) -> None:
    driver.switch_to.default_content()
    path.write_bytes(driver.get_screenshot_as_png())
