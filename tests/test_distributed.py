"""Several processes through torchrun (gloo on CPU), gradient accumulation, and train.dtype:
real `torchrun` runs of train.py, read back from their checkpoints, logs and event files."""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from runtime.devices import cpu_multiplies_bf16
from tests.helpers import (
    QUICK,
    ROOT,
    THEN_NAME_GLOO_THREADS,
    TWO_RANKS,
    curves,
    gloo_threads_left,
    limit_file_size,
    logged_losses,
    read_events,
    run_cli,
    tiny_run,
    torchrun,
    weights,
)

pytestmark = pytest.mark.distributed  # torchrun: several processes of train.py

# Every run here is on the CPU, as gloo's processes on one machine are: on a GPU machine train.device=auto
# would give each torchrun process a GPU of its own (a one-GPU machine has none for rank 1), and the
# one-process runs compared with them would train in bf16 there.
QUICK_ON_CPU = {**QUICK, "train.device": "cpu"}

# run_left_alone (tests/conftest.py, shared with tests/test_fsdp.py): helpers.TWO_RANKS on 2 processes,
# never stopped, each process then naming the Gloo threads it has left. The killed run here is
# TWO_RANKS too, and must end as it did, bit for bit; a run stopped by Ctrl-C under torchrun is
# tests/test_fsdp.py's.


def test_two_processes_write_one_run_and_their_loss_falls(run_left_alone):
    run, stdout = run_left_alone.dir, run_left_alone.stdout
    assert {"ckpt_last.pt", "ckpt_best.pt", "train.log", ".hydra"} <= {p.name for p in run.iterdir()}
    assert len(list(run.glob("events.out.tfevents.*"))) == 1  # one TensorBoard run
    # Only rank 0 speaks: each line of the run's story appears once.
    assert stdout.count("model: ") == 1 and stdout.count("done: best val loss") == 1
    assert "| 2 processes (gloo)" in stdout and "each holding a shard" not in stdout  # DDP, as asked: not FSDP
    log_lines = (run / "train.log").read_text().splitlines()
    assert sum("run dir:" in line for line in log_lines) == 1
    events = read_events(run)
    val = [e.value for e in events.Scalars("loss/val")]
    assert val[-1] < val[0] - 0.3, val
    assert events.Images("attention/layer_1/head_1")  # rank 0 drew the attention maps
    assert len(torch.load(run / "ckpt_last.pt", weights_only=True)["run_state"]["rng"]) == 2  # both ranks' RNGs


def test_a_finished_run_ends_its_gloo_threads_before_its_process_exits(run_left_alone):
    # Left running, they are torn down with the process, which now and then aborts it
    # ("terminate called without an active exception"). Linux's /proc names every thread.
    assert gloo_threads_left(run_left_alone.stdout) == [("0", "[]"), ("1", "[]")], run_left_alone.stdout


# One optimizer step, then the saved weights. The first AdamW step moves every weight by
# about lr, so any difference in the data or the gradient averaging shows at that scale;
# float sums in another order differ by far less than the 1e-6 allowed. (AdamW, not the
# default Muon: orthogonalising the update magnifies those float differences in the
# gradient's weakest directions to about 3e-5.)
# 5 evaluation batches: on 2 ranks, rank 0 takes 3 of them and rank 1 takes 2.
ONE_STEP = {**QUICK_ON_CPU, "train.max_steps": 1, "train.eval_iters": 5, "optim.name": "adamw", "optim.warmup_steps": 0,
            "optim.lr": "1e-2"}
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def one_batch_of_8(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("batch8")
    result = run_cli("train.py", *tiny_run(ONE_STEP, **{"train.batch_size": 8, "hydra.run.dir": "run"}), cwd=workdir)
    assert result.returncode == 0, result.stderr
    # The step did change the weights, so that comparing with them is not comparing two fresh models.
    fresh = run_cli("train.py", *tiny_run(ONE_STEP, **{"train.batch_size": 8, "optim.lr": "1e-9", "optim.min_lr": 0,
                                                 "hydra.run.dir": "fresh"}), cwd=workdir)
    assert fresh.returncode == 0, fresh.stderr
    stepped = weights(workdir / "run")
    assert max((weights(workdir / "fresh")[k] - stepped[k]).abs().max().item() for k in stepped) > 1e-3
    return stepped


@dataclass
class TwoNodes:
    """A run of the README's several-machines command with both "machines" here: node 0's run dir
    and what each node printed."""
    dir: Path
    stdout: str
    node_1_folder: Path
    node_1_stdout: str


@pytest.fixture(scope="module")
def two_nodes_accumulating(made_once) -> TwoNodes:
    """ONE_STEP on 2 ranks (DDP), each taking 2 micro-steps of 2 (the gradients synced in the second's
    backward alone), each rank a node of its own: the README's several-machines command, node 0 and
    node 1 with one process each, in folders of their own, meeting at node 0's rendezvous endpoint."""
    def run(workdir: Path) -> TwoNodes:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        nodes = []
        for node_rank in (0, 1):
            folder = workdir / f"machine{node_rank}"
            folder.mkdir()
            command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node_rank}",
                       "--nproc_per_node=1", f"--rdzv_endpoint=127.0.0.1:{port}", str(ROOT / "train.py"),
                       *tiny_run(ONE_STEP, **{"train.batch_size": 2, "train.grad_accum_steps": 2, "hydra.run.dir": "run"})]
            nodes.append(subprocess.Popen(command, cwd=folder, env={**os.environ, "TMPDIR": str(folder)},
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outputs = [node.communicate(timeout=300) for node in nodes]
        assert [node.returncode for node in nodes] == [0, 0], outputs
        return TwoNodes(workdir / "machine0" / "run", outputs[0][0], workdir / "machine1", outputs[1][0])
    return made_once("two_nodes_accumulating", run)


def assert_took_the_step(run_dir: Path, expected_weights: dict[str, torch.Tensor]) -> None:
    got = weights(run_dir)
    moved = {k: (got[k] - expected_weights[k]).abs().max().item() for k in got}
    worst = max(moved, key=moved.get)
    assert moved[worst] < TOLERANCE, f"largest weight difference {moved[worst]:.2e} in {worst}"


def test_the_several_machines_command_runs_as_two_nodes_and_only_node_0_speaks_and_writes(two_nodes_accumulating):
    assert "| 2 processes (gloo)" in two_nodes_accumulating.stdout
    assert two_nodes_accumulating.node_1_stdout == ""  # node 1's rank prints nothing
    assert (two_nodes_accumulating.dir / "ckpt_last.pt").is_file()
    assert not (two_nodes_accumulating.node_1_folder / "run").exists()  # the folder Hydra made there, empty, was taken back


def test_the_first_step_of_2_ranks_x_2_micro_steps_x_2_equals_one_process_with_the_whole_batch(
        one_batch_of_8, two_nodes_accumulating):
    # Both ways of splitting a batch at once: DDP averages the ranks' gradients (here across two
    # nodes: nodes that trained apart would each take a step of their own half), accumulation the micro-steps'.
    assert_took_the_step(two_nodes_accumulating.dir, one_batch_of_8)


def test_the_first_step_of_2_micro_steps_x_4_equals_one_process_with_the_whole_batch(one_batch_of_8, tmp_path):
    result = run_cli("train.py", *tiny_run(ONE_STEP, **{"train.batch_size": 4, "train.grad_accum_steps": 2,
                                                        "hydra.run.dir": "run"}), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert_took_the_step(tmp_path / "run", one_batch_of_8)


def test_the_evaluation_gives_the_same_losses_on_any_number_of_processes(two_nodes_accumulating, tmp_path):
    # Rank 0 takes 3 of the 5 evaluation batches, rank 1 takes 2, and the sums are added. The same
    # update both ways (4 micro-steps of 2 = 2 ranks x 2 micro-steps of 2), and the same eval batches of 2.
    one = run_cli("train.py", *tiny_run(ONE_STEP, **{"train.batch_size": 2, "train.grad_accum_steps": 4, "hydra.run.dir": "one"}),
                  cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    assert len(logged_losses(one.stdout)) == 4  # train and val, before and after the step
    assert logged_losses(two_nodes_accumulating.stdout) == pytest.approx(logged_losses(one.stdout), abs=1e-5)


def test_a_rank_that_fails_ends_the_whole_run_with_its_error(tmp_path):
    # Rank 0 alone writes checkpoints, so a file size limit fails rank 0 alone, at its first
    # save (step 10); rank 1 is left waiting for it. The run must end, not hang, and say why:
    # rank 0 first, then rank 1, which must hear of it as rank 0 leaves the group, its threads
    # ended, not as it exits, when torchrun stops rank 1 (CI once saw rank 1 stopped before it
    # spoke); rank 1 then waits for that stop, so that torchrun names rank 0 as the cause.
    wrapper = tmp_path / "then_name_gloo_threads.py"
    wrapper.write_text(THEN_NAME_GLOO_THREADS)
    result = torchrun(2, *tiny_run(QUICK_ON_CPU, **{"hydra.run.dir": "run"}), cwd=tmp_path, timeout=180,
                      preexec_fn=limit_file_size(150_000), script=(str(wrapper), str(ROOT / "train.py")))
    assert result.returncode != 0
    assert ("0", "[]") in gloo_threads_left(result.stdout), result.stdout
    said = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert said == ["error: could not save run/ckpt_best.pt (File too large); no ckpt_best.pt was written. "
                    "Free some disk space and resume",
                    "error: rank 1 lost contact with the other processes: one of them stopped (its own message says why)"
                    ], result.stderr
    root_cause = result.stderr.partition("Root Cause (first observed failure):")[2]
    assert "rank      : 0 (local_rank: 0)\n  exitcode  : 2" in root_cause, result.stderr
    assert "rank      : 1 (local_rank: 1)\n  exitcode  : 143" in result.stderr  # stopped by torchrun as it waited
    assert "[rank" not in result.stderr  # no rank died of an uncaught exception (torch prefixes their tracebacks)
    assert not (tmp_path / "run" / "ckpt_best.pt").exists()


@pytest.mark.parametrize("bad, line", [
    # A run dir for each process (the default is rank 0's for both), so that each must take back its own.
    # Not two in one new folder: each process notes what was there before it started, and a process
    # that starts late on a loaded machine sees the folder the other made as the user's, and keeps it.
    ({"train.grad_accum_steps": 0, "hydra.run.dir": "run-${oc.env:LOCAL_RANK}"},
     "error: train.grad_accum_steps=0 must be at least 1"),
    # Found by local rank 0 alone, as it tokenizes while the other waits: that one said first that
    # it had lost contact.
    ({"data": "text", "data.path": "bad.jsonl", "data.n_chars": None, "hydra.run.dir": "run"},
     "error: bad.jsonl, line 2: not valid JSON (Expecting ',' delimiter, column 16); fix or remove that line"),
], ids=["a config error", "a corpus error"])
def test_a_config_error_under_torchrun_is_said_once_not_once_per_process(tmp_path, bad, line):
    (tmp_path / "bad.jsonl").write_text('{"text": "one"}\n{"text": "two" "three"}\n')
    result = torchrun(2, *tiny_run(QUICK_ON_CPU, **bad), cwd=tmp_path, timeout=120)
    assert result.returncode != 0
    assert [said for said in result.stderr.splitlines() if said.startswith("error: ")] == [line], result.stderr
    assert not list(tmp_path.glob("run*"))  # nothing written, and the folder Hydra made in each process taken back
    assert "rank      : 0 (local_rank: 0)\n  exitcode  : 2" in result.stderr  # torchrun names rank 0 as the cause


# One of each way: Hydra refuses the first as it composes, train() the second. (What each refusal
# says is checked in-process, in test_config.py and test_bad_input.py.)
@pytest.mark.parametrize("bad", ["train.eval_every=20", "train.grad_accum_steps=0"])
def test_a_second_process_on_a_machine_leaves_a_config_error_to_the_first_and_takes_back_its_run_dir(
        tmp_path, monkeypatch, bad):
    # This process as torchrun's local rank 1 of 2 (here, not under torchrun: it starts no process).
    # It must wait, silent, for torchrun's SIGTERM, sent once local rank 0 has failed. A thread here
    # raises it as soon as the handler is in place, delivered to the thread itself: the handler is
    # then pending while the main thread may be asleep, as when the signal lands just before a sleep
    # starts (a single long sleep would hear it only when it ends).
    for name, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    before = signal.getsignal(signal.SIGTERM)
    sent, returned = threading.Event(), threading.Event()

    def stop_once_waiting() -> None:
        while signal.getsignal(signal.SIGTERM) is before and not returned.is_set():
            time.sleep(0.01)
        if not returned.is_set():  # its handler is in place (never a SIGTERM to a process without one)
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
            sent.set()

    stopper = threading.Thread(target=stop_once_waiting, daemon=True)
    stopper.start()
    started = time.monotonic()
    try:
        result = run_cli("train.py", *tiny_run(QUICK_ON_CPU, **{"hydra.run.dir": "run"}), bad, cwd=tmp_path)
    finally:
        returned.set()
        stopper.join()
    assert sent.is_set() and result.returncode == 128 + signal.SIGTERM, result.stderr
    assert time.monotonic() - started < 30  # it heard the signal, not the end of its wait
    assert result.stdout == result.stderr == ""  # local rank 0 says the error
    assert signal.getsignal(signal.SIGTERM) is before  # its handler taken back
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"train.dtype": "fp8"}, "error: train.dtype=fp8 must be one of auto, fp32, bf16, fp16"),
        ({"train.grad_accum_steps": 0}, "error: train.grad_accum_steps=0 must be at least 1"),
    ],
)
def test_bad_precision_and_accumulation_values_get_one_line(tmp_path, args, message):
    result = run_cli("train.py", *tiny_run(QUICK_ON_CPU, args), cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]  # one line
    assert message in result.stderr and "Traceback" not in result.stderr


def test_bf16_on_a_cpu_trains_and_warns_only_where_the_cpu_lacks_bf16_in_hardware(tmp_path):
    result = run_cli("train.py", *tiny_run(QUICK_ON_CPU, **{"train.max_steps": 10, "train.dtype": "bf16", "hydra.run.dir": "run"}),
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    warned = "warning: train.dtype=bf16 on a CPU without AVX-512 BF16 or AMX: its bf16 matmuls run in slow code" in result.stdout
    assert warned == (not cpu_multiplies_bf16())  # read from /proc/cpuinfo, as train.py reads it
    losses = logged_losses(result.stdout)
    assert losses[-1] < losses[1]  # val loss fell


def process_of_rank(torchrun_pid: int, rank: int) -> int:
    """The pid of the process torchrun started as RANK=rank (read from Linux's /proc)."""
    children = [int(pid) for task in Path(f"/proc/{torchrun_pid}/task").iterdir()
                for pid in (task / "children").read_text().split()]
    for pid in children:
        if f"RANK={rank}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            return pid
    raise AssertionError(f"torchrun ({torchrun_pid}) has no process of rank {rank}: {children}")


def steps_by_tag(events: EventAccumulator) -> dict[str, list[int]]:
    """The steps logged of every tag: scalars, images and tensors (texts, attention weights)."""
    tags = events.Tags()
    return {tag: [e.step for e in read(tag)] for kind, read in
            (("scalars", events.Scalars), ("images", events.Images), ("tensors", events.Tensors)) for tag in tags[kind]}


def test_a_process_killed_under_torchrun_restarts_from_the_last_checkpoint_and_ends_as_if_left_alone(
        tmp_path, run_left_alone):
    # The default run dir (a new folder per start), a checkpoint every 5 steps, and one restart
    # allowed. Rank 1 is killed (SIGKILL: no chance to save or say goodbye) once rank 0 has
    # logged step 7, two steps past the first checkpoint; torchrun then stops rank 0 and starts
    # both again.
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "--max-restarts=1", str(ROOT / "train.py"), *tiny_run(TWO_RANKS, **{"train.save_interval": 5})]
    output_file = tmp_path / "torchrun.log"
    with open(output_file, "w") as output:
        process = subprocess.Popen(command, cwd=tmp_path, env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_path)},
                                   stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while "step 7/30" not in output_file.read_text() and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert "step 7/30" in output_file.read_text(), output_file.read_text()  # the run got there, alive
            os.kill(process_of_rank(process.pid, 1), signal.SIGKILL)
            process.wait(timeout=180)
        finally:
            if process.poll() is None:  # the test failed: leave no processes behind
                os.killpg(process.pid, signal.SIGKILL)
    output = output_file.read_text()
    assert process.returncode == 0, output
    [run] = tmp_path.glob("outputs/*/*")  # one run dir for both attempts
    resumed = re.search(rf"resuming {run.relative_to(tmp_path)} at step (\d+)", output)
    assert "torchrun restarted the processes (restart 1 of 1)" in output and resumed, output
    step = int(resumed.group(1))
    assert 5 <= step < 30  # it went on from a checkpoint, not from the start
    first_attempt = read_events(min(run.glob("events.out.tfevents.*")))
    assert first_attempt.Scalars("train/batch_loss")[-1].step > step  # so the steps after it were logged twice

    a, b = weights(run_left_alone.dir), weights(run)
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]), name
    # Both attempts' events, as TensorBoard's own reader shows them: every step of every tag once
    # (the evaluation at step 0 too), and the curves of the run left alone, bit for bit (tokens/s
    # aside: it is a speed).
    killed, alone = read_events(run), read_events(run_left_alone.dir)
    for tag, steps in steps_by_tag(killed).items():
        assert len(steps) == len(set(steps)), f"{tag}: a step logged twice: {steps}"
    assert steps_by_tag(killed)["loss/val"] == [0, 10, 20, 30]
    assert steps_by_tag(killed)["attention/layer_1/head_1"] == [0, 10, 20, 30]
    killed_curves, alone_curves = curves(killed), curves(alone)
    del killed_curves["train/tokens_per_sec"], alone_curves["train/tokens_per_sec"]
    assert killed_curves == alone_curves
