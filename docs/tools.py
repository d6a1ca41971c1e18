"""Make docs/tools.md's record and the tour's section 18 pictures: what the logit lens, direct logit
attribution and activation patching find on the default run and on a run of experiment=induction:
`make docs RUN=<default run> INDUCTION_RUNS="<run dir> ..."` (the first induction run is read).

It writes docs/tools.json, the numbers docs/tools.md and docs/attention.md quote (a test ties them
to the text), and draws from that record alone docs/residual_stream.png (each part's direct share
of the name's logit difference, and the logit lens) and docs/patching.png (each head's direct
share, knock-out and patch; the residual stream patched layer by layer, position by position), and
docs/patching_induction.png, the same for the induction run. Without an induction run, the
record's induction part stays as it is.
    python docs/tools.py <default run> [<induction run>]
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
from data.tokenizer import special_ids  # noqa: E402
from docs.drawing import BLUE, FAINT, RED, SHOWN_WIDTH, drawn_with, font, one_above_another, side_by_side  # noqa: E402
from inspection.head_metrics import head_metrics, induction_score, run_induction_probe  # noqa: E402
from inspection.heatmap import INK, readable_token, text_width  # noqa: E402
from inspection.logit_attribution import logit_attribution  # noqa: E402
from inspection.logit_lens import logit_lens  # noqa: E402
from inspection.name_swap import CLASSIC, NAMES, STORY, name_swap  # noqa: E402
from inspection.patching import knock_out_effects, logit_difference, patch_heads, patch_residual  # noqa: E402
from inspection.repeated_tokens import repeated_pair  # noqa: E402
from model import GPT, eval_mode  # noqa: E402
from model_io.checkpoint import Checkpoint  # noqa: E402
from model_io.run_files import kept_checkpoints, resolve_checkpoint  # noqa: E402
from user_error import UserError  # noqa: E402

DOCS = Path(__file__).resolve().parent
RECORD = DOCS / "tools.json"
RESIDUAL, PATCHING, PATCHING_INDUCTION = PICTURES = "residual_stream.png", "patching.png", "patching_induction.png"
# Repeated random tokens on the induction run: 12 distinct tokens, then the same again but the last, for
# each of 20 seeds; the example is the first the model answers both ways (clean and corrupted) with p >= 0.5.
N, SEEDS, SURE = 12, 20, 0.5


def rounded(values: torch.Tensor, digits: int = 2) -> list:
    """A tensor as nested lists of floats, rounded as the pages quote them (-0.0 as 0.0)."""
    return (np.round(values.detach().double().numpy(), digits) + 0.0).tolist()


def findings(model: GPT, tokenizer, clean: torch.Tensor, corrupted: torch.Tensor, answer: int, other: int) -> dict:
    """What the three tools say about logit(answer) - logit(other) at the last position of clean (1, T),
    against corrupted (1, T), whose answer is other."""
    metric = logit_difference(-1, answer, other)
    with eval_mode(model), torch.no_grad():
        probs = [model(idx)[0][0, -1].softmax(dim=-1) for idx in (clean, corrupted)]  # 2 x (V,)
    lens = logit_lens(model, clean)[:, 0, -1]  # (L, B, T, V) -> (L, V)
    attribution = logit_attribution(model, clean, -1, answer, other)
    knocked = knock_out_effects(model, clean, metric)  # (L, H)
    by_head = patch_heads(model, clean, corrupted, metric)  # fraction (L, H)
    by_place = patch_residual(model, clean, corrupted, metric)  # fraction (L, T)
    layer, head = divmod(int(by_head.fraction.argmax()), model.config.n_head)
    with eval_mode(model), torch.no_grad():
        _, cache = model.run_with_cache(clean, names=lambda name: name == f"blocks.{layer}.attn.hook_pattern")
    looks = cache["pattern", layer][0, head, -1]  # (B, H, T, T) -> (T,): the last query's weights
    pieces = tokenizer.token_strings(clean[0].tolist())
    return {
        "tokens": pieces, "answer": tokenizer.token_strings([answer])[0], "other": tokenizer.token_strings([other])[0],
        "metric": {"clean": round(by_head.clean, 2), "corrupted": round(by_head.corrupted, 2)},
        "probability": {"answer_on_clean": round(probs[0][answer].item(), 3), "other_on_corrupted": round(probs[1][other].item(), 3)},
        "lens": [{"layer": n, "rank": 1 + int((lens[n] > lens[n, answer]).sum()), "probability": round(lens[n, answer].exp().item(), 3),
                  "top": tokenizer.token_strings([int(lens[n].argmax())])[0]} for n in range(len(lens))],
        "shares": {label: round(share.item(), 2) for label, share in attribution.shares.items()},
        "logit_difference": round(attribution.logit.item(), 2), "shares_total": round(attribution.total().item(), 2),
        "direct": rounded(attribution.heads()[..., 0]), "knock_out": rounded(knocked), "patch_heads": rounded(by_head.fraction),
        "patch_residual": rounded(by_place.fraction),
        "best_patch": {"layer": layer, "head": head, "restored": round(by_head.fraction[layer, head].item(), 2),
                       "looks_at": int(looks.argmax()), "weight": round(looks.max().item(), 2)},
    }


def default_part(run: str) -> dict:
    """The default run on the name swap in its stories' form, and what it makes of the classic sentence."""
    checkpoint = Checkpoint.load(resolve_checkpoint(run))
    if checkpoint.config["data"]["source"] != "stories" or checkpoint.config["data"].get("names", "common") != "common":
        raise UserError(f"{run} did not read make train's stories; give the default run: make docs RUN=<its run dir>")
    model, tokenizer = checkpoint.build_model()
    swap, classic = name_swap(tokenizer, *NAMES, template=STORY), name_swap(tokenizer, *NAMES, template=CLASSIC)
    with eval_mode(model), torch.no_grad():
        probs = model(classic.clean)[0][0, -1].softmax(dim=-1)  # (V,)
    top = probs.topk(3)
    return {"step": checkpoint.step, "config": checkpoint.config, "prompt": STORY.format(answer=NAMES[0], other=NAMES[1]),
            "classic": {"prompt": CLASSIC.format(answer=NAMES[0], other=NAMES[1]),
                        "top": [[piece, round(p, 3)] for piece, p in zip(tokenizer.token_strings(top.indices.tolist()), top.values.tolist(), strict=True)],
                        "answer_probability": round(probs[swap.answer].item(), 3)},
            **findings(model, tokenizer, swap.clean, swap.corrupted, swap.answer, swap.other)}


def induction_part(run: str) -> dict:
    checkpoint = Checkpoint.load(resolve_checkpoint(run))
    if not checkpoint.config["data"].get("word_games"):
        raise UserError(f"{run} was not trained with word games; give a run of python train.py experiment=induction")
    model, tokenizer = checkpoint.build_model()
    tried = []
    for seed in range(SEEDS):
        clean, corrupted, answer, other = repeated_pair(tokenizer.vocab_size, tokenizer.bos_id, tokenizer.eot_id, N, seed)
        clean, corrupted = torch.tensor([clean]), torch.tensor([corrupted])  # (1, 2N) each
        with eval_mode(model), torch.no_grad():
            sure = [model(idx)[0][0, -1].softmax(dim=-1)[token].item() for idx, token in ((clean, answer), (corrupted, other))]
        by_head = patch_heads(model, clean, corrupted, logit_difference(-1, answer, other)).fraction  # (L, H)
        tried.append({"seed": seed, "probabilities": [round(p, 3) for p in sure],
                      "best_head": list(divmod(int(by_head.argmax()), model.config.n_head)), "restored": round(by_head.max().item(), 2),
                      "pair": (clean, corrupted, answer, other)})
    example = next((t for t in tried if min(t["probabilities"]) >= SURE), None)
    if example is None:
        raise UserError(f"on none of {SEEDS} sequences of {N} random tokens repeated does {run} copy the token with p >= "
                        f"{SURE} both ways; give a run of the preset's whole {checkpoint.config['train']['max_steps']} steps")
    best_heads = [f"{layer}.{head}" for layer, head in (t["best_head"] for t in tried)]
    over_seeds = {"seeds": SEEDS, "best_heads": {name: best_heads.count(name) for name in sorted(set(best_heads))},
                  "restored": [min(t["restored"] for t in tried), max(t["restored"] for t in tried)],
                  "copied": sum(t["probabilities"][0] >= SURE for t in tried)}
    with eval_mode(model), torch.no_grad():
        _, cache = model.run_with_cache(example["pair"][0], names=lambda name: name.endswith("hook_pattern"))
    patterns = cache.stack_activation("pattern")[:, 0, :, 1:, 1:]  # (L, B, H, T, T) -> (L, H, T - 1, T - 1) without the start token
    found = findings(model, tokenizer, *example["pair"])
    head = (found["best_patch"]["layer"], found["best_patch"]["head"])
    return {"step": checkpoint.step, "config": checkpoint.config, "n": N, "seed": example["seed"], "changed_position": N,
            "over_seeds": over_seeds, "previous_token": rounded(head_metrics(patterns)["previous_token"], 3),
            **found, "across_training": across_training(resolve_checkpoint(run).parent, example["pair"], head)}


def across_training(run_dir: Path, pair: tuple, head: tuple[int, int]) -> list[dict]:
    """The example at each step the run kept (train.keep_checkpoints): the head's induction score
    (on the random tokens repeated that the run logs head_induction on), the metric on the clean prompt
    and on the corrupted one, the head's direct share of the clean one, and what its patch restores
    (None where the two prompts' metrics are the same: nothing to restore); [] for a run that kept none."""
    clean, corrupted, answer, other = pair
    layer, h = head
    rows = []
    for step, path in kept_checkpoints(run_dir).items():
        checkpoint = Checkpoint.load(path)
        model, tokenizer = checkpoint.build_model()
        model.eval()
        train = checkpoint.config["train"]  # the sequence the run scored head_induction on
        probe = run_induction_probe(tokenizer.vocab_size, train["probe_tokens"], model.config.block_size, train["seed"],
                                    avoid=special_ids(tokenizer))  # (1, 2n), or None: too short a probe to score
        score = None
        if probe is not None:
            weights = model.attention_weights(probe)[:, 0]  # (L, 1, H, 2n, 2n) -> (L, H, 2n, 2n)
            score = induction_score(weights, probe.shape[1] // 2)[layer, h].item()  # (L, H) -> one head's
        attribution = logit_attribution(model, clean, -1, answer, other)
        try:
            patched = patch_heads(model, clean, corrupted, logit_difference(-1, answer, other))
            restored, corrupted_metric = round(patched.fraction[layer, h].item(), 2), round(patched.corrupted, 2)
        except UserError:
            restored = corrupted_metric = None
        rows.append({"step": step, "induction_score": None if score is None else round(score, 2),
                     "metric": {"clean": round(attribution.logit.item(), 2), "corrupted": corrupted_metric},
                     "direct_share": round(attribution.shares[f"L{layer}H{h}"].item(), 2), "restored": restored})
    return rows


# The pictures, drawn from the record alone, so that a test can redraw them and compare.

def signed_colour(value: float, most: float) -> tuple[int, int, int]:
    strength = min(abs(value) / most, 1.0) if most else 0.0  # 0 white, 1 full colour
    full = RED if value > 0 else BLUE
    return tuple(round(255 + (c - 255) * strength * 0.85) for c in full)


def signed_grid(values: list[list[float]], rows: list[str], columns: list[str], title: str, most: float,
                cell: tuple[int, int] = (46, 26), digits: int = 2) -> Image.Image:
    """values (rows, columns) on a blue (negative), white (0), red (positive) scale to +-most, each cell
    with its number to `digits` places; column labels above, turned when they are tokens."""
    face = font()
    width, height = cell
    turned = any(text_width(face, label) > width - 2 for label in columns)
    left = max(text_width(face, label) for label in rows) + 10
    head = (max(text_width(face, label) for label in columns) + 8) if turned else 18
    top = 24 + head
    image = Image.new("RGB", (max(left + len(columns) * width + 4, text_width(face, title) + 12), top + len(rows) * height + 4), "white")
    draw = ImageDraw.Draw(image)
    draw.text((6, 4), title, font=face, fill=INK)
    for j, label in enumerate(columns):
        x = left + j * width + width // 2
        if turned:
            strip = Image.new("RGB", (head, width), "white")
            ImageDraw.Draw(strip).text((4, width // 2), label, font=face, fill=INK, anchor="lm")
            image.paste(strip.rotate(90, expand=True), (left + j * width, 24))
        else:
            draw.text((x, top - 4), label, font=face, fill=INK, anchor="mb")
    for i, label in enumerate(rows):
        draw.text((left - 6, top + i * height + height // 2), label, font=face, fill=INK, anchor="rm")
        for j, value in enumerate(values[i]):
            box = [left + j * width, top + i * height, left + (j + 1) * width, top + (i + 1) * height]
            draw.rectangle(box, fill=signed_colour(value, most), outline=(200, 200, 200))
            strong = abs(value) / most > 0.6 if most else False
            number = f"{value:.{digits}f}"
            draw.text((box[0] + width // 2, box[1] + height // 2), "0" if float(number) == 0 else number, font=face,
                      fill="white" if strong else INK, anchor="mm")
    return image


def share_bars(shares: dict[str, float], total: float, title: str, width: int, row: int = 15) -> Image.Image:
    """One horizontal bar per part, from 0, with its value; the last row the sum, the logit difference."""
    face = font()
    items = [*shares.items(), ("sum", total)]
    left = max(text_width(face, label) for label, _ in items) + 12
    low, high = min(0.0, *[v for _, v in items]), max(0.0, *[v for _, v in items])
    span = (width - left - 50) / (high - low)
    zero = left + (0 - low) * span
    top = 26
    image = Image.new("RGB", (width, top + len(items) * row + 8), "white")
    draw = ImageDraw.Draw(image)
    draw.text((6, 4), title, font=face, fill=INK)
    for i, (label, value) in enumerate(items):
        y = top + i * row
        if label == "sum":
            draw.line([(left, y), (width - 8, y)], fill=FAINT)
        draw.text((left - 8, y + row // 2), label, font=face, fill=INK, anchor="rm")
        end = zero + value * span
        colour = INK if label == "sum" else (RED if value > 0 else BLUE)
        draw.rectangle([min(zero, end), y + 3, max(zero, end), y + row - 3], fill=colour)
        if abs(value) >= 0.1 or label == "sum":
            draw.text((max(zero, end) + 4, y + row // 2), f"{value:+.2f}", font=face, fill=INK, anchor="lm")
    draw.line([(zero, top), (zero, top + len(items) * row)], fill=INK)
    return image


def lens_bars(lens: list[dict], answer: str, width: int, height: int = 200) -> Image.Image:
    """The answer's probability after each layer, a bar each, its rank below."""
    face = font()
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    draw.text((6, 4), f"the logit lens: p({readable_token(answer)}) after each layer", font=face, fill=INK)
    left, top, bottom = 40, 30, height - 40
    slot = (width - left - 10) / len(lens)
    for p in (0, 0.5, 1):
        y = bottom - p * (bottom - top)
        draw.line([(left, y), (width - 10, y)], fill=(225, 225, 225))
        draw.text((left - 6, y), f"{p:g}", font=face, fill=INK, anchor="rm")
    for n, layer in enumerate(lens):
        x = left + n * slot
        y = bottom - layer["probability"] * (bottom - top)
        draw.rectangle([x + slot * 0.2, y, x + slot * 0.8, bottom], fill=RED)
        draw.text((x + slot / 2, y - 3), f"{layer['probability']:.3f}", font=face, fill=INK, anchor="mb")
        draw.text((x + slot / 2, bottom + 4), f"layer {layer['layer']}", font=face, fill=INK, anchor="mt")
        draw.text((x + slot / 2, bottom + 20), f"rank {layer['rank']}", font=face, fill=INK, anchor="mt")
    return image


def residual_figure(part: dict) -> Image.Image:
    bars = share_bars(part["shares"], part["logit_difference"],
                      f"direct shares of logit({readable_token(part['answer'])}) - logit({readable_token(part['other'])})", 470)
    return side_by_side([bars, lens_bars(part["lens"], part["answer"], SHOWN_WIDTH - bars.width - 16, height=bars.height)], gap=16)


def patching_figure(part: dict) -> Image.Image:
    L, H = len(part["direct"]), len(part["direct"][0])
    rows, heads = [f"layer {layer}" for layer in range(L)], [f"head {head}" for head in range(H)]
    most = max(abs(v) for grid in (part["direct"], part["knock_out"]) for row in grid for v in row)
    grids = [signed_grid(part["direct"], rows, heads, "direct share", most),
             signed_grid(part["knock_out"], rows, heads, "lost when knocked out", most),
             signed_grid(part["patch_heads"], rows, heads, "restored by its patch", 1.0)]
    tokens = [readable_token(piece)[:10] for piece in part["tokens"]]
    width = min(44, (SHOWN_WIDTH - 110) // len(tokens))
    stream = signed_grid(part["patch_residual"], [f"into layer {layer}" for layer in range(L)], tokens,
                         "restored by the stream entering a layer, patched at one position", 1.0, cell=(width, 24),
                         digits=2 if width >= 40 else 1)
    return one_above_another([side_by_side(grids, gap=10), stream], gap=14)


def draw_all(record: dict, folder: Path = DOCS) -> None:
    """The three pictures, from the record alone: folder/residual_stream.png, patching.png, patching_induction.png."""
    residual_figure(record["default"]).save(folder / RESIDUAL, optimize=True)
    patching_figure(record["default"]).save(folder / PATCHING, optimize=True)
    patching_figure(record["induction"]).save(folder / PATCHING_INDUCTION, optimize=True)


def main(default_run: str, induction_runs: list[str]) -> dict:
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    record["default"] = default_part(default_run)
    if induction_runs:
        record["induction"] = induction_part(induction_runs[0])
    elif "induction" not in record:
        raise UserError("docs/tools.json has no induction part yet: give a run of experiment=induction too "
                        "(make docs INDUCTION_RUNS=<its run dir>)")
    else:
        print("docs/tools.py: no induction run given (INDUCTION_RUNS); the record's induction part stays as it is")
    record["drawn_with"] = drawn_with()
    return record


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="the default run: a run dir or checkpoint of make train")
    parser.add_argument("induction_runs", nargs="*", help="runs of python train.py experiment=induction (the first is read)")
    args = parser.parse_args()
    with exit_on_user_error():
        record = main(args.run, args.induction_runs)
    draw_all(record)
    RECORD.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {RECORD} and {', '.join(str(DOCS / name) for name in PICTURES)}")
