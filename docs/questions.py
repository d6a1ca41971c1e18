"""Draw the tour's pictures (docs/attention.md): `python docs/questions.py` (part of `make docs`).

Each picture is drawn from numbers worked out here by running the project's own code (the
attention module's steps, the GPT's initialisation); docs/questions/figures.json keeps those
numbers, and tests/test_attention_tour.py recomputes them and redraws every picture.
"""

import ast
import json
import linecache
import math
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cli.run_spec import composed_run_spec  # noqa: E402
from docs.drawing import (  # noqa: E402
    BLUE,
    FAINT,
    ORANGE,
    RED,
    SHOWN_WIDTH,
    Line,
    Plot,
    drawn_with,
    font,
    one_above_another,
    side_by_side,
)
from inspection.heatmap import COLORMAP, FUTURE, INK, colour_level, render_attention_map  # noqa: E402
from inspection.shape_trace import LineShapes  # noqa: E402
from model import attention  # noqa: E402
from model.attention import CausalSelfAttention, KVCache  # noqa: E402
from model_io.checkpoint import build_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "docs" / "questions"
PICTURES = ("forward_pass", "scale_and_head_size", "mask_conventions", "softmax_direction", "softmax_overflow", "wq_for_k",
            "strides", "init_scale", "window", "kv_cache_sizes")
T = 6  # tokens in the small examples


def forward_pass() -> dict:
    """One forward of a small module, traced line by line (inspection/shape_trace.py), each line
    filed under the numbered step of model/attention.py it belongs to."""
    torch.manual_seed(0)
    B, T, C, H = 2, 5, 12, 3
    module = CausalSelfAttention(C, H, attention="manual")
    recorder = LineShapes()
    with torch.no_grad(), recorder:
        module(torch.randn(B, T, C))
    steps = step_of_each_line()
    traced = []
    for _, filename, lineno, shapes in recorder.steps:
        number, title = steps[lineno]
        code, _, letters = linecache.getline(filename, lineno).strip().partition("  # ")
        line = {"code": code, "letters": re.split(r"[:;]", letters)[0], "shapes": shapes}
        if traced and traced[-1]["step"] == number:
            traced[-1]["lines"].append(line)
        else:
            traced.append({"step": number, "title": title, "lines": [line]})
    return {"sizes": {"B": B, "T": T, "C": C, "H": H, "D": C // H}, "steps": traced}


def step_of_each_line() -> dict[int, tuple[int, str]]:
    """{line number of model/attention.py: (step number, the step's comment)}: a line belongs to
    the last `# N.` comment above it in its function (`# 3b.` is part of step 3), or to the
    `Step N` its docstring names."""
    source = Path(attention.__file__).read_text()
    lines = source.splitlines()
    steps: dict[int, tuple[int, str]] = {}
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.FunctionDef):
            continue
        named = re.match(r"Step (\d+): (.*?)[;.]", ast.get_docstring(function) or "", re.DOTALL)
        current = (int(named[1]), short(" ".join(named[2].split()))) if named else None
        for number in range(function.body[0].lineno, function.end_lineno + 1):
            text = lines[number - 1].strip()
            heading = re.match(r"# (\d+)[a-z]?\. (.*)", text)
            if heading:
                comment = [heading[2]]
                for following in lines[number:]:  # the comment goes on in lines "#    ..."
                    if not following.strip().startswith("#  "):
                        break
                    comment.append(following.strip().lstrip("# "))
                current = (int(heading[1]), short(" ".join(comment)))
            elif current is not None:
                steps[number] = current
    return steps


def short(comment: str, most: int = 90) -> str:
    """A step's comment as a title: its first sentence, capitalised, cut at a comma if too long."""
    title = re.match(r".*?(?:[.:](?= |$)|$)", comment)[0].rstrip(".:")
    while len(title) > most and ", " in title:
        title = title.rsplit(", ", 1)[0]
    return title[0].upper() + title[1:]


def attend(q: torch.Tensor, k: torch.Tensor, may_attend: torch.Tensor) -> torch.Tensor:
    """The weights (T, S) the module's steps 4 and 5 (attend_manual) give q (T, D) over k (S, D)
    where may_attend (T, S) is True; a row with nothing to attend gets zeros, as in the module."""
    module = CausalSelfAttention(q.shape[-1], 1, attention="manual")
    no_key = ~may_attend.any(dim=-1, keepdim=True)  # (T, 1)
    view = (1, 1, *may_attend.shape)
    _, weights = module.attend_manual(q[None, None], k[None, None], k[None, None], (may_attend | no_key).view(view),
                                      no_key.view(1, 1, -1, 1))
    return weights[0, 0]  # (T, S)


def mask_conventions() -> dict:
    """Q2: the same queries and keys, SDPA given the right mask and the 'hide' mask."""
    torch.manual_seed(0)
    module = CausalSelfAttention(16, 1, attention="manual")
    with torch.no_grad():
        q, k, v = module.qkv(torch.randn(T, 16)).split(16, dim=-1)  # (T, 16) each
        hide = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)  # True = hide, masked_fill's convention
        right, wrong = attend(q, k, ~hide), attend(q, k, hide)
        # These are the weights SDPA itself used: times v, they give its outputs.
        same = all(torch.allclose(w @ v, F.scaled_dot_product_attention(q, k, v, attn_mask=m), atol=1e-5)
                   for w, m in ((right, ~hide), (wrong, hide)))
    return {"hide": hide.tolist(), "right": right.tolist(), "hide_mask_given_to_sdpa": wrong.tolist(),
            "are_sdpas_weights": same}


def softmax_overflow() -> dict:
    """Q11: softmax of the row [s, 33] as s grows: naive in float32, and the module's."""
    tops = torch.arange(0.0, 120.5, 0.5)  # (N,)
    rows = torch.stack([tops, torch.full_like(tops, 33.0)], dim=-1)  # (N, 2)
    naive = rows.exp() / rows.exp().sum(dim=-1, keepdim=True)  # (N, 2)
    module = CausalSelfAttention(1, 1, attention="manual")
    q = torch.ones(len(tops), 1, 1, 1)  # D = 1: q . k / sqrt(1) is the key itself
    _, stable = module.attend_manual(q, rows.view(-1, 1, 2, 1), rows.view(-1, 1, 2, 1),
                                     torch.ones(1, 1, 1, 2, dtype=torch.bool), None)  # (N, 1, 1, 2)
    return {"top_score": tops.tolist(), "naive": [None if math.isnan(w) else w for w in naive[:, 0].tolist()],
            "stable": stable[:, 0, 0, 0].tolist(), "exp_overflows_above": math.log(torch.finfo(torch.float32).max)}


def wq_for_k() -> dict:
    """Q21: every token's scores and weights over all tokens (no mask), from the module with its
    own W_k and from the module with W_q's rows copied into W_k's (the bug, planted)."""
    torch.manual_seed(0)
    C = 32
    module = CausalSelfAttention(C, 1, bias=False, attention="manual", causal=False)
    x = torch.randn(1, T, C)
    data = {}
    with torch.no_grad():
        for name in ("keys_from_w_k", "keys_from_w_q"):
            if name == "keys_from_w_q":
                module.qkv.weight[C : 2 * C] = module.qkv.weight[:C]
            q, k, _ = module.qkv(x).split(C, dim=-1)  # (1, T, C) each: the module's step 1
            _, weights = module(x, need_weights=True)  # (1, 1, T, T)
            data[name] = {"scores": (q[0] @ k[0].T / math.sqrt(C)).tolist(), "weights": weights[0, 0].tolist()}
    return data


HEAD_SIZES = [2**i for i in range(10)]  # 1 to 512
KEYS = 16


def scale_and_head_size() -> dict:
    """Section 2: the mean largest weight a query puts on one of 16 keys, as the head size D grows,
    with the module's scale and without it (its step 4 given q * sqrt(D), which cancels the
    division). Queries and keys have channels of mean 0 and variance 1."""
    torch.manual_seed(0)
    largest = {"scaled": [], "unscaled": []}
    everything = torch.ones(1, 1, 1, KEYS, dtype=torch.bool)
    for D in HEAD_SIZES:
        module = CausalSelfAttention(D, 1, attention="manual")
        q, k = torch.randn(1000, 1, 1, D), torch.randn(1000, 1, KEYS, D)  # (N, H, T=1, D), (N, H, S, D)
        for name, queries in (("scaled", q), ("unscaled", q * math.sqrt(D))):
            _, weights = module.attend_manual(queries, k, k, everything, None)  # (N, 1, 1, KEYS)
            largest[name].append(weights.amax(dim=-1).mean().item())
    return {"head_size": HEAD_SIZES, "keys": KEYS, **largest}


def softmax_direction() -> dict:
    """Section 4: one head's causal weights, softmax over the keys (the module's) and over the
    queries (the wrong dim), from the module's own queries, keys and mask."""
    torch.manual_seed(0)
    module = CausalSelfAttention(16, 1, attention="manual")
    x = torch.randn(1, T, 16)
    with torch.no_grad():
        q, k, _ = module.qkv(x).split(16, dim=-1)  # (1, T, 16) each
        visible, _ = module.visible_keys(1, T, T, None, x.device)  # (1, 1, T, T)
        scores = (q @ k.transpose(-2, -1) / math.sqrt(16)).masked_fill(~visible[0], float("-inf"))  # (1, T, T)
        _, weights = module(x, need_weights=True)
    over_queries = torch.softmax(scores, dim=-2)[0]  # (T, T): each column sums to 1
    assert torch.allclose(torch.softmax(scores, dim=-1)[0], weights[0, 0], atol=1e-6)  # the module's, by its steps
    return {"over_keys": weights[0, 0].tolist(), "over_queries": over_queries.tolist()}


def strides() -> dict:
    """Q17: a (B=1, H=2, T=3, D=2) tensor's memory, and the order transpose(1, 2) reads it in."""
    x = torch.arange(12).view(1, 2, 3, 2)  # element i sits at memory offset i
    flipped = x.transpose(1, 2)  # (1, T, H, D)
    return {"shape": list(x.shape), "strides": list(x.stride()), "transposed_shape": list(flipped.shape),
            "transposed_strides": list(flipped.stride()), "read_order": flipped.flatten().tolist(),
            "is_contiguous": flipped.is_contiguous()}


INITS = ("the project's (GPT-2): std 0.02, residual projections 0.02 / sqrt(2 L)",
         "std 0.02, residual projections not scaled", "std 1, every weight and embedding")


def residual_spread(n_layer: int = 16) -> dict[str, list[float]]:
    """Q24: the residual stream's std after each block, over the embeddings' std, for the default
    model's options at 16 blocks of width 64: with the project's init and two others."""
    spread = {}
    shape = replace(composed_run_spec().model, n_layer=n_layer, n_embd=64, n_head=4, block_size=32)
    for init in INITS:
        torch.manual_seed(0)
        model = build_model(shape, vocab_size=64)
        with torch.no_grad():
            for name, layer in model.named_modules():
                if init == INITS[1] and name.endswith(("attn.proj", "mlp.proj")):
                    nn.init.normal_(layer.weight, std=0.02)
                elif init == INITS[2] and isinstance(layer, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(layer.weight, std=1.0)
        with torch.no_grad():
            x = model.embed(torch.randint(0, 64, (8, 32)))  # (B, T, C): the stream before block 0
            stds = [x.std().item()]
            for block in model.blocks:
                x = block(x)  # (B, T, C)
                stds.append(x.std().item())
        spread[init] = [std / stds[0] for std in stds]
    return spread


WINDOW_T, WINDOW = 10, 4  # the window picture: 10 tokens, a window of 4


def window_and_ring() -> dict:
    """Section 9: which keys each query may see, causal and with a window (the module's step 3),
    and which position each of a windowed KVCache's ring slots holds after each token."""
    T, W = WINDOW_T, WINDOW
    causal, _ = CausalSelfAttention.visible_keys(1, T, T, None, torch.device("cpu"))  # (1, 1, T, T)
    band, _ = CausalSelfAttention.visible_keys(1, T, T, None, torch.device("cpu"), window=W)
    cache = KVCache(T, window=W)
    held = []
    for position in range(T):  # one token at a time, as generation feeds them
        key = torch.full((1, 1, 1, 1), position + 1.0)  # (B, K, 1, D): its position + 1; an unwritten slot holds 0
        cache.extend(key, key)
        held.append([int(p) - 1 if p else None for p in cache.k[0, 0, :, 0].tolist()])
    return {"tokens": T, "window": W, "causal": causal[0, 0].tolist(), "band": band[0, 0].tolist(), "ring": held}


SMOLLM2_135M = {"n_layer": 30, "n_head": 9, "n_kv_head": 3, "head_dim": 64, "context": 8192}  # its config.json; bf16
CONTEXTS = [1, *range(256, 4097, 256)]


def cache_bytes(n_layer: int, n_kv_head: int, head_dim: int, length: int, window: int | None = None,
                dtype: torch.dtype = torch.float32) -> int:
    """The bytes of one sequence's KV caches, all layers, holding `length` tokens: what KVCache
    allocates for them, read with nbytes() after one token."""
    cache = KVCache(length, window)
    key = torch.zeros(1, n_kv_head, 1, head_dim, dtype=dtype)  # (B, K, 1, D)
    cache.extend(key, key)
    return n_layer * cache.nbytes()


def kv_cache_sizes() -> dict:
    """Section 9: the KV cache's bytes against the context length for the default model's shape,
    with every head its own keys, fewer key/value heads, and a window; and SmolLM2-135M's."""
    default = composed_run_spec().model
    L, H, D = default.n_layer, default.n_head, default.head_size
    settings = {f"every head its own keys and values (K = {H})": (H, None),
                f"grouped, K = {H // 2} (2 query heads each)": (H // 2, None),
                f"multi-query, K = 1 ({H} query heads each)": (1, None),
                f"K = {H}, a window of 256": (H, 256)}
    smol = SMOLLM2_135M
    at_context = {K: cache_bytes(smol["n_layer"], K, smol["head_dim"], smol["context"], dtype=torch.bfloat16)
                  for K in (smol["n_kv_head"], smol["n_head"])}
    return {
        "default_shape": {"n_layer": L, "n_head": H, "head_dim": D, "block_size": default.block_size, "bytes": 4},
        "context": CONTEXTS,
        "mib": {name: [cache_bytes(L, K, D, S, window) / 2**20 for S in CONTEXTS] for name, (K, window) in settings.items()},
        "default_full_block_kib": {str(K): cache_bytes(L, K, D, default.block_size) / 2**10 for K in (H, H // 2, 1)},
        "smollm2_135m": {**smol, "bytes_per_token": {str(K): n // smol["context"] for K, n in at_context.items()},
                         "mib_at_context": {str(K): n / 2**20 for K, n in at_context.items()}},
    }


def figure_data() -> dict:
    return {"forward_pass": forward_pass(), "scale_and_head_size": scale_and_head_size(),
            "mask_conventions": mask_conventions(), "softmax_direction": softmax_direction(),
            "softmax_overflow": softmax_overflow(), "wq_for_k": wq_for_k(), "strides": strides(),
            "init_scale": residual_spread(), "window": window_and_ring(), "kv_cache_sizes": kv_cache_sizes()}


def draw_forward_pass(data: dict) -> Image.Image:
    """The numbered steps top to bottom: each traced line, the shapes it made in numbers, and in letters."""
    face, small = font(12), font(11)
    sizes = data["sizes"]
    rows: list[tuple[str, object]] = []
    for step in data["steps"]:
        rows.append(("step", step))
        rows += [("line", line) for line in step["lines"]]
    heights = {"step": 26, "line": 36}
    top = 52
    image = Image.new("RGB", (SHOWN_WIDTH - 10, top + sum(heights[kind] for kind, _ in rows) + 10), "white")
    draw = ImageDraw.Draw(image)
    draw.text((12, 8), f"One forward of CausalSelfAttention(n_embd={sizes['C']}, n_head={sizes['H']}) on x of shape "
              f"(B, T, C) = ({sizes['B']}, {sizes['T']}, {sizes['C']})", font=face, fill=INK)
    draw.text((12, 28), f"H = {sizes['H']} heads of D = {sizes['D']} channels; S = T = {sizes['T']} keys. "
              "Blue: the shapes each line made; grey: its comment in letters.", font=small, fill=FAINT)
    y = top
    for kind, item in rows:
        if kind == "step":
            draw.rectangle([8, y + 2, image.width - 8, y + heights["step"] - 4], fill=(236, 242, 250))
            draw.text((16, y + 12), f"{item['step']}. {item['title']}", font=face, fill=INK, anchor="lm")
        else:
            draw.text((28, y + 2), item["code"], font=face, fill=INK)
            shapes = "-> " + " -> ".join(item["shapes"])
            draw.text((44, y + 18), shapes, font=face, fill=BLUE)
            draw.text((44 + max(260, face.getbbox(shapes)[2] + 24), y + 18), item["letters"], font=face, fill=FAINT)
        y += heights[kind]
    return image


READING = "True = hide, as masked_fill reads it"


def draw_mask(hide: list[list[bool]], cell: int) -> Image.Image:
    """The bool mask as a grid: True cells shaded and marked."""
    face = font()
    n = len(hide)
    left, top = 24, 56
    image = Image.new("RGB", (max(left + n * cell + 16, face.getbbox(READING)[2] + 12), top + n * cell + 8), "white")
    draw = ImageDraw.Draw(image)
    draw.text((6, 6), "hide = ones(T, T).triu(1)", font=face, fill=INK)
    draw.text((6, 22), READING, font=face, fill=FAINT)
    for i in range(n):
        draw.text((left - 4, top + i * cell + cell // 2), f"t{i}", font=face, fill=INK, anchor="rm")
        draw.text((left + i * cell + cell // 2, top - 4), f"t{i}", font=face, fill=INK, anchor="mb")
        for j in range(n):
            box = [left + j * cell, top + i * cell, left + (j + 1) * cell, top + (i + 1) * cell]
            draw.rectangle(box, fill=(250, 215, 210) if hide[i][j] else "white", outline=(190, 190, 190))
            draw.text((box[0] + cell // 2, box[1] + cell // 2), "T" if hide[i][j] else "F", font=face,
                      fill=RED if hide[i][j] else FAINT, anchor="mm")
    return image


def draw_strides(data: dict) -> Image.Image:
    """Two rows of boxes: memory in order (head by head), then the order the transposed view reads it."""
    face = font()
    image = Image.new("RGB", (12 * 50 + 40, 230), "white")
    draw = ImageDraw.Draw(image)
    H, T, D = data["shape"][1:]
    names = [f"h{h} t{t} d{d}" for h in range(H) for t in range(T) for d in range(D)]  # by memory offset
    rows = (("memory: (B, H, T, D), strides " + str(tuple(data["strides"])), list(range(12))),
            ("transpose(1, 2) reads: (B, T, H, D), strides " + str(tuple(data["transposed_strides"])), data["read_order"]))
    for r, (title, order) in enumerate(rows):
        top = 10 + r * 105
        draw.text((20, top), title, fill="black", font=face)
        for i, offset in enumerate(order):
            x = 20 + 50 * i
            shade = (200, 220, 255) if names[offset].startswith("h0") else (255, 220, 190)
            draw.rectangle([x, top + 22, x + 46, top + 70], fill=shade, outline="black")
            for j, part in enumerate(names[offset].split()):
                draw.text((x + 6, top + 24 + 14 * j), part, fill="black", font=face)
            draw.text((x + 6, top + 74), f"@{offset}", fill="gray", font=face)
    note = "not contiguous: view(B, T, H*D) cannot read this; contiguous() copies it into this order"
    draw.text((20, 212), note if not data["is_contiguous"] else "contiguous", fill="black", font=face)
    return image


def draw_softmax_overflow(data: dict) -> Image.Image:
    limit = data["exp_overflows_above"]
    plot = Plot(
        title="softmax([s, 33]): the weight on s, computed two ways in float32",
        x_label="s, the larger score of the row", y_label="weight on s",
        x_range=(0, 120), y_range=(-0.05, 1.2), x_ticks=list(range(0, 121, 20)), y_ticks=[0, 0.25, 0.5, 0.75, 1],
        lines=[Line("naive: exp(s) / (exp(s) + exp(33))", data["top_score"], data["naive"], ORANGE, width=5),
               Line("stable: the module's softmax (subtracts the max first)", data["top_score"], data["stable"], BLUE)],
        bands=[(limit, 120, "naive: inf / inf = nan")],
        marks=[(limit, f"exp(s) > float32 max above s = {limit:.2f}")],
        points=[(97, data["stable"][data["top_score"].index(97.0)], "[97, 33]: stable 1, naive nan")],
        legend=(44, 0.55),
    )
    return plot.draw(SHOWN_WIDTH - 10, 320)


def draw_init_scale(spread: dict[str, list[float]]) -> Image.Image:
    blocks = list(range(len(spread[INITS[0]])))
    plot = Plot(
        title=f"The residual stream's spread through {len(blocks) - 1} blocks (the default model's options, width 64)",
        x_label="after block (0: the embeddings)", y_label="std / the embeddings' std",
        x_range=(0, blocks[-1]), y_range=(0.5, 1e4), log_y=True, x_ticks=blocks[::2], y_ticks=[1, 10, 100, 1000, 10000],
        lines=[Line(name, blocks, spread[name], colour, width=3) for name, colour in zip(INITS, (BLUE, ORANGE, RED), strict=True)],
        legend=(4.5, 250),
    )
    return plot.draw(SHOWN_WIDTH - 10, 340)


def draw_scale_and_head_size(data: dict) -> Image.Image:
    sizes = data["head_size"]
    plot = Plot(
        title=f"The largest of {data['keys']} weights, on average, as the head size D grows (random q, k of variance 1)",
        x_label="D, the head size (channels per head)", y_label="largest weight",
        x_range=(sizes[0], sizes[-1]), y_range=(0, 1), log_x=True, x_ticks=sizes, y_ticks=[0, 0.25, 0.5, 0.75, 1],
        lines=[Line("without the scale: softmax(q . k)", sizes, data["unscaled"], ORANGE, width=3),
               Line("the module's: softmax(q . k / sqrt(D))", sizes, data["scaled"], BLUE, width=3),
               Line(f"every key alike: 1/{data['keys']}", [sizes[0], sizes[-1]], [1 / data["keys"]] * 2, FAINT, dashed=True)],
        legend=(1.2, 0.95),
    )
    return plot.draw(SHOWN_WIDTH - 10, 300)


def draw_sums(weights: list[list[float]], title: str, causal: bool = True, cell: int = 33) -> Image.Image:
    """A weights grid, the future pale grey, with each row's sum at its right and each column's below."""
    face = font()
    w = np.array(weights)
    n = len(w)
    left, top = 30, 44
    image = Image.new("RGB", (max(left + n * cell + 60, face.getbbox(title)[2] + 12), top + n * cell + 40), "white")
    draw = ImageDraw.Draw(image)
    draw.text((6, 6), title, font=face, fill=INK)
    shade = COLORMAP[colour_level(w)]  # (T, T, 3)
    if causal:
        shade[np.triu(np.ones((n, n), dtype=bool), k=1)] = FUTURE
    image.paste(Image.fromarray(shade.repeat(cell, axis=0).repeat(cell, axis=1)), (left, top))
    draw.text((left + n * cell + 8, top - 6), "row sum", font=face, fill=FAINT, anchor="lb")
    for i in range(n):
        draw.text((left - 4, top + i * cell + cell // 2), f"t{i}", font=face, fill=INK, anchor="rm")
        draw.text((left + i * cell + cell // 2, top - 4), f"t{i}", font=face, fill=INK, anchor="mb")
        draw.text((left + n * cell + 8, top + i * cell + cell // 2), f"{w[i].sum():.2f}", font=face, fill=INK, anchor="lm")
        draw.text((left + i * cell + cell // 2, top + n * cell + 6), f"{w[:, i].sum():.2f}", font=face, fill=INK, anchor="mt")
    draw.text((left, top + n * cell + 24), "column sums", font=face, fill=FAINT)
    return image


def labelled_grid(n: int, title: str, cell: int, left: int, top: int, key_prefix: str) -> tuple[Image.Image, ImageDraw.ImageDraw, Any]:
    """A white canvas for an n x n grid of cells: the title, queries t0, t1, ... down the left and
    keys (key_prefix + i) across the top. Returns the image, its drawing context and the font."""
    face = font()
    image = Image.new("RGB", (max(left + n * cell + 8, face.getbbox(title)[2] + 12), top + n * cell + 8), "white")
    draw = ImageDraw.Draw(image)
    draw.text((6, 6), title, font=face, fill=INK)
    for i in range(n):
        draw.text((left - 4, top + i * cell + cell // 2), f"t{i}", font=face, fill=INK, anchor="rm")
        draw.text((left + i * cell + cell // 2, top - 4), f"{key_prefix}{i}", font=face, fill=INK, anchor="mb")
    return image, draw, face


def draw_scores(scores: list[list[float]], title: str, cell: int = 33) -> Image.Image:
    """A score grid on a blue (negative) to red (positive) scale, each cell with its number."""
    s = np.array(scores)
    n, most = len(s), float(np.abs(s).max())
    left, top = 30, 44
    image, draw, face = labelled_grid(n, title, cell, left, top, key_prefix="t")
    for i in range(n):
        for j in range(n):
            strength = abs(s[i, j]) / most  # 0 white, 1 full colour
            full = RED if s[i, j] > 0 else BLUE
            colour = tuple(round(255 + (c - 255) * strength * 0.8) for c in full)
            box = [left + j * cell, top + i * cell, left + (j + 1) * cell, top + (i + 1) * cell]
            draw.rectangle(box, fill=colour, outline=(190, 190, 190))
            draw.text((box[0] + cell // 2, box[1] + cell // 2), f"{s[i, j]:.1f}", font=face,
                      fill="white" if strength > 0.6 else INK, anchor="mm")
    return image


MAY_SEE, TOO_OLD = (158, 202, 234), (250, 215, 210)


def draw_visible(visible: list[list[bool]], causal: list[list[bool]], title: str, cell: int = 22) -> Image.Image:
    """Queries down (t0, t1, ...), keys across (0, 1, ...): blue where a query may look, grey the
    future, red what is visible causally but W or more back."""
    n = len(visible)
    left, top = 34, 44
    image, draw, face = labelled_grid(n, title, cell, left, top, key_prefix="")  # key i is token t_i
    for i in range(n):
        for j in range(n):
            fill = MAY_SEE if visible[i][j] else TOO_OLD if causal[i][j] else FUTURE
            draw.rectangle([left + j * cell, top + i * cell, left + (j + 1) * cell, top + (i + 1) * cell], fill=fill,
                           outline=(200, 200, 200))
    return image


def draw_ring(ring: list[list[int | None]], cell: int = 22) -> Image.Image:
    """After each token (a row), the position each ring slot holds; the slot just written in orange."""
    face = font()
    width, n = 44, len(ring)
    left, top = 64, 44
    title = f"KVCache(window={len(ring[0])}): its {len(ring[0])} slots"
    image = Image.new("RGB", (max(left + len(ring[0]) * width + 8, face.getbbox(title)[2] + 12), top + n * cell + 8),
                      "white")
    draw = ImageDraw.Draw(image)
    draw.text((6, 6), title, font=face, fill=INK)
    for s in range(len(ring[0])):
        draw.text((left + s * width + width // 2, top - 4), f"slot {s}", font=face, fill=INK, anchor="mb")
    for t, held in enumerate(ring):
        draw.text((left - 4, top + t * cell + cell // 2), f"after t{t}", font=face, fill=INK, anchor="rm")
        for s, position in enumerate(held):
            box = [left + s * width, top + t * cell, left + (s + 1) * width, top + (t + 1) * cell]
            draw.rectangle(box, fill=(255, 214, 170) if position == t else "white", outline=(200, 200, 200))
            if position is not None:
                draw.text((box[0] + width // 2, box[1] + cell // 2), f"t{position}", font=face,
                          fill=INK if position == t else FAINT, anchor="mm")
    return image


def draw_window(data: dict) -> Image.Image:
    W = data["window"]
    panels = side_by_side([
        draw_visible(data["causal"], data["causal"], "causal: itself and every earlier key"),
        draw_visible(data["band"], data["causal"], f"window={W}: the {W} most recent keys"),
        draw_ring(data["ring"]),
    ], gap=22)
    face = font()
    legend = Image.new("RGB", (panels.width, 24), "white")
    draw = ImageDraw.Draw(legend)
    x = 6
    for fill, text in ((MAY_SEE, "may attend"), (FUTURE, "the future"), (TOO_OLD, f"{W} or more back: hidden"),
                       ((255, 214, 170), f"the slot just written, over the token {W} back")):
        draw.rectangle([x, 6, x + 14, 20], fill=fill, outline=(200, 200, 200))
        draw.text((x + 20, 13), text, font=face, fill=INK, anchor="lm")
        x += 20 + face.getbbox(text)[2] + 18
    return one_above_another([panels, legend], gap=4)


def draw_kv_cache_sizes(data: dict) -> Image.Image:
    shape, contexts = data["default_shape"], data["context"]
    colours = (RED, ORANGE, BLUE, (44, 160, 44))
    plot = Plot(
        title=f"KV cache of one sequence, default shape: {shape['n_layer']} layers, {shape['n_head']} query heads of "
              f"D = {shape['head_dim']}, float32 (computed, not measured)",
        x_label="tokens held (S)", y_label="MiB",
        x_range=(0, contexts[-1]), y_range=(0, 17), x_ticks=list(range(0, contexts[-1] + 1, 512)), y_ticks=[0, 4, 8, 12, 16],
        lines=[Line(name, contexts, mib, colour, width=3) for (name, mib), colour in zip(data["mib"].items(), colours,
                                                                                            strict=True)],
        legend=(250, 15.5),
    )
    return plot.draw(SHOWN_WIDTH - 10, 320)


def draw_all(data: dict, folder: Path = FOLDER) -> None:
    """Every picture of PICTURES, as folder/<name>.png."""
    folder.mkdir(exist_ok=True)
    labels = [f"t{i}" for i in range(T)]
    masks = data["mask_conventions"]
    cell = 33
    pictures = {
        "forward_pass": draw_forward_pass(data["forward_pass"]),
        "mask_conventions": side_by_side([
            draw_mask(masks["hide"], cell),
            render_attention_map(np.array(masks["right"]), labels, "SDPA, attn_mask=~hide: right", causal=False, cell=cell),
            render_attention_map(np.array(masks["hide_mask_given_to_sdpa"]), labels, "SDPA, attn_mask=hide: the future",
                                 causal=False, cell=cell),
        ], gap=16),
        "scale_and_head_size": draw_scale_and_head_size(data["scale_and_head_size"]),
        "softmax_direction": side_by_side([
            draw_sums(data["softmax_direction"]["over_keys"], "softmax over the keys (dim=-1): rows sum to 1"),
            draw_sums(data["softmax_direction"]["over_queries"], "over the queries (dim=-2): columns sum to 1"),
        ], gap=24),
        "softmax_overflow": draw_softmax_overflow(data["softmax_overflow"]),
        "wq_for_k": one_above_another([side_by_side([
            draw_scores(data["wq_for_k"][name]["scores"], f"{title}: scores q . k / sqrt(D)"),
            render_attention_map(np.array(data["wq_for_k"][name]["weights"]), labels, f"{title}: weights",
                                 causal=False, cell=cell),
        ], gap=24) for name, title in (("keys_from_w_q", "keys from W_q"), ("keys_from_w_k", "keys from W_k"))], gap=12),
        "strides": draw_strides(data["strides"]),
        "init_scale": draw_init_scale(data["init_scale"]),
        "window": draw_window(data["window"]),
        "kv_cache_sizes": draw_kv_cache_sizes(data["kv_cache_sizes"]),
    }
    assert pictures.keys() == set(PICTURES)
    for name, picture in pictures.items():
        picture.save(folder / f"{name}.png", optimize=True)


def first_difference(made: object, kept: object, where: str = "figures.json") -> str | None:
    """Where figures made now differ from those kept in figures.json by more than float32's last bits,
    which another CPU or thread count moves (relative 1e-5, absolute 1e-6); None where they agree."""
    if isinstance(made, dict):
        if not isinstance(kept, dict) or made.keys() != kept.keys():
            return where
        return next(filter(None, (first_difference(made[key], kept[key], f"{where}.{key}") for key in made)), None)
    if isinstance(made, list | tuple):
        if not isinstance(kept, list) or len(made) != len(kept):
            return where
        pairs = enumerate(zip(made, kept, strict=True))
        return next(filter(None, (first_difference(a, b, f"{where}[{i}]") for i, (a, b) in pairs)), None)
    if isinstance(made, float) and isinstance(kept, float | int):
        return None if math.isclose(made, kept, rel_tol=1e-5, abs_tol=1e-6) else where
    return None if made == kept else where


if __name__ == "__main__":
    data = figure_data()
    figures = FOLDER / "figures.json"
    kept = json.loads(figures.read_text()) if figures.is_file() else {}
    kept.pop("drawn_with", None)
    if first_difference(data, kept) is None:
        data = kept  # the same figures but for float32's last bits: the file stays as it is, and the pictures drawn from it
    draw_all(data)
    figures.write_text(json.dumps({**data, "drawn_with": drawn_with()}, indent=1) + "\n")
    print(f"wrote {len(PICTURES)} pictures and their numbers to {FOLDER}")
