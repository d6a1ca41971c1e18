"""Draw the pictures of docs/attention.md's "Questions learners ask": `python docs/questions.py`
(part of `make docs`). Each picture is drawn from numbers worked out here with the real module
and torch; docs/questions/figures.json keeps those numbers, and a test recomputes them.
"""

import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inspection.heatmap import label_font, render_attention_map  # noqa: E402
from model.attention import CausalSelfAttention  # noqa: E402

FOLDER = Path(__file__).resolve().parent / "questions"
T = 6  # tokens in the small examples


def side_by_side(images: list[np.ndarray]) -> Image.Image:
    height = max(image.shape[0] for image in images)
    padded = [np.pad(image, ((0, height - image.shape[0]), (0, 8), (0, 0)), constant_values=255) for image in images]
    return Image.fromarray(np.concatenate(padded, axis=1))


def weights_under(q: torch.Tensor, k: torch.Tensor, may_attend: torch.Tensor) -> torch.Tensor:
    """The weights (T, S) SDPA uses for a bool attn_mask (True = may attend); a row with no key
    allowed gets zeros, as SDPA's output does."""
    scores = (q @ k.T / math.sqrt(q.shape[-1])).masked_fill(~may_attend, float("-inf"))  # (T, S)
    return torch.softmax(scores, dim=-1).nan_to_num(0.0)


def mask_conventions() -> dict:
    """Q1: the same queries and keys, SDPA given the right mask and the 'hide' mask."""
    torch.manual_seed(0)
    module = CausalSelfAttention(16, 1, attention="manual")
    with torch.no_grad():
        q, k, v = module.qkv(torch.randn(T, 16)).split(16, dim=-1)  # (T, 16) each
    hide = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)  # True = hide, masked_fill's convention
    right, wrong = weights_under(q, k, ~hide), weights_under(q, k, hide)
    # These are the weights SDPA itself used: times v, they give its outputs.
    same = all(torch.allclose(w @ v, F.scaled_dot_product_attention(q, k, v, attn_mask=m), atol=1e-5)
               for w, m in ((right, ~hide), (wrong, hide)))
    return {"right": right.tolist(), "hide_mask_given_to_sdpa": wrong.tolist(), "are_sdpas_weights": same}


def softmax_overflow() -> dict:
    """Q2: one row of scores, its naive softmax and the stable one."""
    scores = torch.tensor([97.0, 33.0])
    naive = scores.exp() / scores.exp().sum()
    return {"scores": scores.tolist(), "naive": [None if x != x else x for x in naive.tolist()],
            "stable": torch.softmax(scores, dim=0).tolist()}


def wq_for_k() -> dict:
    """Q5: softmax of each token's scores over all tokens, keys from W_q (the bug) and from W_k."""
    torch.manual_seed(0)
    module = CausalSelfAttention(32, 1, bias=False, attention="manual")
    with torch.no_grad():
        q, k, _ = module.qkv(torch.randn(T, 32)).split(32, dim=-1)  # (T, 32) each
        weights = {name: torch.softmax(q @ keys.T / math.sqrt(32), dim=-1).tolist()
                   for name, keys in (("keys_from_w_q", q), ("keys_from_w_k", k))}
    return weights


def strides() -> dict:
    """Q7: a (B=1, H=2, T=3, D=2) tensor's memory, and the order transpose(1, 2) reads it in."""
    x = torch.arange(12).view(1, 2, 3, 2)  # element i sits at memory offset i
    flipped = x.transpose(1, 2)  # (1, T, H, D)
    return {"shape": list(x.shape), "strides": list(x.stride()), "transposed_shape": list(flipped.shape),
            "transposed_strides": list(flipped.stride()), "read_order": flipped.flatten().tolist(),
            "is_contiguous": flipped.is_contiguous()}


def figure_data() -> dict:
    return {"mask_conventions": mask_conventions(), "softmax_overflow": softmax_overflow(), "wq_for_k": wq_for_k(),
            "strides": strides()}


def text_picture(lines: list[str], width: int = 620) -> Image.Image:
    font, _ = label_font()
    image = Image.new("RGB", (width, 22 * len(lines) + 16), "white")
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        draw.text((12, 8 + 22 * i), line, fill="black", font=font)
    return image


def draw_strides(data: dict) -> Image.Image:
    """Two rows of boxes: memory in order (head by head), then the order the transposed view reads it."""
    font, _ = label_font()
    image = Image.new("RGB", (12 * 50 + 40, 230), "white")
    draw = ImageDraw.Draw(image)
    H, T, D = data["shape"][1:]
    names = [f"h{h} t{t} d{d}" for h in range(H) for t in range(T) for d in range(D)]  # by memory offset
    rows = (("memory: (B, H, T, D), strides " + str(tuple(data["strides"])), list(range(12))),
            ("transpose(1, 2) reads: (B, T, H, D), strides " + str(tuple(data["transposed_strides"])), data["read_order"]))
    for r, (title, order) in enumerate(rows):
        top = 10 + r * 105
        draw.text((20, top), title, fill="black", font=font)
        for i, offset in enumerate(order):
            x = 20 + 50 * i
            shade = (200, 220, 255) if names[offset].startswith("h0") else (255, 220, 190)
            draw.rectangle([x, top + 22, x + 46, top + 70], fill=shade, outline="black")
            for j, part in enumerate(names[offset].split()):
                draw.text((x + 6, top + 24 + 14 * j), part, fill="black", font=font)
            draw.text((x + 6, top + 74), f"@{offset}", fill="gray", font=font)
    note = "not contiguous: view(B, T, H*D) cannot read this; contiguous() copies it into this order"
    draw.text((20, 212), note if not data["is_contiguous"] else "contiguous", fill="black", font=font)
    return image


def draw_all(data: dict) -> None:
    FOLDER.mkdir(exist_ok=True)
    labels = [f"t{i}" for i in range(T)]
    masks = data["mask_conventions"]
    side_by_side([
        render_attention_map(np.array(masks["right"]), labels, "SDPA, attn_mask=~hide: right", causal=False),
        render_attention_map(np.array(masks["hide_mask_given_to_sdpa"]), labels, "attn_mask=hide: the future",
                             causal=False),
    ]).save(FOLDER / "mask_conventions.png", optimize=True)
    soft = data["softmax_overflow"]
    text_picture([
        f"scores                         {soft['scores']}",
        f"naive  exp(s) / sum(exp(s))    {['nan' if x is None else x for x in soft['naive']]}",
        f"stable torch.softmax(s)        [{soft['stable'][0]:.1f}, {soft['stable'][1]:.2e}]",
        "float32 exp overflows above ~88.7: exp(97) = inf, inf / inf = nan",
    ]).save(FOLDER / "softmax_overflow.png", optimize=True)
    wq = data["wq_for_k"]
    side_by_side([
        render_attention_map(np.array(wq["keys_from_w_q"]), labels, "keys from W_q: the diagonal", causal=False),
        render_attention_map(np.array(wq["keys_from_w_k"]), labels, "keys from W_k", causal=False),
    ]).save(FOLDER / "wq_for_k.png", optimize=True)
    draw_strides(data["strides"]).save(FOLDER / "strides.png", optimize=True)


if __name__ == "__main__":
    data = figure_data()
    draw_all(data)
    (FOLDER / "figures.json").write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {len(data)} figures and their numbers to {FOLDER}")
