"""sample.py on a tiny run: the text it prints, the same with and without the KV cache, and the
runs and checkpoints it accepts."""

import re
import shutil

from tests.helpers import run_cli


def test_sample_loads_the_checkpoint_and_prints_text_without_writing(trained_run, tmp_path):
    before = sorted(p.name for p in trained_run.iterdir())
    args = [f"run={trained_run}", "prompt=Once upon a time", "max_new_tokens=40", "num_samples=2", "seed=1"]
    first = run_cli("sample.py", *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    samples = re.split(r"--- sample \d of 2 ---\n", first.stdout)[1:]
    assert len(samples) == 2
    assert all(s.startswith("Once upon a time") and len(s.rstrip("\n")) >= len("Once upon a time") + 40 for s in samples)
    again = run_cli("sample.py", *args, cwd=tmp_path)
    assert again.stdout == first.stdout  # same seed, same text
    assert sorted(p.name for p in trained_run.iterdir()) == before
    assert list(tmp_path.iterdir()) == []  # and nothing in the folder it ran from


def test_sampling_with_and_without_the_kv_cache_gives_the_same_text(trained_run, tmp_path):
    # <eot> + 4 prompt tokens + 27 new ones fill the tiny run's block_size of 32 exactly.
    args = [f"run={trained_run}", "prompt=Once upon a time", "max_new_tokens=27", "num_samples=3", "temperature=1"]
    cached = run_cli("sample.py", *args, cwd=tmp_path)
    recomputed = run_cli("sample.py", *args, "use_kv_cache=false", cwd=tmp_path)
    assert cached.returncode == 0 and recomputed.returncode == 0, cached.stderr + recomputed.stderr
    assert cached.stdout == recomputed.stdout and cached.stdout.count("Once upon a time") == 3


def test_sample_accepts_a_run_dir_a_checkpoint_file_and_latest(trained_run, tmp_path):
    greedy = ["max_new_tokens=10", "temperature=0", "prompt=The"]
    by_file = run_cli("sample.py", f"run={trained_run / 'ckpt_best.pt'}", *greedy, cwd=tmp_path)
    assert by_file.returncode == 0 and len(by_file.stdout) > len("The\n"), by_file.stderr
    by_dir = run_cli("sample.py", f"run={trained_run}", *greedy, cwd=tmp_path)
    assert by_dir.stdout == by_file.stdout  # a run dir means its ckpt_best.pt
    last = run_cli("sample.py", f"run={trained_run / 'ckpt_last.pt'}", *greedy, cwd=tmp_path)
    assert last.returncode == 0 and last.stdout.startswith("The"), last.stderr

    workdir = tmp_path / "project"
    shutil.copytree(trained_run, workdir / "outputs" / "2026-01-01" / "12-00-00")
    latest = run_cli("sample.py", "run=latest", *greedy, cwd=workdir)
    assert latest.returncode == 0, latest.stderr
    assert latest.stdout == by_file.stdout
