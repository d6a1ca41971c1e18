"""train.keep_checkpoints: the model alone at chosen steps, in the run dir's checkpoints/, for the
Attention tab's slider. Real runs of train.py: one that keeps, resumed to train on, and one that
keeps nothing, to say what the weights at each step are."""

import re
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from cli.config import MAX_KEPT_CHECKPOINTS, check_keep_checkpoints
from model_io.checkpoint import Checkpoint, build_model
from model_io.run_files import KEPT, LAST, kept_checkpoints
from tests.helpers import QUICK, run_cli, tiny_run
from training.build import seed_everything
from training.saving import kept_steps
from user_error import UserError

# QUICK with an evaluation every 4 steps, a flat learning rate (optim.min_lr = optim.lr), so that a
# run of 4 steps resumed to 8 follows the schedule of a run of 8 step for step, and dropout on, so
# that a random number drawn in passing would change the weights after it.
RUN = {**QUICK, "train.eval_interval": 4, "optim.min_lr": "1e-2", "model.dropout": 0.1}
KEEP = {"train.keep_checkpoints": "[0,3,4,6,8,9]"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> SimpleNamespace:
    """`kept`: 4 steps keeping [0,3,4,6,8,9], then resumed to 8 steps; `alone`: 8 steps keeping none."""
    cwd = tmp_path_factory.mktemp("keep")
    first = run_cli("train.py", *tiny_run(RUN, KEEP, **{"train.max_steps": 4, "hydra.run.dir": "kept"}), cwd=cwd)
    assert first.returncode == 0, first.stdout + first.stderr
    at_4 = Checkpoint.load(cwd / "kept" / LAST)
    kept_first = {step: (path.read_bytes(), path.stat().st_mtime_ns) for step, path in kept_checkpoints(cwd / "kept").items()}
    resumed = run_cli("train.py", "resume=kept", "train.max_steps=8", cwd=cwd)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    alone = run_cli("train.py", *tiny_run(RUN, **{"train.max_steps": 8, "hydra.run.dir": "alone"}), cwd=cwd)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    return SimpleNamespace(dir=cwd / "kept", first=first, resumed=resumed, at_4=at_4, kept_first=kept_first,
                           alone=Checkpoint.load(cwd / "alone" / LAST))


def test_log_spaced_steps_are_step_0_every_power_of_two_and_the_last():
    assert kept_steps("log", 2000) == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2000]  # configs/train/default.yaml
    assert kept_steps("log", 1024) == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]  # the last once
    assert kept_steps("log", 1) == [0, 1]
    assert kept_steps([20, 0, 5, 5, 30], 20) == [0, 5, 20]  # a list: in order, once each, up to max_steps


def test_a_list_longer_than_the_cap_is_refused_saying_its_count_and_the_cap():
    check_keep_checkpoints(OmegaConf.create(list(range(MAX_KEPT_CHECKPOINTS))))
    with pytest.raises(UserError, match=f"lists {MAX_KEPT_CHECKPOINTS + 1} steps, more than the {MAX_KEPT_CHECKPOINTS}"):
        check_keep_checkpoints(OmegaConf.create(list(range(MAX_KEPT_CHECKPOINTS + 1))))


@pytest.mark.slow
def test_a_run_keeps_a_model_only_checkpoint_at_exactly_the_listed_steps_it_reaches(runs):
    assert list(kept_checkpoints(runs.dir)) == [0, 3, 4, 6, 8]  # 9 is past train.max_steps=8
    assert sorted(path.name for path in (runs.dir / KEPT).iterdir()) == [f"step_00000{k}.pt" for k in (0, 3, 4, 6, 8)]
    for step, path in kept_checkpoints(runs.dir).items():
        kept = Checkpoint.load(path)
        assert (kept.step, kept.optimizer, kept.run_state) == (step, None, None), path
        model, tokenizer = kept.build_model()  # as the Attention tab loads it
        assert tokenizer.kind == "char" and model.config.n_layer == 2


@pytest.mark.slow
def test_the_weights_kept_at_a_step_are_bitwise_the_weights_the_run_had_there(runs):
    kept = {step: Checkpoint.load(path) for step, path in kept_checkpoints(runs.dir).items()}

    def same(a: dict, b: dict) -> bool:
        return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
    # Step 0: the weights as the run built them (train.seed), before any update.
    seed_everything(kept[0].config["train"]["seed"])
    assert same(kept[0].model, build_model(kept[0].config["model"], kept[0].build_tokenizer().vocab_size).state_dict())
    # Step 4: the ckpt_last.pt the first run ended with, its val loss of that step the best so far.
    assert same(kept[4].model, runs.at_4.model) and kept[4].best_val_loss == runs.at_4.best_val_loss
    # Step 8, kept after the resume: the last weights of the run that kept nothing, so keeping
    # changed nothing the run computed.
    assert same(kept[8].model, runs.alone.model)
    assert not same(kept[3].model, kept[4].model) and not same(kept[6].model, kept[8].model)


@pytest.mark.slow
def test_a_resumed_run_leaves_the_files_kept_and_keeps_the_steps_still_ahead(runs):
    assert list(runs.kept_first) == [0, 3, 4]
    for step, (content, mtime) in runs.kept_first.items():
        path = kept_checkpoints(runs.dir)[step]
        assert (path.read_bytes(), path.stat().st_mtime_ns) == (content, mtime), step  # not written again


@pytest.mark.slow
def test_the_log_says_the_steps_the_folder_the_disk_and_the_steps_not_reached(runs):
    line = re.search(r"keeping model-only checkpoints at 3 steps \(0, 3, 4\) in kept/checkpoints: "
                     r"about 3 x (\d+) kB = \d+ kB; 6, 8, 9 are past train.max_steps=4, not reached\n", runs.first.stdout)
    assert line, runs.first.stdout
    actual_kB = (runs.dir / KEPT / "step_000000.pt").stat().st_size / 1e3
    assert abs(int(line[1]) - actual_kB) < 0.1 * actual_kB  # "about": within 10% of the file
    assert re.search(r"keeping model-only checkpoints at 5 steps \(0, 3, 4, 6, 8\) in kept/checkpoints: about 5 x \d+ kB"
                     r" = \d+ kB; 9 is past train.max_steps=8, not reached\n", runs.resumed.stdout), runs.resumed.stdout


@pytest.mark.slow
def test_resuming_from_a_kept_checkpoint_says_it_holds_the_model_alone(runs):
    result = run_cli("train.py", f"resume={kept_checkpoints(runs.dir)[4]}", cwd=runs.dir.parent)
    assert result.returncode == 2 and "holds the model alone" in result.stderr and len(result.stderr.splitlines()) == 1
