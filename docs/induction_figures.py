"""Make docs/induction.md's pictures and record from runs of `experiment=induction`:
`make docs INDUCTION_RUNS="<run dir> [<run dir> ...]"` (the first is drawn; every run adds the
step at which its best head crossed 0.3, for the seeds table).

It writes docs/induction_scores.png (every head's induction score over the steps, the
previous-token score of the circuit's first head, and loss/in_context), docs/induction_map.png
(the two heads of the circuit on random tokens repeated once), and docs/induction.json, the
numbers docs/induction.md and docs/attention.md quote, which a test ties to the text.
`--out <folder>` writes the three files there instead, leaving docs/ as it is:
    python docs/induction_figures.py <run dir> --out <run dir>
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cli.errors import exit_on_user_error  # noqa: E402
from cli.run_spec import composed_run_spec  # noqa: E402
from data.tokenizer import special_ids  # noqa: E402
from docs.drawing import BLUE, FAINT, ORANGE, RED, SHOWN_WIDTH, Line, Plot, one_above_another  # noqa: E402
from docs.figures import draw_maps  # noqa: E402
from inspection.head_metrics import induction_probe  # noqa: E402
from inspection.heatmap import INK as INK_LINE  # noqa: E402
from inspection.tab_format import INDUCTION_ABLATION, head_metric_prefix, head_scalar_parts  # noqa: E402
from model_io.checkpoint import Checkpoint  # noqa: E402
from model_io.run_files import resolve_checkpoint  # noqa: E402
from training.tensorboard_log import BATCH_LOSS, IN_CONTEXT_LOSS  # noqa: E402
from user_error import UserError  # noqa: E402

DOCS = Path(__file__).resolve().parent
SCORES, MAP, RECORD = "induction_scores.png", "induction_map.png", "induction.json"  # written in docs/ or --out
SHOWN_TOKENS = 12  # random tokens in each copy of the drawn sequence: 24 rows, 12 px each
BEFORE, AFTER, CROSSING = 0.05, 0.5, 0.3  # the issue's marks: below, above, and the seeds' crossing
JUMP = 0.2  # the steep part of the rise starts where the score leaves this


def read_run(run: str) -> tuple[Checkpoint, dict[str, dict[int, float]], float]:
    """The run's last checkpoint, every scalar it logged ({tag: {step: value}}), and the
    seconds from its first logged step to its last."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = resolve_checkpoint(run)
    checkpoint = Checkpoint.load(path)
    if not checkpoint.config["data"].get("word_games"):
        raise UserError(f"{run} was not trained with word games; give runs of python train.py experiment=induction")
    events = EventAccumulator(str(path.parent), size_guidance={"scalars": 0})
    events.Reload()
    scalars = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    walls = [e.wall_time for e in events.Scalars(BATCH_LOSS)]
    return checkpoint, scalars, walls[-1] - walls[0]


def heads_of(scalars: dict[str, dict[int, float]], prefix: str) -> dict[tuple[int, int], dict[int, float]]:
    """{(layer, head): {step: value}} of the tags prefix/layer_<l>/head_<h>."""
    return {(parts[1], parts[2]): series for tag, series in scalars.items()
            if (parts := head_scalar_parts(tag)) and parts[0] == prefix}


def circuit(scalars: dict[str, dict[int, float]]) -> tuple[tuple[int, int], tuple[int, int]]:
    """The induction head (the highest score at the last step, above layer 0) and, in a layer
    below it, the head its keys read: of the heads whose knock-out costs the second copy a nat or
    more, the one that looks back one token most (else the knock-out that costs most)."""
    induction = heads_of(scalars, head_metric_prefix("induction"))
    last = max(next(iter(induction.values())))
    head = max((h for h in induction if h[0] > 0), key=lambda h: induction[h][last])  # it reads a layer below
    without = heads_of(scalars, INDUCTION_ABLATION)
    intact = scalars[f"{INDUCTION_ABLATION}/intact"][last]
    previous = heads_of(scalars, head_metric_prefix("previous_token"))
    below = [h for h in without if h[0] < head[0]]
    needed = [h for h in below if without[h][last] >= intact + 1.0]
    if needed:
        return head, max(needed, key=lambda h: previous[h][last])
    return head, max(below, key=lambda h: without[h][last])


def rise(series: dict[int, float], start: float = BEFORE) -> tuple[int, int] | None:
    """(the last step below start, the first step at AFTER or more after it); None if the
    score never reached AFTER."""
    steps = sorted(series)
    first_above = next((step for step in steps if series[step] >= AFTER), None)
    if first_above is None:
        return None
    last_below = max(step for step in steps if step < first_above and series[step] < start)
    return last_below, first_above


def crossing(scalars: dict[str, dict[int, float]]) -> int | None:
    """The first step at which any head's induction score reached CROSSING."""
    induction = heads_of(scalars, head_metric_prefix("induction"))
    steps = sorted(next(iter(induction.values())))
    return next((step for step in steps if max(series[step] for series in induction.values()) >= CROSSING), None)


def run_record(checkpoint: Checkpoint, scalars: dict[str, dict[int, float]], seconds: float) -> dict:
    head, previous = circuit(scalars)
    induction = heads_of(scalars, head_metric_prefix("induction"))[head]
    if max(induction.values()) < AFTER:
        raise UserError(f"no head's induction score reached {AFTER} by step {max(induction)} (the best: layer {head[0]} "
                        f"head {head[1]}, {max(induction.values()):.3f}); draw a run of the preset's whole "
                        f"{composed_run_spec('experiment=induction').loop.max_steps:,} steps")
    previous_score = heads_of(scalars, head_metric_prefix("previous_token"))[previous]
    without = heads_of(scalars, INDUCTION_ABLATION)
    intact = scalars[f"{INDUCTION_ABLATION}/intact"]
    last = max(induction)
    before, after = rise(induction)
    jump = rise(induction, start=JUMP)
    in_context = scalars[IN_CONTEXT_LOSS]
    best_previous = max(heads_of(scalars, head_metric_prefix("previous_token")).items(), key=lambda kv: kv[1][last])
    return {
        "step": checkpoint.step, "seconds": round(seconds), "config": checkpoint.config,
        "induction_head": list(head), "previous_token_head": list(previous),
        "induction_score": {"last": round(induction[last], 3), "before": [before, round(induction[before], 3)],
                            "after": [after, round(induction[after], 3)],
                            "rise_fraction_of_steps": round((after - before) / checkpoint.config["train"]["max_steps"], 3),
                            "jump": list(jump), "jump_fraction_of_steps": round((jump[1] - jump[0]) / checkpoint.config["train"]["max_steps"], 3)},
        "previous_token_score": round(previous_score[last], 3),
        "best_previous_token": [*best_previous[0], round(best_previous[1][last], 3)],
        "second_copy_loss": {"intact": round(intact[last], 2), "without_induction_head": round(without[head][last], 2),
                             "without_previous_token_head": round(without[previous][last], 2),
                             "at_start": round(intact[0], 2),
                             "without": {f"{layer}.{h}": round(series[last], 2) for (layer, h), series in sorted(without.items())}},
        "in_context": {str(step): round(value, 3) for step, value in sorted(in_context.items())},
        "series": {name: {str(step): round(value, 3) for step, value in sorted(values.items())} for name, values in (
            ("induction_head", induction), ("previous_token_head", previous_score), ("batch_loss", scalars[BATCH_LOSS]),
            ("second_copy_intact", intact))},
    }


def scores_figure(record: dict, scalars: dict[str, dict[int, float]], path: Path) -> None:
    """Three panels over the same steps: every head's induction score (the induction head in red)
    with the circuit's layer-0 head's previous-token score; loss/in_context; the training loss."""
    induction = heads_of(scalars, head_metric_prefix("induction"))
    head, previous = tuple(record["induction_head"]), tuple(record["previous_token_head"])
    steps = sorted(induction[head])
    top = max(steps)
    x_ticks = list(range(0, top + 1, 250 if top <= 2000 else 500))
    lines = [Line("", steps, [induction[h][s] for s in steps], FAINT, width=1) for h in sorted(induction) if h != head]
    lines.append(Line(f"induction score, layer {head[0]} head {head[1]}", steps, [induction[head][s] for s in steps], RED, width=3))
    prev = heads_of(scalars, head_metric_prefix("previous_token"))[previous]
    lines.append(Line(f"previous-token score, layer {previous[0]} head {previous[1]}", steps, [prev[s] for s in steps], BLUE))
    jump = record["induction_score"]["jump"]
    band = [(jump[0], jump[1], "the jump")]  # from the last step below JUMP to the first at AFTER or more
    scores = Plot("every head's induction score on random characters repeated once (grey: the other heads)", "step",
                  "score", (0, top), (0, 1), x_ticks, [0, 0.25, 0.5, 0.75, 1], lines, bands=band, legend=(top * 0.45, 0.2))
    in_context = scalars[IN_CONTEXT_LOSS]
    evals = sorted(in_context)
    low = min(in_context.values())
    context = Plot(f"{IN_CONTEXT_LOSS}: val loss late in the window minus early", "step", "nats", (0, top), (low - 0.05, 0.05),
                   x_ticks, [round(low, 2), round(low / 2, 2), 0], [Line("", evals, [in_context[s] for s in evals], ORANGE)],
                   bands=band)
    train = scalars[BATCH_LOSS]
    logged = sorted(train)
    losses = Plot(f"{BATCH_LOSS}: the training loss", "step", "nats", (0, top), (0, 4.5), x_ticks, [0, 1, 2, 3, 4],
                  [Line("", logged, [train[s] for s in logged], INK_LINE)], bands=band)
    one_above_another([scores.draw(SHOWN_WIDTH, 300), context.draw(SHOWN_WIDTH, 170), losses.draw(SHOWN_WIDTH, 170)]).save(
        path, optimize=True)


def map_figure(checkpoint: Checkpoint, record: dict, path: Path) -> None:
    model, tokenizer = checkpoint.build_model()
    ids = induction_probe(tokenizer.vocab_size, SHOWN_TOKENS, seed=0, avoid=special_ids(tokenizer))  # (2n,)
    weights = model.attention_weights(torch.tensor([ids]))[:, 0]  # (L, H, 2n, 2n)
    (l1, h1), (l0, h0) = record["induction_head"], record["previous_token_head"]
    maps = [weights[l1, h1].numpy(), weights[l0, h0].numpy()]
    titles = [f"layer {l1} head {h1}: induction", f"layer {l0} head {h0}: looks back"]
    caption = (f"step {checkpoint.step}: {SHOWN_TOKENS} random characters, then the same again; a row is a query, "
               "a column a key")
    draw_maps(maps, tokenizer.token_strings(ids), titles, caption).save(path, optimize=True)


def check_out(out: Path) -> None:
    """UserError unless out is a folder, or could be made as one: before any run is read."""
    existing = next(path for path in (out, *out.parents) if path.exists())
    if existing == out and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a folder; give a folder for the pictures")
    if not existing.is_dir():
        raise UserError(f"--out {out} lies under {existing}, a file, not a folder; give a folder for the pictures")


def main(runs: list[str], out: Path = DOCS) -> dict:
    """Reads the runs, draws the first into out's two pictures, and returns the record (with a
    row for each run in its seeds)."""
    checkpoint, scalars, seconds = read_run(runs[0])
    record = run_record(checkpoint, scalars, seconds)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"--out {out}: cannot make that folder ({error.strerror}); give a folder you can write to") from None
    scores_figure(record, scalars, out / SCORES)
    map_figure(checkpoint, record, out / MAP)
    seeds = []
    for run in runs:
        other, other_scalars, other_seconds = (checkpoint, scalars, seconds) if run == runs[0] else read_run(run)
        head, previous = circuit(other_scalars)
        looks_back = heads_of(other_scalars, head_metric_prefix("previous_token"))[previous]  # {step: score}
        seeds.append({"seed": other.config["train"]["seed"], "crossed_0.3_at": crossing(other_scalars),
                      "rise": rise(heads_of(other_scalars, head_metric_prefix("induction"))[head]),
                      "previous_token_head": list(previous),
                      "previous_token_score": round(looks_back[max(looks_back)], 3),
                      "steps": other.step, "seconds": round(other_seconds)})
    record["seeds"] = seeds
    return record


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", help="run dirs of python train.py experiment=induction (seeds)")
    parser.add_argument("--out", type=Path, default=DOCS,
                        help="the folder for the two pictures and the record (default: docs/, the record docs/induction.md quotes)")
    args = parser.parse_args()
    if not args.runs:
        print("docs/induction_figures.py: no runs given (make docs INDUCTION_RUNS=\"<run dir> ...\"); "
              "the committed induction pictures stay as they are")
        sys.exit(0)
    with exit_on_user_error():
        check_out(args.out)
        record = main(args.runs, args.out)
    (args.out / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {', '.join(str(args.out / name) for name in (SCORES, MAP, RECORD))}")
