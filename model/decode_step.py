"""One decoding step captured once and compiled into fused kernels: what generation runs for
each new token with compile=True (model/generation.py).

Eager, a cached step is about 200 small operations per token, and with a model this small the
fixed cost of each operation is most of the time. Compiled, the step becomes a few fused C++
loops. The step takes each KVCache's whole buffer of block_size slots (a window's ring of W),
writes the new key and value into slot `position` (position % W in a ring), and attends over
the slots filled so far: their count, read from `position` when the step runs, sizes the
attention's loops, so an early token of a long window does not read the empty slots. The math
is GPT.forward's with caches, then sampling.choose_next_token; tests/test_decode_step.py checks
both against the eager path.
"""

import logging
import math
import sys
import warnings

import torch
from torch import nn

from model.attention import CausalSelfAttention
from model.gpt import GPT, Caches, eval_mode
from model.sampling import DIVERGED, choose_next_token

# C++ rather than Python glue between the kernels, one block of memory planned for all the step's
# buffers instead of an allocation each, and every intermediate of more than a few operations (a
# norm's output, an activation) stored once rather than recomputed inside each loop that reads it:
# a one-row matmul (one_row_linear) reads its input once per row of its weight. No pattern matcher:
# it swaps attend_one's bmm, softmax, bmm for a fused attention kernel, whose call costs more than
# one query row's work (on a CPU its 12 calls a token also split the step's one fused loop nest
# into five: docs/speed.md, "Without Inductor's pattern matcher"), and whose shape checks on CUDA cannot take a slot
# count read at run time (torch 2.11 stops the compile there). A step whose one-row matmuls read
# bfloat16 in pairs stores more still (inductor_options).
INDUCTOR_OPTIONS = {"cpp_wrapper": True, "memory_planning": True, "realize_opcount_threshold": 4, "pattern_matcher": False}


def inductor_options(bfloat16_pairs: bool) -> dict:
    """INDUCTOR_OPTIONS, and the C++ compiler allowed to fuse each multiply and add into one FMA
    instruction (-ffp-contract=fast; rounded once rather than twice). A one-row matmul's loop is a
    chain of multiply-adds into one accumulator: fused, GPT-2 small decoded 8% and 10% faster at
    bfloat16 in paired runs on a 2-core AMD EPYC (docs/speed.md). The option is "off"/"on"/"fast"
    in recent torch and a bool in older releases.
    bfloat16_pairs: the one-row matmuls read bfloat16 in pairs (bfloat16_pairs_dot); then every
    intermediate of more than one operation is stored once, the input's two widened halves among
    them, which each loop over a weight would otherwise widen again with every vector of the
    weight it reads (GPT-2 small's compiled step 10% faster on an AMD EPYC of family 26; the
    project's default model, whose weights sit in the caches, slower: docs/speed.md)."""
    from torch._inductor import config  # here, not at the top: importing Inductor takes a second

    contract = "fast" if isinstance(config.cpp.enable_floating_point_contract_flag, str) else True
    options = {**INDUCTOR_OPTIONS, "cpp.enable_floating_point_contract_flag": contract}
    if bfloat16_pairs:
        options["realize_opcount_threshold"] = 1
    return options


def one_token_logits(
    model: GPT,
    token: torch.Tensor,
    position: torch.Tensor,
    last_embedding: torch.Tensor,
    slots: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The next-token logits after `token` (B, 1), the token at `position` (a (1,) tensor).

    last_embedding: (B, 1, C), the previous token's embedding (used by Smear only).
    slots: each layer's KVCache keys, then each layer's values, all (B, K, N, D), N slots (block_size,
    or a window's W), with the earlier tokens' in slots 0 .. min(position, N) - 1; this token's key
    and value are written into slot position % N.
    Returns logits (B, vocab_size) and this token's embedding (B, 1, C), the next last_embedding.
    """
    n_layer = len(model.blocks)
    keys, values = slots[:n_layer], slots[n_layer:]
    embedding = model.tok_emb(token)  # (B, 1, C)
    x = model.smear(embedding, last_embedding) if model.smear is not None else embedding  # (B, 1, C)
    if model.pos_emb is not None:
        x = x + model.pos_emb(position)  # (B, 1, C) + (1, C)
    slot_count = keys[0].shape[2]  # N
    slot = position % slot_count  # (1,): where this token's key and value go
    # The slots filled so far, this token's included: slots 0 .. position, or all N once a ring
    # has gone round (a ring holds the window only, so every key in it is visible). A number read
    # when the step runs, not a shape fixed when it was compiled.
    filled = torch.clamp(position + 1, max=slot_count).item()
    torch._check(filled >= 1)  # what the compiled loops may assume of it
    torch._check(filled <= slot_count)
    for block, k_slots, v_slots in zip(model.blocks, keys, values, strict=True):
        x = x + attend_one(block.attn, block.ln_1(x), k_slots, v_slots, position, slot, filled)  # (B, 1, C)
        x = x + block.mlp(block.ln_2(x))  # (B, 1, C)
    logits = model.lm_head(model.ln_f(x))  # (B, 1, vocab_size)
    return logits[:, -1], embedding  # (B, vocab_size), (B, 1, C)


def attend_one(
    attn: CausalSelfAttention,
    x: torch.Tensor,
    k_slots: torch.Tensor,
    v_slots: torch.Tensor,
    position: torch.Tensor,
    slot: torch.Tensor,
    filled: int,
) -> torch.Tensor:
    """CausalSelfAttention.forward for one token x (B, 1, C) at `position` whose key and value go
    into `slot` of k_slots and v_slots (B, K, N, D), attending over their first `filled` slots.
    Returns (B, 1, C).

    The scores are attend_manual's, but each group of G = H // K query heads reads its shared
    key/value head in place, as one (G, D) @ (D, S) product, instead of a copy of the cache
    repeated G times per token."""
    B, _, C = x.shape
    H, K, D = attn.n_head, attn.n_kv_head, attn.head_dim
    G = H // K
    q, k, v = attn.qkv(x).split([H * D, K * D, K * D], dim=2)  # (B, 1, H*D), 2 x (B, 1, K*D)
    q, k = attn.qk_norm_and_rope(q.view(B, 1, H, D), k.view(B, 1, K, D), position)  # (B, 1, H, D), (B, 1, K, D)
    q = q.view(B, K, G, D)  # (B, 1, H, D) -> (B, K, G, D): query heads by group
    k, v = k.transpose(1, 2), v.view(B, 1, K, D).transpose(1, 2)  # (B, K, 1, D) each
    k_slots.index_copy_(2, slot, k)  # (B, K, N, D) with this token's key in its slot
    v_slots.index_copy_(2, slot, v)  # (B, K, N, D)
    keys, values = k_slots[:, :, :filled], v_slots[:, :, :filled]  # (B, K, S, D) each, S = filled
    # q scaled first, not the scores (the same up to rounding): G x D multiplies instead of G x S.
    # As bmm over the B*K key/value heads: with K = 1, @ on 4-d tensors folds (G, S) into one
    # dimension of G * S, a size the compiler cannot reason about while S is read at run time.
    S = keys.shape[2]
    scores = torch.bmm((q / math.sqrt(D)).reshape(B * K, G, D), keys.reshape(B * K, S, D).transpose(1, 2))  # (B*K, G, D) @ (B*K, D, S) -> (B*K, G, S)
    weights = torch.softmax(scores, dim=-1)  # (B*K, G, S): every filled slot is visible, no mask
    out = torch.bmm(weights, values.reshape(B * K, S, D))  # (B*K, G, S) @ (B*K, S, D) -> (B*K, G, D)
    return attn.proj(out.reshape(B, 1, H * D))  # (B*K, G, D) -> (B, 1, H*D) -> (B, 1, C)


def one_row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear for one row x (1, 1, in) as a multiply and a sum, accumulated in float32 as BLAS
    does. One token's matmul reads each weight once for one multiply-add: the speed is memory's,
    and Inductor makes this one loop over the weight that streams it near that speed, in float32,
    and in bfloat16 read in pairs (BLAS's one-row calls reach a third to a half of it on a 2-core
    AMD EPYC, docs/speed.md). Returns (1, 1, out)."""
    if x.dtype == torch.bfloat16 and reads_bfloat16_pairs(weight):
        out = bfloat16_pairs_dot(x, weight)  # (1, 1, out), float32
    else:
        out = (x.unsqueeze(-2).float() * weight.float()).sum(-1)  # (1, 1, 1, in) * (out, in), summed over in -> (1, 1, out)
    if bias is not None:
        out = out + bias.float()  # (1, 1, out), rounded once below, as addmm does
    return out.to(x.dtype)


def reads_bfloat16_pairs(weight: torch.Tensor) -> bool:
    """Whether one_row_linear reads a bfloat16 input and this weight as pairs of bfloat16: the
    weight bfloat16, of an even width, on a little-endian CPU (CUDA's loop was not measured so)."""
    return (weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and weight.shape[-1] % 2 == 0
            and sys.byteorder == "little")


def bfloat16_pairs_dot(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (1, 1, in) times each row of weight (out, in), both bfloat16, summed in float32: (1, 1, out).

    A bfloat16 is the top half of a float32, so widening one is a 16-bit shift. Read as int32,
    each 4 bytes hold two neighbours, element 2j in the low half and 2j+1 in the high half:
    shifting the low half up, or masking the high half, gives each one's float32 exactly. This
    way Inductor's loop reads the weight in whole 64-byte vectors of int32; reading it as
    bfloat16 it loads 16 at a time with masked loads, which ran at 22% of x.sum()'s read rate on
    an AMD EPYC of family 26 (docs/speed.md, "bfloat16 read in pairs")."""
    # A fresh copy: contiguous() would hand back an x that starts at an odd element, or whose size-1
    # dimensions have odd strides, which no int32 view can read. (The step stores x once anyway.)
    x_pairs = x.clone(memory_format=torch.contiguous_format).view(torch.int32).unsqueeze(-2)  # (1, 1, in) bf16 -> (1, 1, 1, in/2) int32
    w_pairs = weight.contiguous().view(torch.int32)  # (out, in) bf16 -> (out, in/2) int32 (contiguous: no copy)
    even = widen_low(x_pairs) * widen_low(w_pairs)  # (1, 1, out, in/2): elements 0, 2, 4, ...
    odd = widen_high(x_pairs) * widen_high(w_pairs)  # (1, 1, out, in/2): elements 1, 3, 5, ...
    return (even + odd).sum(-1)  # (1, 1, out)


def widen_low(pairs: torch.Tensor) -> torch.Tensor:
    """The float32 of the bfloat16 in each int32's low half: shifted into the high half."""
    return (pairs << 16).view(torch.float32)


def widen_high(pairs: torch.Tensor) -> torch.Tensor:
    """The float32 of the bfloat16 in each int32's high half: the low half cleared."""
    return (pairs & -65536).view(torch.float32)  # -65536 = 0xFFFF0000 as an int32


class NextTokenStep(nn.Module):
    """one_token_logits then choose_next_token, as one module for torch.export to capture."""

    def __init__(self, model: GPT, temperature: float, top_k: int | None, top_p: float | None) -> None:
        super().__init__()
        self.model = model
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p

    def forward(
        self, token: torch.Tensor, position: torch.Tensor, last_embedding: torch.Tensor, uniform: torch.Tensor,
        *slots: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns the next token (B, 1), whether the logits were all finite (a bool tensor),
        and this token's embedding (B, 1, C)."""
        logits, embedding = one_token_logits(self.model, token, position, last_embedding, list(slots))  # (B, V), (B, 1, C)
        next_token = choose_next_token(logits, self.temperature, self.top_k, self.top_p, uniform)  # (B, 1)
        return next_token, torch.isfinite(logits).all(), embedding


class CompiledDecodeStep:
    """NextTokenStep for one model, batch size and choice of sampling settings, captured with
    torch.export and compiled by Inductor. Building it takes seconds, more the first time on a
    machine (Inductor caches its kernels); each call then costs a fraction of the eager step
    (docs/speed.md, "Sampling", has both figures). generate_tokens checks with
    check_fits that it is used for what it was built for: the model as it is, so neither
    building nor using one is allowed while functions are attached to its hook points
    (GPT.hooks: knock-outs, caches), which compiled code would not call."""

    def __init__(self, model: GPT, batch_size: int, temperature: float, top_k: int | None, top_p: float | None) -> None:
        refuse_hooks(model)
        self.model = model
        self.settings = (batch_size, temperature, top_k, top_p)
        config, weight = model.config, next(model.parameters())
        floats = dict(dtype=weight.dtype, device=weight.device)
        self.weights_as_built = (weight.dtype, weight.device)  # model.to(...) after this needs a new step
        slot_count = model.new_caches().layers[0].slots  # block_size, or a window's W
        example = (
            torch.zeros(batch_size, 1, dtype=torch.long, device=weight.device),  # token
            torch.zeros(1, dtype=torch.long, device=weight.device),  # position
            torch.zeros(batch_size, 1, config.n_embd, **floats),  # last_embedding
            # uniform: float32 whatever the weights' dtype, as uniform_noise draws it (the compiled code
            # reads its input's bytes as the dtype it was built with)
            torch.full((batch_size, config.vocab_size), 0.5, dtype=torch.float32, device=weight.device),
            *(torch.zeros(batch_size, config.kv_heads, slot_count, config.head_size, **floats)
              for _ in range(2 * config.n_layer)),  # slots
        )
        self._position = example[1]  # refilled for each call
        self._stand_ins = example[2], example[3]  # the last_embedding and uniform of a call without them
        with eval_mode(model):
            program = torch.export.export(NextTokenStep(model, temperature, top_k, top_p), example)
        bfloat16_pairs = False  # whether any one-row matmul reads bfloat16 in pairs
        if batch_size == 1:  # with more rows, one BLAS call reads the weight once for all of them
            with warnings.catch_warnings():  # torch's own deprecation (LeafSpec) inside run_decompositions
                warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
                program = program.run_decompositions({torch.ops.aten.linear.default: one_row_linear})
            bfloat16_pairs = weight.dtype == torch.bfloat16 and any(
                reads_bfloat16_pairs(module.weight) for module in model.modules() if isinstance(module, nn.Linear))
        from torch._inductor import compile as inductor_compile  # here, not at the top: it takes a second to import

        graph = program.module()
        # Its hooks (input checks that the compiled code repeats) are lambdas, which Inductor's
        # cache cannot key; without them a later process reuses more of the compiled code.
        graph._forward_pre_hooks.clear()
        graph._forward_hooks.clear()
        # The whole-graph cache cannot key an exported graph either (a warning with a traceback);
        # the kernels themselves are still cached, so that message is kept off the user's screen.
        cache_log = logging.getLogger("torch._inductor.codecache")
        level = cache_log.level
        cache_log.setLevel(logging.ERROR)
        try:
            with torch.no_grad():  # an inference graph: no autograd records around the kernels
                self._run = inductor_compile(graph, list(example), options=inductor_options(bfloat16_pairs))
        finally:
            cache_log.setLevel(level)

    def check_fits(self, model: GPT, batch_size: int, temperature: float, top_k: int | None, top_p: float | None,
                   use_kv_cache: bool) -> None:
        """ValueError unless generation with these arguments is what this step was built for."""
        if model is not self.model or (batch_size, temperature, top_k, top_p) != self.settings or not use_kv_cache:
            raise ValueError(
                f"this CompiledDecodeStep was built for another model or for (batch_size, temperature, top_k, "
                f"top_p) = {self.settings}, with the KV cache; got {(batch_size, temperature, top_k, top_p)}, "
                f"use_kv_cache={use_kv_cache}")
        weight = next(model.parameters())
        if (weight.dtype, weight.device) != self.weights_as_built:
            built_dtype, built_device = self.weights_as_built
            raise ValueError(f"this CompiledDecodeStep was built for the model's weights in {built_dtype} on "
                             f"{built_device}; they are {weight.dtype} on {weight.device} now: build the step again")
        refuse_hooks(model)

    def __call__(self, token: torch.Tensor, caches: Caches, uniform: torch.Tensor | None) -> torch.Tensor:
        """The next token (B, 1) after token (B, 1); caches (filled by GPT.forward) take in this
        token as GPT.forward would have done. uniform: uniform_noise's (B, V), or None at
        temperature 0."""
        # The compiled code expects the strides it was built with: token and last_embedding
        # may be slices of longer tensors, so they are copied into fresh contiguous ones.
        token = token.to(torch.long, memory_format=torch.contiguous_format, copy=True)  # (B, 1); int32 ids too
        position = self._position.fill_(caches.length)  # (1,)
        last_embedding, stand_in_uniform = self._stand_ins  # without smear, last_embedding is not read
        if self.model.smear is not None:
            last_embedding = caches.last_embedding.clone(memory_format=torch.contiguous_format)  # (B, 1, C)
        uniform = uniform if uniform is not None else stand_in_uniform  # temperature 0 reads none
        slots = [cache.k for cache in caches.layers] + [cache.v for cache in caches.layers]
        next_token, finite, embedding = self._run(token, position, last_embedding, uniform, *slots)
        for cache in caches.layers:
            cache.length += 1
        if self.model.smear is not None:
            caches.last_embedding = embedding  # (B, 1, C)
        if not finite:
            raise FloatingPointError(DIVERGED)
        return next_token


def refuse_hooks(model: GPT) -> None:
    """ValueError while functions are attached to model's hook points: a compiled step calls none."""
    if model.has_hooks():
        raise ValueError("functions are attached to this model's hook points (GPT.hooks: knock-outs, caches), and a "
                         "CompiledDecodeStep calls none of them: generate without it (compile=False) while they are")
