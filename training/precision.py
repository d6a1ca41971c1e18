"""train.dtype: the precision of the training matmuls.

    fp32  full precision, the default, and the right choice on a CPU
    bf16  autocast to bfloat16: on recent GPUs about twice the speed of fp32, with fp32's
          range, so no loss scaling is needed (on most CPUs, bf16 matmuls are far slower)
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

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
CPU_WARNINGS = {
    "bf16": "train.dtype=bf16 on a CPU: bf16 matmuls are much slower than fp32 on most CPUs (about 60x without "
            "AVX-512 BF16, as on the 2-core AMD machines this project is tested on); fp32 is the CPU default",
    "fp16": "train.dtype=fp16 on a CPU: fp16 matmuls are about 10x slower than fp32 here, and fp16 with its loss "
            "scaling is meant for CUDA GPUs (it runs on a CPU to check that path); fp32 is the CPU default",
}


class Precision:
    def __init__(self, name: str, device: torch.device, growth_interval: int = 2000) -> None:
        """growth_interval: fp16's updates in a row without an overflow before the loss scale doubles."""
        self.name, self.device = name, device
        self.dtype = DTYPES[name]
        self.warning = CPU_WARNINGS.get(name) if device.type == "cpu" else None
        # Loss scaling, for fp16 only; with enabled=False its methods pass straight through.
        self.scaler = torch.amp.GradScaler(device.type, enabled=name == "fp16", growth_interval=growth_interval)

    def autocast(self) -> AbstractContextManager:
        return torch.autocast(self.device.type, dtype=self.dtype) if self.dtype else nullcontext()

    @property
    def loss_scale(self) -> float | None:
        """fp16's loss scale now; None for fp32 and bf16, which need none."""
        return self.scaler.get_scale() if self.scaler.is_enabled() else None
