"""The forward the Attention tab runs on a learner's own text (inspection/text_forward.py), on
tiny models: its numbers are the model's own, and a knocked-out head gives knock_out's hooks'."""

import math
import re

import pytest
import torch
import torch.nn.functional as F

from data.tokenizer import CharTokenizer
from inspection.repeated_tokens import default_n, repeated_ids
from inspection.text_forward import forward_text, single_token
from model import GPT
from tests.helpers import previous_token_copier, tiny_gpt
from user_error import UserError

TOKENIZER = CharTokenizer(list(" abcdefghijklmnopqrstuvwxyz."))
TEXT = "the cat sat. the cat ran."


def text_gpt(block_size: int = 32, n_layer: int = 2) -> GPT:
    """tests/helpers.py's tiny_gpt with 16 channels and today's blocks, its weights 5x its init."""
    model = tiny_gpt(TOKENIZER.vocab_size, block_size, n_layer=n_layer, n_embd=16, pos="rope", qk_norm=True, smear=True,
                     mlp="relu2")
    with torch.no_grad():
        for parameter in model.parameters():  # larger than GPT-2's init, so that the heads differ clearly
            parameter.mul_(5)
    return model.eval()


def ids_of(text: str) -> torch.Tensor:
    return torch.tensor([[TOKENIZER.eot_id, *TOKENIZER.encode(text)]])  # (1, T)


def test_the_text_is_read_after_endoftext_and_labelled_as_the_heatmaps_label_tokens():
    forward = forward_text(text_gpt(), TOKENIZER, "a cat.")
    assert forward.ids == ids_of("a cat.")[0].tolist()
    assert forward.labels == ["<eot>", "a", "·", "c", "a", "t", "."]


def test_the_top_5_are_the_likeliest_next_tokens_of_the_models_own_logits():
    model = text_gpt()
    forward = forward_text(model, TOKENIZER, TEXT)
    with torch.no_grad():
        probs = model(ids_of(TEXT))[0][0].softmax(-1)  # (T, vocab_size), through the fused attention path
    top = forward.predictions
    assert top.top_ids.shape == top.top_probs.shape == (len(TEXT) + 1, 5)
    # The forward takes the manual path (it returns the weights): the same math up to rounding.
    torch.testing.assert_close(top.top_probs, probs.gather(1, top.top_ids), atol=1e-6, rtol=1e-5)
    assert torch.equal(top.top_ids[:, 0], probs.argmax(-1))
    assert (top.top_probs[:, :-1] >= top.top_probs[:, 1:]).all()  # likeliest first
    assert (top.top_probs.sum(-1) <= 1 + 1e-6).all() and (top.top_probs.sum(-1) < 0.999).any()  # 5 of 28: not all


def test_the_loss_beside_each_token_is_the_cross_entropy_of_the_token_that_came_next():
    model = text_gpt()
    idx = ids_of(TEXT)
    with torch.no_grad():
        logits, mean_loss = model(idx[:, :-1], idx[:, 1:])  # (1, T - 1, V): what train.py's loss reads
    loss = forward_text(model, TOKENIZER, TEXT).predictions.next_loss
    assert loss.shape == (len(TEXT),)  # the last token has no next one
    torch.testing.assert_close(loss, F.cross_entropy(logits[0], idx[0, 1:], reduction="none"), atol=1e-5, rtol=1e-5)
    assert loss.mean().item() == pytest.approx(mean_loss.item(), rel=1e-5)


def test_the_weights_are_the_ones_attention_weights_gives():
    model = text_gpt()
    forward = forward_text(model, TOKENIZER, TEXT)
    assert torch.equal(forward.weights, model.attention_weights(ids_of(TEXT))[:, 0])  # (L, H, T, T)
    assert forward.knocked_out == [] and forward.intact is None and forward.intact_top_probs is None


def test_with_a_head_knocked_out_every_number_is_the_knocked_out_models_and_the_intact_ones_come_beside():
    model, idx = text_gpt(), ids_of(TEXT)
    forward = forward_text(model, TOKENIZER, TEXT, knocked_out=[(0, 1), (0, 1)])
    with torch.no_grad(), model.hooks(model.knock_out({(0, 1)})):
        weights, probs = model.attention_weights(idx)[:, 0], model(idx)[0][0].softmax(-1)
    intact_probs = model(idx)[0][0].softmax(-1).detach()
    assert forward.knocked_out == [(0, 1)]
    assert torch.equal(forward.weights, weights)
    assert torch.equal(forward.weights[0], model.attention_weights(idx)[0, 0])  # layer 0 reads before the head is out
    assert not torch.allclose(forward.weights[1], model.attention_weights(idx)[1, 0], atol=1e-3)  # layer 1 after it
    torch.testing.assert_close(forward.predictions.top_probs, probs.gather(1, forward.predictions.top_ids), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(forward.intact.top_probs, intact_probs.gather(1, forward.intact.top_ids), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(forward.intact_top_probs, intact_probs.gather(1, forward.predictions.top_ids), atol=1e-6, rtol=1e-5)
    assert torch.equal(forward.intact.next_loss, forward_text(model, TOKENIZER, TEXT).predictions.next_loss)
    assert not torch.allclose(forward.predictions.next_loss, forward.intact.next_loss, atol=1e-3)
    assert not model.has_hooks()  # every head back after


def test_knocking_out_the_copy_head_takes_the_copied_token_from_the_top_and_its_probability_down():
    # A hand-built model whose head 0 copies the previous token and predicts it (tests/test_model.py).
    model, tokenizer = previous_token_copier("manual"), CharTokenizer(list("abcdefg"))  # 8 ids: 7 and <|endoftext|>
    text = "gfedcba"
    intact = forward_text(model, tokenizer, text)
    assert intact.predictions.top_ids[1:, 0].tolist() == intact.ids[:-1]  # after each token: the one before it
    assert (intact.predictions.top_probs[1:, 0] > 0.99).all()
    out = forward_text(model, tokenizer, text, knocked_out=[(0, 0)])
    torch.testing.assert_close(out.predictions.top_probs, torch.full((8, 5), 1 / 8))  # nothing of the copy is left
    torch.testing.assert_close(out.predictions.next_loss, torch.full((7,), math.log(8)))
    assert (out.intact.top_probs[1:, 0] > 0.99).all()  # beside it, the intact model's
    assert torch.equal(forward_text(model, tokenizer, text, knocked_out=[(0, 1)]).predictions.top_ids[1:, 0],
                       intact.predictions.top_ids[1:, 0])  # the other head was not needed for the copy


@pytest.mark.parametrize(("text", "message"), [
    ("", "the text is empty: type a sentence"),
    (" \n ", "the text is empty: type a sentence"),
    ("abcdefgh", "the text is too long: 8 tokens, and this model reads at most 7 after the <eot> it starts with "
                 "(8 in all, its block_size); shorten it"),  # <eot>, as the tab labels that token
    # longer than 32 characters per token it may hold: refused before tokenizing (é is not in the vocabulary)
    ("é" * 257, "the text is too long: 257 characters, and this model reads at most 8 tokens (its block_size); shorten it"),
    ("aé", "the text has characters the model never saw in training: 'é'"),
])
def test_an_empty_or_too_long_text_is_refused_saying_the_block_size(text, message):
    with pytest.raises(UserError) as refused:
        forward_text(text_gpt(block_size=8), TOKENIZER, text)
    assert str(refused.value).startswith(message)


def test_a_model_of_too_short_a_context_for_any_text_or_copy_says_so_not_that_the_input_is_too_long():
    # model.block_size=1 trains: the tab said "1 tokens, and this model reads at most 0", and for
    # repeated tokens "n=0 is out of range: give 2 to 0", an n the user never sent.
    with pytest.raises(UserError, match="^" + re.escape("this model's block_size=1 leaves no room for a text after the <eot> "
                                                        "each one starts with: use a run of model.block_size=2 or more") + "$"):
        forward_text(text_gpt(block_size=1), TOKENIZER, "a")
    for block_size in (1, 4):
        with pytest.raises(UserError, match="^" + re.escape(f"this model's block_size={block_size} is too short for repeated "
                                                            "random tokens: the start token and two copies of at least 2")):
            repeated_ids(TOKENIZER, default_n(block_size), seed=0, block_size=block_size)
    assert len(repeated_ids(TOKENIZER, 2, seed=0, block_size=5)) == 5


def test_seven_tokens_fit_a_block_size_of_8_with_endoftext_before_them():
    assert forward_text(text_gpt(block_size=8), TOKENIZER, "abcdefg").weights.shape == (2, 2, 8, 8)


def test_knocking_out_a_head_the_model_lacks_is_refused_saying_which_heads_it_has():
    with pytest.raises(UserError, match=r"no layer 2 \(in 2:0\): this model has layers 0 to 1 and heads 0 to 1"):
        forward_text(text_gpt(), TOKENIZER, TEXT, knocked_out=[(2, 0)])


def test_a_typed_token_is_its_one_id_and_more_than_one_token_is_refused_naming_the_pieces():
    assert single_token(TOKENIZER, " ") == TOKENIZER.encode(" ")[0]
    with pytest.raises(UserError, match=r"^' a' is 2 tokens to this model \('·', 'a'\), not one: type a single token$"):
        single_token(TOKENIZER, " a")
    with pytest.raises(UserError, match="^" + re.escape("'a\\n' is 2 tokens to this model ('a', '\\n'), not one")):
        single_token(CharTokenizer(list("a\n")), "a\n")  # the newline's piece escaped once, as the tab's labels show it
    with pytest.raises(UserError, match=r"^the token is empty"):
        single_token(TOKENIZER, "")
    with pytest.raises(UserError, match=r"^'a{32}'\.\.\. \(5,000 characters\) is not one token"):
        single_token(TOKENIZER, "a" * 5000)
