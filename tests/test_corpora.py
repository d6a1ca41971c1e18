"""data=shakespeare: a download checked against its sha256, against a real HTTP server on
127.0.0.1; and a local copy given as data.path."""

import hashlib
import time

import pytest

from data.corpus import load_documents
from training.errors import UserError

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 200
TEXT_SHA256 = hashlib.sha256(TEXT.encode()).hexdigest()


def shakespeare_cfg(tmp_path, url, sha256=TEXT_SHA256, path=None):
    return {"source": "shakespeare", "url": url, "sha256": sha256, "path": path, "val_fraction": 0.1, "cache_dir": str(tmp_path / "cache")}


def cached_files(tmp_path):
    folder = tmp_path / "cache" / "corpora"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_the_right_hash_caches_the_file_and_later_runs_need_no_server(tmp_path, file_server):
    served, base = file_server
    (served / "input.txt").write_text(TEXT)
    cfg = shakespeare_cfg(tmp_path, f"{base}/input.txt")
    assert load_documents(cfg) == [TEXT]
    assert cached_files(tmp_path) == [f"{TEXT_SHA256[:16]}-input.txt"]
    (served / "input.txt").unlink()  # the server no longer has it: the cache answers
    assert load_documents(cfg) == [TEXT]


def test_a_wrong_hash_keeps_nothing_and_says_so(tmp_path, file_server):
    served, base = file_server
    (served / "input.txt").write_text(TEXT + "tampered")
    with pytest.raises(UserError, match=r"input\.txt has sha256 [0-9a-f]{64}, not the expected .*nothing was kept"):
        load_documents(shakespeare_cfg(tmp_path, f"{base}/input.txt"))
    assert cached_files(tmp_path) == []


def test_a_server_that_is_down_fails_quickly_and_names_the_offline_way(tmp_path, closed_port_url):
    start = time.perf_counter()
    with pytest.raises(UserError) as caught:
        load_documents(shakespeare_cfg(tmp_path, f"{closed_port_url}/input.txt"))
    assert time.perf_counter() - start < 5
    assert "could not download" in str(caught.value) and "data=text data.path=<file>" in str(caught.value)
    assert cached_files(tmp_path) == []


def test_a_local_copy_is_used_only_if_its_hash_matches(tmp_path, closed_port_url):
    copy = tmp_path / "input.txt"
    copy.write_text(TEXT)
    assert load_documents(shakespeare_cfg(tmp_path, f"{closed_port_url}/input.txt", path=str(copy))) == [TEXT]
    copy.write_text(TEXT.upper())
    with pytest.raises(UserError, match=r"data.path=.*input\.txt has sha256 .* not the expected"):
        load_documents(shakespeare_cfg(tmp_path, f"{closed_port_url}/input.txt", path=str(copy)))
