"""What several test files build: tiny Hugging Face GPT-2 folders, made offline with transformers
and tokenizers (the independent reference), never fetched from the Hub; and the induction circuit
built by hand."""

import dataclasses
import math
import string
from pathlib import Path

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tokenizers import ByteLevelBPETokenizer
from transformers import GPT2Config, GPT2LMHeadModel

from data.stories import generate_stories
from data.tokenizer import EOT, CharTokenizer
from inspection.head_metrics import induction_probe
from model import GPT, GPTConfig
from model_io.checkpoint import BEST, Checkpoint
from training.tensorboard_log import RunLogger

# A trained GPT-2's scale rather than HF's init (0.02 everywhere): logits of a few units, and GELU
# inputs around 1, where its tanh form is ~1e-4 off erf's (near 0 the two agree).
WEIGHT_STDS = {"wte.weight": 0.3, "mlp.c_fc.weight": 0.3, "mlp.c_proj.weight": 0.2}
HARD_TEXT = ("Café naïve, Straße, 日本語 and 🙂👍🏽 emoji\n\n\ttabs\t\tand   runs of    spaces \r\n"
             "digits 1234567890 and 3.14, don't 'quote' it , so . it is ! is it ? it 's do n't \n")


def tiny_gpt2(seed: int = 0, vocab_size: int = 301, eot_id: int = 300, n_positions: int = 64,
              **options) -> GPT2LMHeadModel:
    """A random GPT2LMHeadModel with GPT-2's settings (tanh GELU, eps 1e-5, biases) at a tiny size;
    its LayerNorms perturbed away from 1 and 0 so that a lost or swapped one shows."""
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=n_positions, vocab_size=vocab_size,
                        activation_function="gelu_new", bos_token_id=eot_id, eos_token_id=eot_id, **options)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            std = next((std for suffix, std in WEIGHT_STDS.items() if name.endswith(suffix)), None)
            if ".ln_" in name:
                parameter.add_(0.3 * torch.randn_like(parameter))
            elif std is not None:
                parameter.normal_(0, std)
            elif name.endswith("bias"):
                parameter.normal_(0, 0.02)
    return model


def tiny_bpe_folder(folder: Path, vocab_size: int = 400) -> ByteLevelBPETokenizer:
    """A byte-level BPE trained by `tokenizers` on the built-in stories, <|endoftext|> first (id 0),
    saved in GPT-2's layout (vocab.json, merges.txt) and as tokenizer.json."""
    trained = ByteLevelBPETokenizer()
    stories = "".join(generate_stories(seed=11, n_chars=30_000))
    trained.train_from_iterator([stories, HARD_TEXT], vocab_size=vocab_size, special_tokens=[EOT], show_progress=False)
    folder.mkdir(parents=True, exist_ok=True)
    trained.save(str(folder / "tokenizer.json"))
    trained.save_model(str(folder))
    return trained


def tiny_gpt2_folder(folder: Path, seed: int = 0, n_positions: int = 64) -> Path:
    """A whole Hugging Face GPT-2 folder, as init_from reads one: a tiny random model
    (model.safetensors, config.json) and its tiny BPE (vocab.json, merges.txt, tokenizer.json)."""
    trained = tiny_bpe_folder(folder)
    eot_id = trained.token_to_id(EOT)
    tiny_gpt2(seed, vocab_size=trained.get_vocab_size(), eot_id=eot_id, n_positions=n_positions).save_pretrained(folder)
    return folder


def read_events(run_dir: Path) -> EventAccumulator:
    """A run's TensorBoard events, read whole by TensorBoard's own reader."""
    events = EventAccumulator(str(run_dir), size_guidance={"images": 0, "scalars": 0, "tensors": 0})
    events.Reload()
    return events


PREVIOUS_TOKEN_HEAD, INDUCTION_HEAD = (0, 0), (1, 0)  # (layer, head) in shift_then_copy_model


@torch.no_grad()
def shift_then_copy_model(vocab_size: int = 64, block_size: int = 32) -> GPT:
    """Two layers of two heads; head 0 of layer 0 writes each token's predecessor into the
    residual stream (a previous-token head), head 0 of layer 1 looks for the key whose
    predecessor is the current token and copies that key's token to the output (an induction
    head). The other heads and the MLPs write nothing. The residual stream is four one-hot
    blocks: [token | previous token | copied token | position]."""
    C = 3 * vocab_size + block_size
    config = GPTConfig(vocab_size, block_size, n_layer=2, n_head=2, n_embd=C, pos="learned", norm="rmsnorm",
                       mlp="gelu", tie_head=False, qk_norm=False, smear=False)
    model = GPT(config).eval()
    for parameter in model.parameters():
        parameter.zero_()
    for norm in (model.ln_f, *[block.ln_1 for block in model.blocks], *[block.ln_2 for block in model.blocks]):
        norm.weight.fill_(1.0)
    D = C // 2  # head_dim
    token, previous, copied, position = (torch.arange(vocab_size), vocab_size + torch.arange(vocab_size),
                                         2 * vocab_size + torch.arange(vocab_size), 3 * vocab_size + torch.arange(block_size))
    model.tok_emb.weight[torch.arange(vocab_size), token] = 1.0
    model.pos_emb.weight[torch.arange(block_size), position] = 1.0
    # RMSNorm scales a stream of m one-hot blocks by sqrt(C / m): the weights below undo it, so that
    # each value is a one-hot of 1 and a matching query and key score `sharp` (any other pair 0).
    sharp = 30.0
    # Layer 0 (the stream: token, position), head 0: the query at position t matches the key at
    # t - 1, and moves that key's token into `previous`.
    qkv, proj = model.blocks[0].attn.qkv.weight, model.blocks[0].attn.proj.weight  # (3C, C), (C, C)
    qkv[torch.arange(block_size), position] = sharp * math.sqrt(D) / (C / 2)  # W_q: position t -> query dim t
    qkv[C + torch.arange(1, block_size), position[:-1]] = 1.0  # W_k: position s -> key dim s + 1
    qkv[2 * C + torch.arange(vocab_size), token] = math.sqrt(2 / C)  # W_v: the token
    proj[previous, torch.arange(vocab_size)] = 1.0
    # Layer 1 (token, position, previous), head 0: the query holds the current token, a key its
    # own predecessor; the value is the key's token, written into `copied`.
    qkv, proj = model.blocks[1].attn.qkv.weight, model.blocks[1].attn.proj.weight
    qkv[torch.arange(vocab_size), token] = sharp * math.sqrt(D) / (C / 3)
    qkv[C + torch.arange(vocab_size), previous] = 1.0
    qkv[2 * C + torch.arange(vocab_size), token] = math.sqrt(3 / C)
    proj[copied, torch.arange(vocab_size)] = 1.0
    model.lm_head.weight[torch.arange(vocab_size), copied] = 12.0 / math.sqrt(C / 4)  # the copied token's logit: 12
    return model


CIRCUIT_TOKENIZER = CharTokenizer(list(string.ascii_letters + string.digits + "."))  # 63 characters, <|endoftext|> 63
CIRCUIT_BLOCK_SIZE = 40  # <eot> and up to 19 tokens twice
CIRCUIT_N = 16  # random tokens, then the same 16 again: 33 tokens with <eot>
# A seed whose 16 tokens all differ: a token twice in the first copy has two earlier occurrences,
# and even an ideal induction head splits its weight between the tokens after them.
CIRCUIT_SEED = next(seed for seed in range(100) if len(set(
    induction_probe(CIRCUIT_TOKENIZER.vocab_size, CIRCUIT_N, seed, CIRCUIT_TOKENIZER.eot_id)[:CIRCUIT_N])) == CIRCUIT_N)


def save_circuit(run_dir: Path) -> GPT:
    """shift_then_copy_model as a run's checkpoint, beside an event file (TensorBoard lists the run)."""
    model = shift_then_copy_model(CIRCUIT_TOKENIZER.vocab_size, CIRCUIT_BLOCK_SIZE)
    shape = {key: value for key, value in dataclasses.asdict(model.config).items() if key != "vocab_size"}
    run_dir.mkdir()
    Checkpoint(model.state_dict(), {"model": shape}, CIRCUIT_TOKENIZER.state(), step=0).save(run_dir / BEST)
    logger = RunLogger(run_dir)
    logger.scalars(0, {"loss/train": 4.2})
    logger.close()
    return model
