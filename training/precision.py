"""train.dtype: the precision of the training matmuls.

    fp32  full precision, the default, and the right choice on a CPU
    bf16  autocast to bfloat16: on recent GPUs about twice the speed of fp32, with fp32's
          range, so no loss scaling is needed (on most CPUs, bf16 matmuls are far slower)
    fp16  autocast to float16 on CUDA: as fast as bf16, but its small range lets small
          gradients round to zero, so the loss is scaled up before backward() and the
          gradients scaled back down before the update (torch.amp.GradScaler)

Autocast runs each operation in the precision that suits it (matmuls in bf16/fp16, softmax,
norms and the loss in fp32); the weights and the optimizer state stay fp32 throughout.
"""

from contextlib import AbstractContextManager, nullcontext

import torch

from training.errors import UserError

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    def __init__(self, name: str, device: torch.device) -> None:
        if name == "fp16" and device.type != "cuda":
            raise UserError(f"train.dtype=fp16 needs a CUDA GPU, and this run is on {device.type}; "
                            "use train.dtype=fp32 (the default)")
        self.name, self.device = name, device
        self.dtype = DTYPES[name]
        self.warning = (
            "train.dtype=bf16 on a CPU: bf16 matmuls are much slower than fp32 on most CPUs "
            "(about 60x without AVX-512 BF16, as on the 2-core AMD machines this project is tested on); "
            "fp32 is the CPU default"
            if name == "bf16" and device.type == "cpu" else None
        )
        # Loss scaling, for fp16 only; with enabled=False its methods pass straight through.
        self.scaler = torch.amp.GradScaler(device.type, enabled=name == "fp16")

    def autocast(self) -> AbstractContextManager:
        return torch.autocast(self.device.type, dtype=self.dtype) if self.dtype else nullcontext()
