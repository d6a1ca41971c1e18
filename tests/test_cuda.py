"""The CUDA paths, on a CUDA GPU: mixed precision tracks fp32, fp16's loss scaling skips an
overflow, the two attention paths agree, cached and compiled decoding give the tokens of
recomputing the window, a resumed run gives the losses of the run left alone, a compiled run
learns what the eager one learns, a checkpoint moves between the GPU and the CPU, and the
Attention tab reads a run trained on the GPU.

Without a CUDA GPU every test here is skipped. TINYATTN_CUDA_TESTS_ON_CPU=1 runs them on the CPU
instead, to check the tests themselves where there is no GPU: every device the tests use is
DEVICE below, and there a CPU->CPU move stands in for a GPU->CPU one.

    .venv/bin/pytest tests/test_cuda.py -rA                               on the GPU (-rA: whether resuming was bitwise)
    TINYATTN_CUDA_TESTS_ON_CPU=1 .venv/bin/pytest tests/test_cuda.py -rA  the same tests on the CPU
"""

import base64
import json
import math
import os
import shutil
import threading
import traceback
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard import program
from tensorboard.plugins.core import core_plugin

from attention_tab.browser import attention_runs
from attention_tab.live_model import ModelCache, text_answer
from attention_tab.plugin import AttentionLoader
from inspection.tab_format import PLUGIN_NAME
from model.decode_step import INDUCTOR_OPTIONS, CompiledDecodeStep
from model.generation import generate_tokens
from model_io.checkpoint import Checkpoint
from runtime.devices import Machine, check_compiler
from tests.helpers import ARCHITECTURE_OPTIONS, curves, fp32_matmuls, lively, read_events, run_cli, tiny_gpt, tiny_run
from tests.test_precision import (
    assert_an_overflow_changes_nothing_halves_the_scale_and_it_regrows,
    train_step,
)
from user_error import UserError

ON_CPU = os.environ.get("TINYATTN_CUDA_TESTS_ON_CPU") == "1"
DEVICE = torch.device("cpu" if ON_CPU else "cuda")

pytestmark = [
    pytest.mark.skipif(not ON_CPU and not torch.cuda.is_available(),
                       reason="needs a CUDA GPU (TINYATTN_CUDA_TESTS_ON_CPU=1 runs these tests on the CPU)"),
    pytest.mark.slow,  # each trains, compiles or starts a server; and on a machine without CUDA none of them runs
]
OPTION_IDS = [",".join(f"{k}={v}" for k, v in options.items()) or "gpt2" for options in ARCHITECTURE_OPTIONS]


def run_args(*overrides: str) -> list[str]:
    """tiny_run with character tokens on DEVICE, then each key=value override."""
    return tiny_run({"tokenizer": "char", "train.device": DEVICE.type}, dict(override.split("=", 1) for override in overrides))


def train(workdir: Path, run: str, *args: str) -> str:
    """train.py with args, its run dir workdir/run; what it printed. It must finish, on DEVICE."""
    result = run_cli("train.py", *args, f"hydra.run.dir={run}", cwd=workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"| device: {DEVICE}" in result.stdout, result.stdout
    return result.stdout


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory) -> Path:
    """One data.cache_dir for every run here: the stories are tokenized once."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def device_run(tmp_path_factory, data_cache) -> Path:
    """TINY_RUN trained on DEVICE: 20 steps, with its attention maps, probes, samples and
    checkpoints at steps 0, 10 and 20. The tests that read it copy it before they change it."""
    workdir = tmp_path_factory.mktemp("device_run")
    train(workdir, "run", *run_args(f"data.cache_dir={data_cache}"))
    return workdir / "run"


@pytest.fixture
def full_fp32_matmuls() -> Iterator[None]:
    """fp32 matmuls in full precision during the test, as a fresh `python sample.py` has them: code
    that builds a run in this process (training/build.py) turns CUDA's to TF32 and leaves them so."""
    with fp32_matmuls("highest"):
        yield


def skip_without_compiler(key: str, cpp_wrapper: bool = False) -> None:
    """Skips the test where the CLI would refuse key=true for want of a compiler (runtime/devices.py)."""
    try:
        check_compiler(key, DEVICE, Machine.this_one(), cpp_wrapper=cpp_wrapper)
    except UserError as refusal:
        pytest.skip(str(refusal))


# 1. Mixed precision tracks fp32.

PRECISION_RUN = ["train.max_steps=50", "train.eval_interval=10", "train.eval_iters=4", "train.log_interval=5",
                 "train.attn_log_interval=0", "train.sample_interval=0"]


@pytest.fixture(scope="module")
def curves_by_dtype(tmp_path_factory, data_cache) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Every logged scalar of the same 50-step run on DEVICE in fp32, bf16 and fp16."""
    workdir = tmp_path_factory.mktemp("dtypes")
    for dtype in ("fp32", "bf16", "fp16"):
        train(workdir, dtype, *run_args(*PRECISION_RUN, f"train.dtype={dtype}", f"data.cache_dir={data_cache}"))
    return {dtype: curves(read_events(workdir / dtype)) for dtype in ("fp32", "bf16", "fp16")}


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_bf16_and_fp16_runs_on_cuda_track_the_fp32_run_within_3_percent_and_learn(curves_by_dtype, dtype):
    fp32, mixed = curves_by_dtype["fp32"], curves_by_dtype[dtype]
    for tag in ("loss/train", "loss/val", "train/batch_loss"):  # evaluations at 0, 10, ..., 50; batch losses every 5
        assert [step for step, _ in mixed[tag]] == [step for step, _ in fp32[tag]], tag
        for (step, ours), (_, reference) in zip(mixed[tag], fp32[tag], strict=True):
            assert ours == pytest.approx(reference, rel=0.03), f"{tag} at step {step}"  # 0.1% apart on a CPU
    assert mixed["loss/val"][-1][1] < 0.75 * mixed["loss/val"][0][1]  # it learned: about 3.9 -> 2.6


# 2. fp16's loss scaling on the GPU.

@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_an_fp16_overflow_on_cuda_skips_the_update_halves_the_scale_and_the_scale_regrows(optimizer):
    step = train_step("fp16", optimizer, growth_interval=3, device=DEVICE)  # adamw: fused AdamW on CUDA
    assert next(step.model.parameters()).device.type == DEVICE.type
    assert_an_overflow_changes_nothing_halves_the_scale_and_it_regrows(step)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_bf16_step_on_cuda_queues_its_work_without_waiting_and_its_numbers_read_late_are_the_same(optimizer):
    """The default policy (no fp16 loss scale; a NaN stops the run): the host queues a step and the
    next without waiting for the GPU once, and each step's loss and gradient norm, read afterwards,
    are those of the same steps read at once (skip_nonfinite=true reads before it updates)."""
    late, at_once = train_step("bf16", optimizer, device=DEVICE), train_step("bf16", optimizer, device=DEVICE)
    at_once.skip_nonfinite = True
    late_rng, at_once_rng = np.random.default_rng(1), np.random.default_rng(1)
    for step in (late, at_once):  # the first step makes the optimizer's state and loads the kernels
        step(0, 3e-3, late_rng if step is late else at_once_rng).result()
    with host_waits_forbidden():
        queued = [late(i, 3e-3, late_rng) for i in (1, 2, 3)]
    read_late = [q.result() for q in queued]
    read_at_once = [at_once(i, 3e-3, at_once_rng).result() for i in (1, 2, 3)]
    assert [q.number for q in queued] == [2, 3, 4]
    for a, b in zip(read_late, read_at_once, strict=True):
        assert a.updated and b.updated and a.loss == pytest.approx(b.loss, rel=1e-3)
        assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-2)


@contextmanager
def host_waits_forbidden() -> Iterator[None]:
    """On CUDA, any operation that makes the host wait for the GPU raises (on the CPU: nothing to check)."""
    if DEVICE.type != "cuda":
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


# 3. The two attention paths on the GPU.

@pytest.mark.parametrize("options", ARCHITECTURE_OPTIONS, ids=OPTION_IDS)
def test_manual_attention_equals_sdpa_on_cuda_in_the_logits_and_every_gradient(options, full_fp32_matmuls):
    # 80 tokens: no multiple of the fused kernels' tile sizes (32, 64, 128), so a tile is cut short.
    manual = tiny_gpt(block_size=80, attention="manual", **options).to(DEVICE)
    sdpa = tiny_gpt(block_size=80, attention="sdpa", **options).to(DEVICE)
    sdpa.load_state_dict(manual.state_dict())
    generator = torch.Generator().manual_seed(0)
    idx, targets = (torch.randint(0, 65, (2, 80), generator=generator).to(DEVICE) for _ in range(2))
    (logits_manual, loss_manual), (logits_sdpa, loss_sdpa) = manual(idx, targets), sdpa(idx, targets)
    assert logits_sdpa.device.type == DEVICE.type
    # fp32 both ways: the fused kernels sum in another order, about 1e-7 apart (tests/test_model.py's tolerance).
    torch.testing.assert_close(logits_sdpa, logits_manual, atol=1e-5, rtol=1e-4)
    loss_manual.backward()
    loss_sdpa.backward()
    for (name, a), (_, b) in zip(manual.named_parameters(), sdpa.named_parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=f"gradient of {name}")


# 4. Cached and compiled decoding on the GPU.

def lively_gpt(**options) -> torch.nn.Module:
    """A tiny_gpt made lively (tests/helpers.py), on DEVICE: its matrices drawn from N(0, 0.5),
    so that the greedy tokens depend on the context (a wrong key shows), and the likeliest two
    logits are seldom as close as two ways of computing them in fp32 can differ (about 1e-5 at
    these logits' ~10; the 1% closest pairs here are 0.02 apart)."""
    return lively(tiny_gpt(block_size=16, **options)).to(DEVICE)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
@pytest.mark.parametrize("options", ARCHITECTURE_OPTIONS, ids=OPTION_IDS)
def test_cached_generation_on_cuda_gives_the_tokens_of_recomputing_the_window(options, temperature, full_fp32_matmuls):
    # 4 prompt tokens and 40 new ones with block_size 16: the window slides (or a ring cache wraps) several times.
    model = lively_gpt(**options)
    prompt = torch.randint(0, 65, (2, 4), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    cached, recomputed = (
        generate_tokens(model, prompt, 40, temperature=temperature, use_kv_cache=use_kv_cache,
                        generator=torch.Generator(DEVICE).manual_seed(5))  # the noise drawn on the device
        for use_kv_cache in (True, False))
    assert cached.device.type == DEVICE.type
    assert torch.equal(cached, recomputed)
    assert len(set(cached[:, 4:].flatten().tolist())) > 5  # not a token or two over and over


@pytest.mark.compile
def test_the_compiled_decode_step_on_cuda_gives_the_eager_tokens(full_fp32_matmuls):
    # Today's small model (rope, qk_norm, SwiGLU, 4 query heads sharing 2 key/value heads, a window
    # of 5), one row as sample.py's default num_samples=1 runs it (its one-row matmuls decomposed):
    # 40 new tokens wrap the ring caches many times.
    skip_without_compiler("compile", cpp_wrapper=INDUCTOR_OPTIONS["cpp_wrapper"])
    model = lively_gpt(pos="rope", norm="rmsnorm", mlp="swiglu", qk_norm=True, n_head=4, n_kv_head=2, window=5)
    prompt = torch.randint(0, 65, (1, 4), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    try:
        step = CompiledDecodeStep(model, batch_size=1, temperature=0.0, top_k=None, top_p=None)
        compiled = generate_tokens(model, prompt, 40, temperature=0.0, decode_step=step)
    except Exception as error:
        if "CUDA_HOME" not in "".join(traceback.format_exception(error)):
            raise
        # Inductor's C++ wrapper includes the CUDA toolkit's headers; a pip-only install has none.
        pytest.skip("the compiled decode step on CUDA needs the CUDA toolkit (CUDA_HOME), which this machine "
                    "lacks: sample.py compile=true fails here too, and check_compiler does not say so")
    assert torch.equal(compiled, generate_tokens(model, prompt, 40, temperature=0.0))  # eager, cached
    assert torch.equal(compiled, generate_tokens(model, prompt, 40, temperature=0.0, use_kv_cache=False))
    assert len(set(compiled[0, 4:].tolist())) > 5


@pytest.mark.compile
def test_the_compiled_decode_step_on_cuda_builds_with_tf32_matmuls_on_as_train_py_leaves_them():
    # After training in the same process (a notebook, the tab beside a run) CUDA's fp32 matmuls
    # are TF32 (training/build.py). Inductor's pattern matcher then swapped the step's attention
    # for a fused kernel that cannot take the slot count read at run time: the build stopped.
    skip_without_compiler("compile", cpp_wrapper=INDUCTOR_OPTIONS["cpp_wrapper"])
    model = lively_gpt(pos="rope", norm="rmsnorm", mlp="swiglu", qk_norm=True, n_head=4, n_kv_head=2, window=5)
    prompt = torch.randint(0, 65, (2, 4), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    with fp32_matmuls("high"):
        step = CompiledDecodeStep(model, batch_size=2, temperature=0.0, top_k=None, top_p=None)
        compiled = generate_tokens(model, prompt, 40, temperature=0.0, decode_step=step)
        eager = generate_tokens(model, prompt, 40, temperature=0.0)
    # TF32 rounds both paths' matmuls, each its own way: the first tokens agree, the rest may part.
    assert torch.equal(compiled[:, :14], eager[:, :14])
    assert len(set(compiled[0, 4:].tolist())) > 5


# 5. Resuming on the GPU.

# 20 steps at a constant lr (so that a 10-step run is the first half of a 20-step one), with
# dropout (so the GPU's RNG matters), every job on at steps 0, 10 and 20, the loss logged every step.
RESUMED_RUN = ["train.log_interval=1", "model.dropout=0.1", "optim.warmup_steps=0", "optim.min_lr=1e-2"]


def first_difference(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> str:
    """Where two (step, value) curves first part, and by how much at most."""
    apart = [(step, abs(x - y)) for (step, x), (_, y) in zip(a, b, strict=True) if x != y]
    if not apart:
        return "bitwise equal"
    return f"first differ at step {apart[0][0]}, by at most {max(gap for _, gap in apart):.3g}"


def test_a_run_resumed_on_cuda_gives_the_losses_of_the_run_left_alone(tmp_path, data_cache):
    args = run_args(*RESUMED_RUN, f"data.cache_dir={data_cache}")
    train(tmp_path, "alone", *args)
    train(tmp_path, "split", *args, "train.max_steps=10")
    resumed = run_cli("train.py", "resume=split", "train.max_steps=20", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming split at step 10; train.max_steps 10 -> 20" in resumed.stdout
    alone, split = curves(read_events(tmp_path / "alone")), curves(read_events(tmp_path / "split"))
    assert [step for step, _ in split["train/batch_loss"]] == list(range(1, 21))  # every step once
    bitwise = {}
    for tag in ("train/batch_loss", "loss/train", "loss/val"):
        assert [step for step, _ in split[tag]] == [step for step, _ in alone[tag]], tag
        bitwise[tag] = first_difference(split[tag], alone[tag])
        gaps = [abs(x - y) for (_, x), (_, y) in zip(split[tag], alone[tag], strict=True)]
        assert max(gaps) <= 1e-6, f"{tag}: {bitwise[tag]}"
    a, b = Checkpoint.load(tmp_path / "alone" / "ckpt_last.pt"), Checkpoint.load(tmp_path / "split" / "ckpt_last.pt")
    assert a.step == b.step == 20
    bitwise["weights"] = "bitwise equal" if all(torch.equal(a.model[k], b.model[k]) for k in a.model) else "not bitwise"
    print(f"\nresume on {DEVICE}: " + "; ".join(f"{tag}: {said}" for tag, said in bitwise.items()))


# 6. torch.compile on the GPU.

@pytest.mark.compile
def test_a_compiled_run_on_cuda_learns_what_the_eager_run_learns(tmp_path, data_cache):
    skip_without_compiler("train.compile")
    args = run_args("train.attn_log_interval=0", "train.sample_interval=0", f"data.cache_dir={data_cache}")
    train(tmp_path, "eager", *args)
    said = train(tmp_path, "compiled", *args, "train.compile=true")
    assert "train.compile=true: the first training step and the first evaluation compile first" in said
    eager, compiled = curves(read_events(tmp_path / "eager")), curves(read_events(tmp_path / "compiled"))
    for tag in ("loss/train", "loss/val"):  # evaluations at 0, 10, 20
        assert [step for step, _ in compiled[tag]] == [0, 10, 20]
        for (step, ours), (_, reference) in zip(compiled[tag], eager[tag], strict=True):
            # The same model; only the kernels differ (fp32 on a CPU: 2e-3 apart; bf16 on a GPU rounds more).
            assert ours == pytest.approx(reference, rel=0.02), f"{tag} at step {step}"
    assert compiled["loss/val"][-1][1] < compiled["loss/val"][0][1] - 0.5  # and it learned
    saved = Checkpoint.load(tmp_path / "compiled" / "ckpt_last.pt").model
    assert not any(key.startswith("_orig_mod") for key in saved)  # plain weights that sample.py loads


# 7. A checkpoint between the GPU and the CPU.

def test_a_checkpoint_saved_on_cuda_samples_on_the_cpu_and_resumes_on_cuda(device_run, tmp_path, full_fp32_matmuls):
    run = tmp_path / "run"
    shutil.copytree(device_run, run)
    saved = Checkpoint.load(run / "ckpt_last.pt")
    assert all(("cuda" in rng) == (DEVICE.type == "cuda") for rng in saved.run_state["rng"])  # the GPU's RNG kept

    prompt = "Once upon a time"
    greedy = [f"run={run / 'ckpt_last.pt'}", f"prompt={prompt}", "max_new_tokens=20", "temperature=0", "dtype=fp32"]
    on_cpu = run_cli("sample.py", *greedy, "device=cpu", cwd=tmp_path)
    assert on_cpu.returncode == 0, on_cpu.stderr
    assert on_cpu.stdout.startswith(prompt) and len(on_cpu.stdout) >= len(prompt) + 21  # 20 new characters, a newline
    on_device = run_cli("sample.py", *greedy, f"device={DEVICE.type}", cwd=tmp_path)
    assert on_device.returncode == 0, on_device.stderr
    assert on_device.stdout == on_cpu.stdout  # the same weights, read on either device

    resumed = run_cli("train.py", "resume=run", "train.max_steps=30", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming run at step 20; train.max_steps 20 -> 30" in resumed.stdout
    assert f"| device: {DEVICE}" in resumed.stdout  # the run's own train.device, from its checkpoint
    assert Checkpoint.load(run / "ckpt_last.pt").step == 30
    losses = curves(read_events(run))
    assert [step for step, _ in losses["loss/val"]] == [0, 10, 20, 30]
    assert all(math.isfinite(value) for _, value in losses["loss/val"])


# 8. The Attention tab on a run trained on the GPU.

@contextmanager
def tensorboard_in_process(logdir: Path, **flags) -> Iterator[str]:
    """A real TensorBoard server on 127.0.0.1, in this process, with the Attention tab loaded by
    hand rather than found through its entry point (which needs the project installed); yields its
    base URL. The event files are read once, before it serves."""
    board = program.TensorBoard(plugins=[core_plugin.CorePluginLoader(), AttentionLoader()])
    board.configure(logdir=str(logdir), host="127.0.0.1", port=0, load_fast="false", reload_interval=0,
                    reload_task="blocking", **flags)
    server = board._make_server()  # launch() would serve on a thread that nothing can stop
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.get_url().rstrip("/")
    finally:
        server.shutdown()
        server.server_close()


def assert_attention_weights(weights: np.ndarray) -> None:
    """(L, H, T, T) causal attention weights, as float16 sends them: finite, nothing on later tokens,
    each row summing to 1 (within float16's rounding of T numbers)."""
    T = weights.shape[-1]
    assert np.isfinite(weights).all()
    assert not weights[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]].any()
    np.testing.assert_allclose(weights.astype(np.float32).sum(-1), 1.0, atol=1e-2)


def test_the_attention_tab_reads_a_run_trained_on_cuda_and_runs_its_model_there(device_run, tmp_path,
                                                                                 full_fp32_matmuls):
    shutil.copytree(device_run, tmp_path / "logs" / "run")
    threads = torch.get_num_threads()  # the tab's model cache sets 1 for its process: this one
    try:
        with tensorboard_in_process(tmp_path / "logs", attention_tab_device=str(DEVICE)) as base:
            (listed,) = attention_runs(base)
            assert (listed["run"], listed["steps"], listed["shape"]) == ("run", [0, 10, 20], [2, 2, 24, 24])
            with urllib.request.urlopen(f"{base}/data/plugin/{PLUGIN_NAME}/weights?run=run&step=20") as response:
                logged = np.frombuffer(response.read(), dtype="<f2").reshape(2, 2, 24, 24)
            assert_attention_weights(logged)  # drawn by the run on DEVICE at step 20

            text = "Once upon a time there was"
            form = urllib.parse.urlencode({"run": "run", "text": text}).encode()
            with urllib.request.urlopen(f"{base}/data/plugin/{PLUGIN_NAME}/text", data=form) as response:
                answer = json.load(response)  # the run's checkpoint's model, on DEVICE
    finally:
        torch.set_num_threads(threads)
    T = len(text) + 1  # characters, after <|endoftext|>
    best = Checkpoint.load(tmp_path / "logs" / "run" / "ckpt_best.pt").step
    assert (answer["checkpoint"], answer["step"], answer["shape"]) == ("ckpt_best.pt", best, [2, 2, T, T])
    on_device = np.frombuffer(base64.b64decode(answer["weights"]), dtype="<f2").reshape(2, 2, T, T)
    assert_attention_weights(on_device)
    cpu_answer = ModelCache(2**30, "cpu").ask(tmp_path / "logs" / "run", "run", None,
                                             lambda loaded: text_answer("run", loaded, text, []))
    on_cpu = np.frombuffer(base64.b64decode(cpu_answer["weights"]), dtype="<f2").reshape(2, 2, T, T)
    np.testing.assert_allclose(on_device, on_cpu, atol=1e-3)  # one float16 step apart at most
    for key in ("probs", "loss"):  # the top-5 next characters' probabilities, and the loss of each next one
        np.testing.assert_allclose(answer["next"][key], cpu_answer["next"][key], atol=1e-4, err_msg=key)
