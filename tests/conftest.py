"""Shared helpers: run the real CLIs in a temporary working folder, in this process or as
subprocesses."""

import functools
import importlib
import io
import logging
import os
import socket
import subprocess
import sys
import threading
import traceback
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from torch import nn

from cli.errors import run_cli as cli_entry
from model import CausalSelfAttention

# Each pytest-xdist worker keeps to one core, and so do the processes it starts: two workers
# with two torch threads each on two cores spend their time waiting on each other's threads.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parent.parent

# A model and run small enough to train in seconds, touching every logging path.
TINY_RUN = [
    "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
    "data.n_chars=20000", "train.max_steps=20", "train.batch_size=4",
    "train.eval_interval=10", "train.eval_iters=2", "train.log_interval=5",
    "train.attn_log_interval=10", "train.sample_interval=10", "train.sample_tokens=20",
    "train.probe_tokens=24", "optim.warmup_steps=2", "optim.lr=1e-2", "optim.min_lr=1e-3",
]


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(script: str, *args: str, cwd: Path) -> CliResult:
    """`python <script> <args>` (train.py or sample.py) in this process: the same entry point,
    command line and working folder, without a new interpreter's seconds of start-up. An
    exception that would end the process with a traceback gives exit 1 and that traceback."""
    entry = importlib.import_module(script.removesuffix(".py")).main
    stdout, stderr = io.StringIO(), io.StringIO()
    saved_argv, saved_cwd, saved_handlers = sys.argv, os.getcwd(), logging.root.handlers[:]
    sys.argv = [script, *args]
    os.chdir(cwd)
    returncode = 0
    try:
        with redirect_stdout(stdout), redirect_stderr(stderr):
            cli_entry(entry)
    except SystemExit as exit_:
        returncode = exit_.code if isinstance(exit_.code, int) else 1
    except Exception:
        returncode = 1
        stderr.write(traceback.format_exc())
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        for handler in set(logging.root.handlers) - set(saved_handlers):  # the run's log file and console
            logging.root.removeHandler(handler)
            handler.close()
    return CliResult(returncode, stdout.getvalue(), stderr.getvalue())


def spawn_cli(script: str, *args: str, cwd: Path, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python <script> <args>` as a subprocess: for what only a real process shows (signals,
    a terminal, torchrun, environment variables, the script's own start)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / script), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> Path:
    """One tiny real training run, shared by the tests that inspect what it wrote."""
    workdir = tmp_path_factory.mktemp("train")
    result = run_cli("train.py", *TINY_RUN, "hydra.run.dir=run", cwd=workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    return workdir / "run"


# The whole corpus tokenised at once, as simply as it can be said: what the stream
# (data/token_stream.py) must give, id for id.
def split_documents(documents: list[str], val_fraction: float) -> tuple[list[str], list[str], bool]:
    """Cut the corpus, read as one text, so the last val_fraction of its characters is val.
    The cut may fall inside a document: then its tail starts the val split, and the third
    value is True (that tail does not start a document)."""
    total = sum(len(doc) for doc in documents)
    remaining = total - int(total * val_fraction)  # characters that go to train
    for i, doc in enumerate(documents):
        if remaining < len(doc):
            head, tail = doc[:remaining], doc[remaining:]
            train = documents[:i] + ([head] if head else [])
            return train, [tail, *documents[i + 1 :]], bool(head)
        remaining -= len(doc)
    return documents, [], False


def encode_documents(tokenizer, documents: list[str], starts_mid_document: bool = False) -> list[int]:
    """<|endoftext|> doc <|endoftext|> doc ...; a leading piece that continues a document cut in
    two gets no token before it."""
    ids: list[int] = []
    for i, doc in enumerate(documents):
        if not (i == 0 and starts_mid_document):
            ids.append(tokenizer.eot_id)
        ids.extend(tokenizer.encode(doc))
    return ids


def made_up_attention(seed: int, n_layer: int, n_head: int, T: int) -> torch.Tensor:
    """Causal attention weights (n_layer, n_head, T, T) from random scores: what a model of that
    shape would log, without training one."""
    scores = torch.randn(n_layer, n_head, T, T, generator=torch.Generator().manual_seed(seed)) * 3
    return scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")).softmax(-1)


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep the test output clean
        pass


@pytest.fixture
def file_server(tmp_path_factory):
    """A real HTTP server on 127.0.0.1 serving a temporary folder: (folder, base URL)."""
    folder = tmp_path_factory.mktemp("served")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def closed_port_url() -> str:
    """The URL of a port on 127.0.0.1 where nothing listens: a server that is down."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def multihead_attention_like(module: CausalSelfAttention) -> nn.MultiheadAttention:
    """torch's nn.MultiheadAttention with the module's weights (the same [W_q; W_k; W_v] layout)."""
    C = module.proj.weight.shape[0]
    mha = nn.MultiheadAttention(C, module.n_head, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(module.qkv.weight)
        mha.in_proj_bias.copy_(module.qkv.bias)
        mha.out_proj.weight.copy_(module.proj.weight)
        mha.out_proj.bias.copy_(module.proj.bias)
    return mha
