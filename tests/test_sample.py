"""sample.py, what `make sample` runs: the text it prints (the same with and without the KV cache,
the end of a text as a line, not the raw <|endoftext|> token), the runs and checkpoints it reads,
and run=latest, which skips a newer test run for a trained one."""

import logging
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import runtime.huge_pages
from data.bpe import GPT2_PATTERN
from data.tokenizer import EOT, CharTokenizer, TiktokenTokenizer, bpe_encoding
from model.generation import EOT_SHOWN, generate_text, terminal_text
from model_io.checkpoint import Checkpoint, build_model
from model_io.run_files import BEST, LAST, MIN_STEPS, checkpoint_and_note, kept_checkpoint_path, resolve_checkpoint
from runtime.huge_pages import huge_pages_possible
from tests.helpers import (
    ONE_PROCESS,
    ROOT,
    moved_to_huge_pages,
    read_events,
    run_cli,
    small_checkpoint,
    streamed_pieces,
    text_of,
)
from training.data_parallel import Replicated
from training.jobs import Samples
from training.specs import ProbeSpec
from training.tensorboard_log import RunLogger

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
    trained = save_run(tmp_path / "outputs/2026-01-01/10-00-00", steps=100, written=1_000)  # 100 steps: enough
    save_run(tmp_path / "outputs/2026-01-02/10-00-00", steps=1, written=2_000)  # make train ARGS=train.max_steps=1
    save_run(tmp_path / "multirun/2026-01-02/11-00-00/0", steps=99, written=3_000, name=LAST)
    assert MIN_STEPS == 100  # as README.md and docs/ say it
    assert resolve_checkpoint("latest") == Path("outputs/2026-01-01/10-00-00") / BEST
    assert trained.is_file()
    assert checkpoint_and_note("latest") == (Path("outputs/2026-01-01/10-00-00") / BEST, (
        "note: run=latest passed over newer runs of fewer than 100 steps: multirun/2026-01-02/11-00-00/0 "
        "(99 steps), outputs/2026-01-02/10-00-00 (1 step); give run=<run dir> to use one"))


def test_sample_says_which_run_latest_took_and_the_newer_short_runs_it_passed_over(tmp_path):
    save_run(tmp_path / "outputs/2026-01-01/10-00-00", steps=800, written=1_000)
    save_run(tmp_path / "outputs/2026-01-02/10-00-00", steps=5, written=2_000)
    result = run_cli("sample.py", "run=latest", "max_new_tokens=3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[:2] == [
        "run=latest: outputs/2026-01-01/10-00-00/ckpt_best.pt",
        f"note: run=latest passed over newer runs of fewer than {MIN_STEPS} steps: outputs/2026-01-02/10-00-00 "
        "(5 steps); give run=<run dir> to use one"]
    short = tmp_path / "outputs/2026-01-02/10-00-00"
    assert checkpoint_and_note(str(short)) == (short / BEST, None)  # a run named is taken, and nothing said
    exported = run_cli("export.py", "run=latest", "out=exported", cwd=tmp_path)  # export.py says it too, first
    assert exported.stderr.startswith(result.stderr.splitlines()[1] + "\n"), exported.stderr


def test_latest_names_three_runs_it_passed_over_and_counts_the_rest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save_run(tmp_path / "outputs/2026-01-01/10-00-00", steps=800, written=1_000)
    for hour in range(5):
        save_run(tmp_path / f"outputs/2026-01-02/1{hour}-00-00", steps=hour, written=2_000 + hour)
    path, note = checkpoint_and_note("latest")
    assert path == Path("outputs/2026-01-01/10-00-00") / BEST
    assert note.endswith(": outputs/2026-01-02/14-00-00 (4 steps), outputs/2026-01-02/13-00-00 (3 steps), "
                         "outputs/2026-01-02/12-00-00 (2 steps) and 2 more; give run=<run dir> to use one"), note


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


@pytest.mark.parametrize("compile_", [False, True], ids=["eager", "compile=true"])
def test_sample_lays_out_the_weights_for_eager_decoding_on_a_cpu_and_not_for_the_compiled_step_and_on_huge_pages_for_both(
        tmp_path, monkeypatch, compile_):
    import sample

    path = save_run(tmp_path / "run", steps=800, written=1_000)
    monkeypatch.setattr(runtime.huge_pages, "SMALLEST_MODEL", 0)  # this model is too small to gain
    laid_out, on_huge_pages = [], []

    def generate_and_look(model, *args, **kwargs):
        laid_out.append([module.weight.t().is_contiguous() for module in (model.lm_head, model.blocks[0].attn.qkv)])
        on_huge_pages.append(moved_to_huge_pages(model))
        return generate_text(model, *args, **kwargs)

    monkeypatch.setattr(sample, "generate_text", generate_and_look)
    # One new token: compile=true then builds no decode step, but keeps the weights it would compile for.
    result = run_cli("sample.py", f"run={path}", "max_new_tokens=1", f"compile={str(compile_).lower()}", "device=cpu",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert laid_out == [[not compile_] * 2]
    assert on_huge_pages == [huge_pages_possible()]  # Linux: runtime/huge_pages.py, for a model of any size here


@pytest.mark.slow
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


@pytest.mark.parametrize(("prompts", "text"), [
    (["prompt=0.10"], "0.10"),  # Hydra reads a number: 0.1
    (["prompt=true"], "true"),  # and a boolean: True
    (["prompt=1e3", "prompt=hi"], "hi"),  # the last one holds
    (["prompt=hi", "prompt=007.50"], "007.50"),
    (["prompt='0.10'"], "0.10"),  # quoted: text already, its quotes taken off
    (["prompt=Once\\ upon"], "Once upon"),  # an escaped space
])
def test_the_prompt_is_the_text_as_typed_even_where_hydra_reads_a_number_or_a_boolean(tmp_path, prompts, text):
    checkpoint, _ = small_checkpoint(tmp_path, text="Once upon hirt.0123456789")
    result = run_cli("sample.py", f"run={checkpoint}", *prompts, "max_new_tokens=0", cwd=tmp_path)  # the prompt alone
    assert (result.returncode, result.stdout) == (0, text + "\n"), result.stderr


def test_a_prompt_longer_than_the_model_reads_is_noted_and_printed_whole(tmp_path):
    # The model continued from the last block_size tokens without a word.
    checkpoint, _ = small_checkpoint(tmp_path, text="Once upon a time.")  # block_size 8
    result = run_cli("sample.py", f"run={checkpoint}", "prompt=Once upon a time", "max_new_tokens=3", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("Once upon a time")  # the whole prompt, then what follows
    assert result.stderr == ("note: the prompt is 17 tokens with its start token, and the model reads at most 8 (its "
                             "model.block_size): it continues from the prompt's last 8\n")


def test_a_sweep_prints_each_jobs_text_under_its_name_and_a_bad_job_says_its_error_there(tmp_path):
    checkpoint, _ = small_checkpoint(tmp_path, text="Once upon hirt.")
    args = [f"run={checkpoint}", "prompt=On", "max_new_tokens=12", "temperature=1"]
    seeds = (0, 2**63 - 1)  # the first and the last seed torch's generator takes
    alone = {seed: run_cli("sample.py", *args, f"seed={seed}", cwd=tmp_path).stdout for seed in seeds}
    assert alone[seeds[0]] != alone[seeds[1]]
    (tmp_path / "sweep").mkdir(), (tmp_path / "bad").mkdir()  # each sweep's record under its multirun/
    swept = run_cli("sample.py", "-m", *args, f"seed={seeds[0]},{seeds[1]}", cwd=tmp_path / "sweep")
    assert swept.returncode == 0, swept.stderr
    assert swept.stdout == "".join(f"=== job #{job} of the sweep ({' '.join(args)} seed={seed}) ===\n{alone[seed]}"
                                   for job, seed in enumerate(seeds))
    bad = run_cli("sample.py", "-m", *args, "top_k=3,100", cwd=tmp_path / "bad")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    first, second = (f"=== job #{job} of the sweep ({' '.join(args)} top_k={top_k}) ===\n" for job, top_k in ((0, 3), (1, 100)))
    assert bad.stdout.startswith(first + "On") and bad.stdout.endswith("\n" + second)  # job #1's error came after its name
    assert bad.stderr.strip() == (f"error: job #1 of the sweep ({' '.join(args)} top_k=100): top_k=100 must be between 1 and "
                                  "the vocabulary size 14 (or 0: off); job #0 ran, the rest did not")


@pytest.mark.slow
def test_sampling_with_and_without_the_kv_cache_gives_the_same_text(trained_run, tmp_path):
    # <eot> + 4 prompt tokens + 27 new ones fill the tiny run's block_size of 32 exactly.
    args = [f"run={trained_run}", "prompt=Once upon a time", "max_new_tokens=27", "num_samples=3", "temperature=1"]
    cached = run_cli("sample.py", *args, cwd=tmp_path)
    recomputed = run_cli("sample.py", *args, "use_kv_cache=false", cwd=tmp_path)
    assert cached.returncode == 0 and recomputed.returncode == 0, cached.stderr + recomputed.stderr
    assert cached.stdout == recomputed.stdout and cached.stdout.count("Once upon a time") == 3


@pytest.mark.slow
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
    assert "run=latest: outputs/2026-01-01/12-00-00/ckpt_best.pt\n" in latest.stderr  # which run it picked

    # A run before its first evaluation's save, with a checkpoint kept (train.keep_checkpoints): that
    # one, as the Attention tab reads it (attention_tab/live_model.py), and said.
    young = tmp_path / "young"
    for step in (5, 10):
        kept_checkpoint_path(young, step).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(trained_run / (BEST if step == 10 else LAST), kept_checkpoint_path(young, step))
    kept = run_cli("sample.py", f"run={young}", *greedy, cwd=tmp_path)
    assert kept.returncode == 0 and kept.stdout == by_file.stdout, kept.stderr  # the newest kept: the best's copy
    assert f"run={young}: {kept_checkpoint_path(young, 10)}\n" in kept.stderr




def log_a_sample(model, tokenizer, events: Path, caplog) -> None:
    """The training loop's Samples job at step 10 (60 tokens at temperature 1): its log line in
    caplog, its TensorBoard text in the event file under events."""
    probes = ProbeSpec(attn_log_interval=0, attn_log_at_start=True, probe_tokens=16, seed=0, recall_seed=None, sample_interval=10,
                       sample_tokens=60, sample_temperature=1.0)
    run = SimpleNamespace(spec=SimpleNamespace(probes=probes), model=model, data=SimpleNamespace(tokenizer=tokenizer),
                          parallel=Replicated(model, ONE_PROCESS), ranks=ONE_PROCESS)
    logger = RunLogger(events)
    with caplog.at_level(logging.INFO):
        Samples(run, logger)(SimpleNamespace(step=10))
    logger.close()


def test_the_training_logs_sample_shows_the_end_of_a_text_as_sample_py_does(tmp_path, caplog):
    # The loop's Samples job, with a model that writes <|endoftext|> one token in three: the
    # sample it logs and writes to TensorBoard shows each end of text as sample.py prints it.
    model, tokenizer = Checkpoint.load(save_run(tmp_path / "run", steps=800, written=1_000)).build_model()
    log_a_sample(model, tokenizer, tmp_path / "events", caplog)
    for shown in (text_of(read_events(tmp_path / "events"), "samples"), caplog.text):
        assert EOT not in shown and shown.count(EOT_SHOWN.strip()) > 5


def test_control_characters_the_model_writes_are_printed_as_escapes_and_kept_in_the_text(tmp_path, caplog):
    # A model that writes ESC and BEL as often as anything (its characters all equally likely): printed
    # raw they would move the terminal's cursor, change its colours or ring it. sample.py and the
    # training log show them as escapes; TensorBoard's samples keep them.
    tokenizer = CharTokenizer(list("a\x1b\x07\n"))
    torch.manual_seed(0)
    model = build_model(MODEL, tokenizer.vocab_size)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    (tmp_path / "run").mkdir()
    Checkpoint(model.state_dict(), {"model": MODEL}, tokenizer.state(), step=MIN_STEPS).save(tmp_path / "run" / BEST)
    # On the CPU, where generate_text below samples: a GPU's random numbers draw other characters.
    result = run_cli("sample.py", "run=run", "prompt=a", "max_new_tokens=60", "temperature=1.0", "device=cpu", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = generate_text(model, tokenizer, "a", 60, temperature=1.0, seed=1, eot_text=EOT_SHOWN)[0]  # sample.py's seed, 1
    assert {"\x1b", "\x07"} <= set(text)
    assert result.stdout == terminal_text(text) + "\n"
    assert "\\x1b" in result.stdout and "\\x07" in result.stdout and not {"\x1b", "\x07"} & set(result.stdout)
    log_a_sample(model, tokenizer, tmp_path / "events", caplog)
    assert "\\x1b" in caplog.text and "\\x07" in caplog.text and not {"\x1b", "\x07"} & set(caplog.text)
    assert {"\x1b", "\x07"} <= set(text_of(read_events(tmp_path / "events"), "samples"))
    assert terminal_text("a\x1b[31mb\x07\n\tc\r\nd\re\x85 é 日 \u202eba\u2066") == \
        "a\\x1b[31mb\\x07\n\tc\r\nd\\re\\x85 é 日 \\u202eba\\u2066"


def test_a_streamed_text_comes_in_pieces_that_add_up_to_it_and_never_show_half_a_character():
    # Bytes alone, no merges: every character past ASCII is two to four tokens, each of which
    # decodes to U+FFFD until the last one comes. A carriage return waits for what follows it.
    tokenizer = TiktokenTokenizer("bpe", bpe_encoding({bytes([b]): b for b in range(256)}, GPT2_PATTERN))
    text = "日本 é\r\nx\ry 🐍"
    ids = [tokenizer.eot_id, *tokenizer.encode("日本"), tokenizer.eot_id, *tokenizer.encode(text)]
    pieces = streamed_pieces(tokenizer, ids, EOT_SHOWN, "日本" + EOT_SHOWN + text)
    assert "".join(pieces) == "日本" + EOT_SHOWN + text
    assert not any("\ufffd" in piece or piece.endswith("\r") for piece in pieces)
    assert [terminal_text(piece) for piece in pieces if "\r" in piece] == ["\r\n", "\\ry"]  # as the whole text shows them
    assert len(pieces) > 5  # pieces as characters complete, not the text at the end


@pytest.mark.slow  # processes of their own (TextStream's pieces: the test above, in the fast tier)
def test_sample_py_prints_one_sample_as_it_is_written_and_ends_its_line_before_an_error(tmp_path):
    tokenizer = CharTokenizer(list("ab"))
    torch.manual_seed(0)
    model = build_model(MODEL, tokenizer.vocab_size)
    (tmp_path / "run").mkdir()
    Checkpoint(model.state_dict(), {"model": MODEL}, tokenizer.state(), step=MIN_STEPS).save(tmp_path / "run" / BEST)
    # A million characters take the tiny model many minutes to write: printed at the end, none
    # would come within the 60 s this waits; printed as they come, the first come in seconds.
    process = subprocess.Popen([sys.executable, str(ROOT / "sample.py"), "run=run", "prompt=ab", "device=cpu",
                                "max_new_tokens=1000000"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first, deadline = b"", time.monotonic() + 60
        while len(first) < 12 and select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
            first += os.read(process.stdout.fileno(), 12 - len(first)) or b"(ended)"
        assert len(first) >= 12 and process.poll() is None, first  # the prompt and 10 new characters, while it writes
        assert first.startswith(b"ab") and set(first.decode()) <= set("ab\n-endoftx "), first
        process.send_signal(signal.SIGINT)  # Ctrl-C: the sample's line ends, then one line says so
        rest, stderr = process.communicate(timeout=60)
        assert (process.returncode, stderr) == (130, b"stopped: interrupted (nothing was written)\n"), stderr
        assert rest.endswith(b"\n")
    finally:
        process.kill()
        process.wait()
    # Weights gone to NaN: the prompt is printed, then the error, on a line of its own.
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    Checkpoint(model.state_dict(), {"model": MODEL}, tokenizer.state(), step=MIN_STEPS).save(tmp_path / "run" / BEST)
    result = run_cli("sample.py", "run=run", "prompt=ab", "device=cpu", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "ab\n"), result.stderr
    assert result.stderr == ("error: run/ckpt_best.pt: the model's next-token logits are NaN or inf: its weights have "
                             "diverged; sample from a checkpoint saved before that\n")


@pytest.mark.slow
def test_a_reader_that_leaves_the_pipe_ends_sample_py_quietly(trained_run, tmp_path):
    # `sample.py | head -n 1`: head leaves after a line. Here the reader leaves before anything is
    # written, so every write meets the closed pipe, whenever Python flushes its buffer.
    process = subprocess.Popen([sys.executable, str(ROOT / "sample.py"), f"run={trained_run}", "device=cpu", "num_samples=3"],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()
    stderr = process.stderr.read()
    assert process.wait(timeout=120) == 1, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr and "Exception ignored" not in stderr, stderr


def test_top_k_takes_0_for_off_and_the_whole_vocabulary_which_samples_alike(tmp_path):
    checkpoint, _ = small_checkpoint(tmp_path, text="Once upon hirt.")
    vocab_size = Checkpoint.load(checkpoint).build_tokenizer().vocab_size
    texts = [run_cli("sample.py", f"run={checkpoint}", "max_new_tokens=12", "temperature=1", f"top_k={k}", cwd=tmp_path)
             for k in (0, vocab_size)]
    assert [text.returncode for text in texts] == [0, 0], texts[1].stderr
    assert texts[0].stdout == texts[1].stdout  # every token kept, either way


def test_make_sample_takes_the_run_as_make_docs_does():
    # -n: the command make runs (it sampled the newest run, RUN= unread). ARGS' run= comes after it, and wins.
    def command(*variables: str) -> str:
        return subprocess.run(["make", "-s", "-n", "-o", ".venv/.installed", "sample", *variables], cwd=ROOT,
                              capture_output=True, text=True, timeout=60, check=True).stdout.strip()

    assert command().endswith("sample.py run=latest")
    assert command("RUN=outputs/a").endswith("sample.py run=outputs/a")
    # A run that is not there is named as typed (sample.py's own line names its run=).
    result = subprocess.run(["make", "-s", "-o", ".venv/.installed", "sample", "RUN=outputs/nowhere"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and not result.stdout
    assert result.stderr.splitlines()[0] == ("error: RUN=outputs/nowhere does not exist; give make sample RUN=<run dir>, "
                                             "or leave RUN out for the newest run")
