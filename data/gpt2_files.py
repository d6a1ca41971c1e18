"""The GPT-2 encoding's files: downloaded once into the project's cache, then offline.

tiktoken.get_encoding("gpt2") reads two files from the internet (vocab.bpe and
encoder.json). tiktoken keeps them in TIKTOKEN_CACHE_DIR under the name sha1(url) and
checks their sha256 itself. This module points that cache at <cache_dir>/tiktoken and
fetches missing files itself, with a short timeout and the same sha256 check, so that no network means one clear error
at once instead of a long hang.

    load_gpt2_encoding(cache_dir) -> tiktoken.Encoding
"""

import hashlib
import os
from pathlib import Path

import tiktoken

from data.download import verified_copy

GPT2_FILES_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main"
# The files and their sha256, as tiktoken itself checks them (tiktoken_ext/openai_public.py).
GPT2_FILES = {
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}


def load_gpt2_encoding(cache_dir: Path, mirror: str | None = None) -> tiktoken.Encoding:
    """tiktoken's GPT-2 encoding with its files in <cache_dir>/tiktoken. Missing files are
    fetched from mirror (a base URL holding vocab.bpe and encoder.json), or OpenAI's."""
    tiktoken_dir = (cache_dir / "tiktoken").resolve()
    os.environ["TIKTOKEN_CACHE_DIR"] = str(tiktoken_dir)
    for name, sha256 in GPT2_FILES.items():
        official_url = f"{GPT2_FILES_URL}/{name}"
        cached = tiktoken_dir / hashlib.sha1(official_url.encode()).hexdigest()
        verified_copy(
            f"{(mirror or GPT2_FILES_URL).rstrip('/')}/{name}", sha256, cached,
            offline_advice="tokenizer=gpt2 needs its files from the internet once; tokenizer=bpe and tokenizer=char work offline",
            mismatch_advice="Check tokenizer.url",
        )
    return tiktoken.get_encoding("gpt2")  # reads the checked files from the cache
