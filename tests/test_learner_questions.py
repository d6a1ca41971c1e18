"""The learner's questions in docs/attention.md (Q1 to Q24, each in the section where it arises),
each answered by a check that runs: where the answer is about this project's module, the check
runs the module, and where it is about a mistake, plants the mistake in the module's own code,
so that it fails when the module is wrong, not only when torch is."""

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


class Planted(TorchFunctionMode):
    """A fault planted in the module's own code: inside `with Planted(func, instead):`, every call of
    func (torch.softmax, Tensor.contiguous, ...) runs instead(*args, **kwargs); calls counts them."""

    def __init__(self, func: Callable, instead: Callable) -> None:
        super().__init__()
        self.func, self.instead, self.calls = func, instead, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is self.func:
            self.calls += 1
            return self.instead(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


@contextmanager
def mask_replaced(module: CausalSelfAttention, change: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """The module's forward with the mask its step 3 builds passed through change: a wrong mask, planted."""
    build = module.visible_keys

    def changed(*args):
        visible, no_key_visible = build(*args)
        return change(visible), no_key_visible

    module.visible_keys = changed
    try:
        yield
    finally:
        del module.visible_keys


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


def test_q1_dividing_by_sqrt_d_tames_the_spread_only_for_centred_queries_and_keys():
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


def test_q2_a_hide_mask_given_to_sdpa_is_silently_wrong_and_inverting_it_is_the_fix():
    torch.manual_seed(0)
    module = identity_projection(CausalSelfAttention(16, 2, attention="sdpa"))  # its output: the merged heads
    mha = multihead_attention_like(module)  # torch's own attention, the same weights
    x = torch.randn(1, 5, 16)
    hide = torch.ones(5, 5, dtype=torch.bool).triu(diagonal=1)  # True = hide: masked_fill's and MHA's convention
    nothing_padded = torch.zeros(1, 5, dtype=torch.bool)  # so that the sdpa path hands its mask to SDPA
    with torch.no_grad():
        expected, _ = mha(x, x, x, attn_mask=hide)
        right, _ = module(x, key_padding_mask=nothing_padded)  # the module's mask: True = may attend
        with mask_replaced(module, lambda visible: ~visible):  # the module's SDPA call given hide instead
            wrong, _ = module(x, key_padding_mask=nothing_padded)
            module.attention = "manual"
            manual_wrong, _ = module(x, key_padding_mask=nothing_padded)
    torch.testing.assert_close(right, expected, atol=ATOL, rtol=RTOL)
    assert torch.isfinite(wrong).all()  # no error, no NaN...
    assert (wrong[:, -1] == 0).all()  # the last query, left with no key, gets zeros...
    # ...from SDPA itself, a fact about torch: the module's zeroing of such rows (no_key_visible) had nothing
    # to do, since its own mask leaves every query a key. Called alone, SDPA gives a row that sees nothing zeros.
    alone = torch.randn(1, 1, 3, 4)
    no_key_for_the_last = torch.ones(3, 3, dtype=torch.bool).tril()
    no_key_for_the_last[2] = False
    assert (F.scaled_dot_product_attention(alone, alone, alone, attn_mask=no_key_for_the_last)[0, 0, 2] == 0).all()
    assert not torch.allclose(wrong[:, :-1], expected[:, :-1], atol=1e-3)  # ...and wrong: each query saw only its future
    assert manual_wrong[:, -1].isnan().all() and manual_wrong[:, :-1].isfinite().all()  # -inf everywhere: 0 / 0
    # The module's own `visible` is SDPA's convention; its padding mask is nn.MultiheadAttention's.
    with torch.no_grad():
        _, caught = run_and_catch(module, x)
    assert torch.equal(caught.visible[0, 0], ~hide)
    padding = torch.tensor([[False, False, False, True, True]])  # True = hide (a padding key)
    _, weights = module(x, key_padding_mask=padding, need_weights=True)
    assert (weights[..., 3:] == 0).all() and (weights[0, :, 4, :3] > 0).all()
    _, weights = module(x, key_padding_mask=~padding, need_weights=True)  # True = keep, read as hide
    assert (weights[0, :, 3:, :3] == 0).all()  # the real keys hidden: queries 3 and 4 see only padding


def test_multihead_attention_uses_true_to_hide_like_masked_fill():
    # Q2's other half: torch's nn.MultiheadAttention reads a bool attn_mask and key_padding_mask as
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


def test_q3_masking_before_or_after_the_sqrt_d_scale_is_the_same_with_minus_inf_and_not_with_a_small_finite_fill():
    torch.manual_seed(0)
    module = CausalSelfAttention(64, 1, attention="manual")  # D = 64: the scale divides by 8
    x = torch.randn(2, 6, 64) * 3
    with torch.no_grad():
        _, caught = run_and_catch(module, x)
        finite = Planted(torch.Tensor.masked_fill, lambda scores, hidden, value: scores.masked_fill(hidden, -20.0))
        with finite:  # the module (scale, then mask) filling -20 instead of -inf
            _, module_minus_20 = module(x, need_weights=True)
    hidden = ~caught.visible  # (1, 1, T, S): the future
    dot = caught.q @ caught.k.transpose(-2, -1)  # (B, H, T, S): the module's q . k, before the scale

    def weights(fill: float, mask_first: bool) -> torch.Tensor:
        scores = dot.masked_fill(hidden, fill) / 8 if mask_first else (dot / 8).masked_fill(hidden, fill)
        return torch.softmax(scores, dim=-1)

    # -inf / 8 is still -inf: either order gives the module's weights, and exactly 0 on the future.
    for mask_first in (False, True):
        torch.testing.assert_close(weights(float("-inf"), mask_first), caught.weights, atol=ATOL, rtol=RTOL)
    assert (caught.weights[..., hidden[0, 0]] == 0).all()
    # A finite fill is divided by sqrt(D) too when it comes first: -20 becomes -2.5, and the future gets weight.
    assert finite.calls == 1
    torch.testing.assert_close(module_minus_20, weights(-20.0, mask_first=False))
    assert module_minus_20[..., hidden[0, 0]].max() < 1e-6
    assert weights(-20.0, mask_first=True)[..., hidden[0, 0]].max() > 0.1


def test_q4_masked_fill_wants_a_bool_mask_and_a_0_1_mask_multiplied_in_instead_lets_the_future_through():
    torch.manual_seed(0)
    module = CausalSelfAttention(16, 2, attention="manual")
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        right, caught = run_and_catch(module, x)
        assert caught.visible.dtype == torch.bool  # step 3's mask: True = may attend
        # The same mask as numbers: ~ of a float is an error; of 0/1 integers a bitwise not (-2, -1), never a bool.
        with mask_replaced(module, lambda visible: visible.float()), pytest.raises(TypeError, match="only implemented on integer and Boolean"):
            module(x, need_weights=True)
        assert (~caught.visible.long()).unique().tolist() == [-2, -1]
        with mask_replaced(module, lambda visible: visible.long()), pytest.raises(RuntimeError, match="only supports boolean masks"):
            module(x, need_weights=True)
        # A 0/1 mask multiplied into the scores (the module's step 5 with `scores * mask` planted): a hidden
        # score becomes 0, not -inf, and exp(0) = 1 gives the future weight.
        multiplied = Planted(torch.Tensor.masked_fill,
                             lambda t, hidden, value: t * (~hidden).float() if value == float("-inf") else t.masked_fill(hidden, value))
        with multiplied:
            wrong, wrong_weights = module(x, need_weights=True)
    assert multiplied.calls == 1
    assert (wrong_weights[..., ~caught.visible[0, 0]] > 0).all() and not torch.allclose(wrong, right, atol=1e-3)
    # The module's own padding mask must be bool, and says so in one line.
    with pytest.raises(ValueError, match=r"key_padding_mask must be a bool tensor of shape \(2, 6\), not torch.float32"):
        module(x, key_padding_mask=torch.zeros(2, 6))


def test_q5_a_float_mask_is_added_to_the_scores_so_it_must_hold_minus_inf_not_0_and_1():
    torch.manual_seed(0)
    module = CausalSelfAttention(16, 2, attention="sdpa")
    x = torch.randn(2, 6, 16)
    nothing_padded = torch.zeros(2, 6, dtype=torch.bool)  # so that the sdpa path hands its mask to SDPA
    with torch.no_grad():
        right, _ = module(x)
        # The module's SDPA call given float masks in place of its bool one (True = may attend):
        with mask_replaced(module, lambda visible: torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))):
            minus_inf, _ = module(x, key_padding_mask=nothing_padded)  # 0 keeps, -inf hides
        with mask_replaced(module, lambda visible: visible.float()):
            ones_and_zeros, _ = module(x, key_padding_mask=nothing_padded)  # the bool mask turned into numbers
        # What SDPA did with the 1.0 and 0.0: added them to the scores.
        _, caught = run_and_catch(module, x)
        scores = caught.q @ caught.k.transpose(-2, -1) / math.sqrt(module.head_dim) + caught.visible.float()
        weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
    torch.testing.assert_close(minus_inf, right, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(ones_and_zeros, merged(module, weights @ caught.v), atol=ATOL, rtol=RTOL)
    assert (weights[..., ~caught.visible[0, 0]] > 0.01).all()  # the future gets weight: no error, no NaN, wrong
    assert not torch.allclose(ones_and_zeros, right, atol=1e-3)


def test_q6_masked_fill_in_place_on_softmaxs_output_breaks_backward_and_the_module_fills_a_copy():
    torch.manual_seed(0)
    module = CausalSelfAttention(8, 2, attention="manual")
    x = torch.randn(1, 3, 8, requires_grad=True)
    padding = torch.tensor([[True, False, False]])  # key 0 is padding: query 0 sees no key at all

    def gradient() -> torch.Tensor:
        out, weights = module(x, key_padding_mask=padding, need_weights=True)
        assert (weights[0, :, 0] == 0).all()  # query 0 attends to nothing
        return torch.autograd.grad(out.square().sum() + weights.square().sum(), x)[0]

    def in_place_where(fill_value: float) -> Planted:
        """The module's masked_fill(mask, fill_value) made masked_fill_, in place; the other one kept."""
        def fill(tensor, mask, value):
            return tensor.masked_fill_(mask, value) if value == fill_value else tensor.masked_fill(mask, value)
        return Planted(torch.Tensor.masked_fill, fill)

    # The module zeroes such a row after softmax on a copy: its backward runs, with finite gradients.
    expected = gradient()
    assert torch.isfinite(expected).all() and expected.abs().sum() > 0
    # In place there, on softmax's output, which softmax keeps for backward: backward raises.
    with in_place_where(0.0), pytest.raises(RuntimeError, match="modified by an inplace operation"):
        gradient()
    # In place on the scores, before softmax, is fine: dividing by sqrt(D) keeps nothing the fill overwrites.
    with in_place_where(float("-inf")) as planted:
        torch.testing.assert_close(gradient(), expected)
    assert planted.calls == 2  # both fills ran, the scores' in place


def test_q7_the_mask_is_built_per_call_equal_to_a_slice_of_a_block_size_buffer_and_never_saved():
    block_size = 8
    buffer = torch.ones(block_size, block_size, dtype=torch.bool).tril()  # nanoGPT's way: (block_size, block_size)
    # Query t of T new tokens after S - T cached ones is token S - T + t: its row of the buffer.
    for T, S in ((8, 8), (5, 5), (1, 7), (3, 8)):
        visible, _ = CausalSelfAttention.visible_keys(1, T, S, None, torch.device("cpu"))  # (1, 1, T, S)
        assert torch.equal(visible[0, 0], buffer[S - T : S, :S]), (T, S)
    # Nothing of it is saved: a checkpoint holds weights only (a buffer would add block_size^2 entries).
    model = GPT(GPTConfig(vocab_size=10, block_size=block_size, n_layer=1, n_head=2, n_embd=8))
    attention_state = {name for name in model.state_dict() if ".attn." in name}
    assert attention_state == {"blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight"}
    with_buffer = nn.Module()
    with_buffer.register_buffer("mask", buffer)
    assert with_buffer.state_dict()["mask"].numel() == block_size**2
    # A fact about torch: persistent=False keeps a buffer out of the state dict, so a checkpoint is no reason
    # to build the mask per call. The module keeps none, persistent or not: no block_size^2 table in memory.
    not_saved = nn.Module()
    not_saved.register_buffer("mask", buffer, persistent=False)
    assert "mask" not in not_saved.state_dict() and torch.equal(not_saved.mask, buffer)
    assert list(CausalSelfAttention(8, 2).buffers()) == [] and list(model.buffers()) == []


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_q8_with_causal_false_every_query_sees_every_key_as_multihead_attention_without_a_mask(attention):
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


def test_q9_dividing_scores_by_their_sum_is_no_weighting_and_softmax_is():
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


def test_q10_dividing_by_sums_without_keepdim_normalises_the_wrong_way_silently():
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
    visible, no_key_visible = module.visible_keys(2, 4, 4, padding, torch.device("cpu"))
    assert no_key_visible.shape == (2, 1, 4, 1) and visible.shape == (2, 1, 4, 4)
    assert no_key_visible.flatten().tolist() == [True, True, False, False] + [False] * 4  # queries 0, 1 of row 0
    out, weights = module(torch.randn(2, 4, 6), key_padding_mask=padding, need_weights=True)
    assert (out[0, :2] == 0).all() and (weights[0, :, :2] == 0).all()  # those two queries attend to nothing
    assert (out[0, 2:] != 0).any(dim=-1).all() and (out[1] != 0).any(dim=-1).all()  # every other query does
    torch.testing.assert_close(weights[0, :, 2:].sum(dim=-1), torch.ones(3, 2))  # each row over its own keys
    torch.testing.assert_close(weights[1].sum(dim=-1), torch.ones(3, 4))


def test_q11_a_naive_softmax_of_scores_near_100_gives_nan_and_the_first_nan_can_be_found():
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
    # The module's softmax is the stable one: the same scores inside it stay finite. With the naive
    # one planted in its step 5 instead, its weights and its output are NaN.
    module = CausalSelfAttention(1, 1, bias=False, attention="manual")
    x = torch.tensor([[[math.sqrt(33.0 * 33 / 97)], [math.sqrt(97.0)]]])  # (1, 2, 1)
    with torch.no_grad():
        module.qkv.weight[:2] = torch.tensor([[1.0], [1.0]])  # q = k = x: the last query scores 97 and 33
        out, weights = module(x, need_weights=True)
        naive_softmax = Planted(torch.softmax, lambda s, dim: s.exp() / s.exp().sum(dim, keepdim=True))
        with naive_softmax:
            naive_out, naive_weights = module(x, need_weights=True)
    assert weights.isfinite().all() and out.isfinite().all() and weights[0, 0, 1, 0] < 1e-20
    assert naive_softmax.calls == 1 and naive_weights[0, 0, 1, 1].isnan() and naive_out[0, 1].isnan().all()
    assert naive_weights[0, 0, 0, 0] == 1  # the first query scores 11.2 with its one key: no overflow there


def test_q12_attention_dropout_drops_weights_before_they_meet_v_and_is_off_in_eval():
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


def test_q13_transpose_swaps_two_dims_and_permute_names_them_all_and_neither_copies():
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


def test_q14_heads_must_divide_the_width_and_every_other_size_is_read_from_the_input():
    with pytest.raises(ValueError, match=r"n_embd=10 is not divisible by n_head=3: .* pick n_head from \[1, 2, 5, 10\]"):
        CausalSelfAttention(10, 3)
    torch.manual_seed(0)
    module = CausalSelfAttention(12, 3, attention="manual")  # H and D = 12 // 3 come from the module's sizes...
    x = torch.randn(3, 7, 12)
    with torch.no_grad():
        out, weights = module(x, need_weights=True)  # (3, 7, 12), (3, 3, 7, 7)
        # ...B, T and C from x.shape: the same module runs any batch and length, with no size built in.
        for B, T in ((1, 7), (3, 1), (2, 4)):
            smaller, smaller_weights = module(x[:B, :T], need_weights=True)
            assert smaller.shape == (B, T, 12) and smaller_weights.shape == (B, 3, T, T)
            # Causal: the first T tokens' outputs do not depend on the tokens after them.
            torch.testing.assert_close(smaller, out[:B, :T], atol=ATOL, rtol=RTOL)
            torch.testing.assert_close(smaller_weights, weights[:B, :, :T, :T], atol=ATOL, rtol=RTOL)


def test_q15_scoring_whole_512_wide_vectors_over_sqrt_64_sums_the_8_heads_scores_and_saturates_softmax():
    torch.manual_seed(0)
    B, T, C, H = 64, 16, 512, 8
    D = C // H  # 64
    module = CausalSelfAttention(C, H, bias=False, attention="manual")
    with torch.no_grad():  # queries = x, keys = x turned by a random rotation: each channel's product has variance 1
        module.qkv.weight[:C] = torch.eye(C)
        module.qkv.weight[C : 2 * C] = torch.linalg.qr(torch.randn(C, C))[0]
        _, caught = run_and_catch(module, torch.randn(B, T, C))
    q, k = caught.q, caught.k  # (B, H, T, D): the module's per-head queries and keys
    per_head = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, H, T, T)
    unsplit_q, unsplit_k = (t.transpose(1, 2).reshape(B, T, C) for t in (q, k))  # the same numbers before the split
    whole = unsplit_q @ unsplit_k.transpose(-2, -1) / math.sqrt(D)  # (B, T, T): 512-wide dot products over sqrt(64)
    # A 512-wide dot product is the sum of the 8 heads' 64-wide ones: one pattern for every head, 8 times the variance.
    torch.testing.assert_close(whole, per_head.sum(dim=1), atol=1e-3, rtol=1e-4)
    assert per_head[:, :, -1].var(dim=-1).mean().item() == pytest.approx(1.0, rel=0.1)
    module_scores = caught.weights[:, :, -1].log()  # the module's scaled scores, up to a shift per row
    assert module_scores.var(dim=-1).mean().item() == pytest.approx(1.0, rel=0.1)
    assert whole[:, -1].var(dim=-1).mean().item() == pytest.approx(H, rel=0.1)
    # The last query sees all 16 keys: the module's heads spread their weight, the whole-width score piles it up.
    assert caught.weights[:, :, -1].max(dim=-1).values.mean() < 0.3
    assert torch.softmax(whole[:, -1], dim=-1).max(dim=-1).values.mean() > 0.5
    assert not torch.allclose(caught.weights[:, 0], caught.weights[:, 1], atol=0.05)  # each head its own pattern


def test_q16_head_dim_1_and_a_single_token_work_and_a_too_long_sequence_is_refused():
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


@pytest.mark.parametrize(("H", "T", "raises"), [(4, 6, True), (1, 6, False), (4, 1, False)])
def test_q17_view_after_transpose_raises_unless_one_of_the_swapped_dims_is_1(H, T, raises):
    # T new tokens after 4 cached ones; T = 1 is the KV-cache step, one new token at a time.
    B, D = 2, 3
    module = identity_projection(CausalSelfAttention(H * D, H, attention="manual"))
    x = torch.randn(B, 4 + T, H * D)

    def cache() -> KVCache:
        cache = KVCache(4 + T)
        module(x[:, :4], cache=cache)
        return cache

    with torch.no_grad():
        merged_heads, caught = run_and_catch(module, x[:, 4:], cache=cache())  # (B, T, C), heads (B, H, T, D)
        filled = cache()
        without_contiguous = Planted(torch.Tensor.contiguous, lambda tensor, *args, **kwargs: tensor)
        with without_contiguous:  # the module's merge (step 8) with view straight after the transpose
            if raises:
                with pytest.raises(RuntimeError, match="view size is not compatible"):
                    module(x[:, 4:], cache=filled)
            else:
                assert torch.equal(module(x[:, 4:], cache=filled)[0], merged_heads)  # the memory was in order already
    assert without_contiguous.calls == 1
    # The module's merge lays head h of token t in channels h*D .. (h+1)*D - 1 of token t, in every case.
    for h in range(H):
        assert torch.equal(merged_heads[..., h * D : (h + 1) * D], caught.out[:, h])  # a copy: exactly equal
    # A fact about torch: reshape is view when it can be, contiguous().view when it cannot.
    out = caught.out.transpose(1, 2)  # (B, T, H, D), read out of (B, H, T, D) memory
    joined = out.reshape(B, T, H * D)
    assert torch.equal(joined, merged_heads) and (joined.data_ptr() == out.data_ptr()) == (not raises)


@pytest.mark.parametrize(("H", "T", "copies"), [(4, 6, True), (1, 6, False), (4, 1, False)])
def test_q18_the_merge_needs_contiguous_which_copies_only_when_the_memory_is_out_of_order(H, T, copies):
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


def test_q19_einsum_writes_the_scores_the_weighted_sum_and_the_merge_with_named_axes():
    torch.manual_seed(0)
    B, T, H, D = 2, 5, 3, 4
    C = H * D
    module = CausalSelfAttention(C, H, bias=False, attention="manual")
    proj = module.proj
    with torch.no_grad():
        expected, caught = run_and_catch(module, torch.randn(B, T, C))
        q, k, v = caught.q, caught.k, caught.v  # (B, H, T, D) each, from the module's steps 1 and 2
        # The lines docs/attention.md shows (Q19), run on them:
        scores = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(D)  # q @ k.transpose(-2, -1): (B, H, T, S)
        weights = torch.softmax(scores.masked_fill(~caught.visible, float("-inf")), dim=-1)  # (B, H, T, S)
        heads = torch.einsum("bhts,bhsd->bhtd", weights, v)  # weights @ v: (B, H, T, D)
        out = torch.einsum("bhtd,hdc->btc", heads, proj.weight.T.reshape(H, D, C))  # merge and proj: (B, T, C)
    torch.testing.assert_close(weights, caught.weights, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(heads, caught.out, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)


def test_q20_linear_stores_out_by_in_and_per_head_fused_and_einsum_projections_agree():
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


def test_q21_keys_made_by_w_q_give_symmetric_scores_where_each_token_scores_itself_highest():
    torch.manual_seed(0)
    T, C = 32, 64
    x = torch.randn(1, T, C)
    module = CausalSelfAttention(C, 1, bias=False, attention="manual", causal=False)  # every token sees all 32
    keys_from_w_q = CausalSelfAttention(C, 1, bias=False, attention="manual", causal=False)
    no_projections = CausalSelfAttention(C, 1, bias=False, attention="manual", causal=False)
    with torch.no_grad():
        keys_from_w_q.load_state_dict(module.state_dict())
        keys_from_w_q.qkv.weight[C : 2 * C] = module.qkv.weight[:C]  # the copy-paste bug, planted in the weights
        no_projections.qkv.weight[: 2 * C] = torch.cat([torch.eye(C), torch.eye(C)])  # q = k = x
        _, proper = run_and_catch(module, x)
        bugs = [run_and_catch(bugged, x)[1] for bugged in (keys_from_w_q, no_projections)]
    for caught in bugs:
        scores = (caught.q @ caught.k.transpose(-2, -1))[0, 0]  # (T, T): the module's scores, before the scale
        torch.testing.assert_close(scores, scores.T)
        assert torch.equal(caught.weights[0, 0].argmax(dim=1), torch.arange(T))  # all 32 tokens attend most to themselves
    proper_scores = (proper.q @ proper.k.transpose(-2, -1))[0, 0]
    assert not torch.allclose(proper_scores, proper_scores.T)
    assert (proper.weights[0, 0].argmax(dim=1) == torch.arange(T)).float().mean() < 0.2
    # The module makes its keys with rows C:2C of qkv (W_k), not rows 0:C (W_q).
    torch.testing.assert_close(proper.k[0, 0], x[0] @ module.qkv.weight[C : 2 * C].T)
    torch.testing.assert_close(proper.q[0, 0], x[0] @ module.qkv.weight[:C].T)


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_q22_cross_attention_takes_keys_and_values_from_the_other_sequence_as_multihead_attention_does(attention):
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


def test_q23_the_output_projection_lets_every_head_write_to_every_channel_and_folds_into_w_v_only_with_one_head():
    torch.manual_seed(0)
    C, H = 12, 3
    D = C // H
    x = torch.randn(2, 5, C)
    module = CausalSelfAttention(C, H, attention="manual")
    without = CausalSelfAttention(C, H, attention="manual")
    without.load_state_dict(module.state_dict())
    identity_projection(without)  # no W_o: the merged heads go straight to the residual stream

    def channels_head_1_writes(model: CausalSelfAttention) -> list[int]:
        with torch.no_grad():
            out, _ = model(x)
            detach = model.hook_z.add_hook(lambda z, hook: z * torch.tensor([1.0, 0.0, 1.0]).view(1, 1, 3, 1))  # step 7: head 1 out
            changed = (model(x)[0] - out).abs().amax(dim=(0, 1)) > 1e-6  # (C,)
            detach()
        return changed.nonzero().flatten().tolist()

    assert channels_head_1_writes(module) == list(range(C))  # through W_o, every channel
    assert channels_head_1_writes(without) == list(range(D, 2 * D))  # without it, its own D channels only
    # With one head (D = C), W_o folds into W_v (weights sum to 1, so the bias passes through): nothing is lost.
    one = CausalSelfAttention(C, 1, attention="manual")
    folded = CausalSelfAttention(C, 1, attention="manual")
    with torch.no_grad():
        folded.load_state_dict(one.state_dict())
        W_o, b_o, W_v, b_v = one.proj.weight, one.proj.bias, one.qkv.weight[2 * C :], one.qkv.bias[2 * C :]
        folded.qkv.weight[2 * C :] = W_o @ W_v
        folded.qkv.bias[2 * C :] = W_o @ b_v + b_o
        identity_projection(folded)
        torch.testing.assert_close(folded(x)[0], one(x)[0], atol=ATOL, rtol=RTOL)
    # With H heads W_v gives each head D rows, so no fold can let a head write outside its D channels.
    # Exact only without dropout: in training, dropout scales a query's kept weights by 1 / (1 - p), its row no
    # longer sums to 1, and b_o, folded into every value, comes out times that sum. The same random draws:
    def in_training(module: CausalSelfAttention, dropout: float) -> torch.Tensor:
        copy = CausalSelfAttention(C, 1, dropout=dropout, attention="manual")
        copy.load_state_dict(module.state_dict())
        torch.manual_seed(1)
        with torch.no_grad():
            return copy.train()(x)[0]

    assert not torch.allclose(in_training(folded, 0.5), in_training(one, 0.5), atol=1e-3)
    torch.testing.assert_close(in_training(folded, 0.0), in_training(one, 0.0), atol=ATOL, rtol=RTOL)
    with torch.no_grad():  # without b_o the fold holds under dropout too: the bias is what a row's sum moves
        one.proj.bias.zero_()
        folded.qkv.bias[2 * C :] = W_o @ b_v
    torch.testing.assert_close(in_training(folded, 0.5), in_training(one, 0.5), atol=ATOL, rtol=RTOL)


def test_q24_the_gpt2_init_keeps_the_residual_streams_spread_flat_through_depth():
    from docs.questions import INITS, residual_spread

    n_layer = 16
    model = GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=n_layer, n_head=4, n_embd=64))
    residual_std = 0.02 / math.sqrt(2 * n_layer)  # the two projections that write into the residual stream
    for name, parameter in model.named_parameters():
        if name.endswith(("attn.proj.weight", "mlp.proj.weight")):
            assert parameter.std().item() == pytest.approx(residual_std, rel=0.05), name
        elif name.endswith(("qkv.weight", "fc.weight", "tok_emb.weight")):
            assert parameter.std().item() == pytest.approx(0.02, rel=0.05), name
    # N(0, 0.02) is for the weights of Linear and Embedding layers only: every bias starts at 0 and every
    # norm's gain (LayerNorm's, QK-norm's) at 1, with every option that adds one on.
    full = GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=64, bias=True, qk_norm=True,
                         smear=True, norm="layernorm"))
    drawn = {f"{name}.weight" for name, layer in full.named_modules() if isinstance(layer, (nn.Linear, nn.Embedding))}
    kinds = set()
    for name, parameter in full.named_parameters():
        if name in drawn:
            kinds.add("drawn")
            assert parameter.abs().max() > 0 and parameter.abs().mean() < 0.03, name  # about 0.016 for std 0.02
        elif name.endswith(".bias"):
            kinds.add("bias")
            assert (parameter == 0).all(), name
        else:
            kinds.add("gain")
            assert (parameter == 1).all(), name
    assert kinds == {"drawn", "bias", "gain"}
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
