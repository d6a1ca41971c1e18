"""Make the README's attention picture from a trained run: `make docs RUN=<run dir>`.

It draws, on the run's own probe text, the head that copies names (the one the recall probe
finds looking back at the earlier mention most) beside the head that most looks one token back,
and writes docs/attention_maps.json: the run's config and the numbers docs/attention.md quotes
from it (section 14), which a test holds to the defaults and to the text.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cli.errors import exit_on_user_error  # noqa: E402
from data.dataset import prepare_tokens, probe_ids  # noqa: E402
from inspection.head_metrics import head_metrics  # noqa: E402
from inspection.heatmap import (  # noqa: E402
    BACKGROUND,
    COLORMAP,
    FONT_SIZE,
    FUTURE,
    INK,
    colour_level,
    draw_colorbar,
    label_font,
    readable_token,
    text_width,
)
from inspection.recall_probe import RecallProbe  # noqa: E402
from model_io.checkpoint import Checkpoint, resolve_checkpoint  # noqa: E402
from user_error import UserError  # noqa: E402

ATTENTION_MAPS = Path(__file__).resolve().parent / "attention_maps.png"
RECORD = ATTENTION_MAPS.with_suffix(".json")
# The probe's first tokens, 12 px a row so that each row's 11 px label is legible with both
# maps side by side in 830 px; in the default run's probe the name comes back at token 26.
SHOWN_TOKENS, CELL = 28, 12


def pick_heads(model, tokenizer, data_seed: int, probe_weights: torch.Tensor) -> list[tuple[int, int, str]]:
    """(layer, head, role) of the name-copying head and of the previous-token head."""
    recall = RecallProbe.build(tokenizer, model.config.block_size, seed=data_seed + 1).evaluate(model)
    copier = divmod(int(recall.head_weight.argmax()), recall.head_weight.shape[1])
    previous = head_metrics(probe_weights)["previous_token"]  # (L, H)
    previous[copier] = -1  # the other picture shows another head
    looker = divmod(int(previous.argmax()), previous.shape[1])
    # The head with the most weight on the token just before; one with under half of it spreads
    # its weight over the last few tokens.
    looks = "looks one token back" if previous[looker] >= 0.5 else "looks at the last few tokens"
    return [(*copier, "looks back at the earlier mention"), (*looker, looks)]


def attention_maps_figure(run: str, out: Path = ATTENTION_MAPS) -> list[tuple[int, int, str]]:
    checkpoint = Checkpoint.load(resolve_checkpoint(run))
    model, tokenizer = checkpoint.build_model()
    config, step = checkpoint.config, checkpoint.step
    if config["data"]["source"] != "stories":
        raise UserError(f"{run} was trained on data={config['data']['source']}; the picture needs a run on the "
                        "built-in stories, where names come back (the default)")
    data = prepare_tokens(config["data"], config["tokenizer"])
    probe = probe_ids(data.val, tokenizer, min(config["train"]["probe_tokens"], model.config.block_size))
    weights = model.attention_weights(torch.tensor([probe]))[:, 0]  # (L, H, T, T)
    heads = pick_heads(model, tokenizer, config["data"]["seed"], weights)
    shown = min(SHOWN_TOKENS, len(probe))  # causal: the first rows' weights are the whole probe's
    maps = [weights[layer, head, :shown, :shown].numpy() for layer, head, _ in heads]
    titles = [f"layer {layer} head {head}: {role}" for layer, head, role in heads]
    caption = f"step {step}, the probe's first {shown} tokens: a row is a query, a column a key"
    draw_maps(maps, tokenizer.token_strings(probe[:shown]), titles, caption).save(out, optimize=True)
    return heads


def draw_maps(maps: list[np.ndarray], labels: list[str], titles: list[str], caption: str) -> Image.Image:
    """Causal maps (T, T) side by side, sharing the query labels on the left and one colour bar."""
    font, unicode_ok = label_font()
    labels = [readable_token(label, unicode_ok)[:12] for label in labels]
    T, pad, gap = len(labels), 6, 16
    grid = T * CELL
    label_width = max(text_width(font, label) for label in labels) + pad
    top = 2 * (FONT_SIZE + 2 * pad) + label_width  # the caption, the titles, then the key labels
    width = label_width + len(maps) * (grid + gap) + 44
    image = Image.new("RGB", (width, top + grid + pad), BACKGROUND)
    draw = ImageDraw.Draw(image)
    draw.text((pad, pad), caption, font=font, fill=INK)
    for i, label in enumerate(labels):
        draw.text((label_width - pad // 2, top + i * CELL + CELL // 2), label, font=font, fill=INK, anchor="rm")
    strip = Image.new("RGB", (label_width, grid), BACKGROUND)  # key labels, turned to read bottom-up
    for j, label in enumerate(labels):
        ImageDraw.Draw(strip).text((pad // 2, j * CELL + CELL // 2), label, font=font, fill=INK, anchor="lm")
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    for n, (weights, title) in enumerate(zip(maps, titles, strict=True)):
        left = label_width + n * (grid + gap)
        draw.text((left, FONT_SIZE + 3 * pad), title, font=font, fill=INK)
        image.paste(strip.rotate(90, expand=True), (left, top - label_width))
        shade = COLORMAP[colour_level(weights)]  # (T, T, 3)
        shade[future] = FUTURE
        image.paste(Image.fromarray(shade.repeat(CELL, axis=0).repeat(CELL, axis=1)), (left, top))
    draw_colorbar(draw, x=label_width + len(maps) * (grid + gap) - gap + pad, top=top, height=grid, font=font)
    return image


def run_record(run: str) -> dict:
    """What docs/attention.md and the README take from the run: its config and step, and the
    numbers section 14 quotes, read from the run's TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = resolve_checkpoint(run)
    checkpoint = Checkpoint.load(path)
    events = EventAccumulator(str(path.parent), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    induction = [events.Scalars(tag)[-1].value for tag in tags if tag.startswith("head_induction/")]
    return {"step": checkpoint.step, "config": checkpoint.config,
            "name_recall": {str(e.step): round(e.value, 4) for e in events.Scalars("recall/accuracy_name")},
            "largest_induction_score_at_the_end": round(max(induction), 4)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run dir or checkpoint of the stories corpus")
    args = parser.parse_args()
    with exit_on_user_error():
        heads = attention_maps_figure(args.run)
        record = run_record(args.run)
    for layer, head, role in heads:
        print(f"layer {layer} head {head}: {role}")
    RECORD.write_text(json.dumps({**record, "heads": heads}, indent=1) + "\n")
    print(f"wrote {ATTENTION_MAPS} and {RECORD}")
