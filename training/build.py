"""Everything one training run is made of, built from its spec (training/specs.py): processes, data, model, optimizer."""

import logging
import os
import random
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from data.batches import check_splits_fit
from data.token_cache import TokenData, prepare_tokens
from model import GPT, GPTConfig
from model_io.checkpoint import Checkpoint, build_model
from model_io.hf_models import load_hf_weights
from model_io.run_files import LAST
from runtime.devices import Machine, check_compiler, is_out_of_memory, memory_bytes
from runtime.precision import Precision
from runtime.ranks import Ranks, dist_backend, leave_it_to_local_rank_zero, lost_contact, said_once_per_machine
from training.data_parallel import Replicated, wrap
from training.lr_schedule import schedule_note
from training.optimizer import Optimizers, build_optimizer
from training.specs import RunSpec, StepSpec
from training.state import RunState, TrainState, restore_rng_states
from training.step import TrainStep
from user_error import UserError

log = logging.getLogger("train")
# What the lines of too big a batch say to do instead
GRAD_ACCUM_HINT = "train.grad_accum_steps=N adds up N micro-steps into one update: as big a batch in less memory"


@dataclass
class Run:
    spec: RunSpec  # what the run is asked for (training/specs.py), built by cli/run_spec.py
    config: dict[str, Any]  # the config it came from, as plain values: what checkpoints and TensorBoard keep
    dir: Path
    ranks: Ranks
    precision: Precision
    data: TokenData
    model: GPT
    optimizer: Optimizers
    step_model: torch.nn.Module  # what trains: model, or DDP and/or torch.compile around it
    eval_model: torch.nn.Module  # what evaluates: model, or torch.compile around it
    parallel: Replicated  # how the ranks share the training: DDP or FSDP (training/data_parallel.py)
    batch_rng: np.random.Generator  # the training batches; every rank draws the same ones

    @property
    def shown_dir(self) -> str:
        return os.path.relpath(self.dir)  # as the user would type it

    def train_step(self) -> TrainStep:
        """The run's step, on its training split; a stop names its ckpt_last.pt."""
        return TrainStep(self.spec.step, self.model, self.step_model, self.parallel, self.optimizer, self.precision,
                         self.ranks, self.data.train, self.dir / LAST)


def build_data_and_model(spec: RunSpec) -> tuple[Ranks, Precision, TokenData, GPT]:
    """This process's place among the ranks, its precision, the tokenized corpus and a new model:
    random, or the weights of spec.start.weights (a resumed run's checkpoint brings its own)."""
    machine = Machine.this_one()
    ranks = Ranks.join(spec.device.device, machine)
    with said_once_per_machine():  # every process on a machine would refuse alike
        precision = Precision.for_run(spec.device.dtype, ranks.device, machine)
        if spec.device.compile:
            check_compiler("train.compile", ranks.device, machine)
    if precision.warning:
        log.warning(f"warning: {precision.warning}")
    # Each rank its own seed, so dropout masks differ between ranks; the model itself starts
    # as rank 0's everywhere, since DistributedDataParallel copies rank 0's weights to all.
    seed_everything(spec.loop.seed + ranks.rank)
    if ranks.device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls: much faster, ample precision here
    # On each machine one process tokenizes (and downloads) first; the others then read its cache.
    if ranks.local_rank != 0:
        wait_for_the_tokens(ranks)
    data = prepare_tokens(spec.corpus, spec.tokenizer)
    if ranks.local_rank == 0:
        ranks.barrier()
    check_splits_fit(data, spec.model.block_size)
    with said_once_per_machine():  # every process on a machine would refuse alike
        check_model_fits(spec.model, data.tokenizer.vocab_size, ranks.device, spec.start.init_from)
        check_batch_fits(spec.step, data.tokenizer.vocab_size, ranks.device)
        try:
            if spec.start.weights:
                with torch.device("meta"):  # no memory for random weights the file's replace at once
                    model = build_model(spec.model, data.tokenizer.vocab_size)
                load_hf_weights(spec.start.weights, model)
            else:
                model = build_model(spec.model, data.tokenizer.vocab_size)
            model = model.to(ranks.device)
        except (RuntimeError, MemoryError) as error:  # torch.OutOfMemoryError is a RuntimeError
            if not is_out_of_memory(error):
                raise
            raise UserError(f"{model_named(spec.model, spec.start.init_from)}: the model's weights do not fit in the "
                            f"memory left on {ranks.device}; {smaller(spec.start.init_from)}") from None
    return ranks, precision, data, model


def check_model_fits(shape: GPTConfig, vocab_size: int, device: torch.device, init_from: str | None) -> None:
    """Refuses a model whose float32 weights (and, training on the CPU, their gradients, in each of
    the machine's processes) take more than this machine's memory, before any of it is made: the
    kernel would end the run without a word (model.n_layer=100000), or a model of 10^23 layers
    would be built for ever. A lower bound: the optimizer's state and the activations come on top."""
    memory = memory_bytes()
    if memory is None:
        return
    parameters = parameter_count(shape, vocab_size)
    on_cpu = device.type == "cpu"
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if on_cpu else 1  # torchrun's, on this machine
    needed = parameters * 4 * (2 if on_cpu else 1) * processes  # built in the CPU's memory, then moved
    if needed > memory:
        what = f"weights and gradients{f' in {processes} processes' if processes > 1 else ''}" if on_cpu else "weights"
        raise UserError(f"{model_named(shape, init_from)}: a model of {parameters / 1e9:,.1f}B parameters, whose float32 "
                        f"{what} take {needed / 1e9:,.1f} GB, more than this machine's {memory / 1e9:.1f} GB of memory; "
                        f"{smaller(init_from)}")


def check_batch_fits(step: StepSpec, vocab_size: int, device: torch.device) -> None:
    """Refuses a batch whose least memory passes this machine's (its processes' together): the
    kernel would end the run without a word (train.batch_size=100000 on 24 GB, at its first
    evaluation). Two lower bounds, each of a moment every step comes to. On every device: while an
    update's micro-steps are drawn at once, each token's int64 window, its offset, and the input and
    target cut from it, in this machine's memory (every rank drawing all ranks' rows: data/batches.py
    get_batch, TrainStep.rank_share; on a GPU too, before they move). On a CPU: a micro-step's
    logits and their gradient, in float32. The blocks' activations come on top. (A GPU's own memory
    running out is an error that train.py words: ran_out_of_memory.)"""
    memory = memory_bytes()
    if memory is None:
        return
    on_cpu = device.type == "cpu"
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # torchrun's, on this machine
    drawn = step.grad_accum_steps * int(os.environ.get("WORLD_SIZE", "1")) * step.batch_size  # sequences an update draws
    logits = step.batch_size * step.block_size * vocab_size * 4 * 2 * processes if on_cpu else 0
    ids = drawn * step.block_size * 8 * 4 * processes
    if max(logits, ids) <= memory:
        return
    together = f" by the {processes} processes on this machine together" if processes > 1 else ""
    if ids > logits:  # the ids an update draws, not one micro-step's logits
        lever, value, drawn_as = (("train.grad_accum_steps", step.grad_accum_steps, "its micro-steps' ")
                                  if step.grad_accum_steps > 1 else ("train.batch_size", step.batch_size, ""))
        raise UserError(f"{lever}={value}: an update draws {drawn_as}{drawn:,} sequences of "
                        f"{step.block_size:,} tokens at once, and their token ids alone take at least "
                        f"{ids / 1e9:,.1f} GB{together}, more than this machine's {memory / 1e9:.1f} GB of memory; lower "
                        f"{lever}")
    raise UserError(f"train.batch_size={step.batch_size}: a micro-step of {step.batch_size:,} sequences of "
                    f"{step.block_size:,} tokens needs at least {logits / 1e9:,.1f} GB{together} for its logits and their "
                    f"gradients alone ({vocab_size:,} a token, in float32), more than this machine's "
                    f"{memory / 1e9:.1f} GB of memory; lower train.batch_size ({GRAD_ACCUM_HINT})")


def ran_out_of_memory(spec: RunSpec, device: torch.device, error: BaseException | None = None) -> str:
    """The line for a run whose training or evaluation found too little memory on its device, with
    what the allocation that failed asked for where torch's error says it."""
    where = "the GPU's memory" if device.type == "cuda" else "memory"
    said = re.search(r"tried to allocate (?:(\d+) bytes|([\d.]+ \w+))", str(error or ""), re.IGNORECASE)  # a CPU's, a GPU's
    asked = "" if said is None else f" (one allocation asked for {int(said[1]) / 1e9:,.1f} GB)" if said[1] else \
        f" (one allocation asked for {said[2]})"
    step = spec.step
    if step.grad_accum_steps > 1:  # an update draws its micro-steps' ids at once: many of them are the cause too
        accum = f", train.grad_accum_steps={step.grad_accum_steps} of them drawn at once for each update"
        lower = "train.batch_size, model.block_size or train.grad_accum_steps"
    else:
        accum, lower = "", f"train.batch_size ({GRAD_ACCUM_HINT}) or model.block_size"
    line = (f"{where} ran out while training on {device}{asked}, with micro-steps of train.batch_size={step.batch_size} "
            f"sequences of model.block_size={step.block_size} tokens{accum}; lower {lower}")
    if spec.model.attention == "manual":
        line += ", or use model.attention=sdpa, which never holds every head's (T, T) scores at once"
    return line


def parameter_count(shape: GPTConfig, vocab_size: int) -> int:
    """The parameters of a GPT of this shape, counted on the meta device (no memory) from one of a
    single layer: its blocks are alike, so a model of many layers need not be built to be measured."""
    with torch.device("meta"):
        one_layer = build_model(replace(shape, n_layer=1), vocab_size)
    block = sum(parameter.numel() for parameter in one_layer.blocks[0].parameters())
    return one_layer.num_parameters() + (shape.n_layer - 1) * block


def model_named(shape: GPTConfig, init_from: str | None) -> str:
    """The setting that sized the model: init_from=<folder or id>, or model.n_layer=4, model.n_embd=128."""
    return f"init_from={init_from}" if init_from else f"model.n_layer={shape.n_layer}, model.n_embd={shape.n_embd}"


def smaller(init_from: str | None) -> str:
    return "start from a smaller model, or train where there is more memory" if init_from else "make the model smaller"


def build_run(spec: RunSpec, config: dict[str, Any], run_dir: Path, ranks: Ranks, precision: Precision,
              data: TokenData, model: GPT) -> Run:
    """The run of spec; config: the config it came from, as plain values (cli/config.py plain_config)."""
    # Under torchrun, DDP averages the gradients over all ranks during backward(), so that every
    # rank takes the same step; FSDP does too, each rank stepping its own shard.
    parallel = wrap(model, spec.device.parallel, ranks)
    optimizer = build_optimizer(model, spec.optim, ranks.device)  # after wrap: on FSDP's shards
    step_model, eval_model = parallel.step_model, model
    # The compiled modules share model's parameters: checkpoints, maps and samples use model itself.
    if spec.device.compile:
        precision.before_compiling()
        step_model, eval_model = torch.compile(step_model), torch.compile(model)
    batch_rng = np.random.default_rng(spec.loop.seed)
    return Run(spec, config, run_dir, ranks, precision, data, model, optimizer, step_model, eval_model, parallel, batch_rng)


def wait_for_the_tokens(ranks: Ranks) -> None:
    """A process other than the first on its machine waits while that one tokenizes. If it stops
    instead (a corpus it cannot read), it says why: this one leaves it to that line rather than
    saying first that it lost contact."""
    try:
        ranks.barrier()
    except RuntimeError as error:
        if not lost_contact(error):
            raise
        leave_it_to_local_rank_zero(f"rank {ranks.rank} lost contact with local rank 0 while that one prepared the "
                                    "tokens (its own message says why)")
        raise


def model_line(model: GPT) -> str:
    """The log's line for the model: its size, its shape, its context and window."""
    shape = model.config
    kv_heads = f" ({shape.kv_heads} key/value head{'s' if shape.kv_heads > 1 else ''})" if shape.kv_heads != shape.n_head else ""
    window = f", window {shape.window}" if shape.window else ""
    if shape.window and shape.window >= shape.block_size:  # a new run has it with rotary positions alone (cli/config.py)
        window += (f" (no query in training sees more than {shape.block_size} tokens: the window hides keys only when "
                   "generating past them)" if model.generates_past_block_size else " (it hides nothing)")
    layers, heads = (f"{n} {word}{'s' if n > 1 else ''}" for n, word in ((shape.n_layer, "layer"), (shape.n_head, "head")))
    return (f"model: {model.num_parameters() / 1e6:.2f}M parameters, {layers} x {heads} x {shape.head_size} dims{kv_heads}, "
            f"context {shape.block_size}{window}")


def describe(run: Run) -> None:
    """The log's opening lines: model, data, where it runs, where it writes."""
    spec, model, tokenizer = run.spec, run.model, run.data.tokenizer
    log.info(model_line(model))
    log.info(
        f"data: {spec.corpus.source}, {len(run.data.train):,} train and {len(run.data.val):,} val tokens, "
        f"vocab {tokenizer.vocab_size} ({tokenizer.kind}) | device: {run.ranks.device}"
        + (f" | {run.ranks.world_size} processes ({dist_backend()})" if run.ranks.distributed else "")
        + (", each holding a shard (fsdp)" if run.parallel.collective_forwards else "")
    )
    log.info(f"precision: {run.precision.name} ({run.precision.why})")
    if spec.device.parallel == "fsdp" and not run.parallel.collective_forwards:  # wrap() shards under torchrun alone
        log.info("note: train.parallel=fsdp shards the model over torchrun's processes; this is one process, which "
                 "holds it whole (docs/fsdp.md: torchrun --nproc_per_node=N train.py train.parallel=fsdp)")
    learned = tokenizer.vocab_size - 1  # BPE's byte tokens: all but <|endoftext|>
    if spec.tokenizer.kind == "bpe" and learned < spec.tokenizer.vocab_size:
        log.info(f"note: bpe has {learned} byte tokens, not the {spec.tokenizer.vocab_size} of tokenizer.vocab_size: "
                 "the train split ran out of pairs to merge (each of its words is one token already)")
    if spec.optim.name == "muon" and spec.optim.ns_dtype == "bfloat16" and run.ranks.device.type == "cpu":
        log.info("note: optim.ns_dtype=bfloat16 (a run saved before the option resumes with it) runs Muon's "
                 "Newton-Schulz matmuls in bfloat16, very slow on a CPU without AVX-512 BF16; optim.ns_dtype=auto "
                 "runs them in float32")
    if spec.start.weights is not None and spec.optim.name == "muon" and spec.loop.max_steps > 0:
        log.info(f"note: init_from={spec.start.init_from} trains with optim.name=muon, the default for training from "
                 "scratch: its steps have a fixed size whatever the gradient, too big for weights that are already good; "
                 "the fine-tuning presets use AdamW (experiment=finetune_gpt2 or experiment=finetune_smollm2, "
                 "with init_from=<yours>), or give optim.name=adamw optim.lr=3e-5")
    optim = spec.optim
    if note := schedule_note(optim.lr, optim.min_lr, optim.warmup_steps, spec.loop.max_steps, optim.schedule,
                             optim.decay_fraction):
        log.info(f"note: {note}")
    log.info(f"run dir: {run.shown_dir}")
    if spec.device.compile:
        log.info("train.compile=true: the first training step and the first evaluation compile first")


def restore(run: Run, checkpoint: Checkpoint) -> TrainState:
    """Put a saved run back exactly where it stopped: weights, optimizer, RNGs, loop state (the run state
    checked by train.py before anything was written)."""
    run.parallel.load(checkpoint.model, run.optimizer, checkpoint.optimizer)
    saved = RunState.from_dict(checkpoint.run_state)
    restore_rng_states(saved.rng[run.ranks.rank % len(saved.rng)], run.batch_rng)  # one per rank
    if saved.grad_scaler:
        run.precision.scaler.load_state_dict(saved.grad_scaler)
    if saved.world_size != run.ranks.world_size:
        log.info(f"note: the run was saved by {saved.world_size} process(es) and goes on with "
                 f"{run.ranks.world_size}, so its batches differ from here on")
    return saved.train_state(checkpoint.step, checkpoint.best_val_loss)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds CUDA too
