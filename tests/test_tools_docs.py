"""docs/tools.md and the tour's section 18 quote docs/tools.json, the record docs/tools.py writes
(make docs) from the default run and a run of experiment=induction; its pictures are drawn from it."""

import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from docs.tools import SURE
from inspection.name_swap import one_token_names
from inspection.patching import patch_heads
from model_io.checkpoint import Checkpoint
from tests.helpers import ROOT, groups_that_differ, preset_beside_record

RECORD = ROOT / "docs" / "tools.json"


def flat(text: str) -> str:
    return " ".join(text.replace("**", "").split())


def signed(value: float) -> str:
    """A share as the pages print it: +5.81, -0.53 (the record's own digits)."""
    return f"+{value}" if value > 0 else f"{value}"


def head(layer: int, head_: int) -> str:
    return f"layer {layer} head {head_}"


def ranked(grid: list[list[float]]) -> list[tuple[float, int, int]]:
    """(value, layer, head) of every head, largest value first."""
    return sorted(((value, layer, h) for layer, row in enumerate(grid) for h, value in enumerate(row)), reverse=True)


def at_most(values: list[float]) -> str:
    """'at most 0.16 either way' of the values a table row leaves out (all 0: '0.0')."""
    most = max(abs(value) for value in values)
    return f"at most {most} either way" if most else "0.0"


def named_heads(grid: list[list[float]], shown: int) -> str:
    """The `shown` largest heads with their values; then the heads of negative value that outrank every
    other in size, as "(gained)"; then the rest in one clause (when there is a rest)."""
    order, gained = ranked(grid), gained_heads(grid, shown)
    named = "; ".join(f"{head(layer, h)}: {value}" for value, layer, h in order[:shown])
    if gained:
        named += "; " + listed([f"{head(layer, h)}: {value}" for value, layer, h in gained]) + " (gained)"
    rest = [item for item in order[shown:] if item not in gained]
    return named + (f"; every other head {at_most([v for v, _, _ in rest])}" if rest else "")


def gained_heads(grid: list[list[float]], shown: int) -> list[tuple[float, int, int]]:
    """The "(gained)" heads of named_heads(grid, shown), largest gain first."""
    rest = sorted(ranked(grid)[shown:], key=lambda item: -abs(item[0]))
    return rest[: next((i for i, (v, _, _) in enumerate(rest) if v >= 0), len(rest))]


def listed(values: list) -> str:
    """'a', 'a and b', 'a, b and c'."""
    values = [str(value) for value in values]
    return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " and " + values[-1]


def table_rows(part: dict, knocked_out_shown: int, patched_shown: int) -> list[str]:
    """The rows of tools.md's table for a model, as the record gives them."""
    answer, other, lens = part["answer"], part["other"], part["lens"]
    shares = sorted(part["shares"].items(), key=lambda item: -abs(item[1]))
    stream, best = part["patch_residual"], part["best_patch"]
    position = int(np.argmax(stream[0]))
    at_position = [layer[position] for layer in stream]
    entering = (f"{at_position[0]} entering every layer" if len(set(at_position)) == 1
                else f"{listed(at_position)} entering layers 0 to {len(stream) - 1}")
    elsewhere = [value for layer in stream for p, value in enumerate(layer) if p != position]
    largest = ", ".join(f'`"{label}"` {signed(value)}' for label, value in shares[:3])  # a part's label, quoted as a string
    return [
        f'| the metric, logit("{answer}") - logit("{other}") | {part["metric"]["clean"]} on the clean prompt, '
        f'{part["metric"]["corrupted"]} on the corrupted one |',
        f'| the logit lens: the rank of "{answer}" after layers 0 to {len(lens) - 1} | '
        f"{', '.join(str(layer['rank']) for layer in lens)} (p {', '.join(str(layer['probability']) for layer in lens)}) |",
        f"| direct shares of the {part['logit_difference']} | {largest}; "
        f"every other part {at_most([v for _, v in shares[3:]])}; they add up to {part['shares_total']} |",
        f"| lost when a head is knocked out | {named_heads(part['knock_out'], knocked_out_shown)} |",
        f"| restored by one head's output (`patch_heads`) | {named_heads(part['patch_heads'], patched_shown)} |",
        f'| restored by the stream at one position (`patch_residual`) | at "{part["tokens"][position]}" (position '
        f"{position}): {entering}; at every other position {at_most(elsewhere)} |",
        f"| where the patched head looks | {head(best['layer'], best['head'])} puts {best['weight']} of the last token's "
        f'weight on "{part["tokens"][best["looks_at"]]}" (position {best["looks_at"]}) |',
    ]


def share_of_whole(cost: float, whole: float) -> str:
    """How a knock-out's cost compares with the whole logit difference, in the tour's words."""
    return "more than the whole difference" if cost > whole else "nearly the whole difference" if cost > 0.8 * whole else (
        "part of the difference")


def default_story(part: dict) -> SimpleNamespace:
    """The figures of the default run that docs/tools.md and the tour's section 18 quote, and the
    shape of the story they tell (asserted: a record that tells another needs the pages rewritten)."""
    answer, other, lens, classic = part["answer"], part["other"], part["lens"], part["classic"]
    best, clean = part["best_patch"], part["metric"]["clean"]
    own_share = part["direct"][best["layer"]][best["head"]]
    mlp_share = part["shares"][f"{len(lens) - 1}_mlp_out"]
    knocked = ranked(part["knock_out"])
    cost, costly = knocked[0][0], knocked[1:3]  # the patched head's knock-out; the next two heads'
    assert knocked[0][1:] == (best["layer"], best["head"])  # the head whose patch restores most costs most knocked out
    second_patch = ranked(part["patch_heads"])[1]  # (restored, layer, head)
    gained = gained_heads(part["knock_out"], 3)[:2]  # the two heads whose knock-out helps most
    assert len(gained) == 2, "the page names two heads whose knock-out raises the metric"
    four = [(layer, h) for _, layer, h in costly + gained]
    assert second_patch[1:] not in four  # the head patched second is another one
    top = [f'"{piece}" ({p})' for piece, p in classic["top"]]
    stream, name_at = part["patch_residual"], best["looks_at"]  # the first name's position
    at_name = [layer[name_at] for layer in stream]
    mentions = [p for p, token in enumerate(part["tokens"]) if token == other]  # the later names, swapped
    at_mentions = [layer[p] for layer in stream for p in mentions]
    last = len(lens) - 1
    last_position_late = stream[last][-1]  # the stream at the last position, entering the last layer
    assert max(abs(value) for layer in stream[:last] for value in layer[name_at + 1:]) < 0.05 < last_position_late
    shares = sorted(part["shares"].items(), key=lambda item: -abs(item[1]))
    assert shares[0][0] == f"L{best['layer']}H{best['head']}" and shares[1][0] == f"{last}_mlp_out"  # head, then MLP
    assert cost > clean  # "more than the whole difference"
    return SimpleNamespace(
        answer=answer, other=other, lens=lens, classic=classic, best=best, clean=clean, own_share=own_share,
        mlp_share=mlp_share, cost=cost, costly=costly, second_patch=second_patch, gained=gained, four=four,
        top=top, at_name=at_name, at_mentions=at_mentions, last=last, last_position_late=last_position_late,
        shares=shares)


def default_quotes(part: dict) -> tuple[list[str], list[str]]:
    """What docs/tools.md and the tour's section 18 quote of the default run, word for word."""
    s = default_story(part)
    return default_page_quotes(part, s), default_tour_quotes(part, s)


def default_page_quotes(part: dict, s: SimpleNamespace) -> list[str]:
    """docs/tools.md's sentences and table rows of the default run."""
    return [
        f"| measured on the default run (step {part['step']}) | |",
        f"the model's three likeliest next tokens are {s.top[0]}, {s.top[1]} and {s.top[2]}, and \"{s.answer}\" gets "
        f"{s.classic['answer_probability']}",
        f'| the clean prompt | "{part["prompt"]}": "{s.answer}", p {part["probability"]["answer_on_clean"]} |',
        f'| the corrupted prompt, the names swapped | "{s.other}", p {part["probability"]["other_on_corrupted"]} |',
        *table_rows(part, knocked_out_shown=3, patched_shown=2),
        f"putting back its output alone restores {s.best['restored']} of the answer, and without it the difference falls "
        f"from {s.clean} to {s.clean - s.cost:.2f}",
        f"It writes {signed(s.own_share)} of the {part['logit_difference']} itself; the last layer's MLP, which reads what "
        f"the head wrote, writes {signed(s.mlp_share)}",
        f"{head(*s.second_patch[1:])} writes nothing to speak of ({part['direct'][s.second_patch[1]][s.second_patch[2]]}), yet "
        f"its patch restores {s.second_patch[0]}",
        f"without {head(*s.costly[0][1:])} or {head(*s.costly[1][1:])} the difference falls by {s.costly[0][0]} and "
        f"{s.costly[1][0]}, without {head(*s.gained[0][1:])} or {head(*s.gained[1][1:])} it grows by {-s.gained[0][0]} and "
        f"{-s.gained[1][0]}, and no patch of these four heads restores more than "
        f"{max(abs(part['patch_heads'][layer][h]) for layer, h in s.four)} either way",
        f"put back at any of those mentions, {at_most(s.at_mentions)}",
        f"By layer {s.last}'s entrance some of it has reached the last position too: the stream put back there restores "
        f"{s.last_position_late}",
    ]


def default_tour_quotes(part: dict, s: SimpleNamespace) -> list[str]:
    """The tour's section 18 sentences of the default run."""
    return [
        f"the answer's probability is at most {max(layer['probability'] for layer in s.lens[:-1])} after layers 0 to "
        f"{len(s.lens) - 2} and {s.lens[-1]['probability']} after layer {len(s.lens) - 1}",
        f'the model goes on with "{s.answer}" (p {part["probability"]["answer_on_clean"]}), and with the two names swapped '
        f'with "{s.other}" (p {part["probability"]["other_on_corrupted"]})',
        f'The logit difference logit("{s.answer}") - logit("{s.other}") is {part["logit_difference"]}',
        f"{signed(s.shares[0][1])} from {head(s.best['layer'], s.best['head'])}, {signed(s.shares[1][1])} from the last layer's "
        f"MLP (`\"{s.shares[1][0]}\"`), {signed(s.shares[2][1])} from {head(*map(int, s.shares[2][0][1:].split('H')))}, and "
        f"{at_most([v for _, v in s.shares[3:]])} from every other part",
        f"finds the answer at rank {s.lens[0]['rank']}, {s.lens[1]['rank']} and {s.lens[2]['rank']} after layers 0, 1 and 2, and at "
        f"rank {s.lens[3]['rank']} after layer 3",
        f"Layer {s.best['layer']} head {s.best['head']} writes {signed(s.own_share)} of it directly, yet knocking it out costs "
        f"{s.cost}, {share_of_whole(s.cost, s.clean)}, and putting back its output alone restores {s.best['restored']} of it",
        f"Layer {s.second_patch[1]} head {s.second_patch[2]} writes nothing to speak of directly "
        f"({part['direct'][s.second_patch[1]][s.second_patch[2]]}), yet its patch restores {s.second_patch[0]}",
        f"knocking out {head(*s.costly[0][1:])} or {head(*s.costly[1][1:])} costs {s.costly[0][0]} and {s.costly[1][0]}, though "
        f"neither writes more than {max(abs(part['direct'][layer][h]) for _, layer, h in s.costly)} either way",
        f'restores all of the answer ({min(s.at_name)} to {max(s.at_name)}) at the first name, "{s.answer}", at the entrance of '
        f'every layer, and {at_most(s.at_mentions)} at the later mentions of "{s.other}"; entering layer {s.last}, the last '
        f"position restores {s.last_position_late} of it already",
        f"puts {s.best['weight']} of the last token's weight on it",
        f"here a share of {s.own_share} for the head the answer needs, whose knock-out costs {s.cost}",
    ]


def induction_quotes(part: dict) -> list[str]:
    """What docs/tools.md quotes of the induction run, word for word."""
    answer, other, best, seeds = part["answer"], part["other"], part["best_patch"], part["over_seeds"]
    ((layer, h), count), = [(name.split("."), count) for name, count in seeds["best_heads"].items()]
    previous = ranked(part["knock_out"])[1]  # the head whose knock-out costs most after the induction head's
    assert ranked(part["knock_out"])[0][1:] == (best["layer"], best["head"]) and previous[1] == 0
    looks_back = part["previous_token"][0]  # layer 0's heads: the weight on the token just before
    assert previous[2] == looks_back.index(max(looks_back))  # "the previous-token head below it"
    layer_1 = sorted(v for v in part["knock_out"][1] if v < 0)  # the heads of layer 1 it does better without
    shares = sorted(part["shares"].items(), key=lambda item: -abs(item[1]))
    assert seeds["restored"][1] > 1  # "above 1, the patched run says the answer more surely than the clean one"
    n = part["n"]
    return [
        f"| measured on the induction run (step {part['step']:,}) | |",
        f"`<|endoftext|>`, {n} distinct random characters, then the same {n} less the last, so that the last query, the "
        f"{n - 1}th character again, should copy the {n}th; the corrupted prompt puts a {n + 1}th character in the {n}th's place",
        f"of {seeds['seeds']} (seeds 0 to {seeds['seeds'] - 1}) it gives the copied character p {SURE} or more in "
        f"{seeds['copied']}; the example is seed {part['seed']}, the first it answers both ways, clean and corrupted, with p "
        f"{SURE} or more",
        f'| the clean prompt | {part["n"]} random characters, then the same again but the last: "{answer}", p '
        f'{part["probability"]["answer_on_clean"]} |',
        f'| the corrupted prompt, "{answer}" at position {part["changed_position"]} changed to "{other}" | "{other}", p '
        f'{part["probability"]["other_on_corrupted"]} |',
        *table_rows(part, knocked_out_shown=8, patched_shown=2),
        f"| over the {seeds['seeds']} sequences | the head whose patch restores most: {head(int(layer), int(h))} in {count} of "
        f"{seeds['seeds']}, restoring {seeds['restored'][0]} to {seeds['restored'][1]} |",
        f"it puts {best['weight']} of the last query's weight on the character to copy, and putting back its output alone "
        f"restores {best['restored']} of the answer",
        f"Unlike the default model's head, it writes only {signed(part['direct'][best['layer']][best['head']])} of the {part['logit_difference']} "
        f"directly; layer 1's MLP writes {signed(shares[0][1])}",
        f"layer 0 head {previous[2]} ({looks_back[previous[2]]} of a query's weight on the character just before, on "
        f"average over this prompt), is needed: knocking it out costs {previous[0]}, yet its patch restores "
        f"{part['patch_heads'][0][previous[2]]}",
        f"without layer 1 head {part['knock_out'][1].index(layer_1[0])} or head {part['knock_out'][1].index(layer_1[1])} "
        f"the model says the copied character far more surely ({layer_1[0]}, {layer_1[1]})",
    ]


def test_the_tools_page_and_the_tour_quote_the_record_make_docs_wrote():
    record = json.loads(RECORD.read_text())
    page, tour = default_quotes(record["default"])
    page += induction_quotes(record["induction"])
    page.append(f"| `docs/tools.json`: the default run at step {record['default']['step']} and a run of `experiment=induction` "
                f"at step {record['induction']['step']:,}, with its {len(record['induction']['across_training'])} kept checkpoints |")
    part = record["induction"]  # "What the two have in common": here the last MLP writes most of it, the head less
    L, best = len(part["lens"]), part["best_patch"]
    assert max(part["shares"], key=part["shares"].get) == f"{L - 1}_mlp_out"
    assert part["direct"][best["layer"]][best["head"]] < part["shares"][f"{L - 1}_mlp_out"]
    default, best_default = record["default"], record["default"]["best_patch"]
    default_mlp = default["shares"][f"{len(default['lens']) - 1}_mlp_out"]
    page.append(f"the induction head writes {signed(part['direct'][best['layer']][best['head']])} of "
                f"{part['logit_difference']} and the MLP most of the rest")
    default_own, default_cost = default["direct"][best_default["layer"]][best_default["head"]], ranked(default["knock_out"])[0][0]
    assert default_cost > default_own + default_mlp and default_cost > 1.9 * default_own  # "twice", "more than the two"
    page.append(f"the default model's head writes {signed(default_own)} of {default['logit_difference']} itself and the "
                f"MLP {signed(default_mlp)}, and the head's knock-out costs {default_cost}, more than the two write together")
    tools, attention = flat((ROOT / "docs" / "tools.md").read_text()), flat((ROOT / "docs" / "attention.md").read_text())
    for sentence in page:
        assert flat(sentence) in tools, sentence
    for sentence in tour:
        assert flat(sentence) in attention, sentence


def test_the_records_runs_are_the_default_run_and_the_induction_preset():
    record = json.loads(RECORD.read_text())
    for part, overrides in (("default", []), ("induction", ["experiment=induction"])):
        config, kept = preset_beside_record(record[part]["config"], *overrides)
        assert groups_that_differ(config, kept) == [], part
        assert record[part]["step"] == config["train"]["max_steps"] == kept["train"]["max_steps"], part


def test_the_records_shares_add_up_to_its_logit_difference():
    # Each share is rounded to 2 places, so the sum of P of them may be off by P * 0.005.
    for part in json.loads(RECORD.read_text()).values():
        if isinstance(part, dict) and "shares" in part:
            shares = part["shares"]
            assert sum(shares.values()) == pytest.approx(part["logit_difference"], abs=0.005 * len(shares) + 0.005)
            assert part["shares_total"] == part["logit_difference"]


def test_the_tools_pictures_are_what_docs_tools_py_draws_from_the_record(tmp_path):
    from docs.drawing import SHOWN_WIDTH, drawn_with
    from docs.tools import DOCS, PICTURES, draw_all

    record = json.loads(RECORD.read_text())
    for name in PICTURES:
        with Image.open(DOCS / name) as image:
            assert image.width <= SHOWN_WIDTH, name  # shown at its own size: 11 px labels stay 11 px
    if record["drawn_with"] != drawn_with():
        pytest.skip(f"the pictures were drawn with {record['drawn_with']} and this machine has {drawn_with()}: "
                    "other anti-aliasing (the numbers are still checked)")
    draw_all(record, tmp_path)
    for name in PICTURES:
        kept, drawn = (np.asarray(Image.open(folder / name).convert("RGB")) for folder in (DOCS, tmp_path))
        assert kept.shape == drawn.shape and (kept == drawn).all(), f"docs/{name} is stale: run make docs"


ACROSS_TRAINING_SHOWN = (0, 200, 225, 250, 275, 300, 325, 350, 375, 400, 450, 1000, 2000)  # the steps tools.md's table lists


def test_the_across_training_table_and_its_reading_are_the_records():
    rows = json.loads(RECORD.read_text())["induction"]["across_training"]
    by_step = {row["step"]: row for row in rows}
    page = flat((ROOT / "docs" / "tools.md").read_text())
    assert f"keeps the model at {len(rows)} steps" in page
    for step in ACROSS_TRAINING_SHOWN:
        row = by_step[step]
        assert flat(f"| {step:,} | {row['induction_score']} | {row['metric']['clean']} / {row['metric']['corrupted']} | "
                    f"{row['direct_share']} | {row['restored']} |") in page, step
    gap = {step: round(row["metric"]["clean"] - row["metric"]["corrupted"], 2) for step, row in by_step.items()}
    opens = next(step for step in by_step if gap[step] > 0.2)  # the first kept step whose prompts the model tells apart
    before, after = [s for s in by_step if s < opens], [s for s in by_step if s > opens]
    score = {step: row["induction_score"] for step, row in by_step.items()}
    crosses = next(step for step in by_step if score[step] >= 0.5)
    previous = max(s for s in by_step if s < crosses)
    shares = {step: row["direct_share"] for step, row in by_step.items()}
    largest = max(shares, key=shares.get)
    second = min(s for s in after if gap[s] > 1)
    reading = [
        f"Up to step {before[-1]} the two prompts' metrics lie within {max(abs(gap[s]) for s in before)} of each other",
        f"({by_step[200]['restored']} at step 200, {by_step[250]['restored']} at step 250)",
        f"At step {opens} the gap opens ({gap[opens]}, then {gap[second]} at step {second})",
        f"the head's patch restores most of it ({by_step[opens]['restored']} at step {opens}, at least "
        f"{min(by_step[s]['restored'] for s in after)} at every kept step after)",
        f"while its induction score is still {score[opens]} and crosses 0.5 only between steps {previous} and {crosses}",
        f"{shares[300]} at step 300, at most {shares[largest]} (step {largest})",
    ]
    for sentence in reading:
        assert flat(sentence) in page, sentence


@pytest.mark.slow
def test_the_tools_pages_example_runs_on_a_trained_run(trained_run, tmp_path, monkeypatch, capsys):
    example = re.search(r"^```py\n(.*?)^```", (ROOT / "docs" / "tools.md").read_text(), flags=re.MULTILINE | re.DOTALL)[1]
    shutil.copytree(trained_run, tmp_path / "outputs" / "run")
    monkeypatch.chdir(tmp_path)  # where "latest" looks: outputs/ under the working folder
    tokenizer = Checkpoint.load(tmp_path / "outputs" / "run" / "ckpt_best.pt").build_model()[1]
    answer, other = one_token_names(tokenizer)[:2]  # the tiny run's BPE spells " Mia" in two pieces: two names it holds whole
    assert example.count("name_swap(tokenizer)") == 1
    names: dict = {}
    exec(compile(example.replace("name_swap(tokenizer)", f"name_swap(tokenizer, {answer!r}, {other!r})"), "docs/tools.md", "exec"), names)
    assert capsys.readouterr().out == f"{Path('outputs/run/ckpt_best.pt')}\n"  # which run "latest" is
    L, H = names["model"].config.n_layer, names["model"].config.n_head
    assert names["attribution"].heads()[..., 0].shape == (L, H)
    assert patch_heads(names["model"], names["swap"].clean, names["swap"].corrupted, names["swap"].metric()).fraction.shape == (L, H)
