"""inspection/heatmap.py: the attention maps TensorBoard shows, token labels and colours."""

import re

import numpy as np
import pytest
import torch

from inspection.heatmap import (
    COLORMAP,
    FUTURE,
    colour_level,
    hidden_cells,
    readable_token,
    render_attention_map,
    render_head_grid,
)
from tests.helpers import tiny_gpt


def test_readable_token_marks_spaces_and_newlines():
    assert readable_token(" the") == "·the"
    assert readable_token("\n") == "\\n"
    assert readable_token("a\tb") == "a\\tb"
    assert readable_token("é", unicode_ok=False) == "\\xe9"
    assert readable_token("é", unicode_ok=True) == "é"
    assert readable_token("") == "∅"


def test_colour_scale_is_square_root_from_0_to_1():
    assert colour_level(np.array([0.0, 0.25, 1.0])).tolist() == [0, 128, 255]


def test_a_map_of_a_model_gone_nan_is_still_drawn():
    # train.skip_nonfinite=true goes on logging after the weights became NaN.
    assert colour_level(np.array([np.nan, 0.25])).tolist() == [0, 128]
    image = render_attention_map(np.full((3, 3), np.nan), ["a", "b", "c"], "nan")
    assert image.ndim == 3 and image.shape[2] == 3


def test_weights_and_labels_that_do_not_make_one_map_are_one_line():
    one_head, labels = np.eye(3), ["a", "b", "c"]
    for weights, labels_given, message in [
        (np.ones((2, 3, 3)), labels, "render_attention_map draws one head's weights, (T, T); got shape (2, 3, 3): pick one, "
                                     "e.g. weights[layer, head] of the model's (L, H, T, T)"),  # was numpy's IndexError
        (np.ones((3, 4)), labels, "render_attention_map draws one head's weights, (T, T); got shape (3, 4)"),
        (one_head, ["a", "b"], "labels must be the 3 token strings of the map's rows and columns; got 2 labels: e.g. "
                               "tokenizer.token_strings(ids)"),  # drawn mislabelled, without a word
        (one_head, [1, 2, 3], "labels must be the 3 token strings of the map's rows and columns; got labels that are not all "
                              "strings (token ids?)"),
        (one_head, None, "labels must be the 3 token strings of the map's rows and columns; got a NoneType"),
    ]:
        with pytest.raises(ValueError, match="^" + re.escape(message)):
            render_attention_map(weights, labels_given, "title")
    with pytest.raises(ValueError, match="^title must be a string; got a NoneType$"):
        render_attention_map(one_head, labels, None)
    with pytest.raises(ValueError, match="^" + re.escape("render_head_grid draws every head of every layer, weights of shape "
                                                         "(L, H, T, T); got shape (2, 3, 3): one layer's (H, T, T) is weights[None]")):
        render_head_grid(np.ones((2, 3, 3)), "title")
    assert render_attention_map(torch.eye(3), labels, "a tensor too").shape[2] == 3


def test_heatmap_colours_each_cell_by_its_weight_and_greys_the_future():
    weights = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    image = render_attention_map(weights, ["a", "b", "c"], "title")
    # The grid is the block of non-white pixels whose colours are colormap or FUTURE entries;
    # find the top-left cell's colour (weight 1.0) and the top-right cell's colour (future).
    bright, future = tuple(COLORMAP[255]), FUTURE
    pixels = {tuple(p) for p in image.reshape(-1, 3)}
    assert bright in pixels and future in pixels and tuple(COLORMAP[0]) in pixels
    ys, xs = np.nonzero((image == bright).all(-1))
    fy, fx = np.nonzero((image == future).all(-1))
    assert fx.mean() > xs.min() and fy.mean() < ys.max()  # the future sits up and to the right


def test_a_window_greys_exactly_the_keys_the_model_gives_no_weight_as_it_greys_the_future():
    T, W = 8, 3
    model = tiny_gpt(window=W).eval()
    with torch.no_grad():
        weights = model.attention_weights(torch.randint(0, 65, (1, T), generator=torch.Generator().manual_seed(0)))[:, 0].numpy()
    hidden = hidden_cells(T, W)  # (T, T)
    assert ((weights == 0) == hidden).all()  # the model's band: no weight beyond it, some on every key within it
    assert (hidden == hidden_cells(T) | np.tril(np.ones((T, T), dtype=bool), k=-W)).all() and hidden[W, 0] and not hidden[W, 1]
    # Each cell the window hides adds cell x cell grey pixels to each head's map (20 px a cell at T = 8).
    grey = {window: int((render_head_grid(weights, "t", window) == FUTURE).all(-1).sum()) for window in (None, W)}
    assert grey[W] - grey[None] == (hidden.sum() - hidden_cells(T).sum()) * 20 * 20 * 4  # 2 layers x 2 heads
    drawn = {window: int((render_attention_map(weights[0, 0], list("abcdefgh"), "t", cell=4, window=window) == FUTURE)
                         .all(-1).sum()) for window in (None, W)}
    assert drawn[W] - drawn[None] == (hidden.sum() - hidden_cells(T).sum()) * 4 * 4
