"""Nothing trained is lost: real signals on real training processes, exact resume, non-finite
losses, a full disk, and checkpoints crafted to run code."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from data.stories import generate_stories
from model_io.checkpoint import Checkpoint
from model_io.run_files import kept_checkpoints
from tests.helpers import (
    ROOT,
    assert_one_error_line,
    limit_file_size,
    read_events,
    run_cli,
    signal_after_line,
    stop_while,
    tiny_run,
)
from training.interrupt import StopSignals

pytestmark = pytest.mark.slow  # each test trains, or starts a Python process that it signals

# TINY_RUN with dropout on (so the torch RNG matters), 20 steps, and the loss logged every step.
EXACT_RUN = {"train.max_steps": 20, "train.log_interval": 1, "model.dropout": 0.1}
SHORT_RUN = {"train.max_steps": 10}


def start_training(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    return [(event.step, event.value) for event in read_events(run_dir).Scalars(tag)]


def image_steps(run_dir: Path, tag: str) -> list[int]:
    return [image.step for image in read_events(run_dir).Images(tag)]


def test_a_run_stopped_by_ctrl_c_and_resumed_is_bitwise_the_run_left_alone(tmp_path):
    # SIGTERM (`kill`, a cluster's scheduler) is one more of StopSignals.HANDLED: the same handler,
    # heard by the same watcher (the tests of StopSignals below send it).
    alone = run_cli("train.py", *tiny_run(EXACT_RUN, **{"hydra.run.dir": "alone"}), cwd=tmp_path)
    assert alone.returncode == 0, alone.stderr

    # The stopped run also keeps the model at every step (train.keep_checkpoints), the one it stops at too.
    every_step = {"train.keep_checkpoints": f"[{','.join(map(str, range(21)))}]"}
    stopped = start_training(*tiny_run(EXACT_RUN, every_step, **{"hydra.run.dir": "stopped"}), cwd=tmp_path)
    output = signal_after_line(stopped, "step 5/20", signal.SIGINT)
    assert stopped.returncode == 128 + signal.SIGINT, output
    assert "Traceback" not in output
    at_stop = Checkpoint.load(tmp_path / "stopped" / "ckpt_last.pt")
    step = at_stop.step
    assert 5 <= step < 20  # stopped before the end, after finishing its step
    assert f"stopped by SIGINT after step {step}; saved stopped/ckpt_last.pt" in output
    assert "Resume with: .venv/bin/python train.py resume=stopped" in output
    assert list(kept_checkpoints(tmp_path / "stopped")) == list(range(step + 1))
    kept_at_stop = Checkpoint.load(kept_checkpoints(tmp_path / "stopped")[step]).model
    assert all(torch.equal(tensor, at_stop.model[name]) for name, tensor in kept_at_stop.items())

    resumed = run_cli("train.py", "resume=stopped", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming stopped at step {step}" in resumed.stdout
    assert list(kept_checkpoints(tmp_path / "stopped")) == list(range(21))
    assert all(torch.equal(tensor, at_stop.model[name])  # written again with the step's jobs, the same model
               for name, tensor in Checkpoint.load(kept_checkpoints(tmp_path / "stopped")[step]).model.items())

    a = Checkpoint.load(tmp_path / "alone" / "ckpt_last.pt")
    b = Checkpoint.load(tmp_path / "stopped" / "ckpt_last.pt")
    assert a.step == b.step == 20
    for name, tensor in a.model.items():
        assert torch.equal(tensor, b.model[name]), name
    for tag in ("train/batch_loss", "loss/train", "loss/val"):
        assert scalars(tmp_path / "stopped", tag) == scalars(tmp_path / "alone", tag), tag  # bitwise, every step once
    assert [s for s, _ in scalars(tmp_path / "stopped", "train/batch_loss")] == list(range(1, 21))
    assert image_steps(tmp_path / "stopped", "attention/layer_1/head_1") == [0, 10, 20]


def start_script(code: str, tmp_path: Path) -> subprocess.Popen:
    """Runs code (given the project's root as argv[1], and as argv[2] the log HEARD writes,
    heard.log in tmp_path) in a new Python process, once it says "ready"."""
    script = tmp_path / "script.py"
    script.write_text(code)
    process = subprocess.Popen([sys.executable, str(script), str(ROOT), str(tmp_path / "heard.log")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    return process


# What the scripts below run first: StopSignals' watcher thread ("stop-signals") notes in argv[2]
# each signal it reads ("read <time> <signal numbers>") and the time it takes of it ("clock <time>":
# its first_at, or its now), and the scripts note when their handler has taken a request ("handler
# <time> <signal number>"). time.monotonic() is one clock for every process here, so that the test
# waits until the watcher and the handler have heard a signal, and then past StopSignals'
# SAME_REQUEST_SECONDS, instead of sleeping and hoping a busy machine ran them in time.
HEARD = """
import os, sys, threading, time
sys.path.insert(0, sys.argv[1])
def note(*words):
    with open(sys.argv[2], "a") as log:
        log.write(" ".join(map(str, words)) + "\\n")
clock, read = time.monotonic, os.read
def watched_read(fd, n):
    value = read(fd, n)
    if threading.current_thread().name == "stop-signals":
        note("read", clock(), *value)
    return value
def watched_clock():
    value = clock()
    if threading.current_thread().name == "stop-signals":
        note("clock", value)
    return value
os.read, time.monotonic = watched_read, watched_clock
"""


def heard(log: Path, kind: str, signum: int, count: int = 1) -> float:
    """When the script's process had heard signum for the count-th time, as its log (HEARD) says,
    once written: kind "read", when the watcher read it; "clock", the time the watcher took after
    that read (its first_at, for a first request); "handler", when the handler had taken it."""
    deadline = time.monotonic() + 60
    while True:
        text = log.read_text() if log.exists() else ""
        lines = [line.split() for line in text[: text.rfind("\n") + 1].splitlines()]  # whole lines only
        times = []
        for i, (k, at, *signals) in enumerate(lines):
            if k == kind and (signals == [str(signum)] if k == "handler" else str(signum) in signals):
                times.append(float(at))
            elif k == "read" and str(signum) in signals and kind == "clock":
                after = next((line for line in lines[i + 1 :] if line[0] in ("read", "clock")), None)
                if after is not None and after[0] == "clock":  # the watcher's next line: a clock, before any read
                    times.append(float(after[1]))
        if len(times) >= count:
            return times[count - 1]
        assert time.monotonic() < deadline, f"no {kind} of signal {signum} (#{count}) within 60 s: {text}"
        time.sleep(0.01)


def past_the_same_request_window(since: float) -> None:
    """Waits until a signal sent now arrives more than StopSignals.SAME_REQUEST_SECONDS after `since`
    (on the same clock): a second request, not torchrun's relay of the first."""
    time.sleep(max(0.0, since + StopSignals.SAME_REQUEST_SECONDS + 0.05 - time.monotonic()))


STUCK_IN_ONE_OPERATION = HEARD + """
import torch
from training.interrupt import StopSignals
StopSignals.GRACE_SECONDS = 0.5  # not 2 s: the test need not wait it out
matrix = torch.randn(7000, 7000)
with StopSignals():
    print("ready", flush=True)
    started = time.perf_counter()
    torch.linalg.eigvals(matrix)  # one PyTorch operation of about 30 s on 2 cores
    print(f"finished after {time.perf_counter() - started:.1f} s", flush=True)
"""


def heard_line(name: str) -> str:
    """What the first request to stop is answered with at once, even inside one long operation
    (an evaluation of a huge train.eval_iters went on without a word)."""
    return (f"heard {name}: the run saves and stops once the work under way ends (a step, an evaluation, a sample); "
            f"{name} again, a second or more later, stops at once (files already saved are whole)\n")


def test_a_second_signal_stops_at_once_even_inside_one_long_operation(tmp_path):
    # Python runs signal handlers only between bytecodes; this process sits inside one
    # operation for about 30 s, so only StopSignals' watcher thread can end it sooner.
    process = start_script(STUCK_IN_ONE_OPERATION, tmp_path)
    process.send_signal(signal.SIGTERM)  # the first: stop cleanly, when the step is done
    past_the_same_request_window(heard(tmp_path / "heard.log", "clock", signal.SIGTERM))  # the watcher's first_at
    second_at = time.monotonic()
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert "finished" not in stdout  # the operation was still running
    assert process.returncode == 128 + signal.SIGINT
    assert stderr == heard_line("SIGTERM") + "stopped: interrupted in the middle of an operation (files already saved are whole)\n"
    assert time.monotonic() - second_at < 10  # the watcher's grace, plus slack for a busy machine


SLOW_TO_CLEAN_UP = HEARD + """
import signal
from training.interrupt import StopSignals
StopSignals.GRACE_SECONDS = 0.5  # not 2 s: the cleanup below outlasts it all the same
signal.signal(signal.SIGUSR1, lambda signum, frame: None)  # a signal that is no request to stop
try:
    with StopSignals() as stop:
        print("ready", flush=True)
        noted = False
        while True:
            if stop.requested and not noted:
                noted = True
                note("handler", time.monotonic(), stop.requested)
            time.sleep(0.01)  # Python code: the handler runs at once
except KeyboardInterrupt:
    time.sleep(1.5)  # a cleanup longer than the watcher's grace
    print("cleaned up", flush=True)
    sys.exit(130)
"""


def test_the_watcher_leaves_a_run_alone_that_the_handler_stopped_and_ignores_other_signals(tmp_path):
    process = start_script(SLOW_TO_CLEAN_UP, tmp_path)
    log = tmp_path / "heard.log"
    for count in (1, 2):  # two of another signal, further apart than the window: nothing happens
        process.send_signal(signal.SIGUSR1)
        past_the_same_request_window(heard(log, "read", signal.SIGUSR1, count))
    process.send_signal(signal.SIGTERM)
    past_the_same_request_window(max(heard(log, "clock", signal.SIGTERM), heard(log, "handler", signal.SIGTERM)))
    process.send_signal(signal.SIGINT)  # the second request: the handler raises KeyboardInterrupt
    stdout, stderr = process.communicate(timeout=60)
    assert (process.returncode, stdout, stderr) == (130, "cleaned up\n", heard_line("SIGTERM"))  # SIGUSR1 said nothing


SLOW_TO_SAVE = HEARD + """
from training.interrupt import StopSignals
StopSignals.GRACE_SECONDS = 0.3  # the save below outlasts it
with StopSignals() as stop:
    print("ready", flush=True)
    while not stop.requested:
        time.sleep(0.01)
    time.sleep(1.0)  # the clean stop: the step ends, then the checkpoint is written
    print("saved", flush=True)
"""


def test_one_ctrl_c_that_reaches_a_process_twice_is_one_request_and_the_save_runs_to_its_end(tmp_path):
    # Under torchrun, one Ctrl-C reaches each process from the terminal and again, relayed, from torchrun.
    process = start_script(SLOW_TO_SAVE, tmp_path)
    process.send_signal(signal.SIGINT)
    heard(tmp_path / "heard.log", "read", signal.SIGINT)
    process.send_signal(signal.SIGINT)  # at once: within StopSignals.SAME_REQUEST_SECONDS
    stdout, stderr = process.communicate(timeout=60)
    assert (process.returncode, stdout, stderr) == (0, "saved\n", heard_line("SIGINT"))  # one request, one line
    assert heard(tmp_path / "heard.log", "read", signal.SIGINT, count=2)  # the watcher heard both


def test_sigkill_in_the_middle_of_a_save_leaves_the_last_checkpoint_whole(tmp_path):
    # A model big enough (3.2M parameters, ~38 MB with AdamW's state) that a save takes a
    # while, saving at every step: kill -9 the moment a new ckpt_last.pt is being written.
    run = tmp_path / "run"
    args = tiny_run(**{
        "optim.name": "adamw", "model.n_embd": 256, "model.n_layer": 4, "train.max_steps": 300, "train.eval_interval": 1,
        "train.eval_iters": 1, "train.attn_log_interval": 0, "train.sample_interval": 0, "hydra.run.dir": "run",
    })
    process = start_training(*args, cwd=tmp_path)
    partial = run / ".ckpt_last.pt.tmp"

    def saving() -> bool:  # a save after the first: the last checkpoint whole, the next one half written
        return (run / "ckpt_last.pt").exists() and partial.exists()

    deadline = time.monotonic() + 120
    # Stopped (SIGSTOP) while a save is under way, it cannot end the save between the look and the kill.
    while not (saving() and stop_while(process, saving)) and time.monotonic() < deadline:
        time.sleep(0.001)  # a save takes far longer than this; a busy loop would take a core from the run
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert partial.exists(), "the kill did not land during a save"

    saved = Checkpoint.load(run / "ckpt_last.pt")  # whole, and loads
    assert saved.step >= 1
    resumed = run_cli("train.py", "resume=run", f"train.max_steps={saved.step + 2}", "train.eval_interval=1000",
                      cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert Checkpoint.load(run / "ckpt_last.pt").step == saved.step + 2
    assert not partial.exists()


@pytest.fixture
def ten_step_run(made_once, tmp_path) -> Path:
    """A finished 10-step run, with both checkpoints saved at step 10, in tmp_path/run: a copy of its
    own for each test (the run is trained once a session). LayerNorm and ReLU², not the default's
    RMSNorm and SwiGLU: with those, optim.lr=1000 leaves the weights huge but finite."""
    def train(workdir: Path) -> Path:
        args = tiny_run(SHORT_RUN, **{"model.norm": "layernorm", "model.mlp": "relu2", "hydra.run.dir": "run"})
        result = run_cli("train.py", *args, cwd=workdir)
        assert result.returncode == 0, result.stderr
        return workdir / "run"
    shutil.copytree(made_once("ten_step_run", train), tmp_path / "run")
    return tmp_path / "run"


def test_resume_auto_goes_on_with_the_run_in_its_dir_or_starts_one_there(ten_step_run):
    # What a cluster job passes each time it is (re)started: the same command, the same run dir.
    workdir, requeued = ten_step_run.parent, {**SHORT_RUN, "resume": "auto", "hydra.run.dir": "run"}
    finished = run_cli("train.py", *tiny_run(requeued), cwd=workdir)
    assert finished.returncode == 0, finished.stderr
    assert "run finished at step 10 (train.max_steps=10); nothing to train" in finished.stdout
    longer = run_cli("train.py", *tiny_run(requeued, **{"train.max_steps": 12}), cwd=workdir)
    assert longer.returncode == 0, longer.stderr
    assert "resuming run at step 10; train.max_steps 10 -> 12" in longer.stdout

    fresh = tiny_run(**{"train.max_steps": 2, "train.eval_interval": 2, "resume": "auto", "hydra.run.dir": "new"})
    assert "no ckpt_last.pt in new yet: a new run there" in run_cli("train.py", *fresh, cwd=workdir).stdout
    for checkpoint in (workdir / "new").glob("*.pt"):  # as if killed before its first save: its events stay
        checkpoint.unlink()
    again = run_cli("train.py", *fresh, cwd=workdir)
    assert again.returncode == 0 and "no ckpt_last.pt in new yet: a new run there" in again.stdout
    assert [step for step, _ in scalars(workdir / "new", "loss/val")] == [0, 2]  # each once, from the new start


def test_a_run_on_your_own_text_resumes_where_it_stopped_and_not_on_another_text(tmp_path):
    # The stories' own keys (data.names, data.word_games) were once added to every resumed run's
    # config, and a run of text files, refused, could not go on at all.
    (tmp_path / "book.txt").write_text("".join(generate_stories(7, 30_000)))
    own_text = {**SHORT_RUN, "data": "text", "data.path": "book.txt", "data.n_chars": None, "hydra.run.dir": "run"}
    assert run_cli("train.py", *tiny_run(own_text), cwd=tmp_path).returncode == 0
    resumed = run_cli("train.py", "resume=run", "train.max_steps=12", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming run at step 10; train.max_steps 10 -> 12" in resumed.stdout
    assert Checkpoint.load(tmp_path / "run" / "ckpt_last.pt").step == 12
    # Always the same command (resume=auto): data=text chosen again was once refused as a change of the
    # data; another file in it is named as the change it is.
    again = run_cli("train.py", *tiny_run(own_text, **{"train.max_steps": 12, "resume": "auto"}), cwd=tmp_path)
    assert again.returncode == 0 and "run finished at step 12 (train.max_steps=12); nothing to train" in again.stdout, \
        again.stdout + again.stderr
    (tmp_path / "other.txt").write_text("".join(generate_stories(9, 30_000)))
    other = run_cli("train.py", *tiny_run(own_text, **{"train.max_steps": 13, "resume": "auto", "data.path": "other.txt"}),
                    cwd=tmp_path)
    assert other.returncode == 2 and other.stderr == (f"error: resume: the text of data.path={tmp_path / 'other.txt'} differs "
                                                      "from the text this run trained on; give the run its corpus as it was, "
                                                      "or start a new run\n")
    alone = run_cli("train.py", "resume=run", "data.text_field=text", cwd=tmp_path)  # the composed group is the default's
    assert_one_error_line(alone, "error: data.text_field is not an option of the data chosen; data=text has it (with "
                                 "resume=, give the run's group as well, e.g. data=text)")
    # The same text moved (to another machine's path, say): found missing, then taken where it is now.
    (tmp_path / "book.txt").rename(tmp_path / "moved.txt")
    gone = run_cli("train.py", "resume=run", "train.max_steps=13", cwd=tmp_path)
    assert_one_error_line(gone, f"error: resume: data.path={tmp_path / 'book.txt'}, the text this run trained on, does not "
                                "exist; if it moved, give resume=run data.path=<where it is now> (the text is checked "
                                "against the run's)")
    found = run_cli("train.py", "resume=run", "train.max_steps=13", "data.path=moved.txt", cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    assert f"data.path {tmp_path / 'book.txt'} -> {tmp_path / 'moved.txt'}" in found.stdout
    (tmp_path / "moved.txt").rename(tmp_path / "book.txt")
    # From another folder (a cluster job's): the run kept its text's whole path; the same file spelt
    # from there is no change, and where the token cache lives may change.
    (tmp_path / "elsewhere").mkdir()
    moved = run_cli("train.py", "resume=../run", "train.max_steps=14", f"data.path={tmp_path / 'book.txt'}",
                    "data.cache_dir=cache", cwd=tmp_path / "elsewhere")
    assert moved.returncode == 0, moved.stderr
    assert (f"resuming ../run at step 13; train.max_steps 13 -> 14; data.path {tmp_path / 'moved.txt'} -> "
            f"{tmp_path / 'book.txt'}; data.cache_dir .cache -> cache") in moved.stdout
    assert Checkpoint.load(tmp_path / "run" / "ckpt_last.pt").config["data"]["path"] == str(tmp_path / "book.txt")
    # The text changed since: refused as it is read (the checkpoint keeps a hash of it). A checkpoint
    # of an older version kept none: its tokenizer would be another (other merges, other ids), and was
    # taken silently once.
    (tmp_path / "book.txt").write_text("".join(generate_stories(8, 30_000)).replace("b", "q"))
    changed = run_cli("train.py", "resume=run", "train.max_steps=16", cwd=tmp_path)
    assert changed.returncode == 2 and changed.stderr.startswith("error: resume: the text of data.path=")
    old = torch.load(tmp_path / "run" / "ckpt_last.pt", weights_only=True)
    del old["run_state"]["text_key"]
    torch.save(old, tmp_path / "run" / "ckpt_last.pt")
    before = {path: path.read_bytes() for path in (tmp_path / "run").rglob("*") if path.is_file()}
    changed = run_cli("train.py", "resume=run", "train.max_steps=16", cwd=tmp_path)
    assert changed.returncode == 2
    assert changed.stderr.startswith("error: resume=run: the tokenizer the corpus gives now differs from the one this run")
    assert {path: path.read_bytes() for path in (tmp_path / "run").rglob("*") if path.is_file()} == before


def test_a_text_that_changed_under_the_same_tokenizer_is_refused_on_resume(tmp_path):
    # Two more lines of the same characters: a char tokenizer is the same, the batches are not. Taken
    # silently once, as a resume that computes what the run left alone would have.
    (tmp_path / "book.txt").write_text("".join(generate_stories(7, 20_000)))
    own_text = {**SHORT_RUN, "data": "text", "data.path": "book.txt", "data.n_chars": None, "tokenizer": "char",
                "hydra.run.dir": "run"}
    assert run_cli("train.py", *tiny_run(own_text), cwd=tmp_path).returncode == 0
    with open(tmp_path / "book.txt", "a") as book:
        book.write("".join(generate_stories(7, 20_000))[:200])
    before = {path: path.read_bytes() for path in (tmp_path / "run").rglob("*") if path.is_file()}
    cached = sorted((tmp_path / ".cache" / "tokens").iterdir())
    changed = run_cli("train.py", "resume=run", "train.max_steps=12", cwd=tmp_path)
    assert_one_error_line(changed, f"error: resume: the text of data.path={tmp_path / 'book.txt'} differs from the text "
                                   "this run trained on; give the run its corpus as it was, or start a new run")
    assert {path: path.read_bytes() for path in (tmp_path / "run").rglob("*") if path.is_file()} == before
    assert sorted((tmp_path / ".cache" / "tokens").iterdir()) == cached  # refused as it was read: nothing tokenised
    # A checkpoint of an older version kept no hash of its text: it resumes as it did.
    old = torch.load(tmp_path / "run" / "ckpt_last.pt", weights_only=True)
    del old["run_state"]["text_key"]
    torch.save(old, tmp_path / "run" / "ckpt_last.pt")
    resumed = run_cli("train.py", "resume=run", "train.max_steps=12", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr


@pytest.mark.parametrize(("edit", "message"), [
    (lambda c: c.update(optimizer=None), "error: resume=run: this checkpoint holds no optimizer state, which an exact "
                                         "resume needs; resume from a checkpoint train.py saved, as it saved it"),
    (lambda c: c["run_state"].pop("rng"), "error: the checkpoint's run state is not as train.py saves it (no rng); resume "
                                          "from a checkpoint train.py saved, as it saved it"),
    (lambda c: c["run_state"].update(rng="x"), "error: the checkpoint's run state is not as train.py saves it (its rng is "
                                               "not a list of each rank's generator states)"),
    (lambda c: c["run_state"].update(rng=[]), "error: the checkpoint's run state is not as train.py saves it (its rng is "
                                              "not a list of each rank's generator states)"),
    (lambda c: c.update(run_state="x"), "error: run/ckpt_last.pt is not a checkpoint of this project (its run_state is "
                                        "str, not dict); use one train.py saved, as it saved it"),
    (lambda c: c["config"].update(data="text"), "error: run/ckpt_last.pt is not a checkpoint of this project (its config's "
                                                "data is str, not a group of settings)"),
    (lambda c: c.update(step="x"), "error: run/ckpt_last.pt is not a checkpoint of this project (its step is str, not "
                                   "int)"),
], ids=["no optimizer", "no rng", "rng text", "rng empty", "run state text", "data group text", "step text"])
def test_a_checkpoint_edited_by_hand_is_one_line_on_resume_and_nothing_is_written(ten_step_run, edit, message):
    # Each was a traceback from inside the restore, after the run dir had been written to.
    edited = torch.load(ten_step_run / "ckpt_last.pt", weights_only=True)
    edit(edited)
    torch.save(edited, ten_step_run / "ckpt_last.pt")
    before = {path: path.read_bytes() for path in ten_step_run.rglob("*") if path.is_file()}
    result = run_cli("train.py", "resume=run", "train.max_steps=12", cwd=ten_step_run.parent)
    assert_one_error_line(result, message)
    assert {path: path.read_bytes() for path in ten_step_run.rglob("*") if path.is_file()} == before


def checkpoint_bytes(run_dir: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(run_dir.glob("*.pt"))}


def test_a_nonfinite_loss_stops_naming_the_step_and_keeps_the_checkpoints(ten_step_run):
    before = checkpoint_bytes(ten_step_run)
    # A learning rate of 1000 blows the weights up within a step or two of resuming.
    result = run_cli("train.py", "resume=run", "optim.lr=1000", "train.max_steps=20", cwd=ten_step_run.parent)
    assert result.returncode == 2, result.stdout + result.stderr
    assert re.fullmatch(
        r"error: the (loss|gradient norm) became (nan|inf) at step 1[1-9]; stopped without saving, and "
        r"run/ckpt_last.pt from before it is kept\. Lower optim.lr, or set train.skip_nonfinite=true to skip such batches\n",
        result.stderr,
    ), result.stderr
    assert checkpoint_bytes(ten_step_run) == before


def test_skip_nonfinite_skips_and_counts_the_bad_batches(ten_step_run):
    result = run_cli("train.py", "resume=run", "optim.lr=1000", "train.max_steps=20", "train.skip_nonfinite=true",
                     cwd=ten_step_run.parent)
    assert result.returncode == 0, result.stderr
    skipped = scalars(ten_step_run, "train/skipped_nonfinite")
    assert skipped and skipped[-1][1] == len(skipped) and skipped[-1][0] <= 20
    assert f"warning: {len(skipped)} of 20 batches were skipped" in result.stdout
    # The weights have diverged: the logged sample says so, and sampling the checkpoint is one line.
    assert "(no sample: the model's next-token logits are NaN or inf" in result.stdout
    sampled = run_cli("sample.py", "run=run/ckpt_last.pt", cwd=ten_step_run.parent)
    assert sampled.returncode == 2 and "Traceback" not in sampled.stderr, sampled.stderr
    assert sampled.stderr == ("error: run/ckpt_last.pt: the model's next-token logits are NaN or inf: its weights have "
                              "diverged; sample from a checkpoint saved before that\n")


def test_a_full_disk_while_saving_is_one_line_and_keeps_the_previous_checkpoint(ten_step_run):
    before = checkpoint_bytes(ten_step_run)
    room = len(before["ckpt_last.pt"]) // 2  # the event files fit; a checkpoint no longer does
    result = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "resume=run", "train.max_steps=20"],
        cwd=ten_step_run.parent, capture_output=True, text=True, preexec_fn=limit_file_size(room), timeout=300,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert re.fullmatch(
        r"error: could not save run/ckpt_(best|last)\.pt \(File too large\); the previous ckpt_(best|last)\.pt "
        r"is kept\. Free some disk space and resume\n", result.stderr,
    ), result.stderr
    assert checkpoint_bytes(ten_step_run) == before
    assert not list(ten_step_run.glob(".*.tmp"))


class RunsCodeWhenUnpickled:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('this ran')",))


def test_a_checkpoint_crafted_to_run_code_is_refused_and_the_code_never_runs(ten_step_run):
    marker = ten_step_run.parent / "it-ran"
    evil = ten_step_run.parent / "evil.pt"
    checkpoint = torch.load(ten_step_run / "ckpt_last.pt", weights_only=True)
    checkpoint["tokenizer"] = RunsCodeWhenUnpickled(marker)
    torch.save(checkpoint, evil)
    torch.load(evil, weights_only=False)  # the file really is dangerous when loaded unsafely
    assert marker.exists()
    marker.unlink()

    for script, arg in (("sample.py", "run=evil.pt"), ("train.py", "resume=evil.pt")):
        result = run_cli(script, arg, cwd=ten_step_run.parent)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.startswith("error: evil.pt is not a readable checkpoint (UnpicklingError")
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
        assert not marker.exists(), script


def test_a_new_run_is_refused_a_run_dir_that_holds_a_run(ten_step_run):
    # hydra.run.dir=<a run> without resume= (resume.md's command with resume=auto forgotten) overwrote its checkpoints.
    before = {path: path.read_bytes() for path in ten_step_run.rglob("*") if path.is_file()}
    refused = run_cli("train.py", *tiny_run(SHORT_RUN, **{"hydra.run.dir": "run"}), cwd=ten_step_run.parent)
    assert refused.returncode == 2
    assert refused.stderr == ("error: run already holds a run (ckpt_last.pt), which a new run there would overwrite; "
                              "go on with it with resume=run (or resume=auto), or give the new run another hydra.run.dir\n")
    assert {path: path.read_bytes() for path in ten_step_run.rglob("*") if path.is_file()} == before


def test_a_value_out_of_range_given_on_resume_is_one_line_and_leaves_the_run_as_it_was(ten_step_run):
    # The values a resume may change are checked as a new run's are, once they are the run's.
    before = {path: path.read_bytes() for path in ten_step_run.rglob("*") if path.is_file()}
    refused = run_cli("train.py", "resume=run", "optim.min_lr=1", "train.max_steps=20", cwd=ten_step_run.parent)
    assert_one_error_line(refused, "error: optim.min_lr=1 must be between 0 and optim.lr=0.01")
    assert {path: path.read_bytes() for path in ten_step_run.rglob("*") if path.is_file()} == before


def test_resume_refuses_a_new_model_shape_and_says_what_else_changed(ten_step_run):
    before = {path: path.read_bytes() for path in ten_step_run.rglob("*") if path.is_file()}
    refused = run_cli("train.py", "resume=run", "model.n_layer=3", "train.max_steps=20", cwd=ten_step_run.parent)
    assert refused.returncode == 2
    assert refused.stderr == (
        "error: resume: model.n_layer=3 would change the model this run was trained with (2); "
        "start a new run for that instead\n"
    )
    twice = run_cli("train.py", "resume=run", "model.n_layer=3", "model.n_layer=4", "train.max_steps=20", cwd=ten_step_run.parent)
    assert twice.stderr.startswith("error: resume: model.n_layer=4 would change the model this run was trained with (2)")
    group = run_cli("train.py", "resume=run", "tokenizer=char", cwd=ten_step_run.parent)  # a group: no old value to quote
    assert group.stderr == ("error: resume: tokenizer=char would change the tokenizer this run was trained with; "
                            "start a new run for that instead\n")
    finished = run_cli("train.py", "resume=run", cwd=ten_step_run.parent)
    assert finished.returncode == 2
    assert "error: resume=run: the run is already at step 10, and train.max_steps=10" in finished.stderr
    # Refused resumes write nothing into the run: no config record of their own, no log lines.
    assert {path: path.read_bytes() for path in ten_step_run.rglob("*") if path.is_file()} == before

    longer = run_cli("train.py", "resume=run/ckpt_last.pt", "train.max_steps=20", "optim.muon_momentum=0.9",
                     "model.dropout=0.1", cwd=ten_step_run.parent)  # dropout changes no weight: the run may go on with it
    assert longer.returncode == 0, longer.stderr
    assert ("resuming run at step 10; train.max_steps 10 -> 20; optim.muon_momentum 0.95 -> 0.9; "
            "model.dropout 0.0 -> 0.1") in longer.stdout
    resumed = Checkpoint.load(ten_step_run / "ckpt_last.pt")
    assert resumed.step == 20 and resumed.optimizer["optimizers"][1]["param_groups"][0]["momentum"] == 0.9
    assert resumed.config["model"]["dropout"] == 0.1
    assert [step for step, _ in scalars(ten_step_run, "loss/val")] == [0, 10, 20]
    assert (ten_step_run / ".hydra" / "config.yaml").read_text().count("max_steps: 10") == 1  # the original kept
    assert len(list((ten_step_run / ".hydra").glob("resumed-*/config.yaml"))) == 1
    log = (ten_step_run / "train.log").read_text()
    assert re.search(r"^\[[\d:]{8}\] resuming run at step 10; train.max_steps 10 -> 20; optim.muon_momentum 0.95 -> 0.9; "
                     r"model.dropout 0.0 -> 0.1$",
                     log, re.M)  # logged before the record began
