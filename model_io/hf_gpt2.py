"""GPT-2 as transformers' GPT2LMHeadModel writes it: config.json's settings and the tensors' names, both
ways. model_io/hf_models.py reads and writes the files, for every architecture."""

import json
from collections.abc import Callable
from typing import Any

from model.gpt import GPTConfig
from user_error import UserError

Refuse = Callable[[str, Any, str], UserError]  # (key, its value, what is needed) -> one line naming config.json

# GPT2Config's defaults, for keys a config.json leaves out.
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
    "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.1, "embd_pdrop": 0.1,
    "attn_pdrop": 0.1, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False, "add_cross_attention": False, "tie_word_embeddings": True,
}
LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which model/gpt.py uses
# HF's names for GELU: "gelu_new" and "gelu_pytorch_tanh" are the tanh approximation GPT-2 was trained with.
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu2": "relu2"}
EXPORTED_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu2": "relu2"}

ALL = slice(None)  # every row of our parameter
BLOCK_NAMES = {  # a block's tensors: HF's name under transformer.h.{i}. -> ours under blocks.{i}.
    "ln_1.weight": "ln_1.weight", "ln_1.bias": "ln_1.bias",
    "attn.c_attn.weight": "attn.qkv.weight", "attn.c_attn.bias": "attn.qkv.bias",
    "attn.c_proj.weight": "attn.proj.weight", "attn.c_proj.bias": "attn.proj.bias",
    "ln_2.weight": "ln_2.weight", "ln_2.bias": "ln_2.bias",
    "mlp.c_fc.weight": "mlp.fc.weight", "mlp.c_fc.bias": "mlp.fc.bias",
    "mlp.c_proj.weight": "mlp.proj.weight", "mlp.c_proj.bias": "mlp.proj.bias",
}
# HF's Conv1D keeps its weight as (in, out), nn.Linear as (out, in): these cross transposed.
TRANSPOSED = ("c_attn.weight", "c_proj.weight", "c_fc.weight")
# Causal-mask buffers that transformers before 4.3x saved into the file (the gpt2 repo's has them).
IGNORED = ("attn.bias", "attn.masked_bias")


def gpt_config(hf: dict[str, Any], model_type: str, refuse: Refuse, dropout: float | None) -> tuple[GPTConfig, list[str]]:
    """The GPTConfig of a GPT-2 config.json (block_size: all its positions), and notes for the log.
    dropout (None: the folder's resid_pdrop) applies to attention, residual branches and embeddings alike."""
    hf = HF_DEFAULTS | hf
    for key in ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size"):
        if not (isinstance(hf[key], int) and hf[key] >= 1):
            raise refuse(key, hf[key], "GPT-2 needs a whole number of at least 1 here")
    n_embd = hf["n_embd"]
    if n_embd % hf["n_head"]:
        raise refuse("n_head", hf["n_head"], f"it must divide n_embd={n_embd}")
    if hf["activation_function"] not in ACTIVATIONS:
        raise refuse("activation_function", hf["activation_function"], f"this project's MLP has {', '.join(ACTIVATIONS)}")
    if hf["layer_norm_epsilon"] != LAYER_NORM_EPS:
        raise refuse("layer_norm_epsilon", hf["layer_norm_epsilon"], f"this project's LayerNorm uses {LAYER_NORM_EPS} (GPT-2's)")
    if hf["n_inner"] not in (None, 4 * n_embd):
        raise refuse("n_inner", hf["n_inner"], f"this project's MLP is 4 * n_embd = {4 * n_embd} wide (null in GPT-2's config)")
    for key, gpt2_value in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                            ("reorder_and_upcast_attn", False), ("add_cross_attention", False)):
        if hf[key] is not gpt2_value:
            raise refuse(key, hf[key], f"this project's attention is GPT-2's, which has {key}={json.dumps(gpt2_value)}")
    if not isinstance(hf["tie_word_embeddings"], bool):
        raise refuse("tie_word_embeddings", hf["tie_word_embeddings"], "it must be true or false")
    notes = []
    if dropout is None:
        dropout = hf["resid_pdrop"]
        if hf["attn_pdrop"] != dropout or hf["embd_pdrop"] != dropout:
            notes.append(f"model.dropout={dropout} (the folder's resid_pdrop) applies to attention and embeddings too")
    config = GPTConfig(
        vocab_size=hf["vocab_size"], block_size=hf["n_positions"], n_layer=hf["n_layer"], n_head=hf["n_head"],
        n_embd=n_embd, dropout=dropout, bias=True, attention="sdpa", pos="learned", norm="layernorm",
        mlp=ACTIVATIONS[hf["activation_function"]], tie_head=hf["tie_word_embeddings"], qk_norm=False,
        smear=False,
    )
    return config, notes


def hf_names(config: GPTConfig) -> dict[str, tuple[str, slice]]:
    """GPT2LMHeadModel's tensor names -> (ours, all its rows), biases included (a bias=False GPT has none of its own)."""
    names = {"transformer.wte.weight": "tok_emb.weight", "transformer.wpe.weight": "pos_emb.weight"}
    for i in range(config.n_layer):
        names |= {f"transformer.h.{i}.{hf}": f"blocks.{i}.{ours}" for hf, ours in BLOCK_NAMES.items()}
    names |= {"transformer.ln_f.weight": "ln_f.weight", "transformer.ln_f.bias": "ln_f.bias"}
    if not config.tie_head:
        names["lm_head.weight"] = "lm_head.weight"  # tied, HF leaves it out of the file
    return {hf: (ours, ALL) for hf, ours in names.items()}


def full_name(name: str) -> str:
    """A file's tensor name as GPT2LMHeadModel's: the gpt2 repo's file holds GPT2Model's, without "transformer."."""
    return name if name.startswith(("transformer.", "lm_head.")) else f"transformer.{name}"


def export_blockers(config: GPTConfig, model_type: str) -> list[str]:
    """One phrase per option of config that GPT2LMHeadModel cannot represent; empty if it maps."""
    blockers = []
    if config.pos != "learned":
        blockers.append(f"model.pos={config.pos} (GPT-2 learns position embeddings)")
    if config.norm != "layernorm":
        blockers.append(f"model.norm={config.norm} (GPT-2 uses LayerNorm)")
    if config.norm_eps not in (None, LAYER_NORM_EPS):
        blockers.append(f"model.norm_eps={config.norm_eps} (GPT-2's LayerNorm uses {LAYER_NORM_EPS})")
    if config.mlp not in EXPORTED_ACTIVATIONS:
        blockers.append(f"model.mlp={config.mlp} (GPT-2's MLP has no gate)")
    elif config.hidden_size != 4 * config.n_embd:
        blockers.append(f"model.mlp_hidden={config.mlp_hidden} (GPT-2's MLP is 4 * n_embd wide)")
    if config.qk_norm:
        blockers.append("model.qk_norm=true (GPT-2 does not normalise queries and keys)")
    if config.smear:
        blockers.append("model.smear=true (GPT-2 has no smear)")
    if config.kv_heads != config.n_head:
        blockers.append(f"model.n_kv_head={config.n_kv_head} (GPT-2 gives every head its own keys and values)")
    if config.head_dim is not None and config.head_dim * config.n_head != config.n_embd:
        blockers.append(f"model.head_dim={config.head_dim} (GPT-2's heads are n_embd // n_head wide)")
    if config.window is not None:
        blockers.append(f"model.window={config.window} (GPT-2's queries see every earlier token)")
    return blockers


def hf_config(config: GPTConfig, model_type: str) -> dict[str, Any]:
    """config.json's GPT-2 settings for config (hf_models.py adds the ids and the architecture)."""
    return {
        "vocab_size": config.vocab_size, "n_positions": config.block_size, "n_embd": config.n_embd,
        "n_layer": config.n_layer, "n_head": config.n_head, "n_inner": None,
        "activation_function": EXPORTED_ACTIVATIONS[config.mlp], "layer_norm_epsilon": LAYER_NORM_EPS,
        "resid_pdrop": config.dropout, "embd_pdrop": config.dropout, "attn_pdrop": config.dropout,
        "scale_attn_weights": True, "tie_word_embeddings": config.tie_head,
    }

