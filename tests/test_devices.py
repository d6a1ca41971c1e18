"""The device, precision and compiler decisions (runtime/devices.py, runtime/precision.py),
machine by machine: the machines these tests run on have no GPU, no Mac and a compiler, so each
decision is checked as the function of a Machine it is, and what this machine can show (no
compiler on PATH) is shown for real. Plus a walk of the source for torch.cuda and torch.mps calls
that no check for that backend guards."""

import ast
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from runtime.devices import Machine, check_compiler, find_compiler, is_out_of_memory, memory_bytes, pick_device
from runtime.precision import choose_dtype, weights_dtype
from tests.helpers import ROOT, run_cli, tiny_run
from user_error import UserError

CPU_ONLY = Machine(cxx="/usr/bin/g++", cc="/usr/bin/gcc")
A100 = Machine(cuda_count=2, cuda_name="A100", cuda_bf16=True, cxx="/usr/bin/g++", cc="/usr/bin/gcc")
T4 = Machine(cuda_count=1, cuda_name="T4", cuda_bf16=False, cc="/usr/bin/gcc")
MAC_14 = Machine(mps=True, macos=(14, 2), cxx="/usr/bin/clang++")
MAC_13 = Machine(mps=True, macos=(13, 6), cxx="/usr/bin/clang++")
INTEL_MAC = Machine(macos=(12, 7))  # no MPS, no compiler

DEVICES = [  # machine, train.device, world size, local rank -> the device, or the start of the refusal
    (A100, "auto", 1, 0, "cuda"),
    (A100, "auto", 2, 1, "cuda:1"),
    (A100, "cuda", 2, 1, "cuda:1"),
    (A100, "cuda:1", 1, 0, "cuda:1"),
    (A100, "cpu", 1, 0, "cpu"),
    (A100, "cuda:2", 1, 0, "train.device=cuda:2 but only 2 CUDA GPU(s) are visible"),
    (A100, "cuda:0", 2, 0, "train.device=cuda:0 names one GPU, but torchrun started 2 processes"),
    (A100, "auto", 4, 3, "train.device=auto but only 2 CUDA GPU(s) are visible to local rank 3"),
    (A100, "mps", 1, 0, "train.device=mps but PyTorch sees no Apple GPU (MPS) here"),
    (Machine(cuda_count=1, mps=True), "auto", 1, 0, "cuda"),  # no such machine yet: the order, cuda first
    (MAC_14, "auto", 1, 0, "mps"),
    (MAC_14, "mps", 1, 0, "mps"),
    (MAC_14, "mps:0", 1, 0, "mps:0"),
    (MAC_14, "auto", 2, 0, "cpu"),  # gloo reduces CPU tensors: torchrun on a Mac runs on its CPU
    (MAC_14, "mps", 2, 0, "train.device=mps runs one process, but torchrun started 2"),
    (MAC_14, "mps:1", 1, 0, "train.device=mps:1: a Mac has one GPU"),
    (MAC_14, "cuda", 1, 0, "train.device=cuda but PyTorch sees no CUDA GPU here"),
    (INTEL_MAC, "auto", 1, 0, "cpu"),
    (CPU_ONLY, "auto", 1, 0, "cpu"),
    (CPU_ONLY, "auto", 2, 1, "cpu"),
    (CPU_ONLY, "gpu", 1, 0, "train.device=gpu is not a device; use auto, cpu, cuda, cuda:<index> or mps"),
    (CPU_ONLY, "meta", 1, 0, "train.device=meta is not a device"),
]


@pytest.mark.parametrize(("machine", "name", "world_size", "local_rank", "expected"), DEVICES)
def test_each_machine_gets_the_device_its_option_names_or_one_line_why_not(machine, name, world_size, local_rank, expected):
    if expected.startswith("train.device"):
        with pytest.raises(UserError, match="^" + re.escape(expected)):
            pick_device(name, machine, local_rank, world_size)
    else:
        assert pick_device(name, machine, local_rank, world_size) == torch.device(expected)


DTYPES = [  # machine, device, train.dtype -> the precision and the start of why, or of the refusal
    (A100, "cuda", "auto", "bf16", "train.dtype=auto: the GPU (A100) computes in bf16 natively"),
    (T4, "cuda", "auto", "fp16", "train.dtype=auto: the GPU (T4) lacks native bf16"),
    (T4, "cuda", "bf16", "bf16", "train.dtype=bf16"),  # asked for: given
    (CPU_ONLY, "cpu", "auto", "fp32", "train.dtype=auto: fp32 on a CPU"),
    (A100, "cpu", "auto", "fp32", "train.dtype=auto: fp32 on a CPU"),  # train.device=cpu on a GPU machine
    (CPU_ONLY, "cpu", "fp16", "fp16", "train.dtype=fp16"),
    (MAC_14, "mps", "auto", "fp32", "train.dtype=auto: fp32 on Apple's MPS"),
    (MAC_14, "mps", "bf16", "bf16", "train.dtype=bf16"),
    (MAC_13, "mps", "fp16", "fp16", "train.dtype=fp16"),
    (MAC_13, "mps", "bf16", None, "train.dtype=bf16 on Apple's MPS needs macOS 14 or later, and this is macOS 13.6"),
    (MAC_13, "cpu", "bf16", "bf16", "train.dtype=bf16"),  # the Mac's CPU: no MPS autocast involved
]


@pytest.mark.parametrize(("machine", "device", "requested", "name", "why"), DTYPES)
def test_train_dtype_auto_picks_bf16_fp16_or_fp32_by_the_machine_and_says_why(machine, device, requested, name, why):
    if name is None:
        with pytest.raises(UserError, match="^" + re.escape(why)):
            choose_dtype(requested, torch.device(device), machine)
    else:
        chosen, reason = choose_dtype(requested, torch.device(device), machine)
        assert chosen == name and reason.startswith(why)


AVX512_BF16 = Machine(cpu_bf16=True, cxx="/usr/bin/g++")
SAMPLING_DTYPES = [  # machine, device, sample.py's dtype -> the weights' dtype (None: refused), the start of the warning or refusal
    (A100, "cuda", "auto", torch.bfloat16, None),
    (T4, "cuda", "auto", torch.float16, None),
    (CPU_ONLY, "cpu", "auto", torch.float32, None),
    (AVX512_BF16, "cpu", "auto", torch.float32, None),  # fp32 unless asked: bf16 changes the tokens
    (AVX512_BF16, "cpu", "bf16", torch.bfloat16, None),
    (CPU_ONLY, "cpu", "bf16", torch.bfloat16, "dtype=bf16 on a CPU without native bf16"),
    (CPU_ONLY, "cpu", "fp16", torch.float16, "dtype=fp16 on a CPU"),
    (MAC_14, "mps", "auto", torch.float32, None),
    (MAC_14, "mps", "bf16", torch.bfloat16, None),
    (MAC_13, "mps", "bf16", None, "dtype=bf16 on Apple's MPS needs macOS 14 or later, and this is macOS 13.6"),
    (A100, "cuda", "float32", None, "dtype=float32 is not a precision; use auto, fp32, bf16 or fp16"),
]


@pytest.mark.parametrize(("machine", "device", "requested", "dtype", "says"), SAMPLING_DTYPES)
def test_sampling_dtype_is_bf16_on_a_recent_gpu_fp32_on_a_cpu_unless_asked_and_warns_where_slow(
        machine, device, requested, dtype, says):
    if dtype is None:
        with pytest.raises(UserError, match="^" + re.escape(says)):
            weights_dtype(requested, torch.device(device), machine)
        return
    chosen, warning = weights_dtype(requested, torch.device(device), machine)
    assert chosen == dtype
    assert (warning is None) if says is None else warning.startswith(says)


COMPILERS = [  # machine, device, C++ wrapper -> the start of the refusal of compile=true, or None
    (CPU_ONLY, "cpu", False, None),
    (Machine(cc="/usr/bin/gcc"), "cpu", False, "compile=true needs a C++ compiler for Inductor's CPU kernels"),
    (T4, "cuda", False, None),  # Triton builds with a C compiler; Inductor's Python wrapper needs no C++ one
    (T4, "cuda", True, "compile=true needs a C++ compiler for the C++ code Inductor writes around the kernels"),
    (Machine(cuda_count=1, cxx="/usr/bin/g++"), "cuda", False, "compile=true needs a C compiler for Triton's GPU kernels"),
    (Machine(cuda_count=1, cxx="/usr/bin/g++"), "cpu", False, None),
    (INTEL_MAC, "cpu", False, "compile=true needs a C++ compiler"),
    (Machine(mps=True, macos=(14, 0)), "mps", False, None),  # Metal compiles Inductor's shaders itself
    (Machine(mps=True, macos=(14, 0)), "mps", True, "compile=true needs a C++ compiler for the C++ code"),
    (MAC_14, "mps", True, None),
]


@pytest.mark.parametrize(("machine", "device", "cpp_wrapper", "refusal"), COMPILERS)
def test_compile_needs_the_compilers_its_device_and_wrapper_compile_with(machine, device, cpp_wrapper, refusal):
    if refusal is None:
        check_compiler("compile", torch.device(device), machine, cpp_wrapper)
    else:
        with pytest.raises(UserError, match="^" + re.escape(refusal)):
            check_compiler("compile", torch.device(device), machine, cpp_wrapper)


def test_a_cxx_that_names_no_program_is_named_in_the_refusal(monkeypatch):
    monkeypatch.setenv("CXX", "/nowhere/g++")
    machine = Machine.this_one()
    assert machine.cxx is None  # CXX set: the search does not go on to PATH, as Inductor's does not
    with pytest.raises(UserError, match="^" + re.escape("compile=true needs a C++ compiler for Inductor's CPU kernels, and "
                                                        "CXX=/nowhere/g++ is no program here; install one")):
        check_compiler("compile", torch.device("cpu"), machine)


@pytest.fixture
def no_compiler_path(tmp_path, monkeypatch) -> Path:
    """PATH set to a folder holding a python and no compiler, and CC and CXX unset."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "python").symlink_to(os.path.realpath(sys.executable))
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("CC", raising=False)
    return folder


def test_this_machine_finds_a_cxx_compiler_where_inductor_finds_one(no_compiler_path, monkeypatch):
    from torch._inductor.cpp_builder import cpp_compiler_search
    from torch._inductor.exc import InvalidCxxCompiler

    # torch's own search, with its own candidates: the reference for "no compiler". It keeps its
    # last answer (lru_cache), which an earlier compile in this worker may have left: ask afresh.
    assert Machine.this_one().cxx is None and Machine.this_one().cc is None
    # Inductor read $CXX once, when it was imported; with CXX unset it reads its default, g++.
    # (Else an image that sets CXX to a full path, as one GPU machine's does, is found by it.)
    unset_cxx = (None, "clang++" if sys.platform == "darwin" else "g++")
    cpp_compiler_search.cache_clear()
    with pytest.raises(InvalidCxxCompiler):
        cpp_compiler_search(unset_cxx)
    cpp_compiler_search.cache_clear()
    real_gxx = shutil.which("g++", path=os.defpath + ":/usr/local/bin")
    if real_gxx is None:
        pytest.skip("no g++ on this machine to put back on PATH")
    (no_compiler_path / "g++").symlink_to(real_gxx)  # g++ back on PATH: both find it
    assert Machine.this_one().cxx == str(no_compiler_path / "g++")
    assert cpp_compiler_search(unset_cxx) == "g++"
    cpp_compiler_search.cache_clear()  # the g++ found on this test's PATH must not outlive it
    monkeypatch.setenv("CXX", "no-such-compiler")  # $CXX alone counts: no falling back to g++
    assert Machine.this_one().cxx is None and find_compiler("CXX", ("g++",)) is None


def test_train_py_compile_true_without_a_compiler_is_refused_in_one_line_before_any_work(tmp_path, no_compiler_path):
    # On the CPU, whose kernels the C++ compiler builds (a GPU's are Triton's, built with a C compiler).
    result = run_cli("train.py", *tiny_run(**{"train.device": "cpu", "train.compile": True, "hydra.run.dir": "run"}),
                     cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: train.compile=true needs a C++ compiler for Inductor's CPU kernels, and there is none here ($CXX, "
        "else g++ on PATH); install one (e.g. g++), point CXX at it, or run with train.compile=false"]
    assert list(tmp_path.iterdir()) == [no_compiler_path]  # nothing written: no run dir, no corpus in .cache


def test_sample_py_compile_true_without_a_compiler_is_refused_before_it_reads_the_checkpoint(tmp_path, no_compiler_path):
    result = run_cli("sample.py", "run=no-such-run", "device=cpu", "compile=true", cwd=tmp_path)  # the CPU's kernels
    assert result.returncode == 2
    assert result.stderr.startswith("error: compile=true needs a C++ compiler for Inductor's CPU kernels")
    assert "run with compile=false" in result.stderr and "no-such-run" not in result.stderr
    one_token = run_cli("sample.py", "run=no-such-run", "compile=true", "max_new_tokens=1", cwd=tmp_path)
    assert "no-such-run" in one_token.stderr  # one new token compiles nothing: no compiler needed


# A call to torch.cuda.<f> or torch.mps.<f> must sit where its backend was checked: in the body of
# an `if` (or the true side of `x if test else y`, or a later operand of `and`) whose test asserts
# the backend, or in the else branch of one whose test is `not` such a check. A test asserts CUDA
# when it is (or is an `and` with an operand that is) torch.cuda.is_available() or a comparison
# `<anything>.type == "cuda"`; MPS alike, with torch.backends.mps.is_available() and "mps".
# is_available() and device_count() are themselves the checks, safe anywhere. A module imported
# under another name (import torch.cuda as tc) is not followed.
BACKENDS = {"cuda": "torch.cuda.is_available", "mps": "torch.backends.mps.is_available"}
SAFE_ANYWHERE = {"torch.cuda.is_available", "torch.cuda.device_count", "torch.mps.device_count"}


def asserts_backend(test: ast.expr, backend: str) -> bool:
    """Whether test, when true, means the backend is there."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(asserts_backend(value, backend) for value in test.values)
    if isinstance(test, ast.Call):
        return ast.unparse(test.func) == BACKENDS[backend]
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        sides = [test.left, *test.comparators]
        return (any(isinstance(side, ast.Attribute) and side.attr == "type" for side in sides)
                and any(isinstance(side, ast.Constant) and side.value == backend for side in sides))
    return False


def denies_backend(test: ast.expr, backend: str) -> bool:
    """Whether test, when false, means the backend is there."""
    return isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and asserts_backend(test.operand, backend)


def guarded(call: ast.Call, parents: dict[ast.AST, ast.AST], backend: str) -> bool:
    node = call
    while node in parents:
        parent = parents[node]
        if isinstance(parent, ast.If | ast.IfExp):
            in_body = node in parent.body if isinstance(parent, ast.If) else node is parent.body
            in_else = node in parent.orelse if isinstance(parent, ast.If) else node is parent.orelse
            if (in_body and asserts_backend(parent.test, backend)) or (in_else and denies_backend(parent.test, backend)):
                return True
        if isinstance(parent, ast.BoolOp) and isinstance(parent.op, ast.And) and node in parent.values:
            earlier = parent.values[: parent.values.index(node)]
            if any(asserts_backend(value, backend) for value in earlier):
                return True
        node = parent
    return False


def unguarded_backend_calls(source: str, filename: str) -> list[str]:
    """'file:line torch.cuda.f' for each call of a backend's function that no check guards."""
    tree = ast.parse(source, filename)
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        for backend in BACKENDS:
            if name.startswith(f"torch.{backend}.") and name not in SAFE_ANYWHERE and not guarded(node, parents, backend):
                found.append(f"{filename}:{node.lineno} {name}")
    return found


def project_sources() -> list[Path]:
    """Every Python file of the project, its tests aside (they skip by marks, not branches), and
    nothing in a hidden folder (.venv, .git, a checkout of another project someone keeps there)."""
    skipped = {"tests", "outputs", "multirun", "node_modules"}
    parts = lambda path: path.relative_to(ROOT).parts  # noqa: E731
    return [path for path in ROOT.rglob("*.py")
            if not skipped & set(parts(path)) and not any(part.startswith(".") for part in parts(path))]


@pytest.mark.slow
def test_no_cuda_or_mps_call_runs_outside_a_branch_that_checked_for_its_backend():
    sources = project_sources()
    assert ROOT / "training" / "state.py" in sources and len(sources) > 50
    found = [line for path in sources for line in unguarded_backend_calls(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []


@pytest.mark.parametrize(("source", "unguarded"), [
    ("torch.cuda.synchronize()", True),
    ("if torch.cuda.is_available():\n    torch.cuda.synchronize()", False),
    ("if not torch.cuda.is_available():\n    torch.cuda.synchronize()", True),
    ("if not torch.cuda.is_available():\n    pass\nelse:\n    torch.cuda.synchronize()", False),
    ("if device.type == 'cuda':\n    torch.cuda.synchronize()", False),
    ("if device.type == 'mps':\n    torch.cuda.synchronize()", True),
    ("if device.type != 'cuda':\n    torch.cuda.synchronize()", True),
    ("if x or torch.cuda.is_available():\n    torch.cuda.synchronize()", True),
    ("ok = device.type == 'cuda' and torch.cuda.synchronize()", False),
    ("ok = torch.cuda.synchronize() and device.type == 'cuda'", True),
    ("n = torch.cuda.mem_get_info() if torch.cuda.is_available() else 0", False),
    ("n = 0 if torch.cuda.is_available() else torch.cuda.mem_get_info()", True),
    ("if torch.backends.mps.is_available():\n    torch.mps.synchronize()", False),
    ("if torch.cuda.is_available():\n    torch.mps.synchronize()", True),
    ("n = torch.cuda.device_count()", False),
])
def test_the_walk_tells_a_guarded_backend_call_from_an_unguarded_one(source, unguarded):
    assert bool(unguarded_backend_calls(source, "example.py")) == unguarded


def test_the_memory_a_process_may_use_is_at_most_the_machines():
    if not Path("/proc/meminfo").exists():
        pytest.skip("reads Linux's /proc/meminfo")
    total_kib = int(re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text())[1])
    assert 0 < memory_bytes() <= total_kib * 1024  # a container's limit may be less
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory")) and is_out_of_memory(MemoryError())
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"))
    assert not is_out_of_memory(RuntimeError("shapes cannot be multiplied"))
