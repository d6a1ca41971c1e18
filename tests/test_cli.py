"""The real command lines, end to end: train.py, sample.py and a Hydra sweep, run as
subprocesses in a temporary folder; logs are read back with TensorBoard's own reader."""

import fcntl
import gzip
import json
import math
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
from tensorboard.util.tensor_util import make_ndarray

from data.bpe import ranks_from_text
from data.corpus import load_documents
from data.tokenizer import train_bpe_fast
from inspection.head_metrics import head_metrics, induction_probe, induction_score
from inspection.recall_probe import RecallProbe, recall_points
from model_io.checkpoint import Checkpoint
from tests.helpers import ROOT, TINY_RUN, read_events, run_cli, spawn_cli, split_documents
from training.lr_schedule import lr_at


def text_of(events: EventAccumulator, tag: str) -> str:
    """The first text logged under tag, without RunLogger's 4-space code-block indent."""
    return events.Tensors(f"{tag}/text_summary")[0].tensor_proto.string_val[0].decode()[4:]


def last_values(events: EventAccumulator, tags) -> dict[str, float]:
    return {tag: events.Scalars(tag)[-1].value for tag in tags}


def recomputed_last_step_scalars(run_dir: Path) -> dict[str, float]:
    """The induction, recall and ablation scalars of a run's last step, computed afresh from its
    ckpt_last.pt: the held-out stories (data.seed + 1) and the induction probe of train.seed, as the
    run builds them; name recall without each head the plain way, head by head."""
    checkpoint = Checkpoint.load(run_dir / "ckpt_last.pt")
    cfg, (model, tokenizer) = checkpoint.config, checkpoint.build_model()
    n = min(cfg["train"]["probe_tokens"], cfg["model"]["block_size"]) // 2
    probe = torch.tensor([induction_probe(tokenizer.vocab_size, n, cfg["train"]["seed"], avoid=tokenizer.eot_id)])
    induction = induction_score(model.attention_weights(probe)[:, 0], n)  # (L, H)
    recall_probe = RecallProbe.build(tokenizer, cfg["model"]["block_size"], seed=cfg["data"]["seed"] + 1)
    recall = recall_probe.evaluate(model)
    per_head = {f"{prefix}/layer_{layer}/head_{head}": values[layer, head].item()
                for prefix, values in (("head_induction", induction), ("recall_heads", recall.head_weight))
                for layer, head in np.ndindex(*values.shape)}
    by_kind = {f"recall/accuracy_{kind}": value for kind, value in recall.accuracy_by_kind.items()}
    ablation = {}
    for layer, head in np.ndindex(*induction.shape):
        with model.heads_knocked_out({(layer, head)}):
            ablation[f"ablation/recall_name/layer_{layer}/head_{head}"] = recall_probe.evaluate(model).accuracy_by_kind["name"]
    return {**per_head, "recall/accuracy": recall.accuracy, **by_kind, **ablation}


def test_training_writes_both_checkpoints_a_log_and_the_config(trained_run):
    for name in ("ckpt_last.pt", "ckpt_best.pt", "train.log", ".hydra/config.yaml"):
        assert (trained_run / name).is_file(), name
    assert list(trained_run.glob("events.out.tfevents.*"))
    checkpoint = torch.load(trained_run / "ckpt_last.pt", weights_only=True)
    assert checkpoint["step"] == 20
    assert checkpoint["config"]["model"]["n_layer"] == 2
    assert checkpoint["tokenizer"]["kind"] == "bpe"  # the default
    log = (trained_run / "train.log").read_text()
    assert "step 20: train loss" in log and "val loss" in log
    assert "precision: fp32 (train.dtype=auto: fp32 on a CPU, where bf16 and fp16 matmuls are slower)" in log
    # Guards ckpt_best saved at the wrong evaluation or with a stale best_val_loss: the lowest val loss logged.
    val = {e.step: e.value for e in read_events(trained_run).Scalars("loss/val") if e.step > 0}
    best = torch.load(trained_run / "ckpt_best.pt", weights_only=True)
    assert best["step"] == min(val, key=val.get)
    assert best["best_val_loss"] == pytest.approx(val[best["step"]]) == checkpoint["best_val_loss"]


def test_tensorboard_has_attention_maps_for_every_layer_and_head(trained_run):
    events = read_events(trained_run)
    expected = {f"attention/layer_{layer}/head_{head}" for layer in range(2) for head in range(2)}
    assert expected <= set(events.Tags()["images"])
    for tag in expected:
        images = events.Images(tag)
        assert [image.step for image in images] == [0, 10, 20]
        assert images[-1].width > 24 * 4 and images[-1].height > 24 * 4  # 24 probe tokens, labelled


def test_every_head_has_its_metrics_and_all_heads_share_one_grid_image(trained_run, tmp_path):
    events = read_events(trained_run)
    scalars = set(events.Tags()["scalars"])
    for metric in ("entropy", "distance", "previous_token", "induction"):
        for layer in range(2):
            for head in range(2):
                values = events.Scalars(f"head_{metric}/layer_{layer}/head_{head}")
                assert [v.step for v in values] == [0, 10, 20], (metric, layer, head)
                assert all(math.isfinite(v.value) and v.value >= 0 for v in values)
    assert all(v.value <= 1 for v in events.Scalars("head_previous_token/layer_0/head_0"))
    assert not any(tag.startswith("head_") and "layer_2" in tag for tag in scalars)  # 2 layers only
    # The recall probe (the stories corpus): accuracy on repeated names, and every head's look back.
    assert [v.step for v in events.Scalars("recall/accuracy")] == [0, 10, 20]
    assert all(0 <= v.value <= 1 for v in events.Scalars("recall/accuracy"))
    assert "weight on the earlier mention: layer " in text_of(events, "recall/top_heads")
    # And its name recall with each head knocked out alone, at the same steps.
    for layer, head in np.ndindex(2, 2):
        assert [v.step for v in events.Scalars(f"ablation/recall_name/layer_{layer}/head_{head}")] == [0, 10, 20]
    assert re.match(r"name recall \d\.\d\d with every head; without layer \d head \d: ", text_of(events, "ablation/top_heads"))
    # Guards logging another probe's numbers, or a head under another's tag: recomputed from ckpt_last.pt.
    expected = recomputed_last_step_scalars(trained_run)
    assert last_values(events, expected) == pytest.approx(expected, abs=1e-5)
    grids = events.Images("attention/all_heads")
    assert [g.step for g in grids] == [0, 10, 20]
    (tmp_path / "grid.png").write_bytes(grids[-1].encoded_image_string)
    pixels = np.asarray(Image.open(tmp_path / "grid.png").convert("RGB")).astype(int)
    grey = (np.abs(pixels - 236).sum(axis=-1) < 6)  # the future cells of 2 x 2 maps
    assert grey.mean() > 0.15 and pixels.shape[0] > 2 * 24 * 6  # two rows of maps of 24 tokens


def test_the_attention_tabs_data_is_every_logged_steps_weights_with_the_probes_labels(trained_run):
    events = read_events(trained_run)
    metadata = events.SummaryMetadata("attention/weights")
    assert metadata.plugin_data.plugin_name == "tinyattn_attention"
    labels = json.loads(metadata.plugin_data.content)["labels"]
    assert " | ".join(labels) == text_of(events, "attention/probe")  # the heatmaps' labels
    logged = events.Tensors("attention/weights")
    assert [t.step for t in logged] == [0, 10, 20]
    for event in logged:
        weights = make_ndarray(event.tensor_proto)
        assert weights.dtype == np.float16 and weights.shape == (2, 2, 24, 24)  # (L, H, T, T) of the probe
        assert (np.triu(weights, k=1) == 0).all() and np.allclose(weights.astype(np.float32).sum(-1), 1, atol=1e-2)
        # The same weights the head metrics of that step were computed from (guards a stale or
        # shuffled tensor): recomputed from the logged numbers, they match the logged scalars.
        metrics = head_metrics(torch.from_numpy(weights.astype(np.float32)))
        for layer, head in np.ndindex(2, 2):
            scalar = events.Scalars(f"head_previous_token/layer_{layer}/head_{head}")[logged.index(event)]
            assert metrics["previous_token"][layer, head].item() == pytest.approx(scalar.value, abs=2e-3)


def test_attention_maps_show_a_causal_pattern(trained_run, tmp_path):
    events = read_events(trained_run)
    encoded = events.Images("attention/layer_0/head_0")[-1].encoded_image_string
    (tmp_path / "map.png").write_bytes(encoded)
    pixels = np.asarray(Image.open(tmp_path / "map.png").convert("RGB")).astype(int)
    # The pale grey of "future" cells fills the upper-right triangle of the grid; the lower
    # triangle is coloured by the weights. Count grey pixels in each half of the image.
    grey = (np.abs(pixels - 236).sum(axis=-1) < 6)
    height, width = grey.shape
    upper_right = grey[: height // 2, width // 2 :].mean()
    lower_left = grey[height // 2 :, : width // 2].mean()
    assert upper_right > 0.3 and lower_left < 0.05


def test_tensorboard_has_the_scalars_samples_and_config(trained_run):
    events = read_events(trained_run)
    scalars = set(events.Tags()["scalars"])
    assert {"loss/train", "loss/val", "train/batch_loss", "train/lr", "train/grad_norm", "train/tokens_per_sec"} <= scalars
    assert [e.step for e in events.Scalars("loss/val")] == [0, 10, 20]
    # Guards swapped or mislabelled scalars: each logged value is the one train.log printed for its step.
    log = (trained_run / "train.log").read_text()
    evals = re.findall(r"step (\d+): train loss ([\d.]+), val loss ([\d.]+)", log)
    windows = re.findall(r"step (\d+)/20 \| loss ([\d.]+) \| lr [^|]+\| grad norm ([\d.]+)", log)
    for tag, printed, rounding in (("loss/train", {int(s): float(t) for s, t, _ in evals}, 1e-4),
                                   ("loss/val", {int(s): float(v) for s, _, v in evals}, 1e-4),
                                   ("train/batch_loss", {int(s): float(loss) for s, loss, _ in windows}, 1e-4),
                                   ("train/grad_norm", {int(s): float(g) for s, _, g in windows}, 1e-2)):
        assert {e.step: e.value for e in events.Scalars(tag)} == pytest.approx(printed, abs=rounding), tag
    assert all(e.value > 0 for e in events.Scalars("train/tokens_per_sec"))
    text_tags = set(events.Tags()["tensors"])
    assert {"samples/text_summary", "config/text_summary", "attention/probe/text_summary"} <= text_tags
    labels = text_of(events, "attention/probe").split(" | ")
    assert len(labels) == 24 and "·was" in labels  # 24 BPE tokens, whole words, the leading space shown as ·
    probe = "".join(labels).replace("·", " ")
    assert re.match(r"(Once upon|There once|Long ago|[A-Z][a-z]+ was a)", probe), probe
    assert any(point.kind == "name" for point in recall_points(probe)), probe  # a name comes back: the copying shows
    samples = events.Tensors("samples/text_summary")
    assert [s.step for s in samples] == [0, 10, 20]
    config_text = text_of(events, "config")
    assert "n_layer: 2" in config_text


def test_the_val_loss_falls_during_the_tiny_run(trained_run):
    val = [e.value for e in read_events(trained_run).Scalars("loss/val")]
    assert val[-1] < val[0] - 0.3


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


def test_sampling_with_the_compiled_decode_step_gives_the_eager_text(trained_run, tmp_path):
    # 40 new tokens after <eot> + 4 prompt tokens: past the tiny run's block_size of 32, so the
    # window slides and the compiled step goes on from caches that GPT.forward refilled.
    args = [f"run={trained_run}", "prompt=Once upon a time", "max_new_tokens=40", "num_samples=2", "temperature=1", "top_k=20"]
    eager = run_cli("sample.py", *args, cwd=tmp_path)
    compiled = run_cli("sample.py", *args, "compile=true", cwd=tmp_path)
    assert eager.returncode == 0 and compiled.returncode == 0, eager.stderr + compiled.stderr
    assert compiled.stdout == eager.stdout and eager.stdout.count("Once upon a time") == 2
    assert "compile=true: compiling the decode step first" in compiled.stderr
    one_token = run_cli("sample.py", *args[:2], "max_new_tokens=1", "compile=true", cwd=tmp_path)
    assert one_token.returncode == 0 and "compil" not in one_token.stderr  # the prompt's forward makes it


def broken_compiler(folder: Path) -> dict[str, str]:
    """The environment of a C++ compiler that is there but fails (no compiler at all is refused
    before any work: tests/test_devices.py), with an empty kernel cache so that nothing compiled
    earlier is reused."""
    compiler = folder / "broken-g++"
    compiler.write_text("#!/bin/sh\nexit 1\n")
    compiler.chmod(0o755)
    return {"CXX": str(compiler), "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor")}


def test_a_decode_step_that_cannot_compile_is_one_line_that_names_the_way_out(trained_run, tmp_path):
    env = broken_compiler(tmp_path)
    result = spawn_cli("sample.py", f"run={trained_run}", "max_new_tokens=5", "compile=true", cwd=tmp_path, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr + result.stdout, result.stderr
    note, error = result.stderr.strip().splitlines()  # what it was doing, then why it stopped
    assert note.startswith("compile=true: compiling the decode step first")
    assert error.startswith("error: compile=true: Inductor could not compile the decode step (")
    assert error.endswith("run with compile=false")


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


def test_the_default_run_uses_a_bpe_vocabulary_learned_once_and_cached(trained_run):
    assert "(bpe)" in (trained_run / "train.log").read_text()
    (cached,) = (trained_run.parent / ".cache" / "bpe").glob("*.tiktoken")
    # Guards val text leaking into the vocabulary: the cached ranks, the checkpoint's, are the train split's alone.
    checkpoint = torch.load(trained_run / "ckpt_last.pt", weights_only=True)
    data, vocab_size = checkpoint["config"]["data"], checkpoint["config"]["tokenizer"]["vocab_size"]
    train_docs, _, _ = split_documents(load_documents(data), data["val_fraction"])
    assert ranks_from_text(cached.read_text()) == train_bpe_fast(train_docs, vocab_size)
    assert checkpoint["tokenizer"]["ranks"] == cached.read_text()


def test_a_tiny_char_run_trains_logs_labelled_maps_and_samples(tmp_path):
    result = run_cli("train.py", *TINY_RUN, "tokenizer=char", "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = tmp_path / "run"
    assert "(char)" in (run_dir / "train.log").read_text()
    assert not (tmp_path / ".cache" / "bpe").exists()
    events = read_events(run_dir)
    assert {f"attention/layer_{layer}/head_{h}" for layer in range(2) for h in range(2)} <= set(events.Tags()["images"])
    assert [image.step for image in events.Images("attention/layer_1/head_1")] == [0, 10, 20]
    labels = text_of(events, "attention/probe").split(" | ")
    assert len(labels) == 24 and all(len(label) == 1 for label in labels)  # one character each, a space as ·
    assert "".join(labels).replace("·", " ").startswith(("Once upon", "There once", "Long ago"))
    losses = [e.value for e in events.Scalars("loss/val")]
    assert losses[-1] < losses[0] - 0.3
    # The recall probe reads character tokens too; guards a probe built on other stories than the held-out ones.
    expected = recomputed_last_step_scalars(run_dir)
    assert "recall/accuracy_name" in expected
    assert last_values(events, expected) == pytest.approx(expected, abs=1e-5)
    sampled = run_cli("sample.py", f"run={run_dir}", "prompt=Once upon", "max_new_tokens=20", cwd=tmp_path)
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout.startswith("Once upon") and len(sampled.stdout.rstrip("\n")) >= len("Once upon") + 20
    unknown = run_cli("sample.py", f"run={run_dir}", "prompt='Once upon a time ☃'", cwd=tmp_path)
    assert_one_error_line(unknown, "never saw in training: '☃'")  # a character outside the char vocabulary


def test_a_bpe_that_runs_out_of_merges_says_how_many_tokens_it_got(tmp_path):
    result = run_cli("train.py", *TINY_RUN, "data.n_chars=10000", "tokenizer=bpe", "tokenizer.vocab_size=4096",
                     "train.max_steps=1", "train.attn_log_interval=0", "train.sample_interval=0", "hydra.run.dir=run",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    vocab = int(re.search(r"vocab (\d+) \(bpe\)", result.stdout).group(1))
    assert vocab < 4096
    assert f"note: bpe has {vocab - 1} byte tokens, not the 4096 of tokenizer.vocab_size" in result.stdout
    assert "ns_dtype" not in result.stdout  # Muon in float32 on a CPU: nothing to say


def test_muon_in_bfloat16_on_a_cpu_says_it_is_slow_without_avx512_bf16_and_how_to_use_float32(tmp_path):
    result = run_cli("train.py", *TINY_RUN, "optim.ns_dtype=bfloat16", "train.max_steps=1", "train.attn_log_interval=0",
                     "train.sample_interval=0", "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "note: optim.ns_dtype=bfloat16 (a run saved before the option resumes with it)" in result.stdout
    assert "optim.ns_dtype=auto runs them in float32" in result.stdout


def test_a_sweep_makes_one_run_dir_per_value(tmp_path):
    tiny_without_n_head = [arg for arg in TINY_RUN if not arg.startswith("model.n_head=")]
    result = run_cli("train.py", "-m", "model.n_head=1,2", *tiny_without_n_head, "train.max_steps=4",
                     "train.eval_interval=4", "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    runs = sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir())
    assert runs == ["0", "1"]
    for run, n_head in (("0", 1), ("1", 2)):
        run_dir = tmp_path / "sweep" / run
        assert (run_dir / "ckpt_last.pt").is_file() and list(run_dir.glob("events.out.tfevents.*"))
        assert torch.load(run_dir / "ckpt_last.pt", weights_only=True)["config"]["model"]["n_head"] == n_head
        heads = {tag.split("/")[2] for tag in read_events(run_dir).Tags()["images"] if tag.startswith("attention/layer_")}
        assert heads == {f"head_{h}" for h in range(n_head)}
        # The HParams tab's data, read back as TensorBoard reads it: this run's settings and result.
        events = read_events(run_dir)
        content = events.PluginTagToContent("hparams")
        assert {"_hparams_/experiment", "_hparams_/session_start_info", "_hparams_/session_end_info"} <= set(content)
        start = HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
        assert start.hparams["model.n_head"].number_value == n_head
        assert start.hparams["optim.name"].string_value == "muon"
        experiment = HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
        assert "hparams/best_val_loss" in {m.name.tag for m in experiment.metric_infos}
        best = events.Scalars("hparams/best_val_loss")[-1].value
        assert best == pytest.approx(min(e.value for e in events.Scalars("loss/val")[1:]), rel=1e-6)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["model.n_layr=3"], "error: model.n_layr is not an option; check its spelling (`python train.py --help`"),
        (["n_layer=3"], "error: n_layer is not an option"),
        (["+model.n_layr=3"], "error: +model.n_layr=3 adds model.n_layr, which is not an option here"),
        (["model=huge"], "error: model=huge is not an option of model; choose one of: gpt"),
        (["optimizer=sgd"], "error: optimizer is not an option; check its spelling"),
        (["model.n_layer=[1,"], "error: could not read the argument 'model.n_layer=[1,' (no viable alternative at input '[1,')"),
        (["model.n_head=2,4"], "error: model.n_head=2,4: a comma here means a sweep; add -m for one run per value"),
        (["--hlep"], "error: --hlep is not a flag of this command; `python train.py --help` lists every option"),
        (["model.n_layer=${oops}"], "error: model.n_layer: Interpolation key 'oops' not found"),
        (["model.n_embd=30", "model.n_head=4"], "error: model.n_embd=30 is not divisible by model.n_head=4"),
        (["train.batch_size=0"], "error: train.batch_size=0 must be at least 1"),
        (["optim.lr=-1"], "error: optim.lr=-1"),
        (["model.dropout=1.5"], "error: model.dropout=1.5 must be in [0, 1)"),
        (["data=text"], "error: data=text needs a corpus"),
        (["data=text", "data.path=nowhere.txt"], "error: data.path=nowhere.txt does not exist"),
        (["data=text", "data.path=empty.txt"], "error: data.path=empty.txt holds no text"),
        (["data=text", "data.path=binary.txt"], "error: binary.txt looks binary (it holds NUL bytes at 5)"),
        (["data=text", "data.path=latin1.txt"], "error: latin1.txt is not UTF-8 text (byte 3 is 0xe9)"),
        (["data=text", "data.path=bad.jsonl"], "error: bad.jsonl, line 2: not valid JSON (Expecting ',' delimiter, column 16)"),
        (["data=text", "data.path=bad.jsonl", "data.text_field=story"], "error: bad.jsonl, line 1: no 'story' field (it has 'text')"),
        (["data=text", "data.path=cut.txt.gz"], "error: cut.txt.gz is not a readable gzip file"),
        pytest.param(["train.device=cuda"], "error: train.device=cuda but PyTorch sees no CUDA GPU here",
                     marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")),
        (["optim.lr=0"], "error: optim.lr=0"),
        (["model.pos=alibi"], "error: model.pos=alibi must be one of learned, rope"),
        (["model.pos=rope", "model.n_embd=36", "model.n_head=4"], "error: model.pos=rope needs an even head size"),
        (["model.mlp=swish"], "error: model.mlp=swish must be one of gelu, gelu_tanh, relu2"),
        (["optim.name=sgd"], "error: optim.name=sgd must be one of adamw, muon"),
        (["optim.schedule=step"], "error: optim.schedule=step must be one of cosine, wsd"),
        (["experiment=fast"], "error: experiment=fast is not an option of experiment; choose one of: finetune_gpt2, gpt2_shape, shakespeare_char_cpu"),
        (["resume=nowhere"], "error: resume=nowhere does not exist"),
        (["resume=auto"], "error: resume=auto goes on with the run in hydra.run.dir, a new folder each time unless you name it: "
                          "add hydra.run.dir=<folder>"),
        (["train.save_interval=-1"], "error: train.save_interval=-1 must be 0 (only at evaluations) or more"),
        (["model.block_size=5000", "data.n_chars=20000"], "error: model.block_size=5000 needs more than 5000 tokens"),
        (["train.max_steps=abc"], "error: train.max_steps=abc must be a whole number"),
        (["model.bias=maybe"], "error: model.bias=maybe must be true or false"),
        (["model.qk_norm=1.5"], "error: model.qk_norm=1.5 must be true or false"),
        (["debug=shape"], "error: debug=shape is not a debug mode; the one there is: debug=shapes"),
        (["train.compile=yes please"], "error: train.compile=yes please must be true or false"),
        (["model.dropout=x"], "error: model.dropout=x must be a number"),
        (["optim.betas=[2,0.9]"], "error: optim.betas=[2, 0.9] must be two numbers in [0, 1)"),
        (["optim.muon_momentum=1"], "error: optim.muon_momentum=1 must be in [0, 1)"),
        (["data.n_chars=0"], "error: data.n_chars=0 must be a whole number of at least 10000"),
        (["train.sample_temperature=-1"], "error: train.sample_temperature=-1 must be 0 (greedy) or more"),
        (["train.device=tpu9"], "error: train.device=tpu9"),
        (["tokenizer=bpe", "tokenizer.vocab_size=100"], "error: tokenizer.vocab_size=100 must be a whole number from 256"),
        (["tokenizer=gpt2", "tokenizer.url=http://127.0.0.1:9/gpt2", "data.cache_dir=c"],
         "error: could not download http://127.0.0.1:9/gpt2/vocab.bpe"),
        (["data=shakespeare", "data.url=http://127.0.0.1:9/input.txt", "data.cache_dir=c"],
         "error: could not download http://127.0.0.1:9/input.txt"),
    ],
)
def test_bad_training_input_gets_one_clear_line_and_no_traceback(tmp_path, args, message):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "binary.txt").write_bytes(b"hello\0\0\0world")
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9 au lait".encode("latin-1"))
    (tmp_path / "bad.jsonl").write_text('{"text": "one"}\n{"text": "two" "three"}\n{"text": "four"}\n')
    (tmp_path / "cut.txt.gz").write_bytes(gzip.compress(b"a story " * 1000)[:-40])  # a download cut short
    result = run_cli("train.py", *args, cwd=tmp_path)
    assert_one_error_line(result, message)
    assert not (tmp_path / "outputs").exists()  # a refused run leaves no run dir, not even an empty one
    if "data=text" in args:  # a corpus refused while read leaves no token cache entry, whole or half-written
        assert not list(tmp_path.glob(".cache/tokens/*"))


def assert_one_error_line(result, message: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr  # one line
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run=nowhere"], "error: run=nowhere does not exist"),
        (["run=empty_run"], "error: run=empty_run has no ckpt_best.pt or ckpt_last.pt"),
        (["run=truncated.pt"], "error: truncated.pt is not a readable checkpoint"),
        (["run=notes.pt"], "error: notes.pt is not a readable checkpoint"),
        (["run=mismatched.pt"], "error: the checkpoint's weights do not fit the model its config describes"),
        (["top_p=0"], "error: top_p=0 must be in (0, 1]"),
        (["topk=5"], "error: topk is not an option; check its spelling (`python sample.py --help`"),
        (["temperature=-1"], "error: temperature=-1"),
        (["prompt=Chapter", "1:", "x"], "error: could not read the argument '1:': each argument is key=value, and a value with"),
        (["prompt=Once upon a time, a"], "error: prompt=Once upon a time, a: a comma here means a sweep"),
        (["prompt='a','b'"], "error: prompt='a','b': a comma here means a sweep"),
        (["device=tpu9"], "error: device=tpu9 is not a device; use auto, cpu, cuda"),
        (["top_k=100000"], "error: top_k=100000 must be between 1 and the vocabulary size"),
        (["top_p=1.5"], "error: top_p=1.5 must be in (0, 1]"),
        (["max_new_tokens=-3"], "error: max_new_tokens=-3 must be 0 or more"),
        (["max_new_tokens=abc"], "error: max_new_tokens=abc must be a whole number"),
        (["top_k=lots"], "error: top_k=lots must be a whole number"),
        (["use_kv_cache=maybe"], "error: use_kv_cache=maybe must be true or false"),
        (["compile=true", "use_kv_cache=false"], "error: compile=true compiles the cached one-token step"),
    ],
)
def test_bad_sampling_input_gets_one_clear_line_and_no_traceback(trained_run, tmp_path, args, message):
    checkpoint = (trained_run / "ckpt_last.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(checkpoint[: len(checkpoint) // 2])
    (tmp_path / "notes.pt").write_text("not a checkpoint")
    (tmp_path / "empty_run").mkdir()
    wrong = torch.load(trained_run / "ckpt_last.pt", weights_only=True)
    wrong["config"]["model"]["n_embd"] = 64  # the config now describes another model than the weights
    torch.save(wrong, tmp_path / "mismatched.pt")
    run = [] if any(a.startswith("run=") for a in args) else [f"run={trained_run}"]
    before = sorted(p.name for p in trained_run.rglob("*"))
    result = run_cli("sample.py", *run, *args, cwd=tmp_path)
    assert_one_error_line(result, message)
    assert sorted(p.name for p in trained_run.rglob("*")) == before  # nothing written into the run dir


@pytest.mark.parametrize("script", ["train.py", "sample.py"])
def test_help_lists_the_options_with_the_projects_own_text(tmp_path, script):
    result = spawn_cli(script, "--help", cwd=tmp_path)  # the scripts' own start, as a user runs them
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{script}: ")
    assert f"Usage: python {script} [key=value ...]" in result.stdout
    if script == "train.py":
        assert "tokenizer: bpe, char, gpt2" in result.stdout  # the groups and their options
        assert "  n_head: 4\n" in result.stdout and "resume: null" in result.stdout
        overridden = run_cli(script, "model.n_head=8", "--help", cwd=tmp_path)
        assert "  n_head: 8\n" in overridden.stdout  # the values this command line would use
    else:
        assert "use_kv_cache: true" in result.stdout
    assert list(tmp_path.iterdir()) == []  # asking for help writes nothing


def test_the_time_to_quality_preset_resolves_to_nanogpts_shape_with_its_levers(tmp_path):
    result = run_cli("train.py", "experiment=shakespeare_char_cpu", "--cfg", "job", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    assert config["data"]["source"] == "shakespeare" and config["tokenizer"]["kind"] == "char"
    model = config["model"]
    assert (model["n_layer"], model["n_head"], model["n_embd"], model["block_size"]) == (4, 4, 128, 64)
    assert (model["pos"], model["mlp"], config["optim"]["schedule"]) == ("rope", "relu2", "wsd")
    assert config["train"]["batch_size"] == 12 and config["train"]["eval_iters"] >= 200
    assert list(tmp_path.iterdir()) == []


def logged_losses(stdout: str) -> list[float]:
    return [float(v) for v in re.findall(r"step \d+: train loss ([\d.]+), val loss ([\d.]+)", stdout) for v in v]


def test_a_compiled_run_learns_what_the_eager_run_learns(tmp_path):
    quick = [*TINY_RUN, "train.attn_log_interval=0", "train.sample_interval=0"]
    eager = run_cli("train.py", *quick, "hydra.run.dir=eager", cwd=tmp_path)
    compiled = spawn_cli("train.py", *quick, "train.compile=true", "hydra.run.dir=compiled", cwd=tmp_path, timeout=600)
    assert eager.returncode == 0 and compiled.returncode == 0, compiled.stdout + compiled.stderr
    assert "train.compile=true: the first training step and the first evaluation compile first" in compiled.stdout
    eager_losses, compiled_losses = logged_losses(eager.stdout), logged_losses(compiled.stdout)
    assert len(compiled_losses) == 6  # train and val at steps 0, 10, 20
    assert compiled_losses == pytest.approx(eager_losses, abs=2e-3)  # the same model, only the kernels differ
    assert compiled_losses[-1] < compiled_losses[1] - 0.3  # and it did learn
    saved = torch.load(tmp_path / "compiled" / "ckpt_last.pt", weights_only=True)["model"]
    assert not any(key.startswith("_orig_mod") for key in saved)  # plain weights that sample.py loads


def test_a_compile_that_cannot_build_is_one_line_that_names_the_way_out(tmp_path):
    env = broken_compiler(tmp_path)  # a real failure, inside Inductor
    result = spawn_cli("train.py", *TINY_RUN, "train.compile=true", "hydra.run.dir=run", cwd=tmp_path, env=env)
    assert_one_error_line(result, "error: train.compile=true: torch.compile could not build the model (")
    assert "run with train.compile=false" in result.stderr
    assert not (tmp_path / "run" / "ckpt_last.pt").exists()


def trace_steps(stdout: str) -> dict[str, str]:
    """The shape trace as {code of a line: the shapes printed under it} (the first time each appears)."""
    lines = stdout.splitlines()
    steps = {}
    for code, shape in zip(lines, lines[1:], strict=False):
        if shape.strip().startswith("-> ") and ".py:" in code:
            steps.setdefault(code.split(maxsplit=1)[1].split("  #")[0], shape.strip()[3:])
    return steps


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["model.n_layer=2", "model.n_head=4", "model.n_embd=32", "model.block_size=16", "tokenizer=char",
          "model.pos=learned"], {
            "x = self.tok_emb(idx)": "(2, 16, 32)",
            "q, k, v = self.qkv(x).split(C, dim=2)": "(2, 16, 96) -> 3 x (2, 16, 32)",  # every step of a line
            "q = q.view(B, T, H, D).transpose(1, 2)": "(2, 16, 4, 8) -> (2, 4, 16, 8)",
            "scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)": "(2, 4, 8, 16) -> (2, 4, 16, 16)",
            "weights = torch.softmax(scores, dim=-1)": "(2, 4, 16, 16)",
            "out = self.attn_dropout(weights) @ v": "(2, 4, 16, 16) -> (2, 4, 16, 8)",
            "out = out.transpose(1, 2).contiguous().view(B, T, C)": "(2, 16, 4, 8) -> (2, 16, 32)",
            "x = self.fc(x)": "(2, 16, 128)",
            "logits = self.lm_head(x)": "(2, 16, 50)",  # 49 characters and <|endoftext|>
        }),
        (["model.n_layer=3", "model.n_head=2", "model.n_embd=48", "model.block_size=12", "model.pos=rope",
          "model.qk_norm=true", "model.attention=manual"], {
            "q = q.view(B, T, H, D).transpose(1, 2)": "(2, 12, 2, 24) -> (2, 2, 12, 24)",
            "q, k = self.q_norm(q), self.k_norm(k)": "(2, 2, 12, 24)",
            "x1, x2 = x.chunk(2, dim=-1)": "2 x (2, 2, 12, 12)",
            "scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)": "(2, 2, 24, 12) -> (2, 2, 12, 12)",
            "x = self.fc(x)": "(2, 12, 192)",
            "logits = self.lm_head(x)": "(2, 12, 1103)",  # the BPE vocabulary of the first 20,000 characters
        }),
    ],
    ids=["4 heads of 8", "rope and qk-norm, 2 heads of 24"],
)
def test_debug_shapes_walks_one_forward_of_the_configured_model_and_writes_nothing(tmp_path, args, expected):
    result = run_cli("train.py", "debug=shapes", "data.n_chars=20000", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    steps = trace_steps(result.stdout)
    for code, shape in expected.items():
        assert steps.get(code) == shape, (code, steps.get(code))
    assert "self.pos_emb(positions)" in result.stdout if "model.pos=learned" in args else "pos_emb" not in result.stdout
    n_layer = int(args[0].split("=")[1])
    later = "blocks.1" if n_layer == 2 else f"blocks.1 to blocks.{n_layer - 1}"
    assert f"{later}: the same steps and shapes as blocks.0" in result.stdout
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").iterdir())  # no run was made


def test_the_docs_picture_shows_the_name_copying_head_beside_another(trained_run, tmp_path):
    import docs.figures  # the script behind `make docs`
    from docs.drawing import SHOWN_WIDTH

    out = tmp_path / "maps.png"
    (copier, _), (other, _) = [((layer, head), role) for layer, head, role in
                               docs.figures.attention_maps_figure(str(trained_run / "ckpt_last.pt"), out=out)]
    # The run logged each head's weight on the earlier mention at step 20, from the same weights.
    events = read_events(trained_run)
    logged = {(layer, head): events.Scalars(f"recall_heads/layer_{layer}/head_{head}")[-1].value
              for layer in range(2) for head in range(2)}
    assert copier == max(logged, key=logged.get) and other != copier
    width, height = Image.open(out).size
    assert 1.5 * height < width <= SHOWN_WIDTH  # two square maps side by side, shown at their own size


def test_the_docs_picture_of_a_missing_run_is_one_clear_line(tmp_path):
    result = spawn_cli("docs/figures.py", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert_one_error_line(result, "does not exist")


def test_each_update_uses_and_logs_the_schedules_lr_for_its_own_step(tmp_path):
    # Guards the loop's call of the schedule: the update that ends at step s is update s - 1.
    result = run_cli("train.py", *TINY_RUN, "train.max_steps=8", "train.log_interval=1", "optim.warmup_steps=3",
                     "train.eval_interval=8", "train.attn_log_interval=0", "train.sample_interval=0",
                     "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    optim = yaml.safe_load((tmp_path / "run" / ".hydra" / "config.yaml").read_text())["optim"]
    logged = read_events(tmp_path / "run").Scalars("train/lr")
    assert [e.step for e in logged] == list(range(1, 9))
    expected = [lr_at(e.step - 1, optim["lr"], optim["min_lr"], 3, 8, optim["schedule"], optim["decay_fraction"])
                for e in logged]
    assert [e.value for e in logged] == pytest.approx(expected, rel=1e-6)
    assert len(set(expected)) >= 5  # warmup, flat and decay: an update one step off would log other values


def run_on_a_terminal(args: list[str], cwd: Path) -> tuple[int, str]:
    """train.py with a real pseudo-terminal as its stdout and stderr: (exit status, what it showed)."""
    terminal, child_end = pty.openpty()
    fcntl.ioctl(child_end, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # 40 rows, 120 columns
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], cwd=cwd, env=env,
                               stdin=subprocess.DEVNULL, stdout=child_end, stderr=child_end)
    os.close(child_end)
    shown = b""
    while True:
        try:
            chunk = os.read(terminal, 4096)
        except OSError:  # EIO: the process closed its end
            break
        if not chunk:
            break
        shown += chunk
    os.close(terminal)
    return process.wait(timeout=300), shown.decode(errors="replace")


def test_a_terminal_gets_a_progress_bar_instead_of_step_lines_and_a_pipe_gets_the_lines(tmp_path):
    args = [*TINY_RUN, "train.attn_log_interval=0", "train.sample_interval=0"]
    status, shown = run_on_a_terminal([*args, "hydra.run.dir=tty"], tmp_path)
    assert status == 0, shown
    assert re.search(r"step 20/20 \|█{24}\| loss [\d.]+ \| [\d.]+k tok/s \| 00:00 left", shown), shown
    assert "| lr " not in shown  # the per-step lines went to the log file only...
    assert "step 20/20 | loss" in (tmp_path / "tty" / "train.log").read_text()
    assert "step 20: train loss" in shown and "done: best val loss" in shown  # ...the others print above the bar
    for reading in ("reading the corpus", "reading text for BPE", r"tokenising \(bpe\)"):  # bytes of a known total
        assert re.search(reading + r": +0%\|.*\| 0\.00/[12]\d\.\dk \[00:00<\?, \?B/s\]", shown), shown
    assert "read 17 documents, 21,443 characters (21.4kB)" in shown and "merges in" in shown
    assert "Progress:" not in shown  # nor the trainer's own steps
    piped = spawn_cli("train.py", *args, "hydra.run.dir=piped", cwd=tmp_path)
    assert "step 20/20 | loss" in piped.stdout and "| lr " in piped.stdout
    assert "█" not in piped.stdout + piped.stderr and "\r" not in piped.stderr  # no bar in a pipe
