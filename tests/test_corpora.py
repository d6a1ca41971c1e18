"""data=shakespeare: a download checked against its sha256, against a real HTTP server on
127.0.0.1; and a local copy given as data.path. data=text: the file formats, read as a stream."""

import gzip
import hashlib
import json
import re
import time

import pytest

from data import corpus
from data.corpus import load_documents
from data.specs import CorpusSpec
from user_error import UserError

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 200
TEXT_SHA256 = hashlib.sha256(TEXT.encode()).hexdigest()


def shakespeare_cfg(tmp_path, url, sha256=TEXT_SHA256, path=None):
    return CorpusSpec(source="shakespeare", url=url, sha256=sha256, path=path, val_fraction=0.1, cache_dir=str(tmp_path / "cache"))


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


def text_files_cfg(path, text_field="text"):
    return CorpusSpec(source="text", path=str(path), text_field=text_field, val_fraction=0.1, cache_dir=".cache")


def test_a_folder_reads_txt_jsonl_and_their_gz_files_in_order_one_document_each(tmp_path):
    (tmp_path / "a.txt").write_text("a whole file\n")
    (tmp_path / "b.txt.gz").write_bytes(gzip.compress(b"a packed file"))
    lines = [{"text": "first line", "id": 1}, {"text": "  \n"}, {"text": "second\r\nline"}]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress(json.dumps({"text": "packed line"}).encode()))
    (tmp_path / "notes.md").write_text("not a corpus file")
    assert load_documents(text_files_cfg(tmp_path)) == [
        "a whole file\n", "a packed file", "first line", "second\nline", "packed line"]  # blank lines and documents left out


def test_jsonl_reads_the_field_data_text_field_names(tmp_path):
    (tmp_path / "s.jsonl").write_text('{"story": "Once", "text": "no"}\n{"story": "Twice"}\n')
    assert load_documents(text_files_cfg(tmp_path / "s.jsonl", "story")) == ["Once", "Twice"]


@pytest.mark.parametrize(("content", "message"), [
    ('{"text": "ok"}\n{"text": oops}\n', "s.jsonl, line 2: not valid JSON (Expecting value, column 10); fix or remove that line"),
    ('{"text": "ok"}\n\n{"body": "x", "id": 3}\n', "s.jsonl, line 3: no 'text' field (it has 'body', 'id'); set data.text_field"),
    ('["a list"]\n', "s.jsonl, line 1: no 'text' field (it has a JSON array, no fields)"),
    ('{"text": 42}\n', "s.jsonl, line 1: 'text' holds a JSON number, not text"),
    ('{"text": null}\n', "s.jsonl, line 1: 'text' holds null, not text"),  # in JSON's words, not Python's NoneType
    ('{"text": "ok"}\n{"text": "half a pair \\ud800"}\n', "s.jsonl, line 2: 'text' holds a lone surrogate escape"),
])
def test_a_bad_jsonl_line_is_named_by_file_and_line(tmp_path, content, message):
    (tmp_path / "s.jsonl").write_text(content)
    with pytest.raises(UserError, match=re.escape(message)):
        load_documents(text_files_cfg(tmp_path / "s.jsonl"))


def test_a_long_file_comes_in_pieces_that_join_to_it_across_split_characters_and_line_ends(tmp_path, monkeypatch):
    text = "naïve café\r\nßtraße ☃ — end\r\n" * 40
    (tmp_path / "long.txt").write_bytes(text.encode())
    monkeypatch.setattr(corpus, "CHUNK_BYTES", 7)  # cuts inside multi-byte characters and CRLFs
    pieces = list(corpus.read_corpus(text_files_cfg(tmp_path / "long.txt")))
    assert len(pieces) > 100 and [p.starts_document for p in pieces] == [True] + [False] * (len(pieces) - 1)
    assert "".join(p.text for p in pieces) == text.replace("\r\n", "\n")
    (tmp_path / "bad.txt").write_bytes(b"ok ok " * 5 + b"\xff")
    with pytest.raises(UserError, match=r"bad\.txt is not UTF-8 text \(byte 30 is 0xff\)"):
        list(corpus.read_corpus(text_files_cfg(tmp_path / "bad.txt")))
    # Saved with a byte order mark (Notepad's "UTF-8 with BOM"): the same text, no U+FEFF character;
    # the mark still counts in a bad byte's place in the file. A U+FEFF later on is text.
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbf" + text.encode() + "\ufeff".encode())
    pieces = list(corpus.read_corpus(text_files_cfg(tmp_path / "bom.txt")))
    assert "".join(p.text for p in pieces) == text.replace("\r\n", "\n") + "\ufeff"
    (tmp_path / "bad.txt").write_bytes(b"\xef\xbb\xbf" + b"ok ok " * 5 + b"\xff")
    with pytest.raises(UserError, match=r"bad\.txt is not UTF-8 text \(byte 33 is 0xff\)"):
        list(corpus.read_corpus(text_files_cfg(tmp_path / "bad.txt")))
    # Only the file's first character is the mark: one that begins a later chunk, or that follows
    # leading spaces held back until the text starts, is text.
    monkeypatch.setattr(corpus, "CHUNK_BYTES", 3)
    for name, marked in (("second_chunk.txt", "ab \ufeffcd"), ("after_spaces.txt", "   \ufeffx")):
        (tmp_path / name).write_bytes(marked.encode())
        assert "".join(p.text for p in corpus.read_corpus(text_files_cfg(tmp_path / name))) == marked
