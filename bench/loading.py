"""The loading section: peak memory of reading a Hugging Face GPT-2 folder into this project's GPT."""

import shutil
import subprocess
import sys
from pathlib import Path

import torch

from bench.common import ROOT

GPT2_MEDIUM = {"n_layer": 24, "n_head": 16, "n_embd": 1024, "n_positions": 1024, "vocab_size": 50257}

# In a fresh process, its peak resident memory after the imports and after loading. VmHWM (Linux)
# rather than ru_maxrss: a child's ru_maxrss keeps the peak of the process it was forked from.
MEASURE = """
import re, sys
from model_io.hf_models import gpt_from_hf
def peak(): return int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
imports = peak()
gpt_from_hf(sys.argv[1])
print(imports, peak())
"""


def bench_loading(work: Path) -> dict:
    """Peak resident memory of a fresh process that loads random weights of GPT-2 medium's shape
    (355M parameters, 1.42 GB in fp32), written by transformers' save_pretrained, against the
    size of their file; the aim is at most about 1.3x (one copy, no second)."""
    from transformers import GPT2Config, GPT2LMHeadModel  # a dev requirement, like the nanogpt section's checkout

    folder = work / "gpt2-weights"
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(**GPT2_MEDIUM)).save_pretrained(folder)
    size = (folder / "model.safetensors").stat().st_size
    output = subprocess.run([sys.executable, "-c", MEASURE, str(folder)], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout
    imports, peak = map(int, output.split())
    shutil.rmtree(folder)
    return {"weights_gb": size / 1e9, "imports_gb": imports / 1e9, "peak_gb": peak / 1e9, "peak_vs_weights": peak / size}
