"""data/staging.py: cache files written whole under a name of the writer's own, and what killed writers left
behind removed by the next run that writes the same path, never a live writer's nor another machine's."""

import os
import socket
import subprocess
import sys

from data.bpe import ranks_to_text
from data.staging import remove_abandoned_staging, staging_path, write_staged
from data.tokenizer import learned_ranks

HOST = socket.gethostname()


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
    assert staging_path(path).name == f"ranks.tiktoken.tmp-{HOST}-{os.getpid()}"


def test_what_a_killed_writer_left_is_removed_and_what_a_live_one_or_another_machine_writes_is_kept(tmp_path):
    path = tmp_path / "ranks.tiktoken"
    dead = pid_of_an_ended_process()
    left_file = tmp_path / f"ranks.tiktoken.tmp-{HOST}-{dead}"
    left_folder = tmp_path / f"ranks.tiktoken.tmp-{HOST}-{dead + 1_000_000_000}"  # no such process either
    left_file.write_text("half of a file")
    (left_folder / "inside").mkdir(parents=True)
    live = staging_path(path)  # this process's, as if it were writing now
    live.write_text("being written")
    kept = [live,
            tmp_path / f"ranks.tiktoken.tmp-another-machine-{dead}",  # a writer on a machine sharing the folder (NFS)
            tmp_path / "ranks.tiktoken.tmp-notapid",
            tmp_path / f"other.tiktoken.tmp-{HOST}-{dead}"]  # another file's
    for other in kept[1:]:
        other.write_text("not ours to remove")
    remove_abandoned_staging(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in kept)


def test_a_name_with_glob_characters_matches_only_its_own_staging(tmp_path):
    path = tmp_path / "input[1].txt"  # a download's name, from its URL
    dead = pid_of_an_ended_process()
    (tmp_path / f"input[1].txt.tmp-{HOST}-{dead}").write_text("half")
    (tmp_path / f"input1.txt.tmp-{HOST}-{dead}").write_text("another file's, which [1] as a pattern would match")
    remove_abandoned_staging(path)
    assert [p.name for p in tmp_path.iterdir()] == [f"input1.txt.tmp-{HOST}-{dead}"]


def test_learning_bpe_ranks_removes_a_killed_runs_half_written_ranks(tmp_path):
    path = tmp_path / "bpe" / "ranks.tiktoken"
    path.parent.mkdir()
    left = path.with_name(f"ranks.tiktoken.tmp-{HOST}-{pid_of_an_ended_process()}")
    left.write_text("half of a f")
    text = "the cat sat on the mat " * 20
    ranks = learned_ranks(lambda: [text], 300, path)
    assert [p.name for p in path.parent.iterdir()] == ["ranks.tiktoken"]
    assert path.read_text() == ranks_to_text(ranks)
