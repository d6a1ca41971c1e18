"""Direct logit attribution (inspection/logit_attribution.py): the parts add up to the model's own
logit on every architecture, and on the hand-built circuit the head that copies writes the answer."""

import re

import pytest
import torch

from inspection.logit_attribution import logit_attribution, residual_parts
from tests.helpers import ARCHITECTURE_OPTIONS, INDUCTION_HEAD, PREVIOUS_TOKEN_HEAD, shift_then_copy_model, tiny_gpt
from tests.test_logit_lens import TOKENS, perturbed
from user_error import UserError


@pytest.mark.parametrize("options", [*ARCHITECTURE_OPTIONS, {"bias": True}], ids=str)
def test_the_parts_add_up_to_the_real_logit_and_logit_difference(options):
    model = perturbed(tiny_gpt(**options))
    logits, _ = model(TOKENS)  # the plain forward, fused norms and attention
    tokens, others = logits[:, 5].argmax(dim=-1), logits[:, 5].argmin(dim=-1)  # one pair per row of the batch
    difference = logit_attribution(model, TOKENS, 5, tokens, others)
    single = logit_attribution(model, TOKENS, -1, 11)
    real_difference = logits[[0, 1], 5, tokens] - logits[[0, 1], 5, others]
    assert real_difference.abs().max() > 1.0  # logits of a trained model's scale: a lost part shows
    torch.testing.assert_close(difference.total(), real_difference, atol=1e-4, rtol=0)
    torch.testing.assert_close(difference.logit, real_difference, atol=1e-4, rtol=0)
    torch.testing.assert_close(single.total(), logits[:, -1, 11], atol=1e-4, rtol=0)
    assert difference.heads().shape == (2, 2, 2)  # (L, H, B)
    smear, learned = options.get("smear", False), options.get("pos", "learned") == "learned"
    assert list(difference.shares) == ["embed", *["smear"] * smear, *["pos_embed"] * learned,
                                       "L0H0", "L0H1", "0_mlp_out", "L1H0", "L1H1", "1_mlp_out", "bias"]


def test_the_parts_add_up_to_the_stream_that_leaves_the_last_block():
    model = perturbed(tiny_gpt(smear=True, bias=True))
    labels, parts, scale, _ = residual_parts(model, TOKENS)
    _, cache = model.run_with_cache(TOKENS, names=["blocks.1.hook_resid_post"])
    torch.testing.assert_close(parts.sum(dim=0), cache["resid_post", 1], atol=1e-5, rtol=0)
    assert parts.shape == (len(labels), *TOKENS.shape, 32) and scale.shape == (*TOKENS.shape, 1)


def test_on_the_circuit_the_induction_head_writes_the_copied_tokens_logit_and_nothing_else_does():
    model = shift_then_copy_model()
    first = torch.randperm(60, generator=torch.Generator().manual_seed(0))[:16]
    idx = torch.cat([first, first[:-1]]).unsqueeze(0)  # (1, 31): 16 tokens, then the first 15 again
    copied = int(first[-1])  # what the last query should copy
    attribution = logit_attribution(model, idx, -1, copied)
    layer, head = INDUCTION_HEAD
    assert attribution.shares[f"L{layer}H{head}"].item() == pytest.approx(12.0, abs=0.01)  # lm_head gives the copy 12
    others = {label: share.item() for label, share in attribution.shares.items() if label != f"L{layer}H{head}"}
    assert max(abs(share) for share in others.values()) < 1e-3, others
    assert others[f"L{PREVIOUS_TOKEN_HEAD[0]}H{PREVIOUS_TOKEN_HEAD[1]}"] == pytest.approx(0.0, abs=1e-6)  # it feeds, not writes


@pytest.mark.parametrize(("position", "token", "other", "message"), [
    (12, 3, None, "position 12 is out of range: the sequence has 12 tokens (positions 0 to 11, or -12 to -1 from the end)"),
    (-13, 3, None, "position -13 is out of range"),
    (0, 65, None, "token=65 is not a token id of this model: ids run from 0 to 64"),
    (0, [3, 65], None, "token=[3, 65] is not a token id of this model"),
    (0, True, None, "token=True is not a token id: an id is a whole number (torch.bool given), e.g. "
                    "token=tokenizer.encode(' Mia')[0]"),  # was torch's IndexError about a mask
    (0, 5.0, None, "token=5.0 is not a token id: an id is a whole number (torch.float32 given)"),  # "ids run from 0 to 64"
    (0, [1, 2, 3], None, "token gives 3 token ids for a batch of 2: give one id, or one per row"),
    (0, " Leo", None, "token=' Leo' is text: give its token id, e.g. tokenizer.encode(' Leo')[0] for a text of one token"),
    (0, [3, " Leo"], None, "token=' Leo' is text: give its token id"),
    (0, None, None, "token=None is not a token id: give one, e.g. token=tokenizer.encode(' Mia')[0], or one per row"),
    (0, [3, None], None, "token=[3, None] is not a token id"),
    (0, 3, 3, "token and other are both id 3: their difference is 0 whatever the model does"),
    (-1.0, 3, None, "position -1.0 is not a whole number: give the token's index, e.g. -1 for the last"),
])
def test_a_bad_request_is_one_line_naming_the_value(position, token, other, message):
    with pytest.raises(UserError, match="^" + re.escape(message)) as caught:
        logit_attribution(tiny_gpt(), TOKENS, position, token, other)
    assert "\n" not in str(caught.value)


def test_the_first_position_counted_from_the_end_is_position_0_and_a_batch_takes_one_id_or_one_per_row():
    model, ids = tiny_gpt(), torch.cat([TOKENS, TOKENS[:1]])  # (3, 12)
    first, from_the_end = (logit_attribution(model, ids, position, 3).total() for position in (0, -12))
    assert torch.equal(first, from_the_end)
    assert torch.equal(logit_attribution(model, ids, 0, [3, 3, 3]).total(), first)
    with pytest.raises(UserError, match=re.escape("token gives 2 token ids for a batch of 3: give one id, or one per row")):
        logit_attribution(model, ids, 0, [3, 4])


def test_ids_with_no_tokens_or_no_batch_are_the_models_own_one_line():
    with pytest.raises(ValueError, match=re.escape("idx must be token ids of shape (B, T) with T >= 1; got shape (2, 0)")):
        logit_attribution(tiny_gpt(), TOKENS[:, :0], -1, 3)
    with pytest.raises(ValueError, match=re.escape("got shape (12,): one text is idx[None], a batch of 1")):
        logit_attribution(tiny_gpt(), TOKENS[0], -1, 3)  # the model's own line, before the position is read
