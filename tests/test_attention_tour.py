"""Every claim docs/attention.md makes, checked: one test per claim, named in the text."""

import math
import re
from pathlib import Path

import pytest
import torch

from model.attention import CausalSelfAttention

ROOT = Path(__file__).resolve().parent.parent
torch.manual_seed(0)


def test_tour_a_dot_product_scores_how_much_a_key_points_the_way_the_query_does():
    q = torch.tensor([1.0, 2.0, -1.0, 0.5])
    orthogonal = torch.tensor([2.0, -1.0, 0.0, 0.0])  # q . orthogonal == 0
    keys = torch.stack([q, orthogonal, -q])  # same direction, at right angles, opposite
    scores = keys @ q  # (3,)
    assert scores[0] > scores[1] == 0 > scores[2]
    assert scores[0] == pytest.approx(q.norm() ** 2)  # q . q = |q|^2
    weights = torch.softmax(scores, dim=-1)
    assert weights.argmax() == 0


def test_tour_dividing_by_sqrt_d_keeps_the_scores_spread_near_1_and_softmax_unsaturated():
    generator = torch.Generator().manual_seed(0)
    D = 256
    q, k = torch.randn(20_000, D, generator=generator), torch.randn(20_000, D, generator=generator)
    dots = (q * k).sum(dim=-1)  # (20000,): one q . k per pair
    assert dots.var().item() == pytest.approx(D, rel=0.05)  # the spread grows with D...
    assert (dots / math.sqrt(D)).var().item() == pytest.approx(1.0, rel=0.05)  # ...and sqrt(D) undoes it
    rows = dots[:16 * 1000].view(1000, 16)  # 1000 queries, 16 keys each
    assert torch.softmax(rows, dim=-1).max(dim=-1).values.mean() > 0.9  # unscaled: almost one-hot
    assert torch.softmax(rows / math.sqrt(D), dim=-1).max(dim=-1).values.mean() < 0.35  # scaled: spread out (about 0.25)


def test_tour_softmax_runs_over_the_keys_so_each_query_gets_weights_that_sum_to_1():
    module = CausalSelfAttention(16, 2, attention="manual")
    _, weights = module(torch.randn(2, 6, 16), need_weights=True)  # (B, H, T, S)
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(2, 2, 6))  # over keys: 1 for every query
    assert not torch.allclose(weights.sum(dim=-2), torch.ones(2, 2, 6))  # over queries: no such rule


def test_tour_a_naive_softmax_overflows_and_subtracting_the_max_does_not_change_the_answer():
    scores = torch.tensor([1000.0, 1001.0, 999.0])
    naive = scores.exp() / scores.exp().sum()  # exp(1000) is inf in float32: inf / inf
    assert torch.isnan(naive).all()
    shifted = scores - scores.max()  # [-1, 0, -2]: the largest is exp(0) = 1, nothing overflows
    stable = shifted.exp() / shifted.exp().sum()
    torch.testing.assert_close(stable, torch.softmax(scores, dim=-1))
    small = torch.tensor([0.0, 1.0, -1.0])  # the same scores, minus 1000: the same weights
    torch.testing.assert_close(small.exp() / small.exp().sum(), stable)


def test_tour_minus_infinity_gives_zero_weight_and_a_row_of_it_gives_nan_unless_handled():
    row = torch.tensor([2.0, float("-inf"), 0.5])
    assert torch.softmax(row, dim=-1)[1] == 0.0  # exp(-inf) = 0: a masked key gets no weight
    assert torch.isnan(torch.softmax(torch.full((3,), float("-inf")), dim=-1)).all()  # 0 / 0
    # The module gives a query that can see no key a zero output, with finite gradients.
    module = CausalSelfAttention(8, 2, attention="manual")
    x = torch.randn(1, 3, 8, requires_grad=True)
    padding = torch.tensor([[True, False, False]])  # key 0 is padding: query 0 sees nothing
    out, weights = module(x, key_padding_mask=padding, need_weights=True)
    assert not torch.isnan(weights).any() and (weights[0, :, 0] == 0).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_tour_heads_split_with_view_and_transpose_and_merge_back_exactly():
    B, T, H, D = 2, 5, 3, 4
    x = torch.randn(B, T, H * D)  # (B, T, C)
    heads = x.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    for h in range(H):  # head h owns channels h*D .. (h+1)*D - 1
        assert torch.equal(heads[:, h], x[:, :, h * D : (h + 1) * D])
    out = heads.contiguous()  # (B, H, T, D) laid out head by head, as weights @ v returns it
    with pytest.raises(RuntimeError, match="view"):
        out.transpose(1, 2).view(B, T, H * D)  # its memory is not in (B, T, C) order
    merged = out.transpose(1, 2).contiguous().view(B, T, H * D)  # contiguous() copies it into that order
    assert torch.equal(merged, x)


def test_tour_one_fused_qkv_matrix_equals_three_projections_and_per_head_matrices():
    C, H = 12, 3
    D = C // H
    module = CausalSelfAttention(C, H, bias=False)
    x = torch.randn(2, 5, C)
    W = module.qkv.weight  # (3C, C): rows [0:C] are W_q, [C:2C] W_k, [2C:3C] W_v
    q, k, v = module.qkv(x).split(C, dim=2)  # one (C, 3C) matmul
    torch.testing.assert_close(q, x @ W[:C].T)
    torch.testing.assert_close(k, x @ W[C : 2 * C].T)
    torch.testing.assert_close(v, x @ W[2 * C :].T)
    for h in range(H):  # and head h's queries come from its own (D, C) block of W_q
        torch.testing.assert_close(q[..., h * D : (h + 1) * D], x @ W[h * D : (h + 1) * D].T)


def test_tour_the_at_operator_batches_over_leading_dims_where_bmm_needs_exactly_three():
    B, H, T, D = 2, 3, 5, 4
    q, k = torch.randn(B, H, T, D), torch.randn(B, H, T, D)
    scores = q @ k.transpose(-2, -1)  # (B, H, T, T): one matmul per (batch, head)
    assert scores.shape == (B, H, T, T)
    with pytest.raises(RuntimeError):
        torch.bmm(q, k.transpose(-2, -1))  # bmm takes (N, T, D) only
    flat = torch.bmm(q.reshape(B * H, T, D), k.transpose(-2, -1).reshape(B * H, D, T))  # (B*H, T, T)
    torch.testing.assert_close(flat.view(B, H, T, T), scores)
    torch.testing.assert_close(scores[1, 2], q[1, 2] @ k[1, 2].T)


def test_every_test_the_tour_cites_exists():
    tour = (ROOT / "docs" / "attention.md").read_text()
    cited = set(re.findall(r"`(test_\w+)`", tour))
    assert len(cited) >= 10
    defined = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        defined |= set(re.findall(r"^def (test_\w+)", path.read_text(), flags=re.MULTILINE))
    assert cited <= defined, cited - defined
