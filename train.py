"""Train a small GPT: config -> data -> model -> loop, logging to TensorBoard as it learns.

    python train.py                                   the defaults in configs/
    python train.py model.n_head=8 optim.lr=3e-3      any config value
    python train.py data=text data.path=book.txt      your own text
    python train.py -m model.n_head=1,2,4             a sweep: one run dir per value

The run dir (outputs/<date>/<time>, or multirun/<date>/<time>/<n> in a sweep) receives
.hydra/ (the resolved config), train.log, TensorBoard event files, ckpt_last.pt and
ckpt_best.pt. Watch it with `tensorboard --logdir outputs`; sample from it with
`python sample.py run=<run dir>`.
"""

import logging
import math
import os
import time
from pathlib import Path

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from data.dataset import TokenData, check_splits_fit, get_batch, prepare_tokens, probe_ids
from model import GPT
from training.checkpoint import BEST, LAST, save_checkpoint
from training.config import build_model, pick_device, seed_everything, validate_train_config
from training.errors import exit_on_user_error
from training.generation import generate_text
from training.lr_schedule import lr_at
from training.optimizer import build_optimizer
from training.progress import ProgressBar
from training.tensorboard_log import RunLogger

log = logging.getLogger("train")


@hydra.main(config_path="configs", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    with exit_on_user_error():
        return train(cfg)


def train(cfg: DictConfig) -> float:
    """One training run; returns the best val loss (what a sweeper would minimise)."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    shown_dir = os.path.relpath(run_dir)  # as the user would type it
    validate_train_config(cfg)
    device = pick_device(cfg.train.device)
    seed_everything(cfg.train.seed)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls: much faster, ample precision here

    # Data: the corpus as token ids, split into train and val, and the tokenizer that made them.
    data = prepare_tokens(cfg.data, cfg.tokenizer)
    block_size, batch_size = cfg.model.block_size, cfg.train.batch_size
    check_splits_fit(data, block_size)

    # Model and optimizer.
    model = build_model(cfg.model, data.tokenizer.vocab_size).to(device)
    optimizer = build_optimizer(model, cfg.optim, device)
    log.info(
        f"model: {model.num_parameters() / 1e6:.2f}M parameters, {cfg.model.n_layer} layers x "
        f"{cfg.model.n_head} heads x {cfg.model.n_embd // cfg.model.n_head} dims, context {block_size}"
    )
    log.info(
        f"data: {cfg.data.source}, {len(data.train):,} train and {len(data.val):,} val tokens, "
        f"vocab {data.tokenizer.vocab_size} ({data.tokenizer.kind}) | device: {device}"
    )
    log.info(f"run dir: {shown_dir}")

    # What gets watched: TensorBoard, and a fixed probe text from val for the attention maps.
    tb = RunLogger(run_dir)
    tb.text("config", OmegaConf.to_yaml(cfg), 0)
    probe = probe_ids(data.val, data.tokenizer, min(cfg.train.probe_tokens, block_size))
    probe_batch = torch.tensor([probe], device=device)  # (1, T_probe)
    probe_labels = data.tokenizer.token_strings(probe)
    tb.probe_tokens(probe_labels)
    config_dict = OmegaConf.to_container(cfg, resolve=True)

    batch_rng = np.random.default_rng(cfg.train.seed)  # draws every training batch
    best_val_loss = math.inf
    max_steps = cfg.train.max_steps
    tokens_per_step = batch_size * block_size
    window_loss, window_steps, window_time = 0.0, 0, 0.0
    bar = ProgressBar(total=max_steps)
    step = 0
    while True:
        last_step = step == max_steps

        # Evaluate, and keep the last and the best model.
        if step % cfg.train.eval_interval == 0 or last_step:
            losses = evaluate(model, data, batch_size, block_size, cfg.train.eval_iters, device, cfg.train.seed)
            tb.scalars(step, {"loss/train": losses["train"], "loss/val": losses["val"]})
            log.info(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
            if step > 0:
                state = dict(model=model, optimizer=optimizer, step=step, config=config_dict, tokenizer=data.tokenizer)
                if losses["val"] < best_val_loss:
                    best_val_loss = losses["val"]
                    save_checkpoint(run_dir / BEST, best_val_loss=best_val_loss, **state)
                save_checkpoint(run_dir / LAST, best_val_loss=best_val_loss, **state)

        # Attention maps of the probe, drawn from the weights the model uses right now.
        if cfg.train.attn_log_interval and (step % cfg.train.attn_log_interval == 0 or last_step):
            tb.attention_maps(step, model.attention_weights(probe_batch)[:, 0], probe_labels)  # (L, H, T, T)

        # A sample, to read how the model writes.
        if cfg.train.sample_interval and (step % cfg.train.sample_interval == 0 or last_step):
            sample = generate_text(
                model, data.tokenizer, "", cfg.train.sample_tokens, temperature=cfg.train.sample_temperature, seed=cfg.train.seed
            )[0]
            tb.text("samples", sample, step)
            log.info(f"sample at step {step}:\n{sample}\n")
        tb.flush()
        if last_step:
            break

        # One optimizer update.
        started = time.perf_counter()
        lr = lr_at(step, cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps, max_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = get_batch(data.train, batch_size, block_size, batch_rng)  # (B, T), (B, T)
        x, y = x.to(device), y.to(device)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or math.inf)
        optimizer.step()
        step += 1

        # Report: TensorBoard and the log every log_interval steps, the bar every step.
        # loss.item() waits for the step to finish (on a GPU too), so the clock read after it is honest.
        loss_value = loss.item()
        window_loss += loss_value
        window_steps += 1
        window_time += time.perf_counter() - started
        tokens_per_sec = window_steps * tokens_per_step / window_time
        if step % cfg.train.log_interval == 0 or step == max_steps:
            mean_loss = window_loss / window_steps
            tb.scalars(step, {
                "train/batch_loss": mean_loss,
                "train/lr": lr,
                "train/grad_norm": grad_norm.item(),
                "train/tokens_per_sec": tokens_per_sec,
            })
            log.info(
                f"step {step}/{max_steps} | loss {mean_loss:.4f} | lr {lr:.2e} | "
                f"grad norm {grad_norm.item():.2f} | {tokens_per_sec:,.0f} tok/s",
                extra={"progress": True},
            )
            window_loss, window_steps, window_time = 0.0, 0, 0.0
        bar.update(step, loss_value, tokens_per_sec)

    bar.close()
    tb.close()
    log.info(f"done: best val loss {best_val_loss:.4f}; checkpoints, logs and TensorBoard events in {shown_dir}")
    log.info(f"  watch:  .venv/bin/tensorboard --logdir {os.path.dirname(shown_dir)}")
    log.info(f"  sample: .venv/bin/python sample.py run={shown_dir} prompt='Once upon a time'")
    return best_val_loss


@torch.no_grad()
def evaluate(
    model: GPT, data: TokenData, batch_size: int, block_size: int, eval_iters: int, device: torch.device, seed: int
) -> dict[str, float]:
    """Mean loss over eval_iters batches of each split. The batches are the same at every
    evaluation (a fixed seed), so the curve shows the model changing, not the batches."""
    model.eval()
    rng = np.random.default_rng(seed + 1)
    losses = {}
    for split, tokens in (("train", data.train), ("val", data.val)):
        total = 0.0
        for _ in range(eval_iters):
            x, y = get_batch(tokens, batch_size, block_size, rng)
            total += model(x.to(device), y.to(device))[1].item()
        losses[split] = total / eval_iters
    model.train()
    return losses


if __name__ == "__main__":
    main()
