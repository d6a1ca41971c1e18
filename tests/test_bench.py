"""python -m bench runs end to end and writes every figure it prints (the figures themselves are
the benchmark's business, not the tests')."""

import json
import os
import subprocess
import sys

from conftest import ROOT


def spawn_bench(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -m bench <args>` as a subprocess, from the project's folder as `make bench` runs it."""
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                          capture_output=True, text=True, timeout=timeout)


def test_the_benchmark_runs_its_default_sections_and_writes_json(tmp_path):
    # The opt-in sections, recipe and compile, are train.py runs with other arguments: the
    # same code as the training and quality sections, only minutes longer.
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n\n" * 400)
    out = tmp_path / "results" / "bench.json"
    result = spawn_bench("--repeats", "1", "--steps", "60", "--new-tokens", "20", "--preset-steps", "20",
                         "--corpus", str(corpus), "--out", str(out), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    record = json.loads(out.read_text())
    figures = record["results"]
    assert figures["peak"]["matmul_gflops"] > 0
    training = figures["training"]
    assert training["tokens_per_sec"] > 0 and 0 < training["mfu"] < 1.5
    assert 780_000 < training["params"] < 820_000  # nanoGPT's CPU shape: about 0.8 M parameters
    quality = figures["quality"]
    assert quality["seconds"] > 0 and 0 < quality["val_loss"] < 5
    assert quality["reached_target"] == (quality["val_loss"] <= 1.886)
    sampling = figures["sampling"]
    assert set(sampling) == {"L6_H6_C384", "default"}
    assert 900_000 < sampling["default"]["params"] < 1_000_000  # the default model, with the default run's vocabulary
    assert 10_000_000 < sampling["L6_H6_C384"]["params"] < 11_000_000  # nanoGPT's shakespeare-char model
    assert all(s["kv_cache_tokens_per_sec"] > 0 and s["recompute_tokens_per_sec"] > 0 for s in sampling.values())
    assert all(s["compiled_tokens_per_sec"] > 0 and s["compile_seconds"] > 0 for s in sampling.values())
    assert set(figures["attention"]) == {"B8_T256_C384_H6", "B12_T64_C128_H4"}
    startup = figures["startup"]
    # both processes import torch first; which of them is quicker depends on the load of the moment
    assert 0 < startup["import_torch_seconds"] < min(startup["sample_seconds"], startup["train_first_step_seconds"])
    assert "tokens/s with KV cache" in result.stdout and f"written: {out}" in result.stdout
    assert (out.parent / next(p.name for p in out.parent.iterdir() if p.name.startswith("runs-"))).is_dir()


def test_an_unknown_section_is_one_clear_line(tmp_path):
    result = spawn_bench("--only", "speed")
    assert result.returncode == 1
    assert result.stderr == (
        "error: --only speed is not a section (choose from peak, training, quality, recipe, compile, sampling, attention, startup, data, nanogpt, tab)\n"
    )


def test_the_data_section_tokenises_a_corpus_streamed_and_at_once_into_as_many_ids(tmp_path):
    out = tmp_path / "bench.json"
    result = spawn_bench("--only", "data", "--repeats", "1", "--data-mb", "1", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())["results"]["data"]
    assert 1 <= data["corpus_mb"] < 1.5
    for kind in ("char", "bpe"):
        streamed, at_once = data[kind]["streamed"], data[kind]["in_memory"]
        assert streamed["tokens"] == at_once["tokens"] + 1 > 1  # the same ids, and the <|endoftext|> before the file
        assert streamed["seconds"] >= streamed["encode_s"] > 0 and streamed["peak_mib"] > 0 and at_once["peak_mib"] > 0
    assert "tokenising 1 MB, bpe, streamed" in result.stdout
    assert data["trainers"]["mb"] == data["corpus_mb"] and data["trainers"]["lesson_s"] > data["trainers"]["rustbpe_s"] > 0


def test_the_nanogpt_section_without_a_nanogpt_checkout_is_one_clear_line(tmp_path):
    # The section itself needs nanoGPT's code, which this project does not ship (see the README).
    missing = spawn_bench("--only", "nanogpt")
    assert missing.returncode == 1
    assert missing.stderr == "error: --only nanogpt needs --nanogpt <a checkout of karpathy/nanoGPT>; clone it and give its folder\n"
    (tmp_path / "train.py").write_text("")
    not_nanogpt = spawn_bench("--only", "nanogpt", "--nanogpt", str(tmp_path))
    assert not_nanogpt.returncode == 1 and not_nanogpt.stderr.count("\n") == 1
    assert not_nanogpt.stderr.startswith(f"error: --nanogpt {tmp_path} is not a nanoGPT checkout (it needs train.py, model.py")
