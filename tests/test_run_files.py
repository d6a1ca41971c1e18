"""model_io/run_files.py: which checkpoint file a run's name means."""

import os
import re

import pytest

from model_io.run_files import KEPT, checkpoint_to_resume, kept_checkpoints, resolve_checkpoint, resolve_resume
from tests.helpers import small_checkpoint
from user_error import UserError


def test_resolve_checkpoint_prefers_best_in_a_run_dir(tmp_path):
    small_checkpoint(tmp_path, "ckpt_last.pt")
    assert resolve_checkpoint(str(tmp_path)).name == "ckpt_last.pt"
    small_checkpoint(tmp_path, "ckpt_best.pt")
    assert resolve_checkpoint(str(tmp_path)).name == "ckpt_best.pt"
    assert resolve_checkpoint(tmp_path).name == "ckpt_best.pt"  # a notebook's RUN may be a Path (it raised AttributeError)
    with pytest.raises(TypeError, match=re.escape("run=None: give a run dir or a .pt file, as a str or a Path, or 'latest'")):
        resolve_checkpoint(None)
    with pytest.raises(UserError, match="does not exist"):
        resolve_checkpoint(str(tmp_path / "missing"))
    empty = tmp_path / "empty_run"
    empty.mkdir()
    with pytest.raises(UserError, match=re.escape("has no checkpoint (ckpt_best.pt, ckpt_last.pt or one it kept)")):
        resolve_checkpoint(str(empty))


def test_an_empty_run_or_resume_is_refused_not_read_as_the_working_folder(tmp_path, monkeypatch):
    small_checkpoint(tmp_path, "ckpt_last.pt")  # run=$RUN with RUN unset, typed inside a run dir
    monkeypatch.chdir(tmp_path)
    for empty in ("", " "):
        with pytest.raises(UserError, match="^" + re.escape("run= is empty; give a run dir (e.g. outputs/<date>/<time>), "
                                                            "a .pt file, or latest") + "$"):
            resolve_checkpoint(empty)
        with pytest.raises(UserError, match="^" + re.escape("resume= is empty;")):
            resolve_resume(empty)
    assert str(resolve_checkpoint(".")) == "ckpt_last.pt"  # "." is the working folder, as given


def test_a_sweeps_folder_given_as_a_run_names_the_run_dirs_inside_it(tmp_path):
    sweep = tmp_path / "multirun" / "2026-01-01" / "12-00-00"  # one run dir per value: 0, 1, ..., 10
    for name in ("10", "0", "2", "1"):
        (sweep / name).mkdir(parents=True)
        small_checkpoint(sweep / name, "ckpt_last.pt")
    (sweep / ".submitit").mkdir()  # not a run
    (sweep / "best_only").mkdir()  # sampled from, not resumed
    small_checkpoint(sweep / "best_only", "ckpt_best.pt")
    runs = f"it holds 5 run dirs (0, 1, 2, 10, ...): give one, e.g. run={sweep / '0'}"  # by number; the first four
    with pytest.raises(UserError, match="^" + re.escape(f"run={sweep} has no checkpoint (ckpt_best.pt, ckpt_last.pt or one it kept); {runs}") + "$"):
        resolve_checkpoint(str(sweep))
    resumable = f"it holds 4 run dirs (0, 1, 2, 10): give one, e.g. resume={sweep / '0'}"
    with pytest.raises(UserError, match="^" + re.escape(f"resume={sweep} has no ckpt_last.pt; {resumable}") + "$"):
        resolve_resume(str(sweep))
    (tmp_path / "one" / "0").mkdir(parents=True)
    small_checkpoint(tmp_path / "one" / "0", "ckpt_last.pt")
    with pytest.raises(UserError, match=re.escape(f"; it holds 1 run dir (0): give one, e.g. resume={tmp_path / 'one' / '0'}")):
        resolve_resume(str(tmp_path / "one"))


def test_a_run_that_has_saved_nothing_yet_is_named_as_one_not_as_a_wrong_folder(tmp_path, monkeypatch):
    # A run still before its first evaluation: train.py has written its config, no checkpoint yet.
    monkeypatch.chdir(tmp_path)
    older = tmp_path / "outputs" / "2026-01-01" / "11-00-00"  # named later, started earlier
    (older / ".hydra").mkdir(parents=True)
    os.utime(older, (1_000, 1_000))
    young = tmp_path / "outputs" / "2026-01-01" / "10-00-00"
    (young / ".hydra").mkdir(parents=True)
    (young / ".hydra" / "config.yaml").write_text("model: {}\n")
    (older / ".hydra" / "config.yaml").write_text("model: {}\n")
    os.utime(older, (1_000, 1_000))
    saves = ("saved none yet: a run saves its first checkpoint at its first evaluation after step 0 (every train.eval_interval "
             "steps); wait for it")
    with pytest.raises(UserError, match="^" + re.escape(f"run={young} has no checkpoint (ckpt_best.pt, ckpt_last.pt or one it kept); it is a run dir that has {saves}")):
        resolve_checkpoint(str(young))
    with pytest.raises(UserError, match="^" + re.escape("run=latest found no checkpoint under outputs/ or multirun/: the newest run, "
                                                        "outputs/2026-01-01/10-00-00, has saved none yet")):
        resolve_checkpoint("latest")
    for run in (young, older):
        (run / ".hydra" / "config.yaml").unlink()  # no run at all: the first run is still to train
    with pytest.raises(UserError, match=re.escape("found no checkpoint under outputs/ or multirun/; train one first (make train)")):
        resolve_checkpoint("latest")


def test_a_run_is_refused_a_run_dir_whose_checkpoints_it_would_overwrite(tmp_path):
    here, there = tmp_path / "here", tmp_path / "there"
    for run_dir in (here, there):
        run_dir.mkdir()
        small_checkpoint(run_dir, "ckpt_last.pt")
        small_checkpoint(run_dir, "ckpt_best.pt")
    assert checkpoint_to_resume(str(here), here, restarted=False) == here / "ckpt_last.pt"  # going on where it is
    assert checkpoint_to_resume(str(here / "ckpt_last.pt"), here, restarted=False) == here / "ckpt_last.pt"
    assert checkpoint_to_resume("auto", here, restarted=False) == here / "ckpt_last.pt"
    assert checkpoint_to_resume(None, here, restarted=True) == here / "ckpt_last.pt"  # a process torchrun restarted
    # Another run's checkpoint, or an earlier point of this one (its best), going on in this dir: refused.
    for resume, source in ((there, "ckpt_last.pt"), (here / "ckpt_best.pt", "ckpt_best.pt")):
        with pytest.raises(UserError, match="^" + re.escape(
                f"resume={resume} would go on in {os.path.relpath(here)} from {source}, overwriting the ckpt_last.pt there; "
                f"to branch from it, add hydra.run.dir=<a new folder>, or resume={os.path.relpath(here)} to go on from "
                "its ckpt_last.pt") + "$"):
            checkpoint_to_resume(str(resume), here, restarted=False)
    new = tmp_path / "new"
    assert checkpoint_to_resume(str(here / "ckpt_best.pt"), new, restarted=False) == here / "ckpt_best.pt"  # a branch
    # A dir that kept its best model alone (its ckpt_last.pt deleted): a new run, or resume=auto, would overwrite it.
    (there / "ckpt_last.pt").unlink()
    for resume in (None, "auto"):
        with pytest.raises(UserError, match=re.escape("holds ckpt_best.pt but no ckpt_last.pt, and a new run there would "
                                                      "overwrite it")):
            checkpoint_to_resume(resume, there, restarted=False)
    with pytest.raises(UserError, match="^" + re.escape(f"resume={there} has no ckpt_last.pt, only ckpt_best.pt; to go on "
                                                        f"from that one, give resume={there / 'ckpt_best.pt'} "
                                                        "hydra.run.dir=<a new folder>") + "$"):
        resolve_resume(str(there))
    # A ckpt_last.pt that is no file was called missing; a file of the run that is no checkpoint, a
    # branch that would overwrite: each is said for what it is (Checkpoint.load refuses train.log).
    last = there / "ckpt_last.pt"
    for what in ("a folder", "a link that leads nowhere (to a path that does not exist, or round in a loop)"):
        last.mkdir() if what == "a folder" else last.symlink_to("nowhere")
        with pytest.raises(UserError, match="^" + re.escape(f"resume={there}: its ckpt_last.pt is {what}, not the checkpoint "
                                                            "train.py saves there; put the run's checkpoint back")):
            resolve_resume(str(there))
        last.rmdir() if what == "a folder" else last.unlink()
    (here / "train.log").write_text("[10:00:00] step 10\n")
    assert checkpoint_to_resume(str(here / "train.log"), here, restarted=False) == here / "train.log"


def test_kept_checkpoints_are_the_files_named_by_step_in_step_order(tmp_path):
    kept = tmp_path / KEPT
    kept.mkdir()
    for name in ("step_000100.pt", "step_000020.pt", "step_best.pt", "notes.pt"):
        (kept / name).write_bytes(b"")
    (kept / "step_000300.pt").mkdir()  # a folder, named as a checkpoint would be
    assert kept_checkpoints(tmp_path) == {20: kept / "step_000020.pt", 100: kept / "step_000100.pt"}
    assert kept_checkpoints(tmp_path / "none kept") == {}
