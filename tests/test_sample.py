"""What `make sample` reads and prints: run=latest skips a newer test run for a trained one, and
the end of a text shows as a line, not as the raw <|endoftext|> token."""

import os
from pathlib import Path

import torch

from data.tokenizer import EOT, CharTokenizer
from model_io.checkpoint import BEST, LAST, Checkpoint, build_model, resolve_checkpoint
from model_io.latest_run import MIN_STEPS
from tests.helpers import run_cli

TOKENIZER = CharTokenizer(list("ab"))  # <|endoftext|> is id 2
MODEL = {"n_layer": 1, "n_head": 1, "n_embd": 8, "block_size": 16, "pos": "learned", "tie_head": False}


def save_run(run_dir: Path, steps: int, written: int, init_from: str | None = None, name: str = BEST) -> Path:
    """A run dir whose checkpoint holds `steps` steps, written at `written` (seconds since the epoch).
    Its model gives every next token the same logit: <|endoftext|> comes one token in three."""
    torch.manual_seed(0)
    model = build_model(MODEL, TOKENIZER.vocab_size)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    run_dir.mkdir(parents=True)
    path = run_dir / name
    Checkpoint(model.state_dict(), {"model": MODEL, "init_from": init_from}, TOKENIZER.state(), step=steps).save(path)
    os.utime(path, (written, written))
    return path


def test_latest_is_the_newest_run_that_trained_100_steps_not_a_newer_short_test_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trained = save_run(tmp_path / "outputs/2026-01-01/10-00-00", steps=800, written=1_000)
    save_run(tmp_path / "outputs/2026-01-02/10-00-00", steps=1, written=2_000)  # make train ARGS=train.max_steps=1
    save_run(tmp_path / "multirun/2026-01-02/11-00-00/0", steps=MIN_STEPS - 1, written=3_000, name=LAST)
    assert resolve_checkpoint("latest") == Path("outputs/2026-01-01/10-00-00") / BEST
    assert trained.is_file()


def test_latest_takes_a_newer_run_started_from_pretrained_weights_even_at_step_0(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save_run(tmp_path / "outputs/2026-01-01/10-00-00", steps=800, written=1_000)
    save_run(tmp_path / "outputs/2026-01-02/10-00-00", steps=0, written=2_000, init_from="gpt2")  # GPT-2 as it came
    assert resolve_checkpoint("latest") == Path("outputs/2026-01-02/10-00-00") / BEST


def test_latest_among_short_runs_only_is_the_newest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save_run(tmp_path / "outputs/2026-01-01/10-00-00", steps=20, written=2_000)
    save_run(tmp_path / "outputs/2026-01-02/10-00-00", steps=1, written=1_000)  # named later, written earlier
    assert resolve_checkpoint("latest") == Path("outputs/2026-01-01/10-00-00") / BEST


def test_sample_prints_the_end_of_a_text_as_a_line_of_its_own_not_the_raw_token(tmp_path):
    path = save_run(tmp_path / "run", steps=800, written=1_000)
    result = run_cli("sample.py", f"run={path}", "max_new_tokens=60", "temperature=1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert EOT not in result.stdout
    texts = result.stdout.removesuffix("\n").split("\n\n--- end of text ---\n\n")  # print's newline off
    assert len(texts) > 5  # about 60 / 3 texts: each end of text shown
    assert set("".join(texts)) <= {"a", "b"}
