"""Hugging Face GPT-2 folders (config.json + model.safetensors): their shape as a GPTConfig, their
weights into our GPT, our GPT out as such a folder, and a Hub repo id turned into a local folder."""

import json
import math
import struct
from pathlib import Path
from typing import Any, BinaryIO

import torch
from safetensors.torch import save_file
from torch import nn

from model.gpt import GPT, GPTConfig
from user_error import UserError

CONFIG, WEIGHTS, PICKLE = "config.json", "model.safetensors", "pytorch_model.bin"
HUB_FILES = ["config.json", "model.safetensors", "vocab.json", "merges.txt", "tokenizer.json",
             "tokenizer_config.json", "generation_config.json"]
HUB_TIMEOUT_S = 10  # huggingface_hub waits without limit for a Hub that does not answer

# GPT2Config's defaults, for keys a config.json leaves out.
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
    "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.1, "embd_pdrop": 0.1,
    "attn_pdrop": 0.1, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False, "add_cross_attention": False, "tie_word_embeddings": True,
}
LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which model/gpt.py uses
# HF's names for GELU: "gelu_new" and "gelu_pytorch_tanh" are the tanh approximation GPT-2 was trained with.
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu2": "relu2"}
EXPORTED_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu2": "relu2"}

BLOCK_NAMES = {  # a block's tensors: HF's name under transformer.h.{i}. -> ours under blocks.{i}.
    "ln_1.weight": "ln_1.weight", "ln_1.bias": "ln_1.bias",
    "attn.c_attn.weight": "attn.qkv.weight", "attn.c_attn.bias": "attn.qkv.bias",
    "attn.c_proj.weight": "attn.proj.weight", "attn.c_proj.bias": "attn.proj.bias",
    "ln_2.weight": "ln_2.weight", "ln_2.bias": "ln_2.bias",
    "mlp.c_fc.weight": "mlp.fc.weight", "mlp.c_fc.bias": "mlp.fc.bias",
    "mlp.c_proj.weight": "mlp.proj.weight", "mlp.c_proj.bias": "mlp.proj.bias",
}
# HF's Conv1D keeps its weight as (in, out), nn.Linear as (out, in): these cross transposed.
CONV1D_WEIGHTS = ("c_attn.weight", "c_proj.weight", "c_fc.weight")
# Causal-mask buffers that transformers before 4.3x saved into the file (the gpt2 repo's has them).
IGNORED = ("attn.bias", "attn.masked_bias")
SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def hf_names(config: GPTConfig) -> dict[str, str]:
    """GPT2LMHeadModel's tensor names -> ours, biases included (a bias=False GPT has none of its own)."""
    names = {"transformer.wte.weight": "tok_emb.weight", "transformer.wpe.weight": "pos_emb.weight"}
    for i in range(config.n_layer):
        names |= {f"transformer.h.{i}.{hf}": f"blocks.{i}.{ours}" for hf, ours in BLOCK_NAMES.items()}
    names |= {"transformer.ln_f.weight": "ln_f.weight", "transformer.ln_f.bias": "ln_f.bias"}
    if not config.tie_head:
        names["lm_head.weight"] = "lm_head.weight"  # tied, HF leaves it out of the file
    return names


def read_hf_config(folder: Path) -> dict[str, Any]:
    """config.json of a Hugging Face folder, with GPT2Config's defaults for the keys it leaves out."""
    path = Path(folder) / CONFIG
    if not path.is_file():
        raise UserError(f"{folder} has no {CONFIG}: a Hugging Face GPT-2 folder holds {CONFIG} and {WEIGHTS}")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(f"{path} is not valid JSON ({error})") from None
    if not isinstance(config, dict):
        raise UserError(f"{path} holds {type(config).__name__}, not a JSON object of GPT-2's settings")
    return HF_DEFAULTS | config


def gpt_config_from_hf(
    folder: Path, vocab_size: int | None = None, block_size: int | None = None, dropout: float | None = None
) -> tuple[GPTConfig, list[str]]:
    """The GPTConfig of a Hugging Face GPT-2 folder, and notes on what the overrides changed.

    vocab_size must match the weights; a smaller block_size crops the learned positions; dropout
    (None: the folder's resid_pdrop) applies to attention, residual branches and embeddings alike."""
    hf = read_hf_config(folder)
    path = Path(folder) / CONFIG

    def refuse(key: str, need: str) -> UserError:
        return UserError(f"{path} has {key}={json.dumps(hf.get(key))}: {need}")

    if hf.get("model_type") != "gpt2":
        raise refuse("model_type", "this project reads GPT-2 models only (model_type gpt2)")
    for key in ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size"):
        if not (isinstance(hf[key], int) and hf[key] >= 1):
            raise refuse(key, "GPT-2 needs a whole number of at least 1 here")
    n_embd = hf["n_embd"]
    if n_embd % hf["n_head"]:
        raise refuse("n_head", f"it must divide n_embd={n_embd}")
    if hf["activation_function"] not in ACTIVATIONS:
        raise refuse("activation_function", f"this project's MLP has {', '.join(ACTIVATIONS)}")
    if hf["layer_norm_epsilon"] != LAYER_NORM_EPS:
        raise refuse("layer_norm_epsilon", f"this project's LayerNorm uses {LAYER_NORM_EPS} (GPT-2's)")
    if hf["n_inner"] not in (None, 4 * n_embd):
        raise refuse("n_inner", f"this project's MLP is 4 * n_embd = {4 * n_embd} wide (null in GPT-2's config)")
    for key, gpt2_value in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                            ("reorder_and_upcast_attn", False), ("add_cross_attention", False)):
        if hf[key] is not gpt2_value:
            raise refuse(key, f"this project's attention is GPT-2's, which has {key}={json.dumps(gpt2_value)}")

    notes = []
    if vocab_size is not None and vocab_size != hf["vocab_size"]:
        raise UserError(f"vocab_size={vocab_size} contradicts {path}, whose weights have {hf['vocab_size']} tokens; "
                        f"leave it out: the vocabulary comes from the folder")
    n_positions = hf["n_positions"]
    if block_size is None:
        block_size = n_positions
    elif block_size > n_positions:
        raise UserError(f"model.block_size={block_size} is longer than the {n_positions} positions the weights in "
                        f"{folder} learned; use model.block_size={n_positions} or less")
    elif block_size < n_positions:
        notes.append(f"model.block_size={block_size} crops GPT-2's {n_positions} positions to {block_size}")
    if dropout is None:
        dropout = hf["resid_pdrop"]
        if hf["attn_pdrop"] != dropout or hf["embd_pdrop"] != dropout:
            notes.append(f"model.dropout={dropout} (the folder's resid_pdrop) applies to attention and embeddings too")

    config = GPTConfig(
        vocab_size=hf["vocab_size"], block_size=block_size, n_layer=hf["n_layer"], n_head=hf["n_head"],
        n_embd=n_embd, dropout=dropout, bias=True, attention="sdpa", pos="learned", norm="layernorm",
        mlp=ACTIVATIONS[hf["activation_function"]], tie_head=bool(hf["tie_word_embeddings"]), qk_norm=False,
        smear=False,
    )
    return config, notes


def check_hf_folder(folder: Path) -> None:
    """UserError naming every file that a Hugging Face GPT-2 folder needs and folder lacks."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder: a Hugging Face GPT-2 folder holds {CONFIG} and {WEIGHTS}")
    if not (folder / WEIGHTS).is_file() and (folder / PICKLE).is_file():
        raise UserError(f"{folder} holds {PICKLE} but no {WEIGHTS}: only safetensors are read, never a pickle "
                        f"(loading one can run any code); convert it once where you trust it, e.g. "
                        f"AutoModelForCausalLM.from_pretrained(folder).save_pretrained(folder) writes {WEIGHTS}")
    missing = [name for name in (CONFIG, WEIGHTS) if not (folder / name).is_file()]
    if missing:
        raise UserError(f"{folder} has no {' and no '.join(missing)}: a Hugging Face GPT-2 folder holds "
                        f"{CONFIG} and {WEIGHTS}")


def gpt_from_hf(
    folder: Path, vocab_size: int | None = None, block_size: int | None = None, dropout: float | None = None
) -> tuple[GPT, list[str]]:
    """Our GPT with the weights of a Hugging Face GPT-2 folder, and gpt_config_from_hf's notes."""
    check_hf_folder(folder)
    config, notes = gpt_config_from_hf(folder, vocab_size, block_size, dropout)
    with torch.device("meta"):  # no memory for weights that the file's would replace at once
        model = GPT(config)
    load_hf_weights(folder, model)
    return model, notes


def load_hf_weights(folder: Path, model: GPT) -> None:
    """Fill model (its parameters on the meta device, or real ones) from folder's model.safetensors.

    Every name and shape is checked against model before any tensor is read. Then each tensor's
    bytes are read from the file straight into the memory of its parameter, one tensor at a time,
    so that memory holds one copy of the weights. (safetensors' own reader maps the file, and every
    page it reads stays in this process's resident memory while the file is open: two copies.)"""
    check_hf_folder(folder)
    path = Path(folder) / WEIGHTS
    header, data_start = read_safetensors_header(path)
    parameters = dict(model.named_parameters(remove_duplicate=False))  # tied: lm_head.weight too
    plan = _load_plan(path, header, model.config, parameters)
    # A tensor to transpose (Conv1D) or convert passes through one scratch buffer, reused: a new
    # temporary per tensor leaves glibc's heap fragmented, 0.4 GB over one copy at gpt2-medium.
    staged = [(name, shape) for name, ours, shape in plan if _needs_staging(name, header, parameters[ours])]
    scratch = torch.empty(max((_nbytes(header, name, shape) for name, shape in staged), default=0), dtype=torch.uint8)
    with open(path, "rb") as file:
        for name, ours, shape in plan:
            parameter = parameters[ours]
            in_place = parameter.device.type == "cpu"  # else a new tensor: on meta, or to copy to a GPU
            destination = parameter.data if in_place else torch.empty(parameter.shape, dtype=parameter.dtype)
            file.seek(data_start + header[name]["data_offsets"][0])  # rows past shape (cropped positions) stay unread
            if _needs_staging(name, header, parameter):
                source = scratch[: _nbytes(header, name, shape)].view(SAFETENSORS_DTYPES[header[name]["dtype"]])
                source = _read_into(file, source.view(shape), path, name)
                destination.copy_(source.t() if name.endswith(CONV1D_WEIGHTS) else source)  # (in, out) -> (out, in)
            else:
                _read_into(file, destination, path, name)
            if parameter.is_meta:
                module_name, _, attribute = ours.rpartition(".")
                setattr(model.get_submodule(module_name), attribute, nn.Parameter(destination))
            elif not in_place:
                parameter.data.copy_(destination)
    if model.config.tie_head:
        model.lm_head.weight = model.tok_emb.weight


def _needs_staging(name: str, header: dict[str, dict[str, Any]], parameter: nn.Parameter) -> bool:
    """Whether the file's tensor name cannot be read as it is into parameter's memory."""
    return name.endswith(CONV1D_WEIGHTS) or SAFETENSORS_DTYPES[header[name]["dtype"]] != parameter.dtype


def _nbytes(header: dict[str, dict[str, Any]], name: str, shape: list[int]) -> int:
    return math.prod(shape) * SAFETENSORS_DTYPES[header[name]["dtype"]].itemsize


def _read_into(file: BinaryIO, tensor: torch.Tensor, path: Path, name: str) -> torch.Tensor:
    """tensor (contiguous, on the CPU) filled with the file's next tensor.nbytes bytes."""
    if file.readinto(tensor.reshape(-1).view(torch.uint8).numpy()) != tensor.nbytes:
        raise UserError(f"{path} ends inside tensor {name}: the file is cut short; download it again")
    return tensor


def read_safetensors_header(path: Path) -> tuple[dict[str, dict[str, Any]], int]:
    """A safetensors file's tensor entries (name -> dtype, shape, data_offsets) and where their data starts.

    The format: an 8-byte little-endian header length, a JSON header, then the tensors' bytes."""
    size = path.stat().st_size
    with open(path, "rb") as file:
        prefix = file.read(8)
        length = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else size
        if length > size - 8:
            raise UserError(f"{path} is not a safetensors file (its header would end past its {size} bytes)")
        try:
            header = json.loads(file.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise UserError(f"{path} is not a safetensors file (its header is not JSON: {error})") from None
    header.pop("__metadata__", None)
    return header, 8 + length


def _load_plan(
    path: Path, header: dict[str, dict[str, Any]], config: GPTConfig, parameters: dict[str, nn.Parameter]
) -> list[tuple[str, str, list[int]]]:
    """(name in the file, our name, shape to read) for every tensor to load, in file order;
    UserError on the first tensor missing, unexpected or of the wrong shape."""
    expected = {hf: ours for hf, ours in hf_names(config).items() if ours in parameters}
    found = {}  # our name -> the file's name, which may lack GPT2LMHeadModel's "transformer." prefix
    for name in header:
        full_name = name if name.startswith(("transformer.", "lm_head.")) else f"transformer.{name}"
        if full_name in expected:
            found[expected[full_name]] = name
        elif not (full_name.endswith(IGNORED) or (full_name == "lm_head.weight" and config.tie_head)):
            shape = tuple(header[name]["shape"])
            raise UserError(f"{path} holds tensor {name} {shape}, which a GPT-2 of its config.json's shape "
                            f"({config.n_layer} layers, n_embd={config.n_embd}) does not have")
    missing = [hf for hf, ours in expected.items() if ours not in found]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UserError(f"{path} lacks tensor {missing[0]}{more}, which a GPT-2 of its config.json's shape has")

    plan = []
    for ours, name in found.items():
        entry = header[name]
        need = list(parameters[ours].shape)
        if name.endswith(CONV1D_WEIGHTS):
            need.reverse()
        have = list(entry["shape"])
        # A longer position table is cropped: its first block_size rows are read.
        crops = ours == "pos_emb.weight" and len(have) == 2 and have[0] >= need[0] and have[1] == need[1]
        if have != need and not crops:
            raise UserError(f"{path} holds tensor {name} of shape {tuple(have)}, but its config.json's GPT-2 "
                            f"needs {tuple(need)}")
        if entry["dtype"] not in SAFETENSORS_DTYPES:
            raise UserError(f"{path} holds tensor {name} as {entry['dtype']}; only floats "
                            f"({', '.join(SAFETENSORS_DTYPES)}) can be weights here")
        begin, end = entry["data_offsets"]
        if end - begin < math.prod(need) * SAFETENSORS_DTYPES[entry["dtype"]].itemsize:
            raise UserError(f"{path} holds tensor {name} in fewer bytes than its shape {tuple(have)} needs")
        plan.append((name, ours, need))
    plan.sort(key=lambda item: header[item[0]]["data_offsets"][0])  # read the file front to back
    return plan


def export_blockers(config: GPTConfig) -> list[str]:
    """One phrase per option of config that GPT2LMHeadModel cannot represent; empty if it maps."""
    blockers = []
    if config.pos != "learned":
        blockers.append(f"model.pos={config.pos} (GPT-2 learns position embeddings)")
    if config.norm != "layernorm":
        blockers.append(f"model.norm={config.norm} (GPT-2 uses LayerNorm)")
    if config.qk_norm:
        blockers.append("model.qk_norm=true (GPT-2 does not normalise queries and keys)")
    if config.smear:
        blockers.append("model.smear=true (GPT-2 has no smear)")
    return blockers


def hf_files_for(model: GPT, eot_id: int) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """config.json's contents and model.safetensors' tensors (HF's names) of model as a GPT2LMHeadModel;
    eot_id, the tokenizer's end-of-text token, is GPT-2's bos and eos. A bias=False model gets zero biases."""
    config = model.config
    blockers = export_blockers(config)
    if blockers:
        raise UserError(f"this model cannot be written as a Hugging Face GPT-2: {'; '.join(blockers)}")
    hf_config = {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": config.vocab_size,
        "n_positions": config.block_size, "n_embd": config.n_embd, "n_layer": config.n_layer,
        "n_head": config.n_head, "n_inner": None, "activation_function": EXPORTED_ACTIVATIONS[config.mlp],
        "layer_norm_epsilon": LAYER_NORM_EPS, "resid_pdrop": config.dropout, "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout, "scale_attn_weights": True, "tie_word_embeddings": config.tie_head,
        "bos_token_id": eot_id, "eos_token_id": eot_id, "dtype": "float32",
    }
    ours = model.state_dict()
    tensors = {}
    for hf, name in hf_names(config).items():
        if name in ours:
            tensor = ours[name].detach().to("cpu", torch.float32)
            tensors[hf] = tensor.t().contiguous() if hf.endswith(CONV1D_WEIGHTS) else tensor.contiguous()
        else:  # a bias of a bias=False model: zero adds nothing, exactly
            tensors[hf] = torch.zeros(ours[name.removesuffix("bias") + "weight"].shape[0])
    return hf_config, tensors


def save_hf_gpt2(model: GPT, folder: Path, eot_id: int) -> None:
    """Write model into folder as config.json and model.safetensors that GPT2LMHeadModel loads."""
    hf_config, tensors = hf_files_for(model, eot_id)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / WEIGHTS, metadata={"format": "pt"})  # transformers wants format pt
    (folder / CONFIG).write_text(json.dumps(hf_config, indent=2) + "\n", encoding="utf-8")


def resolve_pretrained(name_or_folder: str | Path, cache_dir: Path | None = None) -> Path:
    """A local Hugging Face GPT-2 folder as it is (checked), or a Hub repo id's files, downloaded
    once into huggingface_hub's cache (HF_HOME, HF_HUB_OFFLINE respected) and the folder they are in."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id  # the Hub's library only when needed

    folder = Path(name_or_folder).expanduser()
    try:
        validate_repo_id(str(name_or_folder))
        is_repo_id = not folder.is_dir()
    except HFValidationError:
        is_repo_id = False
    if not is_repo_id:
        if not folder.exists():
            raise UserError(f"init_from={name_or_folder} is neither a folder here nor a Hugging Face Hub repo id "
                            f"(like gpt2 or openai-community/gpt2)")
        check_hf_folder(folder)
        return folder
    return _download(str(name_or_folder), cache_dir)


def _download(repo_id: str, cache_dir: Path | None) -> Path:
    """The folder in huggingface_hub's cache holding repo_id's files, downloaded if need be."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.utils import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        HfApi().repo_info(repo_id, timeout=HUB_TIMEOUT_S)
        online = True
    except GatedRepoError:
        raise UserError(f"init_from={repo_id} is a gated model on the Hugging Face Hub: accept its terms on "
                        f"huggingface.co, then log in with `hf auth login`") from None
    except RepositoryNotFoundError:
        raise UserError(f"init_from={repo_id}: no such model on the Hugging Face Hub (or it is private: "
                        f"log in with `hf auth login`)") from None
    except Exception:  # no connection, a timeout, the Hub down or HF_HUB_OFFLINE=1: the cache may still hold it
        online = False
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES, cache_dir=cache_dir,
                                      local_files_only=not online))
    except LocalEntryNotFoundError:
        raise UserError(
            f"init_from={repo_id} is not a folder here and needs the Hugging Face Hub once, which cannot be reached "
            f"(and its cache does not hold {repo_id}); nothing was written. Get the folder another way: on a machine "
            f"with internet, `hf download {repo_id} config.json model.safetensors vocab.json merges.txt "
            f"--local-dir <folder>`, copy <folder> here, then init_from=<folder>"
        ) from None
