"""torch.compile end to end: a compiled training run and sample.py's compiled decode step give what
the eager ones give, and a compile that fails inside Inductor is one line naming compile=false."""

from pathlib import Path

import pytest
import torch

from tests.helpers import NO_PROBES, assert_one_error_line, logged_losses, run_cli, spawn_cli, tiny_run

pytestmark = pytest.mark.compile  # torch.compile of a training run and of the decode step


# One layer of the default model (rotary positions, QK-norm, RMSNorm, SwiGLU), on the CPU in fp32: each
# kernel Inductor writes is a C++ compile of about 2 s on a 2-core CPU, and a second layer of the same
# operations adds 6 kernels (34 rather than 28) and 10 to 15 s to the test. (On a GPU machine auto would
# train in bf16, which rounds more than the 2e-3 below: tests/test_cuda.py compiles there.)
ONE_LAYER = {**NO_PROBES, "model.n_layer": 1, "train.device": "cpu"}


def test_a_compiled_run_learns_what_the_eager_run_learns(tmp_path):
    eager = run_cli("train.py", *tiny_run(ONE_LAYER, **{"hydra.run.dir": "eager"}), cwd=tmp_path)
    compiled = spawn_cli("train.py", *tiny_run(ONE_LAYER, **{"train.compile": True, "hydra.run.dir": "compiled"}), cwd=tmp_path,
                         timeout=600)
    assert eager.returncode == 0 and compiled.returncode == 0, compiled.stdout + compiled.stderr
    assert "train.compile=true: the first training step and the first evaluation compile first" in compiled.stdout
    eager_losses, compiled_losses = logged_losses(eager.stdout), logged_losses(compiled.stdout)
    assert len(compiled_losses) == 6  # train and val at steps 0, 10, 20
    assert compiled_losses == pytest.approx(eager_losses, abs=2e-3)  # the same model, only the kernels differ
    assert compiled_losses[-1] < compiled_losses[1] - 0.3  # and it did learn
    saved = torch.load(tmp_path / "compiled" / "ckpt_last.pt", weights_only=True)["model"]
    assert not any(key.startswith("_orig_mod") for key in saved)  # plain weights that sample.py loads


def test_sampling_with_the_compiled_decode_step_gives_the_eager_text(trained_run, tmp_path):
    # 40 new tokens after <eot> + 4 prompt tokens: past the tiny run's block_size of 32, so the
    # window slides and the compiled step goes on from caches that GPT.forward refilled. On the CPU,
    # in fp32, on every machine: on a GPU, auto's bf16 lets the kernels' rounding turn a near-tie
    # (tests/test_cuda.py compares the GPU's compiled and eager tokens).
    args = [f"run={trained_run}", "device=cpu", "prompt=Once upon a time", "max_new_tokens=40", "num_samples=2", "temperature=1", "top_k=20"]
    eager = run_cli("sample.py", *args, cwd=tmp_path)
    compiled = run_cli("sample.py", *args, "compile=true", cwd=tmp_path)
    assert eager.returncode == 0 and compiled.returncode == 0, eager.stderr + compiled.stderr
    assert compiled.stdout == eager.stdout and eager.stdout.count("Once upon a time") == 2
    assert "compile=true: compiling the decode step first" in compiled.stderr
    one_token = run_cli("sample.py", *args[:3], "max_new_tokens=1", "compile=true", cwd=tmp_path)
    assert one_token.returncode == 0 and "compil" not in one_token.stderr  # the prompt's forward makes it


def broken_compiler(folder: Path) -> dict[str, str]:
    """The environment of a C++ compiler that is there but fails (no compiler at all is refused
    before any work: tests/test_devices.py), with an empty kernel cache so that nothing compiled
    earlier is reused. Its tests run on the CPU, where that compiler builds the kernels themselves
    (on a GPU, Triton builds them)."""
    compiler = folder / "broken-g++"
    compiler.write_text("#!/bin/sh\nexit 1\n")
    compiler.chmod(0o755)
    return {"CXX": str(compiler), "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor")}


def test_a_compile_that_cannot_build_is_one_line_that_names_the_way_out(tmp_path):
    env = broken_compiler(tmp_path)  # a real failure, inside Inductor
    result = spawn_cli("train.py", *tiny_run(ONE_LAYER, **{"train.compile": True, "hydra.run.dir": "run"}),
                       cwd=tmp_path, env=env)
    assert_one_error_line(result, "error: train.compile=true: torch.compile could not build the model (")
    assert "run with train.compile=false" in result.stderr
    assert not (tmp_path / "run" / "ckpt_last.pt").exists()


def test_a_decode_step_that_cannot_compile_is_one_line_that_names_the_way_out(trained_run, tmp_path):
    env = broken_compiler(tmp_path)
    result = spawn_cli("sample.py", f"run={trained_run}", "device=cpu", "max_new_tokens=5", "compile=true", cwd=tmp_path,
                       env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr + result.stdout, result.stderr
    note, error = result.stderr.strip().splitlines()  # what it was doing, then why it stopped
    assert note.startswith("compile=true: compiling the decode step first")
    assert error.startswith("error: compile=true: Inductor could not compile the decode step (")
    assert error.endswith("run with compile=false")
