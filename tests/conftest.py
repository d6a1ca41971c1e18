"""The fixtures several test files share; the helpers they share are in tests/helpers.py."""

import functools
import gc
import os
import pickle
import re
import shutil
import socket
import threading
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import TypeVar

import pytest
import torch
from filelock import FileLock

# Hydra's schemas (train_schema, data_stories_schema, ...) are stored in its ConfigStore when
# cli.schema is imported, and configs/*.yaml extend them: a test that composes a config in-process
# (hydra's compose) needs them whether or not another test module imported cli.schema first.
import cli.schema  # noqa: F401
from data.stories import generate_stories
from data.tokenizer import CharTokenizer
from inspection.recall_probe import RecallProbe
from tests.helpers import Finished, LogdirBuilder, QuietHandler, run_cli, tiny_run, two_ranks_left_alone

T = TypeVar("T")


def forget_makes_command_line() -> None:
    """Under `make test ARGS=...` make puts the variables of its command line in the suite's
    environment and lists them in MAKEFLAGS for every make started below it: a test that runs
    `make sample` would take the suite's ARGS (or RUN) as its own. Each such test says its own."""
    _, separator, assignments = os.environ.get("MAKEFLAGS", "").partition("-- ")
    for name in re.findall(r"(?:^|(?<!\\) )(\w+)=", assignments) if separator else []:
        os.environ.pop(name, None)  # the spaces inside a value come escaped: "ARGS=-k\ a"
    for name in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"):
        os.environ.pop(name, None)


forget_makes_command_line()

# No garbage collection while pytest imports the test files (transformers, TensorBoard, Selenium
# and the rest), then the objects made so far frozen, as the commands do (runtime/startup.py):
# each full collection would walk them all, again and again, through every test.
gc.disable()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """The files are collected (in a pytest-xdist worker too): collect garbage again, over what the
    tests make."""
    gc.enable()
    gc.freeze()

# Each pytest-xdist worker keeps to one core, and so do the processes it starts: two workers
# with two torch threads each on two cores spend their time waiting on each other's threads.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# Before the first compile in each process, Inductor builds and loads ten small C++ files to learn which
# of the vector instruction sets /proc/cpuinfo lists its compiler can use: about 16 s once per kernel
# cache, then 2 s in every process that compiles (the suite's workers and the train.py and sample.py
# they start). The tests take the CPU's list as it stands, which picks the same set where g++ knows
# them all (Debian 12's g++ 12 does); what they compile, and with which flags, is unchanged.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")


@pytest.fixture(scope="session")
def trained_run(made_once) -> Path:
    """One tiny real training run, shared by the tests that inspect what it wrote (trained once a session)."""
    def train(workdir: Path) -> Path:
        # On the CPU on every machine: tests recompute the figures it logged on the CPU in fp32, to 1e-5
        # (a GPU's TF32 matmuls miss that), and read auto's fp32 in its log. tests/test_cuda.py trains on a GPU.
        result = run_cli("train.py", *tiny_run(**{"train.device": "cpu", "hydra.run.dir": "run"}), cwd=workdir)
        assert result.returncode == 0, result.stdout + result.stderr
        return workdir / "run"
    return made_once("trained_run", train)


@pytest.fixture(scope="session")
def made_once(tmp_path_factory) -> Callable[[str, Callable[[Path], T]], T]:
    """made_once(name, make): what make(folder) returns, made once a test session in a folder of its own,
    for the fixtures whose runs take seconds. Under pytest-xdist, which may send a module's tests to
    either worker, the first worker that asks makes it, in the folder the workers share (under a file
    lock), and the others read what it returned (pickled). A make that fails pickles nothing: the next
    to ask makes it again, in a fresh folder."""
    shared = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        # pytest-xdist's workers each have a folder of their own in this session's; the run's id keeps a
        # folder that outlives the session (workers on other hosts) from handing on an older run's pickle
        shared = shared.parent / f"made-once-{os.environ.get('PYTEST_XDIST_TESTRUNUID', 'run')}"
        shared.mkdir(exist_ok=True)

    def made(name: str, make: Callable[[Path], T]) -> T:
        folder, result = shared / name, shared / f"{name}.pickle"
        with FileLock(f"{folder}.lock"):
            if not result.is_file():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                result.write_bytes(pickle.dumps(make(folder)))
            return pickle.loads(result.read_bytes())
    return made


@pytest.fixture(scope="session")
def run_left_alone(made_once) -> Finished:
    """helpers.TWO_RANKS on 2 processes under DDP, never stopped: what a stopped, killed or sharded run
    must end as (tests/test_distributed.py, tests/test_fsdp.py)."""
    return made_once("run_left_alone", two_ranks_left_alone)


@pytest.fixture(scope="module")
def char_probe():
    """A character tokenizer of the built-in stories and the recall probe built with it."""
    tokenizer = CharTokenizer(sorted(set("".join(generate_stories(1337, 100_000)))))
    return tokenizer, RecallProbe.build(tokenizer, block_size=128, seed=1338)


@pytest.fixture
def file_server(tmp_path_factory):
    """A real HTTP server on 127.0.0.1 serving a temporary folder: (folder, base URL)."""
    folder = tmp_path_factory.mktemp("served")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(folder)))
    # serve_forever checks for shutdown() every poll_interval: 0.5 s by default, waited at every teardown
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
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


@pytest.fixture(scope="module")
def logdir(request, tmp_path_factory) -> Path:
    """A TensorBoard logdir, one per test module, holding what the module's LOGDIR lists: the
    builders of tests/helpers.py (whole_tiny_run, young_run, ...), each called in turn with the
    logdir and this request (for the fixtures it needs: trained_run)."""
    builders: list[LogdirBuilder] = request.module.LOGDIR
    folder = tmp_path_factory.mktemp("logdir")
    for build in builders:
        build(folder, request)
    return folder
