"""model_io/run_files.py: which checkpoint file a run's name means."""

import pytest

from model_io.run_files import resolve_checkpoint
from tests.helpers import small_checkpoint
from user_error import UserError


def test_resolve_checkpoint_prefers_best_in_a_run_dir(tmp_path):
    small_checkpoint(tmp_path, "ckpt_last.pt")
    assert resolve_checkpoint(str(tmp_path)).name == "ckpt_last.pt"
    small_checkpoint(tmp_path, "ckpt_best.pt")
    assert resolve_checkpoint(str(tmp_path)).name == "ckpt_best.pt"
    with pytest.raises(UserError, match="does not exist"):
        resolve_checkpoint(str(tmp_path / "missing"))
    empty = tmp_path / "empty_run"
    empty.mkdir()
    with pytest.raises(UserError, match="has no ckpt_best.pt or ckpt_last.pt"):
        resolve_checkpoint(str(empty))
