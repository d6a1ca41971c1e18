"""The GPT as a whole: its loss at init, that it learns, tying, init, and generation."""

import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model import GPT, eval_mode, generation
from model.generation import generate_text, generate_tokens, lay_out_for_decoding
from model.gpt import ReLUSquared, relu_squared
from model.sampling import choose_next_token, filter_logits
from tests.helpers import ARCHITECTURE_OPTIONS, previous_token_copier, tiny_gpt


def test_loss_at_init_is_close_to_ln_vocab_size():
    # Small initial weights give near-uniform predictions: loss ~ ln(V). Allow 0.1 nats.
    model = tiny_gpt(vocab_size=65)
    idx = torch.randint(0, 65, (8, 16))
    _, loss = model(idx, torch.randint(0, 65, (8, 16)))
    assert abs(loss.item() - math.log(65)) < 0.1


@pytest.mark.parametrize("options", ARCHITECTURE_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "gpt2")
def test_a_few_dozen_steps_on_a_tiny_corpus_lower_the_loss_clearly(options):
    text = "the cat sat on the mat. " * 40
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text])
    model = tiny_gpt(vocab_size=len(chars), **options)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(40):
        starts = torch.randint(0, len(ids) - 17, (8,), generator=generator)
        windows = torch.stack([ids[s : s + 17] for s in starts])  # (8, 17)
        _, loss = model(windows[:, :-1], windows[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], f"loss went {losses[0]:.2f} -> {losses[-1]:.2f}"


def test_lm_head_is_tied_to_the_token_embedding():
    model = tiny_gpt()
    assert model.lm_head.weight is model.tok_emb.weight
    # Counted once: the tied matrix appears a single time among the parameters.
    assert sum(p is model.tok_emb.weight for p in model.parameters()) == 1


def test_residual_projections_start_smaller_as_gpt2_does():
    model = tiny_gpt(n_layer=8, n_embd=256, n_head=4)
    residual = model.blocks[0].attn.proj.weight.std().item()
    regular = model.blocks[0].attn.qkv.weight.std().item()
    assert regular == pytest.approx(0.02, rel=0.05)
    assert residual == pytest.approx(0.02 / math.sqrt(2 * 8), rel=0.05)


def test_generate_never_feeds_more_than_block_size_tokens():
    model = tiny_gpt(block_size=8)
    seen_lengths = []
    model.register_forward_pre_hook(lambda module, args: seen_lengths.append(args[0].shape[1]))
    out = generate_tokens(model, torch.zeros(2, 3, dtype=torch.long), max_new_tokens=20, temperature=1.0, use_kv_cache=False)
    assert out.shape == (2, 23)
    assert max(seen_lengths) == 8
    assert seen_lengths[:9] == [3, 4, 5, 6, 7, 8, 6, 7, 8]  # full at 8: the window jumps back to 3/4 of it


def test_with_a_kv_cache_each_step_feeds_only_the_new_token_and_refills_when_full():
    model = tiny_gpt(block_size=8)
    seen_lengths, head_rows = [], []
    model.register_forward_pre_hook(lambda module, args: seen_lengths.append(args[0].shape[1]))
    model.lm_head.register_forward_pre_hook(lambda module, args: head_rows.append(args[0].shape[1]))
    out = generate_tokens(model, torch.zeros(2, 3, dtype=torch.long), max_new_tokens=12, temperature=1.0)
    assert out.shape == (2, 15)
    # The prompt, then one token at a time until the cache holds 8; then 6 (3/4 of 8) again.
    assert seen_lengths == [3, 1, 1, 1, 1, 1, 6, 1, 1, 6, 1, 1]
    assert head_rows == [1] * 12  # the LM head runs at the last position only, the prompt's too
    # A prompt longer than block_size: its last 8 tokens first, then 6 on the first slide.
    seen_lengths.clear()
    generate_tokens(model, torch.zeros(1, 20, dtype=torch.long), max_new_tokens=3, temperature=0.0)
    assert seen_lengths == [8, 6, 1]


@pytest.mark.parametrize("use_kv_cache", [True, False])
def test_every_eager_generation_step_leaves_cudnns_attention_out_and_gives_it_back_after(use_kv_cache):
    # cuDNN's kernel builds a plan per new shape, and each token is a new shape (model/generation.py).
    # The flag is process-wide, so it reads the same on a CPU, where that kernel does not exist.
    model, allowed = tiny_gpt(block_size=8), []
    model.register_forward_pre_hook(lambda module, args: allowed.append(torch.backends.cuda.cudnn_sdp_enabled()))
    assert torch.backends.cuda.cudnn_sdp_enabled()
    generate_tokens(model, torch.zeros(1, 3, dtype=torch.long), max_new_tokens=10, temperature=0.0, use_kv_cache=use_kv_cache)
    assert allowed == [False] * 10
    assert torch.backends.cuda.cudnn_sdp_enabled()  # training and everything else keep PyTorch's choice


@pytest.mark.parametrize(("dtype", "rows", "amx", "one_row_onednn"),
                         [(torch.bfloat16, 1, False, False), (torch.bfloat16, 2, False, True),
                          (torch.float32, 1, False, True), (torch.bfloat16, 1, True, True)],
                         ids=["bf16, one row", "bf16, two rows", "fp32, one row", "bf16, one row, AMX"])
def test_a_bfloat16_step_of_one_row_runs_without_onednn_and_every_other_step_with_it(dtype, rows, amx, one_row_onednn,
                                                                                          monkeypatch):
    # One bfloat16 row reads its weights twice as fast in torch's own loop as in oneDNN's
    # (model/generation.py); prompts and several rows are faster in oneDNN's, and so is one row on a
    # CPU with AMX. The switch is process-wide.
    model, allowed = tiny_gpt(block_size=8).to(dtype), []
    model.register_forward_pre_hook(lambda module, args: allowed.append((args[0].shape[1], torch.backends.mkldnn.enabled)))
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", True)  # as torch starts; and put back after a failure
    monkeypatch.setattr(generation, "ONEDNN_HAS_AMX", amx)  # what this CPU has decides it: both are tested here
    generate_tokens(model, torch.zeros(rows, 3, dtype=torch.long), max_new_tokens=10, temperature=0.0)
    # The prompt, one token at a time until the cache holds 8, then 6 (3/4 of 8) again.
    assert allowed == [(n, n > 1 or one_row_onednn) for n in (3, 1, 1, 1, 1, 1, 6, 1, 1, 6)]
    assert torch.backends.mkldnn.enabled  # training, the tab and everything else keep it


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="Linux's list of the CPU's features")
def test_amx_is_found_where_linux_lists_it():
    listed = "amx_tile" in Path("/proc/cpuinfo").read_text().split()
    assert generation.ONEDNN_HAS_AMX is listed


def test_onednn_comes_back_when_a_one_row_step_is_interrupted(monkeypatch):
    model = tiny_gpt(block_size=8).to(torch.bfloat16)
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", True)
    monkeypatch.setattr(generation, "ONEDNN_HAS_AMX", False)  # a CPU where one row switches it off
    steps = []

    def interrupt_the_third(module, args):
        steps.append(torch.backends.mkldnn.enabled)
        if len(steps) == 3:
            raise KeyboardInterrupt  # Ctrl-C inside sample.py's step

    model.register_forward_pre_hook(interrupt_the_third)
    with pytest.raises(KeyboardInterrupt):
        generate_tokens(model, torch.zeros(1, 3, dtype=torch.long), max_new_tokens=10, temperature=0.0)
    assert steps == [True, False, False] and torch.backends.mkldnn.enabled


def test_onednn_switched_off_by_the_user_stays_off_through_generation(monkeypatch):
    model, allowed = tiny_gpt(block_size=8).to(torch.bfloat16), []
    model.register_forward_pre_hook(lambda module, args: allowed.append(torch.backends.mkldnn.enabled))
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    generate_tokens(model, torch.zeros(1, 3, dtype=torch.long), max_new_tokens=4, temperature=0.0)
    assert allowed == [False] * 4 and not torch.backends.mkldnn.enabled  # not turned on at a step's end


def test_last_only_gives_the_last_positions_logits_of_the_whole_forward():
    model, idx = tiny_gpt(), torch.randint(0, 64, (2, 10))
    with torch.no_grad(), eval_mode(model):
        torch.testing.assert_close(model(idx, last_only=True)[0], model(idx)[0][:, -1:], rtol=0, atol=1e-6)


@pytest.mark.parametrize("attention", ["sdpa", "manual"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("new_tokens", [19, 70], ids=["fills block_size", "slides past it 3 times"])
def test_kv_cache_generation_equals_recomputing_the_context_token_for_token(attention, temperature, new_tokens):
    model = tiny_gpt(block_size=24, attention=attention)
    prompt = torch.randint(0, 65, (3, 5), generator=torch.Generator().manual_seed(0))
    kwargs = dict(max_new_tokens=new_tokens, temperature=temperature, top_k=20 if temperature else None)
    cached = generate_tokens(model, prompt, **kwargs, generator=torch.Generator().manual_seed(5))
    recomputed = generate_tokens(model, prompt, **kwargs, generator=torch.Generator().manual_seed(5), use_kv_cache=False)
    assert torch.equal(cached, recomputed)


def sliding_window_reference(model: GPT, idx: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Greedy decoding written out, over the window generate_tokens() documents: it starts
    at the context's first token and, once block_size tokens are in it and one more is due,
    jumps to the last 3/4 of block_size tokens."""
    block_size = model.config.block_size
    start = max(0, idx.shape[1] - block_size)
    for _ in range(max_new_tokens):
        if idx.shape[1] - start > block_size:
            start = idx.shape[1] - block_size * 3 // 4
        logits, _ = model(idx[:, start:])
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx


@pytest.mark.parametrize("use_kv_cache", [True, False])
def test_past_block_size_the_window_slides_as_documented(use_kv_cache):
    model = tiny_gpt(block_size=8).eval()
    prompt = torch.randint(0, 65, (2, 5), generator=torch.Generator().manual_seed(1))
    generated = generate_tokens(model, prompt, max_new_tokens=40, temperature=0, use_kv_cache=use_kv_cache)
    assert torch.equal(generated, sliding_window_reference(model, prompt, 40))
    long_prompt = torch.randint(0, 65, (1, 20), generator=torch.Generator().manual_seed(2))  # longer than block_size
    generated = generate_tokens(model, long_prompt, 10, temperature=0, use_kv_cache=use_kv_cache)
    assert torch.equal(generated, sliding_window_reference(model, long_prompt, 10))


def test_temperature_zero_is_greedy_and_matches_top_k_one():
    model = tiny_gpt()
    prompt = torch.randint(0, 65, (1, 4))
    greedy = generate_tokens(model, prompt, 12, temperature=0)
    again = generate_tokens(model, prompt, 12, temperature=0)
    top1 = generate_tokens(model, prompt, 12, temperature=1.0, top_k=1, generator=torch.Generator().manual_seed(3))
    assert torch.equal(greedy, again)
    assert torch.equal(greedy, top1)


def test_a_seeded_generator_makes_sampling_repeatable():
    model = tiny_gpt()
    prompt = torch.zeros(2, 1, dtype=torch.long)
    first = generate_tokens(model, prompt, 15, temperature=1.0, generator=torch.Generator().manual_seed(7))
    second = generate_tokens(model, prompt, 15, temperature=1.0, generator=torch.Generator().manual_seed(7))
    other = generate_tokens(model, prompt, 15, temperature=1.0, generator=torch.Generator().manual_seed(8))
    assert torch.equal(first, second)
    assert not torch.equal(first, other)


class DigitTokenizer:
    """All generate_text asks of a tokenizer: digits are ids 0 to 9, <|endoftext|> is 10."""

    eot_id = bos_id = 10

    def encode(self, text: str) -> list[int]:
        return [int(digit) for digit in text]

    def decode(self, ids: list[int]) -> str:
        return "".join("|" if i == self.eot_id else str(i) for i in ids)

    def in_byte_run(self, token_id: int) -> bool:
        return False


def test_generate_text_feeds_end_of_text_then_the_prompt_and_returns_the_prompt_and_its_continuation():
    model = tiny_gpt(vocab_size=11)
    fed = []
    model.register_forward_pre_hook(lambda module, args: fed.append(args[0][0].tolist()))
    samples = generate_text(model, DigitTokenizer(), "314", 6, temperature=1.0, num_samples=3, seed=1)
    assert fed[0] == [10, 3, 1, 4]  # <|endoftext|> first, as every training document starts after one
    assert len(samples) == 3 and all(len(text) == 9 and text.startswith("314") for text in samples)  # and not "|"
    assert samples == generate_text(model, DigitTokenizer(), "314", 6, temperature=1.0, num_samples=3, seed=1)
    assert samples != generate_text(model, DigitTokenizer(), "314", 6, temperature=1.0, num_samples=3, seed=2)


def test_generating_from_diverged_weights_raises_floating_point_error_instead_of_emitting_tokens():
    model = tiny_gpt()
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="NaN or inf: its weights have diverged"):
        generate_tokens(model, torch.zeros(1, 2, dtype=torch.long), 3, temperature=0)


def test_greedy_takes_the_first_of_tied_likeliest_tokens_in_each_row_at_every_precision():
    logits = torch.tensor([[0.5, 2.0, 1.0, 2.0], [3.0, -1.0, 3.0, 3.0]])  # ties at 1 and 3; at 0, 2 and 3
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        chosen = choose_next_token(logits.to(dtype), temperature=0, top_k=None, top_p=None, uniform=None)
        assert chosen.tolist() == [[1], [0]], dtype
    # 1.0 and 1.0078125 (1 + 2**-7) are one bfloat16 step apart: still told apart.
    # And bfloat16's range is float32's: 8e4 beats 7e4, though float16 would make both inf.
    close = torch.tensor([[1.0, 1.0078125, 1.0], [7e4, 8e4, -7e4]], dtype=torch.bfloat16)
    assert choose_next_token(close, temperature=0, top_k=None, top_p=None, uniform=None).tolist() == [[1], [1]]


def test_top_k_and_top_p_keep_only_the_likeliest_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[False, False, True, True]]
    # top_p=0.7: 0.5 alone is not enough, 0.5 + 0.3 is; the rest go.
    assert torch.isinf(filter_logits(logits, top_p=0.7)).tolist() == [[False, False, True, True]]
    # The likeliest token always survives, however small top_p is.
    assert torch.isinf(filter_logits(logits, top_p=0.01)).tolist() == [[False, True, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.0)).tolist() == [[False, True, True, True]]
    # A set that reaches top_p exactly is enough: two even tokens and top_p=0.5 keep one.
    assert torch.isinf(filter_logits(torch.zeros(1, 2), top_p=0.5)).tolist() == [[False, True]]
    assert torch.equal(filter_logits(logits, top_k=0, top_p=1.0), logits)


def test_eval_mode_switches_dropout_off_inside_and_restores_the_mode_after_even_on_error():
    model = tiny_gpt(attention="sdpa", dropout=0.5)
    idx = torch.randint(0, 65, (1, 9))
    with eval_mode(model):
        assert not model.training and torch.equal(model(idx)[0], model(idx)[0])  # no dropout: same logits
    assert model.training
    with pytest.raises(FloatingPointError), eval_mode(model):
        raise FloatingPointError  # e.g. generate_tokens() on a diverged model
    assert model.training
    model.eval()
    with eval_mode(model):
        pass
    assert not model.training  # a model in eval mode stays there


def test_attention_weights_are_the_models_own_and_leave_training_mode_alone():
    model = tiny_gpt(attention="sdpa", dropout=0.1)
    model.train()
    idx = torch.randint(0, 65, (1, 9))
    weights = model.attention_weights(idx)  # (L, B, H, T, T)
    assert model.training
    assert weights.shape == (2, 1, 2, 9, 9)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 1, 2, 9))
    # The same parameters through the manual path give the same weights.
    manual = tiny_gpt(attention="manual", dropout=0.1)
    manual.load_state_dict(model.state_dict())
    torch.testing.assert_close(manual.attention_weights(idx), weights)


@pytest.mark.parametrize("pos", ["rope", "learned"])
def test_a_sequence_longer_than_block_size_is_refused(pos):
    model = tiny_gpt(block_size=8, pos=pos)
    with pytest.raises(ValueError, match="exceeds block_size=8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    if pos == "learned":  # no position past the table: one token more after caches that hold 8 is refused too
        caches = model.new_caches()
        model(torch.zeros(1, 8, dtype=torch.long), caches=caches)
        with pytest.raises(ValueError, match="sequence length 9 exceeds block_size=8"):
            model(torch.zeros(1, 1, dtype=torch.long), caches=caches)


@pytest.mark.parametrize(("idx", "message"), [
    (torch.zeros(1, 0, dtype=torch.long), "idx must be token ids of shape (B, T) with T >= 1; got shape (1, 0)"),
    (torch.tensor([1, 2, 3]), "idx must be token ids of shape (B, T) with T >= 1; got shape (3,): one text is idx[None], a batch of 1"),
    (torch.tensor([[1, 65]]), "token id 65 is not in this model's vocabulary: ids run from 0 to 64"),
    (torch.tensor([[-1, 2]]), "token id -1 is not in this model's vocabulary: ids run from 0 to 64"),
    (torch.tensor([[-1, 65]]), "token id -1 is not in this model's vocabulary: ids run from 0 to 64"),  # the lowest first
    (torch.tensor([], dtype=torch.long), "idx must be token ids of shape (B, T) with T >= 1; got shape (0,)"),
    (torch.tensor([[1.0, 2.0]]), "idx must be token ids of dtype torch.long (or torch.int32); got torch.float32: use idx.long()"),
    (torch.tensor([[1, 2]], dtype=torch.uint16), "idx must be token ids of dtype torch.long (or torch.int32); got torch.uint16: "
                                                 "use idx.long()"),  # the token cache's dtype
    ("Once upon a time", "idx must be a tensor of token ids of shape (B, T); got a str: encode it first, e.g. "
                         "torch.tensor([tokenizer.encode(text)])"),  # TransformerLens's models take a text
    ([[1, 2]], "idx must be a tensor of token ids of shape (B, T); got a list: e.g. torch.tensor([ids]) for one text's "
               "list of ids, torch.as_tensor(array) for a (B, T) array"),
], ids=["no tokens", "no batch", "past the vocabulary", "negative", "both ends", "empty", "floats", "uint16", "a text",
        "a list"])
def test_ids_the_model_cannot_read_are_one_line_naming_them(idx, message):
    # What a learner hands model(), run_with_cache() or the tools by mistake; torch's own errors
    # for these come from deep inside (an IndexError of the embedding, of idx.shape[1]).
    model = tiny_gpt()
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        model(idx)
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        model.run_with_cache(idx)


IDX = torch.tensor([[1, 2, 3], [4, 5, 6]])  # (2, 3)


@pytest.mark.parametrize(("targets", "message"), [
    (IDX.T.contiguous(), "targets must have the logits' shape (B, T) = (2, 3), one next-token id for each position of idx; "
                         "got shape (3, 2)"),  # flattened, it paired the wrong positions: a loss, and no word
    (IDX.flatten(), "targets must have the logits' shape (B, T) = (2, 3), one next-token id for each position of idx; "
                    "got shape (6,)"),
    (IDX.float(), "targets must be token ids of dtype torch.long (or torch.int32); got torch.float32: use targets.long()"),
    ([[2, 3, 4], [5, 6, 7]], "targets must be a tensor of next-token ids of shape (2, 3), as idx; got a list"),
    (torch.tensor([[2, 3, 4], [5, 6, 65]]), "target id 65 is not in this model's vocabulary: ids run from 0 to 64 (or -100, a "
                                            "position the loss leaves out)"),
    (torch.tensor([[2, 3, -1], [5, 6, 7]]), "target id -1 is not in this model's vocabulary: ids run from 0 to 64 (or -100, a "
                                            "position the loss leaves out)"),
    (torch.full((2, 3), -100), "every target is -100, a position the loss leaves out: no position is left to average a loss "
                               "over"),  # a NaN loss
], ids=["transposed", "flat", "floats", "a list", "past the vocabulary", "negative", "none counted"])
def test_targets_that_do_not_pair_an_id_with_each_position_are_one_line(targets, message):
    model = tiny_gpt()
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        model(IDX, targets)
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        model.run_with_hooks(IDX, targets=targets)
    # -100 leaves a position out, as cross_entropy's ignore_index does; int32 ids are read as long.
    kept = torch.tensor([[2, 3, -100], [5, 6, 7]])
    _, loss = model(IDX, kept)
    logits, _ = model(IDX)
    assert torch.equal(loss, F.cross_entropy(logits.flatten(0, 1), kept.flatten()))
    assert torch.equal(model(IDX, IDX.int())[1], model(IDX, IDX)[1])


def test_the_id_check_stays_out_of_a_compiled_forward():
    # Reading the ids' range is a data-dependent branch: under torch.compile it would cut the forward
    # into pieces (graph breaks), so the check runs only outside a compile. Dynamo's trace alone, no compiler.
    try:
        explained = torch._dynamo.explain(tiny_gpt().eval())(torch.zeros(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.long))
    finally:
        torch._dynamo.reset()  # nothing of this trace left to the worker's later compiles
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@pytest.mark.parametrize("options", ARCHITECTURE_OPTIONS[1:], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_each_architecture_option_gives_the_same_outputs_and_gradients_on_both_attention_paths(options):
    manual, sdpa = tiny_gpt(attention="manual", **options), tiny_gpt(attention="sdpa", **options)
    sdpa.load_state_dict(manual.state_dict())
    idx = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(0))
    targets = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(1))
    (logits_manual, loss_manual), (logits_sdpa, loss_sdpa) = manual(idx, targets), sdpa(idx, targets)
    torch.testing.assert_close(logits_manual, logits_sdpa, atol=1e-5, rtol=1e-4)
    loss_manual.backward()
    loss_sdpa.backward()
    for (name, a), (_, b) in zip(manual.named_parameters(), sdpa.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4, msg=f"gradient of {name}")


@pytest.mark.parametrize("options", ARCHITECTURE_OPTIONS[1:], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_each_architecture_option_samples_the_same_with_and_without_the_kv_cache(options):
    model = tiny_gpt(block_size=16, **options)
    prompt = torch.randint(0, 65, (2, 4), generator=torch.Generator().manual_seed(0))
    assert torch.equal(generate_tokens(model, prompt, 30, temperature=0), generate_tokens(model, prompt, 30, temperature=0, use_kv_cache=False))


@pytest.mark.parametrize("options", ARCHITECTURE_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "gpt2")
def test_weights_laid_out_for_decoding_keep_names_values_and_tying_and_sample_the_same_tokens(options):
    model = tiny_gpt(block_size=16, bias=True, **options)
    prompt = torch.randint(0, 65, (2, 4), generator=torch.Generator().manual_seed(0))
    idx = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(1))

    def outputs() -> tuple[torch.Tensor, ...]:
        sampled = generate_tokens(model, prompt, 30, temperature=1.0, top_k=20, generator=torch.Generator().manual_seed(5))
        with torch.no_grad(), eval_mode(model):
            return generate_tokens(model, prompt, 30, temperature=0), sampled, model(idx)[0]

    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    greedy, sampled, logits = outputs()
    lay_out_for_decoding(model)
    linears = [module for module in model.modules() if isinstance(module, nn.Linear)]
    assert all(module.weight.t().is_contiguous() for module in linears)  # each (out, in) weight stored (in, out)
    assert model.lm_head.weight.t().is_contiguous() and (model.lm_head.weight is model.tok_emb.weight) == model.config.tie_head
    after = model.state_dict()
    assert list(after) == list(state) and all(torch.equal(after[name], state[name]) for name in state)
    greedy_after, sampled_after, logits_after = outputs()
    assert torch.equal(greedy_after, greedy) and torch.equal(sampled_after, sampled)
    torch.testing.assert_close(logits_after, logits, rtol=0, atol=1e-5)  # the same sums, maybe in another order


def test_laying_out_for_decoding_leaves_bf16_weights_and_an_already_laid_out_model_as_they_are():
    bf16 = tiny_gpt().to(torch.bfloat16)
    lay_out_for_decoding(bf16)
    assert all(parameter.is_contiguous() for parameter in bf16.parameters())  # one bf16 row's loop reads (out, in) faster
    model = tiny_gpt()
    lay_out_for_decoding(model)
    storage = model.lm_head.weight.data_ptr()
    lay_out_for_decoding(model)  # twice is once
    assert model.lm_head.weight.t().is_contiguous() and model.lm_head.weight.data_ptr() == storage


def test_smear_gives_each_position_its_own_token_and_the_one_before_and_nothing_else():
    model = tiny_gpt(smear=True)
    idx = torch.randint(0, 65, (1, 10), generator=torch.Generator().manual_seed(0))
    changed = idx.clone()
    changed[0, 4] = (idx[0, 4] + 1) % 65
    with torch.no_grad():
        moved = (model.embed(changed) - model.embed(idx)).abs().amax(dim=-1)[0]  # (T,)
    assert moved[4] > 0 and moved[5] > 0  # the token itself, and the next one, which takes it in
    assert moved[[0, 1, 2, 3, 6, 7, 8, 9]].max() == 0
    plain = tiny_gpt()
    with torch.no_grad():
        assert (plain.embed(changed) - plain.embed(idx)).abs().amax(dim=-1)[0, 5] == 0


def test_relu_squared_gives_exactly_the_values_and_gradients_autograd_gives_relu_then_square():
    x = torch.tensor([[-2.0, -0.5, 0.0, 0.3, 1.0, 7.5]] * 2, requires_grad=True)
    upstream = torch.randn(2, 6)
    expected = torch.nn.functional.relu(x).square()
    (expected_grad,) = torch.autograd.grad(expected, x, upstream)
    out = ReLUSquared.apply(x)
    (grad,) = torch.autograd.grad(out, x, upstream)
    assert torch.equal(out, expected) and torch.equal(grad, expected_grad)  # bit for bit: x2 is exact
    assert grad[:, :3].eq(0).all() and not grad[:, 3:].eq(0).any()
    assert type(relu_squared(x).grad_fn).__name__ == "ReLUSquaredBackward"  # training takes the quick backward
    with torch.no_grad():
        assert torch.equal(relu_squared(x), expected)  # and sampling the plain ops


def test_rope_has_no_position_table_and_an_untied_head_its_own_matrix():
    rope = tiny_gpt(pos="rope")
    assert rope.pos_emb is None and "pos_emb.weight" not in rope.state_dict()
    assert not any("rope" in name for name in rope.state_dict())  # derived from the sizes, not saved
    untied = tiny_gpt(tie_head=False)
    assert untied.lm_head.weight is not untied.tok_emb.weight
    assert untied.num_parameters() == tiny_gpt().num_parameters() + 65 * 32


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_functions_that_hand_nothing_back_leave_the_model_bitwise_its_own(attention):
    # At every point but those that choose the manual path (scores, pattern) or spell a norm out
    # (scale, normalized): there the same math runs in other kernels, equal to rounding only.
    model = tiny_gpt(attention=attention, pos="rope", qk_norm=True, smear=True)
    idx, targets = torch.randint(0, 65, (2, 2, 12), generator=torch.Generator().manual_seed(0))

    def logits_cached_logits_and_gradients() -> list[torch.Tensor]:
        model.zero_grad()
        logits, loss = model(idx, targets)
        loss.backward()
        with torch.no_grad():
            caches = model.new_caches()
            cached = torch.cat([model(idx[:, a:b], caches=caches)[0] for a, b in ((0, 5), (5, 6), (6, 12))], dim=1)
        return [logits, cached, *(p.grad for p in model.parameters())]

    assert model.knock_out(set()) == []  # nothing asked: nothing attached, no work at all
    plain = logits_cached_logits_and_gradients()
    seen = []
    def look(activation, hook):
        seen.append(hook.name)
    path_choosers = ("hook_attn_scores", "hook_pattern", "hook_scale", "hook_normalized")
    with model.hooks([(lambda name: not name.endswith(path_choosers), look)]):
        looked_at = logits_cached_logits_and_gradients()
    assert all(torch.equal(a, b) for a, b in zip(plain, looked_at, strict=True))  # bit for bit
    assert "blocks.1.attn.hook_z" in seen and "smear.hook_out" in seen and not model.has_hooks()


def without_output_columns(model: GPT, heads: set[tuple[int, int]]) -> GPT:
    """A copy of model whose output projections never read the given heads' channels."""
    copy = tiny_gpt(attention=model.config.attention, n_head=model.config.n_head)
    copy.load_state_dict(model.state_dict())
    D = model.config.n_embd // model.config.n_head
    with torch.no_grad():
        for layer, head in heads:
            copy.blocks[layer].attn.proj.weight[:, head * D : (head + 1) * D] = 0.0  # (C, D): head's columns
    return copy


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_a_knocked_out_head_gives_the_model_whose_output_projection_never_reads_it(attention):
    # Both zero the head's term of the output projection; only the order of two zeros can differ.
    model = tiny_gpt(attention=attention, n_head=4)
    idx = torch.randint(0, 65, (2, 12), generator=torch.Generator().manual_seed(0))
    for heads in ({(1, 2)}, {(0, 0), (1, 3)}):
        without = without_output_columns(model, heads)
        with torch.no_grad(), model.hooks(model.knock_out(heads)):
            torch.testing.assert_close(model(idx)[0], without(idx)[0], atol=1e-6, rtol=1e-5)
            assert not torch.allclose(model(idx)[0], tiny_gpt(attention=attention, n_head=4)(idx)[0], atol=1e-4)
            for use_kv_cache in (True, False):
                knocked_out = generate_tokens(model, idx[:, :4], 12, temperature=0, use_kv_cache=use_kv_cache)
                assert torch.equal(knocked_out, generate_tokens(without, idx[:, :4], 12, temperature=0, use_kv_cache=use_kv_cache))
    assert not model.has_hooks()


def knocked_out_heads(model: GPT) -> set[tuple[int, int]]:
    """The heads whose output z a forward zeroes now, read from a forward through hook_z."""
    _, cache = model.run_with_cache(torch.tensor([[1, 2, 3]]), names=lambda name: name.endswith("hook_z"))
    z = cache.stack_activation("z")  # (L, B, T, H, D)
    return {(layer, head) for layer, head in (z.abs().sum(dim=(1, 2, 4)) == 0).nonzero().tolist()}


def test_hooks_detach_every_function_after_the_block_even_on_error_and_save_nothing():
    model = tiny_gpt()
    keys = model.state_dict().keys()
    with model.hooks(model.knock_out({(0, 1)})):
        assert knocked_out_heads(model) == {(0, 1)}
        with model.hooks(model.knock_out([(1, 0)])):  # heads an enclosing block knocked out stay out
            assert knocked_out_heads(model) == {(0, 1), (1, 0)}
        assert knocked_out_heads(model) == {(0, 1)}
        saved = model.state_dict()
    assert knocked_out_heads(model) == set() and not model.has_hooks()
    with pytest.raises(FloatingPointError), model.hooks(model.knock_out({(1, 1)})):
        raise FloatingPointError  # e.g. a probe on a diverged model
    assert not model.has_hooks()
    assert saved.keys() == keys  # nothing in a checkpoint: one saved before or during loads into any model
    tiny_gpt(seed=1).load_state_dict(saved)


@pytest.mark.parametrize(("heads", "message"), [
    ({(2, 0)}, "no layer 2 (in (2, 0)): this model has layers 0 to 1 and heads 0 to 1"),
    ({(0, 0), (0, -1)}, "no head -1 in layer 0: this model has layers 0 to 1 and heads 0 to 1"),
    ({(1, 2)}, "no head 2 in layer 1: this model has layers 0 to 1 and heads 0 to 1"),  # one past the last head
    ({(2, 5)}, "no layer 2 (in (2, 5)): this model has layers 0 to 1 and heads 0 to 1"),  # the layer said first
    ({(0, 1, 2)}, "heads are (layer, head) pairs of whole numbers, e.g. {(0, 1)}; got (0, 1, 2)"),
    ((0, 1), "heads are (layer, head) pairs of whole numbers, e.g. {(0, 1)}; got 0"),
    ({(0.0, 1)}, "heads are (layer, head) pairs of whole numbers, e.g. {(0, 1)}; got (0.0, 1)"),  # 0.0 in range(2) holds
    ([(True, 0)], "heads are (layer, head) pairs of whole numbers, e.g. {(0, 1)}; got (True, 0)"),
    ([(torch.tensor(1.0), 0)], "heads are (layer, head) pairs of whole numbers, e.g. {(0, 1)}; got (tensor(1.), 0)"),
    (None, "heads are (layer, head) pairs of whole numbers, e.g. {(0, 1)}; got None"),  # 'NoneType' object is not iterable
    ("01", "heads are (layer, head) pairs of whole numbers, e.g. {(0, 1)}; got '01'"),
])
def test_knocking_out_a_layer_or_head_the_model_lacks_is_refused_with_the_valid_range(heads, message):
    model = tiny_gpt()
    with pytest.raises(ValueError, match=re.escape(message)):
        model.knock_out(heads)
    assert not model.has_hooks()


def test_a_pair_of_heads_may_come_as_a_list_as_json_gives_it_and_twice_is_once():
    model = tiny_gpt()
    assert [name for name, _ in model.knock_out([[1, 0], (1, 0), (torch.tensor(1), 1)])] == ["blocks.1.attn.hook_z"]
    idx = torch.arange(6).view(1, 6)
    with model.hooks(model.knock_out([[1, 0]])):
        from_list = model(idx)[0]
    with model.hooks(model.knock_out({(1, 0)})):
        torch.testing.assert_close(from_list, model(idx)[0], rtol=0, atol=0)


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_knocking_out_the_previous_token_head_destroys_the_copy_and_knocking_out_another_does_not(attention):
    model = previous_token_copier(attention)
    idx = torch.randint(0, 8, (64, 8), generator=torch.Generator().manual_seed(0))
    targets = torch.cat([idx[:, :1], idx[:, :-1]], dim=1)  # the token before; the first token sees only itself

    def logits_accuracy_and_loss() -> tuple[torch.Tensor, float, float]:
        with torch.no_grad():
            logits, loss = model(idx, targets)
        return logits, (logits.argmax(-1) == targets).float().mean().item(), loss.item()

    intact, accuracy, loss = logits_accuracy_and_loss()
    assert accuracy == 1.0 and loss < 1e-4
    with model.hooks(model.knock_out({(0, 1)})):
        logits, accuracy, loss = logits_accuracy_and_loss()
        assert accuracy == 1.0 and loss < 1e-4  # head 1 did not carry the copy...
        assert not torch.equal(logits, intact)  # ...though it was out: the logits moved
    with model.hooks(model.knock_out({(0, 0)})):
        _, accuracy, loss = logits_accuracy_and_loss()
        assert accuracy < 0.25  # chance is 1/8
        assert loss == pytest.approx(math.log(8), rel=1e-6)  # all logits 0: nothing of the previous token is left


@pytest.mark.parametrize(("settings", "message"), [
    ({"max_new_tokens": -1}, "max_new_tokens=-1 must be a whole number, 0 or more"),  # torch's "expanded size" error
    ({"max_new_tokens": 2.5}, "max_new_tokens=2.5 must be a whole number"),
    ({"top_k": -1}, "top_k=-1 must be a whole number, 1 or more (0 or None: off)"),  # torch's "k out of range"
    ({"temperature": -1.0}, "temperature=-1.0 must be 0 (greedy) or a number from 1e-30 up"),  # sampled as if fine
    ({"temperature": math.nan}, "temperature=nan must be 0 (greedy)"),
    ({"temperature": 1e-40}, "temperature=1e-40 is too small to divide float32 logits by; give 0"),  # NaN, token 0
    ({"top_p": 0.0}, "top_p=0.0 must be in (0, 1] (1.0 or None: off)"),
    ({"top_p": 2.0}, "top_p=2.0 must be in (0, 1]"),
    ({"generator": 0}, "generator=0 is no torch.Generator: give torch.Generator().manual_seed(seed), or None"),  # torch's 9 lines
    ({"on_token": 5}, "on_token=5 is not a function: give a function of the tokens so far, or None"),  # after the first token
])
def test_generate_tokens_refuses_settings_it_cannot_sample_with_in_one_line(settings, message):
    # sample.py checks its own first; a notebook calls generate_tokens with whatever it was given.
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        generate_tokens(tiny_gpt(), torch.zeros(1, 3, dtype=torch.long), **{"max_new_tokens": 2, **settings})


@pytest.mark.parametrize(("settings", "message"), [
    ({"num_samples": 0}, "num_samples=0 must be at least 1"),  # said as "idx must be token ids of shape (B, T)"
    ({"num_samples": 2.0}, "num_samples=2.0 must be a whole number, at least 1"),  # "can't multiply sequence by non-int"
    ({"seed": 1.5}, "seed=1.5 must be a whole number from 0 to 9223372036854775807"),  # torch's "manual_seed expected a long"
    ({"seed": -1}, "seed=-1 must be a whole number from 0 to 9223372036854775807"),
    ({"prompt": None}, "prompt must be a text (a str); got a NoneType: token ids go to generate_tokens"),  # tiktoken's words
    ({"prompt": [1, 2]}, "prompt must be a text (a str); got a list: token ids go to generate_tokens"),
    ({"temperature": -1.0}, "temperature=-1.0 must be 0 (greedy)"),  # the settings generate_tokens checks, as there
])
def test_generate_text_refuses_what_it_cannot_sample_with_in_one_line(settings, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        generate_text(tiny_gpt(vocab_size=11), DigitTokenizer(), **{"prompt": "314", "max_new_tokens": 2, **settings})
