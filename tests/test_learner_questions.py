"""The learner's questions in docs/attention.md ("Questions learners ask"), each answered by a
check that runs: where the answer is about this project's module, the check runs the module,
so that it fails when the module is wrong, not only when torch is."""

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from model import GPT, GPTConfig
from model.attention import CausalSelfAttention, KVCache
from tests.helpers import multihead_attention_like

ATOL, RTOL = 1e-5, 1e-4


@dataclass
class Caught:
    """What the module's own forward handed to its steps 4 to 6, and what came back."""

    q: torch.Tensor  # (B, H, T, D): steps 1 and 2, the module's projection and head split
    k: torch.Tensor  # (B, H, S, D)
    v: torch.Tensor  # (B, H, S, D)
    visible: torch.Tensor  # (1 or B, 1, T, S): step 3, the module's mask
    out: torch.Tensor  # (B, H, T, D): before step 8's merge
    weights: torch.Tensor  # (B, H, T, S)


def run_and_catch(module: CausalSelfAttention, x: torch.Tensor, **kwargs) -> tuple[torch.Tensor, Caught]:
    """module(x, need_weights=True, **kwargs), catching what its forward passes through
    attend_manual on the way (the module's q, k, v, mask, and heads before the merge)."""
    caught = []
    attend = module.attend_manual

    def catch(q, k, v, visible, no_key_visible):
        out, weights = attend(q, k, v, visible, no_key_visible)
        caught.append(Caught(q, k, v, visible, out, weights))
        return out, weights

    module.attend_manual = catch
    try:
        out, _ = module(x, need_weights=True, **kwargs)
    finally:
        del module.attend_manual
    return out, caught[0]


def identity_projection(module: CausalSelfAttention) -> CausalSelfAttention:
    """proj = identity, so that the module's output is its merged heads (step 8) exactly."""
    with torch.no_grad():
        module.proj.weight.copy_(torch.eye(module.proj.weight.shape[0]))
        if module.proj.bias is not None:
            module.proj.bias.zero_()
    return module


def merged(module: CausalSelfAttention, out: torch.Tensor) -> torch.Tensor:
    """A reference for steps 8 and 9: heads (B, H, T, D) side by side, projected."""
    B, H, T, D = out.shape
    return module.proj(out.transpose(1, 2).reshape(B, T, H * D))  # (B, T, C)


def test_q1_a_hide_mask_given_to_sdpa_is_silently_wrong_and_inverting_it_is_the_fix():
    torch.manual_seed(0)
    module = CausalSelfAttention(16, 2, attention="manual")
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        expected, caught = run_and_catch(module, x)
        q, k, v = caught.q, caught.k, caught.v  # the module's own heads
        hide = torch.ones(5, 5, dtype=torch.bool).triu(diagonal=1)  # True = hide: masked_fill's convention
        wrong_heads = F.scaled_dot_product_attention(q, k, v, attn_mask=hide)  # (1, H, T, D)
        wrong = merged(module, wrong_heads)
        fixed = merged(module, F.scaled_dot_product_attention(q, k, v, attn_mask=~hide))  # True = may attend
    assert torch.isfinite(wrong).all()  # no error, no NaN...
    assert (wrong_heads[:, :, -1] == 0).all()  # the last query, left with no key, gets zeros
    assert not torch.allclose(wrong, expected, atol=1e-3)  # ...and wrong: each query saw only the future
    torch.testing.assert_close(fixed, expected, atol=ATOL, rtol=RTOL)
    # The module's own `visible` is SDPA's convention; its padding mask is nn.MultiheadAttention's.
    assert torch.equal(caught.visible[0, 0], ~hide)
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
        pytest.warns(UserWarning, match=r"Error detected in DivBackward0(.|\n)*leaf\.exp\(\) / leaf"),  # with the forward's line
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
    # The module's keepdim: step 3 marks the queries that see no key as (B, 1, T, 1), which
    # lines up with (B, H, T, S); without keepdim, (B, 1, T) would line up with (H, T, S).
    module = CausalSelfAttention(6, 3, bias=False, attention="manual")  # B = 2, H = 3, T = S = 4: no two alike
    padding = torch.tensor([[True, True, False, False], [False, False, False, False]])
    visible, no_key_visible = module._visible(2, 4, 4, padding, torch.device("cpu"))
    assert no_key_visible.shape == (2, 1, 4, 1) and visible.shape == (2, 1, 4, 4)
    assert no_key_visible.flatten().tolist() == [True, True, False, False] + [False] * 4  # queries 0, 1 of row 0
    out, weights = module(torch.randn(2, 4, 6), key_padding_mask=padding, need_weights=True)
    assert (out[0, :2] == 0).all() and (weights[0, :, :2] == 0).all()  # those two queries attend to nothing
    assert (out[0, 2:] != 0).any(dim=-1).all() and (out[1] != 0).any(dim=-1).all()  # every other query does
    torch.testing.assert_close(weights[0, :, 2:].sum(dim=-1), torch.ones(3, 2))  # each row over its own keys
    torch.testing.assert_close(weights[1].sum(dim=-1), torch.ones(3, 4))


def test_q4_dividing_scores_by_their_sum_is_no_weighting_and_softmax_is():
    scores = torch.tensor([1.0, -1.2, 0.5])
    by_sum = scores / scores.sum()
    torch.testing.assert_close(by_sum, torch.tensor([10 / 3, -4.0, 5 / 3]))  # a weight of -4, one of 3.3
    # The module's steps 4 and 5 given a query and three keys that score exactly these (D = 1).
    module = CausalSelfAttention(1, 1, attention="manual")
    q, k = torch.ones(1, 1, 1, 1), scores.view(1, 1, 3, 1)  # q . k_s / sqrt(1) = scores[s]
    everything = torch.ones(1, 1, 1, 3, dtype=torch.bool)
    _, weights = module.attend_manual(q, k, torch.zeros(1, 1, 3, 1), everything, None)  # (1, 1, 1, 3)
    weights = weights.flatten()
    assert (weights > 0).all() and weights.sum().item() == pytest.approx(1.0, abs=1e-6)
    assert weights.argsort().tolist() == scores.argsort().tolist()  # the higher the score, the more weight
    torch.testing.assert_close(weights, scores.exp() / scores.exp().sum())  # exp, then divide by the sum
    # On real inputs too: positive where visible, zero where hidden, rows summing to 1.
    _, module_weights = CausalSelfAttention(8, 2, attention="manual")(torch.randn(3, 6, 8) * 5, need_weights=True)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    assert (module_weights[..., causal] > 0).all() and (module_weights[..., ~causal] == 0).all()
    torch.testing.assert_close(module_weights.sum(dim=-1), torch.ones(3, 2, 6))


def test_q5_keys_made_by_w_q_give_symmetric_scores_where_each_token_scores_itself_highest():
    torch.manual_seed(0)
    T, C = 32, 64
    module = CausalSelfAttention(C, 1, bias=False, attention="manual")
    x = torch.randn(1, T, C)
    with torch.no_grad():
        _, caught = run_and_catch(module, x)
        q, k = caught.q, caught.k  # (1, 1, T, C) each: the module's queries and keys
        proper = (q @ k.transpose(-2, -1))[0, 0]  # (T, T)
        same = (q @ q.transpose(-2, -1))[0, 0]  # K made by W_q: the classic bug
        bare = x[0] @ x[0].T  # no projections at all
    for scores in (same, bare):
        torch.testing.assert_close(scores, scores.T)
        assert torch.equal(scores.argmax(dim=1), torch.arange(T))  # all 32 tokens pick themselves
    assert not torch.allclose(proper, proper.T)
    assert (proper.argmax(dim=1) == torch.arange(T)).float().mean() < 0.2
    # The module makes its keys with rows C:2C of qkv (W_k), not rows 0:C (W_q).
    torch.testing.assert_close(k[0, 0], x[0] @ module.qkv.weight[C : 2 * C].T)
    assert not torch.allclose(k, q)


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
        _, caught = run_and_catch(module, x)  # q (B, H, T, D): the module's fused matrix, then its head split
        loop = torch.stack([x @ per_head[h] for h in range(H)], dim=1)  # (B, H, T, D)
        einsum = torch.einsum("btc,hcd->bhtd", x, per_head)  # (B, H, T, D)
    torch.testing.assert_close(loop, caught.q)
    torch.testing.assert_close(einsum, caught.q)


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
    # The module's merge (step 8) lays head h of token t in channels h*D .. (h+1)*D - 1 of
    # token t, in every case; T = 1 is the KV-cache step, one new token after earlier ones.
    module = identity_projection(CausalSelfAttention(H * D, H, attention="manual"))
    x = torch.randn(B, 4 + T, H * D)
    cache = KVCache(4 + T)
    with torch.no_grad():
        module(x[:, :4], cache=cache)
        merged_heads, caught = run_and_catch(module, x[:, 4:], cache=cache)  # (B, T, C), heads (B, H, T, D)
    for h in range(H):
        assert torch.equal(merged_heads[..., h * D : (h + 1) * D], caught.out[:, h])  # a copy: exactly equal


def test_q8_attention_dropout_drops_weights_before_they_meet_v_and_is_off_in_eval():
    torch.manual_seed(0)
    module = CausalSelfAttention(16, 2, dropout=0.5, attention="manual")
    module.resid_dropout.p = 0.0  # keep only the attention dropout, to find where it acts
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        torch.manual_seed(1)
        out, caught = run_and_catch(module, x)  # weights: as softmax gave them, before dropout
        weights, v = caught.weights, caught.v
        torch.testing.assert_close(weights.sum(dim=-1), torch.ones(2, 2, 6))
        torch.manual_seed(1)  # the same random draw, applied by hand to the weights
        dropped = F.dropout(weights, 0.5, training=True)  # kept weights scaled by 1 / (1 - p)
        torch.testing.assert_close(out, merged(module, dropped @ v), atol=ATOL, rtol=RTOL)
        assert not torch.allclose(dropped.sum(dim=-1), torch.ones(2, 2, 6))  # rows no longer sum to 1
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
        q = torch.randn(1000, 1, 1, D) + 1.0  # (B, H, T, D): 1000 queries whose every channel has mean 1, not 0
        keys = torch.randn(1000, 1, 32, D) + 1.0  # (B, H, S, D): 32 keys for each
        assert (torch.einsum("bhtd,bhsd->bhts", q, keys) / math.sqrt(D)).mean().item() == pytest.approx(math.sqrt(D), rel=0.05)
        module = CausalSelfAttention(D, 1, attention="manual")  # its steps 4 and 5 divide by sqrt(head_dim)
        everything = torch.ones(1, 1, 1, 32, dtype=torch.bool)  # one query sees all 32 keys
        for centre, spread in ((False, 2.0), (True, 1.0)):  # 1 + mean^2 = 2; centred, 1
            if centre:
                q, keys = q - q.mean(dim=-1, keepdim=True), keys - keys.mean(dim=-1, keepdim=True)
            _, weights = module.attend_manual(q, keys, keys, everything, None)  # (1000, 1, 1, 32)
            scores = weights.log()  # the module's scaled scores, up to a shift per row (softmax drops it)
            assert scores.var(dim=-1).mean().item() == pytest.approx(spread, rel=0.1), (D, centre)


def test_multihead_attention_uses_true_to_hide_like_masked_fill():
    # Q1's other half: torch's nn.MultiheadAttention reads a bool attn_mask and key_padding_mask as
    # True = hide, and so does the module's key_padding_mask: given the same weights, they agree.
    torch.manual_seed(0)
    module = CausalSelfAttention(8, 2, attention="manual")
    mha = multihead_attention_like(module)
    x = torch.randn(2, 4, 8)
    hide = torch.ones(4, 4, dtype=torch.bool).triu(diagonal=1)  # True = hide, for nn.MultiheadAttention
    padding = torch.tensor([[False, True, False, False], [False, False, False, True]])  # True = a padding key
    with torch.no_grad():
        expected, expected_weights = mha(x, x, x, attn_mask=hide, key_padding_mask=padding, average_attn_weights=False)
        out, weights = module(x, key_padding_mask=padding, need_weights=True)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(weights, expected_weights, atol=ATOL, rtol=RTOL)
    assert (weights[0, :, :, 1] == 0).all() and (weights[1, :, :, 3] == 0).all() and (weights[..., hide] == 0).all()


class ContiguousCalls(TorchFunctionMode):
    """Records, for each contiguous() a forward calls, whether it copied."""

    def __init__(self) -> None:
        super().__init__()
        self.copied: list[bool] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.Tensor.contiguous:
            self.copied.append(out.data_ptr() != args[0].data_ptr())
        return out


@pytest.mark.parametrize(("H", "T", "copies"), [(4, 6, True), (1, 6, False), (4, 1, False)])
def test_q11_the_merge_needs_contiguous_which_copies_only_when_the_memory_is_out_of_order(H, T, copies):
    B, D = 2, 3
    heads = torch.randn(B, H, T, D).transpose(1, 2)  # (B, T, H, D) read out of (B, H, T, D) memory
    assert heads.is_contiguous() == (not copies)
    assert (heads.contiguous().data_ptr() != heads.data_ptr()) == copies  # already in order: itself, no copy
    # The module's step 8 calls contiguous() once: a copy for 4 heads of 6 tokens, none when
    # H = 1 or when T = 1 (the KV-cache step); the merged heads are right in every case.
    module = identity_projection(CausalSelfAttention(H * D, H, attention="manual"))
    x = torch.randn(B, 4 + T, H * D)
    cache = KVCache(4 + T)
    with torch.no_grad():
        module(x[:, :4], cache=cache)
        calls = ContiguousCalls()
        with calls:
            merged_heads, caught = run_and_catch(module, x[:, 4:], cache=cache)
    assert calls.copied == [copies]
    assert torch.equal(merged_heads, caught.out.transpose(1, 2).reshape(B, T, H * D))


def test_q12_transpose_swaps_two_dims_and_permute_names_them_all_and_neither_copies():
    torch.manual_seed(0)
    B, T, H, D = 2, 5, 3, 4
    C = H * D
    module = CausalSelfAttention(C, H, bias=False, attention="manual")
    x = torch.randn(B, T, C)
    with torch.no_grad():
        _, caught = run_and_catch(module, x)
        queries = module.qkv(x)[..., :C]  # (B, T, C): the module's step 1, queries only
    split = queries.view(B, T, H, D)  # (B, T, H, D)
    assert torch.equal(split.transpose(1, 2), split.permute(0, 2, 1, 3))  # the same (B, H, T, D)
    assert torch.equal(caught.q, split.permute(0, 2, 1, 3))  # the module's split (step 2)
    # Neither copies: the module's q is still a view of the (B, T, 3C) projection, read with
    # other strides. Moving down a token jumps 3C numbers (one token's q, k and v), to the next head D.
    assert caught.q.stride() == split.transpose(1, 2).stride() == split.permute(0, 2, 1, 3).stride() == (T * 3 * C, D, 3 * C, 1)
    # view(B, H, T, D) has the right shape and the wrong numbers: it cuts the memory into
    # heads as if it were already head-major.
    assert not torch.equal(caught.q, queries.contiguous().view(B, H, T, D))
    # permute reorders any number of dims in one call; transpose needs one call per swap.
    assert torch.equal(split.permute(2, 0, 1, 3), split.transpose(1, 2).transpose(0, 1))  # (H, B, T, D)


def test_q13_einsum_writes_the_scores_the_weighted_sum_and_the_merge_with_named_axes():
    torch.manual_seed(0)
    B, T, H, D = 2, 5, 3, 4
    C = H * D
    module = CausalSelfAttention(C, H, bias=False, attention="manual")
    proj = module.proj
    with torch.no_grad():
        expected, caught = run_and_catch(module, torch.randn(B, T, C))
        q, k, v = caught.q, caught.k, caught.v  # (B, H, T, D) each, from the module's steps 1 and 2
        # The lines docs/attention.md shows (Q13), run on them:
        scores = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(D)  # q @ k.transpose(-2, -1): (B, H, T, S)
        weights = torch.softmax(scores.masked_fill(~caught.visible, float("-inf")), dim=-1)  # (B, H, T, S)
        heads = torch.einsum("bhts,bhsd->bhtd", weights, v)  # weights @ v: (B, H, T, D)
        out = torch.einsum("bhtd,hdc->btc", heads, proj.weight.T.reshape(H, D, C))  # merge and proj: (B, T, C)
    torch.testing.assert_close(weights, caught.weights, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(heads, caught.out, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)


def test_q14_the_mask_is_built_per_call_equal_to_a_slice_of_a_block_size_buffer_and_never_saved():
    block_size = 8
    buffer = torch.ones(block_size, block_size, dtype=torch.bool).tril()  # nanoGPT's way: (block_size, block_size)
    # Query t of T new tokens after S - T cached ones is token S - T + t: its row of the buffer.
    for T, S in ((8, 8), (5, 5), (1, 7), (3, 8)):
        visible, _ = CausalSelfAttention._visible(1, T, S, None, torch.device("cpu"))  # (1, 1, T, S)
        assert torch.equal(visible[0, 0], buffer[S - T : S, :S]), (T, S)
    # Nothing of it is saved: a checkpoint holds weights only (a buffer would add block_size^2 entries).
    model = GPT(GPTConfig(vocab_size=10, block_size=block_size, n_layer=1, n_head=2, n_embd=8))
    attention_state = {name for name in model.state_dict() if ".attn." in name}
    assert attention_state == {"blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight"}
    with_buffer = nn.Module()
    with_buffer.register_buffer("mask", buffer)
    assert with_buffer.state_dict()["mask"].numel() == block_size**2


def test_q15_a_float_mask_is_added_to_the_scores_so_it_must_hold_minus_inf_not_0_and_1():
    torch.manual_seed(0)
    module = CausalSelfAttention(16, 2, attention="manual")
    with torch.no_grad():
        _, caught = run_and_catch(module, torch.randn(2, 6, 16))
        q, k, v, visible = caught.q, caught.k, caught.v, caught.visible  # visible: bool, True = may attend
        additive = torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))  # 0 keeps, -inf hides
        torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=additive), caught.out, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=visible), caught.out, atol=ATOL, rtol=RTOL)
        # The bool mask turned into numbers, 1.0 and 0.0, adds 1 to every visible score: it hides nothing.
        ones_and_zeros = visible.float()
        wrong = F.scaled_dot_product_attention(q, k, v, attn_mask=ones_and_zeros)
        scores = q @ k.transpose(-2, -1) / math.sqrt(module.head_dim) + ones_and_zeros
        weights = torch.softmax(scores, dim=-1)  # what SDPA used
    torch.testing.assert_close(wrong, weights @ v, atol=ATOL, rtol=RTOL)
    assert (weights[..., ~visible[0, 0]] > 0.01).all()  # the future gets weight: no error, no NaN, wrong
    assert not torch.allclose(wrong, caught.out, atol=1e-3)


def test_q16_masked_fill_in_place_on_softmaxs_output_breaks_backward_and_the_module_fills_a_copy():
    torch.manual_seed(0)
    scores = torch.randn(2, 4, 4, requires_grad=True)
    no_key = torch.tensor([True, False, False, False]).view(4, 1)  # (T, 1): query 0 sees nothing
    weights = torch.softmax(scores, dim=-1)  # softmax keeps its output for backward...
    weights.masked_fill_(no_key, 0.0)  # ...which this overwrites
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        weights.sum().backward()
    # Before softmax it is fine: dividing by sqrt(D) keeps nothing that the fill overwrites.
    q = torch.randn(1, 1, 4, 8, requires_grad=True)
    future = torch.ones(4, 4, dtype=torch.bool).triu(diagonal=1)
    in_place = (q @ q.transpose(-2, -1) / math.sqrt(8)).masked_fill_(future, float("-inf"))
    copied = (q @ q.transpose(-2, -1) / math.sqrt(8)).masked_fill(future, float("-inf"))
    grads = [torch.autograd.grad(torch.softmax(s, dim=-1)[..., 1:, :].square().sum(), q)[0] for s in (in_place, copied)]
    torch.testing.assert_close(grads[0], grads[1])
    # The module zeroes the rows of queries that see no key after softmax, on a copy: its
    # backward runs, with finite gradients, through exactly such a row.
    module = CausalSelfAttention(8, 2, attention="manual")
    x = torch.randn(1, 3, 8, requires_grad=True)
    out, weights = module(x, key_padding_mask=torch.tensor([[True, False, False]]), need_weights=True)
    assert (weights[0, :, 0] == 0).all()
    (out.square().sum() + weights.square().sum()).backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def test_q17_the_gpt2_init_keeps_the_residual_streams_spread_flat_through_depth():
    from docs.questions import INITS, residual_spread

    n_layer = 16
    model = GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=n_layer, n_head=4, n_embd=64))
    residual_std = 0.02 / math.sqrt(2 * n_layer)  # the two projections that write into the residual stream
    for name, parameter in model.named_parameters():
        if name.endswith(("attn.proj.weight", "mlp.proj.weight")):
            assert parameter.std().item() == pytest.approx(residual_std, rel=0.05), name
        elif name.endswith(("qkv.weight", "fc.weight", "tok_emb.weight")):
            assert parameter.std().item() == pytest.approx(0.02, rel=0.05), name
    # Every logit starts near 0, so the first loss is that of a uniform guess, log(vocab_size);
    # with std 1 the model starts out sure of random answers.
    idx, targets = torch.randint(0, 64, (8, 32)), torch.randint(0, 64, (8, 32))
    with torch.no_grad():
        assert model(idx, targets)[1].item() == pytest.approx(math.log(64), rel=0.02)
        for layer in model.modules():
            if isinstance(layer, (nn.Linear, nn.Embedding)):
                nn.init.normal_(layer.weight, std=1.0)
        assert model(idx, targets)[1].item() > 3 * math.log(64)
    # The stream's spread after each block, relative to the embeddings' (docs/questions.py, the picture's numbers).
    spread = residual_spread(n_layer=n_layer)
    gpt2, unscaled, std_1 = (spread[name] for name in INITS)
    assert max(gpt2) < 1.5  # flat: 16 blocks add about as much as the embeddings hold
    assert unscaled[-1] > 2 * gpt2[-1]  # without the scaling it grows with depth, as sqrt(blocks)
    assert std_1[-1] > 100  # std 1: each block adds far more than the tokens' embeddings hold


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_q18_with_causal_false_every_query_sees_every_key_as_multihead_attention_without_a_mask(attention):
    torch.manual_seed(0)
    module = CausalSelfAttention(16, 4, attention=attention, causal=False)
    mha = multihead_attention_like(module)
    x = torch.randn(2, 6, 16)
    padding = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])  # row 1's last two keys are padding
    with torch.no_grad():
        out, _ = module(x)
        torch.testing.assert_close(out, mha(x, x, x)[0], atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(module(x, key_padding_mask=padding)[0], mha(x, x, x, key_padding_mask=padding)[0],
                                   atol=ATOL, rtol=RTOL)
        _, weights = module(x, need_weights=True)
        assert (weights > 0).all()  # the future too: nothing is hidden
        later_changed = x.clone()
        later_changed[:, -1] += 1.0
        assert not torch.allclose(module(later_changed)[0][:, 0], out[:, 0])  # the first token sees the last


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_q19_cross_attention_takes_keys_and_values_from_the_other_sequence_as_multihead_attention_does(attention):
    torch.manual_seed(0)
    module = CausalSelfAttention(16, 4, attention=attention, causal=False)
    mha = multihead_attention_like(module)
    x, context = torch.randn(2, 5, 16), torch.randn(2, 7, 16)  # T = 5 queries, S = 7 keys and values
    padding = torch.tensor([[False] * 7, [False] * 5 + [True] * 2])  # padding of the context
    with torch.no_grad():
        out, _ = module(x, context=context)  # (2, 5, 16)
        torch.testing.assert_close(out, mha(x, context, context)[0], atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(module(x, key_padding_mask=padding, context=context)[0],
                                   mha(x, context, context, key_padding_mask=padding)[0], atol=ATOL, rtol=RTOL)
        _, weights = module(x, need_weights=True, context=context)
    assert weights.shape == (2, 4, 5, 7) and (weights > 0).all()  # (B, H, T, S): every query sees all 7
    with pytest.raises(ValueError, match="build the module with causal=False"):
        CausalSelfAttention(16, 4)(x, context=context)
    with pytest.raises(ValueError, match=r"context must be \(B, S, C\) = \(2, S, 16\)"):
        module(x, context=torch.randn(2, 7, 8))
