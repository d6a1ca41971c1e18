"""Train a small GPT: config -> data -> model -> loop, logging to TensorBoard as it learns.

    python train.py                                   the defaults in configs/
    python train.py model.n_head=8 optim.lr=3e-3      any config value
    python train.py data=text data.path=book.txt      your own text
    python train.py -m model.n_head=1,2,4             a sweep: one run dir per value
    torchrun --standalone --nproc_per_node=4 train.py one run on 4 processes (GPUs), see
                                                      training/distributed.py

The run dir (outputs/<date>/<time>, or multirun/<date>/<time>/<n> in a sweep) receives
.hydra/ (the resolved config), train.log, TensorBoard event files, ckpt_last.pt and
ckpt_best.pt. Watch it with `tensorboard --logdir outputs`; sample from it with
`python sample.py run=<run dir>`.
"""

import logging
import math
import os
import shutil
import signal
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel

from data.dataset import TokenData, check_splits_fit, get_batch, prepare_tokens, probe_ids
from data.errors import DataError
from training.checkpoint import BEST, LAST, load_checkpoint, load_weights, resolve_resume, save_checkpoint
from training.config import build_model, resumed_config, seed_everything, validate_train_config
from training.distributed import Ranks, dist_backend, env_rank, env_world_size, leave_process_group, lost_contact
from training.errors import UserError, exit_on_user_error, run_cli, said_once_per_machine
from training.generation import generate_text
from training.head_metrics import head_metrics, induction_probe, induction_score
from training.interrupt import StopSignals
from training.lr_schedule import lr_at
from training.optimizer import build_optimizer
from training.precision import Precision
from training.progress import ProgressBar
from training.recall_probe import RecallProbe
from training.run_state import capture_rng_states, restore_rng_states
from training.shape_trace import trace_shapes
from training.tensorboard_log import RunLogger

log = logging.getLogger("train")


def run_dir_for(resume: str | None, fresh_dir: str) -> str:
    """hydra.run.dir: a resumed run goes on in its own folder, a new one gets fresh_dir.
    Under torchrun only rank 0 writes the run; the others get a scratch folder Hydra can use."""
    if env_rank() > 0:
        return scratch_dir_of_rank()
    return str(resolve_resume(resume).parent) if resume else fresh_dir


def config_subdir_for(resume: str | None, stamp: str) -> str | None:
    """hydra.output_subdir: a resumed run records its config beside the original one.
    Ranks other than 0 record nothing (None)."""
    if env_rank() > 0:
        return None
    return f".hydra/resumed-{stamp}" if resume else ".hydra"


def scratch_dir_of_rank() -> str:
    return os.path.join(tempfile.gettempdir(), f"tinyattn-rank{env_rank()}-{os.getpid()}")


OmegaConf.register_new_resolver("run_dir_for", run_dir_for)
OmegaConf.register_new_resolver("config_subdir_for", config_subdir_for)


@hydra.main(config_path="configs", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    if env_rank() > 0:
        quiet_other_rank()
    with exit_on_user_error():
        try:
            return train(cfg)
        except (UserError, DataError):
            if env_rank() == 0:  # the other ranks have no record to take back
                forget_refused_run(Path(HydraConfig.get().runtime.output_dir), HydraConfig.get().output_subdir)
            raise
        except torch._dynamo.exc.BackendCompilerFailed as error:  # only train.compile=true gets here
            reason = str(error).strip().splitlines()[0]
            raise UserError(f"train.compile=true: torch.compile could not build the model ({reason}); "
                            "run with train.compile=false") from None
        except RuntimeError as error:
            if not lost_contact(error):
                raise
            raise UserError(f"rank {env_rank()} lost contact with the other processes: one of them stopped "
                            "(its own message says why)") from None
        finally:
            leave_process_group()
            if env_rank() > 0:
                shutil.rmtree(scratch_dir_of_rank(), ignore_errors=True)


def quiet_other_rank() -> None:
    """Ranks other than 0 print errors only, and write no log file (rank 0 logs for all)."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(logging.ERROR)


def forget_refused_run(run_dir: Path, record: str) -> None:
    """Hydra writes the config record (.hydra/, or .hydra/resumed-<time>/ on resume) and a log
    before train() can check anything. When the run was refused (or only traced its shapes)
    before it trained a step, take back that record, and a new run dir left with nothing else."""
    config_file = run_dir / record / "config.yaml"
    if not config_file.is_file():
        return
    if any(events.stat().st_mtime_ns >= config_file.stat().st_mtime_ns for events in run_dir.glob("events.out.*")):
        return  # it did train: keep the record of how
    shutil.rmtree(run_dir / record)
    if {path.name for path in run_dir.iterdir()} <= {"train.log"}:
        shutil.rmtree(run_dir)
        if run_dir.parent.name != "outputs" and not any(run_dir.parent.iterdir()):
            run_dir.parent.rmdir()  # outputs/<date>/, when this was its only run


def train(cfg: DictConfig) -> float:
    """One training run; returns the best val loss (what a sweeper would minimise)."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    shown_dir = os.path.relpath(run_dir)  # as the user would type it
    resumed = None
    with said_once_per_machine():  # checks of the config alone: every process would fail them alike
        if cfg.resume:
            resumed = load_checkpoint(resolve_resume(cfg.resume))
            cfg, changes = resumed_config(cfg, resumed["config"], HydraConfig.get().overrides.task)
            if "run_state" not in resumed:
                raise UserError(f"resume={cfg.resume}: this checkpoint lacks what an exact resume needs (it was "
                                "saved by an older version); start a new run, or sample from it")
        validate_train_config(cfg)
        if resumed and resumed["step"] >= cfg.train.max_steps:
            raise UserError(f"resume={cfg.resume}: the run is already at step {resumed['step']}, and "
                            f"train.max_steps={cfg.train.max_steps}; give a larger train.max_steps to train on")
        if HydraConfig.get().mode == RunMode.MULTIRUN and env_world_size() > 1:
            raise UserError("a sweep (-m) cannot run under torchrun; start one torchrun per configuration instead")
    if resumed:
        log.info(f"resuming {shown_dir} at step {resumed['step']}" + "".join(f"; {change}" for change in changes))

    # Where this process runs: alone, or as one rank of several started by torchrun.
    ranks = Ranks.join(cfg.train.device)
    device = ranks.device
    precision = Precision(cfg.train.dtype, device)
    if precision.warning:
        log.warning(f"warning: {precision.warning}")
    # Each rank its own seed, so dropout masks differ between ranks; the model itself starts
    # as rank 0's everywhere, since DistributedDataParallel copies rank 0's weights to all.
    seed_everything(cfg.train.seed + ranks.rank)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls: much faster, ample precision here

    # Data: the corpus as token ids, split into train and val, and the tokenizer that made them.
    # On each machine one process tokenizes (and downloads) first; the others then read its cache.
    if ranks.local_rank != 0:
        ranks.barrier()
    data = prepare_tokens(cfg.data, cfg.tokenizer)
    if ranks.local_rank == 0:
        ranks.barrier()
    block_size, batch_size, accum = cfg.model.block_size, cfg.train.batch_size, cfg.train.grad_accum_steps
    check_splits_fit(data, block_size)

    # Model and optimizer.
    model = build_model(cfg.model, data.tokenizer.vocab_size).to(device)
    if cfg.debug == "shapes":  # the shape walk of this model instead of a run
        x, y = get_batch(data.train, 2, block_size, np.random.default_rng(cfg.train.seed))  # (2, T) each
        if ranks.is_main:
            print("\n".join(trace_shapes(model, x.to(device), y.to(device))))
            forget_refused_run(run_dir, HydraConfig.get().output_subdir)
        return math.nan
    optimizer = build_optimizer(model, cfg.optim, device)
    log.info(
        f"model: {model.num_parameters() / 1e6:.2f}M parameters, {cfg.model.n_layer} layers x "
        f"{cfg.model.n_head} heads x {cfg.model.n_embd // cfg.model.n_head} dims, context {block_size}"
    )
    log.info(
        f"data: {cfg.data.source}, {len(data.train):,} train and {len(data.val):,} val tokens, "
        f"vocab {data.tokenizer.vocab_size} ({data.tokenizer.kind}) | device: {device}"
        + (f" | {ranks.world_size} processes ({dist_backend()})" if ranks.distributed else "")
    )
    learned = data.tokenizer.vocab_size - 1  # BPE's byte tokens: all but <|endoftext|>
    if cfg.tokenizer.kind == "bpe" and learned < cfg.tokenizer.vocab_size:
        log.info(f"note: bpe has {learned} byte tokens, not the {cfg.tokenizer.vocab_size} of tokenizer.vocab_size: "
                 "the train split ran out of pairs to merge (each of its words is one token already)")
    log.info(f"run dir: {shown_dir}")
    # What trains: the model itself, or under torchrun DistributedDataParallel around it, which
    # averages the gradients over all ranks during backward() so that every rank takes the same
    # step. Its buffers (RoPE tables) are constants: no need to re-send them before every forward.
    ddp = DistributedDataParallel(model, forward_sync_buffers=False) if ranks.distributed else None
    step_model, eval_model = ddp or model, model
    # train.compile: torch.compile turns the training and evaluation steps into generated
    # kernels. The compiled modules share `model`'s parameters, so checkpoints, attention maps
    # and samples keep using `model` itself.
    if cfg.train.compile:
        step_model, eval_model = torch.compile(step_model), torch.compile(model)
        log.info("train.compile=true: the first training step and the first evaluation compile first")

    # Where the loop starts: step 0, or exactly where a saved run stopped. Every rank draws the
    # same batches, each then taking its own share of them (see the training step).
    batch_rng = np.random.default_rng(cfg.train.seed)
    step, best_val_loss, skipped = 0, math.inf, 0
    window_loss, window_steps = 0.0, 0  # the train loss logged every log_interval steps
    timed_steps, window_time = 0, 0.0  # tokens/s over the same window
    evaluated_already = False  # True when resuming at a step whose evaluation was logged and saved
    if resumed:
        load_weights(model, resumed["model"])
        optimizer.load_state_dict(resumed["optimizer"])
        state = resumed["run_state"]
        rng_states = state["rng"] if isinstance(state["rng"], list) else [state["rng"]]  # one per rank
        restore_rng_states(rng_states[ranks.rank % len(rng_states)], batch_rng)
        if state.get("grad_scaler"):
            precision.scaler.load_state_dict(state["grad_scaler"])
        step, best_val_loss, skipped = resumed["step"], resumed["best_val_loss"], state["skipped"]
        window_loss, window_steps = state["window_loss"], state["window_steps"]
        evaluated_already = state["evaluated"]
        if state.get("world_size", 1) != ranks.world_size:
            log.info(f"note: the run was saved by {state.get('world_size', 1)} process(es) and goes on with "
                     f"{ranks.world_size}, so its batches differ from here on")

    # What gets watched: TensorBoard (rank 0 only), and a fixed probe text from val for the
    # attention maps. Everything up to the checkpoint's step was logged before it was saved; a
    # resumed run hides what the old run logged after that, so no step appears twice.
    tb = RunLogger(run_dir if ranks.is_main else None, purge_step=step + 1 if resumed else None)
    if not resumed:
        tb.text("config", OmegaConf.to_yaml(cfg), 0)
    probe = probe_ids(data.val, data.tokenizer, min(cfg.train.probe_tokens, block_size))
    probe_batch = torch.tensor([probe], device=device)  # (1, T_probe)
    probe_labels = data.tokenizer.token_strings(probe)
    if not resumed:
        tb.probe_tokens(probe_labels)
    # The induction probe: random tokens, repeated once (see training/head_metrics.py).
    n_induction = min(cfg.train.probe_tokens, block_size) // 2
    induction_batch = torch.tensor(
        [induction_probe(data.tokenizer.vocab_size, n_induction, cfg.train.seed, avoid=data.tokenizer.eot_id)], device=device,
    ) if n_induction >= 2 else None  # (1, 2n)
    # The recall probe: held-out stories (another seed), where names and items come back.
    recall = (RecallProbe.build(data.tokenizer, block_size, seed=cfg.data.seed + 1)
              if ranks.is_main and cfg.train.attn_log_interval and cfg.data.source == "stories" else None)
    if recall is not None and not recall.targets:
        recall = None  # block_size too short for a name to come back inside one window
    config_dict = OmegaConf.to_container(cfg, resolve=True)

    def save(path: Path, evaluated: bool) -> None:
        rng_states = ranks.gather(capture_rng_states(batch_rng))  # every rank's, for an exact resume
        if not ranks.is_main:
            return  # one copy of the model is enough: rank 0 saves it
        run_state = dict(
            rng=rng_states, world_size=ranks.world_size, grad_scaler=precision.scaler.state_dict(),
            evaluated=evaluated, skipped=skipped, window_loss=window_loss, window_steps=window_steps,
        )
        save_checkpoint(
            path, model=model, optimizer=optimizer, step=step, best_val_loss=best_val_loss,
            config=config_dict, tokenizer=data.tokenizer, run_state=run_state,
        )

    max_steps = cfg.train.max_steps
    tokens_per_step = accum * ranks.world_size * batch_size * block_size
    bar = ProgressBar(total=max_steps, start=step) if ranks.is_main else None
    with StopSignals() as stop:
        while True:
            last_step = step >= max_steps

            if not evaluated_already:
                # Evaluate.
                is_eval_step = (step % cfg.train.eval_interval == 0 and (step > 0 or cfg.train.eval_at_start)) or last_step
                if is_eval_step:
                    losses = evaluate(eval_model, data, batch_size, block_size, cfg.train.eval_iters, ranks,
                                      precision, cfg.train.seed)
                    tb.scalars(step, {"loss/train": losses["train"], "loss/val": losses["val"]})
                    log.info(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")

                # Attention maps of the probe, drawn from the weights the model uses right now, and
                # what each head does in numbers: on the probe, and on the induction probe.
                if ranks.is_main and cfg.train.attn_log_interval and (step % cfg.train.attn_log_interval == 0 or last_step):
                    weights = model.attention_weights(probe_batch)[:, 0]  # (L, H, T, T)
                    tb.attention_maps(step, weights, probe_labels)
                    tb.head_grid(step, weights)
                    metrics = head_metrics(weights)
                    if induction_batch is not None:
                        induction_weights = model.attention_weights(induction_batch)[:, 0]  # (L, H, 2n, 2n)
                        metrics["induction"] = induction_score(induction_weights, induction_batch.shape[1] // 2)
                    tb.head_metrics(step, metrics)
                    if recall is not None:
                        tb.recall(step, recall.evaluate(model))

                # A sample, to read how the model writes.
                if ranks.is_main and cfg.train.sample_interval and (step % cfg.train.sample_interval == 0 or last_step):
                    try:
                        sample = generate_text(
                            model, data.tokenizer, "", cfg.train.sample_tokens,
                            temperature=cfg.train.sample_temperature, seed=cfg.train.seed,
                        )[0]
                    except FloatingPointError as error:  # only after train.skip_nonfinite let NaN in
                        sample = f"(no sample: {error})"
                    tb.text("samples", sample, step)
                    log.info(f"sample at step {step}:\n{sample}\n")

                # Keep the last and the best model (every rank has the same losses: they are summed over ranks).
                if is_eval_step and step > 0:
                    if losses["val"] < best_val_loss:
                        best_val_loss = losses["val"]
                        save(run_dir / BEST, evaluated=True)
                    save(run_dir / LAST, evaluated=True)
                tb.flush()
            evaluated_already = False
            if last_step:
                break

            # One optimizer update.
            started = time.perf_counter()
            lr = lr_at(step, cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps, max_steps,
                       cfg.optim.schedule, cfg.optim.decay_fraction)
            for group in optimizer.param_groups:
                group["lr"] = lr  # AdamW and Muon alike: Muon scales its own update to match
            # The step's batch: every rank draws the same global batch of accum x ranks x batch_size
            # sequences, and takes its own batch_size rows for each of its accum micro-steps. So
            # 2 ranks x batch b, or 2 micro-steps x b, see exactly the sequences one batch of 2b would.
            x, y = get_batch(data.train, accum * ranks.world_size * batch_size, block_size, batch_rng)  # (A*W*B, T) each
            x = x.view(accum, ranks.world_size, batch_size, block_size)[:, ranks.rank]  # (A, B, T): this rank's share
            y = y.view(accum, ranks.world_size, batch_size, block_size)[:, ranks.rank]  # (A, B, T)
            optimizer.zero_grad(set_to_none=True)
            loss_sum = torch.zeros((), device=device)
            for micro in range(accum):
                # Gradients add up over the micro-steps; DDP averages them over ranks only in the
                # last one's backward(), not in every one.
                syncs = ddp is None or micro == accum - 1
                with nullcontext() if syncs else ddp.no_sync():
                    with precision.autocast():
                        _, loss = step_model(x[micro].to(device), y[micro].to(device))  # loss: mean over B x T
                    # Dividing by accum makes the summed gradient that of the mean over all micro-batches.
                    precision.scaler.scale(loss / accum).backward()
                loss_sum += loss.detach()
            precision.scaler.unscale_(optimizer)  # fp16: back to true gradients before clipping
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or math.inf)
            # .item() waits for the step to finish (on a GPU too), so the clock read after it is honest.
            loss_value = ranks.sum(loss_sum.item()) / (accum * ranks.world_size)  # mean over every rank's batches
            grad_norm_value = grad_norm.item()  # the same on every rank: DDP averaged the gradients
            # fp16's loss scale makes an overflowing gradient routine: the scaler skips that update
            # and lowers the scale. Anywhere else a NaN or inf stops the run (or is skipped).
            finite = math.isfinite(loss_value) and (math.isfinite(grad_norm_value) or precision.scaler.is_enabled())
            if finite:
                precision.scaler.step(optimizer)  # optimizer.step(), unless fp16's gradient overflowed
                precision.scaler.update()
            elif cfg.train.skip_nonfinite:
                skipped += 1  # this batch changes nothing; count it and go on
                tb.scalars(step + 1, {"train/skipped_nonfinite": skipped})
            else:
                what, bad = ("loss", loss_value) if not math.isfinite(loss_value) else ("gradient norm", grad_norm_value)
                kept = (f"{os.path.join(shown_dir, LAST)} from before it is kept" if (run_dir / LAST).exists()
                        else "no checkpoint had been saved yet")
                raise UserError(
                    f"the {what} became {bad} at step {step + 1}; "
                    f"stopped without saving, and {kept}. Lower optim.lr, or set train.skip_nonfinite=true "
                    "to skip such batches"
                )
            step += 1

            # Report: TensorBoard and the log every log_interval steps, the bar every step.
            if finite:
                window_loss += loss_value
                window_steps += 1
            timed_steps += 1
            window_time += time.perf_counter() - started
            tokens_per_sec = timed_steps * tokens_per_step / window_time
            if (step % cfg.train.log_interval == 0 or step == max_steps) and window_steps:
                mean_loss = window_loss / window_steps
                tb.scalars(step, {
                    "train/batch_loss": mean_loss,
                    "train/lr": lr,
                    "train/grad_norm": grad_norm_value,
                    "train/tokens_per_sec": tokens_per_sec,
                })
                log.info(
                    f"step {step}/{max_steps} | loss {mean_loss:.4f} | lr {lr:.2e} | "
                    f"grad norm {grad_norm_value:.2f} | {tokens_per_sec:,.0f} tok/s",
                    extra={"progress": True},
                )
                window_loss, window_steps, timed_steps, window_time = 0.0, 0, 0, 0.0
            if bar:
                bar.update(step, loss_value, tokens_per_sec)

            # Ctrl-C or kill: the step is done; save it and say how to go on. Under torchrun the
            # ranks agree first, so that all of them stop after the same step.
            stop_signal = int(ranks.max(stop.requested or 0))
            if stop_signal and step < max_steps:
                save(run_dir / LAST, evaluated=False)
                if bar:
                    bar.close()
                tb.close()
                log.info(
                    f"stopped by {signal.Signals(stop_signal).name} after step {step}; saved "
                    f"{os.path.join(shown_dir, LAST)}. Resume with: .venv/bin/python train.py resume={shown_dir}"
                )
                raise SystemExit(128 + stop_signal)

    if bar:
        bar.close()
    tb.hparams(hyperparameters(config_dict, ranks.world_size), {"hparams/best_val_loss": best_val_loss})
    tb.close()
    if skipped:
        log.info(f"warning: {skipped} of {max_steps} batches were skipped for a non-finite loss or gradient")
    log.info(f"done: best val loss {best_val_loss:.4f}; checkpoints, logs and TensorBoard events in {shown_dir}")
    log.info(f"  watch:  .venv/bin/tensorboard --logdir {os.path.dirname(shown_dir) or '.'}")
    log.info(f"  sample: .venv/bin/python sample.py run={shown_dir} prompt='Once upon a time'")
    return best_val_loss


def hyperparameters(config: dict, world_size: int) -> dict[str, int | float | str | bool]:
    """The settings a sweep compares, flattened ("model.n_head": 4, ...), for the HParams tab."""
    flat = {f"{group}.{key}": value for group in ("model", "optim", "train") for key, value in config[group].items()
            if isinstance(value, (int, float, str, bool))}
    return {**flat, "data.source": config["data"]["source"], "tokenizer.kind": config["tokenizer"]["kind"],
            "processes": world_size}


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, data: TokenData, batch_size: int, block_size: int, eval_iters: int, ranks: Ranks,
    precision: Precision, seed: int,
) -> dict[str, float]:
    """Mean loss over eval_iters batches of each split. The batches are the same at every
    evaluation (a fixed seed), so the curve shows the model changing, not the batches. Under
    torchrun the ranks share them out (batch i to rank i mod ranks) and add up their sums, so
    the result does not depend on how many processes there are."""
    model.eval()
    rng = np.random.default_rng(seed + 1)
    losses = {}
    for split, tokens in (("train", data.train), ("val", data.val)):
        total = 0.0
        for i in range(eval_iters):
            x, y = get_batch(tokens, batch_size, block_size, rng)  # every rank draws every batch: the rng stays in step
            if i % ranks.world_size == ranks.rank:
                with precision.autocast():
                    total += model(x.to(ranks.device), y.to(ranks.device))[1].item()
        losses[split] = ranks.sum(total) / eval_iters
    model.train()
    return losses


if __name__ == "__main__":
    run_cli(main)
