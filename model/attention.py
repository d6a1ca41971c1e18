"""Multi-head causal self-attention, written as a lesson.

Every tensor line says its shape. The letters are:

    B  batch size            T  sequence length (tokens)
    C  model width, n_embd   H  number of query heads, n_head
    D  head_dim: C // H unless set (each head works in its own D-dimensional subspace)
    K  number of key/value heads, n_kv_head: H (every head has its own), fewer (grouped-query
       attention: H // K query heads share each key/value head), or 1 (multi-query)
    S  number of keys: T, plus the earlier tokens held in a KV cache (S == T without one)

The module computes, for every head h and every position t:

    out_h[t] = sum over s <= t of softmax_s( q_h[t] . k_g[s] / sqrt(D) ) * v_g[s]

where g = h // (H // K) is the key/value head of h's group (g == h when K == H), and mixes
the heads back together with one output projection. With a window W, the sum runs over
t - W < s <= t only: each query sees at most the W most recent keys, itself included.

Two paths compute exactly that:
    "manual"  the explicit math, one step per line; it can also hand back the
              attention weights (B, H, T, S), which the TensorBoard maps are drawn from.
    "sdpa"    torch.nn.functional.scaled_dot_product_attention: the same math in one
              fused call that never stores the (T, T) weights. The training default.

KVCache keeps the keys and values of the tokens seen so far, so that generating one more
token computes only that token's query, key and value (see KVCache below). It holds K heads,
not H: grouped queries shrink it by H / K. With a window it is a ring of W slots.

Hook points (model/hooks.py) name the activations a learner asks about: hook_q, hook_k and
hook_v after the split into heads, hook_rot_q and hook_rot_k after QK-norm and rotary positions,
hook_attn_scores and hook_pattern (the manual path's scores after the mask, -inf where a key is
hidden, and weights after softmax), and hook_z, each head's output before the merge. They are TransformerLens's names, with
its layout: (B, T, H, D) for the per-head vectors, (B, T, K, D) for keys and values. A function
attached to one can read the activation or hand back another (knocking a head out is zeroing its
slice of hook_z); with none attached, each is the identity. A function on hook_attn_scores or
hook_pattern takes the manual path, as need_weights does: the fused call has no weights to show.

Two variants, by the same steps: causal=False lets every query see every key (bidirectional,
as in an encoder), and forward(x, context=...) takes the keys and values from another
sequence (cross-attention, as when a decoder reads an encoder's output). The model uses neither.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from model.hooks import HookPoint, name_hook_points
from model.norms import GainDtypeRMSNorm

ATTENTION_PATHS = ("sdpa", "manual")
ROPE_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


class KVCache:
    """The keys and values one attention layer has computed for the tokens so far.

    When text is generated one token at a time, each new token attends over all earlier
    ones, whose keys and values never change (causal attention: earlier tokens never see
    later ones). Keeping them means each step computes the new token's q, k, v only and
    one (1, S) row of scores instead of the whole (S, S) square again.

    The keys and values go into buffers of max_length slots, allocated on first use, so
    adding a token writes one slot instead of copying everything held so far.

    With a window W, no query ever reads a key more than W - 1 tokens back, so the cache
    keeps W slots only, a ring: the token at position p goes into slot p % W, over the one
    W tokens earlier. Its memory stays the same however long the text grows.
    """

    def __init__(self, max_length: int, window: int | None = None) -> None:
        self.max_length = max_length
        self.window = window
        self.slots = min(window, max_length) if window else max_length  # slots kept per layer
        self.length = 0  # how many tokens have gone through: the next token's position
        self.k: torch.Tensor | None = None  # (B, K, slots, D)
        self.v: torch.Tensor | None = None  # (B, K, slots, D)

    @property
    def is_ring(self) -> bool:
        return self.window is not None

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Take in this call's keys and values (B, K, T, D); return the keys and values its
        queries may need (B, K, S, D), oldest first, these T last (one token after a ring: the
        ring itself, whose slots are not in order; every key in it is within the window)."""
        B, K, T, D = k.shape
        if self.k is None:
            # Zeros, not uninitialised memory: a slot not written yet holds nothing that could
            # turn into a NaN if some path ever read it (the compiled decode step reads filled slots only).
            self.k = k.new_zeros(B, K, self.slots, D)  # (B, K, slots, D)
            self.v = v.new_zeros(B, K, self.slots, D)  # (B, K, slots, D)
        if self.is_ring:
            return self._extend_ring(k, v)
        start, end = self.length, self.length + T
        if end > self.max_length:
            raise ValueError(f"the KV cache holds {self.max_length} tokens; {end} do not fit")
        self.k[:, :, start:end] = k  # (B, K, T, D) into slots start..end-1
        self.v[:, :, start:end] = v  # (B, K, T, D) into the same slots
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]  # (B, K, S, D), (B, K, S, D)

    def _extend_ring(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        T, W = k.shape[2], self.slots
        if T == 1:
            # Generation's common step: write the token over the one W back, then attend over
            # the ring as it is. Attention adds up values weighted by scores, whatever order
            # the keys come in, so the slots need no sorting.
            slot = self.length % W
            self.k[:, :, slot] = k[:, :, 0]  # (B, K, D) into its slot
            self.v[:, :, slot] = v[:, :, 0]  # (B, K, D) into the same slot
            self.length += 1
            held = min(self.length, W)
            return self.k[:, :, :held], self.v[:, :, :held]  # (B, K, S, D), S = held
        # Several tokens at once (a prompt): the earlier keys any of them can see (the last
        # W - 1), oldest first, then these T; the window's band mask hides what is too old.
        earlier = torch.arange(max(0, self.length - (W - 1)), self.length, device=k.device) % W  # (E,) slots, oldest first
        k_all = torch.cat([self.k[:, :, earlier], k], dim=2)  # (B, K, E + T, D)
        v_all = torch.cat([self.v[:, :, earlier], v], dim=2)  # (B, K, E + T, D)
        kept = min(T, W)  # of these T, the last W stay in the ring
        positions = torch.arange(self.length + T - kept, self.length + T, device=k.device)  # (kept,)
        self.k[:, :, positions % W] = k[:, :, T - kept :]  # (B, K, kept, D) into their slots
        self.v[:, :, positions % W] = v[:, :, T - kept :]  # (B, K, kept, D) into the same slots
        self.length += T
        return k_all, v_all  # (B, K, S, D), S = E + T

    def nbytes(self) -> int:
        """The bytes the keys and values take (0 before the first token)."""
        return 0 if self.k is None else self.k.nbytes + self.v.nbytes


class CausalSelfAttention(nn.Module):
    def __init__(
        self,
        n_embd: int,
        n_head: int,
        dropout: float = 0.0,
        bias: bool = True,
        attention: str = "sdpa",
        rope: bool = False,
        qk_norm: bool = False,
        causal: bool = True,
        n_kv_head: int | None = None,
        head_dim: int | None = None,
        window: int | None = None,
        rope_theta: float = 10000.0,
        rope_scaling: dict[str, float] | None = None,
        norm_eps: float | None = None,
    ) -> None:
        """rope turns on rotary positions (base rope_theta; rope_scaling: Llama 3's, see rope_speeds);
        qk_norm scales every query and key to a fixed RMS (with a learned gain per dim) first,
        norm_eps inside the root (None: the dtype's eps); causal=False lets every query see every
        key, later ones included (not for a language model); n_kv_head: the key/value heads
        (None: n_head); head_dim: D (None: n_embd // n_head); window: how many of the most recent
        keys a query sees, itself included (None: all)."""
        super().__init__()
        n_kv_head = n_head if n_kv_head is None else n_kv_head
        if (problem := head_split_problem(n_embd, n_head, n_kv_head, head_dim)) is not None:
            raise ValueError(problem)
        if window is not None and window < 1:
            raise ValueError(f"window={window} must be at least 1 (the query's own token), or None")
        if attention not in ATTENTION_PATHS:
            raise ValueError(f"attention={attention!r} is not one of {ATTENTION_PATHS}")
        self.n_head, self.n_kv_head = n_head, n_kv_head
        self.head_dim = n_embd // n_head if head_dim is None else head_dim
        self.window = window
        self.attention = attention
        self.dropout = dropout
        self.causal = causal
        H, K, D = n_head, n_kv_head, self.head_dim
        # Q, K and V for all heads in one matrix: one matmul instead of three. Its rows
        # [0:H*D] are W_q, the next K*D are W_k, the last K*D are W_v (3C rows when K*D = H*D = C).
        self.qkv = nn.Linear(n_embd, (H + 2 * K) * D, bias=bias)
        # Mixes what the heads found back into the residual stream.
        self.proj = nn.Linear(H * D, n_embd, bias=bias)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        # QK-norm: RMS-normalise each head's queries and keys, so that a score can only grow
        # through the learned gains, not because q or k drifted large. Shared by all heads.
        self.q_norm = GainDtypeRMSNorm(D, eps=norm_eps) if qk_norm else None
        self.k_norm = GainDtypeRMSNorm(D, eps=norm_eps) if qk_norm else None
        self.rope = rope
        self.rope_theta, self.rope_scaling = rope_theta, rope_scaling
        # Named points where a function may read or replace an activation (model/hooks.py).
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        if qk_norm or rope:
            self.hook_rot_q, self.hook_rot_k = HookPoint(), HookPoint()
        self.hook_attn_scores, self.hook_pattern, self.hook_z = HookPoint(), HookPoint(), HookPoint()
        name_hook_points(self)

    def forward(
        self,
        x: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
        context: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend causally over x (over all of it with causal=False).

        x:                (B, T, C)
        key_padding_mask: optional (B, S) bool, True marks a padding key that no query
                          may look at (the same convention as nn.MultiheadAttention).
        need_weights:     also return the attention weights; this always takes the
                          manual path, whichever path the module was built with, and so
                          does a function attached to hook_attn_scores or hook_pattern.
        cache:            optional KVCache holding the earlier tokens' keys and values:
                          x then holds the T tokens that come after them. It is extended.
        context:          optional (B, S, C), another sequence: cross-attention, the keys and
                          values come from it and every query sees all of it (needs causal=False).

        Returns (out, weights): out is (B, T, C); weights is (B, H, T, S) or None.
        A query that can see no key at all gets an output row of zeros.
        """
        B, T, C = x.shape
        H, K, D = self.n_head, self.n_kv_head, self.head_dim
        if context is not None:
            self._check_context(x, context, cache)

        # 1. Project every token to a query, a key and a value: H query heads, K key/value heads.
        q, k, v = self.qkv(x).split([H * D, K * D, K * D], dim=2)  # (B, T, H*D), 2 x (B, T, K*D)
        if context is not None:  # cross-attention: keys and values from the other sequence, by the same W_k, W_v
            _, k, v = self.qkv(context).split([H * D, K * D, K * D], dim=2)  # 2 x (B, S, K*D); its queries go unused

        # 2. Split the channels into heads of D dims, then move heads next to batch,
        #    so each head becomes an independent attention over (T, D) matrices.
        q = self.hook_q(q.view(B, T, H, D))  # (B, T, H*D) -> (B, T, H, D)
        k = self.hook_k(k.view(B, -1, K, D))  # (B, T, K, D); (B, S, K, D) from a context
        v = self.hook_v(v.view(B, -1, K, D))  # (B, T, K, D); (B, S, K, D) from a context
        #    QK-norm and rotary positions, where turned on. A KV cache (when generating) holds
        #    the earlier tokens: these T come after them, and their keys and values join them.
        start = cache.length if cache is not None else 0  # the position of this call's first token
        positions = torch.arange(start, start + T, device=x.device)  # (T,)
        q, k = self.qk_norm_and_rope(q, k, positions)  # (B, T, H, D), (B, T, K, D)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, T, H, D) -> (B, H, T, D); k, v (B, K, T, D)
        if cache is not None:
            k, v = cache.extend(k, v)  # (B, K, S, D), (B, K, S, D); the queries are only these T tokens
        S = k.shape[2]  # keys: these T tokens and any cached earlier ones, or the context's

        # 3. Which keys may each query see? Its own token and earlier ones (every key with
        #    causal=False), within the window if there is one, never a padding key.
        visible, no_key_visible = self.visible_keys(B, T, S, key_padding_mask, x.device, self.causal, self.window)  # (1 or B, 1, T, S), (B, 1, T, 1) or None

        # 4-6. Scores, softmax over keys, weighted sum of values: spelt out, or one fused call.
        if need_weights or self.attention == "manual" or self.hook_attn_scores.fns or self.hook_pattern.fns:
            out, weights = self.attend_manual(q, k, v, visible, no_key_visible)  # (B, H, T, D), (B, H, T, S)
        else:
            out, weights = self.attend_sdpa(q, k, v, visible, no_key_visible), None  # (B, H, T, D)

        # 7. Each head's output z, back in token order: the last point where the heads are
        #    apart, so a hook here reads what one head found, or zeroes it (a knock-out).
        z = self.hook_z(out.transpose(1, 2))  # (B, H, T, D) -> (B, T, H, D)

        # 8. Merge the heads: lay the H x D values of each token side by side. transpose()
        #    only changed strides; contiguous() copies into the new order so that view()
        #    can reinterpret the memory as (B, T, H*D).
        out = z.contiguous().view(B, T, H * D)  # (B, T, H, D) -> (B, T, H*D), H*D == C unless head_dim is set

        # 9. Mix the heads and return to the residual stream.
        out = self.resid_dropout(self.proj(out))  # (B, T, H*D) -> (B, T, C)
        return out, weights

    def qk_norm_and_rope(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """QK-norm, then rotary positions, each if turned on, then hook_rot_q and hook_rot_k.
        q (B, T, H, D) and k (B, T, K, D) are the tokens at positions (T,)."""
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # (B, T, H, D), (B, T, K, D): each vector at RMS 1, times a gain
        # With rotary positions, turn each query and key by its token's position, so that
        # q . k depends on how far apart two tokens are, not on where they are.
        if self.rope:
            cos, sin = self.rope_cos_sin(positions)  # (T, 1, D/2) each
            q, k = rotate(q, cos, sin).to(q.dtype), rotate(k, cos, sin).to(k.dtype)  # (B, T, H, D), (B, T, K, D)
        if self.q_norm is not None or self.rope:
            q, k = self.hook_rot_q(q), self.hook_rot_k(k)  # (B, T, H, D), (B, T, K, D)
        return q, k

    def rope_cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cos and sin (T, 1, D/2) of the angles the tokens at positions (T,) turn by, in
        float32 whatever the model's dtype (a bf16 angle would be off by radians at position
        1000). Computed at each call, not kept: any position works, past block_size too."""
        speeds = rope_speeds(self.head_dim, self.rope_theta, self.rope_scaling).to(positions.device)  # (D/2,)
        # The 1: every head of a token turns by the same angles; q and k are (B, T, H, D) then.
        angles = positions.view(-1, 1, 1) * speeds.view(1, 1, -1)  # (T, 1, D/2)
        return angles.cos(), angles.sin()  # (T, 1, D/2) each

    def _check_context(self, x: torch.Tensor, context: torch.Tensor, cache: KVCache | None) -> None:
        """ValueError unless cross-attention from x over context can run here."""
        if context.dim() != 3 or context.shape[0] != x.shape[0] or context.shape[2] != x.shape[2]:
            raise ValueError(f"context must be (B, S, C) = ({x.shape[0]}, S, {x.shape[2]}) like x, not {tuple(context.shape)}")
        if self.causal:
            raise ValueError("context= (cross-attention) lets every query see every key of the other "
                             "sequence: build the module with causal=False")
        if cache is not None or self.rope or self.window:
            raise ValueError("context= (cross-attention) takes no KV cache, no rotary positions (rope=False) and "
                             "no window: the other sequence's positions are not this one's")

    @staticmethod
    def visible_keys(
        B: int, T: int, S: int, key_padding_mask: torch.Tensor | None, device: torch.device, causal: bool = True,
        window: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Step 3: which of the S keys each of the T queries may see; returns (visible,
        no_key_visible): visible (1, 1, T, S), or (B, 1, T, S) with a padding mask; no_key_visible
        (B, 1, T, 1) marks the queries that could see no key at all (None without padding)."""
        # Its own position and earlier ones: query t is token S - T + t of the sequence (the
        # cached tokens come first), so it sees keys 0 .. S - T + t (causal=False: every key)...
        visible = torch.ones(T, S, dtype=torch.bool, device=device)  # (T, S)
        if causal:
            visible = visible.tril(diagonal=S - T)  # (T, S): True on and below the diagonal
        # ...but with a window, only the W most recent of them: keys S - T + t - W + 1 .. S - T + t,
        # a band W wide along the diagonal. (One token after a ring cache: its S <= W keys all are.)
        if window is not None and S - T >= 0:
            visible = visible.triu(diagonal=S - T - window + 1)  # (T, S): True on the band
        visible = visible.view(1, 1, T, S)  # (1, 1, T, S): the same for every batch row and head
        if key_padding_mask is None:
            return visible, None
        if key_padding_mask.dtype != torch.bool or key_padding_mask.shape != (B, S):
            raise ValueError(f"key_padding_mask must be a bool tensor of shape {(B, S)}, not {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}")
        # ...and never a padding key.
        is_real_key = ~key_padding_mask.view(B, 1, 1, S)  # (B, 1, 1, S)
        visible = visible & is_real_key  # (B, 1, T, S)
        # A query with no visible key would softmax a row of -inf, i.e. 0/0 = NaN.
        # Let such a row see every key (finite, harmless) and zero it afterwards.
        no_key_visible = ~visible.any(dim=-1, keepdim=True)  # (B, 1, T, 1)
        visible = visible | no_key_visible  # (B, 1, T, S)
        return visible, no_key_visible

    def attend_manual(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        visible: torch.Tensor,
        no_key_visible: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Steps 4 to 6 spelt out; returns (out (B, H, T, D), weights (B, H, T, S))."""
        # 3b. Fewer keys than queries (K < H): each key/value head serves a group of H // K
        #     query heads, side by side (heads 0..G-1 read key head 0, and so on). Repeating
        #     each key/value head G times gives every query head its keys. (The fused call
        #     reads the shared ones in place instead: enable_gqa=True, no copies.)
        group = self.n_head // self.n_kv_head  # G: query heads per key/value head
        if group > 1:
            k = k.repeat_interleave(group, dim=1)  # (B, K, S, D) -> (B, H, S, D)
            v = v.repeat_interleave(group, dim=1)  # (B, K, S, D) -> (B, H, S, D)

        # 4. Score every (query, key) pair by their dot product. Dividing by sqrt(D) keeps
        #    the scores' spread near 1 whatever D is, so softmax does not saturate.
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, T, D) @ (B, H, D, S) -> (B, H, T, S)

        # 5. Hide what a query may not see, then turn each query's row of scores into
        #    weights over keys: softmax over the last dim (keys), so each row sums to 1.
        #    exp(-inf) = 0, so hidden keys get exactly zero weight.
        scores = scores.masked_fill(~visible, float("-inf"))  # (B, H, T, S)
        scores = self.hook_attn_scores(scores)  # (B, H, T, S): -inf where a key is hidden, as in TransformerLens
        weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
        if no_key_visible is not None:
            weights = weights.masked_fill(no_key_visible, 0.0)  # (B, H, T, S): such rows attend to nothing
        if self.hook_attn_scores.fns:  # a function that hid every key of a row made it 0/0 = NaN:
            hidden = scores.isneginf().all(dim=-1, keepdim=True)  # (B, H, T, 1)
            weights = weights.masked_fill(hidden, 0.0)  # (B, H, T, S): such a row attends to nothing, as in TransformerLens
        weights = self.hook_pattern(weights)  # (B, H, T, S)

        # 6. Each query's output is the weighted average of the values it attends to.
        out = self.attn_dropout(weights) @ v  # (B, H, T, S) @ (B, H, S, D) -> (B, H, T, D)
        return out, weights

    def attend_sdpa(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        visible: torch.Tensor,
        no_key_visible: torch.Tensor | None,
    ) -> torch.Tensor:
        """Steps 4 to 6 as one fused call; returns out (B, H, T, D). k and v may hold fewer heads
        (B, K, S, D): enable_gqa lets each group of query heads read its shared key/value head."""
        dropout_p = self.dropout if self.training else 0.0
        T, S = q.shape[2], k.shape[2]
        gqa = {"enable_gqa": True} if self.n_kv_head != self.n_head else {}
        # No padding mask: the fused kernels' own causal handling can stand in for `visible`.
        only_causal = no_key_visible is None
        # A window narrower than the keys needs its band mask (one token after a ring cache does not).
        banded = self.window is not None and self.window < S
        if only_causal and self.causal and T == S and not banded:
            # is_causal lets PyTorch skip reading a mask and use its fastest kernel.
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, **gqa)  # (B, H, T, D)
        if only_causal and (T == 1 or not self.causal) and not banded:
            # One new token after a KV cache sees every key, and so does every query with
            # causal=False: no mask at all.
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, **gqa)  # (B, H, T, D)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, dropout_p=dropout_p, **gqa)  # (B, H, T, D)
        if no_key_visible is not None:
            out = out.masked_fill(no_key_visible, 0.0)  # (B, H, T, D): such rows attend to nothing
        return out


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding: treat dims (i, i + D/2) of x (B, T, H, D) as a point in a
    plane and turn it by the angle whose cos and sin (T, 1, D/2) are given for each position."""
    x1, x2 = x.chunk(2, dim=-1)  # 2 x (B, T, H, D/2)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (B, T, H, D)


def rope_speeds(head_dim: int, theta: float = 10000.0, scaling: dict[str, float] | None = None) -> torch.Tensor:
    """How fast each of a head's D/2 pairs turns, in radians per token, (D/2,): pair i by
    1 / theta^(2i / D), fast for the first pairs, slow for the last. Written as transformers writes
    it: the angle is speed x position, so one float32 step in a speed grows with the position.

    scaling (Llama 3.1's "llama3" rope scaling: factor, low_freq_factor, high_freq_factor,
    original_max_position_embeddings) slows the pairs that turn less than once in the original
    context by `factor`, keeps the fast ones, and blends the band between, so a model trained
    on that context reads one `factor` times longer."""
    speeds = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)  # (D/2,)
    if not scaling:
        return speeds
    factor, context = scaling["factor"], scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelengths = 2 * math.pi / speeds  # (D/2,): tokens per turn
    slow = wavelengths > context / low  # turns less than low_freq_factor times in the context: slowed
    fast = wavelengths < context / high  # turns more than high_freq_factor times: kept
    blend = (context / wavelengths - low) / (high - low)  # (D/2,): 0 at the slow edge, 1 at the fast one
    between = (1 - blend) * speeds / factor + blend * speeds  # (D/2,)
    return torch.where(slow, speeds / factor, torch.where(fast, speeds, between))  # (D/2,)


def rope_scaling_problem(scaling: dict[str, float]) -> tuple[str, str] | None:
    """(which of the four numbers, what is wrong with it) when rope_speeds cannot use Llama 3.1's
    scaling as given; None when it can."""
    for name in ROPE_SCALING_KEYS:
        value = scaling[name]
        if type(value) not in (int, float) or not 0 < value < math.inf:
            return name, "it must be a positive number"
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    if high <= low:  # the blend between the two bands divides by high - low
        return "high_freq_factor", f"it must be greater than low_freq_factor={low}"
    if scaling["original_max_position_embeddings"] != int(scaling["original_max_position_embeddings"]):
        return "original_max_position_embeddings", "it must be a whole number of tokens"
    return None


def head_split_problem(n_embd: int, n_head: int, n_kv_head: int | None = None, head_dim: int | None = None,
                       key: str = "") -> str | None:
    """What is wrong with splitting n_embd channels into n_head query heads that share n_kv_head
    key/value heads, in one sentence naming each value as key + its name (key "model." on the
    command line); None when nothing is."""
    if head_dim is not None and head_dim < 1:
        return f"{key}head_dim={head_dim} must be at least 1 (or None: n_embd // n_head)"
    if head_dim is None and n_embd % n_head != 0:
        return (f"{key}n_embd={n_embd} is not divisible by {key}n_head={n_head}: each head needs n_embd // n_head "
                f"channels; pick {key}n_head from {divisors(n_embd)} (or set {key}head_dim)")
    if n_kv_head is not None and (n_kv_head < 1 or n_head % n_kv_head != 0):
        wrong = f"is more than {key}n_head={n_head}" if n_kv_head > n_head else f"does not divide {key}n_head={n_head}"
        return (f"{key}n_kv_head={n_kv_head} {wrong}: each key/value head serves n_head // n_kv_head query heads; "
                f"pick {key}n_kv_head from {divisors(n_head)}")
    return None


def divisors(n: int) -> list[int]:
    """The head counts that split n channels evenly, e.g. divisors(12) == [1, 2, 3, 4, 6, 12]."""
    return [d for d in range(1, n + 1) if n % d == 0]
