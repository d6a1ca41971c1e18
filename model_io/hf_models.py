"""Hugging Face model folders in and out: config.json and model.safetensors (or its shards) read into our
GPT and written from it, and a Hub repo id turned into a local folder. config.json's model_type picks the
architecture (ARCHITECTURES); what each calls its settings and its tensors is in hf_gpt2.py and hf_llama.py."""

import json
import math
import stat
import struct
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO, NamedTuple

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from data.hf_tokenizer import read_json
from model.gpt import GPT, GPTConfig
from model_io import hf_gpt2, hf_llama
from user_error import UserError

CONFIG, WEIGHTS, INDEX, PICKLE = "config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"
LAYOUT = (f"a Hugging Face model folder holds {CONFIG} and {WEIGHTS} (or {INDEX} and its shards); "
          "give one that transformers' save_pretrained wrote")
HUB_FILES = [CONFIG, WEIGHTS, INDEX, "model-*-of-*.safetensors", "vocab.json", "merges.txt", "tokenizer.json",
             "tokenizer_config.json", "generation_config.json"]
# What `hf download` fetches for a folder init_from reads: every HUB_FILES name matches one. (One
# --include per pattern: the hf command line takes one value each, and reads more as file names.)
DOWNLOAD_PATTERNS = ("*.json", "*.safetensors", "merges.txt")
HUB_TIMEOUT_S = 10  # huggingface_hub waits without limit for a Hub that does not answer
SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
# Our tables that a file may hold longer: their first rows are read. Positions past model.block_size, and
# vocabulary rows past the tokenizer's last id (Qwen3 pads its 151,669 tokens to 151,936 rows).
CROPPABLE = ("pos_emb.weight", "tok_emb.weight", "lm_head.weight")
# A context past this many positions is said when a run keeps it whole: GPT-2's 1,024 is not, the
# 8,192 of SmolLM2 and Llama 3 and the 32,768 of Qwen3 are (each step trains on batch x context tokens).
LONG_CONTEXT = 2048


class Architecture(NamedTuple):
    names: ModuleType  # hf_gpt2 or hf_llama: its settings and tensor names, both ways
    name: str  # as messages call it
    hf_class: str  # transformers' class: config.json's "architectures"
    preset: str  # the experiment that trains a run of this shape


ARCHITECTURES = {  # config.json's model_type -> its Architecture; export.py tries them in this order
    "gpt2": Architecture(hf_gpt2, "GPT-2", "GPT2LMHeadModel", "gpt2_shape"),
    "llama": Architecture(hf_llama, "Llama", "LlamaForCausalLM", "llama_shape"),
    "qwen3": Architecture(hf_llama, "Qwen3", "Qwen3ForCausalLM", "qwen3_shape"),
    "mistral": Architecture(hf_llama, "Mistral", "MistralForCausalLM", "mistral_shape"),
}


class Read(NamedTuple):
    """One tensor of a safetensors file, and where in our parameters it goes."""

    name: str  # the file's name for it
    path: Path  # the file
    offset: int  # where its bytes start in the file
    dtype: torch.dtype  # as stored
    shape: list[int]  # what is read: its first rows only when our table is shorter; (in, out) when transposed
    ours: str  # our parameter's name
    rows: slice  # the rows of our parameter it fills
    transpose: bool  # stored (in, out), as GPT-2's Conv1D: nn.Linear's (out, in) crosses transposed

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def read_hf_config(folder: Path) -> tuple[dict[str, Any], str]:
    """config.json of a Hugging Face folder as it is, and its model_type (one of ARCHITECTURES)."""
    path = Path(folder) / CONFIG
    if not path.is_file():
        raise UserError(f"{folder} has no {CONFIG}: {LAYOUT}")
    config = read_json(path)
    if not isinstance(config, dict):
        raise UserError(f"{path} holds {type(config).__name__}, not a JSON object of the model's settings")
    model_type = config.get("model_type")
    if model_type not in ARCHITECTURES:
        classes = ", ".join(f"{architecture.hf_class} ({name})" for name, architecture in ARCHITECTURES.items())
        raise UserError(f"{path} has model_type={json.dumps(model_type)}: this project reads {classes}; "
                        "start from one of those, or train from scratch without init_from")
    return config, model_type


def gpt_config_from_hf(
    folder: Path, vocab_size: int | None = None, block_size: int | None = None, dropout: float | None = None
) -> tuple[GPTConfig, list[str]]:
    """The GPTConfig of a Hugging Face folder, and notes on what the overrides changed.

    vocab_size must match the weights; a smaller block_size crops the context (and GPT-2's learned
    positions); dropout None takes the folder's."""
    hf, model_type = read_hf_config(folder)
    path = Path(folder) / CONFIG
    architecture = ARCHITECTURES[model_type]

    def refuse(key: str, value: Any, need: str) -> UserError:
        if key.split(".")[0] not in hf:  # not the file's value: the one transformers fills in
            return UserError(f"{path} leaves {key} out, and transformers' default for a {architecture.name}, "
                             f"{json.dumps(value)}, does not fit: {need}; set {key} there")
        return UserError(f"{path} has {key}={json.dumps(value)}: {need}")

    config, notes = architecture.names.gpt_config(hf, model_type, refuse, dropout)
    if vocab_size is not None and vocab_size != config.vocab_size:
        raise UserError(f"vocab_size={vocab_size} contradicts {path}, whose weights have {config.vocab_size} tokens; "
                        f"leave it out: the vocabulary comes from the folder")
    context = config.block_size
    if block_size is not None and block_size > context:
        raise UserError(f"model.block_size={block_size} is longer than the {context} positions the weights in "
                        f"{folder} learned; use model.block_size={context} or less")
    if block_size is not None and block_size < context:
        notes.append(f"model.block_size={block_size} crops {architecture.name}'s {context} positions to {block_size}")
        config = replace(config, block_size=block_size)
    elif block_size is None and context > LONG_CONTEXT:  # Qwen3's 32,768 would look like a hang on a CPU
        notes.append(f"each sequence is the weights' whole context, {context:,} tokens; model.block_size crops it "
                     f"(e.g. model.block_size={LONG_CONTEXT // 2}: shorter sequences, faster steps)")
    return config, notes


def check_hf_folder(folder: Path) -> None:
    """UserError naming every file that a Hugging Face model folder needs and folder lacks."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder: {LAYOUT}")
    has_weights = (folder / WEIGHTS).is_file() or (folder / INDEX).is_file()
    if not has_weights and (folder / PICKLE).is_file():
        raise UserError(f"{folder} holds {PICKLE} but no {WEIGHTS}: only safetensors are read, never a pickle "
                        f"(loading one can run any code); convert it once where you trust it, e.g. "
                        f"AutoModelForCausalLM.from_pretrained(folder).save_pretrained(folder) writes {WEIGHTS}")
    missing = [name for name, there in ((CONFIG, (folder / CONFIG).is_file()), (WEIGHTS, has_weights)) if not there]
    if missing:
        raise UserError(f"{folder} has no {' and no '.join(missing)}: {LAYOUT}")


def gpt_from_hf(
    folder: Path, vocab_size: int | None = None, block_size: int | None = None, dropout: float | None = None
) -> tuple[GPT, list[str]]:
    """Our GPT with the weights of a Hugging Face folder, and gpt_config_from_hf's notes."""
    check_hf_folder(folder)
    config, notes = gpt_config_from_hf(folder, vocab_size, block_size, dropout)
    with torch.device("meta"):  # no memory for weights that the file's would replace at once
        model = GPT(config)
    load_hf_weights(folder, model)
    return model, notes


def load_hf_weights(folder: Path, model: GPT) -> None:
    """Fill model (its parameters on the meta device, or real ones) from folder's model.safetensors or shards.

    Every name and shape is checked against model before any tensor is read. Then each tensor's bytes are
    read from the file straight into the memory of its parameter (q, k and v into their rows of attn.qkv),
    one parameter at a time, so that memory holds one copy of the weights. (safetensors' own reader maps
    the file, and every page it reads stays in this process's resident memory while the file is open: two
    copies.)"""
    folder = Path(folder)
    check_hf_folder(folder)
    hf, model_type = read_hf_config(folder)
    parameters = dict(model.named_parameters(remove_duplicate=False))  # tied: lm_head.weight too
    plan, tied_copy = _load_plan(folder, ARCHITECTURES[model_type], model.config, parameters, hf.get("vocab_size"))
    # A tensor to transpose (Conv1D) or convert passes through one scratch buffer, reused: a new
    # temporary per tensor leaves glibc's heap fragmented, 0.4 GB over one copy at gpt2-medium.
    staged = [read for read in plan if _needs_staging(read, parameters[read.ours])]
    scratch = torch.empty(max((read.nbytes for read in staged), default=0), dtype=torch.uint8)
    by_parameter: dict[str, list[Read]] = {}  # in file order, so that reading runs front to back
    for read in plan:
        by_parameter.setdefault(read.ours, []).append(read)
    with ExitStack() as files:
        opened: dict[Path, BinaryIO] = {}
        for ours, reads in by_parameter.items():
            parameter = parameters[ours]
            in_place = parameter.device.type == "cpu"  # else a new tensor: on meta, or to copy to a GPU
            destination = parameter.data if in_place else torch.empty(parameter.shape, dtype=parameter.dtype)
            for read in reads:
                if read.path not in opened:
                    opened[read.path] = files.enter_context(open(read.path, "rb"))
                file = opened[read.path]
                file.seek(read.offset)  # rows past shape (cropped tables) stay unread
                target = destination[read.rows]  # whole rows of a contiguous tensor: contiguous too
                if _needs_staging(read, parameter):
                    source = _read_into(file, scratch[: read.nbytes].view(read.dtype).view(read.shape), read)
                    target.copy_(source.t() if read.transpose else source)  # (in, out) -> (out, in)
                else:
                    _read_into(file, target, read)
            if parameter.is_meta:
                module_name, _, attribute = ours.rpartition(".")
                setattr(model.get_submodule(module_name), attribute, nn.Parameter(destination))
            elif not in_place:
                parameter.data.copy_(destination)
    if model.config.tie_head:
        if tied_copy is not None:
            _check_tied_head_copy(*tied_copy, folder, model.tok_emb.weight)
        model.lm_head.weight = model.tok_emb.weight


def _check_tied_head_copy(path: Path, name: str, folder: Path, embedding: torch.Tensor) -> None:
    """A folder whose config.json ties the head to the embedding may still hold an lm_head.weight (name,
    in file path): a copy of the embedding is fine; a different one transformers leaves untied (with a
    warning), so it is refused here rather than silently replaced by the embedding."""
    with safe_open(path, framework="pt") as weights:
        head = weights.get_tensor(name)[: embedding.shape[0]].to(embedding.dtype)  # (vocab_size, n_embd)
    if not torch.equal(head, embedding.detach().cpu()):
        raise UserError(f"{path} holds an lm_head.weight that is not the embedding, while {CONFIG}'s "
                        "tie_word_embeddings is true (transformers then leaves them untied); set "
                        f"tie_word_embeddings to false in {folder / CONFIG} to read both")


def _needs_staging(read: Read, parameter: nn.Parameter) -> bool:
    """Whether read cannot go as it is into parameter's memory."""
    return read.transpose or read.dtype != parameter.dtype


def _read_into(file: BinaryIO, tensor: torch.Tensor, read: Read) -> torch.Tensor:
    """tensor (contiguous, on the CPU) filled with the file's next tensor.nbytes bytes."""
    if file.readinto(tensor.reshape(-1).view(torch.uint8).numpy()) != tensor.nbytes:
        raise UserError(f"{read.path} ends inside tensor {read.name}: the file is cut short; download it again")
    if not is_finite(tensor):
        raise UserError(f"{read.path} holds nan or inf in tensor {read.name}: these weights cannot run; download "
                        "the file again, or save it from a model whose weights are finite")
    return tensor


def is_finite(tensor: torch.Tensor) -> bool:
    """Whether every value of tensor is finite. A sum is finite only if every term is: summed in float64,
    a million values at a time, float32's and the half types' never overflow it (float64's can, and are
    checked one by one). torch.isfinite took 5 to 100 times as long on float32 and bfloat16 on 2-core VMs
    (2026-11-28), and makes temporaries larger than the table."""
    parts = tensor.reshape(-1).split(1 << 20)
    if tensor.dtype == torch.float64:
        return all(torch.isfinite(part).all() for part in parts)
    return all(math.isfinite(part.sum(dtype=torch.float64)) for part in parts)


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


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of folder's weights: model.safetensors, or the shards its index lists."""
    if (folder / WEIGHTS).is_file():
        return [folder / WEIGHTS]
    path = folder / INDEX
    index = read_json(path)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise UserError(f"{path} has no weight_map of tensor names to shard files: download it again")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if not isinstance(shard, str) or Path(shard).name != shard:
            raise UserError(f"{path} names {json.dumps(shard)} as a shard: a shard is a file beside it")
    missing = [shard for shard in shards if not (folder / shard).is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UserError(f"{folder} has no {missing[0]}{more}, a shard that {INDEX} lists: download it again")
    return [folder / shard for shard in shards]


def _load_plan(folder: Path, architecture: Architecture, config: GPTConfig, parameters: dict[str, nn.Parameter],
               file_vocab: object = None) -> tuple[list[Read], tuple[Path, str] | None]:
    """Every tensor to read, in file order, and where a tied model's file also holds an lm_head.weight
    (its file and name; None if it does not); UserError on the first tensor missing, unexpected or of
    the wrong shape, an embedding or head of other than config.json's vocab_size (file_vocab) among them."""
    names = architecture.names
    expected = {hf: place for hf, place in names.hf_names(config).items() if place[0] in parameters}
    found = {}  # the architecture's full name -> (the file's name, the file, its header entry, its data start)
    tied_copy = None
    for path in weight_files(folder):
        header, data_start = read_safetensors_header(path)
        for name, entry in header.items():
            full_name = names.full_name(name)
            if full_name in expected:
                found[full_name] = (name, path, entry, data_start)
            elif full_name == "lm_head.weight" and config.tie_head:
                tied_copy = (path, name)
            elif not full_name.endswith(names.IGNORED):
                raise UserError(f"{path} holds tensor {name} {tuple(entry['shape'])}, which a {architecture.name} of "
                                f"its config.json's shape ({config.n_layer} layers, n_embd={config.n_embd}) does not have")
    missing = [hf for hf in expected if hf not in found]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        source = folder / (WEIGHTS if (folder / WEIGHTS).is_file() else INDEX)
        raise UserError(f"{source} lacks tensor {missing[0]}{more}, which a {architecture.name} of its config.json's "
                        f"shape has")

    plan = []
    for full_name, (name, path, entry, data_start) in found.items():
        ours, rows = expected[full_name]
        transpose = full_name.endswith(names.TRANSPOSED)
        need = list(parameters[ours].detach()[rows].shape)
        if transpose:
            need.reverse()
        have = list(entry["shape"])
        crops = ours in CROPPABLE and len(have) == 2 and have[0] >= need[0] and have[1] == need[1]
        vocabulary = ours in ("tok_emb.weight", "lm_head.weight") and len(have) == 2
        if vocabulary and file_vocab is not None and have[0] != file_vocab:  # transformers refuses such a folder
            raise UserError(f"{path} holds tensor {name} of {have[0]} rows, but {folder / CONFIG} has vocab_size="
                            f"{json.dumps(file_vocab)}: the two must agree; if the tensor is right, set vocab_size to "
                            f"{have[0]} there")
        if vocabulary and have[0] < need[0] and have[1] == need[1]:
            raise UserError(f"{path} holds tensor {name} of {have[0]} rows, fewer than the {need[0]} ids of the "
                            f"folder's tokenizer: its last ids would have no row; resize the model to the tokenizer "
                            "in transformers (model.resize_token_embeddings(len(tokenizer))) and save the folder again")
        if have != need and not crops:
            raise UserError(f"{path} holds tensor {name} of shape {tuple(have)}, but its config.json's "
                            f"{architecture.name} needs {tuple(need)}")
        if entry["dtype"] not in SAFETENSORS_DTYPES:
            raise UserError(f"{path} holds tensor {name} as {entry['dtype']}; only floats "
                            f"({', '.join(SAFETENSORS_DTYPES)}) can be weights here")
        read = Read(name, path, data_start + entry["data_offsets"][0], SAFETENSORS_DTYPES[entry["dtype"]], need,
                    ours, rows, transpose)
        if entry["data_offsets"][1] - entry["data_offsets"][0] < read.nbytes:
            raise UserError(f"{path} holds tensor {name} in fewer bytes than its shape {tuple(have)} needs")
        plan.append(read)
    return sorted(plan, key=lambda read: (str(read.path), read.offset)), tied_copy  # read each file front to back


def export_blockers(config: GPTConfig) -> dict[str, list[str]]:
    """For each architecture (model_type), one phrase per option of config it cannot represent; an empty
    list for the one config fits."""
    return {model_type: architecture.names.export_blockers(config, model_type)
            for model_type, architecture in ARCHITECTURES.items()}


def export_model_type(config: GPTConfig) -> str | None:
    """The model_type whose transformers class holds config exactly, or None."""
    return next((model_type for model_type, blockers in export_blockers(config).items() if not blockers), None)


def export_refusal(config: GPTConfig) -> str:
    """Why config fits no architecture (one line): first the nearest, each option in its way with
    the reason and its preset, then what the others would need changed, by option alone."""
    blockers = export_blockers(config)
    nearest = min(blockers, key=lambda model_type: len(blockers[model_type]))
    architecture, them = ARCHITECTURES[nearest], "them" if len(blockers[nearest]) > 1 else "it"
    others = "; ".join(f"{ARCHITECTURES[model_type].name}: {', '.join(phrase.split(' (')[0] for phrase in phrases)} "
                       f"(experiment={ARCHITECTURES[model_type].preset})"
                       for model_type, phrases in blockers.items() if model_type != nearest)
    return (f"fits none of the architectures transformers loads with no custom code. The nearest is {architecture.name} "
            f"({architecture.hf_class}), which has no place for {'; '.join(blockers[nearest])}: train without {them}, or "
            f"from its preset, `.venv/bin/python train.py experiment={architecture.preset}`. Against the others: "
            f"{others}. docs/export.md says why for each")


def hf_files_for(model: GPT, bos_id: int, eos_id: int) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """config.json's contents and the safetensors' tensors (HF's names) of model as the architecture its
    shape fits; bos_id and eos_id are the tokenizer's. A GPT-2 with bias=False gets zero biases."""
    config = model.config
    model_type = export_model_type(config)
    if model_type is None:
        raise UserError(f"this model {export_refusal(config)}")
    architecture = ARCHITECTURES[model_type]
    hf_config = {"model_type": model_type, "architectures": [architecture.hf_class],
                 **architecture.names.hf_config(config, model_type), "bos_token_id": bos_id, "eos_token_id": eos_id,
                 "dtype": "float32"}
    ours = model.state_dict()
    tensors = {}
    for hf, (name, rows) in architecture.names.hf_names(config).items():
        if name not in ours:  # a bias of a bias=False GPT-2: zero adds nothing, exactly
            tensors[hf] = torch.zeros(ours[name.removesuffix("bias") + "weight"].shape[0])
            continue
        tensor = ours[name].detach()[rows].to("cpu", torch.float32)
        if hf.endswith(architecture.names.TRANSPOSED):
            tensor = tensor.t()
        # A copy where rows is a slice: q, k and v would share attn.qkv's memory, which safetensors refuses.
        tensors[hf] = tensor.contiguous() if rows == slice(None) else tensor.clone(memory_format=torch.contiguous_format)
    return hf_config, tensors


def save_hf_model(model: GPT, folder: Path, bos_id: int, eos_id: int) -> None:
    """Write model into folder as config.json and model.safetensors that transformers' AutoModelForCausalLM
    loads with no custom code."""
    hf_config, tensors = hf_files_for(model, bos_id, eos_id)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG).write_text(json.dumps(hf_config, indent=2) + "\n", encoding="utf-8")
    save_file(tensors, folder / WEIGHTS, metadata={"format": "pt"})  # transformers wants format pt
    # safetensors writes its file readable by its owner alone; give it the mode every other file gets.
    (folder / WEIGHTS).chmod(stat.S_IMODE((folder / CONFIG).stat().st_mode))


def download_command(repo_id: str, folder: str) -> str:
    """The `hf download` command line that fetches what init_from needs of repo_id into folder."""
    includes = " ".join(f"--include '{pattern}'" for pattern in DOWNLOAD_PATTERNS)
    return f"hf download {repo_id} {includes} --local-dir {folder}"


def resolve_pretrained(name_or_folder: str | Path, cache_dir: Path | None = None) -> Path:
    """A local Hugging Face folder as it is (checked), or a Hub repo id's files, downloaded once into
    huggingface_hub's cache (HF_HOME, HF_HUB_OFFLINE respected) and the folder they are in."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id  # the Hub's library only when needed

    if not str(name_or_folder).strip():  # init_from=$FOLDER with FOLDER unset: not the working folder
        raise UserError("init_from= is empty; give a Hugging Face folder or a Hub repo id (like gpt2), or leave "
                        "init_from out to train from scratch")
    folder = Path(name_or_folder).expanduser()
    try:
        validate_repo_id(str(name_or_folder))
        is_repo_id = not folder.exists()  # a file here (init_from=book.txt) is a slip, not a name on the Hub
    except HFValidationError:
        is_repo_id = False
    if not is_repo_id:
        if not folder.exists():
            raise UserError(f"init_from={name_or_folder} is neither a folder here nor a Hugging Face Hub repo id "
                            f"(like gpt2 or HuggingFaceTB/SmolLM2-135M); check the path")
        check_hf_folder(folder)
        return folder
    # owner/name where owner is a folder here may be a slip of the path (hf/lama beside hf/llama), or
    # a Hub id beside a folder of its owner's downloads: the Hub decides, and its refusals say both.
    owner_here = folder.parent != Path(".") and folder.parent.is_dir()
    slip = f" ({folder.parent} is a folder here, but holds no {folder.name})" if owner_here else ""
    return _download(str(name_or_folder), cache_dir, slip)


def _download(repo_id: str, cache_dir: Path | None, slip: str = "") -> Path:
    """The folder in huggingface_hub's cache holding repo_id's files, downloaded if need be. slip: what
    to add where the Hub cannot give it, when repo_id may be a mistyped path."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.utils import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        HfApi().repo_info(repo_id, timeout=HUB_TIMEOUT_S)
        online = True
    except GatedRepoError:
        raise UserError(f"init_from={repo_id} is a gated model on the Hugging Face Hub: accept its terms on "
                        f"huggingface.co, then log in with `hf auth login`") from None
    except RepositoryNotFoundError:
        raise UserError(f"init_from={repo_id}: no such model on the Hugging Face Hub{slip} (or it is private: "
                        f"log in with `hf auth login`)") from None
    except Exception:  # no connection, a timeout, the Hub down or HF_HUB_OFFLINE=1: the cache may still hold it
        online = False
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES, cache_dir=cache_dir,
                                      local_files_only=not online))
    except LocalEntryNotFoundError:
        raise UserError(
            f"init_from={repo_id} is not a folder here{slip} and needs the Hugging Face Hub once, which cannot be reached "
            f"(and its cache does not hold {repo_id}); nothing was written. Get the folder another way: on a machine "
            f"with internet, `{download_command(repo_id, '<folder>')}`, copy <folder> here, then init_from=<folder>"
        ) from None
