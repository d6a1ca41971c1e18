"""Each section of python -m bench runs and writes every figure it prints (the figures themselves
are the benchmark's business, not the tests'). The command line runs in this process; a section
that times processes (train.py, sample.py, tokenising) still starts them, as that is what it measures."""

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import bench.attention
import bench.common
import bench.gpt2_finetune
import bench.gpt2_sampling
import bench.gpu
import bench.kv_cache
import bench.loading
import bench.sampling
import bench.text
import runtime.huge_pages
from bench.cli import DEFAULT_SECTIONS, SECTIONS, main
from bench.common import tiny_shakespeare
from bench.training import training_flops_per_token
from data.download import sha256_of
from model import GPT, GPTConfig
from runtime.huge_pages import huge_pages_possible
from tests.helpers import ROOT, moved_to_huge_pages
from user_error import UserError

SHAKESPEARE = "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"


def run_bench(*args: str, out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> tuple[dict, str]:
    """`python -m bench <args> --out <out>` in this process, in out's folder (where the runs it
    starts keep their .cache): the record it wrote, and what it printed. On stderr, a line as each
    section starts, in the order of the sections' table, whatever the order --only gives."""
    out.parent.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(out.parent)
    monkeypatch.setattr(sys, "argv", ["python -m bench", *args, "--out", str(out)])
    main()
    printed = capsys.readouterr()
    only = sorted(args[args.index("--only") + 1].split(","), key=SECTIONS.index)
    started = [line for line in printed.err.splitlines() if line.startswith("bench: ")]
    assert started == [f"bench: {section} ({n} of {len(only)})" for n, section in enumerate(only, 1)], printed.err
    return json.loads(out.read_text()), printed.out


def bench_refusal(*args: str, out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> str:
    """The line `python -m bench <args>` refuses them with, in this process: exit status 2 and one
    line on stderr, as train.py refuses a config."""
    with pytest.raises(SystemExit) as refused:
        run_bench(*args, out=out, monkeypatch=monkeypatch, capsys=capsys)
    printed = capsys.readouterr()
    assert refused.value.code == 2 and printed.err.count("\n") == 1 and printed.err.startswith("error: "), printed.err
    return printed.err.removesuffix("\n")


@pytest.mark.slow
def test_an_unknown_section_is_one_clear_line():
    # A real `python -m bench`, as make bench runs it: the package's entry point, and the line on stderr.
    result = subprocess.run([sys.executable, "-m", "bench", "--only", "speed"], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=300)
    assert result.returncode == 2
    assert result.stderr == (
        "error: --only speed is not a section (choose from peak, training, quality, recipe, compile, sampling, kv_cache, attention, startup, data, nanogpt, tab, text, gpt2_text, loading, gpt2_sampling, gpt2_finetune, gpu, gpu_sampling, gpu_finetune, nanogpt_gpu)\n"
    )


@pytest.mark.parametrize("args, line", [
    (["--onyl", "peak"], "error: unrecognized arguments: --onyl peak; `python -m bench --help` lists the options"),
    (["--only", "peak", "--repeats", "x"], "error: argument --repeats: invalid int value: 'x'; `python -m bench --help` "
                                           "lists the options"),
])  # argparse's usage text came first, seven lines of it
def test_a_misspelt_flag_or_a_value_of_the_wrong_type_is_one_clear_line(args, line, tmp_path, monkeypatch, capsys):
    assert bench_refusal(*args, out=tmp_path / "bench.json", monkeypatch=monkeypatch, capsys=capsys) == line


def test_speed_md_lists_every_section_once_and_says_which_run_by_default():
    # docs/speed.md's table is where a user learns what `--only` can name and what `make bench` runs.
    rows = re.findall(r"^\| `(\w+)` \| .* \| (yes|no) \|$", (ROOT / "docs" / "speed.md").read_text(), re.MULTILINE)
    assert sorted(name for name, _ in rows) == sorted(SECTIONS)
    assert [name for name, default in rows if default == "yes"] == list(DEFAULT_SECTIONS)


def test_threads_below_one_is_one_clear_line(tmp_path, monkeypatch, capsys):
    line = bench_refusal("--only", "kv_cache", "--threads", "0", out=tmp_path / "bench.json", monkeypatch=monkeypatch,
                         capsys=capsys)
    assert line == "error: --threads 0 must be at least 1"


@pytest.mark.parametrize("only", ["", ",", " , "])
def test_an_only_that_names_no_section_is_one_clear_line(only, tmp_path, monkeypatch, capsys):
    line = bench_refusal("--only", only, out=tmp_path / "bench.json", monkeypatch=monkeypatch, capsys=capsys)
    assert line.startswith(f"error: --only {only!r} names no section; choose from peak, training, quality,")


def test_an_out_that_cannot_be_written_is_one_clear_line_before_any_section_runs(tmp_path, monkeypatch, capsys):
    (tmp_path / "a_folder").mkdir()
    (tmp_path / "a_file").write_text("not a folder")
    line = bench_refusal("--only", "peak", out=tmp_path / "a_folder", monkeypatch=monkeypatch, capsys=capsys)
    assert line == f"error: --out {tmp_path / 'a_folder'} is a folder; give the path of a .json file to write"
    # An earlier record is never written over (it would be, after minutes of sections).
    earlier = tmp_path / "earlier.json"
    earlier.write_text('{"results": {}}')
    line = bench_refusal("--only", "peak", out=earlier, monkeypatch=monkeypatch, capsys=capsys)
    assert line == f"error: --out {earlier} already exists (an earlier record?); give a new path, or move it away first"
    assert earlier.read_text() == '{"results": {}}'
    monkeypatch.setattr(sys, "argv", ["python -m bench", "--only", "peak", "--out", str(tmp_path / "a_file" / "bench.json")])
    with pytest.raises(SystemExit) as refused:
        main()
    printed = capsys.readouterr()
    assert refused.value.code == 2 and printed.out == ""  # refused before the section ran
    assert printed.err == (f"error: --out {tmp_path / 'a_file' / 'bench.json'}: {tmp_path / 'a_file'} cannot be made a folder: "
                           "a file is in the way; give another path\n")
    # A folder os.access calls writable for root, where the kernel makes no file.
    line = bench_refusal("--only", "peak", out=Path("/proc/bench.json"), monkeypatch=monkeypatch, capsys=capsys)
    assert line.startswith("error: --out /proc/bench.json cannot be written (") and line.endswith(
        "); give a path this user may write in")


@pytest.mark.parametrize("section", ["training", "compile"])
def test_steps_within_the_first_logged_window_are_one_clear_line_before_any_section_runs(section, tmp_path, monkeypatch,
                                                                                        capsys):
    line = bench_refusal("--only", f"peak,{section}", "--steps", "50", out=tmp_path / "bench.json",  # peak would run first
                         monkeypatch=monkeypatch, capsys=capsys)
    assert line == ("error: --steps 50 must be more than 50: the training sections leave the first 50 "
                                  "steps' tokens/s out (start-up and compiling), and need a window after them")
    assert not (tmp_path / "bench.json").exists()


@pytest.mark.parametrize("steps", ["600,abc", "0", "-5", "1.5"])
def test_recipe_steps_that_are_not_counts_are_one_clear_line_before_any_section_runs(steps, tmp_path, monkeypatch, capsys):
    line = bench_refusal("--only", "peak,nanogpt_gpu", "--gpu-recipe-steps", steps, out=tmp_path / "bench.json",
                         monkeypatch=monkeypatch, capsys=capsys)  # peak would run first: the line comes before it
    assert line == (f"error: --gpu-recipe-steps {steps} must be whole numbers of steps above 0, "
                                  "comma-separated, e.g. 600,1000")
    assert not (tmp_path / "bench.json").exists()


def a_project_whose_shakespeare_is_at(url: str, text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """bench.common looking at a project folder of its own, whose data=shakespeare downloads text
    from url, with no copy beside it: that folder."""
    root = tmp_path / "project"
    root.mkdir()
    published = replace(bench.common.published_shakespeare(), url=url, sha256=sha256_of(text.encode()))
    monkeypatch.setattr(bench.common, "published_shakespeare", lambda: published)
    monkeypatch.setattr(bench.common, "ROOT", root)
    monkeypatch.setattr(bench.common, "SHARED_SHAKESPEARE", tmp_path / "shared/corpora/tinyshakespeare.txt")
    return root


def test_without_corpus_the_training_sections_download_tiny_shakespeare_once_into_the_cache(tmp_path, monkeypatch,
                                                                                            file_server, capsys):
    served, base = file_server  # a real HTTP server on 127.0.0.1
    text = SHAKESPEARE * 3
    (served / "input.txt").write_text(text.upper())  # another file at the URL first: refused, nothing kept
    root = a_project_whose_shakespeare_is_at(f"{base}/input.txt", text, tmp_path, monkeypatch)
    with pytest.raises(UserError) as refused:
        tiny_shakespeare(None)
    assert str(refused.value).endswith('nothing was kept. With a copy of it, give --corpus <file> '
                                       '(make bench ARGS="--corpus <file>")')
    assert not (root / ".cache" / "corpora").exists() or not any((root / ".cache" / "corpora").iterdir())
    (served / "input.txt").write_text(text)
    fetched = tiny_shakespeare(None)
    assert fetched.parent == root / ".cache" / "corpora" and fetched.read_text() == text  # where data=shakespeare keeps it
    (served / "input.txt").unlink()
    assert tiny_shakespeare(None) == fetched  # read from the cache: the server has nothing now
    shared = tmp_path / "shared/corpora/tinyshakespeare.txt"  # a copy beside the project comes first
    shared.parent.mkdir(parents=True)
    shared.write_text(text)
    assert tiny_shakespeare(None) == shared
    given = tmp_path / "mine.txt"  # and --corpus before both
    given.write_text(text)
    capsys.readouterr()
    assert tiny_shakespeare(given) == given.resolve() and capsys.readouterr().out == ""
    # Another text is taken too, and said to be another than the one the published figures are on.
    other = tmp_path / "other.txt"
    other.write_text(text.upper())
    assert tiny_shakespeare(other) == other.resolve()
    assert capsys.readouterr().out == (f"note: --corpus {other} is not tiny shakespeare as published (its sha256 "
                                       "differs): the figures of the sections that train on it are not comparable "
                                       "with nanoGPT's or with those in docs/speed.md\n")


def test_without_corpus_or_network_the_benchmark_says_how_to_give_it_before_any_section_runs(
        tmp_path, monkeypatch, capsys, closed_port_url):
    a_project_whose_shakespeare_is_at(f"{closed_port_url}/input.txt", SHAKESPEARE, tmp_path, monkeypatch)
    line = bench_refusal("--only", "peak,training", out=tmp_path / "bench.json", monkeypatch=monkeypatch,
                         capsys=capsys)  # peak would run first: the line comes before it
    assert line.startswith("error: tiny shakespeare, which the training sections train on: "
                           f"could not download {closed_port_url}/input.txt (")
    assert line.endswith('; with a copy of it, give --corpus <file> (make bench ARGS="--corpus <file>")')
    assert not (tmp_path / "bench.json").exists()
    line = bench_refusal("--only", "quality", "--corpus", str(tmp_path / "nope.txt"), out=tmp_path / "bench.json",
                         monkeypatch=monkeypatch, capsys=capsys)
    assert line == f"error: --corpus {tmp_path / 'nope.txt'} does not exist; give tiny shakespeare's input.txt"
    line = bench_refusal("--only", "quality", "--corpus", str(tmp_path), out=tmp_path / "bench.json",
                         monkeypatch=monkeypatch, capsys=capsys)
    assert line == f"error: --corpus {tmp_path} is a folder, not a file; give tiny shakespeare's input.txt"


@pytest.mark.slow
def test_the_training_section_measures_train_py_on_nanogpts_cpu_shape_against_the_peak(tmp_path, monkeypatch, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(SHAKESPEARE * 400)
    out = tmp_path / "results" / "bench.json"
    record, printed = run_bench("--only", "training,peak", "--repeats", "1", "--steps", "60", "--corpus", str(corpus),
                                out=out, monkeypatch=monkeypatch, capsys=capsys)
    assert record["repeats"] == 1 and record["machine"]["cores"] >= 1
    figures = record["results"]
    assert figures["peak"]["matmul_gflops"] > 0
    training = figures["training"]
    assert training["tokens_per_sec"] > 0
    assert training["mfu"] == pytest.approx(training["model_gflops"] / figures["peak"]["matmul_gflops"])
    # A loose range: the peak and the run are measured at different moments, and on a shared
    # machine other jobs can halve the one and not the other (1.69 was seen); a FLOP count off by
    # an order of magnitude still falls outside.
    assert 0.01 < training["mfu"] < 4
    assert 780_000 < training["params"] < 820_000  # nanoGPT's CPU shape: about 0.8 M parameters
    assert "fp32 matmul peak" in printed and "training, nanoGPT CPU shape" in printed and f"written: {out}" in printed
    runs = [p for p in out.parent.iterdir() if p.name.startswith("runs-")]  # the run dirs go beside the record
    assert len(runs) == 1 and (runs[0] / "throughput-0" / "ckpt_last.pt").is_file()


@pytest.mark.slow
def test_the_quality_section_reports_the_presets_val_loss_against_nanogpts(tmp_path, monkeypatch, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(SHAKESPEARE * 400)
    record, printed = run_bench("--only", "quality", "--repeats", "1", "--preset-steps", "20", "--corpus", str(corpus),
                                out=tmp_path / "bench.json", monkeypatch=monkeypatch, capsys=capsys)
    quality = record["results"]["quality"]
    assert quality["seconds"] > 0 and 0 < quality["val_loss"] < 5
    assert quality["reached_target"] == (quality["val_loss"] <= 1.886)
    assert "time to quality (preset)" in printed


def test_the_sampled_models_are_nanogpts_shakespeare_char_model_and_the_default():
    models = bench.sampling.sampling_models()
    assert set(models) == {"L6_H6_C384", "default"}
    assert 900_000 < models["default"].num_parameters() < 1_000_000  # the default model, with the default run's vocabulary
    assert 10_000_000 < models["L6_H6_C384"].num_parameters() < 11_000_000  # nanoGPT's shakespeare-char model
    assert all(model.config.block_size == 256 for model in models.values())


@pytest.mark.compile
def test_the_sampling_section_times_each_model_cached_recomputed_and_compiled(tmp_path, monkeypatch, capsys):
    # A tiny model in place of the two above: compiling its decode step is the same work, in a fraction of the time.
    tiny = GPT(GPTConfig(vocab_size=16, block_size=16, n_layer=1, n_head=2, n_embd=16))
    monkeypatch.setattr(bench.sampling, "sampling_models", lambda: {"tiny": tiny})
    record, printed = run_bench("--only", "sampling", "--repeats", "1", "--new-tokens", "4",
                                out=tmp_path / "bench.json", monkeypatch=monkeypatch, capsys=capsys)
    sampling = record["results"]["sampling"]
    assert set(sampling) == {"tiny"} and sampling["tiny"]["params"] == tiny.num_parameters()
    assert all(s["kv_cache_tokens_per_sec"] > 0 and s["recompute_tokens_per_sec"] > 0 for s in sampling.values())
    assert all(s["compiled_tokens_per_sec"] > 0 and s["compile_seconds"] > 0 for s in sampling.values())
    assert "tokens/s with KV cache" in printed and "compiled decode step" in printed


def test_the_kv_cache_section_measures_each_caches_bytes_as_2_layers_kv_heads_slots_dims_4_and_times_decoding(
        tmp_path, monkeypatch, capsys):
    # Contexts of 48 and 96 tokens, a window of 8 in block_size 32 (so the ring goes round and the
    # 96-token prompt takes three pieces), 4 new tokens: the section's logic, in a second.
    monkeypatch.setattr(bench.kv_cache, "CONTEXTS", (48, 96))
    monkeypatch.setattr(bench.kv_cache, "NEW_TOKENS", 4)
    monkeypatch.setattr(bench.kv_cache, "WINDOW_BLOCK_SIZE", 32)
    variants = {name: variant for name, variant in bench.kv_cache.VARIANTS.items() if "window" not in variant}
    monkeypatch.setattr(bench.kv_cache, "VARIANTS", {**variants, "window 8": {"window": 8}})
    record, printed = run_bench("--only", "kv_cache", "--repeats", "1", out=tmp_path / "bench.json", monkeypatch=monkeypatch,
                                capsys=capsys)
    kv = record["results"]["kv_cache"]
    assert kv["threads"] == 1  # steadier on a shared machine, without --threads
    assert kv["contexts"] == [48, 96] and (kv["n_layer"], kv["n_head"], kv["head_dim"]) == (4, 8, 16)
    variants = kv["variants"]
    assert [variants[name]["kv_heads"] for name in variants] == [8, 2, 1, 8]
    # 2 (keys and values) x 4 layers x K heads x S slots x 16 dims x 4 bytes, S the context (block_size) or the ring's 8:
    assert variants["MHA"]["cache_bytes"] == [2 * 4 * 8 * 48 * 16 * 4, 2 * 4 * 8 * 96 * 16 * 4]
    assert variants["GQA 4:1"]["cache_bytes"] == [2 * 4 * 2 * 48 * 16 * 4, 2 * 4 * 2 * 96 * 16 * 4]
    assert variants["MQA"]["cache_bytes"] == [2 * 4 * 1 * 48 * 16 * 4, 2 * 4 * 1 * 96 * 16 * 4]
    assert variants["window 8"]["cache_bytes"] == [2 * 4 * 8 * 8 * 16 * 4] * 2 and variants["window 8"]["block_size"] == [32, 32]
    assert all(v["cache_bytes"] == v["expected_cache_bytes"] for v in variants.values())
    assert all(rate > 0 for v in variants.values() for rate in v["decode_tokens_per_sec"])
    assert "KV cache and decoding at 48 / 96 tokens of context" in printed
    assert re.search(r"  GQA 4:1 \(2 key/value heads\) +cache 0\.046875 / 0\.09375 MiB; [\d,]+ / [\d,]+ tokens/s", printed)
    assert re.search(r"  window 8 \(8 key/value heads, a ring of 8 slots, block_size 32\) +cache 0\.03125 / 0\.03125 MiB;", printed)


def test_the_attention_section_times_three_paths_at_its_two_shapes(tmp_path, monkeypatch, capsys):
    timings = bench.attention.attention_timings
    monkeypatch.setattr(bench.attention, "attention_timings", lambda *args: timings(*args, iterations=1))  # not 20
    record, printed = run_bench("--only", "attention", "--repeats", "1",
                                out=tmp_path / "bench.json", monkeypatch=monkeypatch, capsys=capsys)
    attention = record["results"]["attention"]
    assert set(attention) == {"B8_T256_C384_H6", "B12_T64_C128_H4"}
    for a in attention.values():
        assert a["bare_sdpa_ms"] > 0 and a["sdpa_ms"] > 0 and a["manual_ms"] > 0
        assert a["manual_vs_bare"] == pytest.approx(a["manual_ms"] / a["bare_sdpa_ms"])
    assert "attention fwd+bwd B8_T256_C384_H6" in printed


@pytest.mark.slow
def test_the_startup_section_times_processes_that_import_torch_first(tmp_path, monkeypatch, capsys):
    record, printed = run_bench("--only", "startup", "--repeats", "1",
                                out=tmp_path / "bench.json", monkeypatch=monkeypatch, capsys=capsys)
    startup = record["results"]["startup"]
    # train.py imports torch, then tokenises and builds the default run: seconds more than the import alone
    # (sample.py is only a little slower than the import, so under load the two can swap: no order claimed)
    assert 0 < startup["import_torch_seconds"] < startup["train_first_step_seconds"] and startup["sample_seconds"] > 0
    assert "start-up, seconds from the process's start" in printed


@pytest.mark.slow
def test_the_data_section_tokenises_a_corpus_streamed_and_at_once_into_as_many_ids(tmp_path, monkeypatch, capsys):
    record, printed = run_bench("--only", "data", "--repeats", "1", "--data-mb", "1",
                                out=tmp_path / "bench.json", monkeypatch=monkeypatch, capsys=capsys)
    data = record["results"]["data"]
    assert 1 <= data["corpus_mb"] < 1.5
    for kind in ("char", "bpe"):
        streamed, at_once = data[kind]["streamed"], data[kind]["in_memory"]
        assert streamed["tokens"] == at_once["tokens"] + 1 > 1  # the same ids, and the <|endoftext|> before the file
        assert streamed["seconds"] >= streamed["encode_s"] > 0 and streamed["peak_mib"] > 0 and at_once["peak_mib"] > 0
    assert "tokenising 1 MB, bpe, streamed" in printed
    assert data["trainers"]["mb"] == data["corpus_mb"] and data["trainers"]["lesson_s"] > data["trainers"]["rustbpe_s"] > 0


def test_the_nanogpt_section_without_a_nanogpt_checkout_is_one_clear_line(tmp_path, monkeypatch, capsys):
    # The section itself needs nanoGPT's code, which this project does not ship (see the README).
    corpus = tmp_path / "corpus.txt"  # given, so that the corpus is found here on any machine, offline too
    corpus.write_text(SHAKESPEARE)
    # Said before any section runs (bench_refusal: one line on stderr, no section's line before it), peak's too.
    line = bench_refusal("--only", "peak,nanogpt", "--corpus", str(corpus), out=tmp_path / "bench.json",
                         monkeypatch=monkeypatch, capsys=capsys)
    assert line == "error: --only nanogpt needs --nanogpt <a checkout of karpathy/nanoGPT>; clone it and give its folder"
    (tmp_path / "train.py").write_text("")
    line = bench_refusal("--only", "nanogpt", "--nanogpt", str(tmp_path), "--corpus", str(corpus),
                         out=tmp_path / "bench.json", monkeypatch=monkeypatch, capsys=capsys)
    assert line.startswith(f"error: --nanogpt {tmp_path} is not a nanoGPT checkout (it needs train.py, model.py")


@pytest.mark.slow
def test_the_text_section_times_the_tabs_answer_to_128_tokens_and_to_repeated_tokens_for_the_default_model(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench.text, "TOOL_ANSWERS_PER_RUN", 1)  # the tools take 30 to 100 ms an answer
    record, printed = run_bench("--only", "text", "--repeats", "1", out=tmp_path / "bench.json", monkeypatch=monkeypatch, capsys=capsys)
    text = record["results"]["text"]
    assert text["tokens"] == 128  # the default block_size: <|endoftext|> and 127 tokens of a held-out story
    assert 900_000 < text["params"] < 1_000_000  # the default model, with the default run's vocabulary
    assert text["answer_ms"] > 0 and text["knocked_out_answer_ms"] > 0
    assert "Attention tab, your text (128 tokens)" in printed and "ms per answer" in printed
    assert text["repeated_tokens"] == 127  # <|endoftext|> and 63 random tokens twice: the longest the default model reads
    assert text["repeated_answer_ms"] > 0 and text["repeated_knocked_out_answer_ms"] > 0
    assert "repeated random tokens (127 tokens)" in printed
    assert text["lens_ms"] > 0 and text["attribution_ms"] > 0 and text["patch_ms"] > 0 and text["patch_tokens"] > 10
    assert "tools: lens, attribution (128 tokens)" in printed and "tools: patching" in printed


@pytest.mark.slow
def test_the_loading_section_measures_a_fresh_process_loading_a_hugging_face_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench.loading, "GPT2_MEDIUM", {"n_layer": 2, "n_head": 2, "n_embd": 64, "n_positions": 64, "vocab_size": 5000})
    record, printed = run_bench("--only", "loading", out=tmp_path / "bench.json", monkeypatch=monkeypatch, capsys=capsys)
    loading = record["results"]["loading"]
    assert 0.0015 < loading["weights_gb"] < 0.0017  # (5000 + 64) x 64 + 2 blocks of 12 x 64 x 64 + biases, fp32
    assert 0 < loading["imports_gb"] <= loading["peak_gb"]  # a tiny model fits in what the imports left free
    assert "loading GPT-2 medium's shape (Hugging Face folder)" in printed and "GB of weights" in printed
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").rglob("*.safetensors"))


# GPT-2's layout at a few seconds' size. Weights drawn at std 1 rather than GPT-2's 0.02, so
# that greedy decoding wanders over the vocabulary instead of repeating the prompt's last token:
# then two models that differ a little choose different tokens, and the comparison can tell.
TINY_GPT2 = {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 64, "vocab_size": 97, "initializer_range": 1.0,
             "bos_token_id": 96, "eos_token_id": 96}  # GPT-2's <|endoftext|> is its last token


@pytest.mark.compile
def test_the_gpt2_sampling_section_puts_each_path_beside_the_bandwidth_limit_and_compares_tokens_at_each_precision(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench.gpt2_sampling, "GPT2_SMALL", TINY_GPT2)
    monkeypatch.setattr(bench.gpt2_sampling, "PROMPT_TOKENS", 4)
    monkeypatch.setattr(bench.gpt2_sampling, "NEW_TOKENS", 24)
    monkeypatch.setattr(bench.gpt2_sampling, "READ_BYTES", 1 << 20)
    monkeypatch.setattr(runtime.huge_pages, "SMALLEST_MODEL", 0)  # moved at this size too, as GPT-2 small is
    # Our bf16 model off transformers' (its last layer's MLP writing with the opposite sign): the
    # section must see other tokens there, and the same ones at fp32.
    at_precision = bench.gpt2_sampling.at_precision

    def nudged_at_bf16(model, dtype, eager=False):
        copy = at_precision(model, dtype, eager)
        assert copy.lm_head.weight.t().is_contiguous() == (eager and dtype == torch.float32)  # eager: as sample.py lays it out
        assert moved_to_huge_pages(copy) is huge_pages_possible()  # where sample.py puts them (Linux)
        if dtype == torch.bfloat16:
            with torch.no_grad():
                copy.blocks[1].mlp.proj.weight.neg_()
        return copy

    monkeypatch.setattr(bench.gpt2_sampling, "at_precision", nudged_at_bf16)
    record, printed = run_bench("--only", "gpt2_sampling", "--repeats", "1", out=tmp_path / "results" / "bench.json",
                                monkeypatch=monkeypatch, capsys=capsys)
    sampling = record["results"]["gpt2_sampling"]
    assert sampling["threads"] == 1 and "1 thread)" in printed  # steadier on a shared machine, without --threads
    params = 2 * 12 * 32 * 32 + 97 * 32 + 64 * 32 + 2 * 13 * 32 + 2 * 32
    assert sampling["params"] == params and sampling["new_tokens"] == 24 and sampling["read_bytes"] == 1 << 20
    assert len(sampling["read_gb_per_s_each"]) == 3 and sampling["read_gb_per_s"] > 0  # 3 reads in the one turn
    assert sampling["huge_pages"] is huge_pages_possible()  # the limit is read where our weights are
    assert set(sampling["precisions"]) == {"fp32", "bf16"}
    for name, element_bytes in (("fp32", 4), ("bf16", 2)):
        p = sampling["precisions"][name]
        assert p["weight_bytes"] == params * element_bytes  # a token reads every weight once
        assert p["limit_tokens_per_sec"] == pytest.approx(sampling["read_gb_per_s"] * 1e9 / p["weight_bytes"])
        assert all(len(times) == 1 for times in (*p["seconds"].values(), *p["prompt_seconds"].values()))  # a pair of runs per turn
        # The share of the limit is the decoding's alone: the 23 tokens after the first, the prompt's run taken away.
        decoding = p["seconds"]["compiled"][0] - p["prompt_seconds"]["compiled"][0]
        assert p["compiled_decode_tokens_per_sec"] == pytest.approx(23 / decoding)
        assert p["compiled_share_of_limit"] == pytest.approx(p["compiled_decode_tokens_per_sec"] / p["limit_tokens_per_sec"])
        assert p["eager_vs_transformers"] == pytest.approx(p["eager_tokens_per_sec"] / p["transformers_tokens_per_sec"])
        figures = (f"{p['compiled_tokens_per_sec']:.1f} tokens/s (decoding alone {p['compiled_decode_tokens_per_sec']:.1f}, "
                   f"{p['compiled_share_of_limit']:.0%} of the limit), {p['compiled_vs_transformers']:.2f}x transformers")
        assert re.search(rf"  {name}, compiled decode step \(compile=true\) +{re.escape(figures)}", printed)
    fp32, bf16 = sampling["precisions"]["fp32"], sampling["precisions"]["bf16"]
    assert fp32["same_greedy_tokens"] is True and fp32["compiled_first_difference"] is None is fp32["eager_first_difference"]
    assert re.search(r"  fp32, the same greedy tokens as transformers +yes", printed)
    assert bf16["same_greedy_tokens"] is False
    assert 4 <= bf16["compiled_first_difference"] == bf16["eager_first_difference"] < 4 + 24  # a new token, not the prompt
    assert re.search(r"  bf16, the same greedy tokens as transformers +NO \(compiled first differs at \d+, eager at \d+", printed)
    assert "greedy sampling, GPT-2 small's shape, 24 tokens after 4" in printed and f"(x.sum() over 1 MiB{' on huge pages' * huge_pages_possible()}, " in printed
    assert not any((tmp_path / "results").rglob("*.safetensors"))  # the weights' folder is removed


# nanoGPT's model.py is not shipped with this project (see the README), so the wiring test reads a
# stand-in written into its place: nanoGPT's interface (GPTConfig, GPT(config) that prints, forward(idx,
# targets) -> (logits, loss), configure_optimizers) over this project's GPT at GPT-2's shape.
STAND_IN_MODEL_PY = """
import torch
from dataclasses import dataclass
from model import GPT as OurGPT, GPTConfig as OurConfig

@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True

class GPT(OurGPT):
    def __init__(self, config):
        super().__init__(OurConfig(vocab_size=config.vocab_size, block_size=config.block_size, n_layer=config.n_layer,
                                   n_head=config.n_head, n_embd=config.n_embd, dropout=config.dropout, bias=config.bias,
                                   mlp="gelu"))
        print("number of parameters: ...")

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        print("using fused AdamW: False")
        return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=betas, weight_decay=weight_decay)
"""


def test_the_gpt2_finetune_section_times_train_steps_of_both_models_at_gpt2s_shape(tmp_path, monkeypatch, capsys):
    line = bench_refusal("--only", "gpt2_finetune", out=tmp_path / "bench.json", monkeypatch=monkeypatch, capsys=capsys)
    assert line == ("error: --only gpt2_finetune needs --nanogpt <a checkout of karpathy/nanoGPT>; "
                                  "clone it and give its folder")

    checkout = tmp_path / "nanogpt"
    checkout.mkdir()
    line = bench_refusal("--only", "gpt2_finetune", "--nanogpt", str(checkout), out=tmp_path / "bench.json",
                         monkeypatch=monkeypatch, capsys=capsys)
    assert line == (f"error: --nanogpt {checkout} is not a nanoGPT checkout (it needs model.py); clone karpathy/nanoGPT "
                    "and give its folder")
    (checkout / "model.py").write_text(STAND_IN_MODEL_PY)
    monkeypatch.setattr(bench.gpt2_finetune, "GPT2_SMALL", TINY_GPT2)
    monkeypatch.setattr(bench.gpt2_finetune, "SEQUENCE_LENGTH", 16)
    monkeypatch.setattr(bench.gpt2_finetune, "STEPS", 2)
    record, printed = run_bench("--only", "gpt2_finetune", "--repeats", "2", "--nanogpt", str(checkout),
                                out=tmp_path / "bench.json", monkeypatch=monkeypatch, capsys=capsys)
    finetune = record["results"]["gpt2_finetune"]
    assert finetune["params"] == finetune["nanogpt_params"] == 2 * 12 * 32 * 32 + 97 * 32 + 64 * 32 + 2 * 13 * 32 + 2 * 32
    assert finetune["batch_size"] == 1 and finetune["sequence_length"] == 16
    assert len(finetune["seconds"]) == len(finetune["nanogpt_seconds"]) == 2  # one timing of 2 steps per repeat
    assert finetune["updates"] == finetune["nanogpt_updates"] == 1 + 2 * 2  # AdamW stepped each time, the untimed step too
    assert finetune["vs_nanogpt"] == pytest.approx(finetune["tokens_per_sec"] / finetune["nanogpt_tokens_per_sec"])
    # Both sides start from GPT-2's initialisation (std 0.02): near-uniform guesses, a loss near ln(97) = 4.57.
    assert abs(finetune["first_loss"] - 4.57) < 0.1 and abs(finetune["nanogpt_first_loss"] - 4.57) < 0.1
    assert "fine-tuning steps, GPT-2 small's shape, 1 x 16 tokens" in printed and "nanoGPT's model.py" in printed


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a CUDA GPU")
def test_the_gpu_sections_without_a_cuda_gpu_are_one_clear_line(tmp_path, monkeypatch, capsys):
    line = bench_refusal("--only", "gpu,gpu_sampling", out=tmp_path / "bench.json", monkeypatch=monkeypatch, capsys=capsys)
    assert line == (f"error: --only gpu,gpu_sampling needs a CUDA GPU; PyTorch {torch.__version__} sees none "
                                  "here. Run it on a machine with one, or check its code here with --gpu-device cpu --gpu-quick")


def test_the_stated_bf16_peak_is_nvidias_dense_rate_for_the_cards_name():
    assert bench.gpu.stated_bf16_tflops("NVIDIA H100 80GB HBM3") == 989  # the SXM card
    assert bench.gpu.stated_bf16_tflops("NVIDIA H100 PCIe") == 756  # not the SXM card's rate, though its name holds "H100"
    assert bench.gpu.stated_bf16_tflops("NVIDIA H200") == 989
    assert bench.gpu.stated_bf16_tflops("NVIDIA A100-SXM4-80GB") == 312
    assert bench.gpu.stated_bf16_tflops("NVIDIA GeForce RTX 4090") is None


def test_gpt2_small_at_45_percent_mfu_of_an_h100_trains_520k_tokens_a_second():
    with torch.device("meta"):  # the shape alone: no memory for its weights
        gpt2_small = GPT(GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768, bias=True))
    flops_per_token = training_flops_per_token(gpt2_small)
    # 6 FLOPs per matmul weight (the 12 blocks' 84.9M and the tied head's 38.6M) plus the attention's 12 L T C:
    assert flops_per_token == 6 * (12 * 7_077_888 + 50304 * 768) + 12 * 12 * 1024 * 768 == 854_654_976
    assert bench.gpu.mfu(520_736, flops_per_token, 989) == pytest.approx(0.45, abs=1e-6)
    assert bench.gpu.mfu(520_736, flops_per_token, None) is None  # no peak known: no MFU claimed


@pytest.mark.slow
def test_the_gpu_sections_run_every_eager_path_at_quick_sizes_on_the_cpu(tmp_path, monkeypatch, capsys):
    # Eager alone (compiling three training steps and two decode steps takes minutes on a CPU), each
    # shape profiled, and the matmul peak failing as an out-of-memory would: reported in its place.
    monkeypatch.setattr(bench.gpu, "MODES", ("eager",))
    monkeypatch.setattr(bench.gpu, "PROFILED_MODE", "eager")
    monkeypatch.setattr(bench.gpu, "SAMPLING_PATHS", ("kv_cache", "recompute"))

    def out_of_memory(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 128.00 MiB")

    monkeypatch.setattr(bench.gpu, "matmul_tflops", out_of_memory)
    record, printed = run_bench("--only", "gpu,gpu_sampling,gpu_finetune", "--gpu-device", "cpu", "--gpu-quick", "--gpu-profile",
                                "--repeats", "1", out=tmp_path / "bench.json", monkeypatch=monkeypatch, capsys=capsys)
    gpu = record["results"]["gpu"]
    assert gpu["device"] == "cpu" and gpu["stated_bf16_tflops"] is None and gpu["measured_bf16_tflops"] is None
    assert list(gpu["shapes"]) == ["default", "shakespeare_char", "gpt2_small"]
    assert [gpu["shapes"][name]["optimizer"] for name in gpu["shapes"]] == ["muon", "muon", "adamw"]
    assert [gpu["shapes"][name]["vocab_size"] for name in gpu["shapes"]] == [1274, 65, 50304]
    for shape in gpu["shapes"].values():
        eager = shape["eager"]
        assert eager["tokens_per_step"] == 2 * 32 and eager["timed_steps"] == 2  # --gpu-quick's batch, block and steps
        assert eager["tokens_per_sec"] == pytest.approx(eager["tokens_per_step"] / eager["ms_per_step"] * 1e3)
        assert eager["mfu_stated"] is None is eager["mfu_measured"] and eager["peak_memory_gib"] is None
        profile = eager["profile"]
        assert profile["steps"] == 1 and 1 <= len(profile["top"]) <= 15 and "Self CPU" in profile["table"]
    assert "GPU bf16 matmul (256^3), cpu" in printed and "not measured; no stated peak for it" in printed
    assert re.search(r"  eager \(1\.6M parameters\) +[\d,]+ tokens/s \([\d.]+ ms/step\), MFU n/a of stated", printed)
    assert "    profile of 1 steps" in printed
    sampling = record["results"]["gpu_sampling"]
    assert list(sampling["shapes"]) == ["default", "gpt2_small"] and sampling["new_tokens"] == 8
    for shape in sampling["shapes"].values():
        for name, element_bytes in (("bf16", 2), ("fp32", 4)):
            figures = shape["precisions"][name]
            assert figures["weight_bytes"] == shape["params"] * element_bytes
            assert figures["kv_cache"]["ms_per_token"] > 0 and figures["recompute"]["ms_per_token"] > 0
            assert "first_difference_from_kv_cache" in figures["recompute"] and "compiled" not in figures
    assert re.search(r"  fp32 weights +KV cache [\d.]+; recomputing [\d.]+", printed)
    finetune = record["results"]["gpu_finetune"]
    assert list(finetune["runs"]) == ["from_folder, bf16", "from_folder, fp16", "padded, bf16"]
    assert [run["vocab_size"] for run in finetune["runs"].values()] == [50257, 50257, 50304]
    for name, run in finetune["runs"].items():
        eager = run["eager"]
        assert "compiled" not in run and eager["tokens_per_step"] == 2 * 32 and eager["ms_per_step"] > 0
        assert (eager["load_seconds"] is not None) == name.startswith("from_folder")  # read from the folder, timed
        assert (eager["loss_scale"] is not None) == name.endswith("fp16")
    folder_params, padded_params = (finetune["runs"][name]["eager"]["params"] for name in ("from_folder, bf16", "padded, bf16"))
    assert padded_params - folder_params == (50304 - 50257) * 32  # the folder's model has GPT-2's own vocabulary (tied head)
    assert list(tmp_path.glob("runs-*/gpt2-small-hf/config.json"))  # the folder it read, kept beside the results
    assert re.search(r"  read from its Hugging Face folder, vocabulary 50,257, fp16", printed)
    assert re.search(r"    eager +[\d,]+ tokens/s .*; read in [\d.]+ s; .*loss scale 65,536 after", printed)
