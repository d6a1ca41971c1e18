"""The attention module against independent references, masks and odd shapes.

Tolerances: float32 paths that sum in a different order agree to about 1e-6 relative;
we allow atol=1e-5, rtol=1e-4 throughout (a real bug is off by far more).
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model.attention import CausalSelfAttention, KVCache, rotate
from tests.helpers import multihead_attention_like

ATOL, RTOL = 1e-5, 1e-4


def make_pair(n_embd: int, n_head: int, bias: bool = True, seed: int = 0) -> tuple[CausalSelfAttention, CausalSelfAttention]:
    """A manual and an sdpa module with the same weights."""
    torch.manual_seed(seed)
    manual = CausalSelfAttention(n_embd, n_head, bias=bias, attention="manual")
    sdpa = CausalSelfAttention(n_embd, n_head, bias=bias, attention="sdpa")
    sdpa.load_state_dict(manual.state_dict())
    return manual, sdpa


def per_head_loop_reference(attn: CausalSelfAttention, x: torch.Tensor) -> torch.Tensor:
    """Causal attention with explicit Python loops over batch rows, heads and positions,
    built from per-head slices of the module's own weight matrices."""
    B, T, C = x.shape
    H, D = attn.n_head, attn.head_dim
    W, b = attn.qkv.weight, attn.qkv.bias  # (3C, C), (3C,)
    out = torch.zeros(B, T, C, dtype=x.dtype)
    for batch in range(B):
        for h in range(H):
            rows = {name: slice(offset * C + h * D, offset * C + (h + 1) * D) for offset, name in enumerate("qkv")}
            proj = {name: x[batch] @ W[r].T + (b[r] if b is not None else 0) for name, r in rows.items()}  # each (T, D)
            for t in range(T):
                scores = torch.stack([proj["q"][t] @ proj["k"][s] / math.sqrt(D) for s in range(t + 1)])  # (t+1,)
                weights = torch.exp(scores - scores.max())
                weights = weights / weights.sum()
                out[batch, t, h * D : (h + 1) * D] = sum(weights[s] * proj["v"][s] for s in range(t + 1))
    return attn.proj(out)


def test_manual_and_sdpa_give_the_same_outputs_and_gradients():
    manual, sdpa = make_pair(n_embd=48, n_head=6)
    x = torch.randn(3, 17, 48)
    x_manual, x_sdpa = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_manual, _ = manual(x_manual)
    out_sdpa, _ = sdpa(x_sdpa)
    torch.testing.assert_close(out_manual, out_sdpa, atol=ATOL, rtol=RTOL)

    upstream = torch.randn_like(out_manual)
    (out_manual * upstream).sum().backward()
    (out_sdpa * upstream).sum().backward()
    torch.testing.assert_close(x_manual.grad, x_sdpa.grad, atol=ATOL, rtol=RTOL)
    for (name, p_manual), (_, p_sdpa) in zip(manual.named_parameters(), sdpa.named_parameters(), strict=True):
        torch.testing.assert_close(p_manual.grad, p_sdpa.grad, atol=ATOL, rtol=RTOL, msg=f"gradient of {name}")


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_both_paths_equal_a_per_head_python_loop(attention):
    manual, sdpa = make_pair(n_embd=12, n_head=3)
    module = manual if attention == "manual" else sdpa
    x = torch.randn(2, 6, 12)
    with torch.no_grad():
        torch.testing.assert_close(module(x)[0], per_head_loop_reference(module, x), atol=ATOL, rtol=RTOL)


def test_equals_torch_multihead_attention_with_copied_weights_and_a_causal_mask():
    manual, _ = make_pair(n_embd=32, n_head=4)
    mha = multihead_attention_like(manual)
    x = torch.randn(2, 9, 32)
    future = torch.ones(9, 9, dtype=torch.bool).triu(diagonal=1)  # True = may not attend
    with torch.no_grad():
        expected, expected_weights = mha(x, x, x, attn_mask=future, average_attn_weights=False)
        out, weights = manual(x, need_weights=True)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(weights, expected_weights, atol=ATOL, rtol=RTOL)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_head: int) -> torch.Tensor:
    """Causal attention of separately given (B, T, C) queries, keys and values, head by head;
    returns the heads side by side (B, T, C), before any output projection."""
    B, T, C = q.shape
    D = C // n_head
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)  # (T, T): True = a later key
    heads = []
    for h in range(n_head):
        cols = slice(h * D, (h + 1) * D)
        scores = q[..., cols] @ k[..., cols].transpose(-2, -1) / math.sqrt(D)  # (B, T, T)
        heads.append(torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v[..., cols])  # (B, T, D)
    return torch.cat(heads, dim=-1)  # (B, T, C)


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_fused_qkv_equals_separate_projections(attention):
    # Guards the module's split of qkv(x): it must take q, k, v from rows [0:C], [C:2C], [2C:3C]
    # of the fused weight, in that order (a module that split k, q, v fails here).
    C, H = 20, 4
    module = make_pair(n_embd=C, n_head=H)[attention == "sdpa"]
    separate = {name: nn.Linear(C, C) for name in "qkv"}
    x = torch.randn(2, 5, C)
    with torch.no_grad():
        for offset, name in enumerate("qkv"):
            separate[name].weight.copy_(module.qkv.weight[offset * C : (offset + 1) * C])
            separate[name].bias.copy_(module.qkv.bias[offset * C : (offset + 1) * C])
        expected = module.proj(causal_attention(separate["q"](x), separate["k"](x), separate["v"](x), H))
        torch.testing.assert_close(module(x)[0], expected, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_changing_later_tokens_never_changes_earlier_outputs(attention):
    module = make_pair(n_embd=16, n_head=2)[attention == "sdpa"]
    x = torch.randn(2, 10, 16)
    for t in range(10):
        changed = x.clone()
        changed[:, t + 1 :] = torch.randn_like(changed[:, t + 1 :])
        with torch.no_grad():
            before, after = module(x)[0], module(changed)[0]
        torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], atol=1e-6, rtol=0)
        if t < 9:  # the changed positions themselves do see the change
            assert not torch.allclose(after[:, t + 1 :], before[:, t + 1 :])


def test_attention_weights_rows_sum_to_one_and_are_zero_in_the_future():
    manual, _ = make_pair(n_embd=16, n_head=4)
    with torch.no_grad():
        _, weights = manual(torch.randn(2, 7, 16), need_weights=True)  # (B, H, T, T)
    assert weights.shape == (2, 4, 7, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 7))
    assert (weights.triu(diagonal=1) == 0).all()


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_fully_masked_row_gives_zeros_not_nan(attention):
    module = make_pair(n_embd=16, n_head=2, bias=False)[attention == "sdpa"]
    x = torch.randn(2, 5, 16, requires_grad=True)
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[0, :2] = True  # row 0: keys 0 and 1 are padding, so queries 0 and 1 see no key at all
    out, _ = module(x, key_padding_mask=padding)
    assert not out.isnan().any()
    assert (out[0, :2] == 0).all()
    assert (out[0, 2:].abs() > 0).any() and (out[1].abs() > 0).any()
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_padding_mask_matches_in_both_paths_and_hides_padding_keys():
    manual, sdpa = make_pair(n_embd=16, n_head=2, bias=False)
    x = torch.randn(2, 6, 16)
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[1, 1] = True
    with torch.no_grad():
        out_manual, weights = manual(x, key_padding_mask=padding, need_weights=True)
        out_sdpa, _ = sdpa(x, key_padding_mask=padding)
    torch.testing.assert_close(out_manual, out_sdpa, atol=ATOL, rtol=RTOL)
    assert (weights[1, :, :, 1] == 0).all()  # nobody looks at the padding key
    assert (weights[0, :, 1:, 1] > 0).all()  # while the other row's key 1 is seen


@pytest.mark.parametrize(
    ("n_embd", "n_head", "T"),
    [(8, 2, 1), (8, 1, 7), (15, 3, 4), (21, 7, 5), (30, 5, 2)],  # T=1, H=1, head_dim 5, 3, 6
)
def test_odd_sizes_agree_with_each_other_and_the_loop_reference(n_embd, n_head, T):
    manual, sdpa = make_pair(n_embd, n_head)
    x = torch.randn(2, T, n_embd)
    with torch.no_grad():
        reference = per_head_loop_reference(manual, x)
        torch.testing.assert_close(manual(x)[0], reference, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(sdpa(x)[0], reference, atol=ATOL, rtol=RTOL)


def test_the_default_causal_module_computes_bit_for_bit_what_it_did_before_the_variants():
    # causal=False and context= (the variants) must leave the default untouched: its output
    # and gradients equal, bit for bit, these same torch calls in the same order, with the fused
    # path's is_causal=True (an explicit mask, say, would pick another kernel and other last bits).
    torch.manual_seed(0)
    B, T, C, H = 2, 7, 32, 4
    D = C // H
    x = torch.randn(B, T, C)
    for attention in ("sdpa", "manual"):
        module = CausalSelfAttention(C, H, attention=attention)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in module.qkv(x).split(C, dim=2))  # (B, H, T, D)
        if attention == "sdpa":
            heads = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            visible = torch.ones(T, T, dtype=torch.bool).tril().view(1, 1, T, T)
            scores = (q @ k.transpose(-2, -1) / math.sqrt(D)).masked_fill(~visible, float("-inf"))
            heads = torch.softmax(scores, dim=-1) @ v
        expected = module.proj(heads.transpose(1, 2).contiguous().view(B, T, C))
        out, _ = module(x)
        assert torch.equal(out, expected), attention
        expected_grads = torch.autograd.grad(expected.square().sum(), list(module.parameters()))
        grads = torch.autograd.grad(out.square().sum(), list(module.parameters()))
        assert all(torch.equal(a, b) for a, b in zip(grads, expected_grads, strict=True)), attention


def test_n_embd_not_divisible_by_n_head_raises_a_clear_error():
    with pytest.raises(ValueError, match=r"n_embd=10 is not divisible by n_head=4.*\[1, 2, 5, 10\]"):
        CausalSelfAttention(10, 4)


def test_need_weights_uses_the_manual_math_even_on_the_sdpa_path():
    manual, sdpa = make_pair(n_embd=16, n_head=4)
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        out_fast, _ = sdpa(x)
        out_with_weights, weights = sdpa(x, need_weights=True)
        _, manual_weights = manual(x, need_weights=True)
    torch.testing.assert_close(out_with_weights, out_fast, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(weights, manual_weights)


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_a_kv_cache_fed_in_pieces_gives_the_full_sequences_outputs(attention):
    manual, sdpa = make_pair(n_embd=24, n_head=4)
    module = manual if attention == "manual" else sdpa
    x = torch.randn(2, 11, 24)
    with torch.no_grad():
        full, _ = module(x)  # (2, 11, 24)
        cache = KVCache(max_length=16)
        pieces = [module(x[:, a:b], cache=cache)[0] for a, b in ((0, 4), (4, 5), (5, 9), (9, 10), (10, 11))]
    assert cache.length == 11 and cache.k[:, :, :11].shape == (2, 4, 11, 6)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=ATOL, rtol=RTOL)


def test_with_a_cache_the_weights_cover_earlier_tokens_and_hide_later_ones():
    manual, _ = make_pair(n_embd=8, n_head=2)
    cache = KVCache(max_length=16)
    with torch.no_grad():
        manual(torch.randn(1, 3, 8), cache=cache)
        _, weights = manual(torch.randn(1, 2, 8), need_weights=True, cache=cache)  # 2 queries, 5 keys
    assert weights.shape == (1, 2, 2, 5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 2, 2))
    assert (weights[..., 0, 4] == 0).all()  # the first new token (position 3) cannot see position 4
    assert (weights[..., 1, :] > 0).all()  # the second (position 4) sees everything before it


def test_rotary_positions_make_scores_depend_only_on_the_distance_between_tokens():
    module = CausalSelfAttention(16, 2, attention="manual", rope=True)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)  # one head's query and key, D = 8

    def at(x, p):
        return rotate(x, *module.rope_cos_sin(torch.tensor([p])))

    def score(query_position: int, key_position: int) -> float:
        return (at(q, query_position) * at(k, key_position)).sum().item()

    assert score(7, 3) == pytest.approx(score(27, 23), abs=1e-5)  # 4 apart, wherever they are
    assert score(7, 3) != pytest.approx(score(7, 5), abs=1e-3)  # a different distance, another score
    assert at(q, 0).equal(q)  # position 0 is not turned
    assert at(q, 5).norm() == pytest.approx(q.norm().item(), rel=1e-5)


def test_qk_norm_makes_the_weights_blind_to_the_size_of_queries_and_keys():
    torch.manual_seed(0)
    x = torch.randn(2, 6, 16)
    for qk_norm, same in ((True, True), (False, False)):
        module = CausalSelfAttention(16, 2, bias=False, attention="manual", qk_norm=qk_norm)
        _, before = module(x, need_weights=True)
        with torch.no_grad():
            module.qkv.weight[:32] *= 10  # rows [0:C] make queries, [C:2C] keys: both 10x longer
        _, after = module(x, need_weights=True)
        assert torch.allclose(before, after, atol=1e-5) == same


def recomputed_without(module: CausalSelfAttention, x: torch.Tensor, knocked_out: set[int]) -> torch.Tensor:
    """The module's output for x (B, T, C) worked out by hand with the heads in knocked_out left
    out of the merge. The output projection is a sum over heads: head h's output (B, T, D) times
    its own D columns of proj.weight. A head knocked out adds no term."""
    B, T, C = x.shape
    D = module.head_dim
    q, k, v = module.qkv(x).split(C, dim=2)  # 3 x (B, T, C), from the module's own weights
    heads = causal_attention(q, k, v, module.n_head)  # (B, T, C): head h in channels h*D .. (h+1)*D - 1
    out = module.proj.bias.expand(B, T, C)  # (B, T, C)
    for h in set(range(module.n_head)) - knocked_out:
        columns = slice(h * D, (h + 1) * D)
        out = out + heads[..., columns] @ module.proj.weight[:, columns].T  # (B, T, D) @ (D, C) -> (B, T, C)
    return out


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
@pytest.mark.parametrize("use_cache", [False, True], ids=["whole sequence", "KV cache fed in pieces"])
def test_a_knocked_out_head_gives_exactly_the_output_recomputed_without_that_head(attention, use_cache):
    module = make_pair(n_embd=24, n_head=4)[attention == "sdpa"]
    x = torch.randn(2, 7, 24)
    for knocked_out in ({1}, {0, 3}):
        def zero_heads(z, hook, knocked_out=knocked_out):  # z: (B, T, H, D), each head's output before the merge
            return z * torch.tensor([0.0 if h in knocked_out else 1.0 for h in range(4)]).view(1, 1, 4, 1)
        detach = module.hook_z.add_hook(zero_heads)
        with torch.no_grad():
            if use_cache:
                cache = KVCache(max_length=8)
                out = torch.cat([module(x[:, a:b], cache=cache)[0] for a, b in ((0, 3), (3, 4), (4, 7))], dim=1)
            else:
                out, _ = module(x)  # (2, 7, 24)
            torch.testing.assert_close(out, recomputed_without(module, x, knocked_out), atol=ATOL, rtol=RTOL)
            assert not torch.allclose(out, recomputed_without(module, x, set()), atol=1e-3)  # those heads did matter
        detach()

