"""The norms: LayerNorm and RMSNorm with hook points (hook_scale, hook_normalized), and the RMSNorm
QK-norm and RMSNorm share, which also takes vectors in another dtype than its gain's."""

import torch
import torch.nn.functional as F
from torch import nn

from model.hooks import HookPoint


class GainDtypeRMSNorm(nn.RMSNorm):
    """nn.RMSNorm that also takes vectors in another dtype than its gain's. Under bf16 autocast a
    matmul's output (QK-norm's queries and keys) is bf16 while the gain stays fp32, and torch's
    fused kernel refuses the pair: it takes a slower path (and warns, once a process). This one
    normalises in the wider of the two dtypes, fused, and returns the input's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.weight.dtype:
            return super().forward(x)
        wide = torch.promote_types(x.dtype, self.weight.dtype)
        return F.rms_norm(x.to(wide), self.normalized_shape, self.weight.to(wide), self.eps).to(x.dtype)


class NormHooks:
    """hook_scale (B, T, 1), the number each vector is divided by, and hook_normalized (B, T, C),
    the vectors once divided, before the norm's gain (and bias), as TransformerLens names them.
    With a function on either the norm is spelt out, as the fused kernel shows neither."""

    def add_hook_points(self) -> None:
        self.hook_scale, self.hook_normalized = HookPoint(), HookPoint()

    def past_its_hook_points(self, x: torch.Tensor) -> torch.Tensor:
        """The norm of x, fused, with no function on its hook points called: for streams other than the
        one the forward normalises (a logit lens's), which those functions are not about."""
        return super().forward(x)  # (..., C): any leading dimensions, as a stack of streams has

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.hook_scale.fns or self.hook_normalized.fns):
            return super().forward(x)  # (B, T, C), fused
        centred = x - x.mean(dim=-1, keepdim=True) if isinstance(self, nn.LayerNorm) else x  # (B, T, C)
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps  # RMSNorm's eps=None: the dtype's
        scale = self.hook_scale((centred.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt())  # (B, T, 1)
        out = self.hook_normalized(centred / scale) * self.weight  # (B, T, C)
        return out + self.bias if getattr(self, "bias", None) is not None else out  # (B, T, C)


class LayerNorm(NormHooks, nn.LayerNorm):
    def __init__(self, n_embd: int, bias: bool, eps: float = 1e-5) -> None:
        super().__init__(n_embd, bias=bias, eps=eps)
        self.add_hook_points()


class RMSNorm(NormHooks, GainDtypeRMSNorm):
    def __init__(self, n_embd: int, eps: float | None = None) -> None:
        super().__init__(n_embd, eps=eps)
        self.add_hook_points()
