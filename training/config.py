"""From config to objects, with every value checked first.

    validate_train_config(cfg)     raises UserError naming the first bad value and a fix
    resumed_config(cfg, saved, overrides)  a checkpoint's config with the allowed new overrides
    build_model(model_cfg, vocab)  the one place a GPT is built from config (train and sample)
    seed_everything(seed)          python, numpy and torch
"""

import random
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from model import GPT, GPTConfig
from model.attention import ATTENTION_PATHS, divisors
from model.gpt import MLPS, NORMS, POSITIONS
from training.errors import UserError
from training.lr_schedule import SCHEDULES
from training.optimizer import OPTIMIZERS
from training.precision import DTYPES

MODEL_KEYS = tuple(f.name for f in fields(GPTConfig) if f.name != "vocab_size")


# The type every numeric or boolean key must have; the range checks below assume it.
TRAIN_KEY_TYPES = {
    int: (
        "model.n_layer", "model.n_head", "model.n_embd", "model.block_size", "optim.warmup_steps",
        "train.max_steps", "train.batch_size", "train.grad_accum_steps", "train.eval_interval", "train.eval_iters", "train.log_interval",
        "train.attn_log_interval", "train.sample_interval", "train.sample_tokens", "train.probe_tokens", "train.seed",
    ),
    float: (
        "model.dropout", "optim.lr", "optim.min_lr", "optim.weight_decay", "optim.grad_clip",
        "train.sample_temperature", "data.val_fraction", "optim.decay_fraction",
    ),
    bool: ("model.bias", "model.tie_head", "model.qk_norm", "train.skip_nonfinite", "train.eval_at_start", "train.compile"),
}
TYPE_NAMES = {int: "a whole number", float: "a number", bool: "true or false"}


def check_types(cfg: Any, key_types: dict[type, tuple[str, ...]]) -> None:
    """UserError for the first key whose value is not of its type (e.g. train.max_steps=abc)."""
    for kind, keys in key_types.items():
        for key in keys:
            value = OmegaConf.select(cfg, key)
            if kind is bool:
                ok = isinstance(value, bool)
            else:  # bool is an int in Python, but true is no step count; an int is a fine float
                ok = isinstance(value, int if kind is int else (int, float)) and not isinstance(value, bool)
            require(ok, f"{key}={value} must be {TYPE_NAMES[kind]}")


def validate_train_config(cfg: Any) -> None:
    check_types(cfg, TRAIN_KEY_TYPES)
    model, optim, train = cfg.model, cfg.optim, cfg.train
    for key in ("n_layer", "n_head", "n_embd", "block_size"):
        require(model[key] >= 1, f"model.{key}={model[key]} must be at least 1")
    require(
        model.n_embd % model.n_head == 0,
        f"model.n_embd={model.n_embd} is not divisible by model.n_head={model.n_head}; "
        f"pick model.n_head from {divisors(model.n_embd)}",
    )
    require(0 <= model.dropout < 1, f"model.dropout={model.dropout} must be in [0, 1), e.g. 0.1")
    require(model.attention in ATTENTION_PATHS, f"model.attention={model.attention} must be one of {', '.join(ATTENTION_PATHS)}")
    for key, choices in (("pos", POSITIONS), ("norm", NORMS), ("mlp", MLPS)):
        require(model[key] in choices, f"model.{key}={model[key]} must be one of {', '.join(choices)}")
    require(model.pos != "rope" or (model.n_embd // model.n_head) % 2 == 0,
            f"model.pos=rope needs an even head size; n_embd // n_head is {model.n_embd // model.n_head}")
    require(optim.lr > 0, f"optim.lr={optim.lr} must be greater than 0, e.g. optim.lr=1e-3")
    require(optim.name in OPTIMIZERS, f"optim.name={optim.name} must be one of {', '.join(OPTIMIZERS)}")
    require(optim.schedule in SCHEDULES, f"optim.schedule={optim.schedule} must be one of {', '.join(SCHEDULES)}")
    require(0 < optim.decay_fraction <= 1, f"optim.decay_fraction={optim.decay_fraction} must be in (0, 1], e.g. 0.2")
    require(0 <= optim.min_lr <= optim.lr, f"optim.min_lr={optim.min_lr} must be between 0 and optim.lr={optim.lr}")
    require(optim.weight_decay >= 0, f"optim.weight_decay={optim.weight_decay} must be 0 or more")
    require(optim.warmup_steps >= 0, f"optim.warmup_steps={optim.warmup_steps} must be 0 or more")
    require(optim.grad_clip >= 0, f"optim.grad_clip={optim.grad_clip} must be 0 (off) or more")
    betas = OmegaConf.to_container(optim.betas) if OmegaConf.is_list(optim.betas) else optim.betas
    require(
        isinstance(betas, list) and len(betas) == 2 and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas),
        f"optim.betas={betas} must be two numbers in [0, 1), e.g. optim.betas=[0.9,0.99]",
    )
    require(cfg.debug in (None, "shapes"), f"debug={cfg.debug} is not a debug mode; the one there is: debug=shapes")
    require(train.dtype in DTYPES, f"train.dtype={train.dtype} must be one of {', '.join(DTYPES)}")
    for key in ("max_steps", "batch_size", "grad_accum_steps", "eval_interval", "eval_iters", "log_interval", "probe_tokens"):
        require(train[key] >= 1, f"train.{key}={train[key]} must be at least 1")
    for key in ("attn_log_interval", "sample_interval", "sample_tokens"):
        require(train[key] >= 0, f"train.{key}={train[key]} must be 0 (off) or more")
    require(train.sample_temperature >= 0, f"train.sample_temperature={train.sample_temperature} must be 0 (greedy) or more")
    require(0 < cfg.data.val_fraction < 1, f"data.val_fraction={cfg.data.val_fraction} must be between 0 and 1, e.g. 0.1")
    if cfg.tokenizer.kind == "bpe":
        vocab_size = cfg.tokenizer.vocab_size
        require(
            isinstance(vocab_size, int) and not isinstance(vocab_size, bool) and 256 <= vocab_size <= 2**20,
            f"tokenizer.vocab_size={vocab_size} must be a whole number from 256 (the single bytes) to 1048576, "
            "e.g. tokenizer.vocab_size=2048",
        )
    if cfg.data.source == "stories":
        n_chars = cfg.data.n_chars
        require(
            isinstance(n_chars, int) and not isinstance(n_chars, bool) and n_chars >= 10_000,
            f"data.n_chars={n_chars} must be a whole number of at least 10000 (the default is 1000000)",
        )


# What a resumed run may not change: the network, its tokens, the text it learns from, and
# which optimizer holds its state.
FIXED_ON_RESUME = ("model", "tokenizer", "data", "optim.name")


def resumed_config(cfg: Any, saved: dict[str, Any], overrides: list[str]) -> tuple[Any, list[str]]:
    """The saved run's config, with the command line's overrides that differ from it applied.
    Returns (config, ["train.max_steps 1500 -> 3000", ...]); UserError for an override
    that would change the model, tokenizer or data."""
    resumed = OmegaConf.create(saved)
    changes = []
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key == "resume" or key.startswith("hydra"):
            continue
        new, old = plain(OmegaConf.select(cfg, key)), plain(OmegaConf.select(resumed, key))
        if new == old:
            continue
        fixed = next((f for f in FIXED_ON_RESUME if key == f or key.startswith(f + ".") or f.startswith(key + ".")), None)
        require(
            fixed is None,
            f"resume: {override} would change the {fixed} this run was trained with "
            f"({old if '.' in key else 'a different ' + key}); start a new run for that instead",
        )
        OmegaConf.update(resumed, key, new, merge=False, force_add=True)
        changes.append(f"{key} {old} -> {new}")
    resumed.resume = cfg.resume
    return resumed, changes


def plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def require(ok: bool, message: str) -> None:
    if not ok:
        raise UserError(message)


def build_model(model_cfg: Mapping[str, Any], vocab_size: int) -> GPT:
    # A key missing from an older checkpoint's config keeps GPTConfig's default.
    return GPT(GPTConfig(vocab_size=vocab_size, **{key: model_cfg[key] for key in MODEL_KEYS if key in model_cfg}))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds CUDA too
