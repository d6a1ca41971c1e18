"""Make the README's attention picture from a trained run: `make docs RUN=<run dir>`.

It draws, on the run's own probe text, the head that copies names (the one the recall probe
finds looking back at the earlier mention most) beside the head that most looks one token back,
with a frame on the cell where the first name to come back looks back at its earlier mention,
and writes docs/attention_maps.json: the run's config and every number docs/attention.md and
the pages quote from the run (sections 14 to 16), which tests hold to the defaults and to the text.
"""

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cli.errors import exit_on_user_error  # noqa: E402
from data.batches import probe_ids  # noqa: E402
from data.specs import CorpusSpec, TokenizerSpec  # noqa: E402
from data.token_cache import prepare_tokens  # noqa: E402
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
from inspection.recall_probe import RecallProbe, recall_points  # noqa: E402
from inspection.tab_format import (  # noqa: E402
    RECALL_HEADS,
    ablation_prefix,
    head_metric_prefix,
    head_scalar_of,
    head_scalar_tag,
)
from inspection.text_forward import forward_text  # noqa: E402
from model_io.checkpoint import Checkpoint  # noqa: E402
from model_io.run_files import resolve_checkpoint  # noqa: E402
from training.tensorboard_log import NAME_RECALL  # noqa: E402
from user_error import UserError  # noqa: E402

ATTENTION_MAPS = Path(__file__).resolve().parent / "attention_maps.png"
RECORD = ATTENTION_MAPS.with_suffix(".json")
# The probe's first tokens, 12 px a row so that each row's 11 px label is legible with both
# maps side by side in 830 px; in the default run's probe the name comes back at token 26.
SHOWN_TOKENS, CELL, PAD = 28, 12, 6
# What section 16 of docs/attention.md types into the Attention tab: a name, then the name again.
YOUR_TEXT = "Once upon a time, there was a kind boy named Leo. He lived near the sea with his dog. One day, Leo"


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
    if config["data"].get("names", "common") != "common" or config["data"].get("word_games", 0):
        raise UserError(f"{run} read made-up names or word games (experiment=induction?); the README's pictures need a "
                        "run of make train's stories: make docs RUN=<its run dir>")
    data = prepare_tokens(CorpusSpec.of(config["data"]), TokenizerSpec.of(config["tokenizer"]))
    probe = probe_ids(data.val, tokenizer, min(config["train"]["probe_tokens"], model.config.block_size))
    weights = model.attention_weights(torch.tensor([probe]))[:, 0]  # (L, H, T, T)
    heads = pick_heads(model, tokenizer, config["data"]["seed"], weights)
    shown = min(SHOWN_TOKENS, len(probe))  # causal: the first rows' weights are the whole probe's
    maps = [weights[layer, head, :shown, :shown].numpy() for layer, head, _ in heads]
    titles = [f"layer {layer} head {head}: {role}" for layer, head, role in heads]
    caption = f"step {step}, the probe's first {shown} tokens: a row is a query, a column a key"
    cell = cited_cell(tokenizer.token_strings(probe[:shown]))
    draw_maps(maps, tokenizer.token_strings(probe[:shown]), titles, caption, framed=cell).save(out, optimize=True)
    return heads


def cited_cell(pieces: list[str]) -> tuple[int, int] | None:
    """(query, key) where the first name that comes back in these tokens is due: the token just
    before the repeated name, and the first token of its earlier mention; None without one."""
    ends = np.cumsum([len(piece) for piece in pieces])  # ends[i]: the text's length after token i

    def token_at(offset: int) -> int:
        return int(np.searchsorted(ends, offset, side="right"))

    for point in recall_points("".join(pieces)):
        if point.kind == "name":
            return token_at(point.start) - 1, token_at(point.earlier_start)
    return None


def draw_maps(maps: list[np.ndarray], labels: list[str], titles: list[str], caption: str,
              framed: tuple[int, int] | None = None) -> Image.Image:
    """Causal maps (T, T) side by side, sharing the query labels on the left and one colour bar;
    framed: (query, key), a cell of the first map drawn with a frame round it."""
    font, unicode_ok = label_font()
    labels = [readable_token(label, unicode_ok)[:12] for label in labels]
    T, pad, gap = len(labels), PAD, 16
    grid = T * CELL
    label_width, top = map_origin(labels)
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
    if framed is not None:
        frame_cell(image, labels, framed)
    return image


def map_origin(labels: list[str]) -> tuple[int, int]:
    """(x, y) of the first map's top left corner in draw_maps's picture, for its readable labels."""
    font, _ = label_font()
    label_width = max(text_width(font, label) for label in labels) + PAD
    return label_width, 2 * (FONT_SIZE + 2 * PAD) + label_width  # the caption, the titles, then the key labels


def frame_cell(image: Image.Image, labels: list[str], framed: tuple[int, int]) -> None:
    """A red frame round cell (query, key) of the first map in draw_maps's picture."""
    (query, key), (left, top) = framed, map_origin(labels)
    x, y = left + key * CELL, top + query * CELL
    ImageDraw.Draw(image).rectangle([x - 2, y - 2, x + CELL + 1, y + CELL + 1], outline=(214, 39, 40), width=2)


def run_record(run: str, heads: list[tuple[int, int, str]]) -> dict:
    """What docs/attention.md and the pages take from the run: its config and step, the numbers
    sections 14 to 16 quote, read from the run's TensorBoard events and computed with its model."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = resolve_checkpoint(run)
    checkpoint = Checkpoint.load(path)
    events = EventAccumulator(str(path.parent), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    induction = [events.Scalars(tag)[-1].value for tag in tags if (where := head_scalar_of(tag)) and where[0] == "induction"]
    model, tokenizer = checkpoint.build_model()
    return {"step": checkpoint.step, "config": checkpoint.config,
            "name_recall": {str(e.step): round(e.value, 4) for e in events.Scalars(NAME_RECALL)},
            "largest_induction_score_at_the_end": round(max(induction), 4),
            "framed_cell": framed_cell(checkpoint, model, tokenizer, heads[0][:2]),
            "without_each_head": ablation_table(events, model.config.n_layer, model.config.n_head),
            "your_text": your_text(model, tokenizer, events)}


def framed_cell(checkpoint: Checkpoint, model, tokenizer, head: tuple[int, int]) -> dict | None:
    """The cell the picture frames in the copying head's map: its tokens and its weight."""
    config = checkpoint.config
    data = prepare_tokens(CorpusSpec.of(config["data"]), TokenizerSpec.of(config["tokenizer"]))
    probe = probe_ids(data.val, tokenizer, min(config["train"]["probe_tokens"], model.config.block_size))
    pieces = tokenizer.token_strings(probe[:SHOWN_TOKENS])
    cell = cited_cell(pieces)
    if cell is None:
        return None
    weights = model.attention_weights(torch.tensor([probe]))[:, 0]  # (L, H, T, T)
    (query, key), (layer, head_) = cell, head
    return {"layer": layer, "head": head_, "query": query, "key": key, "query_token": pieces[query],
            "key_token": pieces[key], "weight": round(weights[layer, head_, query, key].item(), 4)}


def last_values(events, prefix: str, n_layer: int, n_head: int) -> dict[tuple[int, int], float]:
    return {(layer, head): events.Scalars(head_scalar_tag(prefix, layer, head))[-1].value
            for layer in range(n_layer) for head in range(n_head)}


def ablation_table(events, n_layer: int, n_head: int) -> dict:
    """Section 16's table: name recall with every head in; the three heads without which it falls
    most, each with its look-back weight and induction score; the ranges of the others."""
    without = last_values(events, ablation_prefix("name"), n_layer, n_head)
    look_back = last_values(events, RECALL_HEADS, n_layer, n_head)
    induction = last_values(events, head_metric_prefix("induction"), n_layer, n_head)
    order = sorted(without, key=without.get)
    rows = [[*head, round(without[head], 3), round(look_back[head], 3), round(induction[head], 3)] for head in order[:3]]
    others = order[3:]
    return {"intact": round(events.Scalars(NAME_RECALL)[-1].value, 3), "heads": rows,
            "others": {"count": len(others),
                       "without": [round(min(without[h] for h in others), 3), round(max(without[h] for h in others), 3)],
                       "look_back": [round(min(look_back[h] for h in others), 3), round(max(look_back[h] for h in others), 3)],
                       "largest_induction": math.ceil(max(induction[h] for h in others) * 1000) / 1000}}  # "at most"


def your_text(model, tokenizer, events) -> dict:
    """Section 16: YOUR_TEXT read by the model, as the Attention tab reads it. The token before the
    second mention of the name: its weight on the first mention in the two heads that look back at
    earlier names most, the name's loss with each of them knocked out, and what leads without the first."""
    look_back = last_values(events, RECALL_HEADS, model.config.n_layer, model.config.n_head)
    heads = sorted(look_back, key=look_back.get, reverse=True)[:2]
    intact = forward_text(model, tokenizer, YOUR_TEXT)
    pieces = tokenizer.token_strings(intact.ids)
    name = YOUR_TEXT.rsplit(" ", 1)[1]
    first, second = [i for i, piece in enumerate(pieces) if piece.strip() == name][:2]
    rows, likeliest = [], []
    for layer, head in heads:
        knocked = forward_text(model, tokenizer, YOUR_TEXT, knocked_out=[(layer, head)])
        rows.append({"layer": layer, "head": head, "look_back": round(look_back[layer, head], 3),
                     "weight": round(intact.weights[layer, head, second - 1, first].item(), 2),
                     "loss_without": round(knocked.predictions.next_loss[second - 1].item(), 2)})
        likeliest.append([piece.strip() for piece in tokenizer.token_strings(knocked.predictions.top_ids[second - 1].tolist())])
    return {"text": YOUR_TEXT, "name": name, "query_token": pieces[second - 1],
            "loss": round(intact.predictions.next_loss[second - 1].item(), 2), "heads": rows,
            "without_the_first": {"name_in_top_5": name in likeliest[0], "top_2": likeliest[0][:2]}}


def figures_of(run: str, staged: Path) -> tuple[list[tuple[int, int, str]], dict]:
    """The picture (drawn at staged) and the numbers of a run; UserError, in one line, for a run of
    another shape than make train's (fewer heads, no recall logged, a shorter context than the
    pages' text), whose numbers the code above does not find."""
    heads = attention_maps_figure(run, out=staged)  # refuses a run that is not there, or not of the stories
    try:
        return heads, run_record(run, heads)
    except (KeyError, IndexError, ValueError, UserError) as err:
        raise UserError(f"RUN={run}: make docs draws the pictures and numbers of a run of make train's settings, and this "
                        f"run lacks what they need ({err}); give RUN=<a run dir of make train>") from None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run dir or checkpoint of the stories corpus")
    args = parser.parse_args()
    staged = ATTENTION_MAPS.with_name(f".{ATTENTION_MAPS.stem}.tmp.png")  # replaces the picture once the numbers are in
    with exit_on_user_error():
        try:
            heads, record = figures_of(args.run, staged)
        except BaseException:
            staged.unlink(missing_ok=True)
            raise
    staged.replace(ATTENTION_MAPS)
    for layer, head, role in heads:
        print(f"layer {layer} head {head}: {role}")
    RECORD.write_text(json.dumps({**record, "heads": heads}, indent=1) + "\n")
    print(f"wrote {ATTENTION_MAPS} and {RECORD}")
