"""The checkpoint's one home, model_io/checkpoint.py: a save and a load round trip, replace the old
file whole, reach the disk first; broken files get clear errors, an older run state is brought up
to date; and loading a model for sampling, the tab or an export needs the weights, the shape and
the tokenizer, never the loop or the config schema."""

import gc
import os
import re
import resource
import signal
import subprocess
import sys
import weakref

import pytest
import torch

from model_io.checkpoint import Checkpoint, save_file, upgrade
from tests.helpers import ROOT, small_checkpoint
from user_error import UserError

LOAD_AND_LIST_MODULES = """
import sys
from pathlib import Path
from model_io.checkpoint import Checkpoint
from model_io.run_files import resolve_checkpoint
model, tokenizer = Checkpoint.load(resolve_checkpoint(sys.argv[1])).build_model()
assert model.num_parameters() > 0 and tokenizer.decode(tokenizer.encode("Once")) == "Once"
print(" ".join(sorted({name.split(".")[0] for name in sys.modules})))
"""


@pytest.mark.slow  # the shared trained run, and a fresh Python process
def test_loading_a_model_imports_neither_hydra_nor_omegaconf_nor_the_loop(trained_run):
    # A fresh interpreter: this process has imported Hydra for the other tests.
    loaded = subprocess.run([sys.executable, "-c", LOAD_AND_LIST_MODULES, str(trained_run)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    modules = set(loaded.stdout.split())
    assert {"model", "model_io", "data"} <= modules  # the list is real: what loading needs is in it
    assert not modules & {"hydra", "omegaconf", "training", "cli"}, modules & {"hydra", "omegaconf", "training", "cli"}


def test_a_checkpoint_round_trips_the_model_and_tokenizer(tmp_path):
    path, model = small_checkpoint(tmp_path)
    checkpoint = Checkpoint.load(path)
    assert checkpoint.step == 7 and checkpoint.best_val_loss == 1.5
    loaded, tokenizer = checkpoint.build_model()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert tokenizer.decode(tokenizer.encode("cab")) == "cab"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt_last.pt"]  # no temporary file left behind


def test_saving_over_a_checkpoint_replaces_it_whole(tmp_path):
    # Guards the rename: a reader holding the old file (here a hard link) keeps its bytes, and
    # the name then points at a new file. Writing over the old file in place fails both.
    path, _ = small_checkpoint(tmp_path)
    first = path.read_bytes()
    os.link(path, tmp_path / "held_by_a_reader.pt")
    small_checkpoint(tmp_path)  # a new random model: other bytes
    assert (tmp_path / "held_by_a_reader.pt").read_bytes() == first
    assert path.stat().st_ino != (tmp_path / "held_by_a_reader.pt").stat().st_ino
    assert path.read_bytes() != first and Checkpoint.load(path).step == 7


def test_a_save_reaches_the_disk_before_it_replaces_the_old_checkpoint(tmp_path, monkeypatch):
    # Guards the fsync: after a power cut, a renamed file whose bytes were still only in the page
    # cache can be empty. The real fsync and rename run; the test only records their order.
    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        real_fsync(fd)

    def replace(src, dst) -> None:
        calls.append(("replace", os.path.basename(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    small_checkpoint(tmp_path)
    assert calls == [("fsync", ".ckpt_last.pt.tmp"), ("replace", ".ckpt_last.pt.tmp")]


def test_broken_or_foreign_checkpoints_get_clear_errors(tmp_path):
    path, _ = small_checkpoint(tmp_path)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    with pytest.raises(UserError, match="truncated.pt is not a readable checkpoint"):
        Checkpoint.load(truncated)
    text = tmp_path / "notes.pt"
    text.write_text("hello")
    with pytest.raises(UserError, match="notes.pt is not a readable checkpoint"):
        Checkpoint.load(text)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(2)}, foreign)
    with pytest.raises(UserError, match="not a checkpoint of this project"):
        Checkpoint.load(foreign)
    with pytest.raises(UserError, match="^" + re.escape(f"{tmp_path / 'none.pt'} does not exist: give the path of a checkpoint file")):
        Checkpoint.load(tmp_path / "none.pt")  # not "truncated": there is no file
    with pytest.raises(UserError, match="^" + re.escape(f"{tmp_path} is a folder, not a checkpoint file: give the ckpt_best.pt")):
        Checkpoint.load(tmp_path)
    # A good file read onto a device that is not one, or not here: the file was blamed ("truncated").
    with pytest.raises(UserError, match="^" + re.escape("map_location='gpu' is not a device: give 'cpu', 'cuda', 'cuda:1' or "
                                                        "'mps'") + "$"):
        Checkpoint.load(path, map_location="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="^" + re.escape("map_location='cuda', but PyTorch sees no CUDA GPU here: load onto "
                                                            "'cpu'") + "$"):
            Checkpoint.load(path, map_location="cuda")
    assert Checkpoint.load(path, map_location=torch.device("cpu")).step == Checkpoint.load(path).step


def test_an_older_checkpoints_run_state_is_brought_up_to_date_in_one_place():
    old = {"rng": {"torch": "state"}, "evaluated": True, "skipped": 0, "window_loss": 0.0, "window_steps": 0}
    upgraded = upgrade(Checkpoint(model={}, config={}, tokenizer={}, run_state=old)).run_state
    assert upgraded["rng"] == [{"torch": "state"}]  # one RNG state per rank, as a single process saved it
    assert upgraded["world_size"] == 1 and upgraded["grad_scaler"] is None
    no_scaler = upgrade(Checkpoint(model={}, config={}, tokenizer={}, run_state={**old, "grad_scaler": {}})).run_state
    assert no_scaler["grad_scaler"] is None  # the empty state an fp32 or bf16 run once saved: no loss scale
    assert upgrade(Checkpoint(model={}, config={}, tokenizer={}, run_state=upgraded)).run_state == upgraded  # today's form stays


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda c: c.pop("step"), "it lacks model, config, tokenizer, step"),
    (lambda c: c.update(step=True), "its step is bool, not int"),  # True is an int to Python, never a step
    (lambda c: c["config"].update(train="x"), "its config's train is str, not a group of settings"),
    (lambda c: c["config"].update(optim=["adamw"]), "its config's optim is list, not a group of settings"),
    (lambda c: c.update(optimizer="x"), "its optimizer is str, not dict"),
], ids=["no step", "step True", "train str", "optim list", "optimizer str"])
def test_a_checkpoint_edited_by_hand_is_named_with_what_is_wrong_in_it(tmp_path, edit, problem):
    path, _ = small_checkpoint(tmp_path)
    saved = torch.load(path, weights_only=True)
    saved["config"] |= {"train": {}, "optim": {}}
    edit(saved)
    torch.save(saved, path)
    with pytest.raises(UserError, match=f"^{re.escape(str(path))} is not a checkpoint of this project \\({re.escape(problem)}\\)"):
        Checkpoint.load(path)


@pytest.mark.parametrize("tokenizer, problem", [
    ({"kind": "char"}, "no 'chars'"),  # its characters left out
    ({"kind": "bpe", "pattern": "x", "ranks": "YQ== 0\nYg== 0\n"}, "the BPE ranks are not each given once"),  # a Rust panic
])
def test_a_tokenizer_state_that_does_not_build_names_what_is_wrong(tokenizer, problem):
    checkpoint = Checkpoint(model={}, config={"model": {}}, tokenizer=tokenizer)
    for build in (checkpoint.build_model, checkpoint.build_tokenizer):  # train.py's resume builds the tokenizer alone
        with pytest.raises(UserError, match=rf"^the checkpoint's tokenizer is not one this version can build \({re.escape(problem)}"):
            build()


def test_a_save_into_a_folder_that_is_gone_says_so_rather_than_to_free_disk_space(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as refused:
        save_file({"model": {}}, tmp_path / "gone" / "ckpt_last.pt")  # (the full disk's line: tests/test_resume.py)
    assert str(refused.value) == ("could not save gone/ckpt_last.pt (No such file or directory); no ckpt_last.pt was written. "
                                  "Check that gone is still there and this user may write in it, and resume")


def test_a_save_that_fails_leaves_nothing_of_its_callers_frames_alive(tmp_path):
    # torch's C++ writer holds the file's writer: had the writer kept the write's OSError, whose
    # frames hold the callers' objects, the collector could not free them. A torchrun rank that
    # failed to save then kept its process group's connections open to its exit, and the rank
    # waiting for it heard of it only then, as torchrun stopped it (tests/test_distributed.py).
    class Caller:
        pass

    def save_from(caller: Caller) -> None:  # a frame that holds the caller, as the loop's frames hold the group
        save_file({"model": {"w": torch.zeros(100_000)}}, tmp_path / "ckpt_last.pt")

    said, caller, previous = "", Caller(), (signal.signal(signal.SIGXFSZ, signal.SIG_IGN), resource.getrlimit(resource.RLIMIT_FSIZE))
    alive = weakref.ref(caller)
    resource.setrlimit(resource.RLIMIT_FSIZE, (10_000, previous[1][1]))  # a file may grow to 10 kB: writes then fail with EFBIG
    try:
        save_from(caller)
    except UserError as error:
        said = str(error)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, previous[1])
        signal.signal(signal.SIGXFSZ, previous[0])
    assert said.startswith("could not save ") and "(File too large); no ckpt_last.pt was written" in said
    del caller
    gc.collect()
    assert alive() is None
