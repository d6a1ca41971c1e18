"""Hugging Face GPT-2 folders in and out (model_io/hf_gpt2.py, read and written by model_io/hf_models.py),
with transformers' GPT2LMHeadModel as the reference: tiny random GPT-2s written by save_pretrained, never the Hub."""

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from fnmatch import fnmatch
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from data.hf_tokenizer import pretrained_tokenizer
from model.generation import generate_tokens, lay_out_for_decoding
from model.gpt import GPT, GPTConfig
from model_io.hf_gpt2 import HF_DEFAULTS
from model_io.hf_models import (
    DOWNLOAD_PATTERNS,
    HUB_FILES,
    download_command,
    export_blockers,
    gpt_config_from_hf,
    gpt_from_hf,
    hf_files_for,
    is_finite,
    load_hf_weights,
    resolve_pretrained,
    save_hf_model,
)
from tests.helpers import ROOT, max_logit_gap, one_line_error, tiny_gpt2, tiny_gpt2_folder

VOCAB, POSITIONS, EOT = 301, 64, 300
TOLERANCE = 1e-5  # fp32: the same math in another order is ~2e-6 apart here, exact GELU ~2e-3


@pytest.fixture(scope="module")
def gpt2_weights_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_gpt2's config.json and model.safetensors, no tokenizer files."""
    folder = tmp_path_factory.mktemp("gpt2")
    tiny_gpt2().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def reference(gpt2_weights_folder: Path) -> GPT2LMHeadModel:
    return AutoModelForCausalLM.from_pretrained(gpt2_weights_folder).eval()


def tokens(length: int = 40, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(seed))  # (2, length)



def copy_folder(source: Path, destination: Path, leave_out: str = "") -> Path:
    destination.mkdir()
    for path in source.iterdir():
        if path.name != leave_out:
            (destination / path.name).write_bytes(path.read_bytes())
    return destination



def test_gpt2_folder_gives_transformers_logits(gpt2_weights_folder: Path, reference: GPT2LMHeadModel) -> None:
    model, notes = gpt_from_hf(gpt2_weights_folder)
    assert (model.config.mlp, model.config.pos, model.config.bias, model.config.tie_head) == ("gelu_tanh", "learned", True, True)
    assert notes == []
    assert model.lm_head.weight is model.tok_emb.weight
    assert max_logit_gap(model, reference, tokens()) < TOLERANCE


def test_exact_gelu_in_place_of_gpt2s_tanh_gelu_changes_the_logits(gpt2_weights_folder: Path, reference: GPT2LMHeadModel) -> None:
    config, _ = gpt_config_from_hf(gpt2_weights_folder)
    model = GPT(replace(config, mlp="gelu"))
    load_hf_weights(gpt2_weights_folder, model)  # into a model with real parameters this time
    assert max_logit_gap(model, reference, tokens()) > 10 * TOLERANCE


@pytest.mark.parametrize("laid_out", [False, True], ids=["as loaded", "laid out for decoding"])
@pytest.mark.parametrize("use_kv_cache", [True, False])
def test_greedy_tokens_match_transformers_generate(gpt2_weights_folder: Path, reference: GPT2LMHeadModel, use_kv_cache: bool,
                                                   laid_out: bool) -> None:
    model, _ = gpt_from_hf(gpt2_weights_folder)
    if laid_out:  # as sample.py samples on a CPU
        lay_out_for_decoding(model)
        assert max_logit_gap(model, reference, tokens()) < TOLERANCE
    prompt = tokens(length=6)
    theirs = reference.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30,
                                do_sample=False, pad_token_id=EOT)
    ours = generate_tokens(model, prompt, max_new_tokens=30, temperature=0.0, use_kv_cache=use_kv_cache)
    assert ours.tolist() == theirs.tolist()


def test_the_original_gpt2_files_names_without_prefix_and_with_mask_buffers_load(
    gpt2_weights_folder: Path, reference: GPT2LMHeadModel, tmp_path: Path
) -> None:
    # The gpt2 repo's model.safetensors holds GPT2Model's names ("wte.weight", "h.0.ln_1.weight")
    # and each layer's causal-mask buffer "h.{i}.attn.bias", which older transformers saved.
    folder = copy_folder(gpt2_weights_folder, tmp_path / "original", leave_out="model.safetensors")
    tensors = {name.removeprefix("transformer."): tensor for name, tensor in load_file(gpt2_weights_folder / "model.safetensors").items()}
    for layer in range(2):
        tensors[f"h.{layer}.attn.bias"] = torch.tril(torch.ones(1, 1, POSITIONS, POSITIONS))
        tensors[f"h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)  # and, in some, the value a masked score took
    save_file(tensors, folder / "model.safetensors")
    model, _ = gpt_from_hf(folder)
    assert max_logit_gap(model, reference, tokens()) < TOLERANCE


def test_half_precision_weights_load_as_float32(tmp_path: Path) -> None:
    tiny_gpt2().half().save_pretrained(tmp_path)  # F16 in the file: read, then converted (and transposed)
    model, _ = gpt_from_hf(tmp_path)
    assert model.tok_emb.weight.dtype == torch.float32
    assert max_logit_gap(model, tiny_gpt2().half().float(), tokens()) < TOLERANCE


def test_a_smaller_block_size_crops_the_positions_and_a_larger_one_is_refused(gpt2_weights_folder: Path, reference: GPT2LMHeadModel) -> None:
    model, notes = gpt_from_hf(gpt2_weights_folder, block_size=16)
    assert notes == [f"model.block_size=16 crops GPT-2's {POSITIONS} positions to 16"]
    assert model.pos_emb.weight.shape == (16, 32)
    assert max_logit_gap(model, reference, tokens(length=16)) < TOLERANCE
    message = one_line_error(gpt_from_hf, gpt2_weights_folder, block_size=POSITIONS + 1)
    assert f"model.block_size={POSITIONS + 1} is longer than the {POSITIONS} positions" in message


def test_a_vocab_size_that_contradicts_the_weights_is_refused(gpt2_weights_folder: Path) -> None:
    message = one_line_error(gpt_config_from_hf, gpt2_weights_folder, vocab_size=50304)
    assert f"vocab_size=50304 contradicts {gpt2_weights_folder / 'config.json'}, whose weights have {VOCAB} tokens" in message


def random_gpt(**options) -> GPT:
    """Our GPT, GPT-2-shaped unless options say otherwise, with every parameter random."""
    torch.manual_seed(2)
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=POSITIONS, n_layer=2, n_head=2, n_embd=32,
                          pos="learned", norm="layernorm", qk_norm=False, smear=False, **options))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3 if parameter.dim() == 1 else 0.2)  # GELU inputs around 1: its form shows
    return model


@pytest.mark.parametrize("options", [{"bias": True, "mlp": "gelu_tanh"}, {"bias": False, "mlp": "gelu"},
                                     {"bias": True, "mlp": "relu2", "tie_head": False}],
                         ids=["gpt2", "bias=False,gelu", "relu2,untied"])
def test_export_loads_in_transformers_with_the_same_logits_and_back(options: dict, tmp_path: Path) -> None:
    model = random_gpt(**options)
    save_hf_model(model, tmp_path, bos_id=EOT, eos_id=EOT)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(theirs) is GPT2LMHeadModel
    assert theirs.config.eos_token_id == EOT
    assert max_logit_gap(model, theirs, tokens()) < TOLERANCE
    back, _ = gpt_from_hf(tmp_path)
    assert max_logit_gap(back, theirs, tokens()) < TOLERANCE


def test_a_bias_free_model_exports_zero_biases(tmp_path: Path) -> None:
    _, tensors = hf_files_for(random_gpt(bias=False), bos_id=EOT, eos_id=EOT)
    assert tensors["transformer.h.0.attn.c_attn.bias"].shape == (96,)
    assert all(tensor.count_nonzero() == 0 for name, tensor in tensors.items() if name.endswith(".bias"))


def test_export_blockers_name_every_option_gpt2_cannot_represent() -> None:
    default = GPTConfig(vocab_size=VOCAB, pos="rope", norm="rmsnorm", qk_norm=True, smear=True, mlp="relu2")
    blockers = export_blockers(default)["gpt2"]
    assert [blocker.split(" ")[0] for blocker in blockers] == ["model.pos=rope", "model.norm=rmsnorm",
                                                                "model.qk_norm=true", "model.smear=true"]
    llama_options = GPTConfig(vocab_size=VOCAB, pos="learned", qk_norm=False, mlp="swiglu", n_kv_head=2, window=16)
    assert [blocker.split(" ")[0] for blocker in export_blockers(llama_options)["gpt2"]] == [
        "model.mlp=swiglu", "model.n_kv_head=2", "model.window=16"]
    assert export_blockers(random_gpt().config)["gpt2"] == []
    assert export_blockers(random_gpt(norm_eps=1e-5).config)["gpt2"] == []  # GPT-2's epsilon, given
    assert [blocker.split(" ")[0] for blocker in export_blockers(random_gpt(mlp="gelu", mlp_hidden=100, norm_eps=1e-6).config)[
        "gpt2"]] == ["model.norm_eps=1e-06", "model.mlp_hidden=100"]
    message = one_line_error(hf_files_for, GPT(default), bos_id=EOT, eos_id=EOT)
    # Qwen3 is nearer (relu2 and smear in its way): GPT-2's options are named among the others', without why.
    assert "The nearest is Qwen3" in message and "Against the others: GPT-2: " + ", ".join(
        blocker.split(" (")[0] for blocker in blockers) + " (experiment=gpt2_shape)" in message


def edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def test_missing_files_and_a_pickle_each_get_one_line(gpt2_weights_folder: Path, tmp_path: Path) -> None:
    no_config = copy_folder(gpt2_weights_folder, tmp_path / "no_config", leave_out="config.json")
    message = one_line_error(gpt_from_hf, no_config)
    assert message.startswith(f"{no_config} has no config.json: a Hugging Face model folder holds"), message
    assert message.endswith("; give one that transformers' save_pretrained wrote"), message
    no_weights = copy_folder(gpt2_weights_folder, tmp_path / "no_weights", leave_out="model.safetensors")
    assert f"{no_weights} has no model.safetensors:" in one_line_error(resolve_pretrained, no_weights)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert f"{empty} has no config.json and no model.safetensors" in one_line_error(resolve_pretrained, empty)
    pickle = copy_folder(gpt2_weights_folder, tmp_path / "pickle", leave_out="model.safetensors")
    (pickle / "pytorch_model.bin").write_bytes(b"never unpickled")
    message = one_line_error(gpt_from_hf, pickle)
    assert "holds pytorch_model.bin but no model.safetensors: only safetensors are read, never a pickle" in message


@pytest.mark.parametrize(("change", "words"), [
    ({"transformer.h.1.mlp.c_fc.weight": torch.zeros(32, 100)},
     "holds tensor transformer.h.1.mlp.c_fc.weight of shape (32, 100), but its config.json's GPT-2 needs (32, 128)"),
    ({"transformer.h.2.ln_1.weight": torch.ones(32)}, "holds tensor transformer.h.2.ln_1.weight (32,), which a GPT-2"),
    ({"transformer.ln_f.bias": None}, "lacks tensor transformer.ln_f.bias, which a GPT-2 of its config.json's shape has"),
    ({"transformer.h.1.attn.c_attn.bias": torch.zeros(96).index_fill(0, torch.tensor([50]), float("nan"))},
     "holds nan or inf in tensor transformer.h.1.attn.c_attn.bias: these weights cannot run"),
    # Read through the scratch buffer, as every transposed or converted tensor is.
    ({"transformer.h.0.mlp.c_fc.weight": torch.zeros(32, 128).index_fill(1, torch.tensor([7]), float("-inf"))},
     "holds nan or inf in tensor transformer.h.0.mlp.c_fc.weight: these weights cannot run"),
], ids=["wrong shape", "unexpected", "missing", "nan", "inf, transposed"])
def test_a_tensor_of_the_wrong_shape_unexpected_or_missing_gets_one_line(
    gpt2_weights_folder: Path, tmp_path: Path, change: dict, words: str
) -> None:
    folder = copy_folder(gpt2_weights_folder, tmp_path / "edited", leave_out="model.safetensors")
    tensors = load_file(gpt2_weights_folder / "model.safetensors") | change
    save_file({name: tensor for name, tensor in tensors.items() if tensor is not None}, folder / "model.safetensors")
    assert words in one_line_error(gpt_from_hf, folder)


def test_the_finite_check_takes_large_finite_weights_and_finds_one_nan_or_inf_in_any_float_type():
    assert is_finite(torch.full((3,), 1e308, dtype=torch.float64))  # their float64 sum would overflow
    assert is_finite(torch.full((3 << 20,), 60000.0, dtype=torch.float16))  # and so would a float16 sum
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        for bad in (float("nan"), float("inf"), float("-inf")):
            tensor = torch.zeros(3 << 20, dtype=dtype)
            tensor[(2 << 20) + 5] = bad  # in the third million: every part is read
            assert not is_finite(tensor), (dtype, bad)


@pytest.mark.parametrize(("change", "words"), [
    ({"model_type": "bert"}, 'model_type="bert": this project reads GPT2LMHeadModel (gpt2), LlamaForCausalLM (llama), '
                             'Qwen3ForCausalLM (qwen3), MistralForCausalLM (mistral); start from one of those, or train '
                             'from scratch without init_from'),
    ({"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon=1e-06: this project's LayerNorm uses 1e-05"),
    ({"n_inner": 100}, "n_inner=100: this project's MLP is 4 * n_embd = 128 wide"),
    ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=true: this project's attention is GPT-2's"),
    ({"activation_function": "silu"}, 'activation_function="silu": this project\'s MLP has gelu_new, gelu_pytorch_tanh, gelu, relu2'),
    ({"tie_word_embeddings": "false"}, 'tie_word_embeddings="false": it must be true or false'),  # not read as true
    ({"n_layer": 0}, "n_layer=0: GPT-2 needs a whole number of at least 1 here"),
    ({"n_positions": "64"}, 'n_positions="64": GPT-2 needs a whole number of at least 1 here'),
    ({"n_head": 3}, "n_head=3: it must divide n_embd=32"),
    ({"scale_attn_weights": False}, "scale_attn_weights=false: this project's attention is GPT-2's, which has scale_attn_weights=true"),
    ({"scale_attn_weights": 1}, "scale_attn_weights=1: this project's attention is GPT-2's"),  # 1 is not true
    ({"reorder_and_upcast_attn": True}, "reorder_and_upcast_attn=true: this project's attention is GPT-2's"),
], ids=lambda value: next(iter(value)) + (f"={value[next(iter(value))]}" if "scale" in next(iter(value)) else "")
   if isinstance(value, dict) else "")
def test_a_config_that_is_not_gpt2_gets_one_line(gpt2_weights_folder: Path, tmp_path: Path, change: dict, words: str) -> None:
    folder = copy_folder(gpt2_weights_folder, tmp_path / "edited")
    edit_config(folder, **change)
    assert f"{folder / 'config.json'} has {words}" in one_line_error(gpt_from_hf, folder)


def test_a_config_json_that_leaves_keys_out_reads_as_transformers_fills_them_in(gpt2_weights_folder: Path, tmp_path: Path) -> None:
    # The gpt2 repo's config.json, written by an older transformers, leaves out n_inner, scale_attn_weights,
    # tie_word_embeddings and more; transformers 5 writes every key. A file that keeps only the shape:
    assert {key: getattr(GPT2Config(), key) for key in HF_DEFAULTS} == HF_DEFAULTS  # what GPT2Config fills in
    folder = copy_folder(gpt2_weights_folder, tmp_path / "short", leave_out="config.json")
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": VOCAB, "n_positions": POSITIONS,
        "n_embd": 32, "n_layer": 2, "n_head": 2, "bos_token_id": EOT, "eos_token_id": EOT}))
    model, notes = gpt_from_hf(folder)
    assert (model.config.dropout, model.config.mlp, model.config.tie_head, notes) == (0.1, "gelu_tanh", True, [])
    assert max_logit_gap(model, AutoModelForCausalLM.from_pretrained(folder).eval(), tokens()) < TOLERANCE


def test_the_folders_resid_pdrop_is_the_dropout_and_a_note_says_where_attn_or_embd_pdrop_differ(gpt2_weights_folder: Path,
                                                                                               tmp_path: Path) -> None:
    folder = copy_folder(gpt2_weights_folder, tmp_path / "dropouts")
    note = "model.dropout=0.2 (the folder's resid_pdrop) applies to attention and embeddings too"
    for attn, embd in ((0.0, 0.2), (0.2, 0.0), (0.2, 0.2)):
        edit_config(folder, resid_pdrop=0.2, attn_pdrop=attn, embd_pdrop=embd, n_inner=128)  # n_inner: 4 * n_embd, written out
        config, notes = gpt_config_from_hf(folder)
        assert config.dropout == 0.2 and notes == ([] if attn == embd == 0.2 else [note])
    assert gpt_config_from_hf(folder, dropout=0.0) == (replace(config, dropout=0.0), [])  # model.dropout given: no note


def test_gelu_pytorch_tanh_is_gpt2s_tanh_gelu(gpt2_weights_folder: Path, reference: GPT2LMHeadModel, tmp_path: Path) -> None:
    folder = copy_folder(gpt2_weights_folder, tmp_path / "pytorch_tanh")
    edit_config(folder, activation_function="gelu_pytorch_tanh")
    model, _ = gpt_from_hf(folder)
    assert max_logit_gap(model, AutoModelForCausalLM.from_pretrained(folder).eval(), tokens()) < TOLERANCE


def test_a_local_folder_resolves_to_itself_and_a_missing_path_or_a_file_is_named(gpt2_weights_folder: Path, tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_pretrained(str(gpt2_weights_folder)) == gpt2_weights_folder
    message = one_line_error(resolve_pretrained, str(tmp_path / "nowhere"))
    assert "is neither a folder here nor a Hugging Face Hub repo id" in message and message.endswith("; check the path")
    monkeypatch.chdir(tmp_path)
    Path("book.txt").write_text("Once upon a time")  # a name a Hub repo id could have: a file here all the same
    assert one_line_error(resolve_pretrained, "book.txt").startswith("book.txt is not a folder: a Hugging Face model folder holds")


@pytest.mark.parametrize("no_hub", ["HF_HUB_OFFLINE=1", "an endpoint that refuses"])
def test_a_hub_repo_id_without_the_hub_fails_at_once_and_writes_nothing(
    no_hub: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same as setting HF_HUB_OFFLINE or HF_ENDPOINT before huggingface_hub is imported.
    if no_hub == "HF_HUB_OFFLINE=1":
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    else:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # discard port: refused
    cache = tmp_path / "cache"
    start = time.perf_counter()
    message = one_line_error(resolve_pretrained, "openai-community/gpt2", cache_dir=cache)
    assert time.perf_counter() - start < 5
    assert message.startswith("init_from=openai-community/gpt2 is not a folder here and needs the Hugging Face Hub once")
    assert "nothing was written" in message and f"`{download_command('openai-community/gpt2', '<folder>')}`" in message
    assert not cache.exists() or not any(cache.rglob("*"))
    # Beside a folder of the owner's name, still a Hub id (a folder of SmolLM2's downloads must not
    # stop another), and the line also says the path it may have been meant as.
    monkeypatch.chdir(tmp_path)
    Path("openai-community").mkdir()
    message = one_line_error(resolve_pretrained, "openai-community/gpt3", cache_dir=cache)
    assert message.startswith("init_from=openai-community/gpt3 is not a folder here (openai-community is a folder here, but "
                              "holds no gpt3) and needs the Hugging Face Hub once")


def test_the_download_command_the_refusal_and_the_readme_give_fetches_every_file_a_folder_needs(tmp_path):
    assert all(any(fnmatch(name, pattern) for pattern in DOWNLOAD_PATTERNS) for name in HUB_FILES)
    command = download_command("gpt2", "gpt2-small")
    assert f".venv/bin/{command}" in (ROOT / "README.md").read_text()
    # The real hf command line, offline: it refuses for want of the Hub, having read each pattern as
    # one (hf takes one value per --include, and reads more as file names, dropping the patterns).
    result = subprocess.run([str(Path(sys.executable).parent / "hf"), *shlex.split(command)[1:-1], str(tmp_path / "g")],
                            capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=60)
    assert result.returncode != 0 and "offline mode is enabled" in result.stderr + result.stdout
    assert "Ignoring" not in result.stderr and "--include" in command


def test_a_folder_whose_json_is_damaged_is_one_line_that_says_to_download_it_again(tmp_path):
    for name, text in (("config.json", b'{"model_type": "gpt2",'), ("tokenizer.json", b"\xff\xfe")):
        folder = tiny_gpt2_folder(tmp_path / name)
        (folder / name).write_bytes(text)
        read = gpt_config_from_hf if name == "config.json" else pretrained_tokenizer
        message = one_line_error(read, folder)
        assert message.startswith(f"{folder / name} is not valid JSON (")
        assert message.endswith("); the folder's files may be damaged: download it again")
