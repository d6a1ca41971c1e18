"""What this machine offers (a Machine), and the choices made from it: which device a run takes,
and whether torch.compile can run there. Each choice is a function of a Machine and the option
alone, so the paths this project's test machines lack (CUDA, Apple's MPS, no compiler) are
tested by their decisions (tests/test_devices.py); Machine.this_one() alone asks torch and PATH.
"""

import os
import platform
import shutil
import sys
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import torch

from user_error import UserError

DEVICE_TYPES = ("cpu", "cuda", "mps")


@dataclass(frozen=True)
class Machine:
    cuda_count: int = 0  # CUDA GPUs PyTorch sees
    cuda_name: str = ""  # the first one's name
    cuda_bf16: bool = False  # the first one computes in bf16 natively (compute capability 8.0 or more)
    cpu_bf16: bool = False  # the CPU multiplies bf16 in hardware (x86's AVX-512 BF16 or AMX)
    mps: bool = False  # Apple's GPU, through the MPS backend
    macos: tuple[int, ...] | None = None  # (14, 2) on macOS 14.2; None elsewhere
    cxx: str | None = None  # the C++ compiler Inductor builds CPU kernels and C++ wrappers with, if found
    cc: str | None = None  # the C compiler Triton builds its GPU kernels' launchers with, if found

    @classmethod
    def this_one(cls) -> "Machine":
        """This machine, as PyTorch and PATH see it now."""
        cuda = {}
        if torch.cuda.is_available():
            cuda = {"cuda_count": torch.cuda.device_count(), "cuda_name": torch.cuda.get_device_name(0),
                    "cuda_bf16": torch.cuda.is_bf16_supported(including_emulation=False)}
        mac = platform.mac_ver()[0]
        return cls(**cuda, cpu_bf16=cpu_multiplies_bf16(), mps=torch.backends.mps.is_available(),
                   macos=tuple(int(part) for part in mac.split(".")) if mac else None,
                   cxx=find_compiler("CXX", (INDUCTOR_CXX,)), cc=find_compiler("CC", ("gcc", "clang")))


def memory_bytes() -> int | None:
    """The memory this process may use: the machine's, or its container's limit where that is less
    (cgroup v2's memory.max, v1's memory.limit_in_bytes); None where neither can be read (Windows)."""
    known = []
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        known.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with suppress(OSError, ValueError):  # "max", no limit, is no number
            known.append(int(Path(limit).read_text().strip()))
    return min(known, default=None)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether error is an allocation that failed: a GPU's (torch.OutOfMemoryError), a CPU's
    (torch's RuntimeError "can't allocate memory", or Python's MemoryError)."""
    return isinstance(error, torch.OutOfMemoryError | MemoryError) or (
        isinstance(error, RuntimeError) and "can't allocate memory" in str(error))


def cpu_multiplies_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX-512 BF16 or AMX), from Linux's
    /proc/cpuinfo; False where there is none (macOS, Windows)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


# Where torch 2.13 looks for compilers: Inductor runs $CXX, else this one (torch/_inductor/config.py,
# cpp.cxx; its other candidate, a g++ from conda, only with TORCH_INDUCTOR_INSTALL_GXX set); Triton,
# which compiles for CUDA GPUs, runs $CC, else gcc, else clang (triton/runtime/build.py).
INDUCTOR_CXX = "cl" if sys.platform == "win32" else "clang++" if sys.platform == "darwin" else "g++"


def find_compiler(variable: str, names: tuple[str, ...]) -> str | None:
    """The compiler the environment variable names, else the first of names on PATH; None if not found."""
    for name in (os.environ[variable],) if os.environ.get(variable) else names:
        if path := shutil.which(name):
            return path
    return None


def pick_device(name: str, machine: Machine, local_rank: int = 0, world_size: int = 1,
                key: str = "train.device") -> torch.device:
    """The device option (key: train.device, or sample.py's device): auto (a CUDA GPU, else Apple's
    MPS, else the CPU), cpu, cuda, cuda:<i> or mps. Under torchrun, auto and cuda give each process
    on a machine its own GPU, cuda:LOCAL_RANK; MPS takes one process (auto falls back to the CPU)."""
    chosen = name
    if name == "auto":
        chosen = "cuda" if machine.cuda_count else "mps" if machine.mps and world_size == 1 else "cpu"
    try:
        device = torch.device(chosen)
    except RuntimeError:
        device = None
    if device is None or device.type not in DEVICE_TYPES:
        raise UserError(f"{key}={name} is not a device; use auto, cpu, cuda, cuda:<index> or mps")
    if device.type == "mps":
        if not machine.mps:
            raise UserError(f"{key}={name} but PyTorch sees no Apple GPU (MPS) here; use {key}=cpu (or auto)")
        if world_size > 1:
            raise UserError(f"{key}={name} runs one process, but torchrun started {world_size}; "
                            f"start train.py without torchrun, or use {key}=cpu under it")
        if device.index:
            raise UserError(f"{key}={name}: a Mac has one GPU, mps (or mps:0)")
        return device
    if device.type == "cuda" and not machine.cuda_count:
        raise UserError(f"{key}={name} but PyTorch sees no CUDA GPU here; use {key}=cpu (or auto)")
    if device.type == "cuda" and world_size > 1:
        if device.index is not None:
            raise UserError(f"{key}={name} names one GPU, but torchrun started {world_size} processes; "
                            f"use {key}=auto (or cuda): each process then takes GPU LOCAL_RANK")
        device = torch.device("cuda", local_rank)
    if device.type == "cuda" and (device.index or 0) >= machine.cuda_count:
        raise UserError(f"{key}={name} but only {machine.cuda_count} CUDA GPU(s) are visible"
                        + (f" to local rank {local_rank}" if world_size > 1 else ""))
    return device


def check_compiler(key: str, device: torch.device, machine: Machine, cpp_wrapper: bool = False) -> None:
    """UserError, before any work, when key=true (train.compile, sample.py's compile) cannot compile
    for device for want of a compiler. cpp_wrapper: Inductor writes the code around the kernels in
    C++ too (the compiled decode step), which takes the C++ compiler on every device. Apple's MPS
    needs none of its own: Metal compiles Inductor's shaders."""
    if (device.type == "cpu" or cpp_wrapper) and machine.cxx is None:
        what = "Inductor's CPU kernels" if device.type == "cpu" else "the C++ code Inductor writes around the kernels"
        raise UserError(f"{key}=true needs a C++ compiler for {what}, and {none_found('CXX', INDUCTOR_CXX)}; "
                        f"install one (e.g. g++), point CXX at it, or run with {key}=false")
    if device.type == "cuda" and machine.cc is None:
        raise UserError(f"{key}=true needs a C compiler for Triton's GPU kernels, and {none_found('CC', 'gcc or clang')}; "
                        f"install one (e.g. gcc), point CC at it, or run with {key}=false")


def none_found(variable: str, names: str) -> str:
    """Why find_compiler found none: the environment variable names no program, or nothing on PATH."""
    if named := os.environ.get(variable):
        return f"{variable}={named} is no program here"
    return f"there is none here (${variable}, else {names} on PATH)"
