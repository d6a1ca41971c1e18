"""model/norms.py: the RMSNorm that takes vectors in another dtype than its gain's (QK-norm and
RMSNorm under bf16 autocast). LayerNorm's and RMSNorm's hook points: tests/test_hooks.py."""

import torch
import torch.nn.functional as F

from model.attention import CausalSelfAttention
from model.norms import GainDtypeRMSNorm
from tests.helpers import tiny_gpt


def rms_norm_calls(monkeypatch) -> list[tuple[torch.dtype, torch.dtype]]:
    """Each call of F.rms_norm from now on, as (input dtype, gain dtype); the call itself goes on."""
    calls, real = [], F.rms_norm

    def recorded(x, shape, weight=None, eps=None):
        calls.append((x.dtype, None if weight is None else weight.dtype))
        return real(x, shape, weight, eps)

    monkeypatch.setattr(F, "rms_norm", recorded)
    return calls


def test_under_bf16_autocast_qk_norm_and_rmsnorm_hand_torch_one_dtype_and_normalise_as_fp32_would(monkeypatch):
    """torch's fused RMSNorm takes a bf16 input with an fp32 gain on a slower path (and warns once a
    process, so a warning is no test): every call must get one dtype."""
    torch.manual_seed(0)
    attention = CausalSelfAttention(n_embd=32, n_head=4, qk_norm=True)
    model = tiny_gpt(norm="rmsnorm", qk_norm=True)
    with torch.no_grad():
        attention.q_norm.weight.uniform_(0.5, 1.5)
    calls = rms_norm_calls(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = attention(torch.randn(2, 16, 32))
        model(torch.randint(0, model.config.vocab_size, (2, 8)))
    assert out.dtype == torch.bfloat16 and len(calls) >= 2 + 2 * model.config.n_layer
    assert all(x == weight for x, weight in calls), calls

    q = torch.randn(2, 16, 4, 8).bfloat16()  # (B, T, H, D): a bf16 matmul's output
    normalised = attention.q_norm(q)
    expected = F.rms_norm(q.float(), (8,), attention.q_norm.weight)  # fp32 from the same bf16 input
    assert normalised.dtype == torch.bfloat16
    torch.testing.assert_close(normalised, expected.bfloat16(), rtol=0, atol=0)  # rounded once


def test_an_fp32_input_with_a_bf16_gain_is_normalised_in_fp32():
    norm = GainDtypeRMSNorm(8).bfloat16()
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 8))
    x = torch.randn(3, 8) * 1e-3 + 1.0  # rounding x to bf16 would move it by up to 4e-3
    expected = F.rms_norm(x, (8,), norm.weight.float())
    assert norm(x).dtype == torch.float32
    torch.testing.assert_close(norm(x), expected, rtol=0, atol=0)
    assert isinstance(tiny_gpt(norm="rmsnorm").ln_f, GainDtypeRMSNorm)  # the model's own RMSNorm is one
