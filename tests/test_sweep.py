"""A Hydra sweep (train.py -m): one run dir per value, each with its HParams for TensorBoard."""

import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from cli.sweep_check import check_same_values, said_as_its_job
from tests.helpers import (
    ROOT,
    assert_one_error_line,
    read_events,
    run_cli,
    signal_after_line,
    tiny_gpt2_folder,
    tiny_run,
)
from user_error import UserError

pytestmark = pytest.mark.slow  # a multirun of training runs


def test_a_sweep_makes_one_run_dir_per_value_and_a_second_sweep_there_is_refused(tmp_path):
    sweep = tiny_run(**{"model.n_head": "1,2", "train.max_steps": 4, "train.eval_interval": 4, "hydra.sweep.dir": "sweep"})
    result = run_cli("train.py", "-m", *sweep, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    saved = {path: path.read_bytes() for path in (tmp_path / "sweep").rglob("*") if path.is_file()}
    again = run_cli("train.py", "-m", *sweep, cwd=tmp_path)  # the same sweep dir: its runs would be overwritten
    assert_one_error_line(again, "error: hydra.sweep.dir=sweep already holds runs (sweep/0/ckpt_best.pt, ...), which ")
    # resume=auto takes each job's run by its number: the values in another order would swap the runs' settings.
    swapped = run_cli("train.py", "-m", *tiny_run(**{"model.n_head": "2,1", "train.max_steps": 6, "train.eval_interval": 4,
                                                     "hydra.sweep.dir": "sweep", "resume": "auto"}), cwd=tmp_path)
    assert_one_error_line(swapped, "error: job #0 of the sweep (model.n_head=2) would go on with sweep/0, which trained "
                                   "with model.n_head=1: resume=auto takes each job's run by its number")
    # ...and so would runs going on there from another run's checkpoint.
    branched = run_cli("train.py", "-m", *sweep, "resume=sweep/0", cwd=tmp_path)
    assert_one_error_line(branched, "error: hydra.sweep.dir=sweep already holds runs (sweep/0/ckpt_best.pt, ...), which ")
    assert {path: path.read_bytes() for path in (tmp_path / "sweep").rglob("*") if path.is_file()} == saved
    runs = sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir())
    assert runs == ["0", "1"]
    for run, n_head in (("0", 1), ("1", 2)):
        run_dir = tmp_path / "sweep" / run
        assert (run_dir / "ckpt_last.pt").is_file() and list(run_dir.glob("events.out.tfevents.*"))
        assert torch.load(run_dir / "ckpt_last.pt", weights_only=True)["config"]["model"]["n_head"] == n_head
        heads = {tag.split("/")[2] for tag in read_events(run_dir).Tags()["images"] if tag.startswith("attention/layer_")}
        assert heads == {f"head_{h}" for h in range(n_head)}
        # The HParams tab's data, read back as TensorBoard reads it: this run's settings and result.
        events = read_events(run_dir)
        content = events.PluginTagToContent("hparams")
        assert {"_hparams_/experiment", "_hparams_/session_start_info", "_hparams_/session_end_info"} <= set(content)
        start = HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
        assert start.hparams["model.n_head"].number_value == n_head
        assert start.hparams["optim.name"].string_value == "muon"
        experiment = HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
        assert "hparams/best_val_loss" in {m.name.tag for m in experiment.metric_infos}
        best = events.Scalars("hparams/best_val_loss")[-1].value
        assert best == pytest.approx(min(e.value for e in events.Scalars("loss/val")[1:]), rel=1e-6)
    # The values in the first sweep's order: each job goes on with its own run.
    longer = run_cli("train.py", "-m", *tiny_run(**{"model.n_head": "1,2", "train.max_steps": 6, "train.eval_interval": 4,
                                                    "hydra.sweep.dir": "sweep", "resume": "auto"}), cwd=tmp_path)
    assert longer.returncode == 0, longer.stderr
    assert [torch.load(tmp_path / "sweep" / run / "ckpt_last.pt", weights_only=True)["step"] for run in ("0", "1")] == [6, 6]


@pytest.mark.parametrize(("sweep", "message"), [
    ({"model.n_head": "2,3"}, "error: job #1 of the sweep (model.n_layer=2 model.n_head=3 "),
    ({"train.batch_size": "8,x"}, "error: train.batch_size=x must be a whole number"),
    ({"tokenizer": "char,nope"}, "error: tokenizer=nope is not an option of tokenizer; choose one of: bpe, char, gpt2"),
    ({"experiment": "qwen3_shape", "model.n_head": "4,3", "model.n_embd": 96},
     "experiment=qwen3_shape): model.n_kv_head=2, set by experiment=qwen3_shape, does not divide model.n_head=3: "),
    # resume=auto with no run there yet: each job starts afresh, so it is checked as a new run
    ({"resume": "auto", "optim.lr": "1e-2,1e-4"}, "optim.min_lr=0.001 must be between 0 and optim.lr=0.0001; no job has run"),
], ids=["a value out of range", "a value of the wrong type", "a group's option that is not there", "a preset's value",
        "a value out of range, resume=auto"])
def test_a_bad_value_in_a_later_job_stops_the_sweep_before_any_job_runs(tmp_path, sweep, message):
    # Checked by cli/sweep_check.py before the first job: otherwise job #0 would train whole first.
    result = run_cli("train.py", "-m", *tiny_run(**sweep, **{"hydra.sweep.dir": "sweep"}), cwd=tmp_path)
    assert_one_error_line(result, message)
    if sweep == {"model.n_head": "2,3"}:
        assert result.stderr.rstrip().endswith("is not divisible by model.n_head=3: each head needs n_embd // n_head "
                                               "channels; pick model.n_head from [1, 2, 4, 8, 16, 32] (or set model.head_dim); "
                                               "no job has run")
    assert not (tmp_path / "sweep").exists()  # not even Hydra's multirun.yaml


@pytest.mark.parametrize(("sweep", "message"), [
    ({"optim.lr": "1e-2,1e-4"}, "optim.lr=0.0001 optim.min_lr=0.001): optim.min_lr=0.001 must be between 0 and optim.lr=0.0001"),
    ({"model.n_head": "2,4"}, "model.n_head=4 contradicts the weights of init_from=gpt2, which have model.n_head=2; drop it: "
                              "the shape comes from the weights; no job has run"),
], ids=["a value out of range", "a shape the weights do not have"])
def test_a_sweep_from_pretrained_weights_checks_each_job_in_their_shape_before_any_job_runs(tmp_path, sweep, message):
    # The weights' config.json gives each job its shape in the check, as it does when the job starts.
    tiny_gpt2_folder(tmp_path / "gpt2")  # 2 layers of 2 heads, 32 wide: tiny_run's shape
    result = run_cli("train.py", "-m", "init_from=gpt2", *tiny_run(**sweep, **{"hydra.sweep.dir": "sweep"}), cwd=tmp_path)
    assert_one_error_line(result, "error: job #1 of the sweep (init_from=gpt2 ")
    assert message in result.stderr and result.stderr.rstrip().endswith("; no job has run")
    assert not (tmp_path / "sweep").exists()


def test_a_sweep_that_goes_on_checks_each_job_against_its_run_before_any_job_runs(tmp_path):
    # As each job's resume would refuse it, but before the first job goes on and Hydra rewrites the sweep's record.
    (tmp_path / "story.txt").write_text("the cat sat on the mat and the dog sat on the log. " * 400)
    sweep = {"model.n_head": "1,2", "hydra.sweep.dir": "sweep", "resume": "auto", "data": "text", "data.path": "story.txt",
             "data.n_chars": None}
    assert run_cli("train.py", "-m", *tiny_run(**sweep, **{"train.max_steps": 2}), cwd=tmp_path).returncode == 0
    record = (tmp_path / "sweep" / "multirun.yaml").read_text()
    for change, message in [({"model.n_layer": 3}, "resume: model.n_layer=3 would change the model this run was trained with (2)"),
                            ({"optim.min_lr": 1}, "optim.min_lr=1 must be between 0 and optim.lr=0.01"),
                            ({"data.path": "moved.txt"}, "moved.txt does not exist")]:  # a text given anew: there, at least
        again = run_cli("train.py", "-m", *tiny_run(**{**sweep, "train.max_steps": 4, **change}), cwd=tmp_path)
        assert_one_error_line(again, "error: job #0 of the sweep (")
        assert message in again.stderr and again.stderr.rstrip().endswith("; no job has run")
    assert (tmp_path / "sweep" / "multirun.yaml").read_text() == record
    assert [torch.load(tmp_path / "sweep" / run / "ckpt_last.pt", weights_only=True)["step"] for run in ("0", "1")] == [2, 2]


def test_a_sweep_a_config_file_gives_is_checked_before_any_job_runs(tmp_path):
    # hydra.sweeper.params, here in an experiment of the user's own config folder: Hydra's sweeper
    # puts its values before the command line's.
    (tmp_path / "mine" / "experiment").mkdir(parents=True)
    (tmp_path / "mine" / "experiment" / "heads.yaml").write_text(
        "# @package _global_\nhydra:\n  sweeper:\n    params:\n      model.n_head: 2,3\n")
    tiny = tiny_run(**{"hydra.sweep.dir": "sweep", "model.n_head": None})  # (the command line's n_head would win)
    result = run_cli("train.py", "-m", "--config-dir", str(tmp_path / "mine"), "experiment=heads", *tiny, cwd=tmp_path)
    assert_one_error_line(result, "error: job #1 of the sweep (model.n_head=3 experiment=heads model.n_layer=2 ")
    assert not (tmp_path / "sweep").exists()


def test_a_sweep_over_config_files_by_glob_runs_each_of_them(tmp_path):
    # Hydra's glob() sweeps over a group's files: its jobs cannot be listed up front, each checks its own.
    (tmp_path / "mine" / "experiment").mkdir(parents=True)
    for name, layers in (("my_one", 1), ("my_two", 2)):
        (tmp_path / "mine" / "experiment" / f"{name}.yaml").write_text(f"# @package _global_\nmodel:\n  n_layer: {layers}\n")
    tiny = tiny_run(**{"hydra.sweep.dir": "sweep", "model.n_layer": None, "debug": "shapes"})
    result = run_cli("train.py", "-m", "--config-dir", str(tmp_path / "mine"), "experiment=glob(my_*)", *tiny, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stdout.splitlines() if line.endswith(", vocab 1103")] == [
        "  B=2 sequences, T=32 tokens, C=32 channels, H=2 heads of D=16 dims, 1 block, vocab 1103",
        "  B=2 sequences, T=32 tokens, C=32 channels, H=2 heads of D=16 dims, 2 blocks, vocab 1103"]  # each file's model


def test_a_missing_text_file_in_a_later_job_stops_the_sweep_before_any_job_runs(tmp_path):
    (tmp_path / "book.txt").write_text("Once upon a time. " * 2000)
    result = run_cli("train.py", "-m", *tiny_run(**{"data": "text", "data.path": "book.txt,nowhere.txt", "data.n_chars": None,
                                                    "hydra.sweep.dir": "sweep"}), cwd=tmp_path)
    assert_one_error_line(result, "error: job #1 of the sweep (")
    assert result.stderr.rstrip().endswith("data.path=nowhere.txt does not exist; give a .txt or .jsonl file (or .gz), "
                                           "or a folder of them; no job has run")
    assert not (tmp_path / "sweep").exists()


def test_a_job_that_stops_midway_names_itself_what_ran_and_how_the_sweep_goes_on(tmp_path):
    # A text too short for the second job's block_size is found only as that job reads it: the line
    # once named no job, and said nothing of the one that ran or of the one that never did.
    (tmp_path / "work").mkdir()  # the sweep's folder outside the working folder: ../sweep
    (tmp_path / "work" / "book.txt").write_text("Once upon a time. " * 200)
    sweep = {"data": "text", "data.path": "book.txt", "data.n_chars": None, "tokenizer": "char", "train.max_steps": 4,
             "train.eval_interval": 4, "hydra.sweep.dir": "../sweep"}
    result = run_cli("train.py", "-m", *tiny_run(sweep, **{"model.block_size": "16,4000,8"}), cwd=tmp_path / "work")
    assert_one_error_line(result, "error: job #1 of the sweep (")
    assert "model.block_size=4000 " in result.stderr and "): model.block_size=4000 needs more than 4000 tokens" in result.stderr
    assert result.stderr.rstrip().endswith("; job #0 ran, the rest did not: fix its values, then run the sweep again "
                                           "with resume=auto hydra.sweep.dir=../sweep (what ran is kept)")
    assert sorted(path.name for path in (tmp_path / "sweep").iterdir()) == ["0", "multirun.yaml"]  # job #1's folder taken back
    first = (tmp_path / "sweep" / "0" / "ckpt_last.pt").read_bytes()
    # As it says: the sweep goes on, the job that ran kept as it was.
    again = run_cli("train.py", "-m", *tiny_run(sweep, **{"model.block_size": "16,32,8", "resume": "auto"}), cwd=tmp_path / "work")
    assert again.returncode == 0, again.stdout + again.stderr
    assert (tmp_path / "sweep" / "0" / "ckpt_last.pt").read_bytes() == first
    assert [torch.load(tmp_path / "sweep" / job / "ckpt_last.pt", weights_only=True)["config"]["model"]["block_size"]
            for job in ("0", "1", "2")] == [16, 32, 8]


def test_ctrl_c_in_a_sweep_saves_its_job_ends_the_sweep_and_says_how_to_go_on_with_every_job(tmp_path):
    # A real process and a real SIGINT. The stop line gives the command that goes on with the job
    # alone; the sweep's line the one that goes on with the job and then runs the ones after it.
    sweep = {"train.max_steps": 30, "train.log_interval": 1, "hydra.sweep.dir": "sweep"}
    process = subprocess.Popen([sys.executable, str(ROOT / "train.py"), "-m", *tiny_run(sweep, **{"train.seed": "1,2"})],
                               cwd=tmp_path, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    output = signal_after_line(process, "step 5/30", signal.SIGINT)
    assert process.returncode == 130, output
    stopped = re.search(r"stopped by SIGINT after step (\d+); saved sweep/0/ckpt_last.pt", output)
    assert stopped, output
    assert ("job #0 of the sweep (" in output and "train.seed=1) was stopped, and the sweep with it (no job ran before "
            "it): to go on with every job, run the same -m command again with resume=auto hydra.sweep.dir=sweep"
            in output), output
    assert not (tmp_path / "sweep" / "1").exists()
    # As it says: job #0 goes on from its step, then job #1 trains.
    again = run_cli("train.py", "-m", *tiny_run(sweep, resume="auto", **{"train.seed": "1,2"}), cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"resuming sweep/0 at step {stopped.group(1)}" in again.stdout
    assert [torch.load(tmp_path / "sweep" / job / "ckpt_last.pt", weights_only=True)["step"] for job in "01"] == [30, 30]


def test_resume_auto_in_a_sweep_needs_a_named_sweep_dir(tmp_path):
    # The default hydra.sweep.dir is new at every start: resume=auto would start every job afresh each time.
    result = run_cli("train.py", "-m", *tiny_run(**{"model.n_head": "1,2", "resume": "auto"}), cwd=tmp_path)
    assert_one_error_line(result, "error: resume=auto in a sweep goes on with the runs in hydra.sweep.dir, a new folder "
                                  "each time unless you name it: add hydra.sweep.dir=<folder>")
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_under_torchrun_is_refused_before_any_job(tmp_path, monkeypatch):
    # As torchrun starts each process: WORLD_SIZE set (here in-process, this process as the first).
    monkeypatch.setenv("WORLD_SIZE", "2")
    result = run_cli("train.py", "-m", *tiny_run(**{"model.n_head": "1,2", "hydra.sweep.dir": "sweep"}), cwd=tmp_path)
    assert_one_error_line(result, "error: a sweep (-m) cannot run under torchrun; start one torchrun per configuration instead")
    assert not (tmp_path / "sweep").exists()


def job_of_a_sweep(number: int, output_dir: Path) -> DictConfig:
    """Hydra's config as a sweep's job number `number` sees it: the fields said_as_its_job reads."""
    return OmegaConf.create({"mode": RunMode.MULTIRUN, "job": {"num": number}, "sweep": {"dir": "sweep"},
                             "overrides": {"task": ["train.seed=3"]}, "runtime": {"output_dir": str(output_dir)}})


@pytest.mark.parametrize(("number", "before"), [(0, "no job ran before it"), (1, "job #0 ran before it"),
                                                (3, "jobs #0 to #2 ran before it")])
def test_a_signal_names_the_jobs_before_and_only_a_signal_of_a_training_sweep_that_can_go_on_says_how(
        tmp_path, caplog, number, before):
    config = job_of_a_sweep(number, tmp_path)
    said = (f"job #{number} of the sweep (train.seed=3) was stopped, and the sweep with it ({before}): to go on with "
            "every job, run the same -m command again with resume=auto hydra.sweep.dir=sweep")
    for code, resume, trains, says in ((130, None, True, True), (143, "auto", True, True), (1, None, True, False),
                                       (128, None, True, False), (None, None, True, False), ("stopped", None, True, False),
                                       (130, "run/ckpt_last.pt", True, False), (130, None, False, False)):
        caplog.clear()
        with (caplog.at_level(logging.INFO, logger="train"), pytest.raises(SystemExit) as ended,
              said_as_its_job(config, resume, trains)):
            raise SystemExit(code)
        assert ended.value.code == code  # the same exit, whatever is said
        assert caplog.messages == ([said] if says else []), (code, resume, trains)


def test_resume_auto_checks_every_swept_key_of_each_jobs_run_and_takes_its_text_file_however_spelt(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    last = tmp_path / "sweep" / "0" / "ckpt_last.pt"
    last.parent.mkdir(parents=True)
    torch.save({"config": {"model": {"n_head": 1}, "optim": {"lr": 0.01}, "data": {"path": str(tmp_path / "a.txt")}}}, last)
    job = ["model.n_head=1", "optim.lr=0.03", 'data.path="~/a.txt"']  # the job's values, as the sweep gives them
    cfg = OmegaConf.create({"model": {"n_head": 1}, "optim": {"lr": 0.03}, "data": {"path": "~/a.txt"}})
    swept = {"model.n_head", "optim.lr", "data.path"}
    with pytest.raises(UserError, match=r"^job #0 of the sweep \(model.n_head=1 optim.lr=0.03 data.path=\"~/a.txt\"\) would go on "
                                        rf"with {re.escape(str(last.parent))}, which trained with optim.lr=0.01: "):
        check_same_values(0, job, swept, cfg, last)  # the last of three keys differs
    cfg.optim.lr = 0.01
    check_same_values(0, job, swept, cfg, last)  # the same run: its text file given from the home folder


def test_the_way_to_go_on_quotes_a_sweep_dir_the_shell_would_split(tmp_path):
    config = job_of_a_sweep(1, tmp_path)
    config.sweep.dir = "my sweeps/lr"
    with (pytest.raises(UserError, match=r"run the sweep again with resume=auto 'hydra.sweep.dir=my sweeps/lr' \(what ran"),
          said_as_its_job(config)):
        raise UserError("a text too short")


def test_a_job_that_fails_says_which_jobs_ran_and_how_to_go_on_only_where_resume_auto_would(tmp_path):
    def said(number: int, resume: str | None = None) -> str:
        with pytest.raises(UserError) as failed, said_as_its_job(job_of_a_sweep(number, tmp_path), resume):
            raise UserError("a text too short")
        return str(failed.value)
    go_on = ": fix its values, then run the sweep again with resume=auto hydra.sweep.dir=sweep (what ran is kept)"
    assert said(2) == f"job #2 of the sweep (train.seed=3): a text too short; jobs #0 to #1 ran, the rest did not{go_on}"
    assert said(2, "run/ckpt_last.pt").endswith("jobs #0 to #1 ran, the rest did not")  # goes on from a checkpoint it names
    (tmp_path / "ckpt_last.pt").write_bytes(b"")  # the job saved: resume=auto would take it up, not start it again
    assert said(1).endswith("job #0 ran, the rest did not")
