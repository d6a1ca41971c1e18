"""Llama, Qwen3 and Mistral as transformers writes them (LlamaForCausalLM: Llama 2 and 3, SmolLM2, TinyLlama;
Qwen3ForCausalLM; MistralForCausalLM): config.json's settings and the tensors' names, both ways.
model_io/hf_models.py reads and writes the files. In this project's terms all three are rotary positions,
RMSNorm, a SwiGLU MLP, no biases and often fewer key/value heads than query heads; Qwen3 adds QK-norm and
may set its own head size; Mistral is Llama with a window every layer slides over (or none)."""

import math
from collections.abc import Callable
from typing import Any

import torch

from model.attention import ROPE_SCALING_KEYS, rope_scaling_problem
from model.gpt import GPTConfig
from user_error import UserError

Refuse = Callable[[str, Any, str], UserError]  # (key, its value, what is needed) -> one line naming config.json

# LlamaConfig's, Qwen3Config's and MistralConfig's defaults (transformers 5), for keys a config.json leaves out.
# The bias keys are the class's own: Mistral has none, and builds no biases whatever config.json says.
HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "hidden_act": "silu",
              "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
              "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0},
    "qwen3": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "hidden_act": "silu",
              "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
              "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False, "sliding_window": 4096,
              "max_window_layers": 28, "layer_types": None},
    "mistral": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "hidden_act": "silu",
                "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
                "attention_dropout": 0.0, "sliding_window": 4096},
}
ROPE_THETA = 10000.0  # transformers' default base

ALL = slice(None)  # every row of our parameter
BLOCK_NAMES = {  # a block's tensors but q, k and v: HF's name under model.layers.{i}. -> ours under blocks.{i}.
    "input_layernorm.weight": "ln_1.weight",
    "self_attn.o_proj.weight": "attn.proj.weight",
    "post_attention_layernorm.weight": "ln_2.weight",
    "mlp.gate_proj.weight": "mlp.fc.weight",
    "mlp.up_proj.weight": "mlp.up.weight",
    "mlp.down_proj.weight": "mlp.proj.weight",
}
QK_NORM_NAMES = {"self_attn.q_norm.weight": "attn.q_norm.weight", "self_attn.k_norm.weight": "attn.k_norm.weight"}
TRANSPOSED = ()  # nn.Linear on both sides
IGNORED = ("rotary_emb.inv_freq",)  # a buffer some older files hold: the angles are computed, not loaded


def gpt_config(hf: dict[str, Any], model_type: str, refuse: Refuse, dropout: float | None) -> tuple[GPTConfig, list[str]]:
    """The GPTConfig of a Llama, Qwen3 or Mistral config.json (block_size: max_position_embeddings), and notes for
    the log. dropout (None: the folder's attention_dropout) applies to attention and residual branches."""
    defaults = HF_DEFAULTS[model_type]
    hf = defaults | hf
    for key in ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size",
                "max_position_embeddings", "vocab_size"):
        if not is_count(hf[key]):
            raise refuse(key, hf[key], "it must be a whole number of at least 1")
    n_head, n_embd = hf["num_attention_heads"], hf["hidden_size"]
    n_kv_head = n_head if hf["num_key_value_heads"] is None else hf["num_key_value_heads"]  # null: one per query head
    if not is_count(n_kv_head) or n_head % n_kv_head:
        raise refuse("num_key_value_heads", n_kv_head, f"it must divide num_attention_heads={n_head}")
    if hf["head_dim"] is None and n_embd % n_head:
        raise refuse("num_attention_heads", n_head, f"it must divide hidden_size={n_embd}, or head_dim be set")
    head_dim = n_embd // n_head if hf["head_dim"] is None else hf["head_dim"]
    if not is_count(head_dim) or head_dim % 2:
        raise refuse("head_dim", head_dim, "rotary positions turn pairs of dims: it must be even")
    if not is_number(hf["rms_norm_eps"]) or not 0 < hf["rms_norm_eps"] < 1:
        raise refuse("rms_norm_eps", hf["rms_norm_eps"], "it must be a small positive number, e.g. 1e-05")
    if not isinstance(hf["tie_word_embeddings"], bool):
        raise refuse("tie_word_embeddings", hf["tie_word_embeddings"], "it must be true or false")
    if hf["hidden_act"] != "silu":
        raise refuse("hidden_act", hf["hidden_act"], "this project's SwiGLU MLP gates with SiLU (silu)")
    for key in ("attention_bias", "mlp_bias"):
        if key in defaults and hf.get(key):
            raise refuse(key, hf[key], "this project reads Llama and Qwen3 without biases")
    window = None  # Llama has none
    if model_type == "qwen3":
        window = qwen3_window(hf, refuse)
    elif model_type == "mistral":
        window = mistral_window(hf, refuse)
    rope_theta, rope_scaling = rope_settings(hf, refuse)
    config = GPTConfig(
        vocab_size=hf["vocab_size"], block_size=hf["max_position_embeddings"], n_layer=hf["num_hidden_layers"],
        n_head=n_head, n_embd=n_embd, dropout=hf["attention_dropout"] if dropout is None else dropout, bias=False,
        attention="sdpa", pos="rope", norm="rmsnorm", mlp="swiglu", tie_head=hf["tie_word_embeddings"],
        qk_norm=model_type == "qwen3", smear=False, n_kv_head=n_kv_head, head_dim=head_dim, window=window,
        mlp_hidden=hf["intermediate_size"], rope_theta=rope_theta, rope_scaling=rope_scaling,
        norm_eps=float(hf["rms_norm_eps"]),
    )
    return config, []


def is_count(value: Any) -> bool:
    """A whole number of at least 1, as JSON writes one (not true, which Python counts as 1)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def is_number(value: Any) -> bool:
    """A finite JSON number (not true or false)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def qwen3_window(hf: dict[str, Any], refuse: Refuse) -> int | None:
    """The window of a Qwen3 whose every layer slides, None when none does: a layer slides when its
    layer_types entry says so (by default, from max_window_layers on, when use_sliding_window is
    true), over sliding_window keys, as Qwen3Config and Qwen3's attention read them."""
    if not isinstance(hf["use_sliding_window"], bool):
        raise refuse("use_sliding_window", hf["use_sliding_window"], "it must be true or false")
    window = hf["sliding_window"] if hf["use_sliding_window"] else None  # Qwen3Config's rule
    kinds = hf["layer_types"]
    if kinds is None:
        if window is None:
            return None
        first = hf["max_window_layers"]
        if not isinstance(first, int) or isinstance(first, bool):  # below 0: every layer slides, as from 0
            raise refuse("max_window_layers", first, "it must be a whole number (the first layer that slides)")
        kinds = ["sliding_attention" if i >= first else "full_attention" for i in range(hf["num_hidden_layers"])]
    key = "layer_types" if hf["layer_types"] is not None else "max_window_layers"
    return one_window(hf, kinds, key, window, "give use_sliding_window=true and a sliding_window", refuse)


def mistral_window(hf: dict[str, Any], refuse: Refuse) -> int | None:
    """Mistral's window, over which every layer slides: sliding_window, or None (null) for full attention.
    A config.json that also lists layer_types is a Ministral to transformers, whose layers slide as
    that list says (null: as Mistral's do)."""
    window = hf["sliding_window"]
    if window is not None and not is_count(window):
        raise refuse("sliding_window", window, "it must be a whole number of at least 1, or null for no window")
    kinds = hf.get("layer_types")
    if kinds is None:
        return window
    return one_window(hf, kinds, "layer_types", window, "give a sliding_window", refuse)


def one_window(hf: dict[str, Any], kinds: Any, key: str, window: Any, set_window: str, refuse: Refuse) -> int | None:
    """The one window of every layer that kinds (each layer's "full_attention" or "sliding_attention")
    slides over, None when none does. A mix is refused (key names where it came from): this project's
    model has one window for every layer, or none."""
    n_layer = hf["num_hidden_layers"]
    if not isinstance(kinds, list) or len(kinds) != n_layer or not set(kinds) <= {"full_attention", "sliding_attention"}:
        raise refuse("layer_types", kinds, f'it must list "full_attention" or "sliding_attention" for each of the '
                                           f"{n_layer} layers")
    if set(kinds) == {"full_attention"}:
        return None
    if window is None:  # transformers cannot run it either
        raise refuse("layer_types", kinds, f"it names sliding layers, but no window is set: {set_window}")
    if not is_count(window):
        raise refuse("sliding_window", window, "it must be a whole number of at least 1")
    if set(kinds) == {"sliding_attention"}:
        return window
    raise refuse(key, hf[key], "some layers slide and some do not, which does not map to this project's model: it "
                               "has one window for every layer, or none")


def rope_settings(hf: dict[str, Any], refuse: Refuse) -> tuple[float, dict[str, float] | None]:
    """(rope_theta, our rope_scaling or None) from transformers 5's rope_parameters, or from the rope_theta
    and rope_scaling that earlier versions wrote; read as transformers 5 reads them: a rope_scaling that is
    set wins over rope_parameters, and a top-level original_max_position_embeddings over the one inside."""
    key = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
    rope = hf.get(key) or {}
    if not isinstance(rope, dict) or any(isinstance(value, dict) for value in rope.values()):
        raise refuse(key, rope, "this project reads one rotary setting for every layer")
    theta = rope.get("rope_theta", hf.get("rope_theta", ROPE_THETA))
    if not is_number(theta) or theta <= 0:
        raise refuse("rope_theta", theta, "the rotary base must be a positive number, e.g. 10000.0")
    field = "rope_type" if "rope_type" in rope else "type"  # early transformers 4 wrote only "type": named as the file has it
    rope_type = rope.get(field, "default")
    if rope_type not in ("default", "llama3"):
        raise refuse(f"{key}.{field}", rope_type, 'this project\'s rotary positions take no scaling ("default") '
                                                    'or Llama 3.1\'s ("llama3")')
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise refuse(f"{key}.partial_rotary_factor", rope["partial_rotary_factor"], "this project turns every dim of a head")
    if rope_type == "default":
        return float(theta), None
    scaling = {"original_max_position_embeddings": hf["max_position_embeddings"]} | rope  # transformers' default
    named = {name: f"{key}.{name}" for name in ROPE_SCALING_KEYS}  # where each value came from, for a refusal
    if "original_max_position_embeddings" in hf:  # where Phi-3 writes it: transformers prefers it to the dict's
        scaling["original_max_position_embeddings"] = hf["original_max_position_embeddings"]
        named["original_max_position_embeddings"] = "original_max_position_embeddings"
    missing = [name for name in ROPE_SCALING_KEYS if name not in scaling]
    if missing:
        raise refuse(key, rope, f"Llama 3.1's scaling needs {', '.join(missing)}")
    if problem := rope_scaling_problem(scaling):
        name, reason = problem
        raise refuse(named[name], scaling[name], reason)
    return float(theta), {name: scaling[name] for name in ROPE_SCALING_KEYS}


def hf_names(config: GPTConfig) -> dict[str, tuple[str, slice]]:
    """LlamaForCausalLM's tensor names (Qwen3's and Mistral's too) -> (ours, which of its rows). q_proj, k_proj
    and v_proj share our attn.qkv: its rows [q (H*D) | k (K*D) | v (K*D)]."""
    H, K, D = config.n_head, config.kv_heads, config.head_size
    qkv_rows = {"q_proj": slice(0, H * D), "k_proj": slice(H * D, (H + K) * D), "v_proj": slice((H + K) * D, (H + 2 * K) * D)}
    block_names = BLOCK_NAMES | (QK_NORM_NAMES if config.qk_norm else {})
    names = {"model.embed_tokens.weight": ("tok_emb.weight", ALL)}
    for i in range(config.n_layer):
        names |= {f"model.layers.{i}.self_attn.{hf}.weight": (f"blocks.{i}.attn.qkv.weight", rows)
                  for hf, rows in qkv_rows.items()}
        names |= {f"model.layers.{i}.{hf}": (f"blocks.{i}.{ours}", ALL) for hf, ours in block_names.items()}
    names["model.norm.weight"] = ("ln_f.weight", ALL)
    if not config.tie_head:
        names["lm_head.weight"] = ("lm_head.weight", ALL)  # tied, HF leaves it out of the file
    return names


def full_name(name: str) -> str:
    """A file's tensor name as LlamaForCausalLM's: a file of the bare LlamaModel lacks "model."."""
    return name if name.startswith(("model.", "lm_head.")) else f"model.{name}"


def export_blockers(config: GPTConfig, model_type: str) -> list[str]:
    """One phrase per option of config that LlamaForCausalLM (model_type llama), Qwen3ForCausalLM (qwen3) or
    MistralForCausalLM (mistral) cannot represent as written here; empty if it maps."""
    name, qwen3 = {"llama": "Llama", "qwen3": "Qwen3", "mistral": "Mistral"}[model_type], model_type == "qwen3"
    blockers = []
    if config.pos != "rope":
        blockers.append(f"model.pos={config.pos} ({name} turns queries and keys by rotary positions; it learns no position table)")
    if config.norm != "rmsnorm":
        blockers.append(f"model.norm={config.norm} ({name} uses RMSNorm)")
    if config.mlp != "swiglu":
        blockers.append(f"model.mlp={config.mlp} ({name}'s MLP is SwiGLU)")
    if config.qk_norm and not qwen3:
        blockers.append(f"model.qk_norm=true ({name} does not normalise queries and keys; Qwen3 does)")
    if qwen3 and not config.qk_norm:
        blockers.append("model.qk_norm=false (Qwen3 normalises queries and keys; Llama and Mistral do not)")
    if config.smear:
        blockers.append(f"model.smear=true ({name} has no smear)")
    if config.bias:
        blockers.append(f"model.bias=true ({name} is written here without biases)")
    if config.window is not None and model_type == "llama":
        blockers.append(f"model.window={config.window} (Llama has no sliding window; Mistral has one, and Qwen3 "
                        f"with model.qk_norm=true)")
    if model_type == "llama" and config.head_dim is not None and config.n_embd % config.n_head:
        blockers.append(f"model.head_dim={config.head_dim} with n_embd={config.n_embd} not a multiple of "
                        f"n_head={config.n_head} (LlamaConfig needs one)")
    return blockers


def hf_config(config: GPTConfig, model_type: str) -> dict[str, Any]:
    """config.json's Llama, Qwen3 or Mistral settings for config (hf_models.py adds the ids and the architecture)."""
    # norm_eps None is RMSNorm's "the dtype's eps": for the float32 weights written, float32's.
    eps = torch.finfo(torch.float32).eps if config.norm_eps is None else config.norm_eps
    theta = float(config.rope_theta)
    scaling = {"rope_type": "llama3", "rope_theta": theta, **config.rope_scaling} if config.rope_scaling else None
    settings = {
        "vocab_size": config.vocab_size, "hidden_size": config.n_embd, "intermediate_size": config.hidden_size,
        "num_hidden_layers": config.n_layer, "num_attention_heads": config.n_head,
        "num_key_value_heads": config.kv_heads, "head_dim": config.head_size, "hidden_act": "silu",
        "max_position_embeddings": config.block_size, "rms_norm_eps": eps,
        "tie_word_embeddings": config.tie_head, "attention_dropout": config.dropout,
        # transformers 5 reads rope_parameters; earlier versions (and other readers) rope_theta and rope_scaling.
        "rope_parameters": scaling or {"rope_type": "default", "rope_theta": theta},
        "rope_theta": theta, "rope_scaling": scaling,
    }
    if model_type == "qwen3":  # a window: every layer slides over it
        sliding = config.window is not None
        settings |= {"attention_bias": False, "use_sliding_window": sliding, "sliding_window": config.window,
                     "max_window_layers": 0,
                     "layer_types": [("sliding_attention" if sliding else "full_attention")] * config.n_layer}
    elif model_type == "mistral":  # no bias keys: MistralConfig has none
        settings["sliding_window"] = config.window  # null: full attention
    else:
        settings |= {"attention_bias": False, "mlp_bias": False}
    return settings
