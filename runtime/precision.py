"""train.dtype: the precision of the training matmuls.

    auto  the default: bf16 on a GPU that computes in it natively, fp16 on an older GPU, fp32 on
          a CPU and on Apple's MPS (choose_dtype; the log says which and why)
    fp32  full precision, and the right choice on a CPU
    bf16  autocast to bfloat16: on recent GPUs about twice the speed of fp32, with fp32's
          range, so no loss scaling is needed (on a CPU without AVX-512 BF16 or AMX, several times
          slower than fp32; with them, about as fast)
    fp16  autocast to float16: on a GPU as fast as bf16, but its small range lets small
          gradients round to zero, so the loss is scaled up before backward() and the
          gradients scaled back down before the update (torch.amp.GradScaler). A gradient
          that overflows at that scale skips its update and halves the scale; after
          growth_interval updates in a row without one, the scale doubles again.

Autocast runs each operation in the precision that suits it (matmuls in bf16/fp16, softmax,
norms and the loss in fp32); the weights and the optimizer state stay fp32 throughout.
"""

from contextlib import AbstractContextManager, nullcontext

import torch
import torch._functorch.config

from runtime.devices import Machine
from user_error import UserError

DTYPES = ("auto", "fp32", "bf16", "fp16")  # train.dtype's choices
AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# What train.dtype costs on a CPU, measured in docs/speed.md#traindtype-on-a-cpu. A CPU with AVX-512 BF16
# or AMX (Machine.cpu_bf16) trains in bf16 near fp32's speed, so asking for it there earns no warning.
CPU_WARNINGS = {
    "bf16": "train.dtype=bf16 on a CPU without AVX-512 BF16 or AMX: its bf16 matmuls run in slow code, several times "
            "slower than fp32 (docs/speed.md); fp32 is the CPU default",
    "fp16": "train.dtype=fp16 on a CPU: slower than fp32, about ten times without AVX-512 FP16 and about 1.5 times "
            "with it (docs/speed.md), and fp16 with its loss scaling is meant for CUDA GPUs (it runs on a CPU to check "
            "that path); fp32 is the CPU default",
}


def slow_on_a_cpu(name: str, cpu_bf16: bool) -> bool:
    """Whether precision name (fp32, bf16, fp16) computes slowly on a CPU: fp16 on any, bf16 on one
    without bf16 in hardware (Machine.cpu_bf16). Training and sampling warn alike by it."""
    return name == "fp16" or (name == "bf16" and not cpu_bf16)


# An overflow that takes fp16's loss scale below 1 stops the run: the gradients overflow fp16 even
# unscaled, and every update from then on would be skipped. From the starting scale, 2**16, that is
# the 17th update skipped in a row; a healthy run skips a few while the scale finds its level.
MIN_LOSS_SCALE = 1.0

# AOTAutograd keeps the graphs it compiles in a cache on disk that every process of the user reads.
# Before torch 2.13 (pytorch/pytorch#181564) that cache told graphs apart by whether autocast was
# on, not by its dtype: a train.compile=true run in fp16 after one in bf16 of the same model got
# bf16's graph, and trained in bf16 under fp16's name (seen on an H100 with torch 2.11: its losses
# were bf16's to six decimals); the other way round, bf16 got fp16's graph and no loss scale.
# (Pre-releases of 2.13 count as before it: they may predate the fix, and the cost is compile time.)
AUTOCAST_DTYPE_IN_CACHE_KEY = (2, 13)


def choose_dtype(requested: str, device: torch.device, machine: Machine) -> tuple[str, str]:
    """The precision a run trains in for train.dtype=requested on device, and why, for the log.
    UserError for a precision the device cannot run."""
    if requested == "bf16" and device.type == "mps" and machine.macos and machine.macos < (14,):
        version = ".".join(map(str, machine.macos))
        raise UserError(f"train.dtype=bf16 on Apple's MPS needs macOS 14 or later, and this is macOS {version}; "
                        "use train.dtype=fp16 or fp32 (auto: fp32)")
    if requested != "auto":
        return requested, f"train.dtype={requested}"
    if device.type == "cuda" and machine.cuda_bf16:
        return "bf16", f"train.dtype=auto: the GPU ({machine.cuda_name}) computes in bf16 natively"
    if device.type == "cuda":
        return "fp16", (f"train.dtype=auto: the GPU ({machine.cuda_name}) lacks native bf16 (compute capability "
                        "below 8.0), so fp16 with loss scaling")
    if device.type == "mps":
        return "fp32", "train.dtype=auto: fp32 on Apple's MPS; train.dtype=fp16 (or bf16 from macOS 14) asks for autocast"
    return "fp32", "train.dtype=auto: fp32 on a CPU, where bf16 and fp16 gain little or are much slower"


class Precision:
    def __init__(self, name: str, device: torch.device, growth_interval: int = 2000, why: str = "",
                 cpu_bf16: bool = False) -> None:
        """name: fp32, bf16 or fp16 (auto chosen already: choose_dtype, which also gives why).
        growth_interval: fp16's updates in a row without an overflow before the loss scale doubles.
        cpu_bf16: the CPU multiplies bf16 in hardware (Machine.cpu_bf16), so bf16 on it earns no warning."""
        self.name, self.device, self.why = name, device, why
        self.dtype = AUTOCAST_DTYPES[name]
        self.warning = CPU_WARNINGS[name] if device.type == "cpu" and slow_on_a_cpu(name, cpu_bf16) else None
        # Loss scaling, for fp16 only; with enabled=False its methods pass straight through.
        self.scaler = torch.amp.GradScaler(device.type, enabled=name == "fp16", growth_interval=growth_interval)

    @classmethod
    def for_run(cls, requested: str, device: torch.device, machine: Machine) -> "Precision":
        """The precision of train.dtype=requested on device (choose_dtype)."""
        name, why = choose_dtype(requested, device, machine)
        return cls(name, device, why=why, cpu_bf16=machine.cpu_bf16)

    def autocast(self) -> AbstractContextManager:
        return torch.autocast(self.device.type, dtype=self.dtype) if self.dtype else nullcontext()

    def before_compiling(self) -> None:
        """Call before torch.compile of a model that will run under autocast(): where this torch's
        AOTAutograd cache cannot tell bf16 from fp16 (AUTOCAST_DTYPE_IN_CACHE_KEY), this process
        neither reads nor writes it, on disk or remote, from here on. Inductor's own cache, keyed on
        the graph with its casts, stays. TORCHINDUCTOR_AUTOGRAD_CACHE=1 in the environment overrides it."""
        if self.dtype is not None and torch.__version__ < AUTOCAST_DTYPE_IN_CACHE_KEY:
            torch._functorch.config.enable_autograd_cache = False
            torch._functorch.config.enable_remote_autograd_cache = False

    @property
    def loss_scale(self) -> float | None:
        """fp16's loss scale now; None for fp32 and bf16, which need none."""
        return self.scaler.get_scale() if self.scaler.is_enabled() else None


WEIGHT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}  # sampling's dtype choices


def weights_dtype(requested: str, device: torch.device, machine: Machine, key: str = "dtype") -> tuple[torch.dtype, str | None]:
    """The dtype a model's weights take for sampling (key=requested: sample.py's dtype, or the tab's
    flag): its matmuls then run in it, and reading half the bytes per token is what makes bf16 and
    fp16 about twice as fast where the hardware multiplies them. auto is bf16 on a GPU that computes
    in it natively, fp16 on an older GPU, and fp32 on a CPU and on Apple's MPS. Returns the dtype and
    a warning to print (a precision this device runs slowly), or None; UserError where it cannot run."""
    if requested not in ("auto", *WEIGHT_DTYPES):
        raise UserError(f"{key}={requested} is not a precision; use auto, fp32, bf16 or fp16")
    if requested == "auto":
        if device.type == "cuda":
            return (torch.bfloat16 if machine.cuda_bf16 else torch.float16), None
        return torch.float32, None
    if requested == "bf16" and device.type == "mps" and machine.macos and machine.macos < (14,):
        version = ".".join(map(str, machine.macos))
        raise UserError(f"{key}=bf16 on Apple's MPS needs macOS 14 or later, and this is macOS {version}; "
                        f"use {key}=fp16 or fp32")
    warnings = {"bf16": f"{key}=bf16 on a CPU without native bf16 (AVX-512 BF16 or AMX): slower than fp32 here; "
                        f"{key}=fp32 is faster",
                "fp16": f"{key}=fp16 on a CPU: slower than fp32 on most CPUs; {key}=fp32 (or bf16 where the CPU has it)"}
    slow = device.type == "cpu" and slow_on_a_cpu(requested, machine.cpu_bf16)
    return WEIGHT_DTYPES[requested], warnings[requested] if slow else None
