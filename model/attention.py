"""Multi-head causal self-attention, written as a lesson.

Every tensor line says its shape. The letters are:

    B  batch size            T  sequence length (tokens)
    C  model width, n_embd   H  number of heads, n_head
    D  head_dim = C // H     (each head works in its own D-dimensional subspace)
    S  number of keys: T, plus the earlier tokens held in a KV cache (S == T without one)

The module computes, for every head h and every position t:

    out_h[t] = sum over s <= t of softmax_s( q_h[t] . k_h[s] / sqrt(D) ) * v_h[s]

and mixes the heads back together with one output projection.

Two paths compute exactly that:
    "manual"  the explicit math, one step per line; it can also hand back the
              attention weights (B, H, T, T), which the TensorBoard maps are drawn from.
    "sdpa"    torch.nn.functional.scaled_dot_product_attention: the same math in one
              fused call that never stores the (T, T) weights. The training default.

KVCache keeps the keys and values of the tokens seen so far, so that generating one more
token computes only that token's query, key and value (see KVCache below).

Hook points (model/hooks.py) name the activations a learner asks about: hook_q, hook_k and
hook_v after the split into heads, hook_rot_q and hook_rot_k after QK-norm and rotary positions,
hook_attn_scores and hook_pattern (the manual path's scores before the mask and weights after
softmax), and hook_z, each head's output before the merge. They are TransformerLens's names, with
its layout: (B, T, H, D) for the per-head vectors. A function attached to one can read the
activation or hand back another (knocking a head out is zeroing its slice of hook_z); with none
attached, each is the identity. A function on hook_attn_scores or hook_pattern takes the manual
path, as need_weights does: the fused call has no weights to show.

Two variants, by the same steps: causal=False lets every query see every key (bidirectional,
as in an encoder), and forward(x, context=...) takes the keys and values from another
sequence (cross-attention, as when a decoder reads an encoder's output). The model uses neither.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from model.hooks import HookPoint, name_hook_points

ATTENTION_PATHS = ("sdpa", "manual")


class KVCache:
    """The keys and values one attention layer has computed for the tokens so far.

    When text is generated one token at a time, each new token attends over all earlier
    ones, whose keys and values never change (causal attention: earlier tokens never see
    later ones). Keeping them means each step computes the new token's q, k, v only and
    one (1, S) row of scores instead of the whole (S, S) square again.

    The keys and values go into buffers of max_length slots, allocated on first use, so
    adding a token writes one slot instead of copying everything held so far.
    """

    def __init__(self, max_length: int) -> None:
        self.max_length = max_length
        self.length = 0  # how many tokens' keys and values are held
        self.k: torch.Tensor | None = None  # (B, H, max_length, D)
        self.v: torch.Tensor | None = None  # (B, H, max_length, D)

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this call's keys and values (B, H, T, D); return all of them (B, H, S, D)."""
        B, H, T, D = k.shape
        if self.k is None:
            # Zeros, not uninitialised memory: the compiled decode step (model/decode_step.py)
            # multiplies the slots not written yet by zero weights, and 0 * NaN would be NaN.
            self.k = k.new_zeros(B, H, self.max_length, D)  # (B, H, max_length, D)
            self.v = v.new_zeros(B, H, self.max_length, D)  # (B, H, max_length, D)
        start, end = self.length, self.length + T
        if end > self.max_length:
            raise ValueError(f"the KV cache holds {self.max_length} tokens; {end} do not fit")
        self.k[:, :, start:end] = k  # (B, H, T, D) into slots start..end-1
        self.v[:, :, start:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]  # (B, H, S, D), (B, H, S, D)


class CausalSelfAttention(nn.Module):
    def __init__(
        self,
        n_embd: int,
        n_head: int,
        dropout: float = 0.0,
        bias: bool = True,
        attention: str = "sdpa",
        rope_length: int = 0,
        qk_norm: bool = False,
        causal: bool = True,
    ) -> None:
        """rope_length > 0 turns on rotary positions for up to that many tokens (see rotate);
        qk_norm scales every query and key to a fixed RMS (with a learned gain per dim) first;
        causal=False lets every query see every key, later ones included (not for a language model)."""
        super().__init__()
        if n_embd % n_head != 0:
            raise ValueError(
                f"n_embd={n_embd} is not divisible by n_head={n_head}: each head needs "
                f"n_embd // n_head dimensions; pick n_head among {divisors(n_embd)}"
            )
        if attention not in ATTENTION_PATHS:
            raise ValueError(f"attention={attention!r} is not one of {ATTENTION_PATHS}")
        self.n_head = n_head
        self.head_dim = n_embd // n_head
        self.attention = attention
        self.dropout = dropout
        self.causal = causal
        # Q, K and V for all heads in one matrix: one (C, 3C) matmul instead of three
        # (C, C) ones. Its rows [0:C] are W_q, [C:2C] are W_k, [2C:3C] are W_v.
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        # Mixes what the heads found back into the residual stream.
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        # QK-norm: RMS-normalise each head's queries and keys, so that a score can only grow
        # through the learned gains, not because q or k drifted large. Shared by all heads.
        self.q_norm = nn.RMSNorm(self.head_dim) if qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_dim) if qk_norm else None
        self.rope_length = rope_length
        if rope_length:
            # Pair i of a head's D dims turns by position * 10000^(-2i / D): fast for the first
            # pairs, slow for the last. Not parameters, and not saved: derived from the sizes.
            speeds = 10000.0 ** (-torch.arange(0, self.head_dim, 2) / self.head_dim)  # (D/2,)
            angles = torch.arange(rope_length).view(-1, 1, 1) * speeds.view(1, 1, -1)  # (rope_length, 1, D/2)
            # The 1: every head of a token turns by the same angles; q and k are (B, T, H, D) then.
            self.register_buffer("rope_cos", angles.cos(), persistent=False)  # (rope_length, 1, D/2)
            self.register_buffer("rope_sin", angles.sin(), persistent=False)  # (rope_length, 1, D/2)
        # Named points where a function may read or replace an activation (model/hooks.py).
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        if qk_norm or rope_length:
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
        H, D = self.n_head, self.head_dim
        if context is not None:
            self._check_context(x, context, cache)

        # 1. Project every token to a query, a key and a value.
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        if context is not None:  # cross-attention: keys and values from the other sequence, by the same W_k, W_v
            _, k, v = self.qkv(context).split(C, dim=2)  # 2 x (B, S, C); its queries go unused

        # 2. Split the channels into H heads of D dims, then move heads next to batch,
        #    so each head becomes an independent attention over (T, D) matrices.
        q = self.hook_q(q.view(B, T, H, D))  # (B, T, C) -> (B, T, H, D)
        k = self.hook_k(k.view(B, -1, H, D))  # (B, T, H, D); (B, S, H, D) from a context
        v = self.hook_v(v.view(B, -1, H, D))  # (B, T, H, D); (B, S, H, D) from a context
        #    QK-norm and rotary positions, where turned on. A KV cache (when generating) holds
        #    the earlier tokens: these T come after them, and their keys and values join them.
        start = cache.length if cache is not None else 0  # the position of this call's first token
        q, k = self.qk_norm_and_rope(q, k, slice(start, start + T))  # (B, T, H, D), (B, T, H, D)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, T, H, D) -> (B, H, T, D)
        if cache is not None:
            k, v = cache.extend(k, v)  # (B, H, S, D), (B, H, S, D); the queries are only these T tokens
        S = k.shape[2]  # keys: these T tokens and any cached earlier ones, or the context's

        # 3. Which keys may each query see? Its own token and earlier ones (every key with
        #    causal=False), never a padding key.
        visible, no_key_visible = self._visible(B, T, S, key_padding_mask, x.device, self.causal)  # (1 or B, 1, T, S), (B, 1, T, 1) or None

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
        #    can reinterpret the memory as (B, T, C).
        out = z.contiguous().view(B, T, C)  # (B, T, H, D) -> (B, T, C)

        # 9. Mix the heads and return to the residual stream.
        out = self.resid_dropout(self.proj(out))  # (B, T, C)
        return out, weights

    def qk_norm_and_rope(
        self, q: torch.Tensor, k: torch.Tensor, positions: slice | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """QK-norm, then rotary positions, each if turned on, then hook_rot_q and hook_rot_k.
        q and k (B, T, H, D) are the tokens at `positions`: a slice start .. start + T, or a
        (T,) tensor of positions."""
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # (B, T, H, D), each (q or k) vector at RMS 1, times a gain
        # With rotary positions, turn each query and key by its token's position, so that
        # q . k depends on how far apart two tokens are, not on where they are.
        if self.rope_length:
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]  # (T, 1, D/2) each
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)  # (B, T, H, D)
        if self.q_norm is not None or self.rope_length:
            q, k = self.hook_rot_q(q), self.hook_rot_k(k)  # (B, T, H, D) each
        return q, k

    def _check_context(self, x: torch.Tensor, context: torch.Tensor, cache: KVCache | None) -> None:
        """ValueError unless cross-attention from x over context can run here."""
        if context.dim() != 3 or context.shape[0] != x.shape[0] or context.shape[2] != x.shape[2]:
            raise ValueError(f"context must be (B, S, C) = ({x.shape[0]}, S, {x.shape[2]}) like x, not {tuple(context.shape)}")
        if self.causal:
            raise ValueError("context= (cross-attention) lets every query see every key of the other "
                             "sequence: build the module with causal=False")
        if cache is not None or self.rope_length:
            raise ValueError("context= (cross-attention) takes no KV cache and no rotary positions "
                             "(rope_length=0): the other sequence's positions are not this one's")

    @staticmethod
    def _visible(
        B: int, T: int, S: int, key_padding_mask: torch.Tensor | None, device: torch.device, causal: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Step 3: which of the S keys each of the T queries may see; returns (visible,
        no_key_visible): visible (1, 1, T, S), or (B, 1, T, S) with a padding mask; no_key_visible
        (B, 1, T, 1) marks the queries that could see no key at all (None without padding)."""
        # Its own position and earlier ones: query t is token S - T + t of the sequence (the
        # cached tokens come first), so it sees keys 0 .. S - T + t (causal=False: every key)...
        visible = torch.ones(T, S, dtype=torch.bool, device=device)  # (T, S)
        if causal:
            visible = visible.tril(diagonal=S - T)  # (T, S): True on and below the diagonal
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
        # 4. Score every (query, key) pair by their dot product. Dividing by sqrt(D) keeps
        #    the scores' spread near 1 whatever D is, so softmax does not saturate.
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, T, D) @ (B, H, D, S) -> (B, H, T, S)
        scores = self.hook_attn_scores(scores)  # (B, H, T, S), before the mask

        # 5. Hide what a query may not see, then turn each query's row of scores into
        #    weights over keys: softmax over the last dim (keys), so each row sums to 1.
        #    exp(-inf) = 0, so hidden keys get exactly zero weight.
        scores = scores.masked_fill(~visible, float("-inf"))  # (B, H, T, S)
        weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
        if no_key_visible is not None:
            weights = weights.masked_fill(no_key_visible, 0.0)  # (B, H, T, S): such rows attend to nothing
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
        """Steps 4 to 6 as one fused call; returns out (B, H, T, D)."""
        dropout_p = self.dropout if self.training else 0.0
        T, S = q.shape[2], k.shape[2]
        # No padding mask: the fused kernels' own causal handling can stand in for `visible`.
        only_causal = no_key_visible is None
        if only_causal and self.causal and T == S:
            # is_causal lets PyTorch skip reading a mask and use its fastest kernel.
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)  # (B, H, T, D)
        if only_causal and (T == 1 or not self.causal):
            # One new token after a KV cache sees every key, and so does every query with
            # causal=False: no mask at all.
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)  # (B, H, T, D)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, dropout_p=dropout_p)  # (B, H, T, D)
        if no_key_visible is not None:
            out = out.masked_fill(no_key_visible, 0.0)  # (B, H, T, D): such rows attend to nothing
        return out


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding: treat dims (i, i + D/2) of x (B, T, H, D) as a point in a
    plane and turn it by the angle whose cos and sin (T, 1, D/2) are given for each position."""
    x1, x2 = x.chunk(2, dim=-1)  # 2 x (B, T, H, D/2)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (B, T, H, D)


def divisors(n: int) -> list[int]:
    """The head counts that split n channels evenly, e.g. divisors(12) == [1, 2, 3, 4, 6, 12]."""
    return [d for d in range(1, n + 1) if n % d == 0]
