"""Fewer key/value heads than query heads (grouped-query and multi-query attention), a window of
the most recent keys, the ring KV cache it allows, and the SwiGLU MLP: each against a reference
built another way (a plain module with repeated key rows, Qwen3's and Llama's own layers from
transformers, attention over a slice of the text, a model that recomputes everything)."""

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, Qwen3Config
from transformers.models.llama.modeling_llama import LlamaMLP
from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3RotaryEmbedding

from model import GPT, CausalSelfAttention, GPTConfig
from model.attention import KVCache
from model.decode_step import CompiledDecodeStep, one_token_logits
from model.generation import generate_tokens
from model.gpt import MLP, swiglu_hidden
from tests.helpers import lively, tiny_gpt
from training.build import model_line

PATHS = ["sdpa", "manual"]


def repeated_kv_module(grouped: CausalSelfAttention) -> CausalSelfAttention:
    """A plain multi-head module (one key/value head per query head) computing what `grouped`
    should: query head h gets kv head h // G's rows of W_k and W_v (and of their biases)."""
    H, K, D = grouped.n_head, grouped.n_kv_head, grouped.head_dim
    C, G = grouped.qkv.in_features, H // K
    plain = CausalSelfAttention(C, H, attention=grouped.attention)
    with torch.no_grad():
        for full, mine in ((plain.qkv.weight, grouped.qkv.weight), (plain.qkv.bias, grouped.qkv.bias)):
            w_q, w_k, w_v = mine.split([H * D, K * D, K * D])  # rows [q | k | v]
            rows = [w_q] + [w.view(K, D, -1).repeat_interleave(G, dim=0).reshape(H * D, *w.shape[1:]) for w in (w_k, w_v)]
            full.copy_(torch.cat(rows).view_as(full))
        plain.proj.load_state_dict(grouped.proj.state_dict())
    return plain


@pytest.mark.parametrize("attention", PATHS)
def test_gqa_with_as_many_kv_heads_as_query_heads_is_the_plain_module_to_the_bit(attention):
    torch.manual_seed(0)
    plain = CausalSelfAttention(32, 4, attention=attention)
    grouped = CausalSelfAttention(32, 4, attention=attention, n_kv_head=4)
    grouped.load_state_dict(plain.state_dict())  # the same (3C, C) qkv: rows [q | k | v]
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        assert torch.equal(grouped(x)[0], plain(x)[0])
        (out, weights), (plain_out, plain_weights) = grouped(x, need_weights=True), plain(x, need_weights=True)
    assert torch.equal(out, plain_out) and torch.equal(weights, plain_weights)


@pytest.mark.parametrize("attention", PATHS)
def test_gqa_equals_a_plain_module_whose_query_head_h_has_kv_head_h_over_g_repeated(attention):
    torch.manual_seed(0)
    grouped = CausalSelfAttention(32, 8, attention=attention, n_kv_head=2)  # G = 4 query heads per kv head
    with torch.no_grad():
        grouped.qkv.bias.normal_()  # biases too, so a bias row in the wrong head shows
    assert grouped.qkv.weight.shape == ((8 + 2 * 2) * 4, 32)  # (H + 2K) D rows, not 3C
    plain = repeated_kv_module(grouped)
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        torch.testing.assert_close(grouped(x)[0], plain(x)[0], atol=1e-6, rtol=0)
        (_, weights), (_, plain_weights) = grouped(x, need_weights=True), plain(x, need_weights=True)
        torch.testing.assert_close(weights, plain_weights, atol=1e-6, rtol=0)
        # With a KV cache, a prompt and then one token at a time: the same again (the cache holds K heads).
        cache, plain_cache = KVCache(16), KVCache(16)
        steps = [(grouped(x[:, :5], cache=cache)[0], plain(x[:, :5], cache=plain_cache)[0])]
        steps += [(grouped(x[:, t : t + 1], cache=cache)[0], plain(x[:, t : t + 1], cache=plain_cache)[0]) for t in range(5, 9)]
    for mine, theirs in steps:
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=0)
    assert cache.k.shape == (2, 2, 16, 4) and plain_cache.k.shape == (2, 8, 16, 4)


def test_gqa_with_qk_norm_rope_and_its_own_head_dim_equals_qwen3s_attention_layer():
    # transformers' Qwen3Attention: separate q/k/v projections, repeat_kv, RMSNorm per head, then
    # rotary positions turning halves (as `rotate` does), head_dim set apart from hidden_size.
    torch.manual_seed(0)
    C, H, K, D, T = 32, 4, 2, 12, 10
    config = Qwen3Config(hidden_size=C, num_attention_heads=H, num_key_value_heads=K, head_dim=D, vocab_size=8,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6}, rms_norm_eps=1e-6)
    config._attn_implementation = "sdpa"
    theirs = Qwen3Attention(config, layer_idx=0).eval()
    mine = CausalSelfAttention(C, H, bias=False, rope=True, qk_norm=True, n_kv_head=K, head_dim=D, rope_theta=1e6,
                               norm_eps=1e-6, attention="manual")
    with torch.no_grad():
        for norm in (theirs.q_norm, theirs.k_norm):
            norm.weight.uniform_(0.5, 1.5)  # gains away from 1, so swapping q_norm and k_norm shows
        mine.qkv.weight.copy_(torch.cat([theirs.q_proj.weight, theirs.k_proj.weight, theirs.v_proj.weight]))
        mine.proj.weight.copy_(theirs.o_proj.weight)
        mine.q_norm.weight.copy_(theirs.q_norm.weight)
        mine.k_norm.weight.copy_(theirs.k_norm.weight)
        x = torch.randn(2, T, C)
        angles = Qwen3RotaryEmbedding(config)(x, torch.arange(T).unsqueeze(0))  # (cos, sin), each (1, T, D)
        expected, _ = theirs(x, position_embeddings=angles, attention_mask=None)  # None: causal
        for attention in PATHS:
            mine.attention = attention
            torch.testing.assert_close(mine(x)[0], expected, atol=1e-5, rtol=1e-4)


def test_mqa_gives_every_query_head_the_same_keys_so_equal_queries_give_equal_patterns():
    torch.manual_seed(0)
    H, D = 4, 8
    shapes = {}
    for K in (1, H):
        module = CausalSelfAttention(32, H, attention="manual", n_kv_head=K)
        with torch.no_grad():
            module.qkv.weight[2 * D : 3 * D] = module.qkv.weight[:D]  # query head 2 asks what head 0 asks
            module.qkv.bias[2 * D : 3 * D] = module.qkv.bias[:D]
        module.hook_k.add_hook(lambda k, hook, K=K: shapes.update({K: tuple(k.shape)}))  # reads, hands back None
        with torch.no_grad():
            _, weights = module(torch.randn(2, 6, 32), need_weights=True)  # (B, H, T, T)
        if K == 1:
            assert torch.equal(weights[:, 2], weights[:, 0])  # one key head: equal queries, equal patterns
            assert not torch.allclose(weights[:, 1], weights[:, 0], atol=1e-3)  # another query, another pattern
        else:
            assert not torch.allclose(weights[:, 2], weights[:, 0], atol=1e-3)  # own keys: the same query differs
    assert shapes == {1: (2, 6, 1, D), H: (2, 6, H, D)}


@pytest.mark.parametrize("attention", PATHS)
def test_a_window_of_w_is_full_attention_over_the_last_w_tokens_and_never_reads_further_back(attention):
    torch.manual_seed(0)
    T, W = 12, 4
    windowed = CausalSelfAttention(32, 4, attention=attention, n_kv_head=2, window=W)
    full = CausalSelfAttention(32, 4, attention=attention, n_kv_head=2)
    full.load_state_dict(windowed.state_dict())
    x = torch.randn(2, T, 32)
    with torch.no_grad():
        out, _ = windowed(x)  # (B, T, C)
        torch.testing.assert_close(out[:, :W], full(x)[0][:, :W], atol=1e-6, rtol=0)  # no key is W back yet
        for t in range(T):  # query t: full attention over tokens t - W + 1 .. t alone, a slice of the text
            torch.testing.assert_close(out[:, t], full(x[:, max(0, t - W + 1) : t + 1])[0][:, -1], atol=1e-6, rtol=0)
        changed = x.clone()
        changed[:, : T - W] = torch.randn(2, T - W, 32)  # every token W or more back from the last query
        assert torch.equal(windowed(changed)[0][:, -1], out[:, -1])  # the last query's output: unchanged, bit for bit
        assert not torch.allclose(full(changed)[0][:, -1], full(x)[0][:, -1], atol=1e-4)  # full attention reads them
        _, weights = windowed(x, need_weights=True)  # (B, H, T, T)
    too_old = torch.ones(T, T, dtype=torch.bool).tril(diagonal=-W)  # key s <= t - W
    in_window = torch.ones(T, T, dtype=torch.bool).tril() & ~too_old
    assert (weights[..., too_old] == 0).all() and (weights[..., in_window] > 0).all()


def test_n_head_not_a_multiple_of_n_kv_head_is_one_clear_line():
    with pytest.raises(ValueError, match=r"^n_kv_head=3 does not divide n_head=4: .* pick n_kv_head from \[1, 2, 4\]$"):
        CausalSelfAttention(32, 4, n_kv_head=3)
    with pytest.raises(ValueError, match=r"^n_kv_head=3 does not divide n_head=4"):
        GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=4, n_embd=32, n_kv_head=3))
    with pytest.raises(ValueError, match=r"^window=0 must be at least 1"):
        CausalSelfAttention(32, 4, window=0)
    for zero in ({"head_dim": 0}, {"n_kv_head": 0}):  # not the default that None stands for
        with pytest.raises(ValueError, match=rf"^{next(iter(zero))}=0 "):
            CausalSelfAttention(32, 4, **zero)
        with pytest.raises(ValueError, match=rf"^{next(iter(zero))}=0 "):
            GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=4, n_embd=32, **zero))


def test_the_kv_cache_holds_k_heads_so_its_bytes_shrink_by_h_over_k():
    prompt = torch.randint(0, 65, (2, 10), generator=torch.Generator().manual_seed(0))
    nbytes = {}
    for K in (4, 2, 1):
        model = tiny_gpt(n_head=4, n_kv_head=K).eval()
        caches = model.new_caches()
        with torch.no_grad():
            model(prompt, caches=caches)
        nbytes[K] = sum(cache.nbytes() for cache in caches.layers)
        # 2 (keys and values) x 2 layers x B = 2 rows x K heads x block_size 16 slots x D = 8 x 4 bytes (float32)
        assert nbytes[K] == 2 * 2 * 2 * K * 16 * 8 * 4
    assert nbytes[4] == 2 * nbytes[2] == 4 * nbytes[1]


def test_with_a_window_the_kv_cache_is_a_ring_whose_bytes_stop_growing_after_w_tokens():
    model = tiny_gpt(block_size=32, pos="rope", n_head=4, n_kv_head=2, window=6).eval()
    tokens = torch.randint(0, 65, (1, 40), generator=torch.Generator().manual_seed(0))
    caches = model.new_caches()
    sizes = []
    with torch.no_grad():
        model(tokens[:, :3], caches=caches)
        for t in range(3, 40):  # past block_size: a ring never fills
            model(tokens[:, t : t + 1], caches=caches)
            sizes.append(caches.layers[0].nbytes())
    assert caches.layers[0].is_ring and caches.layers[0].slots == 6 and caches.length == 40
    assert set(sizes) == {2 * 2 * 6 * 8 * 4}  # keys and values, B = 1, K = 2 heads, W = 6 slots, D = 8, float32
    assert KVCache(32).slots == 32 and not KVCache(32).is_ring
    assert KVCache(8, window=16).slots == 8  # a window wider than the longest text: no slot that no token fills


@pytest.mark.parametrize("attention", PATHS)
def test_a_ring_cache_fed_in_chunks_gives_what_one_forward_over_the_whole_text_gives(attention):
    # Chunks longer than the window, shorter, and single tokens: each sees the earlier keys the ring still holds.
    torch.manual_seed(0)
    module = CausalSelfAttention(32, 4, attention=attention, n_kv_head=2, window=4, rope=True)
    x = torch.randn(2, 17, 32)
    cache, outputs, start = KVCache(32, window=4), [], 0
    with torch.no_grad():
        whole, _ = module(x)  # (B, 17, C)
        for size in (5, 3, 1, 6, 2):
            outputs.append(module(x[:, start : start + size], cache=cache)[0])
            start += size
    torch.testing.assert_close(torch.cat(outputs, dim=1), whole, atol=1e-6, rtol=0)
    assert cache.k.shape == (2, 2, 4, 8)


def test_a_window_and_rope_model_generates_past_block_size_as_a_full_recompute_does():
    # Ring caches and block_size 32 against no cache at all, over all 108 tokens at once, by the
    # same weights with block_size 128: the window keeps each query's keys the same in both.
    options = dict(pos="rope", n_head=4, n_kv_head=2, window=8, mlp="swiglu", qk_norm=True, smear=True)
    ring = lively(tiny_gpt(block_size=32, **options))
    recompute = tiny_gpt(block_size=128, **options)
    recompute.load_state_dict(ring.state_dict())
    assert ring.generates_past_block_size
    prompt = torch.randint(0, 65, (2, 8), generator=torch.Generator().manual_seed(0))
    generated = generate_tokens(ring, prompt, 100, temperature=0.0)
    assert torch.equal(generated, generate_tokens(recompute.eval(), prompt, 100, temperature=0.0, use_kv_cache=False))
    assert len(set(generated[0, 8:].tolist())) > 10  # tokens that depend on the context, not one repeated


def test_a_window_wider_than_block_size_keeps_w_keys_per_query_past_block_size():
    # Trained on 16 tokens, the window (24) is wider: past block_size its ring holds 24 slots, so
    # each query sees its 24 most recent keys, as a recompute at a longer block_size does.
    options = dict(pos="rope", n_head=4, n_kv_head=2, window=24)
    ring = lively(tiny_gpt(block_size=16, **options))
    recompute = tiny_gpt(block_size=128, **options)
    recompute.load_state_dict(ring.state_dict())
    assert ring.new_caches().layers[0].slots == 24
    prompt = torch.randint(0, 65, (1, 10), generator=torch.Generator().manual_seed(1))
    generated = generate_tokens(ring, prompt, 80, temperature=0.0)
    assert torch.equal(generated, generate_tokens(recompute.eval(), prompt, 80, temperature=0.0, use_kv_cache=False))


def test_the_runs_log_says_a_window_as_wide_as_the_context_hides_keys_only_past_it():
    # train.py's model line (training/build.py); cli/config.py refuses such a window with learned positions.
    wide = model_line(tiny_gpt(block_size=16, pos="rope", n_head=4, n_kv_head=1, window=24))
    assert wide.endswith("4 heads x 8 dims (1 key/value head), context 16, window 24 (no query in training sees more "
                         "than 16 tokens: the window hides keys only when generating past them)"), wide
    saved = model_line(tiny_gpt(block_size=16, pos="learned", n_head=4, window=16))  # a run saved before the refusal
    assert saved.endswith("context 16, window 16 (it hides nothing)"), saved
    narrow = model_line(tiny_gpt(block_size=16, pos="rope", n_head=4, n_kv_head=2, window=15))
    assert narrow.endswith("4 heads x 8 dims (2 key/value heads), context 16, window 15"), narrow
    single = model_line(tiny_gpt(n_layer=1, n_head=1, n_embd=8))
    assert ", 1 layer x 1 head x 8 dims, context" in single, single  # not "1 layers x 1 heads"


def test_a_window_with_learned_positions_still_slides_and_gives_the_no_cache_tokens():
    model = lively(tiny_gpt(block_size=16, n_head=4, n_kv_head=1, window=6, mlp="swiglu"))
    assert not model.generates_past_block_size  # learned positions end at block_size
    prompt = torch.randint(0, 65, (2, 5), generator=torch.Generator().manual_seed(0))
    cached = generate_tokens(model, prompt, 40, temperature=0.0)
    assert torch.equal(cached, generate_tokens(model, prompt, 40, temperature=0.0, use_kv_cache=False))
    assert len(set(cached[0, 5:].tolist())) > 5


@pytest.mark.parametrize("options", [dict(n_kv_head=1), dict(n_kv_head=2, window=3, pos="rope"),
                                     dict(n_kv_head=1, window=3, qk_norm=True)],
                         ids=["mqa", "gqa, window ring, rope", "mqa, window, learned positions"])
def test_the_one_token_step_reads_grouped_heads_and_ring_slots_as_the_cached_forward_does(options):
    model = lively(tiny_gpt(block_size=16, n_head=4, **options))
    tokens = torch.randint(0, 65, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        caches = model.new_caches()
        model(tokens[:, :2], caches=caches)
        slots = [cache.k.clone() for cache in caches.layers] + [cache.v.clone() for cache in caches.layers]
        for position in range(2, 10):  # past a window of 3: the ring goes round twice
            token = tokens[:, position : position + 1]  # (B, 1)
            expected, _ = model(token, caches=caches)  # (B, 1, V)
            logits, _ = one_token_logits(model, token, torch.tensor([position]), torch.zeros(2, 1, 32), slots)
            torch.testing.assert_close(logits, expected[:, -1], atol=1e-4, rtol=1e-4)
    n_layer = len(caches.layers)
    for cache, k_slots, v_slots in zip(caches.layers, slots[:n_layer], slots[n_layer:], strict=True):
        assert k_slots.shape == cache.k.shape == (2, options["n_kv_head"], cache.slots, 8)
        torch.testing.assert_close(k_slots, cache.k, atol=1e-5, rtol=1e-5)  # the same slots, ring order included
        torch.testing.assert_close(v_slots, cache.v, atol=1e-5, rtol=1e-5)


@pytest.mark.compile
def test_the_compiled_step_gives_the_eager_tokens_for_gqa_a_window_ring_swiglu_qk_norm_and_smear():
    # One compile for every new shape: K = 2 key/value heads for 4 query heads, a ring of 6 slots,
    # SwiGLU's three matrices, QK-norm, smear and rope, generating past block_size 16. (The
    # multi-query form, K = 1, is compiled in tests/test_decode_step.py, with learned positions.)
    model = lively(tiny_gpt(block_size=16, pos="rope", n_head=4, n_kv_head=2, window=6, mlp="swiglu",
                            qk_norm=True, smear=True))
    prompt = torch.randint(0, 65, (2, 5), generator=torch.Generator().manual_seed(0))
    step = CompiledDecodeStep(model, batch_size=2, temperature=0.0, top_k=None, top_p=None)
    compiled = generate_tokens(model, prompt, 30, temperature=0.0, decode_step=step)
    assert torch.equal(compiled, generate_tokens(model, prompt, 30, temperature=0.0))
    assert len(set(compiled[0, 5:].tolist())) > 5


def test_swiglu_is_llamas_mlp_down_of_silu_gate_times_up_and_about_8_thirds_of_c_wide():
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=4, n_embd=48, mlp="swiglu", bias=False)
    mlp = MLP(config).eval()
    assert config.hidden_size == swiglu_hidden(48) == 128  # 8/3 of 48 is 128, a multiple of 32
    assert [swiglu_hidden(c) for c in (32, 64, 128, 768)] == [96, 192, 352, 2048]  # 85.3, 170.7, 341.3, 2048 rounded up to 32
    assert mlp.fc.out_features == mlp.up.out_features == mlp.proj.in_features == 128
    assert GPTConfig(8, n_embd=48, mlp="relu2").hidden_size == 192  # 4C for the others
    assert GPTConfig(8, n_embd=48, mlp="swiglu", mlp_hidden=40).hidden_size == 40  # or as set
    theirs = LlamaMLP(LlamaConfig(hidden_size=48, num_attention_heads=4, intermediate_size=128, hidden_act="silu", mlp_bias=False)).eval()
    with torch.no_grad():
        theirs.gate_proj.weight.copy_(mlp.fc.weight)
        theirs.up_proj.weight.copy_(mlp.up.weight)
        theirs.down_proj.weight.copy_(mlp.proj.weight)
        x = torch.randn(2, 5, 48)
        torch.testing.assert_close(mlp(x), theirs(x), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(mlp(x), mlp.proj(F.silu(mlp.fc(x)) * mlp.up(x)), atol=0, rtol=0)
