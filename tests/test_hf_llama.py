"""Llama, Qwen3 and Mistral folders in and out (model_io/hf_llama.py, read and written by model_io/hf_models.py),
with transformers' LlamaForCausalLM, Qwen3ForCausalLM and MistralForCausalLM as the reference: tiny random models
and a tiny byte-level BPE, written by save_pretrained in the test, never the Hub."""

import json
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file
from tokenizers import ByteLevelBPETokenizer
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import cli.schema  # noqa: F401  (stores the schemas that configs/train.yaml extends)
from cli.config import composed_train_config, preset_model_values
from data.stories import generate_stories
from data.tokenizer import EOT, CharTokenizer
from inspection.logit_attribution import logit_attribution
from inspection.logit_lens import logit_lens
from inspection.patching import logit_difference, patch_heads
from model.attention import rope_speeds
from model.generation import generate_tokens
from model.gpt import GPT, GPTConfig, eval_mode
from model_io.checkpoint import Checkpoint, build_model
from model_io.hf_models import export_blockers, export_model_type, gpt_config_from_hf, gpt_from_hf, load_hf_weights
from model_io.run_files import BEST
from tests.helpers import max_logit_gap, one_line_error, run_cli

VOCAB = 300  # the tiny BPE's tokens, <|endoftext|> included, and the models' vocabulary
TOLERANCE = 1e-5  # fp32: the same math in another order is ~1e-6 apart here
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 16}  # with head_dim 8: one pair kept, one blended, two slowed
SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64)
SHAPES = {  # grouped-query (2:1) and multi-query, tied and untied, rope scaling, Qwen3's own head size, windows
    "llama,gqa,untied,llama3_rope": LlamaConfig(**SMALL, num_key_value_heads=2, tie_word_embeddings=False,
                                                rope_parameters={"rope_theta": 500000.0, **LLAMA3_SCALING}),
    "llama,mqa,tied": LlamaConfig(**SMALL, num_key_value_heads=1, tie_word_embeddings=True),
    "qwen3,gqa,head_dim=16": Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True),
    "qwen3,every layer sliding": Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=8, use_sliding_window=True,
                                             sliding_window=5, max_window_layers=0),
    "mistral,gqa,window": MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=5),
}
# The folder of each model_type that test_what_does_not_map_is_one_line_naming_the_key edits.
EDITED = {"llama": "llama,mqa,tied", "qwen3": "qwen3,gqa,head_dim=16", "mistral": "mistral,gqa,window"}


def lively(model: torch.nn.Module) -> torch.nn.Module:
    """model with every parameter redrawn from N(0, 0.3): at the init's 0.02 every logit is near 0 and
    greedy tokens hardly depend on the context; here they do, so a wrong row or head shows."""
    torch.manual_seed(3)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model.eval()


def save_tokenizer(folder: Path) -> None:
    """A byte-level BPE of VOCAB tokens with <|endoftext|> as bos and eos, as transformers saves one."""
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(generate_stories(seed=3, n_chars=20_000), vocab_size=VOCAB, special_tokens=[EOT],
                            show_progress=False)
    assert bpe.get_vocab_size() == VOCAB
    PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token=EOT, eos_token=EOT).save_pretrained(folder)


def hf_folder(folder: Path, config: PreTrainedConfig, **save_options) -> Path:
    """A complete Hugging Face folder: a random model of config's shape and the tiny tokenizer."""
    lively(AutoModelForCausalLM.from_config(config)).save_pretrained(folder, **save_options)
    save_tokenizer(folder)
    return folder


@pytest.fixture(scope="module", params=list(SHAPES))
def shape(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PreTrainedModel]:
    """A folder of each shape, and transformers' model read from it."""
    folder = hf_folder(tmp_path_factory.mktemp("hf"), SHAPES[request.param])
    return folder, AutoModelForCausalLM.from_pretrained(folder).eval()


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_folder(tmp_path_factory.mktemp("llama"), SHAPES["llama,gqa,untied,llama3_rope"])


def tokens(length: int = 40, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(seed))  # (2, length)




def test_each_shape_gives_transformers_logits_with_its_heads_sizes_and_norms(shape) -> None:
    folder, theirs = shape
    ours, notes = gpt_from_hf(folder)
    hf = theirs.config
    config = ours.config
    assert (config.pos, config.norm, config.mlp, config.bias, config.smear) == ("rope", "rmsnorm", "swiglu", False, False)
    assert (config.n_head, config.kv_heads, config.head_size, config.hidden_size) == (
        hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim, hf.intermediate_size)
    assert (config.tie_head, config.qk_norm, config.norm_eps) == (hf.tie_word_embeddings, hf.model_type == "qwen3", 1e-6)
    sliding = hf.model_type == "mistral" or "sliding_attention" in getattr(hf, "layer_types", [])  # Mistral: every layer
    assert config.window == (hf.sliding_window if sliding else None)
    assert (ours.lm_head.weight is ours.tok_emb.weight) == config.tie_head and notes == []
    assert max_logit_gap(ours, theirs, tokens()) < TOLERANCE


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_tokens_match_transformers_generate_with_and_without_either_cache(shape, use_cache: bool) -> None:
    folder, theirs = shape
    ours, _ = gpt_from_hf(folder)
    prompt = tokens(length=6)
    expected = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30, do_sample=False,
                               use_cache=use_cache, eos_token_id=None, pad_token_id=0)  # (2, 36): no stop at an eos
    generated = generate_tokens(ours, prompt, max_new_tokens=30, temperature=0.0, use_kv_cache=use_cache)
    assert expected.shape == (2, 36) and generated.tolist() == expected.tolist()


def test_llama3_rope_scaling_is_read_and_is_what_makes_the_logits_agree(llama_folder: Path) -> None:
    theirs = AutoModelForCausalLM.from_pretrained(llama_folder).eval()
    config, _ = gpt_config_from_hf(llama_folder)
    assert (config.rope_theta, config.rope_scaling) == (500000.0, {name: LLAMA3_SCALING[name] for name in
                                                                   ("factor", "low_freq_factor", "high_freq_factor",
                                                                    "original_max_position_embeddings")})
    unscaled = GPT(replace(config, rope_scaling=None))  # plain rotary angles instead
    load_hf_weights(llama_folder, unscaled)  # into real parameters this time
    assert max_logit_gap(unscaled, theirs, tokens()) > 100 * TOLERANCE


def test_rotary_speeds_are_transformers_to_the_bit_so_logits_agree_at_a_thousand_tokens_too(tmp_path: Path) -> None:
    """The angle is speed x position: a speed one float32 step off is ~1e-4 apart in the logits by
    position 1000 with a head of 64 dims (as SmolLM2's and Llama 3.2's)."""
    scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256}
    for name, rope in {"default": {"rope_theta": 500000.0}, "llama3": {"rope_theta": 500000.0, **scaling}}.items():
        hf = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024, rope_parameters=rope)
        theirs = lively(LlamaForCausalLM(hf))
        theirs.save_pretrained(tmp_path / name)
        ours, _ = gpt_from_hf(tmp_path / name)
        attention = ours.blocks[0].attn
        assert torch.equal(rope_speeds(attention.head_dim, attention.rope_theta, attention.rope_scaling),
                           theirs.model.rotary_emb.inv_freq), name
        assert max_logit_gap(ours, theirs, tokens(length=1024)[:1]) < TOLERANCE, name


def test_a_set_rope_scaling_wins_over_rope_parameters_and_a_top_level_original_context_over_both(
        llama_folder: Path, tmp_path: Path) -> None:
    """transformers 5 reads an older rope_scaling before rope_parameters (export.py writes both), and takes
    original_max_position_embeddings from the top level when it is there (Phi-3 writes it so)."""
    folder = Path(shutil.copytree(llama_folder, tmp_path / "edited"))
    hf = json.loads((folder / "config.json").read_text())
    hf["rope_scaling"] = {**LLAMA3_SCALING, "rope_theta": 20000.0, "factor": 4.0, "original_max_position_embeddings": 32}
    hf["original_max_position_embeddings"] = 8
    (folder / "config.json").write_text(json.dumps(hf))
    theirs = AutoModelForCausalLM.from_pretrained(folder).eval()
    config, _ = gpt_config_from_hf(folder)
    assert (config.rope_theta, config.rope_scaling) == (20000.0, {"factor": 4.0, "low_freq_factor": 1.0,
                                                                  "high_freq_factor": 4.0,
                                                                  "original_max_position_embeddings": 8})
    ours, _ = gpt_from_hf(folder)
    assert max_logit_gap(ours, theirs, tokens()) < TOLERANCE


def test_rope_parameters_rotary_base_wins_over_a_top_level_rope_theta_as_transformers_reads_it(
        llama_folder: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(llama_folder, tmp_path / "edited"))
    hf = json.loads((folder / "config.json").read_text())
    hf["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    hf["rope_theta"] = 10000.0  # as a file edited by hand, or written by another tool, may hold both
    (folder / "config.json").write_text(json.dumps(hf))
    theirs = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert theirs.config.rope_parameters["rope_theta"] == gpt_config_from_hf(folder)[0].rope_theta == 500000.0
    ours, _ = gpt_from_hf(folder)
    assert max_logit_gap(ours, theirs, tokens()) < TOLERANCE


def test_a_sharded_folder_loads_as_one_file_does_and_a_missing_shard_is_named(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path / "sharded", SHAPES["qwen3,gqa,head_dim=16"], max_shard_size="50KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and not (folder / "model.safetensors").exists()
    ours, _ = gpt_from_hf(folder)
    assert max_logit_gap(ours, AutoModelForCausalLM.from_pretrained(folder).eval(), tokens()) < TOLERANCE
    (folder / shards[-1]).unlink()
    assert f"has no {shards[-1]}, a shard that model.safetensors.index.json lists" in one_line_error(gpt_from_hf, folder)


@pytest.mark.parametrize("copy", ["the embedding", "another matrix"])
def test_a_tied_folder_that_also_holds_lm_head_reads_a_copy_of_the_embedding_and_refuses_another(tmp_path: Path, copy) -> None:
    folder = hf_folder(tmp_path, SHAPES["llama,mqa,tied"])
    weights = load_file(folder / "model.safetensors")
    embedding = weights["model.embed_tokens.weight"]
    save_file({**weights, "lm_head.weight": embedding.clone() if copy == "the embedding" else embedding.flip(0)},
              folder / "model.safetensors", metadata={"format": "pt"})
    if copy == "another matrix":  # transformers leaves them untied; reading it tied would give other logits
        assert one_line_error(gpt_from_hf, folder) == (
            f"{folder / 'model.safetensors'} holds an lm_head.weight that is not the embedding, while config.json's "
            f"tie_word_embeddings is true (transformers then leaves them untied); set tie_word_embeddings to false in "
            f"{folder / 'config.json'} to read both")
        return
    ours, _ = gpt_from_hf(folder)
    idx = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    assert max_logit_gap(ours, AutoModelForCausalLM.from_pretrained(folder).eval(), idx) < TOLERANCE


def test_vocabulary_rows_past_the_tokenizers_last_id_are_left_out(llama_folder: Path) -> None:
    # Qwen3 pads its 151,669 tokens to 151,936 rows; the model is built from the tokenizer's size.
    config = replace(gpt_config_from_hf(llama_folder)[0], vocab_size=VOCAB - 44)
    with torch.device("meta"):
        ours = GPT(config)
    load_hf_weights(llama_folder, ours)
    theirs = AutoModelForCausalLM.from_pretrained(llama_folder).eval()
    idx = tokens() % config.vocab_size
    with torch.no_grad(), eval_mode(ours):
        gap = (ours(idx)[0] - theirs(idx).logits[..., : config.vocab_size]).abs().max().item()
    assert gap < TOLERANCE


def test_a_tokenizer_with_more_ids_than_the_weights_have_rows_is_one_line_that_says_so(llama_folder: Path) -> None:
    # Tokens added to the tokenizer (a chat template's, say) and not to the model: ids 300 and 301 have no row.
    config = replace(gpt_config_from_hf(llama_folder)[0], vocab_size=VOCAB + 2)
    with torch.device("meta"):
        ours = GPT(config)
    assert one_line_error(load_hf_weights, llama_folder, ours) == (
        f"{llama_folder / 'model.safetensors'} holds tensor lm_head.weight of 300 rows, fewer than the 302 ids "
        "of the folder's tokenizer: its last ids would have no row; resize the model to the tokenizer in transformers "
        "(model.resize_token_embeddings(len(tokenizer))) and save the folder again")


def test_a_config_whose_vocab_size_is_not_the_embeddings_rows_is_one_line_as_transformers_refuses_it(
        llama_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "edited"
    shutil.copytree(llama_folder, folder)
    hf = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**hf, "vocab_size": VOCAB - 20}))  # the tokenizer still fits
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):  # the reference: transformers will not load it
        AutoModelForCausalLM.from_pretrained(folder)
    assert one_line_error(gpt_from_hf, folder) == (
        f"{folder / 'model.safetensors'} holds tensor lm_head.weight of {VOCAB} rows, but "
        f"{folder / 'config.json'} has vocab_size={VOCAB - 20}: the two must agree; if the tensor is right, set "
        f"vocab_size to {VOCAB} there")


@pytest.mark.parametrize(("model_type", "change", "words"), [
    ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
     'rope_parameters.rope_type="dynamic": this project\'s rotary positions take no scaling ("default") or Llama 3.1\'s'),
    ("llama", {"rope_parameters": None, "rope_scaling": {"type": "yarn", "factor": 4.0}}, 'rope_scaling.type="yarn"'),
    ("llama", {"attention_bias": True}, "attention_bias=true: this project reads Llama and Qwen3 without biases"),
    ("llama", {"hidden_act": "gelu"}, 'hidden_act="gelu": this project\'s SwiGLU MLP gates with SiLU (silu)'),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1, "layer_types": None},
     "max_window_layers=1: some layers slide and some do not, which does not map to this project's model"),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 4, "layer_types": ["full_attention", "sliding_attention"]},
     'layer_types=["full_attention", "sliding_attention"]: some layers slide and some do not'),
    ("qwen3", {"layer_types": ["sliding_attention", "sliding_attention"]},
     'layer_types=["sliding_attention", "sliding_attention"]: it names sliding layers, but no window is set'),
    ("qwen3", {"model_type": "qwen2"}, 'model_type="qwen2": this project reads GPT2LMHeadModel (gpt2), LlamaForCausalLM'),
    # Values of the wrong kind: one line each, not a traceback, nor a default put in their place.
    ("llama", {"rms_norm_eps": None}, "rms_norm_eps=null: it must be a small positive number, e.g. 1e-05"),
    ("llama", {"rope_parameters": None, "rope_theta": "abc"}, 'rope_theta="abc": the rotary base must be a positive number'),
    ("llama", {"num_key_value_heads": 0}, "num_key_value_heads=0: it must divide num_attention_heads=4"),
    ("llama", {"head_dim": 0}, "head_dim=0: rotary positions turn pairs of dims: it must be even"),
    ("llama", {"head_dim": 7}, "head_dim=7: rotary positions turn pairs of dims: it must be even"),
    ("llama", {"tie_word_embeddings": "false"}, 'tie_word_embeddings="false": it must be true or false'),
    ("llama", {"rope_parameters": {"rope_theta": 5e5, **LLAMA3_SCALING, "factor": "8"}},
     'rope_parameters.factor="8": it must be a positive number'),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": None, "layer_types": None},
     "max_window_layers=null: it must be a whole number (the first layer that slides)"),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 0, "layer_types": None, "max_window_layers": 0},
     "sliding_window=0: it must be a whole number of at least 1"),
    ("qwen3", {"use_sliding_window": "false", "sliding_window": 4096, "layer_types": None, "max_window_layers": 0},
     'use_sliding_window="false": it must be true or false'),
    ("mistral", {"sliding_window": 0}, "sliding_window=0: it must be a whole number of at least 1, or null for no window"),
    ("mistral", {"sliding_window": "4096"}, 'sliding_window="4096": it must be a whole number of at least 1'),
    ("mistral", {"layer_types": ["full_attention", "sliding_attention"]},  # a Ministral, to transformers
     'layer_types=["full_attention", "sliding_attention"]: some layers slide and some do not'),
    ("mistral", {"sliding_window": None, "layer_types": ["sliding_attention", "sliding_attention"]},
     'layer_types=["sliding_attention", "sliding_attention"]: it names sliding layers, but no window is set: give a '
     'sliding_window'),
    ("llama", {"rope_parameters": {"rope_theta": 5e5, **LLAMA3_SCALING}, "original_max_position_embeddings": None},
     "original_max_position_embeddings=null: it must be a positive number"),
    ("llama", {"rope_parameters": {"rope_theta": 5e5, **LLAMA3_SCALING, "high_freq_factor": 1.0}},
     "rope_parameters.high_freq_factor=1.0: it must be greater than low_freq_factor=1.0"),
], ids=["dynamic rope", "yarn rope (before transformers 5)", "attention_bias", "gelu", "sliding from layer 1",
        "sliding layer", "sliding layers, no window", "qwen2", "eps null", "theta text", "no kv heads", "head_dim 0", "head_dim odd", "tie text", "factor text",
        "sliding, no max_window_layers", "window 0", "sliding text", "mistral window 0", "mistral window text", "ministral's mix",
        "ministral, no window",
        "top-level original context null", "scaling bands overlap"])
def test_what_does_not_map_is_one_line_naming_the_key(tmp_path: Path, model_type: str, change: dict, words: str) -> None:
    config = SHAPES[EDITED[model_type]]
    config.save_pretrained(tmp_path)  # config.json is all gpt_config_from_hf reads
    path = tmp_path / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | change))
    assert f"{path} has {words}" in one_line_error(gpt_config_from_hf, tmp_path)


def test_a_context_longer_than_2048_kept_whole_is_said_with_the_key_that_crops_it(tmp_path: Path) -> None:
    settings = {key: value for key, value in SMALL.items() if key != "max_position_embeddings"}
    Qwen3Config(**settings, num_key_value_heads=2, head_dim=8).save_pretrained(tmp_path)  # transformers' 32,768
    config, notes = gpt_config_from_hf(tmp_path)
    assert config.block_size == 32768 and notes == [
        "each sequence is the weights' whole context, 32,768 tokens; model.block_size crops it (e.g. "
        "model.block_size=1024: shorter sequences, faster steps)"]  # a step at 32,768 on a CPU looks like a hang
    assert gpt_config_from_hf(tmp_path, block_size=256)[1] == ["model.block_size=256 crops Qwen3's 32768 positions to 256"]
    Qwen3Config(**settings, num_key_value_heads=2, head_dim=8, max_position_embeddings=2048).save_pretrained(tmp_path)
    assert gpt_config_from_hf(tmp_path) == (replace(config, block_size=2048), [])  # GPT-2's 1,024 and up to 2,048: as usual


def test_logit_lens_attribution_and_head_patching_work_on_an_imported_gqa_llama(llama_folder: Path) -> None:
    ours, _ = gpt_from_hf(llama_folder)
    theirs = AutoModelForCausalLM.from_pretrained(llama_folder).eval()
    clean = tokens(length=12)
    corrupted = clean.clone()
    corrupted[:, 4] = (corrupted[:, 4] + 1) % VOCAB
    with torch.no_grad():
        out = theirs(clean, output_hidden_states=True)
        # hidden_states[1] leaves the first layer; the last one has passed the final norm already.
        first_layer = theirs.lm_head(theirs.model.norm(out.hidden_states[1])).log_softmax(dim=-1)  # (B, T, V)
    lens = logit_lens(ours, clean)  # (L, B, T, V)
    torch.testing.assert_close(lens[0], first_layer, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(lens[-1], out.logits.log_softmax(dim=-1), atol=TOLERANCE, rtol=0)

    answer, other = out.logits[:, -1].argmax(dim=-1), out.logits[:, -1].argmin(dim=-1)  # (B,) each
    attribution = logit_attribution(ours, clean, -1, answer, other)
    real = out.logits[[0, 1], -1, answer] - out.logits[[0, 1], -1, other]  # (B,)
    torch.testing.assert_close(attribution.total(), real, atol=1e-4, rtol=0)
    assert attribution.heads().shape == (2, 4, 2)  # (L, H, B): every query head, though 2 share each key head

    # Patching one head: in transformers, that head's D columns of o_proj's input taken from the clean run.
    metric = logit_difference(-1, answer, other)
    restored = patch_heads(ours, clean, corrupted, metric)
    D = theirs.config.head_dim
    clean_inputs = {}
    hooks = [layer.self_attn.o_proj.register_forward_pre_hook(lambda module, args, i=i: clean_inputs.update({i: args[0]}))
             for i, layer in enumerate(theirs.model.layers)]
    with torch.no_grad():
        theirs(clean)
    for hook in hooks:
        hook.remove()
    for layer, head in [(0, 1), (1, 2), (1, 3)]:
        def patch(module, args, layer=layer, head=head):
            patched = args[0].clone()  # (B, T, H * D)
            patched[..., head * D : (head + 1) * D] = clean_inputs[layer][..., head * D : (head + 1) * D]
            return (patched,)

        hook = theirs.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(patch)
        with torch.no_grad():
            expected = metric(theirs(corrupted).logits).item()
        hook.remove()
        assert restored.patched[layer, head].item() == pytest.approx(expected, abs=1e-4)


TINY_SHAPE = ["model.n_layer=2", "model.n_embd=32", "model.block_size=32"]  # 4 heads (the default), 2 key/value heads


# Llama 3's rotary base and scaling, as a command line sets them.
LLAMA3_ROPE = ["model.rope_theta=500000.0", "model.rope_scaling={factor:8.0,low_freq_factor:1.0,high_freq_factor:4.0,"
               "original_max_position_embeddings:16}"]


@pytest.mark.parametrize(("preset", "options", "hf_class"), [("llama_shape", LLAMA3_ROPE, LlamaForCausalLM),
                                                             ("qwen3_shape", ["model.head_dim=16"], Qwen3ForCausalLM),
                                                             ("qwen3_shape", ["model.window=6"], Qwen3ForCausalLM),
                                                             ("mistral_shape", ["model.window=6"], MistralForCausalLM)],
                         ids=["llama_shape,llama3_rope", "qwen3_shape,head_dim=16", "qwen3_shape,window", "mistral_shape,window"])
def test_a_llama_qwen3_or_mistral_shaped_run_exports_to_transformers_and_reads_back(
    preset: str, options: list[str], hf_class: type, tmp_path: Path
) -> None:
    cfg = composed_train_config([f"experiment={preset}", *TINY_SHAPE, *options])
    assert OmegaConf.missing_keys(cfg) == set()
    tokenizer = CharTokenizer(sorted(set("".join(generate_stories(seed=1, n_chars=20_000)))))
    model = lively(build_model(OmegaConf.to_container(cfg.model), tokenizer.vocab_size))
    assert (model.config.rope_theta, bool(model.config.rope_scaling)) == (
        (500000.0, True) if preset == "llama_shape" else (10000.0, False))
    assert (model.config.kv_heads, model.config.qk_norm) == (2, preset == "qwen3_shape")
    run = tmp_path / "run"
    run.mkdir()
    model_cfg = {key: value for key, value in asdict(model.config).items() if key != "vocab_size"}
    Checkpoint(model=model.state_dict(), config={"model": model_cfg}, tokenizer=tokenizer.state()).save(run / BEST)
    result = run_cli("export.py", f"run={run}", f"out={tmp_path / 'exported'}", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"as a {hf_class.__name__}, from {run / BEST} (step 0):" in result.stdout  # the class, the checkpoint it read, its step

    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    assert type(theirs) is hf_class
    hf = json.loads((tmp_path / "exported" / "config.json").read_text())
    # model.norm_eps=null is RMSNorm's "the dtype's eps": float32's, written as a number.
    assert hf["rms_norm_eps"] == torch.finfo(torch.float32).eps and theirs.config.rms_norm_eps == hf["rms_norm_eps"]
    assert (hf["num_key_value_heads"], hf["head_dim"], hf["max_position_embeddings"]) == (2, model.config.head_size, 32)
    assert model.config.head_size == (16 if "model.head_dim=16" in options else 8)  # 32 / 4 heads, unless set
    if model.config.window is not None:  # every layer slides over the window: Mistral's one way, one of Qwen3's
        assert (hf["sliding_window"], theirs.config.sliding_window) == (model.config.window, model.config.window)
        if hf_class is Qwen3ForCausalLM:
            assert set(theirs.config.layer_types) == {"sliding_attention"}
            assert hf["max_window_layers"] == 0  # a reader of the years before layer_types slides from this layer on
    assert (theirs.config.bos_token_id, theirs.config.eos_token_id) == (tokenizer.bos_id, tokenizer.eot_id)
    idx = torch.tensor([[tokenizer.bos_id, *tokenizer.encode("Once upon a time")]])  # (1, T)
    assert max_logit_gap(model, theirs, idx) < TOLERANCE
    expected = theirs.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=12, do_sample=False,
                               eos_token_id=None, pad_token_id=tokenizer.eot_id)
    assert generate_tokens(model, idx, max_new_tokens=12, temperature=0.0).tolist() == expected.tolist()

    back, notes = gpt_from_hf(tmp_path / "exported")  # what init_from=<exported folder> reads
    assert notes == [] and (back.config.kv_heads, back.config.window) == (2, model.config.window)
    with torch.no_grad(), eval_mode(model), eval_mode(back):
        assert torch.equal(back(idx)[0], model(idx)[0])


@pytest.mark.parametrize(("use_sliding_window", "layers", "window"), [(True, "sliding_attention", 5), (False, "full_attention", None)])
def test_a_max_window_layers_below_0_slides_every_layer_only_with_use_sliding_window_as_transformers_reads_it(
        tmp_path: Path, use_sliding_window: bool, layers: str, window: int | None) -> None:
    # use_sliding_window=false: no layer slides, whatever sliding_window and max_window_layers say.
    Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=8, use_sliding_window=use_sliding_window, sliding_window=5,
                max_window_layers=-1).save_pretrained(tmp_path)
    path = tmp_path / "config.json"  # without layer_types, which save_pretrained writes out: as older files are
    path.write_text(json.dumps(json.loads(path.read_text()) | {"layer_types": None, "sliding_window": 5}))
    assert set(AutoConfig.from_pretrained(tmp_path).layer_types) == {layers}
    assert gpt_config_from_hf(tmp_path)[0].window == window


def test_a_window_exports_as_a_qwen3_with_qk_norm_and_as_a_mistral_without_never_as_a_llama() -> None:
    shape = dict(vocab_size=VOCAB, pos="rope", norm="rmsnorm", mlp="swiglu", smear=False)
    assert export_model_type(GPTConfig(**shape, qk_norm=True, window=16)) == "qwen3"
    assert export_model_type(GPTConfig(**shape, qk_norm=False, window=16)) == "mistral"
    assert export_model_type(GPTConfig(**shape, qk_norm=False)) == "llama"  # Llama first, where both hold it
    assert export_blockers(GPTConfig(**shape, qk_norm=False, window=16))["llama"] == [
        "model.window=16 (Llama has no sliding window; Mistral has one, and Qwen3 with model.qk_norm=true)"]
    assert export_blockers(GPTConfig(**shape, qk_norm=True, window=16))["mistral"] == [
        "model.qk_norm=true (Mistral does not normalise queries and keys; Qwen3 does)"]


@pytest.mark.parametrize("no_window", [{"sliding_window": None}, {"layer_types": ["full_attention"] * 2}],
                         ids=["sliding_window null", "layer_types all full (a Ministral)"])
def test_a_mistral_with_no_window_reads_as_full_attention_and_its_bias_keys_are_not_read(tmp_path: Path, no_window) -> None:
    # Mistral 7B v0.2 on writes sliding_window null; a config.json with layer_types is a Ministral to
    # transformers, whose layers slide as the list says. MistralConfig has no bias keys, so transformers
    # builds no biases whatever config.json says of them (a Llama's attention_bias=true is refused instead).
    hf_folder(tmp_path, MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=5))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | no_window | {"attention_bias": True, "mlp_bias": True}))
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert not any(name.endswith(".bias") for name, _ in theirs.named_parameters())
    ours, _ = gpt_from_hf(tmp_path)
    assert (ours.config.window, ours.config.kv_heads) == (None, 2)
    assert max_logit_gap(ours, theirs, tokens()) < TOLERANCE


def test_a_key_left_out_whose_default_does_not_fit_is_named_as_left_out(tmp_path: Path) -> None:
    MistralConfig(**SMALL).save_pretrained(tmp_path)  # 4 query heads
    path = tmp_path / "config.json"
    path.write_text(json.dumps({key: value for key, value in json.loads(path.read_text()).items()
                                if key != "num_key_value_heads"}))  # MistralConfig's default: 8
    assert one_line_error(gpt_config_from_hf, tmp_path) == (
        f"{path} leaves num_key_value_heads out, and transformers' default for a Mistral, 8, does not fit: it must "
        "divide num_attention_heads=4; set num_key_value_heads there")


def test_a_llama_that_leaves_its_key_value_heads_out_has_one_per_query_head_as_transformers_reads_it(tmp_path: Path) -> None:
    LlamaConfig(**SMALL, num_key_value_heads=2).save_pretrained(tmp_path)  # 4 query heads
    path = tmp_path / "config.json"
    path.write_text(json.dumps({key: value for key, value in json.loads(path.read_text()).items()
                                if key != "num_key_value_heads"}))
    assert LlamaConfig.from_pretrained(tmp_path).num_key_value_heads == 4
    shape, _ = gpt_config_from_hf(tmp_path)
    assert (shape.n_head, shape.kv_heads) == (4, 4)


def test_the_smollm2_preset_fine_tunes_a_llama_folder_and_keeps_its_shape(llama_folder: Path, tmp_path: Path) -> None:
    preset = composed_train_config(["experiment=finetune_smollm2"])
    assert OmegaConf.missing_keys(preset) == set() and preset.init_from == "HuggingFaceTB/SmolLM2-135M"
    assert (preset.optim.name, preset.optim.lr, preset.optim.schedule, preset.model.block_size) == ("adamw", 1e-3, "cosine", 256)
    result = run_cli("train.py", "experiment=finetune_smollm2", f"init_from={llama_folder}", "model.block_size=32",
                     "data.n_chars=20000", "train.max_steps=2", "train.eval_interval=2", "train.eval_iters=1",
                     "train.batch_size=2", "train.grad_accum_steps=1", "optim.warmup_steps=1", "train.attn_log_interval=0",
                     "train.sample_interval=0", "train.probe_tokens=24", "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "model.block_size=32 crops Llama's 64 positions to 32" in result.stdout
    checkpoint = Checkpoint.load(tmp_path / "run" / "ckpt_last.pt")
    shape = checkpoint.config["model"]
    assert checkpoint.step == 2 and (shape["n_kv_head"], shape["mlp_hidden"], shape["rope_theta"]) == (2, 48, 500000.0)
    assert shape["rope_scaling"]["factor"] == 8.0 and shape["norm_eps"] == 1e-6 and not shape["tie_head"]
    trained, _ = checkpoint.build_model()
    assert not torch.equal(trained.blocks[0].attn.qkv.weight, gpt_from_hf(llama_folder)[0].blocks[0].attn.qkv.weight)


def test_a_shape_value_that_contradicts_a_llamas_weights_is_one_line(llama_folder: Path, tmp_path: Path) -> None:
    result = run_cli("train.py", f"init_from={llama_folder}", "model.n_kv_head=4", "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert f"model.n_kv_head=4 contradicts the weights of init_from={llama_folder}, which have model.n_kv_head=2" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.filterwarnings("ignore:In 'last'. Defaults list is missing `_self_`")  # Hydra's, for a primary config without it
def test_a_presets_model_values_take_those_of_the_presets_it_extends_in_hydras_order(tmp_path: Path) -> None:
    assert preset_model_values("mistral_shape") == {**preset_model_values("llama_shape"), "window": 64}
    assert preset_model_values("finetune_gpt2") == {"block_size": 256, "dropout": 0.0} and preset_model_values("mine") == {}
    (tmp_path / "base.yaml").write_text("model:\n  n_kv_head: 2\n  pos: rope\n")
    (tmp_path / "last.yaml").write_text("defaults:\n  - base\nmodel:\n  n_kv_head: 4\n")  # _self_ last, as Hydra puts it
    (tmp_path / "first.yaml").write_text("defaults:\n  - _self_\n  - base\nmodel:\n  n_kv_head: 4\n  window: 8\n")
    assert preset_model_values("last", tmp_path) == {"n_kv_head": 4, "pos": "rope"}
    assert preset_model_values("first", tmp_path) == {"n_kv_head": 2, "window": 8, "pos": "rope"}
    # As Hydra itself reads them (a primary config's defaults name the files beside it, as a preset's do).
    with initialize_config_dir(str(tmp_path), version_base="1.3"):
        for name in ("last", "first"):
            assert OmegaConf.to_container(compose(name).model) == preset_model_values(name, tmp_path)


@pytest.mark.parametrize("preset, refused", [
    # qwen3_shape's QK-norm is also the default model's: a preset's value counts as asked for all the same.
    (["experiment=qwen3_shape"], "model.qk_norm=true, set by experiment=qwen3_shape, contradicts the weights of "
                                 "init_from={folder}, which have model.qk_norm=false; leave experiment=qwen3_shape out"),
    (["experiment=mistral_shape"], "model.window=64, set by experiment=mistral_shape, contradicts the weights of "
                                   "init_from={folder}, which have model.window=null; leave experiment=mistral_shape out"),
    (["experiment=llama_shape"], None),  # the weights' own shape
    (["experiment=qwen3_shape", "model.qk_norm=false"], None),  # a typed value wins over the preset's
])
def test_a_shape_preset_beside_init_from_is_checked_against_the_weights_and_named(
        llama_folder: Path, tmp_path: Path, preset: list[str], refused: str | None) -> None:
    result = run_cli("train.py", *preset, f"init_from={llama_folder}", "train.max_steps=0", "data.n_chars=20000",
                     "hydra.run.dir=run", cwd=tmp_path)
    if refused is None:
        assert result.returncode == 0, result.stdout + result.stderr
        assert not Checkpoint.load(tmp_path / "run" / "ckpt_last.pt").config["model"]["qk_norm"]  # Llama's, as the weights
    else:
        assert result.returncode == 2 and result.stderr.strip() == f"error: {refused.format(folder=llama_folder)}: " \
            "with init_from the shape comes from the weights"
        assert not (tmp_path / "run").exists()
