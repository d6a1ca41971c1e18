"""The recall probe: where names and items come back, and how its scores are read."""

import pytest
import torch

from data.stories import generate_stories
from data.tokenizer import CharTokenizer
from inspection.recall_probe import RecallProbe, recall_points, summarise


def test_recall_points_are_the_repeated_names_and_the_packed_items_named_again():
    text = "Mia met a fox named Tom. Mia packed a rope and a lamp. The lamp was old. Tom fell. Mia took the rope."
    points = [(text[p.start : p.end], p.kind, p.earlier_start) for p in recall_points(text)]
    assert points == [
        ("Mia", "name", 0),
        ("Tom", "name", text.index("Tom")),
        ("Mia", "name", text.index("Mia packed")),  # the latest earlier mention
        ("rope", "item", text.index("rope")),  # "the rope", first packed as "a rope"
    ]  # "The lamp" (capital, a new sentence) is not counted; a first mention never is
    assert recall_points("Mia and Tom went home.") == []


def test_each_recall_point_is_a_mention_whose_word_appears_earlier_in_the_same_window(char_probe):
    tokenizer, probe = char_probe
    assert probe.windows.shape == (96, 128)
    assert len(probe.targets) > 50 and {kind for *_, kind in probe.targets} == {"name", "item"}
    for window, position, first, end, _ in probe.targets:
        ids = probe.windows[window].tolist()
        earlier = "".join(tokenizer.token_strings(ids[first:end]))
        later = "".join(tokenizer.token_strings(ids[position : position + len(earlier)]))
        assert earlier.isalpha() and later and earlier.startswith(later)  # the window may cut the later one short
        assert 0 <= first < end <= position < 128


def test_scores_read_a_perfect_predictor_and_a_head_that_looks_back(char_probe):
    tokenizer, probe = char_probe
    N, T = probe.windows.shape
    vocab = tokenizer.vocab_size
    logits = torch.zeros(N, T, vocab)
    logits[:, :-1].scatter_(-1, probe.windows[:, 1:].unsqueeze(-1), 1.0)  # always predicts the true next token
    weights = torch.zeros(1, N, 2, T, T)
    weights[0, :, 1] = torch.ones(T, T).tril() / torch.arange(1, T + 1).view(T, 1)  # head 1: uniform
    for window, position, first, _, _ in probe.targets:
        weights[0, window, 0, position - 1, first] = 1.0  # head 0: all weight on the earlier mention
    scores = probe.scores(logits, weights)
    assert scores.accuracy == 1.0 and scores.accuracy_by_kind == {"item": 1.0, "name": 1.0}
    assert scores.head_weight[0, 0].item() == pytest.approx(1.0)
    assert 0 < scores.head_weight[0, 1].item() < 0.2
    wrong = probe.scores(logits.roll(1, dims=-1), weights)  # every prediction off by one id
    assert wrong.accuracy == 0.0


def test_a_char_vocabulary_that_lacks_a_letter_of_the_held_out_stories_skips_those_stories():
    # A tiny corpus's char vocabulary misses letters (capitals of rare names) that the probe's
    # stories use: the probe keeps the stories it can encode, rather than failing the run.
    tokenizer = CharTokenizer.from_text("".join(generate_stories(seed=0, n_chars=3_000)))
    everything = set("".join(generate_stories(seed=1, n_chars=200_000)))
    assert everything - set(tokenizer.chars), "the test needs a vocabulary that lacks a letter"
    probe = RecallProbe.build(tokenizer, block_size=32, seed=1)
    assert len(probe.windows) == 96 and probe.targets


def test_recall_accuracy_is_over_every_point_names_and_items_alike_and_each_kind_has_its_own():
    looks = torch.zeros(2, 2)  # (L, H): where each head looked back, here nowhere
    scores = summarise([("name", True, looks), ("item", False, looks), ("name", True, looks), ("item", True, looks)])
    assert scores.accuracy == 0.75 and scores.accuracy_by_kind == {"item": 0.5, "name": 1.0}


def test_a_storys_windows_run_side_by_side_down_to_its_last_whole_one(char_probe):
    tokenizer, _ = char_probe
    block_size = 16
    probe = RecallProbe.build(tokenizer, block_size=block_size, seed=1338, max_windows=3000)
    windows, filled_exactly = probe.windows.tolist(), 0
    for story in generate_stories(1338, n_chars=200_000):
        ids = [tokenizer.bos_id, *tokenizer.encode(story)]
        n = min(len(ids) // block_size, len(windows))
        assert sum(windows[:n], []) == ids[: n * block_size]  # from the start token on, no gap, no overlap
        windows = windows[n:]
        if not windows:
            break
        assert len(ids) - n * block_size < block_size  # what is left over is too short for a window
        filled_exactly += len(ids) % block_size == 0
    assert not windows and filled_exactly > 0, "the test needs a story of whole windows and no window left over"


def test_an_earlier_mention_that_starts_its_window_counts(char_probe):
    _, probe = char_probe  # the window cuts the text anywhere, so a name may open it
    assert [first for _, _, first, _, _ in probe.targets].count(0) == 1
