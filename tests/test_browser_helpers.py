"""attention_tab/browser.py without a browser or a TensorBoard: how it reads the URL a server prints,
polls the tab's /runs until they are there, and says how to get Chromium when it is missing. (With
TensorBoard and Chromium: tests/test_attention_tab.py, tests/test_attention_tab_browser.py.)"""

import json
import subprocess

import pytest

from attention_tab.browser import BROWSER_MISSING, attention_runs, chromium_paths, wait_for_url
from inspection.tab_format import PLUGIN_NAME


def printing(*lines: str) -> subprocess.Popen:
    """A process that prints lines and ends, as TensorBoard's output reads."""
    script = "".join(f"echo '{line}'; " for line in lines)
    return subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_the_server_url_is_read_from_tensorboards_line_and_a_server_that_ends_is_named_with_its_output():
    server = printing("W1126 some warning", "TensorBoard 2.20.0 at http://127.0.0.1:40123/ (Press CTRL+C to quit)")
    assert wait_for_url(server, timeout=30) == "http://127.0.0.1:40123"
    server.wait(timeout=30)
    failed = printing("E1126 no such logdir")
    with pytest.raises(RuntimeError, match=r"TensorBoard did not start:\nE1126 no such logdir"):
        wait_for_url(failed, timeout=30)


def test_attention_runs_polls_until_the_runs_are_there_or_the_time_is_up(file_server):
    folder, base = file_server
    runs = folder / "data" / "plugin" / PLUGIN_NAME / "runs"
    runs.parent.mkdir(parents=True)
    runs.write_text(json.dumps({"runs": []}))
    assert attention_runs(base, timeout=0) == []  # nothing yet, and no time to wait
    runs.write_text(json.dumps({"runs": [{"run": "a"}, {"run": "b"}]}))
    assert attention_runs(base, until=lambda found: len(found) == 2) == [{"run": "a"}, {"run": "b"}]


def test_a_missing_chromium_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no chromium, no chromedriver
    with pytest.raises(RuntimeError) as missing:
        chromium_paths()
    assert str(missing.value) == BROWSER_MISSING and "make browser" in BROWSER_MISSING
