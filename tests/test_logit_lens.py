"""The logit lens (inspection/logit_lens.py): after the last layer it is the model's own output to
the bit; after layer l it is what a model cut after layer l would say."""

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from inspection.logit_lens import lens_summary, logit_lens
from model import GPT
from tests.helpers import ARCHITECTURE_OPTIONS, CIRCUIT_TOKENIZER, tiny_gpt
from user_error import UserError

TOKENS = torch.randint(0, 65, (2, 12), generator=torch.Generator().manual_seed(4))  # (B, T)


def perturbed(model: GPT, seed: int = 0) -> GPT:
    """model with weights of a trained model's scale (logits of several units), so that a part
    left out or counted twice moves the numbers well past float error."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


@pytest.mark.parametrize("options", ARCHITECTURE_OPTIONS, ids=str)
def test_the_lens_after_the_last_layer_is_the_models_own_output_to_the_bit(options):
    model = perturbed(tiny_gpt(**options))
    lens = logit_lens(model, TOKENS)  # (L, B, T, V)
    logits, _ = model(TOKENS)
    assert lens.shape == (2, *TOKENS.shape, 65)
    assert torch.equal(lens[-1], F.log_softmax(logits, dim=-1))


def test_the_lens_after_layer_0_is_what_the_model_cut_after_layer_0_says():
    model = perturbed(tiny_gpt(smear=True, bias=True))
    cut = GPT(type(model.config)(**{**vars(model.config), "n_layer": 1}))
    cut.load_state_dict({name: value for name, value in model.state_dict().items() if not name.startswith("blocks.1.")})
    lens = logit_lens(model, TOKENS)
    torch.testing.assert_close(lens[0], F.log_softmax(cut.eval()(TOKENS)[0], dim=-1), atol=1e-5, rtol=0)
    assert (lens[0] - lens[1]).abs().max() > 0.5  # layer 1 changes the prediction: a lens that skipped it would show


def test_the_summary_gives_each_layers_rank_probability_and_top_tokens_of_the_next_token():
    model = perturbed(tiny_gpt())
    idx = TOKENS[:1]  # (1, T)
    lens = logit_lens(model, idx)[:, 0]  # (L, T, V)
    summary = lens_summary(model, idx, k=5)
    next_ids = idx[0, 1:]
    for layer in range(2):
        for t in range(idx.shape[1] - 1):
            order = lens[layer, t].argsort(descending=True)
            assert summary.next_rank[layer, t] == (order == next_ids[t]).nonzero().item() + 1
            assert summary.next_log_prob[layer, t] == lens[layer, t, next_ids[t]]
        order = lens[layer].argsort(dim=-1, descending=True)[:, :5]  # (T, 5): the five likeliest, by sorting
        assert torch.equal(summary.top_ids[layer], order)
        torch.testing.assert_close(summary.top_probs[layer], lens[layer].gather(1, order).exp())
    assert set(summary.next_rank.flatten().tolist()) != {1}  # not every token is top: ranks are really counted


def test_the_summary_says_one_position_in_words_and_shows_its_shapes_not_its_numbers():
    # Printed, the summary was some 150 lines of tensors, with ids and no tokens.
    model = perturbed(tiny_gpt(vocab_size=CIRCUIT_TOKENIZER.vocab_size))
    idx = torch.tensor([CIRCUIT_TOKENIZER.encode("abcab")])  # (1, 5)
    summary = lens_summary(model, idx, k=3)
    assert repr(summary) == ("LensSummary(2 layers, 5 tokens, the top 3: next_log_prob and next_rank (2, 4), top_ids and "
                             "top_probs (2, 5, 3); .describe(tokenizer, position) says one position in words)")
    lens = logit_lens(model, idx)[:, 0]  # (L, T, V)
    for position, came in ((1, "c"), (-1, None)):
        lines = summary.describe(CIRCUIT_TOKENIZER, position).splitlines()
        assert lines[0] == f"position {position % 5}:" and len(lines) == 3
        for layer, line in enumerate(lines[1:]):
            ids = lens[layer, position].argsort(descending=True)[:3].tolist()  # the three likeliest, by sorting
            top = ", ".join(f"{CIRCUIT_TOKENIZER.token_strings([i])[0]!r} {lens[layer, position, i].exp():.3f}" for i in ids)
            assert line.startswith(f"  after layer {layer}: {top}")
            if came is None:  # the last position: nothing in the sequence came after it
                assert "next came" not in line
            else:
                rank = int((lens[layer, position] > lens[layer, position, idx[0, 2]]).sum()) + 1
                assert line.endswith(f"; next came {came!r}: rank {rank}, p {lens[layer, position, idx[0, 2]].exp():.3f}")
    with pytest.raises(UserError, match=re.escape("position 5 is out of range: the sequence has 5 tokens")):
        summary.describe(CIRCUIT_TOKENIZER, 5)


def test_the_summary_of_anything_but_one_row_of_ids_is_one_line():
    model = tiny_gpt()
    with pytest.raises(ValueError, match=re.escape("lens_summary reads one sequence, idx of shape (1, T); got (2, 12)")):
        lens_summary(model, TOKENS)  # every row but the first would be left out
    with pytest.raises(ValueError, match=re.escape("got shape (12,): one text is idx[None]")):
        lens_summary(model, TOKENS[0])
    for k in (0, 2.5, "5"):  # 0 once gave empty lists, and the others an error from inside torch
        with pytest.raises(ValueError, match=re.escape(f"k={k!r} must be a whole number of at least 1")):
            lens_summary(model, TOKENS[:1], k=k)
    for k in (np.int64(3), torch.tensor(3)):  # whole numbers, as a layer or head number may be (refused once)
        assert lens_summary(model, TOKENS[:1], k=k).top_ids.shape[-1] == 3
