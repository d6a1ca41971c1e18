"""The checkpoint: the one module that owns its format. It saves and loads one, upgrades an old
one, and builds the model and tokenizer it holds (which file a run dir, `run=latest` or
`resume=` means: model_io/run_files.py). Loading a model needs nothing else: neither the
training loop nor the config schema (no hydra, no omegaconf).

A checkpoint file is a plain dict that torch.load(weights_only=True) can read, so loading one
never runs code from the file; Checkpoint is that dict with names:

    model          the weights (state_dict)
    config         the run's resolved config as plain dicts (config["model"] is the net's shape)
    tokenizer      the tokenizer's state(): sampling needs no corpus
    step           optimizer updates done
    best_val_loss  the lowest val loss seen so far
    optimizer      its state_dict; None where there is none (a run's start from weights)
    run_state      what an exact resume needs besides: RNG states, where in the step the loop
                   stopped, the open log window (training/state.py's RunState)

A save goes to a temporary file, is fsynced, then renamed into place: a crash mid-save
leaves the previous file intact.
"""

import errno
import math
import os
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from enum import Enum
from pathlib import Path
from typing import Any, BinaryIO

import torch

from data.tokenizer import Tokenizer, tokenizer_from_state
from model import GPT, GPTConfig
from user_error import UserError

MODEL_KEYS = tuple(f.name for f in fields(GPTConfig) if f.name != "vocab_size")

# Config keys added after runs were saved without them, with the value that does what the
# versions before them did, so that such a run samples and resumes unchanged.
ADDED_KEYS = {"model.smear": False, "train.eval_train": True, "optim.ns_dtype": "bfloat16",
              "optim.muon_momentum": 0.95, "train.save_interval": 0, "train.parallel": "ddp",
              "train.keep_checkpoints": [], "model.n_kv_head": None, "model.head_dim": None,
              "model.window": None, "model.mlp_hidden": None, "model.rope_theta": 10000.0, "model.rope_scaling": None,
              "model.norm_eps": None, "train.attn_log_at_start": True}
# Keys of one corpus alone (configs/data/<source>.yaml), added only to a run of that corpus: a run of
# text files or of tiny shakespeare has no names or word games, and resuming it would be refused.
ADDED_CORPUS_KEYS = {"stories": {"data.names": "common", "data.word_games": 0}}


@dataclass
class Checkpoint:
    model: dict[str, torch.Tensor]
    config: dict[str, Any]
    tokenizer: dict[str, Any]
    step: int = 0
    best_val_loss: float = math.inf
    optimizer: dict[str, Any] | None = None
    run_state: dict[str, Any] | None = None

    def save(self, path: Path) -> None:
        save_file({f.name: getattr(self, f.name) for f in fields(self)}, path)  # asdict would copy every tensor

    @classmethod
    def load(cls, path: Path, map_location: str | torch.device = "cpu") -> "Checkpoint":
        """The checkpoint at path, in today's form; UserError for a file that is not one."""
        saved = read_file(path, map_location)
        required = ("model", "config", "tokenizer", "step")
        if not isinstance(saved, dict) or any(key not in saved for key in required):
            raise UserError(f"{path} is not a checkpoint of this project (it lacks {', '.join(required)})")
        if problem := shape_problem(saved):
            raise UserError(f"{path} is not a checkpoint of this project ({problem}); use one train.py saved, as it "
                            "saved it")
        known = {f.name for f in fields(cls)}
        return upgrade(cls(**{key: value for key, value in saved.items() if key in known}))

    def build_tokenizer(self) -> Tokenizer:
        """The run's tokenizer; UserError where the saved one is none this version builds (a file
        edited by hand, say)."""
        cache_dir = Path(self.config.get("data", {}).get("cache_dir", ".cache"))  # tokenizer=gpt2's files live there
        try:
            return tokenizer_from_state(self.tokenizer, cache_dir)
        except (KeyError, TypeError, ValueError) as err:
            raise UserError(f"the checkpoint's tokenizer is not one this version can build ({described(err)}); use a "
                            "checkpoint train.py saved, as it saved it") from err

    def build_model(self) -> tuple[GPT, Tokenizer]:
        """The trained model (on the CPU, in train mode) and its tokenizer; UserError where the saved
        config or tokenizer describes none this version builds (a file edited by hand, say)."""
        tokenizer = self.build_tokenizer()
        if "model" not in self.config:
            raise UserError("the checkpoint's config has no model group; use a checkpoint train.py saved, as it saved it")
        try:  # the values of its model group, which GPT checks as it is built
            model = build_model(self.config["model"], tokenizer.vocab_size)
        except (TypeError, ValueError) as err:
            raise UserError(f"the checkpoint's config does not describe a model this version can build "
                            f"({described(err)}); use a checkpoint train.py saved, as it saved it") from err
        load_weights(model, self.model)
        return model, tokenizer


def described(err: Exception) -> str:
    """An exception's first line, for a one-line error: a KeyError as the key that is missing."""
    if isinstance(err, KeyError):
        return f"no {err}"
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def shape_problem(saved: dict[str, Any]) -> str | None:
    """What is not as train.py writes it in a checkpoint's top-level values (a file edited by hand), else None."""
    for key, kind in (("model", dict), ("config", dict), ("tokenizer", dict), ("step", int)):
        if not isinstance(saved[key], kind) or isinstance(saved[key], bool):  # (a state_dict is an OrderedDict)
            return f"its {key} is {type(saved[key]).__name__}, not {kind.__name__}"
    groups = ("model", "data", "tokenizer", "optim", "train")  # (beside top-level values: resume, init_from, ...)
    if group := next((name for name in groups if name in saved["config"] and not isinstance(saved["config"][name], dict)),
                     None):
        return f"its config's {group} is {type(saved['config'][group]).__name__}, not a group of settings"
    for key in ("optimizer", "run_state"):
        if saved.get(key) is not None and not isinstance(saved[key], dict):
            return f"its {key} is {type(saved[key]).__name__}, not dict"
    return None


def upgrade(checkpoint: Checkpoint) -> Checkpoint:
    """An older checkpoint in today's form: config keys added since (ADDED_KEYS, and its corpus's
    ADDED_CORPUS_KEYS), one RNG state per rank (older runs saved one dict), the number of processes
    that saved it (older: 1), no fp16 loss scale, and no hash of the corpus's text."""
    corpus_keys = ADDED_CORPUS_KEYS.get(checkpoint.config.get("data", {}).get("source"), {})
    for dotted, value in {**ADDED_KEYS, **corpus_keys}.items():
        group, key = dotted.split(".")
        if group in checkpoint.config and key not in checkpoint.config[group]:
            checkpoint.config[group][key] = value
    if checkpoint.run_state is not None:
        run_state = checkpoint.run_state
        checkpoint.run_state = {**run_state, "world_size": run_state.get("world_size", 1),
                                "grad_scaler": run_state.get("grad_scaler") or None, "text_key": run_state.get("text_key")}
        if "rng" in run_state and not isinstance(run_state["rng"], list):  # (none at all: restore says so)
            checkpoint.run_state["rng"] = [run_state["rng"]]
    return checkpoint


def model_spec(group: Mapping[str, Any]) -> GPTConfig:
    """The model's shape from the `model` config group as plain values (a checkpoint's config), its
    vocab_size left to the tokenizer; a key missing from an older checkpoint's config keeps GPTConfig's default."""
    def plain(value: Any) -> Any:
        if isinstance(value, Mapping):  # model.rope_scaling
            return dict(value)
        return value.value if isinstance(value, Enum) else value
    return GPTConfig(**{key: plain(group[key]) for key in MODEL_KEYS if key in group})


def build_model(shape: GPTConfig | Mapping[str, Any], vocab_size: int) -> GPT:
    """A new GPT of this shape (a spec, or the `model` group as plain values) over vocab_size tokens."""
    spec = shape if isinstance(shape, GPTConfig) else model_spec(shape)
    return GPT(replace(spec, vocab_size=vocab_size))


def load_weights(model: GPT, weights: dict[str, torch.Tensor]) -> None:
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:
        detail = str(err).strip().splitlines()[1].strip() if len(str(err).strip().splitlines()) > 1 else "shapes differ"
        raise UserError(f"the checkpoint's weights do not fit the model its config describes ({detail})") from None


def save_file(checkpoint: dict[str, Any], path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            writer = WriteErrorKeeper(f)
            try:
                torch.save(checkpoint, writer)
            except RuntimeError:
                # torch's C++ writer holds the writer, where the error's frames must not stay: they hold the
                # callers' objects (a torchrun run's process group), and the collector cannot free them from there
                error, writer.error = writer.error, None
                if error is None:
                    raise
                raise error from None
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:  # a full disk, a file size limit, a folder gone read-only
        tmp.unlink(missing_ok=True)
        kept = f"the previous {path.name} is kept" if path.exists() else f"no {path.name} was written"
        full = err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        fix = ("Free some disk space and resume" if full else
               f"Check that {os.path.relpath(path.parent)} is still there and this user may write in it, and resume")
        raise UserError(f"could not save {os.path.relpath(path)} ({err.strerror or err}); {kept}. {fix}") from None


class WriteErrorKeeper:
    """A file's write() that keeps the OSError it raised: torch.save swallows it and then fails
    with an unrelated RuntimeError ("unexpected pos"), which would hide a full disk."""

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.error = file, None

    def write(self, data: bytes) -> int:
        try:
            return self.file.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        self.file.flush()


def read_file(path: Path, map_location: str | torch.device, mmap: bool = False) -> Any:
    try:  # a device that is not one, or not here: said as such, not as a broken file
        device = torch.device(map_location)
    except (RuntimeError, TypeError):
        raise UserError(f"map_location={map_location!r} is not a device: give 'cpu', 'cuda', 'cuda:1' or 'mps'") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"map_location={map_location!r}, but PyTorch sees no CUDA GPU here: load onto 'cpu'")
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise UserError(f"{path} does not exist: give the path of a checkpoint file (ckpt_best.pt or ckpt_last.pt "
                        "in a run dir)") from None
    except IsADirectoryError:
        raise UserError(f"{path} is a folder, not a checkpoint file: give the ckpt_best.pt or ckpt_last.pt in it") from None
    except PermissionError as err:  # the file is there, but not for us to read
        raise UserError(f"could not read {path} ({err.strerror or err})") from None
    except Exception as err:  # a broken file fails in many ways (zip, unpickler, storage): all mean the same
        if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; PyTorch's own words would mislead
            raise UserError(f"{path} is not a readable checkpoint (not a zip file, as torch.save writes); "
                            "it may be truncated or not a checkpoint") from None
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        if len(first_line) > 120:
            first_line = first_line[:120].rsplit(" ", 1)[0] + " ..."
        detail = f"{type(err).__name__}: {first_line}" if first_line else type(err).__name__
        raise UserError(f"{path} is not a readable checkpoint ({detail}); it may be truncated or not a checkpoint") from None
