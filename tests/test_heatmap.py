"""inspection/heatmap.py: the attention maps TensorBoard shows, token labels and colours."""

import numpy as np

from inspection.heatmap import COLORMAP, FUTURE, colour_level, readable_token, render_attention_map


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
