"""Generate text from a trained checkpoint. Needs no corpus: the checkpoint holds the
model's config, its weights and its tokenizer.

    python sample.py run=outputs/2026-11-22/10-00-00 prompt="Once upon a time"
    python sample.py run=latest max_new_tokens=200 temperature=0.8 top_k=50 num_samples=3 seed=1

Every option is in configs/sample.yaml. Nothing is written anywhere.
"""

import hydra
from omegaconf import DictConfig

from model.generation import generate_text
from training.checkpoint import load_checkpoint, model_from_checkpoint, resolve_checkpoint
from training.config import check_types
from training.distributed import pick_device
from training.errors import UserError, exit_on_user_error, run_cli


@hydra.main(config_path="configs", config_name="sample", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with exit_on_user_error():
        sample(cfg)


SAMPLE_KEY_TYPES = {int: ("max_new_tokens", "num_samples", "seed"), float: ("temperature",), bool: ("use_kv_cache",)}


def sample(cfg: DictConfig) -> None:
    check_types(cfg, SAMPLE_KEY_TYPES)
    for key in ("top_k", "top_p"):  # these two may also be null (off)
        if cfg[key] is not None:
            check_types(cfg, {int if key == "top_k" else float: (key,)})
    if cfg.max_new_tokens < 0:
        raise UserError(f"max_new_tokens={cfg.max_new_tokens} must be 0 or more")
    if cfg.temperature < 0:
        raise UserError(f"temperature={cfg.temperature} must be 0 (greedy) or more")
    if cfg.num_samples < 1:
        raise UserError(f"num_samples={cfg.num_samples} must be at least 1")
    device = pick_device(cfg.device, key="device")
    path = resolve_checkpoint(str(cfg.run))
    model, tokenizer = model_from_checkpoint(load_checkpoint(path))
    model.to(device)
    if cfg.top_k and not 0 < cfg.top_k <= tokenizer.vocab_size:
        raise UserError(f"top_k={cfg.top_k} must be between 1 and the vocabulary size {tokenizer.vocab_size} (or 0: off)")
    if cfg.top_p is not None and not 0 < cfg.top_p <= 1:
        raise UserError(f"top_p={cfg.top_p} must be in (0, 1]; 1.0 turns it off")

    try:
        texts = generate_text(
            model, tokenizer, cfg.prompt, cfg.max_new_tokens,
            temperature=cfg.temperature, top_k=cfg.top_k or None, top_p=cfg.top_p,
            num_samples=cfg.num_samples, seed=cfg.seed, use_kv_cache=cfg.use_kv_cache,
        )
    except FloatingPointError as error:
        raise UserError(f"{path}: {error}; sample from a checkpoint saved before that") from None
    for i, text in enumerate(texts):
        if cfg.num_samples > 1:
            print(f"--- sample {i + 1} of {cfg.num_samples} ---")
        print(text)


if __name__ == "__main__":
    run_cli(main)
