"""A small GPT: token and position embeddings, a stack of transformer blocks, a tied LM head.

What is here:
    GPTConfig  the shape of the network (the keys of the `model` config group, plus vocab_size)
    MLP        position-wise feed-forward: Linear(C, 4C) -> GELU (or ReLU^2) -> Linear(4C, C), or SwiGLU
    Block      pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))
    Smear      each token's embedding takes in a gated share of the previous token's
    Caches     what generation keeps between calls: a KVCache per layer, the last embedding
    GPT        the whole model; forward() gives logits and the loss; its hook points (model/hooks.py)
               let run_with_cache() keep any activation and run_with_hooks() edit one, e.g.
               knock_out() heads; attention_weights() the per-layer maps for a probe
               (generation is in model/generation.py).

Nothing here reads files or config: train.py and sample.py build a GPTConfig and pass it in.
"""

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from model.attention import CausalSelfAttention, KVCache
from model.hooks import HookedModel, HookFn, HookPoint, is_pattern, is_whole_number, name_hook_points
from model.norms import LayerNorm, RMSNorm


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """module in eval mode inside the block, back in the mode it had after it, even on error."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int | None = None  # token ids 0 to vocab_size - 1; None in a run's spec until its tokenizer is built
    block_size: int = 256  # the longest context the model sees (learned positions)
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False  # biases in Linear layers and LayerNorms
    attention: str = "sdpa"  # "sdpa" (fused) or "manual" (explicit math)
    pos: str = "learned"  # "learned" position embeddings (GPT-2), or "rope": rotary, in attention
    norm: str = "layernorm"  # "layernorm" (GPT-2) or "rmsnorm" (no mean subtraction, no bias)
    mlp: str = "gelu"  # "gelu_tanh" (GPT-2's tanh-approximated GELU), "gelu" (exact, erf), "relu2": ReLU(x)^2, or "swiglu" (Llama's)
    tie_head: bool = True  # the LM head shares the token embedding matrix
    qk_norm: bool = False  # RMS-normalise queries and keys in every head before scoring
    smear: bool = False  # add to each token's embedding a gated share of the previous token's
    n_kv_head: int | None = None  # key/value heads, shared by n_head // n_kv_head query heads each; None: n_head
    head_dim: int | None = None  # each head's size D; None: n_embd // n_head
    window: int | None = None  # each query sees at most this many of the most recent keys; None: all
    mlp_hidden: int | None = None  # the MLP's hidden width; None: 4 * n_embd, or about 8/3 of it for swiglu
    rope_theta: float = 10000.0  # rotary positions' base: pair i turns by rope_theta^(-2i/D) per token
    rope_scaling: dict[str, float] | None = None  # Llama 3.1's rope scaling (model/attention.py rope_speeds)
    norm_eps: float | None = None  # inside the norms' root; None: LayerNorm's 1e-5, RMSNorm's the dtype's eps

    @property
    def kv_heads(self) -> int:
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head if self.head_dim is None else self.head_dim

    @property
    def hidden_size(self) -> int:
        """The MLP's hidden width."""
        if self.mlp_hidden:
            return self.mlp_hidden
        return swiglu_hidden(self.n_embd) if self.mlp == "swiglu" else 4 * self.n_embd


POSITIONS, NORMS, MLPS = ("learned", "rope"), ("layernorm", "rmsnorm"), ("gelu", "gelu_tanh", "relu2", "swiglu")


def swiglu_hidden(n_embd: int) -> int:
    """SwiGLU's usual hidden width: 8/3 of n_embd, rounded up to a multiple of 32, so its three
    matrices hold about the parameters of a 4 * n_embd MLP's two."""
    return 32 * math.ceil(8 * n_embd / 3 / 32)


def make_norm(config: GPTConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm(config.n_embd, eps=config.norm_eps)
    return LayerNorm(config.n_embd, bias=config.bias, eps=1e-5 if config.norm_eps is None else config.norm_eps)


class ReLUSquared(torch.autograd.Function):
    """ReLU(x)^2, whose gradient is 2 ReLU(x) times the incoming one. Autograd would get there
    through square's and relu's backward kernels, three times slower on a CPU for the same
    numbers."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        relu = F.relu(x)
        ctx.save_for_backward(relu)
        return relu.square()

    @staticmethod
    @once_differentiable  # a second derivative would need relu's own graph, which is not kept
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        relu, = ctx.saved_tensors
        return (grad * relu).mul_(2)


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """ReLU(x)^2: through ReLUSquared where autograd records, plain ops where it does not
    (sampling, evaluation), as a Function's call costs more than its two ops."""
    return ReLUSquared.apply(x) if torch.is_grad_enabled() else F.relu(x).square()


class MLP(nn.Module):
    """Per token: widen to F = config.hidden_size (4C unless set), an activation, back to C.
    swiglu (Llama's) has a second widening matrix `up`, and multiplies it by SiLU of the first:
    a gate. Its F is about 8/3 C, so its three matrices weigh what the others' two do."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.fc = nn.Linear(config.n_embd, hidden, bias=config.bias)  # swiglu: the gate
        self.up = nn.Linear(config.n_embd, hidden, bias=config.bias) if config.mlp == "swiglu" else None
        self.proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.activation = config.mlp
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()
        if self.up is not None:
            self.hook_pre_linear = HookPoint()  # TransformerLens's name for the ungated half

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.hook_pre(self.fc(x))  # (B, T, C) -> (B, T, F)
        if self.activation == "swiglu":
            h = F.silu(pre) * self.hook_pre_linear(self.up(x))  # (B, T, F) * (B, T, F)
        elif self.activation == "relu2":
            h = relu_squared(pre)  # (B, T, F)
        else:
            # GPT-2 was trained with tanh's approximation of GELU; its weights expect it exactly.
            h = F.gelu(pre, approximate="tanh" if self.activation == "gelu_tanh" else "none")  # (B, T, F)
        h = self.hook_post(h)  # (B, T, F)
        return self.dropout(self.proj(h))  # (B, T, F) -> (B, T, C)


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(
            config.n_embd, config.n_head, config.dropout, config.bias, config.attention,
            rope=config.pos == "rope", qk_norm=config.qk_norm, n_kv_head=config.n_kv_head,
            head_dim=config.head_dim, window=config.window, rope_theta=config.rope_theta,
            rope_scaling=config.rope_scaling, norm_eps=config.norm_eps,
        )
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)
        # The residual stream before, between and after the two sublayers, and what each adds.
        self.hook_resid_pre, self.hook_attn_out, self.hook_resid_mid = HookPoint(), HookPoint(), HookPoint()
        self.hook_mlp_out, self.hook_resid_post = HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        # Pre-LayerNorm: each sublayer reads a normalised copy and adds its answer back,
        # so the residual stream x itself is never normalised away.
        x = self.hook_resid_pre(x)  # (B, T, C)
        attn_out, _ = self.attn(self.ln_1(x), cache=cache)  # (B, T, C)
        x = self.hook_resid_mid(x + self.hook_attn_out(attn_out))  # (B, T, C)
        x = x + self.hook_mlp_out(self.mlp(self.ln_2(x)))  # (B, T, C)
        return self.hook_resid_post(x)  # (B, T, C)


class Smear(nn.Module):
    """x[t] + gate(x[t]) * x[t-1]: every token's embedding also carries the token before it.

    A head that should find "the token after an earlier X" (to copy it) then only has to
    match keys that hold X, which one attention layer can do from the start. The gate, a
    number in (0, 1) per token, is learned from the token itself. The first token of a
    window has no previous token: it takes in zeros."""

    def __init__(self, n_embd: int) -> None:
        super().__init__()
        self.gate = nn.Linear(n_embd, 1)
        self.hook_out = HookPoint()

    def forward(self, x: torch.Tensor, before: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, C) token embeddings; before: (B, 1, C), the embedding of the token just
        before x[:, 0] (generation with a cache), or None at the start of a window."""
        if before is None:
            before = torch.zeros_like(x[:, :1])  # (B, 1, C)
        previous = torch.cat([before, x[:, :-1]], dim=1)  # (B, T, C): x shifted one token right
        return self.hook_out(x + torch.sigmoid(self.gate(x)) * previous)  # (B, T, C) + (B, T, 1) * (B, T, C)


@dataclass
class Caches:
    """What generation keeps between calls of GPT.forward on the same window: each layer's
    KVCache, and the last token's embedding for Smear."""

    layers: list[KVCache]
    last_embedding: torch.Tensor | None = None  # (B, 1, C)

    @property
    def length(self) -> int:
        """How many tokens of the window the caches hold."""
        return self.layers[0].length


class GPT(HookedModel):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("GPTConfig.vocab_size is None: give the tokenizer's vocab_size")
        for key, choices in (("pos", POSITIONS), ("norm", NORMS), ("mlp", MLPS)):  # else a quiet fallback
            if getattr(config, key) not in choices:
                raise ValueError(f"{key}={getattr(config, key)!r} is not one of {choices}")
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        # With rope, positions enter inside attention instead (model/attention.py).
        self.pos_emb = nn.Embedding(config.block_size, config.n_embd) if config.pos == "learned" else None
        self.smear = Smear(config.n_embd) if config.smear else None
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = make_norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_head:
            # Weight tying: reading a token in and scoring it as the next token share one
            # matrix (vocab_size, C). Fewer parameters, and it trains better at this size.
            self.lm_head.weight = self.tok_emb.weight
        self.hook_embed = HookPoint()  # (B, T, C): the tokens' embeddings
        self.hook_pos_embed = HookPoint() if self.pos_emb is not None else None  # (T, C): the positions'
        name_hook_points(self)
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2 initialisation: N(0, 0.02) weights, zero biases, and the two projections
        that write into the residual stream scaled down by 1/sqrt(2 * n_layer), so the
        stream's variance does not grow with depth."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                is_residual_projection = name.endswith("attn.proj") or name.endswith("mlp.proj")
                nn.init.normal_(module.weight, mean=0.0, std=residual_std if is_residual_projection else 0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_parameters(self) -> int:
        """Distinct parameters (the tied head/embedding matrix counted once)."""
        return sum(p.numel() for p in self.parameters())

    @property
    def generates_past_block_size(self) -> bool:
        """Whether generation may run on past block_size tokens with one set of caches: with a
        window no query reads further back than it (its caches are rings), and rotary positions
        work at any position. Learned positions end at block_size: generation slides instead."""
        return self.config.window is not None and self.pos_emb is None

    def new_caches(self) -> Caches:
        """Empty caches for generating one window of up to block_size tokens (a window model with
        rotary positions: as many as wanted, in rings of `window` slots)."""
        # A ring past block_size still keeps W slots when W > block_size: each query sees W keys.
        length = max(self.config.block_size, self.config.window) if self.generates_past_block_size else self.config.block_size
        return Caches([KVCache(length, self.config.window) for _ in self.blocks])

    def embed(self, idx: torch.Tensor, caches: Caches | None = None) -> torch.Tensor:
        """The first block's input for idx (B, T): token embeddings, smeared and with learned
        positions where those are turned on. Returns (B, T, C)."""
        self.check_token_ids(idx)
        T = idx.shape[1]
        start = caches.length if caches is not None else 0  # tokens already in the caches come first
        end = T if self.generates_past_block_size else start + T  # the furthest position this call needs
        if self.config.block_size < end:
            raise ValueError(f"sequence length {end} exceeds block_size={self.config.block_size}: the model reads at most "
                             f"{self.config.block_size} tokens; crop the input to its last ones, e.g. idx[:, -{self.config.block_size}:]")
        x = self.hook_embed(self.tok_emb(idx))  # (B, T, C)
        if self.smear is not None:
            before = caches.last_embedding if caches is not None else None  # (B, 1, C) or None
            if caches is not None:
                caches.last_embedding = x[:, -1:]  # (B, 1, C): the next call's `before`
            x = self.smear(x, before)  # (B, T, C)
        if self.pos_emb is not None:
            positions = torch.arange(start, start + T, device=idx.device)  # (T,)
            x = x + self.hook_pos_embed(self.pos_emb(positions))  # (B, T, C) + (T, C) -> (B, T, C)
        return self.dropout(x)

    def check_token_ids(self, idx: torch.Tensor, name: str = "idx") -> None:
        """ValueError, in one line, for what a learner may hand the model by mistake: not a (B, T)
        batch, no tokens, not integers, an id outside the vocabulary. The shape and dtype cost nothing
        to check; the ids are checked where they are on the CPU (on a GPU the check would wait for
        it) and outside a compile (whose graph it would break)."""
        if not isinstance(idx, torch.Tensor):  # a text, a list of ids, a NumPy array
            how = ("encode it first, e.g. torch.tensor([tokenizer.encode(text)])" if isinstance(idx, str) else
                   "e.g. torch.tensor([ids]) for one text's list of ids, torch.as_tensor(array) for a (B, T) array")
            raise ValueError(f"{name} must be a tensor of token ids of shape (B, T); got a {type(idx).__name__}: {how}")
        if idx.dim() != 2 or idx.shape[1] == 0:
            hint = f": one text is {name}[None], a batch of 1" if idx.dim() == 1 and idx.numel() else ""
            raise ValueError(f"{name} must be token ids of shape (B, T) with T >= 1; got shape {tuple(idx.shape)}{hint}")
        if idx.dtype not in (torch.long, torch.int32):  # what the embedding reads
            raise ValueError(f"{name} must be token ids of dtype torch.long (or torch.int32); got {idx.dtype}: use {name}.long()")
        if idx.device.type == "cpu" and not torch.compiler.is_compiling():
            low, high = torch.aminmax(idx)
            if low < 0 or high >= self.config.vocab_size:
                bad = int(low) if low < 0 else int(high)
                raise ValueError(f"token id {bad} is not in this model's vocabulary: ids run from 0 to {self.config.vocab_size - 1}")

    def hidden_states(self, idx: torch.Tensor, caches: Caches | None = None) -> torch.Tensor:
        """The final norm's output for idx (B, T), what the LM head reads: (B, T, C)."""
        x = self.embed(idx, caches)  # (B, T, C)
        for layer, block in enumerate(self.blocks):
            x = block(x, caches.layers[layer] if caches is not None else None)  # (B, T, C)
        return self.ln_f(x)  # (B, T, C)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, caches: Caches | None = None,
        last_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx: (B, T) token ids; targets: (B, T) next-token ids or None; caches: what the
        tokens before idx left (generation, from new_caches()), or None; last_only: the logits
        of the last position alone, all that generation reads (the head's matmul is the
        largest at a big vocabulary: GPT-2's reads 50,257 x 768 weights per position).
        Returns logits (B, T, vocab_size) (last_only: (B, 1, vocab_size)) and the mean
        cross-entropy loss (or None)."""
        x = self.hidden_states(idx, caches)  # (B, T, C)
        if last_only:
            x = x[:, -1:]  # (B, 1, C)
        logits = self.lm_head(x)  # (B, T, vocab_size); (B, 1, vocab_size) with last_only
        if targets is None:
            return logits, None
        self.check_targets(targets, logits.shape[:2])
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten().long())  # (B*T, vocab_size) vs (B*T,)
        return logits, loss

    def check_targets(self, targets: torch.Tensor, shape: torch.Size) -> None:
        """ValueError, in one line, for targets that do not pair one id with each position of the
        logits, (B, T): another shape (flattened, cross_entropy would pair the wrong positions without
        a word), not integers, or an id outside the vocabulary other than -100, cross_entropy's mark for
        a position the loss leaves out. The ids are checked where check_token_ids checks them."""
        if not isinstance(targets, torch.Tensor):
            raise ValueError(f"targets must be a tensor of next-token ids of shape {tuple(shape)}, as idx; "
                             f"got a {type(targets).__name__}")
        if targets.shape != shape:
            raise ValueError(f"targets must have the logits' shape (B, T) = {tuple(shape)}, one next-token id for each "
                             f"position of idx; got shape {tuple(targets.shape)}")
        if targets.dtype not in (torch.long, torch.int32):
            raise ValueError(f"targets must be token ids of dtype torch.long (or torch.int32); got {targets.dtype}: "
                             "use targets.long()")
        if targets.device.type == "cpu" and not torch.compiler.is_compiling():
            counted = targets != -100  # (B, T)
            outside = counted & ((targets < 0) | (targets >= self.config.vocab_size))  # (B, T)
            if outside.any():
                raise ValueError(f"target id {int(targets[outside][0])} is not in this model's vocabulary: ids run from 0 "
                                 f"to {self.config.vocab_size - 1} (or -100, a position the loss leaves out)")
            if not counted.any():
                raise ValueError("every target is -100, a position the loss leaves out: no position is left to average "
                                 "a loss over")

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor) -> torch.Tensor:
        """The attention weights every head uses on idx (B, T), computed with the model's
        own parameters in eval mode: (n_layer, B, H, T, T). Functions attached by an enclosing
        hooks() block (knock-outs) act as in any forward."""
        with eval_mode(self):
            _, cache = self.run_with_cache(idx, names=is_pattern)
        return cache.stack_activation("pattern")  # (L, B, H, T, T)

    def knock_out(self, heads: Iterable[tuple[int, int]]) -> list[tuple[str, HookFn]]:
        """fwd_hooks that knock out each (layer, head) of heads: its output z is zeroed before
        its layer merges the heads, so the model runs as if the head were not there. Use them
        with hooks(), run_with_hooks() or run_with_cache(); every pair is checked here."""
        if isinstance(heads, str) or not isinstance(heads, Iterable):
            raise ValueError(f"heads are (layer, head) pairs of whole numbers, e.g. {{(0, 1)}}; got {heads!r}")
        pairs = list(heads)  # heads may be an iterator: read once
        self.check_heads(pairs)
        heads = {(int(layer), int(head)) for layer, head in pairs}  # a pair given twice is knocked out once
        by_layer: dict[int, list[int]] = {}
        for layer, head in sorted(heads):
            by_layer.setdefault(layer, []).append(head)
        return [(f"blocks.{layer}.attn.hook_z", zero_heads(knocked)) for layer, knocked in by_layer.items()]

    def check_heads(self, heads: Iterable[tuple[int, int]],
                    spelt: Callable[[int, int], str] = lambda layer, head: f"({layer}, {head})") -> None:
        """ValueError unless every element of heads is a (layer, head) pair of whole numbers (a
        tuple, or a list as JSON gives it) of this model. The message names the first that is not,
        spelt as its caller writes a pair (the tab: 2:0)."""
        n_layer, n_head = self.config.n_layer, self.config.n_head
        for pair in heads:
            if not (isinstance(pair, tuple | list) and len(pair) == 2 and all(map(is_whole_number, pair))):
                raise ValueError(f"heads are (layer, head) pairs of whole numbers, e.g. {{(0, 1)}}; got {pair!r}")
            layer, head = pair
            if layer not in range(n_layer) or head not in range(n_head):
                missing = f"no layer {layer} (in {spelt(layer, head)})" if layer not in range(n_layer) else f"no head {head} in layer {layer}"
                raise ValueError(f"{missing}: this model has layers 0 to {n_layer - 1} and heads 0 to {n_head - 1}")


def zero_heads(heads: list[int]) -> HookFn:
    """A hook_z function that hands on z (B, T, H, D) with the given heads' outputs zeroed."""

    def knock_out(z: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        keep = torch.ones(z.shape[2], dtype=z.dtype, device=z.device)  # (H,)
        keep[heads] = 0.0
        return z * keep.view(1, 1, -1, 1)  # (B, T, H, D) * (1, 1, H, 1)

    return knock_out
