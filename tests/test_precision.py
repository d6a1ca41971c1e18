"""train.dtype=fp16 on a CPU: its loss scaling (torch.amp.GradScaler) skips an overflowing
update, lowers and regrows the scale, stops once the scale collapses, tracks fp32, and resumes
exactly, with AdamW and with Muon."""

import contextlib
import math

import numpy as np
import pytest
import torch

from cli.config import plain_config
from cli.run_spec import run_spec
from model import GPT, GPTConfig
from model_io.checkpoint import Checkpoint
from runtime.devices import Machine
from runtime.precision import AUTOCAST_DTYPE_IN_CACHE_KEY, Precision
from runtime.ranks import Ranks
from tests.helpers import GPT2_BLOCKS, ROOT, optim_spec, read_events, run_cli, tiny_config, tiny_run
from training.build import build_data_and_model, build_run, restore
from training.fit import fit
from training.optimizer import build_optimizer
from training.specs import StepSpec
from training.state import TrainState
from training.step import TrainStep
from user_error import UserError

CPU = torch.device("cpu")
OPTIMIZERS = ("adamw", "muon")


def train_step(dtype: str, optimizer: str, growth_interval: int = 2000, device: torch.device = CPU) -> TrainStep:
    """A 2-layer model on a stream it can learn (a random run of 97 tokens, repeated), its step
    in dtype with optimizer, on device (tests/test_cuda.py takes it to the GPU)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=2, n_embd=32)).to(device)
    tokens = np.tile(np.random.default_rng(0).integers(0, 64, size=97), 40).astype(np.uint16)
    optimizers = build_optimizer(model, optim_spec(name=optimizer), device)
    precision = Precision(dtype, device, growth_interval=growth_interval)
    ranks = Ranks(rank=0, local_rank=0, world_size=1, device=device)
    spec = StepSpec(batch_size=8, block_size=32, grad_accum_steps=1, grad_clip=1.0, skip_nonfinite=False)
    return TrainStep(spec, model, model, None, optimizers, precision, ranks, tokens, last_checkpoint=ROOT / "no-such.pt")


def snapshot(step: TrainStep) -> list[torch.Tensor]:
    """Every weight and every optimizer state tensor (moments, momenta, step counts), copied."""
    states = [value for optimizer in step.optimizer.optimizers for state in optimizer.state.values()
              for value in state.values()]
    return [t.detach().clone() for t in [*step.model.parameters(), *states]]


def test_fp16_runs_on_a_cpu_with_a_warning_and_fp32_and_bf16_have_no_loss_scale():
    fp16 = Precision("fp16", CPU)
    assert fp16.scaler.is_enabled() and fp16.loss_scale == 2.0**16  # GradScaler's starting scale
    assert fp16.warning.startswith("train.dtype=fp16 on a CPU: slower than fp32")
    assert Precision("fp32", CPU).loss_scale is None and Precision("bf16", CPU).loss_scale is None
    with fp16.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float16


def test_bf16_on_a_cpu_warns_only_without_bf16_in_hardware_and_fp16_warns_on_every_cpu():
    without, with_bf16 = Machine(cpu_bf16=False), Machine(cpu_bf16=True)  # Machine.cpu_bf16: AVX-512 BF16 or AMX
    assert Precision.for_run("bf16", CPU, without).warning.startswith("train.dtype=bf16 on a CPU without AVX-512 BF16 or AMX")
    assert Precision.for_run("bf16", CPU, with_bf16).warning is None
    assert Precision.for_run("fp16", CPU, with_bf16).warning.startswith("train.dtype=fp16 on a CPU")
    assert Precision.for_run("auto", CPU, without).warning is None  # auto's fp32


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_an_overflowing_fp16_step_changes_nothing_halves_the_scale_and_the_scale_regrows(optimizer):
    assert_an_overflow_changes_nothing_halves_the_scale_and_it_regrows(train_step("fp16", optimizer, growth_interval=3))


def assert_an_overflow_changes_nothing_halves_the_scale_and_it_regrows(step: TrainStep) -> None:
    """step: fp16 with a growth interval of 3 (here, and on the GPU in tests/test_cuda.py)."""
    rng = np.random.default_rng(1)
    for i in range(2):  # a scale that fits: updates happen, and the optimizers hold state
        assert step(i, 3e-3, rng).result().updated
    step.precision.scaler.update(new_scale=2.0**30)  # far past fp16's 65504 for these gradients
    before = snapshot(step)
    result = step(2, 3e-3, rng).result()
    assert not result.updated and not math.isfinite(result.grad_norm) and math.isfinite(result.loss)
    assert result.loss_scale == 2.0**29
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(step), strict=True))  # weights and state as they were

    scale, streak, grew = result.loss_scale, 0, False
    for i in range(3, 40):  # halving from 2**29 until the scale fits, then a mix of growth and overflow
        before = snapshot(step)
        result = step(i, 3e-3, rng).result()
        changed = any(not torch.equal(a, b) for a, b in zip(before, snapshot(step), strict=True))
        assert changed == result.updated == math.isfinite(result.grad_norm), f"step {i}"
        streak = streak + 1 if result.updated else 0
        expected = scale * 2 if streak == 3 else scale if result.updated else scale / 2
        assert result.loss_scale == expected, f"step {i}"
        grew, scale, streak = grew or streak == 3, result.loss_scale, streak % 3
    assert grew and scale <= 2.0**21  # it came down from 2**29, and went up again at least once


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_fp16_training_tracks_fp32_within_0_005_of_the_loss_over_30_steps(optimizer):
    fp32, fp16 = train_step("fp32", optimizer), train_step("fp16", optimizer)
    rng32, rng16 = np.random.default_rng(2), np.random.default_rng(2)
    pairs = [(fp32(i, 3e-3, rng32).result(), fp16(i, 3e-3, rng16).result()) for i in range(30)]
    assert all(b.updated for _, b in pairs)  # 2**16 fits this model: no step skipped
    assert max(abs(a.loss - b.loss) for a, b in pairs) < 0.005  # 1e-4 seen
    assert all(b.grad_norm == pytest.approx(a.grad_norm, rel=0.01) for a, b in pairs)  # unscaled: true gradients (5e-4 seen)
    assert pairs[-1][1].loss < pairs[0][1].loss - 0.5  # and it learns


def test_fp16_stops_naming_the_step_once_an_overflow_takes_the_loss_scale_below_1():
    """MIN_LOSS_SCALE = 1: a scale of 1 still trains, the overflow that halves it to 0.5 stops the
    run (from the starting 2**16, the 17th update skipped in a row)."""
    step = train_step("fp16", "adamw")
    # Every gradient overflows, at any scale, while the loss stays finite: fp16 has no room for it.
    next(step.model.parameters()).register_hook(lambda grad: torch.full_like(grad, math.inf))
    step.precision.scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    rng = np.random.default_rng(1)
    for i, scale in enumerate((2.0, 1.0)):
        result = step(i, 3e-3, rng).result()
        assert not result.updated and math.isfinite(result.loss) and result.loss_scale == scale
    with pytest.raises(UserError, match=r"^fp16's loss scale fell to 0.5 at step 3: the gradients overflow fp16 even "
                                        r"unscaled, so every update is skipped; stopped without saving"):
        step(2, 3e-3, rng)


def fp16_run(workdir, max_steps: int, scale: float = 2.0**22):
    """An fp16 run of the tiny config at a constant lr, with a loss scale that starts too high and
    regrows after 3 updates, so that it moves during the run."""
    cfg = tiny_config(**{"data.cache_dir": workdir.parent / "cache", "train.dtype": "fp16", "train.max_steps": max_steps,
                         "train.eval_interval": 8, "train.log_interval": 1, "optim.warmup_steps": 0, "optim.min_lr": "1e-2"})
    spec = run_spec(cfg)
    run = build_run(spec, plain_config(cfg), workdir, *build_data_and_model(spec))
    run.precision.scaler = torch.amp.GradScaler("cpu", init_scale=scale, growth_interval=3)
    return run


@pytest.mark.slow
def test_an_fp16_run_counts_its_overflows_logs_its_scale_and_resumes_bitwise(tmp_path):
    alone = fp16_run(tmp_path / "alone", max_steps=16)
    figures = fit(alone, TrainState())
    events = read_events(tmp_path / "alone")
    scales = [e.value for e in events.Scalars("train/loss_scale")]
    drops = sum(b < a for a, b in zip([2.0**22, *scales], scales, strict=False))
    assert drops >= 2 and figures.skipped == drops == events.Scalars("train/skipped_nonfinite")[-1].value
    assert max(scales) > min(scales[:-3])  # it grew back too

    first = fp16_run(tmp_path / "split", max_steps=8)
    fit(first, TrainState())
    second = fp16_run(tmp_path / "split", max_steps=16, scale=2.0**16)  # restore() must bring the saved scaler back
    saved = Checkpoint.load(tmp_path / "split" / "ckpt_last.pt")
    fit(second, restore(second, saved))
    assert saved.run_state["grad_scaler"]["scale"] == scales[7]  # the scale the run had after step 8
    assert second.precision.scaler.state_dict() == alone.precision.scaler.state_dict()
    for a, b in zip(alone.model.parameters(), second.model.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_train_py_runs_fp16_on_a_cpu_and_says_so(tmp_path):
    result = run_cli("train.py", *tiny_run(**{"train.device": "cpu", "train.max_steps": 4, "train.dtype": "fp16",
                                                "hydra.run.dir": "run"}), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "warning: train.dtype=fp16 on a CPU" in result.stdout + result.stderr
    assert "precision: fp16 (train.dtype=fp16)" in result.stdout + result.stderr
    assert Checkpoint.load(tmp_path / "run" / "ckpt_last.pt").run_state["grad_scaler"]["scale"] == 2.0**16


def aotautograd_cache_flags_put_back() -> contextlib.AbstractContextManager:
    """The flags Precision.before_compiling sets, as they are now again once the block ends."""
    config = torch._functorch.config
    return config.patch(enable_autograd_cache=config.enable_autograd_cache,
                        enable_remote_autograd_cache=config.enable_remote_autograd_cache)


@pytest.mark.compile
@pytest.mark.skipif(torch.__version__ >= AUTOCAST_DTYPE_IN_CACHE_KEY,
                    reason="from torch 2.13 AOTAutograd's cache keys on the autocast dtype itself: nothing of ours to check")
def test_a_compiled_run_in_fp16_after_one_in_bf16_computes_in_fp16(tmp_path):
    # Before torch 2.13, AOTAutograd's cache served the bf16 run's graph to the fp16 one, in one
    # process and across processes (runtime/precision.py, AUTOCAST_DTYPE_IN_CACHE_KEY). The graph's
    # logits show which precision it computed in. Runs where torch is older (the GPU machines' 2.11);
    # the next test checks the decision on any torch. GPT-2's blocks: the default model's QK-norm
    # casts back to its input's dtype (GainDtypeRMSNorm), which names bf16 or fp16 in the graph
    # itself, so the default model's two graphs differ and never met the bug.
    with aotautograd_cache_flags_put_back():
        for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
            torch._dynamo.reset()  # nothing compiled in memory: what a new process finds, the caches on disk aside
            cfg = tiny_config(GPT2_BLOCKS, **{"data.cache_dir": tmp_path / "cache", "train.dtype": name, "train.compile": True})
            spec = run_spec(cfg)
            run = build_run(spec, plain_config(cfg), tmp_path / name, *build_data_and_model(spec))
            ids = torch.zeros(2, spec.model.block_size, dtype=torch.long, device=run.ranks.device)  # the GPU where there is one
            with run.precision.autocast():
                logits, loss = run.step_model(ids, ids)
            loss.backward()
            assert logits.dtype == dtype, f"train.dtype={name} compiled a graph that computes in {logits.dtype}"
    torch._dynamo.reset()


def test_before_torch_2_13_compiling_under_autocast_turns_aotautograds_cache_off(monkeypatch):
    with aotautograd_cache_flags_put_back():
        for version, name, cache_on in (("2.13.0", "fp16", True), ("2.12.1", "fp32", True), ("2.12.1", "bf16", False),
                                        ("2.11.0+cu130", "fp16", False)):
            monkeypatch.setattr(torch, "__version__", torch.torch_version.TorchVersion(version))
            torch._functorch.config.enable_autograd_cache = True
            Precision(name, CPU).before_compiling()
            assert torch._functorch.config.enable_autograd_cache is cache_on, (version, name)
