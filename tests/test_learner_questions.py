"""The learner's questions in docs/attention.md ("Questions learners ask"), each answered by a
check that runs: where the answer is about this project's module, the check runs the module."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model import GPT, GPTConfig
from model.attention import CausalSelfAttention

ATOL, RTOL = 1e-5, 1e-4


def heads_of(module: CausalSelfAttention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The module's own q, k, v (B, H, T, D) for x (B, T, C), by its step 1 and 2."""
    B, T, C = x.shape
    q, k, v = module.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
    return tuple(t.view(B, T, module.n_head, module.head_dim).transpose(1, 2) for t in (q, k, v))


def merged(module: CausalSelfAttention, out: torch.Tensor) -> torch.Tensor:
    """Steps 8 and 9: heads (B, H, T, D) merged and projected, as the module does."""
    B, H, T, D = out.shape
    return module.proj(out.transpose(1, 2).reshape(B, T, H * D))  # (B, T, C)


def test_q1_a_hide_mask_given_to_sdpa_is_silently_wrong_and_inverting_it_is_the_fix():
    torch.manual_seed(0)
    module = CausalSelfAttention(16, 2, attention="manual")
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        expected, _ = module(x)
        q, k, v = heads_of(module, x)
        hide = torch.ones(5, 5, dtype=torch.bool).triu(diagonal=1)  # True = hide: masked_fill's convention
        wrong = merged(module, F.scaled_dot_product_attention(q, k, v, attn_mask=hide))
        fixed = merged(module, F.scaled_dot_product_attention(q, k, v, attn_mask=~hide))  # True = may attend
    assert torch.isfinite(wrong).all()  # no error, no NaN...
    assert not torch.allclose(wrong, expected, atol=1e-3)  # ...and wrong: each query saw only the future
    torch.testing.assert_close(fixed, expected, atol=ATOL, rtol=RTOL)
    # The module's own `visible` is SDPA's convention; its padding mask is nn.MultiheadAttention's.
    visible, _ = CausalSelfAttention._visible(1, 5, 5, None, torch.device("cpu"))  # (1, 1, T, S)
    assert torch.equal(visible[0, 0], ~hide)
    padding = torch.tensor([[False, False, False, True, True]])  # True = hide (a padding key)
    _, weights = module(x, key_padding_mask=padding, need_weights=True)
    assert (weights[..., 3:] == 0).all() and (weights[0, :, 4, :3] > 0).all()


def test_q2_a_naive_softmax_of_scores_near_100_gives_nan_and_the_first_nan_can_be_found():
    scores = torch.tensor([97.0, 33.0])  # float32: exp overflows above about 88.7
    assert torch.exp(torch.tensor(88.7)).isfinite() and torch.exp(torch.tensor(88.8)).isinf()
    naive = scores.exp() / scores.exp().sum()
    assert naive[0].isnan() and naive[1] == 0  # inf / inf and 1e14 / inf: [nan, 0]
    torch.testing.assert_close(torch.softmax(scores, dim=0), torch.tensor([1.0, math.exp(33 - 97)]))
    # Checking every step with isfinite names the first step that went wrong.
    steps = {"scores": scores, "exp": scores.exp(), "sum": scores.exp().sum(), "divide": naive}
    assert next(name for name, value in steps.items() if not value.isfinite().all()) == "exp"
    # detect_anomaly stops backward at the operation whose gradient is NaN, and names it.
    leaf = scores.clone().requires_grad_()
    with (
        pytest.warns(UserWarning, match="Anomaly Detection has been enabled"),
        pytest.warns(UserWarning, match="Error detected in DivBackward0"),  # with the forward's traceback
        pytest.raises(RuntimeError, match=r"DivBackward0.*returned nan"),
        torch.autograd.detect_anomaly(),
    ):
        (leaf.exp() / leaf.exp().sum())[1].backward()
    # The module's softmax is the stable one: the same scores inside it stay finite.
    module = CausalSelfAttention(1, 1, bias=False, attention="manual")
    with torch.no_grad():
        module.qkv.weight[:2] = torch.tensor([[1.0], [1.0]])  # q = k = x: the last query scores 97 and 33
        _, weights = module(torch.tensor([[[math.sqrt(33.0 * 33 / 97)], [math.sqrt(97.0)]]]), need_weights=True)
    assert weights.isfinite().all() and weights[0, 0, 1, 0] < 1e-20


def test_q3_dividing_by_sums_without_keepdim_normalises_the_wrong_way_silently():
    torch.manual_seed(0)
    A = torch.randn(4, 4)
    A = A + A.T  # a symmetric score matrix
    E = A.exp()
    wrong = E / E.sum(dim=1)  # (4, 4) / (4,): column j divided by row j's sum
    right = E / E.sum(dim=1, keepdim=True)  # (4, 4) / (4, 1): row i divided by its own sum
    torch.testing.assert_close(right, torch.softmax(A, dim=1))
    torch.testing.assert_close(wrong, torch.softmax(A, dim=0))  # the other dim's softmax...
    torch.testing.assert_close(wrong, torch.softmax(A, dim=1).T)  # ...which is the right one, transposed
    assert not torch.allclose(wrong.sum(dim=1), torch.ones(4))  # its rows do not sum to 1


def test_q4_dividing_scores_by_their_sum_is_no_weighting_and_softmax_is():
    scores = torch.tensor([1.0, -1.2, 0.5])
    by_sum = scores / scores.sum()
    torch.testing.assert_close(by_sum, torch.tensor([10 / 3, -4.0, 5 / 3]))  # a weight of -4, one of 3.3
    weights = torch.softmax(scores, dim=0)
    assert (weights > 0).all() and weights.sum() == pytest.approx(1.0) and weights.argmax() == 0
    module = CausalSelfAttention(8, 2, attention="manual")
    _, module_weights = module(torch.randn(3, 6, 8) * 5, need_weights=True)  # negative scores in plenty
    assert (module_weights >= 0).all()


def test_q5_keys_made_by_w_q_give_symmetric_scores_where_each_token_scores_itself_highest():
    torch.manual_seed(0)
    T, C = 32, 64
    module = CausalSelfAttention(C, 1, bias=False, attention="manual")
    x = torch.randn(1, T, C)
    with torch.no_grad():
        q, k, _ = heads_of(module, x)  # (1, 1, T, C) each
        proper = (q @ k.transpose(-2, -1))[0, 0]  # (T, T)
        same = (q @ q.transpose(-2, -1))[0, 0]  # K made by W_q: the classic bug
        bare = x[0] @ x[0].T  # no projections at all
    for scores in (same, bare):
        torch.testing.assert_close(scores, scores.T)
        assert torch.equal(scores.argmax(dim=1), torch.arange(T))  # all 32 tokens pick themselves
    assert not torch.allclose(proper, proper.T)
    assert (proper.argmax(dim=1) == torch.arange(T)).float().mean() < 0.2
    # The module uses rows C:2C for its keys: its weights are those of `proper`, not of `same`.
    _, weights = module(x, need_weights=True)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for scores, should_match in ((proper, True), (same, False)):
        by_hand = torch.softmax((scores / math.sqrt(C)).masked_fill(~causal, float("-inf")), dim=-1)
        assert torch.allclose(weights[0, 0], by_hand, atol=ATOL) == should_match


def test_q6_linear_stores_out_by_in_and_per_head_fused_and_einsum_projections_agree():
    torch.manual_seed(0)
    B, T, C, H = 2, 5, 12, 3
    D = C // H
    module = CausalSelfAttention(C, H, bias=False)
    x = torch.randn(B, T, C)
    assert module.qkv.weight.shape == (3 * C, C)  # (out, in)
    torch.testing.assert_close(module.qkv(x), x @ module.qkv.weight.T)  # Linear computes x @ W.T
    W_q = module.qkv.weight[:C]  # (C, C): rows are output channels, head h owns rows h*D:(h+1)*D
    per_head = W_q.view(H, D, C).transpose(1, 2)  # (H, C, D): one (C, D) matrix per head
    with torch.no_grad():
        q, _, _ = heads_of(module, x)  # (B, H, T, D), from the fused (3C, C) matrix
        loop = torch.stack([x @ per_head[h] for h in range(H)], dim=1)  # (B, H, T, D)
        einsum = torch.einsum("btc,hcd->bhtd", x, per_head)  # (B, H, T, D)
    torch.testing.assert_close(loop, q)
    torch.testing.assert_close(einsum, q)


@pytest.mark.parametrize(("H", "T", "raises"), [(4, 6, True), (1, 6, False), (4, 1, False)])
def test_q7_view_after_transpose_raises_unless_one_of_the_swapped_dims_is_1(H, T, raises):
    B, D = 2, 3
    out = torch.randn(B, H, T, D).transpose(1, 2)  # (B, T, H, D), strides still head-major
    if raises:
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            out.view(B, T, H * D)
    else:
        out.view(B, T, H * D)  # H = 1 or T = 1: the memory order is already (B, T, H, D)
    joined = out.reshape(B, T, H * D)  # reshape copies only when it must
    torch.testing.assert_close(joined, out.contiguous().view(B, T, H * D))
    assert (joined.data_ptr() == out.data_ptr()) == (not raises)
    # The KV-cache step is the T = 1 case: the module merges its heads there as anywhere else.
    module = CausalSelfAttention(H * D, H, attention="manual")
    full, _ = module(torch.randn(B, T, H * D))
    assert full.shape == (B, T, H * D)


def test_q8_attention_dropout_drops_weights_before_they_meet_v_and_is_off_in_eval():
    torch.manual_seed(0)
    module = CausalSelfAttention(16, 2, dropout=0.5, attention="manual")
    module.resid_dropout.p = 0.0  # keep only the attention dropout, to find where it acts
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        torch.manual_seed(1)
        out, weights = module(x, need_weights=True)  # weights: as softmax gave them, before dropout
        torch.testing.assert_close(weights.sum(dim=-1), torch.ones(2, 2, 6))
        q, k, v = heads_of(module, x)
        torch.manual_seed(1)  # the same random draw, applied by hand to the weights
        by_hand = merged(module, F.dropout(weights, 0.5, training=True) @ v)
        torch.testing.assert_close(out, by_hand, atol=ATOL, rtol=RTOL)
        module.eval()
        first, _ = module(x)
        torch.manual_seed(99)
        second, _ = module(x)
        torch.testing.assert_close(first, second)  # eval: no dropout, the same output every time
        torch.testing.assert_close(first, merged(module, weights @ v), atol=ATOL, rtol=RTOL)


def test_q9_head_dim_1_and_a_single_token_work_and_a_too_long_sequence_is_refused():
    torch.manual_seed(0)
    module = CausalSelfAttention(4, 4, attention="manual")  # head_dim = 1
    x = torch.randn(2, 5, 4)
    _, weights = module(x, need_weights=True)
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(2, 4, 5))
    with torch.no_grad():  # one token sees only itself: weight 1, so its output is proj(v)
        one = torch.randn(2, 1, 4)
        out, weights = module(one, need_weights=True)
        assert torch.equal(weights, torch.ones(2, 4, 1, 1))
        torch.testing.assert_close(out, module.proj(module.qkv(one)[..., 8:]), atol=ATOL, rtol=RTOL)
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=8))
    with pytest.raises(ValueError, match=r"sequence length 9 exceeds block_size=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_q10_dividing_by_sqrt_d_tames_the_spread_only_for_centred_queries_and_keys():
    torch.manual_seed(0)
    for D in (16, 256):
        q = torch.randn(4000, D) + 1.0  # every channel has mean 1, not 0
        keys = torch.randn(4000, 32, D) + 1.0
        scaled = torch.einsum("nd,nsd->ns", q, keys) / math.sqrt(D)  # (4000, 32): one row per query
        assert scaled.mean().item() == pytest.approx(math.sqrt(D), rel=0.05)  # grows with D
        assert scaled.var(dim=1).mean().item() == pytest.approx(2.0, rel=0.1)  # 1 + mean^2, not 1
        q, keys = q - q.mean(dim=-1, keepdim=True), keys - keys.mean(dim=-1, keepdim=True)  # centred
        centred = torch.einsum("nd,nsd->ns", q, keys) / math.sqrt(D)
        assert abs(centred.mean().item()) < 0.05
        assert centred.var(dim=1).mean().item() == pytest.approx(1.0, rel=0.1)


def test_multihead_attention_uses_true_to_hide_like_masked_fill():
    # Q1's other half: torch's own nn.MultiheadAttention reads a bool attn_mask as True = hide.
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(1, 4, 8)
    hide = torch.ones(4, 4, dtype=torch.bool).triu(diagonal=1)
    _, weights = mha(x, x, x, attn_mask=hide)  # (1, T, T), averaged over heads
    assert (weights[0][hide] == 0).all() and (weights[0][~hide] > 0).all()
