"""The attention section: forward + backward of the module's sdpa and manual paths against a bare sdpa call."""

from collections.abc import Callable

import torch
import torch.nn.functional as F

from bench.common import median_time
from model.attention import CausalSelfAttention


def bare_sdpa(module: CausalSelfAttention, x: torch.Tensor) -> torch.Tensor:
    """The same projections as the module around one scaled_dot_product_attention call:
    the floor the module's sdpa path is measured against."""
    B, T, C = x.shape
    H, D = module.n_head, module.head_dim
    q, k, v = module.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))  # 3 x (B, H, T, D)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
    return module.proj(out.transpose(1, 2).contiguous().view(B, T, C))  # (B, T, C)


def attention_timings(B: int, T: int, C: int, H: int, repeats: int, iterations: int = 20) -> dict:
    """Milliseconds per forward + backward of each path on x (B, T, C), same weights."""
    torch.manual_seed(0)
    sdpa = CausalSelfAttention(C, H, bias=False, attention="sdpa")
    manual = CausalSelfAttention(C, H, bias=False, attention="manual")
    manual.load_state_dict(sdpa.state_dict())
    x = torch.randn(B, T, C, requires_grad=True)
    upstream = torch.randn(B, T, C)
    paths = {"bare_sdpa": lambda: bare_sdpa(sdpa, x), "sdpa": lambda: sdpa(x)[0], "manual": lambda: manual(x)[0]}
    ms = {}
    for name, forward in paths.items():
        def run(forward: Callable[[], torch.Tensor] = forward) -> None:
            for _ in range(iterations):
                (forward() * upstream).sum().backward()
        ms[name] = median_time(run, repeats) / iterations * 1e3
    return {
        **{f"{name}_ms": value for name, value in ms.items()},
        "sdpa_vs_bare": ms["sdpa"] / ms["bare_sdpa"],
        "manual_vs_bare": ms["manual"] / ms["bare_sdpa"],
    }


def bench_attention(repeats: int) -> dict:
    return {f"B{B}_T{T}_C{C}_H{H}": attention_timings(B, T, C, H, repeats) for B, T, C, H in ((8, 256, 384, 6), (12, 64, 128, 4))}

