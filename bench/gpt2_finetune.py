"""The gpt2_finetune section: training steps at GPT-2 small's shape, this project's TrainStep
against nanoGPT's model.py (imported from a checkout) in the loop of nanoGPT's train.py."""

import contextlib
import importlib.util
import io
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from bench.gpt2_sampling import GPT2_SMALL
from cli.run_spec import composed_run_spec
from data.batches import get_batch
from model import GPT, GPTConfig
from runtime.precision import Precision
from runtime.ranks import Ranks
from training.optimizer import build_optimizer
from training.specs import StepSpec
from training.step import TrainStep

BATCH_SIZE, SEQUENCE_LENGTH = 1, 256  # tokens per step: a fine-tune's batch on a CPU
STEPS = 3  # timed steps of each model per repeat, after one untimed step each
# What touches the step's cost, as nanoGPT fine-tunes (finetune_shakespeare.py's lr over its
# train.py's defaults): AdamW with weight decay 0.1 and betas (0.9, 0.95), clipping at 1.0; and
# no dropout on either side.
LR, WEIGHT_DECAY, BETAS, GRAD_CLIP = 3e-5, 0.1, (0.9, 0.95), 1.0
CPU = torch.device("cpu")


def nanogpt_model_module(checkout: Path) -> ModuleType:
    """nanoGPT's model.py from the checkout (check_checkout found it), imported as a module (nothing of it is copied here)."""
    path = checkout / "model.py"
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Side = tuple[Callable[[np.random.Generator], float], int, torch.optim.AdamW]  # a step, the parameter count, its AdamW


def our_step(tokens: np.ndarray) -> Side:
    """One TrainStep at GPT-2's shape (learned positions, tanh GELU, biases, no QK-norm or smear)
    as train.py builds it."""
    config = GPTConfig(vocab_size=GPT2_SMALL["vocab_size"], block_size=GPT2_SMALL["n_positions"],
                       n_layer=GPT2_SMALL["n_layer"], n_head=GPT2_SMALL["n_head"], n_embd=GPT2_SMALL["n_embd"],
                       bias=True, pos="learned", norm="layernorm", mlp="gelu_tanh", qk_norm=False, smear=False)
    model = GPT(config)
    default = composed_run_spec()  # configs/ as train.py reads them, then nanoGPT's choices
    optimizer = build_optimizer(model, replace(default.optim, name="adamw", lr=LR, weight_decay=WEIGHT_DECAY, betas=BETAS), CPU)
    spec = StepSpec(batch_size=BATCH_SIZE, block_size=SEQUENCE_LENGTH, grad_accum_steps=1, grad_clip=GRAD_CLIP,
                    skip_nonfinite=False)
    step = TrainStep(spec, model, model, None, optimizer, Precision("fp32", CPU),
                     Ranks(rank=0, local_rank=0, world_size=1, device=CPU), tokens, last_checkpoint=Path("unused"))
    return lambda rng: step(0, LR, rng).result().loss, model.num_parameters(), optimizer.optimizers[0]


def nanogpt_step(nanogpt: ModuleType, tokens: np.ndarray) -> Side:
    """nanoGPT's GPT at the same shape, and the step of its train.py: forward, backward, clip,
    AdamW's step (its configure_optimizers), zero_grad, loss.item()."""
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its parameter counts
        model = nanogpt.GPT(nanogpt.GPTConfig(block_size=GPT2_SMALL["n_positions"], vocab_size=GPT2_SMALL["vocab_size"],
                                              n_layer=GPT2_SMALL["n_layer"], n_head=GPT2_SMALL["n_head"],
                                              n_embd=GPT2_SMALL["n_embd"], dropout=0.0, bias=True))
        optimizer = model.configure_optimizers(WEIGHT_DECAY, LR, BETAS, "cpu")
    model.train()

    def step(rng: np.random.Generator) -> float:
        x, y = get_batch(tokens, BATCH_SIZE, SEQUENCE_LENGTH, rng)  # the same batches as our side draws
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step, sum(p.numel() for p in model.parameters()), optimizer


def updates(adamw: torch.optim.AdamW) -> int:
    """How many steps adamw has taken (its first parameter's count)."""
    return int(adamw.state[adamw.param_groups[0]["params"][0]]["step"])


def bench_gpt2_finetune(repeats: int, checkout: Path) -> dict:
    """Tokens/s of STEPS training steps of each side, in turns within each repeat (the first
    side alternating), on random token ids of GPT-2's vocabulary, in this process and its threads."""
    nanogpt = nanogpt_model_module(checkout)
    tokens = np.random.default_rng(0).integers(0, GPT2_SMALL["vocab_size"], size=100_000).astype(np.uint16)
    torch.manual_seed(0)
    sides = {"ours": our_step(tokens), "nanogpt": nanogpt_step(nanogpt, tokens)}
    losses = {name: step(np.random.default_rng(0)) for name, (step, _, _) in sides.items()}  # AdamW's state is made here
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    for repeat in range(repeats):
        for name in (("ours", "nanogpt") if repeat % 2 == 0 else ("nanogpt", "ours")):
            step, rng = sides[name][0], np.random.default_rng(repeat + 1)
            started = time.perf_counter()
            for _ in range(STEPS):
                step(rng)
            seconds[name].append(time.perf_counter() - started)
    tokens_per_step = BATCH_SIZE * SEQUENCE_LENGTH
    rates = {name: STEPS * tokens_per_step / statistics.median(times) for name, times in seconds.items()}
    return {
        "params": sides["ours"][1], "nanogpt_params": sides["nanogpt"][1], "batch_size": BATCH_SIZE,
        "sequence_length": SEQUENCE_LENGTH, "threads": torch.get_num_threads(),
        "tokens_per_sec": rates["ours"], "nanogpt_tokens_per_sec": rates["nanogpt"],
        "vs_nanogpt": rates["ours"] / rates["nanogpt"],
        "first_loss": losses["ours"], "nanogpt_first_loss": losses["nanogpt"],
        "seconds": seconds["ours"], "nanogpt_seconds": seconds["nanogpt"],
        "updates": updates(sides["ours"][2]), "nanogpt_updates": updates(sides["nanogpt"][2]),  # the untimed one too
    }
