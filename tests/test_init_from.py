"""init_from: a run that starts from a Hugging Face GPT-2 folder's weights, shape and tokenizer,
checked against transformers itself on a tiny random GPT-2 (tests/helpers.py), never the Hub."""

from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from data.tokenizer import EOT
from model.generation import terminal_text
from model.gpt import eval_mode
from model_io.checkpoint import Checkpoint
from tests.helpers import HARD_TEXT, read_events, run_cli, tiny_gpt2_folder

SMALL = ["data.n_chars=20000", "train.eval_iters=2", "train.batch_size=4", "train.sample_tokens=10", "train.probe_tokens=24"]
TOLERANCE = 1e-5  # fp32: the same math in another order is ~2e-6 apart here


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory) -> Path:
    return tiny_gpt2_folder(tmp_path_factory.mktemp("gpt2"))


@pytest.fixture(scope="module")
def weights_as_they_came(gpt2_folder, tmp_path_factory) -> Path:
    """train.max_steps=0: a run dir holding the folder's weights untouched, with step 0's logs."""
    work = tmp_path_factory.mktemp("as_they_came")
    result = run_cli("train.py", f"init_from={gpt2_folder}", "train.max_steps=0", *SMALL, "hydra.run.dir=run", cwd=work)
    assert result.returncode == 0, result.stderr
    return work / "run"


@pytest.mark.slow
def test_a_run_from_weights_gives_transformers_logits_and_token_ids(weights_as_they_came, gpt2_folder):
    checkpoint = Checkpoint.load(weights_as_they_came / "ckpt_last.pt")
    model, tokenizer = checkpoint.build_model()
    assert checkpoint.step == 0 and checkpoint.config["tokenizer"]["kind"] == "pretrained"
    shape = checkpoint.config["model"]  # GPT-2's, whatever the default model is
    assert (shape["pos"], shape["mlp"], shape["bias"], shape["qk_norm"], shape["smear"]) == ("learned", "gelu_tanh", True, False, False)
    ids = tokenizer.encode(HARD_TEXT)  # non-ASCII letters, emoji, tabs and runs of spaces
    assert ids == AutoTokenizer.from_pretrained(gpt2_folder)(HARD_TEXT)["input_ids"]
    reference = AutoModelForCausalLM.from_pretrained(gpt2_folder).eval()
    idx = torch.tensor([ids[:64]])  # (1, 64): the whole context
    with torch.no_grad(), eval_mode(model):
        gap = (model(idx)[0] - reference(idx).logits).abs().max().item()
    assert gap < TOLERANCE


@pytest.mark.slow
def test_step_zero_logs_the_attention_of_the_weights_as_they_came(weights_as_they_came):
    events = read_events(weights_as_they_came)
    assert [e.step for e in events.Scalars("loss/val")] == [0]
    assert [e.step for e in events.Tensors("attention/weights")] == [0]  # what the Attention tab reads
    assert any(tag.startswith("head_induction/") for tag in events.Tags()["scalars"])


@pytest.mark.slow
@pytest.mark.parametrize("use_kv_cache", ["true", "false"])
def test_sample_py_continues_greedily_as_transformers_generate(weights_as_they_came, gpt2_folder, use_kv_cache):
    prompt, new_tokens = "Once upon a time Alice", 24
    sampled = run_cli("sample.py", f"run={weights_as_they_came}", f"prompt={prompt}", "temperature=0",
                      f"max_new_tokens={new_tokens}", f"use_kv_cache={use_kv_cache}", cwd=weights_as_they_came)
    assert sampled.returncode == 0, sampled.stderr
    hf_tokenizer = AutoTokenizer.from_pretrained(gpt2_folder)
    reference = AutoModelForCausalLM.from_pretrained(gpt2_folder).eval()
    eot_id = hf_tokenizer.convert_tokens_to_ids(EOT)
    prompt_ids = torch.tensor([[eot_id, *hf_tokenizer(prompt)["input_ids"]]])  # as sample.py: after <|endoftext|>
    generated = reference.generate(prompt_ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                   pad_token_id=eot_id)  # (1, 1 + prompt + new)
    # Decoded by our tokenizer: a cut multi-byte character comes out as U+FFFD in a number of
    # copies that differs between the two decoders; the ids are what must agree.
    _, tokenizer = Checkpoint.load(weights_as_they_came / "ckpt_last.pt").build_model()
    assert sampled.stdout.rstrip("\n") == terminal_text(tokenizer.decode(generated[0, 1:].tolist()))


def test_a_short_fine_tune_from_the_weights_lowers_the_loss_in_a_cropped_context(gpt2_folder, tmp_path):
    result = run_cli("train.py", "experiment=finetune_gpt2", f"init_from={gpt2_folder}", *SMALL, "model.block_size=32",
                     "train.max_steps=12", "train.eval_interval=12", "train.grad_accum_steps=1", "optim.lr=3e-3",
                     "optim.min_lr=3e-3", "train.attn_log_interval=0", "train.sample_interval=0", "hydra.run.dir=run",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "model.block_size=32 crops GPT-2's 64 positions to 32" in result.stdout
    assert "note: init_from" not in result.stdout  # the preset fine-tunes with AdamW
    val = {e.step: e.value for e in read_events(tmp_path / "run").Scalars("loss/val")}
    assert sorted(val) == [0, 12] and val[12] < val[0] - 0.05, val
    assert Checkpoint.load(tmp_path / "run" / "ckpt_last.pt").model["pos_emb.weight"].shape == (32, 32)  # (block_size, C)


def test_training_from_the_weights_with_the_default_muon_says_which_optimizer_fine_tunes(gpt2_folder, tmp_path):
    result = run_cli("train.py", f"init_from={gpt2_folder}", *SMALL, "train.max_steps=1",
                     "train.attn_log_interval=0", "train.sample_interval=0", "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (f"note: init_from={gpt2_folder} trains with optim.name=muon, the default for training from scratch"
            in result.stdout)
    assert "optim.name=adamw optim.lr=3e-5" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["tokenizer=char"], "brings its own tokenizer (from {folder}); drop tokenizer=char"),
    (["tokenizer.vocab_size=512"], "brings its own tokenizer (from {folder}); drop tokenizer.vocab_size=512"),
    (["model.n_layer=3"], "model.n_layer=3 contradicts the weights of init_from={folder}, which have model.n_layer=2"),
    (["model.pos=rope"], "model.pos=rope contradicts the weights"),
    (["model.qk_norm=true"], "model.qk_norm=true contradicts the weights of init_from={folder}, which have model.qk_norm=false"),
    (["model.window=8"], "model.window=8 contradicts the weights of init_from={folder}, which have model.window=null"),
    (["model.block_size=100"], "model.block_size=100 is longer than the 64 positions the weights in {folder} learned"),
    (["train.max_steps=-1"], "train.max_steps=-1 must be at least 1 (0 only with init_from"),
])
def test_a_choice_that_contradicts_the_weights_is_one_line_and_writes_nothing(gpt2_folder, tmp_path, args, message):
    result = run_cli("train.py", f"init_from={gpt2_folder}", *args, "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 2
    assert message.format(folder=gpt2_folder) in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_an_empty_init_from_is_one_line_not_a_run_from_scratch(tmp_path):
    result = run_cli("train.py", "init_from=", "hydra.run.dir=run", cwd=tmp_path)  # init_from=$FOLDER with FOLDER unset
    assert result.returncode == 2 and result.stderr.strip() == ("error: init_from= is empty; give a Hugging Face folder "
                                                                "or a Hub repo id (like gpt2), or leave init_from out to "
                                                                "train from scratch")
    assert not (tmp_path / "run").exists()


def test_without_the_hub_init_from_gpt2_fails_at_once_saying_how_to_get_the_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # as HF_HUB_OFFLINE=1; no test needs the network
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    result = run_cli("train.py", "init_from=gpt2", "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "needs the Hugging Face Hub once" in result.stderr and "then init_from=<folder>" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_run_exported_to_hugging_face_is_a_folder_init_from_starts_from(weights_as_they_came, tmp_path):
    exported = run_cli("export.py", f"run={weights_as_they_came}", f"out={tmp_path / 'exported'}", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    again = run_cli("train.py", f"init_from={tmp_path / 'exported'}", "train.max_steps=0", *SMALL, "hydra.run.dir=again",
                    cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    first = Checkpoint.load(weights_as_they_came / "ckpt_last.pt")
    second = Checkpoint.load(tmp_path / "again" / "ckpt_last.pt")
    assert first.tokenizer == second.tokenizer | {"name": first.tokenizer["name"]}  # the same vocabulary, another folder
    for name, tensor in first.model.items():
        assert torch.equal(tensor, second.model[name]), name  # fp32 out and back in: bit for bit
