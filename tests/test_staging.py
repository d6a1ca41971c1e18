"""data/staging.py: cache files written whole under a name of the writer's own, and what killed writers left
behind removed by the next run that writes the same path, never a live writer's."""

import os
import subprocess
import sys

from data.bpe import ranks_to_text
from data.staging import remove_abandoned_staging, staging_path, write_staged
from data.tokenizer import learned_ranks


def pid_of_an_ended_process() -> int:
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    return ended.pid


def test_a_staged_write_leaves_the_whole_file_and_no_staging_name(tmp_path):
    path = tmp_path / "cache" / "ranks.tiktoken"  # its folder made on the way
    write_staged(path, "abc\n")
    write_staged(path, b"replaced")
    assert path.read_bytes() == b"replaced"
    assert [p.name for p in path.parent.iterdir()] == ["ranks.tiktoken"]


def test_what_a_killed_writer_left_is_removed_and_what_a_live_one_writes_is_kept(tmp_path):
    path = tmp_path / "ranks.tiktoken"
    dead = pid_of_an_ended_process()
    left_file = tmp_path / f"ranks.tiktoken.tmp-{dead}"
    left_folder = tmp_path / f"ranks.tiktoken.tmp-{dead + 1_000_000_000}"  # no such process either
    left_file.write_text("half of a file")
    (left_folder / "inside").mkdir(parents=True)
    live = staging_path(path)  # this process's, as if it were writing now
    live.write_text("being written")
    others = [tmp_path / "ranks.tiktoken.tmp-notapid", tmp_path / f"other.tiktoken.tmp-{dead}"]
    for other in others:
        other.write_text("not ours to remove")
    remove_abandoned_staging(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, *(p.name for p in others)])
    assert live.name == f"ranks.tiktoken.tmp-{os.getpid()}"


def test_learning_bpe_ranks_removes_a_killed_runs_half_written_ranks(tmp_path):
    path = tmp_path / "bpe" / "ranks.tiktoken"
    path.parent.mkdir()
    left = path.with_name(f"ranks.tiktoken.tmp-{pid_of_an_ended_process()}")
    left.write_text("half of a f")
    text = "the cat sat on the mat " * 20
    ranks = learned_ranks(lambda: [text], 300, path)
    assert [p.name for p in path.parent.iterdir()] == ["ranks.tiktoken"]
    assert path.read_text() == ranks_to_text(ranks)
