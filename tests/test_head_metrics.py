"""The head metrics on hand-built attention patterns whose answers are known."""

import math
import re

import pytest
import torch

from inspection.head_metrics import head_metrics, induction_probe, induction_score, run_induction_probe
from model import GPT, GPTConfig
from tests.helpers import made_up_attention

T = 12


def as_heads(*patterns: torch.Tensor) -> torch.Tensor:
    """Patterns (T, T) -> weights (1 layer, len(patterns) heads, T, T)."""
    return torch.stack(patterns).unsqueeze(0)


def previous_token_head(T: int) -> torch.Tensor:
    w = torch.zeros(T, T)
    w[0, 0] = 1.0  # the first token has nothing before it
    w[torch.arange(1, T), torch.arange(T - 1)] = 1.0
    return w


def uniform_causal_head(T: int) -> torch.Tensor:
    visible = torch.ones(T, T).tril()
    return visible / visible.sum(dim=-1, keepdim=True)


def self_head(T: int) -> torch.Tensor:
    return torch.eye(T)


def test_a_pure_previous_token_head_scores_1_looks_1_back_with_no_uncertainty():
    m = head_metrics(as_heads(previous_token_head(T)))
    assert m["previous_token"].item() == pytest.approx(1.0)
    assert m["distance"].item() == pytest.approx((T - 1) / T)  # query 0 can only look at itself
    assert m["entropy"].item() == pytest.approx(0.0)
    assert head_metrics(as_heads(previous_token_head(2)))["previous_token"].item() == pytest.approx(1.0)  # 2 tokens: one query
    assert head_metrics(as_heads(previous_token_head(1)))["previous_token"].item() == 0.0  # 1 token: no token before it


def test_uniform_attention_has_the_largest_entropy_a_causal_head_can_have():
    random_heads = [made_up_attention(seed, n_layer=1, n_head=1, T=T)[0, 0] for seed in range(5)]  # (T, T) each
    m = head_metrics(as_heads(uniform_causal_head(T), *random_heads))
    most = sum(math.log(t + 1) for t in range(T)) / T  # query t spreads evenly over t + 1 tokens
    assert m["entropy"][0, 0].item() == pytest.approx(most)
    assert (m["entropy"][0, 1:] < most - 0.05).all()
    assert m["distance"][0, 0].item() == pytest.approx(sum(t / 2 for t in range(T)) / T)  # mean of 0..t is t/2
    assert m["previous_token"][0, 0].item() == pytest.approx(sum(1 / (t + 1) for t in range(1, T)) / (T - 1))


def test_a_head_that_attends_to_itself_looks_0_back():
    m = head_metrics(as_heads(self_head(T)))
    assert m["distance"].item() == 0 and m["previous_token"].item() == 0 and m["entropy"].item() == 0


def test_an_ideal_induction_head_scores_1_and_other_heads_do_not():
    n = 8
    ideal = torch.zeros(2 * n, 2 * n)
    ideal[:n] = previous_token_head(2 * n)[:n]  # the first copy has nothing to copy from
    ideal[n + torch.arange(n), torch.arange(n) + 1] = 1.0  # then: the token after the earlier occurrence
    scores = induction_score(as_heads(ideal, previous_token_head(2 * n), uniform_causal_head(2 * n)), n)
    assert scores[0, 0].item() == pytest.approx(1.0)
    assert scores[0, 1].item() == 0.0
    assert 0 < scores[0, 2].item() < 0.1  # uniform: 1 / (number of visible tokens)


def test_weights_of_another_length_than_the_probes_and_probes_that_cannot_be_drawn_are_one_line():
    n = 8
    with_start = torch.rand(2, 4, 2 * n + 1, 2 * n + 1)  # the probe read after a start token, its row and column kept
    with pytest.raises(ValueError, match=re.escape("induction_score reads weights on an induction_probe of 2n = 16 tokens, "
                                                   "(..., 16, 16); got shape (2, 4, 17, 17); with a start token in front of "
                                                   "the probe, leave its row and column out: weights[..., 1:, 1:]")):
        induction_score(with_start, n)  # each query's weight one position off: believable scores, all wrong
    assert induction_score(with_start[..., 1:, 1:], n).shape == (2, 4)
    with pytest.raises(ValueError, match=re.escape("(..., 200, 200); got shape (2, 4, 17, 17)") + "$"):
        induction_score(with_start, 100)  # was an IndexError
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="^" + re.escape(f"n={bad!r} must be a whole number of at least 1")):
            induction_probe(50, bad)
    with pytest.raises(ValueError, match="^" + re.escape("every id of the vocabulary (3) is in avoid: none is left")):
        induction_probe(3, 4, avoid={0, 1, 2})


def test_a_runs_induction_probe_fits_its_context_and_seeds_each_row_on_from_train_seed():
    # train.probe_tokens=100 with block_size 16: 8 tokens twice, a window the model can read whole.
    rows = run_induction_probe(50, probe_tokens=100, block_size=16, seed=3, avoid={0}, rows=3)  # (3, 16)
    assert rows.shape == (3, 16)
    for i, row in enumerate(rows.tolist()):
        assert row == induction_probe(50, 8, 3 + i, avoid={0})
    assert len({tuple(row) for row in rows.tolist()}) == 3
    assert run_induction_probe(50, probe_tokens=3, block_size=16, seed=3) is None  # n = 1: no second copy to score


def test_the_induction_probe_is_a_random_sequence_repeated_twice():
    probe = induction_probe(vocab_size=50, n=10, seed=3, avoid={0})
    assert len(probe) == 20 and probe[:10] == probe[10:]
    assert 0 not in probe and len(set(probe)) > 5
    assert probe == induction_probe(vocab_size=50, n=10, seed=3, avoid={0})  # fixed by the seed
    assert set(induction_probe(vocab_size=4, n=200, seed=3)) == {0, 1, 2, 3}  # avoiding nothing, any id is drawn, 0 too


def test_metrics_of_a_real_model_have_one_value_per_layer_and_head_in_range():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=30, block_size=16, n_layer=3, n_head=2, n_embd=16))
    weights = model.attention_weights(torch.randint(0, 30, (1, 16)))[:, 0]  # (L, H, T, T)
    m = head_metrics(weights)
    assert set(m) == {"entropy", "distance", "previous_token"}
    for value in m.values():
        assert value.shape == (3, 2)
    assert ((m["previous_token"] >= 0) & (m["previous_token"] <= 1)).all()
    assert (m["entropy"] <= sum(math.log(t + 1) for t in range(16)) / 16 + 1e-9).all()
