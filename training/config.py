"""From config to objects: the range of every value (types and choices are checked earlier,
by Hydra, against training/schema.py), a resumed run's config, the model, the seeds."""

import random
from collections.abc import Mapping
from dataclasses import fields
from enum import Enum
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError

from model import GPT, GPTConfig
from model.attention import divisors
from training.errors import refused_value_line
from training.schema import typed_train_config
from user_error import UserError

MODEL_KEYS = tuple(f.name for f in fields(GPTConfig) if f.name != "vocab_size")


def validate_train_config(cfg: Any) -> None:
    """UserError for the first value out of its range, naming it and a fix."""
    model, optim, train = cfg.model, cfg.optim, cfg.train
    for key in ("n_layer", "n_head", "n_embd", "block_size"):
        require(model[key] >= 1, f"model.{key}={model[key]} must be at least 1")
    require(
        model.n_embd % model.n_head == 0,
        f"model.n_embd={model.n_embd} is not divisible by model.n_head={model.n_head}; "
        f"pick model.n_head from {divisors(model.n_embd)}",
    )
    require(0 <= model.dropout < 1, f"model.dropout={model.dropout} must be in [0, 1), e.g. 0.1")
    require(model.pos != "rope" or (model.n_embd // model.n_head) % 2 == 0,
            f"model.pos=rope needs an even head size; n_embd // n_head is {model.n_embd // model.n_head}")
    require(optim.lr > 0, f"optim.lr={optim.lr} must be greater than 0, e.g. optim.lr=1e-3")
    require(0 < optim.decay_fraction <= 1, f"optim.decay_fraction={optim.decay_fraction} must be in (0, 1], e.g. 0.2")
    require(0 <= optim.min_lr <= optim.lr, f"optim.min_lr={optim.min_lr} must be between 0 and optim.lr={optim.lr}")
    require(optim.weight_decay >= 0, f"optim.weight_decay={optim.weight_decay} must be 0 or more")
    require(optim.warmup_steps >= 0, f"optim.warmup_steps={optim.warmup_steps} must be 0 or more")
    require(optim.grad_clip >= 0, f"optim.grad_clip={optim.grad_clip} must be 0 (off) or more")
    require(0 <= optim.muon_momentum < 1, f"optim.muon_momentum={optim.muon_momentum} must be in [0, 1), e.g. optim.muon_momentum=0.95")
    betas = list(optim.betas)
    require(len(betas) == 2 and all(isinstance(b, int | float) and 0 <= b < 1 for b in betas),
            f"optim.betas={betas} must be two numbers in [0, 1), e.g. optim.betas=[0.9,0.99]")
    for key in ("max_steps", "batch_size", "grad_accum_steps", "eval_interval", "eval_iters", "log_interval", "probe_tokens"):
        require(train[key] >= 1, f"train.{key}={train[key]} must be at least 1")
    require(train.save_interval >= 0, f"train.save_interval={train.save_interval} must be 0 (only at evaluations) or more")
    for key in ("attn_log_interval", "sample_interval", "sample_tokens"):
        require(train[key] >= 0, f"train.{key}={train[key]} must be 0 (off) or more")
    require(train.sample_temperature >= 0, f"train.sample_temperature={train.sample_temperature} must be 0 (greedy) or more")
    require(0 < cfg.data.val_fraction < 1, f"data.val_fraction={cfg.data.val_fraction} must be between 0 and 1, e.g. 0.1")
    if cfg.tokenizer.kind == "bpe":
        require(
            256 <= cfg.tokenizer.vocab_size <= 2**20,
            f"tokenizer.vocab_size={cfg.tokenizer.vocab_size} must be a whole number from 256 (the single bytes) to 1048576, "
            "e.g. tokenizer.vocab_size=2048",
        )
    if cfg.data.source == "stories":
        require(cfg.data.n_chars >= 10_000,
                f"data.n_chars={cfg.data.n_chars} must be a whole number of at least 10000 (the default is 1000000)")


def validate_sample_config(cfg: Any, vocab_size: int) -> None:
    """sample.py's counterpart of validate_train_config; top_k's range is the checkpoint's vocabulary."""
    require(cfg.max_new_tokens >= 0, f"max_new_tokens={cfg.max_new_tokens} must be 0 or more")
    require(cfg.temperature >= 0, f"temperature={cfg.temperature} must be 0 (greedy) or more")
    require(cfg.num_samples >= 1, f"num_samples={cfg.num_samples} must be at least 1")
    require(not cfg.top_k or 0 < cfg.top_k <= vocab_size,
            f"top_k={cfg.top_k} must be between 1 and the vocabulary size {vocab_size} (or 0: off)")
    require(cfg.top_p is None or 0 < cfg.top_p <= 1, f"top_p={cfg.top_p} must be in (0, 1]; 1.0 turns it off")
    require(cfg.use_kv_cache or not cfg.compile,
            "compile=true compiles the cached one-token step: drop use_kv_cache=false, or compile=true")


def plain_config(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain dicts, lists, strings and numbers (a choice as its word), resolved:
    what a checkpoint, whose loading admits nothing else, and TensorBoard keep."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


# What a resumed run may not change: the network, its tokens, the text it learns from, and
# which optimizer holds its state.
FIXED_ON_RESUME = ("model", "tokenizer", "data", "optim.name")


def resumed_config(cfg: Any, saved: dict[str, Any], overrides: list[str]) -> tuple[Any, list[str]]:
    """The saved run's config, with the command line's overrides that differ from it applied.
    Returns (config, ["train.max_steps 1500 -> 3000", ...]); UserError for an override
    that would change the model, tokenizer or data."""
    resumed = checked_saved_config(saved, cfg.resume)
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
    return resumed, changes


# Keys added after runs were saved without them, with the value that does what the versions
# before them did, so that such a run resumes unchanged.
ADDED_KEYS = {"model.smear": False, "train.eval_train": True, "optim.ns_dtype": "bfloat16",
              "optim.muon_momentum": 0.95, "train.save_interval": 0, "data.names": "common"}


def checked_saved_config(saved: dict[str, Any], resume: str) -> DictConfig:
    """The checkpoint's config, typed and checked against training/schema.py as a new run's is."""
    fix = "start a new run, or sample from it"
    try:
        resumed = typed_train_config({"debug": None, **saved, "resume": resume})  # how to run, not what was run
    except OmegaConfBaseException as err:  # a key or value this version does not know
        detail = isinstance(err, ValidationError) and refused_value_line(err) or str(err).splitlines()[0]
        raise UserError(f"resume={resume}: this checkpoint's config does not fit this version of train.py ({detail}); {fix}") from None
    except KeyError as err:  # a data.source or tokenizer.kind this version has no schema for
        raise UserError(f"resume={resume}: this checkpoint's config names {err}, which this version of train.py does not know; {fix}") from None
    for key in ADDED_KEYS.keys() & OmegaConf.missing_keys(resumed):
        OmegaConf.update(resumed, key, ADDED_KEYS[key])
    missing = sorted(OmegaConf.missing_keys(resumed))
    require(not missing, f"resume={resume}: this checkpoint's config has no {', '.join(missing)} (it was saved by an older version); {fix}")
    return resumed


def plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    return plain_config(value) if OmegaConf.is_config(value) else value


def require(ok: bool, message: str) -> None:
    if not ok:
        raise UserError(message)


def build_model(model_cfg: Mapping[str, Any], vocab_size: int) -> GPT:
    # A key missing from an older checkpoint's config keeps GPTConfig's default.
    return GPT(GPTConfig(vocab_size=vocab_size, **{key: plain(model_cfg[key]) for key in MODEL_KEYS if key in model_cfg}))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds CUDA too
