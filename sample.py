"""Generate text from a trained checkpoint. Needs no corpus: the checkpoint holds the
model's config, its weights and its tokenizer.

    python sample.py run=outputs/2026-11-22/10-00-00 prompt="Once upon a time"
    python sample.py run=latest max_new_tokens=200 temperature=0.8 top_k=50 num_samples=3 seed=1
    python sample.py run=latest dtype=bf16 compile=true   # half the bytes a token reads
    python sample.py -m run=latest temperature=0.5,1.0     # one sampling per value, each under its name

Every option is in configs/sample.yaml. Nothing is written anywhere (with -m, Hydra keeps a record
of the sweep under multirun/).
"""

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from runtime.startup import Starting
from user_error import UserError, not_installed

try:  # what make setup installs into .venv: another python gets one line, not a traceback
    starting = Starting()  # Ctrl-C while importing is one line too, and no garbage is collected (runtime/startup.py)
    import hydra
    import torch
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig
except ModuleNotFoundError as missing:
    sys.exit(not_installed(missing, "sample.py"))

from cli.checkpoint_commands import prompt_as_typed, validate_sample_config
from cli.errors import compile_failure, exit_on_user_error, run_cli
from cli.sweep_check import said_as_its_job, sweep_job
from model import GPT
from model.decode_step import INDUCTOR_OPTIONS
from model.generation import EOT_SHOWN, Tokenizer, generate_text, lay_out_for_decoding, prompt_ids, terminal_text
from model_io.checkpoint import Checkpoint
from model_io.run_files import KEPT, checkpoint_and_note
from runtime.devices import Machine, check_compiler, is_out_of_memory, pick_device
from runtime.huge_pages import move_to_huge_pages
from runtime.precision import weights_dtype

starting.done()  # Ctrl-C raises KeyboardInterrupt again; the collector runs over what is made from here


@hydra.main(config_path=str(Path(__file__).resolve().parent / "configs"), config_name="sample", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with exit_on_user_error(writes=False), said_as_its_job(HydraConfig.get(), trains=False):
        if job := sweep_job(HydraConfig.get()):  # -m: each job's text under its name (its error names it too)
            print(f"=== {job} ===", flush=True)
        sample(cfg)


def sample(cfg: DictConfig) -> None:
    machine = Machine.this_one()
    device = pick_device(cfg.device, machine, key="device")
    validate_sample_config(cfg)
    dtype, warning = weights_dtype(str(cfg.dtype), device, machine)
    compiles = cfg.compile and cfg.max_new_tokens > 1  # one new token needs no decode step
    if compiles:
        check_compiler("compile", device, machine, cpp_wrapper=INDUCTOR_OPTIONS["cpp_wrapper"])
    path, note = checkpoint_and_note(str(cfg.run))
    if str(cfg.run) == "latest" or path.parent.name == KEPT:  # which run, or which kept step, it picked
        print(f"run={cfg.run}: {path}", file=sys.stderr, flush=True)
    if note:
        print(note, file=sys.stderr, flush=True)
    model, tokenizer = Checkpoint.load(path).build_model()
    model.to(device, dtype)
    validate_sample_config(cfg, tokenizer.vocab_size)
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    if device.type == "cpu":
        if not cfg.compile:
            lay_out_for_decoding(model)  # float32's one-row matmuls read faster from (in, out) there
        move_to_huge_pages(model)  # each token reads every weight: on 2 MiB pages, with fewer address lookups
    prompt_tokens = len(prompt_ids(tokenizer, prompt_as_typed(cfg.prompt)))
    block_size = model.config.block_size
    if prompt_tokens > block_size and not model.generates_past_block_size:
        print(f"note: the prompt is {prompt_tokens:,} tokens with its start token, and the model reads at most "
              f"{block_size} (its model.block_size): it continues from the prompt's last {block_size}", file=sys.stderr, flush=True)
    if compiles:
        print("compile=true: compiling the decode step first (seconds; longer the first time on this machine, "
              "before Inductor has cached its kernels)", file=sys.stderr, flush=True)

    # One sample is printed as it is written; several, batched, each once all are done.
    stream = PrintedAsItComes() if cfg.num_samples == 1 else None
    with stream.line_ended_if_stopped() if stream else nullcontext():
        texts = sampled_texts(cfg, model, tokenizer, path, dtype, stream)
    if stream is not None:
        print()  # the sample's own text is printed already
        return
    for i, text in enumerate(texts):
        print(f"--- sample {i + 1} of {cfg.num_samples} ---")
        print(terminal_text(text))


def out_of_memory(cfg: DictConfig) -> str:
    return (f"num_samples={cfg.num_samples} continuations of max_new_tokens={cfg.max_new_tokens} tokens, sampled "
            "together as one batch, need more memory than this machine has; ask for fewer num_samples")


def sampled_texts(cfg: DictConfig, model: GPT, tokenizer: Tokenizer, path: Path, dtype: torch.dtype,
                  on_text: Callable[[str], None] | None) -> list[str]:
    """generate_text with sample.py's settings; a failure the user can act on as a UserError."""
    try:
        return generate_text(
            model, tokenizer, prompt_as_typed(cfg.prompt), cfg.max_new_tokens,
            temperature=cfg.temperature, top_k=cfg.top_k or None, top_p=cfg.top_p,
            num_samples=cfg.num_samples, seed=cfg.seed, use_kv_cache=cfg.use_kv_cache, compile=cfg.compile,
            eot_text=EOT_SHOWN, on_text=on_text,
        )
    except FloatingPointError as error:
        if dtype == torch.float16:  # the likelier cause: float16 ends at 65,504
            raise UserError(f"{path}: the model's next-token logits are NaN or inf at dtype={cfg.dtype} (float16, "
                            "whose largest number is 65,504); sample with dtype=bf16 or fp32") from None
        raise UserError(f"{path}: {error}; sample from a checkpoint saved before that") from None
    except (RuntimeError, MemoryError) as error:
        if is_out_of_memory(error):  # a GPU's, a CPU's
            raise UserError(out_of_memory(cfg)) from None
        if (reason := compile_failure(error)) is None:
            raise
        raise UserError(f"compile=true: Inductor could not compile the decode step ({reason}); "  # only compile=true gets here
                        "run with compile=false") from None


class PrintedAsItComes:
    """on_text for one sample: each piece printed at once, its control characters as escapes
    (terminal_text)."""

    def __init__(self) -> None:
        self.started = False

    def __call__(self, piece: str) -> None:
        print(terminal_text(piece), end="", flush=True)
        self.started = True

    @contextmanager
    def line_ended_if_stopped(self) -> Iterator[None]:
        """An error or Ctrl-C while the sample is printed ends its line first: what is said next
        (the error, "stopped") starts a line of its own."""
        try:
            yield
        except BaseException:
            if self.started:
                print(flush=True)
            raise


if __name__ == "__main__":
    run_cli(main)
