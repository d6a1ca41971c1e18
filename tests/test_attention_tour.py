"""docs/attention.md's claims about the module, checked by the tests it names; its pictures,
current; and the run it quotes, a run of today's defaults."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from model.attention import CausalSelfAttention

ROOT = Path(__file__).resolve().parent.parent
torch.manual_seed(0)
ATOL, RTOL = 1e-5, 1e-4  # float32 sums in another order agree to ~1e-6; a real bug is off by far more


def attention_by_hand(module: CausalSelfAttention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention worked out head by head from the module's own qkv weights, with the
    scaling written out: returns (the merged heads before proj (B, T, C), weights (B, H, T, T))."""
    B, T, C = x.shape
    H, D = module.n_head, module.head_dim
    W = module.qkv.weight  # (3C, C): rows [0:C] are W_q, [C:2C] W_k, [2C:3C] W_v
    b = module.qkv.bias if module.qkv.bias is not None else torch.zeros(3 * C)
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)  # (T, T): True = a later key
    outs, weights = [], []
    for h in range(H):  # head h has its own (D, C) block in each of W_q, W_k, W_v
        q, k, v = (x @ W[r].T + b[r] for r in (slice(i * C + h * D, i * C + (h + 1) * D) for i in range(3)))  # (B, T, D)
        scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, T, T)
        weights.append(torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1))  # (B, T, T)
        outs.append(weights[-1] @ v)  # (B, T, D)
    return torch.cat(outs, dim=-1), torch.stack(weights, dim=1)  # heads side by side (B, T, C); (B, H, T, T)



def test_tour_a_dot_product_scores_how_much_a_key_points_the_way_the_query_does():
    # Guards the module's scores being the scaled dot product q . k / sqrt(D) (a wrong scale fails).
    q = torch.tensor([1.0, 2.0, -1.0, 0.5])
    orthogonal = torch.tensor([2.0, -1.0, 0.0, 0.0])  # q . orthogonal == 0
    keys = torch.stack([orthogonal, -q, q])  # at right angles, opposite, same direction
    scores = keys @ q  # (3,)
    assert scores[2] > scores[0] == 0 > scores[1] and scores[2] == pytest.approx(q.norm() ** 2)  # q . q = |q|^2
    # In the module, with W_q = W_k = I, the last token (its query is q) sees the three keys.
    module = CausalSelfAttention(4, 1, bias=False, attention="manual")
    with torch.no_grad():
        module.qkv.weight[:8] = torch.cat([torch.eye(4), torch.eye(4)])  # rows [0:C] W_q, [C:2C] W_k
        _, weights = module(keys.view(1, 3, 4), need_weights=True)  # (1, 1, 3, 3)
    row = weights[0, 0, 2]  # (3,): what query q gives each key
    assert row.argmax() == 2 and row[2] > row[0] > row[1]
    # Softmax keeps score differences as log-ratios: log(w_s / w_o) = (q . q - 0) / sqrt(D).
    torch.testing.assert_close(row.log() - row[0].log(), scores / math.sqrt(4), atol=ATOL, rtol=RTOL)



def test_tour_dividing_by_sqrt_d_keeps_the_scores_spread_near_1_and_softmax_unsaturated():
    # Guards the module's scale: scores divided by sqrt(D), not by D, not by sqrt(C), not at all.
    torch.manual_seed(0)
    B, T, C, H = 256, 16, 512, 2
    D = C // H  # 256
    module = CausalSelfAttention(C, H, bias=False, attention="manual")
    with torch.no_grad():  # queries = x, keys = x turned by a random rotation: q . k has variance D
        module.qkv.weight[:C] = torch.eye(C)
        module.qkv.weight[C : 2 * C] = torch.linalg.qr(torch.randn(C, C))[0]
        x = torch.randn(B, T, C)
        _, weights = module(x, need_weights=True)  # (B, H, T, T)
        torch.testing.assert_close(weights, attention_by_hand(module, x)[1], atol=ATOL, rtol=RTOL)
    # The last query sees all 16 keys. Softmax keeps its scores up to a shift: log(weights).
    scaled = weights[:, :, -1].log().view(B * H, T)  # (B*H, 16): the module's scores, shifted per row
    assert scaled.var(dim=-1).mean().item() == pytest.approx(1.0, rel=0.1)  # the spread is near 1...
    unscaled = scaled * math.sqrt(D)
    assert unscaled.var(dim=-1).mean().item() == pytest.approx(D, rel=0.1)  # ...where q . k alone has D
    assert torch.softmax(unscaled, dim=-1).max(dim=-1).values.mean() > 0.9  # unscaled: almost one-hot
    assert weights[:, :, -1].max(dim=-1).values.mean() < 0.35  # the module's: spread out (about 0.25)


def test_tour_softmax_runs_over_the_keys_so_each_query_gets_weights_that_sum_to_1():
    module = CausalSelfAttention(16, 2, attention="manual")
    _, weights = module(torch.randn(2, 6, 16), need_weights=True)  # (B, H, T, S)
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(2, 2, 6))  # over keys: 1 for every query
    assert not torch.allclose(weights.sum(dim=-2), torch.ones(2, 2, 6))  # over queries: no such rule



def test_tour_a_naive_softmax_overflows_and_subtracting_the_max_does_not_change_the_answer():
    # Guards the module's softmax staying finite on huge scores (a naive exp / sum gives NaN).
    scores = torch.tensor([1000.0, 1001.0, 999.0])
    naive = scores.exp() / scores.exp().sum()  # exp(1000) is inf in float32: inf / inf
    assert torch.isnan(naive).all()
    shifted = scores - scores.max()  # [-1, 0, -2]: the largest is exp(0) = 1, nothing overflows
    stable = shifted.exp() / shifted.exp().sum()
    # The module given those scores: W_q makes q = (2 x[3], 0, 0, 0), W_k = I, so with x[3] = 1 and
    # sqrt(D) = 2 the last token's score for key s is x_s[0].
    module = CausalSelfAttention(4, 1, bias=False, attention="manual")
    with torch.no_grad():
        module.qkv.weight[:8] = torch.cat([torch.zeros(4, 4), torch.eye(4)])
        module.qkv.weight[0, 3] = 2.0
        x = torch.tensor([[[s, 0.0, 0.0, 1.0] for s in scores.tolist()]])  # (1, 3, 4)
        out, weights = module(x, need_weights=True)
        _, small_weights = module(x - torch.tensor([1000.0, 0, 0, 0]), need_weights=True)  # scores [0, 1, -1]
    assert torch.isfinite(out).all()
    torch.testing.assert_close(weights[0, 0, 2], stable)
    torch.testing.assert_close(small_weights, weights)  # the same scores minus 1000: the same weights


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



@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_tour_heads_split_with_view_and_transpose_and_merge_back_exactly(attention):
    # Guards the module's head split (head h owns channels h*D .. (h+1)*D - 1) and its merge
    # (transpose back before view): a merge without the transpose interleaves heads and tokens.
    B, T, H, D = 2, 5, 3, 4
    C = H * D
    module = CausalSelfAttention(C, H, attention=attention)
    with torch.no_grad():  # proj = identity: the module's output is its merged heads
        module.proj.weight.copy_(torch.eye(C))
        module.proj.bias.zero_()
        x = torch.randn(B, T, C)
        out, _ = module(x)  # (B, T, C)
        by_hand, head_weights = attention_by_hand(module, x)  # each head from its own block of the weights
    for h in range(H):  # head h's output lies in channels h*D .. (h+1)*D - 1, for every token
        torch.testing.assert_close(out[..., h * D : (h + 1) * D], by_hand[..., h * D : (h + 1) * D], atol=ATOL, rtol=RTOL)
    if attention == "manual":
        torch.testing.assert_close(module(x, need_weights=True)[1], head_weights, atol=ATOL, rtol=RTOL)
    # Why contiguous(): weights @ v lays its (B, H, T, D) out head by head, not in (B, T, C) order.
    with pytest.raises(RuntimeError, match="view"):
        torch.randn(B, H, T, D).transpose(1, 2).view(B, T, C)



def test_tour_one_fused_qkv_matrix_equals_three_projections_and_per_head_matrices():
    # Guards the order of the module's split of qkv(x): q, k, v from rows [0:C], [C:2C], [2C:3C]
    # (taking k before q, say, fails here), and each head using its own (D, C) block of them.
    C, H = 12, 3
    D = C // H
    module = CausalSelfAttention(C, H, bias=False, attention="manual")
    x = torch.randn(2, 5, C)
    W = module.qkv.weight  # (3C, C): rows [0:C] are W_q, [C:2C] W_k, [2C:3C] W_v
    made = {}

    def catch(activation, hook):  # what the module's steps 1 and 2 made: hook_q, hook_k, hook_v (B, T, H, D)
        made[hook.name[-1]] = activation

    for point in (module.hook_q, module.hook_k, module.hook_v):
        point.add_hook(catch)
    with torch.no_grad():
        out, weights = module(x, need_weights=True)
        by_hand, head_weights = attention_by_hand(module, x)  # head h: x @ W_q[h*D:(h+1)*D].T, and so on
        for offset, name in enumerate("qkv"):  # three separate Linear(C, C), split into heads, give the same
            separate = torch.nn.Linear(C, C, bias=False)
            separate.weight.copy_(W[offset * C : (offset + 1) * C])
            torch.testing.assert_close(separate(x).view(2, 5, H, D), made[name])
    torch.testing.assert_close(weights, head_weights, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(out, module.proj(by_hand), atol=ATOL, rtol=RTOL)


def test_tour_without_positions_attention_sees_a_set_and_rope_scores_a_key_by_how_far_back_it_is():
    torch.manual_seed(0)
    plain = CausalSelfAttention(16, 2, attention="manual")
    rope = CausalSelfAttention(16, 2, attention="manual", rope=True)
    rope.load_state_dict(plain.state_dict())
    x = torch.randn(1, 6, 16)
    shuffled = x[:, [3, 0, 4, 1, 2, 5]]  # the first five tokens in another order, the last one last
    repeated = torch.randn(1, 1, 16).expand(1, 10, 16)  # one token, ten times
    with torch.no_grad():
        # Without positions the last token's output is the same whatever order the others came in...
        torch.testing.assert_close(plain(shuffled)[0][:, -1], plain(x)[0][:, -1], atol=ATOL, rtol=RTOL)
        assert not torch.allclose(rope(shuffled)[0][:, -1], rope(x)[0][:, -1], atol=1e-3)  # ...with RoPE it is not
        _, flat = plain(repeated, need_weights=True)  # (1, 2, 10, 10)
        _, turned = rope(repeated, need_weights=True)
    torch.testing.assert_close(flat[0, :, 9], torch.full((2, 10), 0.1))  # ten equal copies: uniform

    def score_against_own(t: int, d: int) -> torch.Tensor:  # (H,) query t's score for key t - d minus for key t
        return turned[0, :, t, t - d].log() - turned[0, :, t, t].log()  # softmax keeps score differences as log-ratios

    for d in (1, 3, 5):
        torch.testing.assert_close(score_against_own(9, d), score_against_own(6, d), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(score_against_own(9, 1), score_against_own(9, 3), atol=1e-2)


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
    # In the module too, each (batch row, head) is its own attention: batch row 1's head 2 alone
    # by hand gives the module's weights[1, 2] (guards heads or batch rows mixing in the matmul).
    module = CausalSelfAttention(H * D, H, attention="manual")
    x = torch.randn(B, T, H * D)
    with torch.no_grad():
        _, weights = module(x, need_weights=True)  # (B, H, T, T)
        torch.testing.assert_close(weights[1, 2], attention_by_hand(module, x[1:2])[1][0, 2], atol=ATOL, rtol=RTOL)


def test_tour_torch_dot_takes_two_1d_vectors_where_the_at_operator_dispatches_by_rank():
    # A fact about torch: torch.dot is the dot product of two 1-D vectors and nothing else, while @
    # (torch.matmul) reads the ranks: 1-D @ 1-D is that dot product, 2-D @ 1-D one per row, 2-D @ 2-D
    # every pair, and more dims a batch of those.
    q, k = torch.randn(4), torch.randn(4)
    Q, K = torch.randn(3, 4), torch.randn(5, 4)
    with pytest.raises(RuntimeError, match="1D tensors expected"):
        torch.dot(Q, K)
    assert (q @ k).shape == () and torch.equal(q @ k, torch.dot(q, k))
    assert (Q @ k).shape == (3,) and (Q @ K.T).shape == (3, 5)
    torch.testing.assert_close(Q @ K.T, torch.stack([torch.stack([torch.dot(a, b) for b in K]) for a in Q]))
    torch.testing.assert_close(Q @ k, torch.mv(Q, k))  # one function per kind of product; @ picks among them
    torch.testing.assert_close(Q @ K.T, torch.mm(Q, K.T))
    with pytest.raises(RuntimeError):
        torch.mm(Q, k)  # mm takes two matrices only
    np.testing.assert_allclose(np.dot(Q.numpy(), K.T.numpy()), (Q @ K.T).numpy(), rtol=1e-5)  # NumPy's dot reads ranks
    # The module's step 4: each score is one such dot product, of a query row and a key row, over sqrt(D).
    module = CausalSelfAttention(12, 3, attention="manual")
    made = {}
    for point in (module.hook_q, module.hook_k, module.hook_attn_scores):
        point.add_hook(lambda activation, hook: made.setdefault(hook.name, activation))
    with torch.no_grad():
        module(torch.randn(2, 5, 12))
    q, k, scores = made["hook_q"], made["hook_k"], made["hook_attn_scores"]  # (B, T, H, D), (B, S, K, D), (B, H, T, S)
    for b, h, t, s in ((0, 0, 4, 1), (1, 2, 3, 3), (1, 1, 4, 0)):
        expected = torch.dot(q[b, t, h], k[b, s, h]) / math.sqrt(module.head_dim)
        torch.testing.assert_close(scores[b, h, t, s], expected, atol=ATOL, rtol=RTOL)
    assert scores[1, 1, 0, 4] == float("-inf")  # a later key: hook_attn_scores comes after the mask, as in TransformerLens


def test_tour_q_dot_k_has_variance_d_only_when_the_channels_have_mean_0():
    # Guards section 2's premise: channels of mean 0 and variance 1 give q . k a variance of D, so the
    # module's scaled scores have variance 1; channels of mean 1 give each product variance 3 and mean 1.
    torch.manual_seed(0)
    B, T, D = 64, 32, 64
    module = CausalSelfAttention(D, 1, bias=False, attention="manual")
    with torch.no_grad():
        module.qkv.weight[: 2 * D] = torch.cat([torch.eye(D), torch.eye(D)])  # queries and keys: the tokens themselves
    earlier = torch.ones(T, T, dtype=torch.bool).tril(diagonal=-1)  # pairs of different tokens: independent q and k
    made = {}
    module.hook_attn_scores.add_hook(lambda scores, hook: made.update(scores=scores[:, 0][:, earlier]))  # (B, pairs)
    for mean, variance in ((0.0, 1.0), (1.0, 3.0)):
        with torch.no_grad():
            module(torch.randn(B, T, D) + mean)
        scores = made["scores"]  # q . k / sqrt(D)
        assert scores.var().item() == pytest.approx(variance, rel=0.1), mean
        assert scores.mean().item() == pytest.approx(mean * math.sqrt(D), abs=0.1), mean  # q . k has mean D * mean^2


def test_tour_b_k_adds_the_same_to_every_score_in_a_row_so_softmax_cancels_it_and_b_q_does_not():
    # q . (k_s + b_k) = q . k_s + q . b_k: the second term is the same for every key s of query q's row, and
    # softmax ignores what a whole row gains. (q + b_q) . k_s = q . k_s + b_q . k_s changes with s.
    torch.manual_seed(0)
    C, H = 12, 3
    x = torch.randn(2, 6, C)
    shift = torch.randn(C) * 3

    def with_bias_moved(module: CausalSelfAttention, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        moved = CausalSelfAttention(C, H, attention="manual", rope=module.rope, qk_norm=module.q_norm is not None)
        moved.load_state_dict(module.state_dict())
        with torch.no_grad():
            moved.qkv.bias[rows] += shift
            return moved(x, need_weights=True)

    module = CausalSelfAttention(C, H, attention="manual")  # biases on (the GPT's are off: model.bias=false)
    b_q, b_k, b_v = slice(0, C), slice(C, 2 * C), slice(2 * C, 3 * C)  # their rows of qkv.bias
    with torch.no_grad():
        out, weights = module(x, need_weights=True)
    k_out, k_weights = with_bias_moved(module, b_k)
    torch.testing.assert_close(k_weights, weights, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(k_out, out, atol=ATOL, rtol=RTOL)
    q_out, q_weights = with_bias_moved(module, b_q)
    assert not torch.allclose(q_weights, weights, atol=1e-3) and not torch.allclose(q_out, out, atol=1e-3)
    # b_v: each row of weights sums to 1, so every output moves by the same W_o b_v, whatever the weights.
    v_out, v_weights = with_bias_moved(module, b_v)
    torch.testing.assert_close(v_weights, weights, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(v_out - out, (module.proj.weight @ shift).expand_as(out), atol=ATOL, rtol=RTOL)
    # Rotary positions turn b_k by each key's position, and QK-norm rescales it with the key: no longer the same.
    for options in ({"rope": True}, {"qk_norm": True}):
        turned = CausalSelfAttention(C, H, attention="manual", **options)
        with torch.no_grad():
            _, turned_weights = turned(x, need_weights=True)
        assert not torch.allclose(with_bias_moved(turned, b_k)[1], turned_weights, atol=1e-3), options


def test_tour_the_letters_table_has_the_modules_letters_and_a_notebooks_n_by_t_is_the_modules_t_by_c():
    import model.attention

    tour = (ROOT / "docs" / "attention.md").read_text()
    table = re.findall(r"^\| `([A-Z])` \|", tour, flags=re.MULTILINE)  # the letters table's first column
    defined = re.findall(r"(?m)(?:^    |\s{3,})([A-Z])  \S", model.attention.__doc__)  # the module's docstring
    assert table == defined == ["B", "T", "C", "H", "D", "K", "S"]
    # A notebook's x of N tokens, each T numbers wide, is the module's (T, C): one sequence, B = 1.
    N, T = 5, 12  # the notebook's letters
    module = CausalSelfAttention(T, 3)
    made = {}
    module.hook_q.add_hook(lambda q, hook: made.update(q=q))
    x = torch.randn(N, T)
    with torch.no_grad():
        out, _ = module(x.unsqueeze(0))  # (B, T, C) = (1, N, the notebook's T)
    assert out.shape == (1, N, T) and made["q"].shape == (1, N, 3, T // 3)  # (B, T, H, D) in the module's letters
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        module(x.T.unsqueeze(0))  # read the other way round: 12 tokens 5 wide, where the module takes 12 wide


def test_tour_a_function_on_hook_z_runs_in_every_forward_it_is_attached_to_not_only_for_knock_outs():
    # Step 7 hands z to hook_z on every forward, on both paths: a function there runs each time, whether it
    # only reads (a cache, a probe), replaces z (a knock-out, a patch) or hands back None.
    torch.manual_seed(0)
    x = torch.randn(2, 5, 12)
    for attention in ("sdpa", "manual"):
        module = CausalSelfAttention(12, 3, attention=attention)
        seen = []
        with torch.no_grad():
            intact, _ = module(x)
            detach = module.hook_z.add_hook(lambda z, hook, seen=seen: seen.append(tuple(z.shape)))
            read, _ = module(x)
            module(x[:, :3])
            detach()
            module(x)
        assert seen == [(2, 5, 3, 4), (2, 3, 3, 4)], attention  # (B, T, H, D), once a forward while attached
        assert torch.equal(read, intact), attention  # reading changes no bit


def test_tour_heatmap_colours_are_on_a_square_root_scale():
    from inspection.heatmap import COLORMAP, FUTURE, colour_level, render_attention_map

    assert colour_level(np.array([0.0, 0.25, 1.0])).tolist() == [0, 128, 255]  # 0.25: half way up
    weights = np.tril(np.full((4, 4), 0.25))  # every visible weight 0.25
    pixels = render_attention_map(weights, ["a", "b", "c", "d"], "t").reshape(-1, 3)
    assert (pixels == COLORMAP[128]).all(axis=1).sum() > (pixels == FUTURE).all(axis=1).sum() > 0


def test_every_test_the_tour_cites_exists():
    tour = (ROOT / "docs" / "attention.md").read_text()
    cited = set(re.findall(r"`(test_\w+)`", tour))
    assert len(cited) >= 10
    defined = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        defined |= set(re.findall(r"^def (test_\w+)", path.read_text(), flags=re.MULTILINE))
    assert cited <= defined, cited - defined


def test_every_numbered_section_and_question_of_the_tour_cites_a_test():
    tour = (ROOT / "docs" / "attention.md").read_text()
    parts = re.split(r"^(?=#{1,3} )", tour, flags=re.MULTILINE)  # from each heading to the next
    sections = [part for part in parts if re.match(r"## \d+\.", part)]
    questions = [part for part in parts if re.match(r"### Q\d+\.", part)]
    assert [int(re.match(r"## (\d+)", part)[1]) for part in sections] == list(range(1, 19))
    assert [int(re.match(r"### Q(\d+)", part)[1]) for part in questions] == list(range(1, 25))
    for part in sections + questions:
        assert re.search(r"`test_\w+`", part), part.splitlines()[0]


def test_the_tours_table_maps_each_section_to_the_steps_its_code_lines_are_in():
    # The table at the top of the tour says which of the module's numbered steps each section
    # walks through; every line a section quotes from model/attention.py must be in one of them.
    from docs.questions import step_of_each_line

    tour = (ROOT / "docs" / "attention.md").read_text()
    table = {int(number): {int(step) for step in re.findall(r"\d+", cell)}
             for number, cell in re.findall(r"^\| \[(\d+)\. [^]]*\]\([^)]*\) \|([^|]*)\|", tour, re.MULTILINE)}
    assert sorted(table) == list(range(1, 19))
    source = (ROOT / "model" / "attention.py").read_text().splitlines()
    steps = step_of_each_line()  # {line number: (step, title)}
    checked = 0
    for section in re.split(r"^(?=## \d+\.)", tour, flags=re.MULTILINE)[1:]:
        number = int(re.match(r"## (\d+)\.", section)[1])
        own_text = re.split(r"\n#{1,3} ", section)[0]  # up to its first question or the next part
        for block in re.findall(r"^```python\n(.*?)^```", own_text, flags=re.MULTILINE | re.DOTALL):
            for quoted in block.splitlines():
                in_steps = {steps[i + 1][0] for i, line in enumerate(source) if line.strip() == quoted.strip() and i + 1 in steps}
                assert in_steps <= table[number], f"section {number} quotes step {in_steps} code: {quoted.strip()}"
                checked += bool(in_steps)
    assert checked >= 9


def test_the_tour_pictures_numbers_are_what_the_code_computes_now():
    # The pictures are drawn from these numbers, computed by running the module and the GPT's
    # init: a change there or in docs/questions.py that would change a picture fails here
    # until `make docs` redraws it.
    from docs.questions import FOLDER, figure_data, first_difference

    committed = json.loads((FOLDER / "figures.json").read_text())
    committed.pop("drawn_with")
    assert first_difference(figure_data(), committed) is None, first_difference(figure_data(), committed)
    tour = (ROOT / "docs" / "attention.md").read_text()
    for picture in re.findall(r"\]\((questions/\w+\.png)\)", tour):
        assert (ROOT / "docs" / picture).is_file(), picture


def test_make_docs_keeps_the_tour_figures_that_differ_by_float32s_last_bits_and_finds_any_other_change():
    # make docs on another CPU rewrote most of figures.json by a last bit each; now such figures are kept.
    from docs.questions import first_difference

    kept = {"softmax": [[0.2597988247871399, 0.0], [1.0]], "sizes": {"4": 256}}
    assert first_difference({"softmax": [[0.2597987949848175, 0.0], [1.0]], "sizes": {"4": 256}}, kept) is None
    assert first_difference({"softmax": [[0.2599, 0.0], [1.0]], "sizes": {"4": 256}}, kept) == "figures.json.softmax[0][0]"
    assert first_difference({"softmax": [[0.2597988247871399, 0.0], [1.0]], "sizes": {"4": 128}}, kept) == "figures.json.sizes.4"
    assert first_difference({"softmax": [[0.2597988247871399, 0.0]], "sizes": {"4": 256}}, kept) == "figures.json.softmax"
    assert first_difference({"sizes": {"4": 256}}, kept) == "figures.json"  # a figure added or dropped


def test_the_figures_the_tour_quotes_from_a_computation_are_the_ones_make_docs_recorded():
    # docs/questions/figures.json, written by `make docs` and recomputed by the test above.
    from docs.questions import FOLDER, INITS

    figures = json.loads((FOLDER / "figures.json").read_text())
    tour = " ".join((ROOT / "docs" / "attention.md").read_text().split())
    scale = figures["scale_and_head_size"]
    unscaled = dict(zip(scale["head_size"], scale["unscaled"], strict=True))
    spread = [figures["init_scale"][name][-1] for name in INITS]  # after the last block
    sizes = figures["kv_cache_sizes"]
    smol, full_block = sizes["smollm2_135m"], sizes["default_full_block_kib"]
    K, H = str(smol["n_kv_head"]), str(smol["n_head"])
    for quoted in (
        f"that is {smol['bytes_per_token'][K]:,} bytes a token with its {K} key/value heads and "
        f"{smol['bytes_per_token'][H]:,} with {H}: at its context of {smol['context']:,} tokens, "
        f"{smol['mib_at_context'][K]:.0f} MiB instead of {smol['mib_at_context'][H]:.0f} MiB",
        f"a full `block_size` of {sizes['default_shape']['block_size']} tokens takes {full_block['4']:.0f} KiB, "
        f"{full_block['2']:.0f} KiB with `K = 2` and {full_block['1']:.0f} KiB with `K = 1`",
        f"without the scale the largest weight averages {unscaled[32]:.2f} at the default model's D = 32 and "
        f"{unscaled[256]:.2f} at D = 256; with it, between {min(scale['scaled']):.2f} and {max(scale['scaled']):.2f} "
        f"at every D from {scale['head_size'][0]} to {scale['head_size'][-1]}",
        f"the stream's spread after the last block is {spread[0]:.2f} times the embeddings' with the project's init, "
        f"{spread[1]:.1f} times without the scaling (growing with depth), and {spread[2]:,.0f} times with std 1",
    ):
        assert quoted in tour, quoted
    assert f"SmolLM2-135M ({smol['n_layer']} layers, `D = {smol['head_dim']}`, bf16's 2 bytes a number)" in tour
    assert f"SmolLM2-135M has {H} query heads and {K} key/value heads" in tour


def test_the_tour_pictures_are_what_docs_questions_py_draws_from_their_numbers(tmp_path):
    from docs.drawing import drawn_with
    from docs.questions import FOLDER, PICTURES, draw_all

    committed = json.loads((FOLDER / "figures.json").read_text())
    if committed.pop("drawn_with") != drawn_with():
        pytest.skip(f"the pictures were drawn with {committed} and this machine has {drawn_with()}: "
                    "other anti-aliasing (their numbers are still checked)")
    draw_all(committed, tmp_path)
    for name in PICTURES:
        kept, drawn = (np.asarray(Image.open(folder / f"{name}.png").convert("RGB")) for folder in (FOLDER, tmp_path))
        assert kept.shape == drawn.shape and (kept == drawn).all(), f"docs/questions/{name}.png is stale: run make docs"


def test_every_picture_of_the_docs_is_shown_at_its_own_size_so_its_labels_stay_11_px():
    from docs.drawing import SHOWN_WIDTH

    pictures = sorted((ROOT / "docs").glob("**/*.png"))
    assert len(pictures) >= 8
    for picture in pictures:
        width, _ = Image.open(picture).size
        if picture.name != "attention_tab.png":  # a browser screenshot, taken at the tab's own size
            assert width <= SHOWN_WIDTH, f"{picture.name} is {width} px wide: shown at {SHOWN_WIDTH}, its labels shrink"
        assert picture.stat().st_size < 300_000, picture.name
    assert Image.open(ROOT / "docs" / "questions" / "mask_conventions.png").size[0] >= 800


def test_the_run_the_docs_quote_is_a_run_of_the_defaults_and_the_text_quotes_it_right():
    # docs/attention_maps.png and the numbers of sections 14 to 16 come from one run, recorded by `make docs`
    # in docs/attention_maps.json: when a default changes, this fails until they are redrawn.
    from runtime.devices import Machine
    from runtime.precision import choose_dtype
    from tests.helpers import preset_beside_record

    record = json.loads((ROOT / "docs" / "attention_maps.json").read_text())
    # The record in today's form, as a checkpoint of that run would load, and train.dtype=auto as it
    # resolves on the CPU it ran on: a run of today's defaults there computes exactly what that run computed.
    defaults, record["config"] = preset_beside_record(record["config"])
    for config in (defaults, record["config"]):
        config["train"]["dtype"] = choose_dtype(config["train"]["dtype"], torch.device("cpu"), Machine())[0]
    for group in ("model", "data", "tokenizer", "optim", "train"):
        assert record["config"][group] == defaults[group], (
            f"docs/attention_maps.png comes from a run whose {group} config is not today's default: "
            "make train, then make docs RUN=<that run>")
    assert record["step"] == defaults["train"]["max_steps"]
    tour = (ROOT / "docs" / "attention.md").read_text()
    section_15 = tour[tour.index("## 15."): tour.index("## 16.")]
    recall = record["name_recall"]
    at_most = math.ceil(record["largest_induction_score_at_the_end"] * 1000) / 1000  # rounded up: "or below"
    for quoted in (f"{at_most:.3f} or below at step {record['step']}",
                   f"from {recall['400']:.1%} at step 400 to {recall[str(record['step'])]:.1%} at step {record['step']}"):
        assert quoted in " ".join(section_15.split()), quoted
    for page, quoted in (("docs/induction.md", f"every `head_induction` stays at {at_most:.3f} or below"),
                         ("docs/default_model.md", f"No head scores above {at_most:.3f} on induction")):
        assert quoted in " ".join((ROOT / page).read_text().split()), page
    for page in ("README.md", "docs/default_model.md"):
        heads = " and ".join(f"layer {layer} head {head}" for layer, head, _ in record["heads"])
        assert f"Attention maps of {heads} at step {record['step']} of the default run" in (ROOT / page).read_text(), page


def test_the_numbers_the_pages_quote_from_the_default_run_are_the_ones_make_docs_recorded():
    # Sections 14 to 16 of the tour quote the default run; `make docs` records those numbers in
    # docs/attention_maps.json (docs/figures.py), the picture's run.
    record = json.loads((ROOT / "docs" / "attention_maps.json").read_text())
    tour = " ".join((ROOT / "docs" / "attention.md").read_text().replace("**", "").split())
    cell = record["framed_cell"]
    name = cell["key_token"].strip()
    for page in (ROOT / "README.md", ROOT / "docs" / "default_model.md", ROOT / "docs" / "attention.md"):
        for quoted in re.findall(rf'"{name}" \(weight (\d\.\d+)\)', page.read_text()):  # "Alice" (weight 0.99)
            assert quoted == f"{cell['weight']:.2f}", page.name
    assert f'second "{name}" straight back to the first "{name}" (weight {cell["weight"]:.2f}), the framed cell' in tour

    table = record["without_each_head"]
    others = table["others"]
    rows = [f"| every head in | {table['intact']:.3f} | | |"]
    rows += [f"| {layer}, {head} | {without:.3f} | {look_back:.3f} | {induction:.3f} |"
             for layer, head, without, look_back, induction in table["heads"]]
    rows.append(f"| the other {others['count']} | {others['without'][0]:.3f} to {others['without'][1]:.3f} | "
                f"{others['look_back'][0]:.3f} to {others['look_back'][1]:.3f} | at most {others['largest_induction']:.3f} |")
    text = record["your_text"]
    (first, second), lost = text["heads"], text["without_the_first"]
    quoted = [
        *rows,
        f'"{text["query_token"]}" before the second "{text["name"]}" puts {first["weight"]:.2f} of its weight on the first '
        f'"{text["name"]}" in layer {first["layer"]} head {first["head"]} and {second["weight"]:.2f} in layer '
        f'{second["layer"]} head {second["head"]}, the two heads with the run\'s highest look-back weights '
        f'({first["look_back"]:.2f} and {second["look_back"]:.2f})',
        f'Knock out layer {first["layer"]} head {first["head"]} and the loss of "{text["name"]}" goes from '
        f'{text["loss"]:.2f} to {first["loss_without"]:.2f} nats',
        f'and "{lost["top_2"][0]}" and "{lost["top_2"][1]}" lead',
        f'knock out layer {second["layer"]} head {second["head"]} and it goes to {second["loss_without"]:.2f}',
        f'two heads look ({first["look_back"]:.3f} and {second["look_back"]:.3f})',
    ]
    assert text["text"] in tour and not lost["name_in_top_5"] and f'"{text["name"]}" leaves the top 5' in tour
    for sentence in quoted:
        assert sentence in tour, sentence


def test_the_readme_and_default_model_page_quote_the_default_run_make_docs_recorded():
    # The same record as above (docs/attention_maps.json): the figures README.md and
    # docs/default_model.md quote from the default run, at the precision they quote them.
    record = json.loads((ROOT / "docs" / "attention_maps.json").read_text())
    recall, table = record["name_recall"], record["without_each_head"]
    copier, second = table["heads"][:2]  # (layer, head, recall without it, look-back weight, induction)
    readme = " ".join((ROOT / "README.md").read_text().split())
    page = " ".join((ROOT / "docs" / "default_model.md").read_text().replace("**", "").split())
    assert f"0% at step 0, **{100 * recall['800']:.1f}%** at step 800" in readme
    assert f"name recall without each head ({copier[2]:.3f} without head {copier[1]}" in readme
    assert "| `recall/accuracy_name` | " + " | ".join(f"{100 * recall[step]:.{0 if recall[step] == 0 else 1}f}%"
                                                     for step in ("0", "200", "400", "600", "800")) in page
    assert (f"layer {copier[0]} head {copier[1]}: {copier[3]:.2f}, layer {second[0]} head {second[1]}: {second[3]:.2f}"
            in page)
    assert (f"name recall falls from {100 * table['intact']:.0f}% to {100 * copier[2]:.0f}% with layer {copier[0]} head "
            f"{copier[1]} knocked out alone, and only to {100 * second[2]:.0f}% without layer {second[0]} head {second[1]}"
            in page)
