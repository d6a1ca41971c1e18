"""Attention weights as a labelled heatmap image, drawn with Pillow (a few ms per map).

    render_attention_map(weights, labels, title, window=None) -> (H, W, 3) uint8 array
    render_head_grid(weights, title, window=None) -> (H, W, 3) uint8 array: every head of every layer,
        one small unlabelled map each, layers as rows and heads as columns

Rows are queries (the token doing the looking), columns are keys (the tokens looked at),
both labelled with their token text. Colour is the weight on a fixed viridis scale, the
same for every head and step so maps compare; the scale is square-root (the colour bar is
ticked in true weights), because most weights are small and a linear scale hides them.
Cells a query cannot see (the future, and with a window W the keys W or more tokens back) are
pale grey: "cannot look" is not "chose not to".
"""

from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from data.tokenizer import EOT

# Matplotlib's viridis at 0, 0.25, 0.5, 0.75 and 1; the table interpolates between them.
VIRIDIS_ANCHORS = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], dtype=np.float64)
COLORMAP = np.stack(
    [np.interp(np.linspace(0, 1, 256), np.linspace(0, 1, len(VIRIDIS_ANCHORS)), VIRIDIS_ANCHORS[:, c]) for c in range(3)],
    axis=1,
).astype(np.uint8)  # (256, 3)
FUTURE = (236, 236, 236)
BACKGROUND, INK = (255, 255, 255), (20, 20, 20)
# Fonts with wide coverage, tried in order; Pillow's built-in font (ASCII only) is the fallback.
FONT_FILES = ("DejaVuSansMono.ttf", "DejaVuSans.ttf", "Menlo.ttc", "Consolas.ttf")
FONT_SIZE = 11
COLORBAR_TICKS = (1.0, 0.5, 0.25, 0.1, 0.02, 0.0)


@lru_cache(maxsize=1)
def label_font() -> tuple[ImageFont.FreeTypeFont | ImageFont.ImageFont, bool]:
    """(font, covers_unicode)."""
    for name in FONT_FILES:
        try:
            return ImageFont.truetype(name, FONT_SIZE), True
        except OSError:
            continue
    return ImageFont.load_default(size=FONT_SIZE), False


def readable_token(piece: str, unicode_ok: bool = True) -> str:
    """Make a token visible as a label: a space shows as '·', a newline as '\\n', a tab as
    '\\t', other control characters (and, without a Unicode font, non-ASCII) as escapes;
    <|endoftext|> is shortened to <eot>."""
    if piece == EOT:
        return "<eot>"
    out = []
    for ch in piece:
        if ch == " ":
            out.append("·")
        elif ch in "\n\t\r":
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}[ch])
        elif not ch.isprintable() or (not unicode_ok and not ch.isascii()):
            out.append(ascii(ch)[1:-1])
        else:
            out.append(ch)
    return "".join(out) or "∅"


def render_attention_map(
    weights: np.ndarray, labels: list[str], title: str, causal: bool = True, cell: int | None = None,
    window: int | None = None,
) -> np.ndarray:
    """weights: (T, T), rows = queries, columns = keys; labels: T token strings. causal: the
    future (above the diagonal) is drawn as hidden, and with a window (the model's window) the
    keys too far back. cell: pixels per weight (default: up to 16, the map at most about 720 px)."""
    weights = np.asarray(weights)
    if weights.ndim != 2 or weights.shape[0] != weights.shape[1]:
        raise ValueError(f"render_attention_map draws one head's weights, (T, T); got shape {weights.shape}: pick one, "
                         "e.g. weights[layer, head] of the model's (L, H, T, T)")
    T = weights.shape[0]
    if not isinstance(labels, list | tuple) or len(labels) != T or not all(isinstance(label, str) for label in labels):
        got = (f"a {type(labels).__name__}" if not isinstance(labels, list | tuple) else f"{len(labels)} labels"
               if len(labels) != T else "labels that are not all strings (token ids?)")
        raise ValueError(f"labels must be the {T} token strings of the map's rows and columns; got {got}: e.g. "
                         "tokenizer.token_strings(ids)")
    if not isinstance(title, str):
        raise ValueError(f"title must be a string; got a {type(title).__name__}")
    font, unicode_ok = label_font()
    labels = [readable_token(label, unicode_ok)[:12] for label in labels]
    cell = cell or int(np.clip(720 // T, 4, 16))
    pad = 6
    label_width = max(text_width(font, label) for label in labels) + pad
    title_height = FONT_SIZE + 2 * pad
    colorbar_width = 44
    grid = T * cell
    top = title_height + label_width
    width = max(label_width + grid + pad + colorbar_width, text_width(font, title) + 2 * pad)
    height = top + grid + pad

    # The grid: each weight becomes a cell x cell block of its colour.
    shade = COLORMAP[colour_level(weights)]  # (T, T, 3)
    if causal:
        shade[hidden_cells(T, window)] = FUTURE
    cells = shade.repeat(cell, axis=0).repeat(cell, axis=1)  # (T * cell, T * cell, 3)

    image = Image.new("RGB", (width, height), BACKGROUND)
    image.paste(Image.fromarray(cells), (label_width, top))
    draw = ImageDraw.Draw(image)
    draw.text((pad, pad), title, font=font, fill=INK)
    # Row labels (queries), right-aligned against the grid.
    for i, label in enumerate(labels):
        y = top + i * cell + cell // 2
        draw.text((label_width - pad // 2, y), label, font=font, fill=INK, anchor="rm")
    # Column labels (keys): written left to right in a strip, one row per column, then the
    # strip is turned 90 degrees so each label reads bottom-up above its column.
    strip = Image.new("RGB", (label_width, grid), BACKGROUND)
    strip_draw = ImageDraw.Draw(strip)
    for j, label in enumerate(labels):
        strip_draw.text((pad // 2, j * cell + cell // 2), label, font=font, fill=INK, anchor="lm")
    image.paste(strip.rotate(90, expand=True), (label_width, title_height))
    draw_colorbar(draw, x=label_width + grid + pad, top=top, height=grid, font=font)
    return np.asarray(image)


def render_head_grid(weights: np.ndarray, title: str, window: int | None = None) -> np.ndarray:
    """weights: (L, H, T, T). The same colours as render_attention_map, without token labels."""
    weights = np.asarray(weights)
    if weights.ndim != 4 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(f"render_head_grid draws every head of every layer, weights of shape (L, H, T, T); got shape "
                         f"{weights.shape}: one layer's (H, T, T) is weights[None]")
    L, H, T, _ = weights.shape
    font, _ = label_font()
    cell = max(1, 160 // T)  # pixels per weight: each map about 160 px wide
    side, gap, pad = T * cell, 8, 6
    left = text_width(font, f"layer {L - 1}") + 2 * pad
    top = 2 * (FONT_SIZE + 2 * pad)  # the title, then the head numbers
    image = Image.new("RGB", (left + H * (side + gap), top + L * (side + gap)), BACKGROUND)
    draw = ImageDraw.Draw(image)
    draw.text((pad, pad), title, font=font, fill=INK)
    hidden = hidden_cells(T, window)
    for head in range(H):
        draw.text((left + head * (side + gap) + side // 2, top - pad), f"head {head}", font=font, fill=INK, anchor="mb")
    for layer in range(L):
        y = top + layer * (side + gap)
        draw.text((left - pad, y + side // 2), f"layer {layer}", font=font, fill=INK, anchor="rm")
        for head in range(H):
            shade = COLORMAP[colour_level(weights[layer, head])]  # (T, T, 3)
            shade[hidden] = FUTURE
            cells = shade.repeat(cell, axis=0).repeat(cell, axis=1)  # (T * cell, T * cell, 3)
            image.paste(Image.fromarray(cells), (left + head * (side + gap), y))
    return np.asarray(image)


def hidden_cells(T: int, window: int | None = None) -> np.ndarray:
    """(T, T) bool, True where query t cannot see key s: the future (s > t), and with a window W
    the keys W or more back (s <= t - W), as the model's band mask hides them (model/attention.py)."""
    hidden = np.triu(np.ones((T, T), dtype=bool), k=1)  # (T, T): above the diagonal
    if window is not None:
        hidden |= np.tril(np.ones((T, T), dtype=bool), k=-window)  # (T, T): W or more below it
    return hidden


def colour_level(weights: np.ndarray) -> np.ndarray:
    """Weights in [0, 1] -> colormap rows 0..255 on the square-root scale (NaN, from a model
    gone non-finite, as 0)."""
    return np.rint(np.sqrt(np.clip(np.nan_to_num(weights, nan=0.0), 0, 1)) * 255).astype(np.int64)


def draw_colorbar(draw: ImageDraw.ImageDraw, x: int, top: int, height: int, font: ImageFont.ImageFont) -> None:
    for y in range(height):
        level = 255 - int(255 * y / max(1, height - 1))
        draw.line([(x, top + y), (x + 10, top + y)], fill=tuple(int(c) for c in COLORMAP[level]))
    for weight in COLORBAR_TICKS:
        y = top + round((1 - float(np.sqrt(weight))) * (height - 1))
        draw.line([(x + 10, y), (x + 13, y)], fill=INK)
        draw.text((x + 15, y), f"{weight:g}", font=font, fill=INK, anchor="lm")


def text_width(font: ImageFont.ImageFont, text: str) -> int:
    left, _, right, _ = font.getbbox(text)
    return int(right - left)
