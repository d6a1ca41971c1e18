"""cli/run_dir.py: a new run's default folder, outputs/<date>/<time>, is its own, even when other
runs start in the same second."""

import logging
import logging.config
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import suppress
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import cli.run_dir  # (also registers the run_dir_for resolver that configs/train.yaml's hydra.run.dir uses)
from tests.helpers import ROOT, run_cli, tiny_run
from user_error import UserError

# Two processes claim the same 200 folders, one after another, started together by a file both
# wait for: runs launched at once (`for s in 1 2; do python train.py train.seed=$s & done`).
CLAIM_TOGETHER = """
import sys, time
from pathlib import Path
from cli.run_dir import claimed
folder = Path(sys.argv[1])
print("ready", flush=True)
while not (folder / "go").exists():
    time.sleep(0.001)
runs = [claimed(str(folder / "outputs" / str(i))) for i in range(200)]
for run in runs:
    (Path(run) / "train.log").touch()  # as a run writes into its folder: an empty one is taken back at the exit
print(" ".join(runs))
"""


def test_a_third_run_of_the_same_second_claims_the_folder_numbered_3(tmp_path):
    fresh = str(tmp_path / "outputs" / "10-00-00")
    assert [cli.run_dir.claimed(fresh) for _ in range(3)] == [fresh, f"{fresh}_2", f"{fresh}_3"]


def test_runs_started_together_each_claim_a_run_dir_of_their_own(tmp_path):
    runs = [subprocess.Popen([sys.executable, "-c", CLAIM_TOGETHER, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for run in runs:
        assert run.stdout.readline() == "ready\n"
    (tmp_path / "go").touch()
    claims = []
    for run in runs:
        out, errors = run.communicate(timeout=60)
        assert run.returncode == 0, errors
        claims.append(out.split())
    everything = claims[0] + claims[1]
    assert len(set(everything)) == len(everything) == 400  # no folder went to both
    expected = {str(tmp_path / "outputs" / name) for i in range(200) for name in (str(i), f"{i}_2")}
    assert set(everything) == expected


def other_runs_in_every_second_from_now(folder: Path, file: str, content: bytes) -> list[Path]:
    """folder/outputs/<date>/<time> of another run, holding file, for each second a run started now
    (or in the next 30 s) may take as its default run dir."""
    now, runs = time.time(), []
    for second in range(-1, 30):
        run = folder / "outputs" / time.strftime("%Y-%m-%d/%H-%M-%S", time.localtime(now + second))
        run.mkdir(parents=True)
        (run / file).write_bytes(content)
        runs.append(run)
    return runs


def test_a_run_started_in_the_second_of_a_run_that_holds_its_folder_trains_beside_it(tmp_path):
    earlier = other_runs_in_every_second_from_now(tmp_path, "ckpt_last.pt", b"another run's checkpoint")
    args = tiny_run(**{"train.max_steps": 2, "train.eval_interval": 2, "train.sample_interval": 0, "train.attn_log_interval": 0})
    result = run_cli("train.py", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [made] = [path for path in (tmp_path / "outputs").glob("*/*") if path not in earlier]
    assert OmegaConf.load(made / ".hydra" / "overrides.yaml") == args  # the command line, as given
    assert made.name.endswith("_2") and made.with_name(made.name.removesuffix("_2")) in earlier
    assert (made / "ckpt_last.pt").stat().st_size > 1000
    assert all((run / "ckpt_last.pt").read_bytes() == b"another run's checkpoint" for run in earlier)


def test_the_run_dir_is_claimed_once_however_often_it_is_read_and_a_command_that_trains_nothing_leaves_none(tmp_path,
                                                                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", return_hydra_config=True)
    first, again = cfg.hydra.run.dir, cfg.hydra.run.dir
    assert first == again and list((tmp_path / "outputs").glob("*/*")) == [tmp_path / first]
    printed = subprocess.run([sys.executable, str(ROOT / "train.py"), "--cfg", "all", "--resolve"], cwd=tmp_path / "outputs",
                             capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0 and "dir: outputs/" in printed.stdout, printed.stderr  # worked out, printed
    assert not (tmp_path / "outputs" / "outputs").exists()  # and taken back as the command ended


def test_a_refused_run_takes_back_the_folders_made_for_it_wherever_they_are_and_no_folder_that_was_there(tmp_path):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    (work / "mine").mkdir()  # an empty folder of the user's, named as the run dir
    for run_dir in ["mine", "made/for/it", str(elsewhere / "made" / "for_it"), "../elsewhere/made/too",
                    "../elsewhere/${now:%Y}/made", None]:  # an interpolation of the user's is given too
        given = [] if run_dir is None else [f"hydra.run.dir={run_dir}"]  # None: the default, outputs/<date>/<time>
        result = run_cli("train.py", "model.n_head=-1", *given, cwd=work)
        assert result.returncode == 2 and result.stderr == "error: model.n_head=-1 must be at least 1\n", result.stderr
    assert [path.name for path in work.iterdir()] == ["mine"] and list(elsewhere.iterdir()) == []
    (work / "outputs").mkdir()  # an empty outputs/ of the user's: the run takes back <date>/<time> only
    assert run_cli("train.py", "model.n_head=-1", cwd=work).returncode == 2
    assert list((work / "outputs").iterdir()) == []
    (work / "outputs").rmdir()
    (work / "outputs").write_text("mine")  # a file where the default run dir's first folder would be
    result = run_cli("train.py", "model.n_head=-1", cwd=work)
    assert result.returncode == 2 and result.stderr.startswith("error: outputs/") and result.stderr.endswith(
        " cannot be made a folder: a file is in the way; give another path\n"), result.stderr
    assert (work / "outputs").read_text() == "mine"
    (work / "outputs").unlink()
    # Another run's folder of each second this one may start in: this one claims <time>_2, and takes back only that.
    earlier = other_runs_in_every_second_from_now(work, "train.log", b"another run's log")
    assert run_cli("train.py", "model.n_head=-1", cwd=work).returncode == 2
    assert sorted(path.name for path in work.iterdir()) == ["mine", "outputs"]
    assert set((work / "outputs").glob("*/*")) == set(earlier)


def test_the_log_holds_each_line_once_however_many_came_before_and_after_the_record_was_written(tmp_path):
    log = logging.getLogger("train")
    level = log.level
    log.setLevel(logging.INFO)
    record = cli.run_dir.RunRecord(tmp_path)
    try:
        for n in range(1_500):  # more than the 1,000 lines held before the run's checks pass
            log.info("before %d", n)
        record.write(OmegaConf.create({}), OmegaConf.create({"overrides": {"task": ["model.n_layer=1"]}}), resumed=False)
        for n in range(1_500):  # and after: none of them held back, none written twice
            log.info("after %d", n)
    finally:
        record.close()
        log.setLevel(level)
    lines = [line.split("] ", 1)[1] for line in (tmp_path / "train.log").read_text().splitlines()]
    assert lines == [f"before {n}" for n in range(1_500)] + [f"after {n}" for n in range(1_500)]
    assert OmegaConf.load(tmp_path / ".hydra" / "overrides.yaml") == ["model.n_layer=1"]


def test_a_run_dir_the_run_cannot_make_files_in_is_one_line_before_anything_is_written(tmp_path, monkeypatch):
    # chattr +i: a folder not even root may add to (chmod does not stop root). A resumed run's first
    # new file was its TensorBoard events, whose writer thread printed a traceback beside the line.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    if subprocess.run(["chattr", "+i", "run"], cwd=tmp_path, capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not allowed here")
    record = cli.run_dir.RunRecord(tmp_path / "run")
    try:
        with pytest.raises(UserError, match=r"^run: the run cannot make files in its run dir \(Operation not "
                                                        r"permitted\); make it writable, or give another hydra.run.dir$"):
            record.write(OmegaConf.create({}), OmegaConf.create({"overrides": {"task": []}}), resumed=True)
        assert list((tmp_path / "run").iterdir()) == []
    finally:
        subprocess.run(["chattr", "-i", "run"], cwd=tmp_path, check=True)
        record.close()


@pytest.mark.parametrize("console", ["a pipe whose reader left", "a full disk"])
def test_a_console_that_cannot_be_written_is_said_once_and_train_log_keeps_every_line(tmp_path, console, capsys):
    # `train.py | head` once head has its lines, and `train.py > out.txt` on a full disk: logging's own
    # handler prints a traceback for every line after. The console's handler as train.py's logging
    # config names it.
    if console == "a full disk" and not os.path.exists("/dev/full"):
        pytest.skip("needs Linux's /dev/full")
    named = OmegaConf.load(ROOT / "configs" / "hydra" / "job_logging" / "train.yaml").handlers.console["class"]
    console_class = logging.config.BaseConfigurator({}).resolve(named)
    if console == "a pipe whose reader left":
        reader, writer = os.pipe()
        os.close(reader)
        stream = os.fdopen(writer, "w")
    else:
        stream = open("/dev/full", "w")  # noqa: SIM115 (closed below, whatever its buffer still holds)
    log = logging.getLogger("tests.console")
    log.propagate, log.level = False, logging.INFO
    log_file = logging.FileHandler(tmp_path / "train.log")  # as RunRecord adds it
    log.handlers = [console_class(stream), log_file]
    try:
        for step in range(3):
            log.info("step %d", step)
    finally:
        log.handlers = []
        log_file.close()
        with suppress(OSError):
            stream.close()
    said = capsys.readouterr().err
    reason = "Broken pipe" if console == "a pipe whose reader left" else "No space left on device"
    assert said == (f"warning: the console's output could not be written ({reason}); the run goes on, and train.log in "
                    f"its run dir keeps every line (Ctrl-C stops it, saving)\n")
    assert (tmp_path / "train.log").read_text().splitlines() == ["step 0", "step 1", "step 2"]


def test_sigterm_while_a_run_checks_its_config_ends_it_and_takes_back_its_run_dir(tmp_path):
    # torchrun stops every other process as soon as one fails: one still checking its config died
    # on the spot and left behind the empty run dir Hydra had made for it (seen under a loaded suite).
    before = signal.getsignal(signal.SIGTERM)
    finished = threading.Event()

    def stop_once_handled() -> None:  # as soon as train() hears SIGTERM, before its checks end
        while signal.getsignal(signal.SIGTERM) is before and not finished.is_set():
            time.sleep(0.0005)
        if not finished.is_set():
            os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=stop_once_handled)
    sender.start()
    try:
        result = run_cli("train.py", *tiny_run(**{"hydra.run.dir": "run"}), cwd=tmp_path)
    finally:
        finished.set()
        sender.join()
    assert result.returncode == 128 + signal.SIGTERM, result.stdout + result.stderr
    assert not (tmp_path / "run").exists() and not result.stderr  # nothing left, nothing said: the failed one speaks
    assert signal.getsignal(signal.SIGTERM) is before
