"""Activation patching (inspection/patching.py) on the hand-built shift-then-copy circuit, where
the answer is known: the induction head's output carries it, the previous-token head's does not
(the copied token comes from the key's own embedding), and in the residual stream only the
position of the changed token carries it. TransformerLens's own patching is the reference in
tests/test_transformer_lens.py."""

import math
import re

import pytest
import torch

from data.tokenizer import CharTokenizer
from inspection import patching
from inspection.name_swap import NameSwap, name_swap
from inspection.patching import SMALL_GAP, Restored, knock_out_effects, logit_difference, patch_heads, patch_residual
from inspection.repeated_tokens import repeated_pair
from tests.helpers import INDUCTION_HEAD, one_line_error, shift_then_copy_model, tiny_gpt
from user_error import UserError

N = 16


@pytest.fixture(scope="module")
def circuit():
    """The circuit, a clean prompt (16 tokens, then the first 15 again: the answer is the 16th),
    a corrupted one whose 16th token is another (so the answer is that one), and the metric."""
    model = shift_then_copy_model()
    first = torch.randperm(60, generator=torch.Generator().manual_seed(0))[:N]
    clean = torch.cat([first, first[:-1]]).unsqueeze(0)  # (1, 31)
    corrupted = clean.clone()
    corrupted[0, N - 1] = 62
    return model, clean, corrupted, logit_difference(-1, int(first[-1]), 62)


def test_patching_the_induction_heads_output_restores_the_answer_and_no_other_head_does(circuit):
    model, clean, corrupted, metric = circuit
    restored = patch_heads(model, clean, corrupted, metric)
    assert restored.clean == pytest.approx(12.0, abs=0.01) and restored.corrupted == pytest.approx(-12.0, abs=0.01)
    expected = torch.zeros(2, 2, dtype=torch.float64)
    expected[INDUCTION_HEAD] = 1.0
    torch.testing.assert_close(restored.fraction, expected, atol=1e-3, rtol=0)


def test_the_repeated_pair_differs_where_the_last_query_copies_from_and_the_induction_head_alone_restores_it():
    model = shift_then_copy_model()
    clean, corrupted, answer, other = repeated_pair(model.config.vocab_size, start_id=0, eot_id=1, n=N, seed=0)
    assert len(clean) == len(corrupted) == 2 * N and clean[0] == 0 and clean[N] == answer and clean[-1] == clean[N - 1]
    assert [t for t, (a, b) in enumerate(zip(clean, corrupted, strict=True)) if a != b] == [N] and corrupted[N] == other
    assert len(set(clean[1 : N + 1])) == N and not {0, 1, other} & set(clean[1:])  # distinct, no start, end or other
    for seed in range(10):  # 6 tokens drawn of the 6 a vocabulary of 8 has besides the start and the end (a Llama's two)
        small_clean, _, _, small_other = repeated_pair(8, start_id=0, eot_id=1, n=5, seed=seed)
        assert sorted({*small_clean[1:], small_other}) == [2, 3, 4, 5, 6, 7]
    for n in (1, 6, 2.5):  # no copy to make; more tokens than there are to draw (an IndexError); not a number of tokens
        with pytest.raises(ValueError, match="^" + re.escape(f"n={n!r} must be a whole number from 2 to 5: n distinct tokens "
                                                             "and one more to put in place of the last, from the 6 that")):
            repeated_pair(8, start_id=0, eot_id=1, n=n, seed=0)
    restored = patch_heads(model, torch.tensor([clean]), torch.tensor([corrupted]), logit_difference(-1, answer, other))
    expected = torch.zeros(2, 2, dtype=torch.float64)
    expected[INDUCTION_HEAD] = 1.0
    torch.testing.assert_close(restored.fraction, expected, atol=1e-3, rtol=0)


def test_patching_the_stream_restores_the_answer_only_where_the_prompts_differ(circuit):
    model, clean, corrupted, metric = circuit
    fraction = patch_residual(model, clean, corrupted, metric).fraction  # (L, T)
    expected = torch.zeros(2, 2 * N - 1, dtype=torch.float64)
    expected[:, N - 1] = 1.0  # entering either block, the changed token's position holds it all
    torch.testing.assert_close(fraction, expected, atol=1e-3, rtol=0)
    backwards = patch_residual(model, corrupted, clean, metric).fraction  # the metric falls from clean to corrupted
    torch.testing.assert_close(backwards, expected, atol=1e-3, rtol=0)
    assert not torch.signbit(backwards[:, : N - 1]).any()  # before the change, the same stream: 0, printed as 0 not -0


def test_patches_batched_together_give_what_each_gives_run_alone(monkeypatch):
    model = tiny_gpt(seed=2).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(8)  # logits of several units
    clean = torch.randint(0, 65, (2, 10), generator=torch.Generator().manual_seed(1))  # (B, T)
    corrupted = clean.clone()
    corrupted[0, 4], corrupted[1, 2] = (corrupted[0, 4] + 9) % 65, (corrupted[1, 2] + 9) % 65  # each row from its own place
    metric = logit_difference(-1, 3, 5)
    monkeypatch.setattr(patching, "LOGIT_BUDGET", 3 * 2 * 10 * 65)  # 3 patches a batch: batches of 3, 3, ... and a rest
    rows = []  # the rows of each forward: at most 3 patched copies of the batch of 2
    forget = model.hook_dict["hook_embed"].add_hook(lambda embedding, hook: rows.append(embedding.shape[0]))
    heads = patch_heads(model, clean, corrupted, metric).patched  # (L, H)
    residual = patch_residual(model, clean, corrupted, metric).patched  # (L, T)
    forget()
    assert max(rows) == 3 * 2
    _, cache = model.run_with_cache(clean)

    def alone(name: str, index: tuple, source: torch.Tensor) -> float:
        def from_clean(activation, hook):
            activation = activation.clone()
            activation[(slice(None), *index)] = source[(slice(None), *index)]
            return activation
        return metric(model.run_with_hooks(corrupted, [(name, from_clean)])[0]).item()

    for layer in range(2):
        for head in range(2):
            assert heads[layer, head].item() == pytest.approx(
                alone(f"blocks.{layer}.attn.hook_z", (slice(None), head), cache["z", layer]), abs=1e-5), (layer, head)
        for position in range(10):
            assert residual[layer, position].item() == pytest.approx(
                alone(f"blocks.{layer}.hook_resid_pre", (position,), cache["resid_pre", layer]), abs=1e-5), (layer, position)
    assert heads.std() > 1e-3 and residual[:, 4:].std() > 1e-3  # the patches differ: a mix-up would show


def test_a_token_id_the_model_lacks_is_one_line_from_the_metric_too(circuit):
    model, clean, corrupted, _ = circuit
    with pytest.raises(UserError) as caught:
        patch_heads(model, clean, corrupted, logit_difference(-1, 3, 99_999))
    assert str(caught.value) == "other=99999 is not a token id of this model: ids run from 0 to 63"


def test_a_knock_outs_effect_is_what_the_metric_loses_without_the_head(circuit):
    model, clean, _, metric = circuit
    effects = knock_out_effects(model, clean, metric)
    intact = metric(model(clean)[0]).item()
    for layer in range(2):
        for head in range(2):
            with model.hooks(model.knock_out({(layer, head)})):
                assert effects[layer, head].item() == pytest.approx(intact - metric(model(clean)[0]).item(), abs=1e-4)
    assert effects[INDUCTION_HEAD] > 10 and effects[0, 0] > 10  # the previous-token head matters, through the other


@pytest.mark.parametrize(("corrupted", "metric", "message"), [
    (torch.zeros(1, 30, dtype=torch.long), None, "the clean prompt has 31 tokens and the corrupted one 30: patching "
     "swaps activations position by position, so give prompts of the same length"),
    ("same", None, "the metric is 12 on both prompts: there is nothing to restore"),
    ("two rows", None, "clean holds 1 prompt and corrupted 2 prompts: row i of each makes a pair, so give as many of each"),
    (None, lambda logits: logits[:, -1, :2], "the metric gave a tensor of shape (1, 2), not one number"),
    (None, logit_difference, "the metric takes (position, token, other=None), but it is called with the logits alone: give it "
     "its other arguments first (functools.partial), or pass what logit_difference(position, token, other) returns"),  # the builder itself, not what it builds
    (None, 12.0, "the metric is a float, not a function: pass a function of the logits (B, T, V) that gives one number"),
    (None, lambda logits: None, "the metric returned None, not a number: return one from it"),  # its return forgotten
    (None, lambda logits: "0.5", "the metric returned '0.5', not a number"),  # were torch's TypeError and RuntimeError
    (None, lambda logits: logits.sum() * math.nan, "the metric is nan on the clean prompt: every fraction would be NaN"),
    (None, lambda logits: logits[:, -1].log_softmax(-1)[:, 0].mean() - math.inf, "the metric is -inf on the clean prompt"),
])
def test_a_bad_request_is_one_line(circuit, corrupted, metric, message):
    model, clean, default_corrupted, default_metric = circuit
    if isinstance(corrupted, str):
        corrupted = clean if corrupted == "same" else default_corrupted.repeat(2, 1)  # "two rows"
    elif corrupted is None:
        corrupted = default_corrupted
    with pytest.raises(UserError) as caught:
        patch_heads(model, clean, corrupted, default_metric if metric is None else metric)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


@pytest.mark.parametrize("tool", [patch_heads, patch_residual])
def test_a_prompt_that_is_no_batch_of_token_ids_gets_the_models_one_line(circuit, tool):
    model, clean, corrupted, metric = circuit
    for bad, message in (("Leo met Mia", "{} must be a tensor of token ids of shape (B, T); got a str: encode it first"),
                         (clean.tolist(), "{} must be a tensor of token ids of shape (B, T); got a list: e.g. torch.tensor"),
                         (clean[0], f"{{}} must be token ids of shape (B, T) with T >= 1; got shape ({clean.shape[1]},): "
                                    "one text is {}[None]")):
        for name, pair in (("clean", (bad, corrupted)), ("corrupted", (clean, bad))):  # the prompt named
            with pytest.raises(ValueError, match="^" + re.escape(message.format(name, name))):
                tool(model, *pair, metric)


def test_patching_a_token_against_itself_is_one_line_not_nothing_to_restore(circuit):
    model, clean, corrupted, _ = circuit
    assert one_line_error(patch_heads, model, clean, corrupted, logit_difference(-1, 7, 7)) == (
        "token and other are both id 7: their difference is 0 whatever the model does; give other a token that competes with it")


@pytest.mark.parametrize(("names", "message"), [
    (("", "B"), "a name is '': give two names, each one token for this run's tokenizer"),
    (("A", "  "), "a name is '  ': give two names, each one token for this run's tokenizer"),
    (("A", "A"), "both names are 'A': swapped, the prompt is the same, so give two different names"),
    (("A", "Bo"), "' A' is 2 tokens for this run's tokenizer ([' ', 'A']), not one: of the stories' names none is one token "
                  "for it, and the swap needs two (a character tokenizer, or a small BPE, spells names out): use a run whose "
                  "BPE holds them, as the default run's does"),
])
def test_a_name_swap_of_names_that_are_not_one_token_each_is_one_line(names, message):
    # A character tokenizer: a name after its space is never one token. Its vocabulary lacks the
    # letters of the names a message would suggest: it suggests none rather than fail on them.
    with pytest.raises(UserError, match="^" + re.escape(message)):
        name_swap(CharTokenizer(list(" ABo")), *names)


def test_the_name_swaps_metric_is_the_answers_logit_less_the_others_at_the_last_position():
    swap = NameSwap(clean=torch.zeros(1, 4, dtype=torch.long), corrupted=torch.zeros(1, 4, dtype=torch.long), answer=3, other=5,
                    pieces=[])
    logits = torch.randn(1, 4, 8)  # (B, T, V)
    assert swap.metric()(logits).item() == pytest.approx((logits[0, -1, 3] - logits[0, -1, 5]).item())


@pytest.mark.parametrize(("clean", "corrupted", "said"), [
    (0.5, 0.0, "+0.5"), (0.0, 0.9, "-0.9"),  # under SMALL_GAP either way: said, with its sign
    (1.0, 0.0, None), (0.0, 12.0, None),  # SMALL_GAP and more, either way: nothing to say
    (math.nan, 0.0, None), (math.inf, 0.0, None),  # not a number: the fractions show it themselves
])
def test_the_caution_is_said_where_the_metric_moves_by_less_than_small_gap_between_the_prompts(clean, corrupted, said):
    assert SMALL_GAP == 1.0
    caution = Restored(torch.zeros(1, 1), clean, corrupted, torch.zeros(1, 1)).caution
    if said is None:
        assert caution is None
    else:
        assert caution == (f"the metric moves by only {said} between the two prompts, and each fraction divides by that: "
                           "they say little where the model barely tells the prompts apart")
