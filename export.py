"""Write a run as a Hugging Face folder that transformers loads with no custom code: AutoModelForCausalLM
gives a GPT2LMHeadModel, a LlamaForCausalLM, a Qwen3ForCausalLM or a MistralForCausalLM, whichever the run's
shape is, and AutoTokenizer the run's tokenizer (docs/export.md).

    python export.py run=outputs/2026-11-22/10-00-00 out=exported/stories
    python export.py run=latest out=exported/stories force=true

Every option is in configs/export.yaml.
"""

import json
import os
import shutil
import sys
from collections.abc import Callable
from fnmatch import fnmatch
from pathlib import Path

from runtime.startup import Starting
from user_error import UserError, not_a_file_or_folder, not_installed

try:  # what make setup installs into .venv: another python gets one line, not a traceback
    starting = Starting()  # Ctrl-C while importing is one line too, and no garbage is collected (runtime/startup.py)
    import hydra
    import torch
    from omegaconf import DictConfig
except ModuleNotFoundError as missing:
    sys.exit(not_installed(missing, "export.py"))

import cli.checkpoint_commands  # noqa: F401  (stores export_schema, which configs/export.yaml extends)
from cli.errors import exit_on_user_error, run_cli
from data.hf_tokenizer import write_hf_tokenizer
from data.tokenizer import Tokenizer
from model import GPT
from model_io.checkpoint import Checkpoint
from model_io.hf_models import ARCHITECTURES, HUB_FILES, export_model_type, export_refusal, save_hf_model
from model_io.run_files import checkpoint_and_note, newest_checkpoint

starting.done()  # Ctrl-C raises KeyboardInterrupt again; the collector runs over what is made from here

# What a tokenizer saved by transformers may add to HUB_FILES (export.py writes special_tokens_map.json).
TOKENIZER_EXTRAS = ("special_tokens_map.json", "added_tokens.json", "chat_template.jinja")


@hydra.main(config_path=str(Path(__file__).resolve().parent / "configs"), config_name="export", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with exit_on_user_error():
        export(cfg)


def export(cfg: DictConfig) -> None:
    if cfg.out is None or not str(cfg.out).strip():  # out= with nothing after it reads as ""
        raise UserError("out= is missing: give the folder to write, e.g. out=exported/my_model")
    out = Path(cfg.out).expanduser()
    path, note = checkpoint_and_note(str(cfg.run))
    if note:
        print(note, file=sys.stderr, flush=True)
    checkpoint = Checkpoint.load(path)
    model, tokenizer = checkpoint.build_model()
    model_type = export_model_type(model.config)
    if model_type is None:
        raise UserError(f"{path} {export_refusal(model.config)}")
    diverged = [name for name, tensor in model.state_dict().items() if not torch.isfinite(tensor).all()]
    if diverged:  # a model that would load, and write NaN
        raise UserError(f"{path}: its weights hold NaN or inf ({diverged[0]}{' and more' if len(diverged) > 1 else ''}): "
                        "the run diverged, or the file is damaged; export a checkpoint saved before that")
    check_out(out, path, cfg.force)
    replace_folder(out, lambda folder: write_hf_folder(model, tokenizer, folder))

    files = ", ".join(sorted(p.name for p in out.iterdir()))
    print(f"wrote {out} as a {ARCHITECTURES[model_type].hf_class}, from {path} (step {checkpoint.step}): {files}")
    print("Load it in Python:")
    print("    from transformers import AutoModelForCausalLM, AutoTokenizer")
    print(f"    model, tokenizer = AutoModelForCausalLM.from_pretrained({str(out)!r}), "
          f"AutoTokenizer.from_pretrained({str(out)!r})")


def write_hf_folder(model: GPT, tokenizer: Tokenizer, folder: Path) -> None:
    """The model (config.json, model.safetensors), its tokenizer and generation settings in folder."""
    save_hf_model(model, folder, bos_id=tokenizer.bos_id, eos_id=tokenizer.eot_id)
    write_hf_tokenizer(tokenizer, folder, model_max_length=model.config.block_size)
    # pad = eot as well: generate() then pads a finished row of a batch without a warning.
    eot = tokenizer.eot_id
    generation = {"bos_token_id": tokenizer.bos_id, "eos_token_id": eot, "pad_token_id": eot}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")


def check_out(out: Path, checkpoint: Path, force: bool) -> None:
    """UserError unless out may be written: a new or empty folder, or (force) one that holds only a model's
    files, as an earlier export or save_pretrained left them. Never the working folder, the checkpoint's
    folder, a run, or a folder with anything else in it: force must not delete a home or a project."""
    if out.exists() and not out.is_dir():
        why = "is a file" if out.is_file() else not_a_file_or_folder(out)  # a named pipe, a device
        raise UserError(f"out={out} {why}; give a folder that is new or empty")
    if Path.cwd().is_relative_to(out.resolve()):
        raise UserError(f"out={out} holds the working folder; give a folder of its own")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if checkpoint.resolve().is_relative_to(out.resolve()):
        raise UserError(f"out={out} holds the checkpoint being exported ({checkpoint}); give another folder")
    entries = sorted(out.iterdir())
    if run := next(filter(None, map(newest_checkpoint, (out, *entries))), None):
        raise UserError(f"out={out} holds a run ({run}), which force=true would delete with it; give a folder of "
                        "its own to the export")
    others = [p.name + "/" * p.is_dir() for p in entries if p.is_dir() or not is_model_file(p.name)]
    if others:
        raise UserError(f"out={out} holds {listed(others)}, which an export does not write; give a new or empty folder "
                        "(force=true replaces only a folder of a model's files, such as an earlier export)")
    if not force:
        raise UserError(f"out={out} holds a model's files ({listed([p.name for p in entries])}); add force=true to "
                        "replace them, or give a new or empty folder")


def listed(names: list[str], most: int = 3) -> str:
    """The first few names, and how many more."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def is_model_file(name: str) -> bool:
    """A file that export.py or transformers' save_pretrained writes into a model folder."""
    return any(fnmatch(name, pattern) for pattern in (*HUB_FILES, *TOKENIZER_EXTRAS))


def replace_folder(out: Path, write: Callable[[Path], None]) -> None:
    """Run write on a new sibling folder of out, then rename it to out, replacing what was there:
    an export that fails leaves out as it was and no half-written folder."""
    out = out.resolve()  # "." has no name to put beside
    staging = out.with_name(f".{out.name}.{os.getpid()}.tmp")  # beside out: the rename stays on one filesystem
    try:
        shutil.rmtree(staging, ignore_errors=True)  # left by a process of the same id that was killed
        staging.mkdir(parents=True)
    except OSError as err:
        raise UserError(f"could not create a folder beside out={out} ({err.strerror or err}); nothing was written") from None
    old = staging.with_name(staging.name + ".old")
    try:
        write(staging)
        if out.exists():
            shutil.copymode(out, staging)  # the folder given keeps its own permissions (a private one stays so)
            os.rename(out, old)
        os.rename(staging, out)
    except OSError as err:  # a full disk, a read-only folder
        raise UserError(f"could not write out={out} ({err.strerror or err}); it was left as it was") from None
    finally:
        if old.exists() and not out.exists():  # the new folder did not make it: put the old one back
            os.rename(old, out)
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


if __name__ == "__main__":
    run_cli(main)
