"""The data section: tokenising a corpus streamed and at once, and learning BPE by rustbpe and by data/bpe.py."""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from bench.common import ROOT, median_time
from data.bpe import train_bpe
from data.tokenizer import train_bpe_fast

# The data section: one tokenisation in a fresh process, whose peak memory is then its own.
STREAMED_SCRIPT = """
import json, resource, sys, time
from data.specs import CorpusSpec, TokenizerSpec
from data.token_cache import write_cache_entry
from data.token_stream import survey_corpus, train_sample
from data.tokenizer import build_tokenizer
from pathlib import Path
corpus, tokenizer_spec = CorpusSpec.of(json.loads(sys.argv[1])), TokenizerSpec.of(json.loads(sys.argv[2]))
times = [time.perf_counter()]
survey = survey_corpus(corpus, tokenizer_spec)
times.append(time.perf_counter())
cache = Path(corpus.cache_dir)
tokenizer = build_tokenizer(tokenizer_spec, survey.chars, lambda: train_sample(corpus, survey), cache, survey.key)
times.append(time.perf_counter())
write_cache_entry(cache / "tokens" / survey.key, corpus, tokenizer, survey)
times.append(time.perf_counter())
phases = dict(zip(("survey_s", "tokenizer_s", "encode_s"), [b - a for a, b in zip(times, times[1:])]))
meta = json.loads((cache / "tokens" / survey.key / "meta.json").read_text())
print(json.dumps({**phases, "seconds": times[-1] - times[0], "tokens": meta["n_train"] + meta["n_val"],
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""
IN_MEMORY_SCRIPT = """
import json, resource, sys, time
import numpy as np
from data.tokenizer import tokenizer_from_state
path, state = sys.argv[1], json.loads(sys.argv[2])
started = time.perf_counter()
text = open(path, encoding="utf-8").read()
if state["kind"] == "char":  # nanoGPT's shakespeare_char/prepare.py
    stoi = {ch: i for i, ch in enumerate(sorted(set(text)))}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
else:  # its openwebtext/prepare.py: encode_ordinary, here with the vocabulary the stream learned
    ids = np.array(tokenizer_from_state(state).encode(text), dtype=np.uint16)
print(json.dumps({"seconds": time.perf_counter() - started, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "tokens": len(ids)}))
"""


def python_sources_corpus(path: Path, megabytes: int) -> int:
    """About `megabytes` of text made from local files: the .py files of the installed packages."""
    site = Path(torch.__file__).resolve().parent.parent
    written = 0
    with open(path, "w", encoding="utf-8") as out:
        while written < megabytes * 1e6:
            for source in sorted(site.rglob("*.py")):
                try:
                    text = source.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    continue
                out.write(text)
                written += len(text.encode())
                if written >= megabytes * 1e6:
                    break
    return written


def run_json(script: str, *args: str) -> dict:
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # where the packages may be too
    result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": pythonpath})
    if result.returncode != 0:
        sys.exit(f"error: the data benchmark's run failed:\n{result.stderr}")
    return json.loads(result.stdout.splitlines()[-1])


AT_ONCE_MAX_MB = 200  # nanoGPT's way holds ~14 bytes per character: above this it would need many GB
TRAINERS_MB = 10  # the lesson trainer learns from this much text in the trainers' comparison


def bench_data(repeats: int, work: Path, megabytes: int) -> dict:
    corpus = work / "data-corpus.txt"
    work.mkdir(parents=True, exist_ok=True)
    n_bytes = python_sources_corpus(corpus, megabytes)
    results = {"corpus_mb": n_bytes / 1e6}
    for kind, tokenizer_cfg in (("char", {"kind": "char"}), ("bpe", {"kind": "bpe", "vocab_size": 2048})):
        runs = []
        for i in range(repeats):
            data_cfg = {"source": "text", "path": str(corpus), "text_field": "text", "val_fraction": 0.0,
                        "cache_dir": str(work / f"data-cache-{kind}-{i}")}
            runs.append(run_json(STREAMED_SCRIPT, json.dumps(data_cfg), json.dumps(tokenizer_cfg)))
        streamed = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        results[kind] = {"streamed": {**streamed, "mb_per_s": n_bytes / 1e6 / streamed["seconds"]}}
        if megabytes <= AT_ONCE_MAX_MB:
            entry = next((work / f"data-cache-{kind}-0" / "tokens").iterdir())
            state = json.loads((entry / "meta.json").read_text())["tokenizer"]
            in_memory = [run_json(IN_MEMORY_SCRIPT, str(corpus), json.dumps(state)) for _ in range(repeats)]
            seconds = statistics.median(r["seconds"] for r in in_memory)
            results[kind]["in_memory"] = {"tokens": in_memory[0]["tokens"], "seconds": seconds,
                                          "peak_mib": statistics.median(r["peak_mib"] for r in in_memory),
                                          "mb_per_s": n_bytes / 1e6 / seconds}
    results["trainers"] = bpe_trainers(corpus, repeats)
    return results


def megabyte_pieces(text: str) -> list[str]:
    """text in 1 MB pieces, as the stream hands them to rustbpe (which splits its pieces over the cores)."""
    return [text[i : i + 1_000_000] for i in range(0, len(text), 1_000_000)]


def bpe_trainers(corpus: Path, repeats: int) -> dict:
    """rustbpe beside data/bpe.py, the lesson trainer, learning 2,048 tokens from the same text."""
    with open(corpus, encoding="utf-8") as file:
        text = file.read(TRAINERS_MB * 1_000_000)
    return {"mb": len(text.encode()) / 1e6,
            "rustbpe_s": median_time(lambda: train_bpe_fast(megabyte_pieces(text), 2048), repeats, warmup=0),
            "lesson_s": median_time(lambda: train_bpe(text, 2048), repeats, warmup=0)}

