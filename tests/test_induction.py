"""The induction circuit and the in-context score: a two-layer model whose heads are set by hand
to shift, then copy (Olsson et al., 2022) is the reference; a tiny real run logs the new tags."""

import json
import math
import re
from collections.abc import Callable

import numpy as np
import pytest
import torch
from PIL import Image

from data.corpus import load_documents
from data.specs import CorpusSpec
from data.stories import FEMALE_NAMES, MALE_NAMES, generate_stories
from data.token_cache import TokenData
from data.tokenizer import CharTokenizer
from docs.drawing import SHOWN_WIDTH
from inspection.ablation import induction_loss_without_each_head, second_copy_loss
from inspection.head_metrics import induction_score
from inspection.tab_format import INDUCTION_ABLATION, head_scalar_tag
from model.attention import CausalSelfAttention
from model_io.checkpoint import Checkpoint
from runtime.precision import Precision
from tests.helpers import (
    INDUCTION_HEAD,
    ONE_PROCESS,
    PREVIOUS_TOKEN_HEAD,
    ROOT,
    groups_that_differ,
    preset_beside_record,
    read_events,
    run_cli,
    run_script,
    shift_then_copy_model,
)
from training.evaluation import evaluate, in_context_positions

V, N = 64, 16  # vocabulary, and the length of the sequence that comes back
CPU = torch.device("cpu")


def repeated_distinct(n: int = N, rows: int = 4, seed: int = 0) -> torch.Tensor:
    """(rows, 2n): n distinct random tokens, then the same n again, in each row."""
    generator = torch.Generator().manual_seed(seed)
    first = torch.stack([torch.randperm(V, generator=generator)[:n] for _ in range(rows)])  # (rows, n)
    return first.repeat(1, 2)  # (rows, 2n)


def test_hand_built_induction_head_scores_above_0_9_and_previous_token_head_above_0_9():
    model, repeated = shift_then_copy_model(), repeated_distinct(rows=1)
    weights = model.attention_weights(repeated)[:, 0]  # (L, H, 2n, 2n)
    scores = induction_score(weights, N)  # (L, H)
    assert scores[INDUCTION_HEAD] >= 0.9
    assert scores.flatten().argmax().item() == 2  # layer 1 head 0, of the 4 heads
    assert weights[0, 0].diagonal(offset=-1).mean() >= 0.9  # head_previous_token


def test_second_copy_loss_collapses_with_the_circuit_and_comes_back_without_either_head():
    model, repeated = shift_then_copy_model(), repeated_distinct()
    ablation = induction_loss_without_each_head(model, repeated)
    assert ablation.intact == pytest.approx(second_copy_loss(model, repeated))
    assert ablation.intact < 0.1  # nats per token, against log(64) = 4.16 for a guess
    assert ablation.without[INDUCTION_HEAD] == pytest.approx(math.log(V), abs=1e-3)  # nothing copied: every logit 0
    assert ablation.without[PREVIOUS_TOKEN_HEAD] > ablation.intact + 2.0  # keys that match nothing: copies a blur
    assert ablation.without[0, 1] == pytest.approx(ablation.intact, abs=1e-6)  # heads that write nothing
    assert ablation.without[1, 1] == pytest.approx(ablation.intact, abs=1e-6)
    with model.hooks(model.knock_out({INDUCTION_HEAD})):
        assert second_copy_loss(model, repeated) == pytest.approx(ablation.without[INDUCTION_HEAD].item())


def gap_to_both_neighbours(last_row: torch.Tensor) -> torch.Tensor:
    """last_row: (T,) the last query's weights. How far the score of the token one back stands
    above the scores of the token itself and of the one two back (log weights differ as scores do)."""
    log_w = last_row.log()  # (T,)
    return torch.minimum(log_w[-2] - log_w[-1], log_w[-2] - log_w[-3])


def weight_one_back(last_row: torch.Tensor) -> torch.Tensor:
    """last_row: (T,) the last query's weights. The weight on the token one back."""
    return last_row[-2]


def best_look_back(rotary: bool, measure: Callable[[torch.Tensor], torch.Tensor], T: int, D: int = 32,
                   steps: int = 150) -> float:
    """The most of measure a QK-normed head (gains at 1) reaches for its last query, by position
    alone: Adam searches W_qkv and the input, one vector at every position (rotary) or one per
    position (learned positions, as if the input were the position's embedding)."""
    torch.manual_seed(0)
    head = CausalSelfAttention(D, 1, bias=False, rope=rotary, qk_norm=True, attention="manual")
    x = torch.randn(1, 1 if rotary else T, D, requires_grad=True)  # (1, 1 or T, D)
    optimizer = torch.optim.Adam([x, head.qkv.weight], lr=0.05)
    best = -math.inf
    for _ in range(steps):
        _, weights = head(x.expand(1, T, D), need_weights=True)  # (1, 1, T, T)
        reached = measure(weights[0, 0, T - 1])  # the last query's row, (T,) -> ()
        optimizer.zero_grad()
        (-reached).backward()
        optimizer.step()
        best = max(best, reached.item())
    return best


def test_a_rotary_score_stands_at_most_2_6_above_its_neighbours_under_qk_norm_and_a_learned_one_11_3():
    # docs/attention.md, section 17: why experiment=induction uses learned positions. With QK-norm,
    # q and k have norm sqrt(D) (times the gains), so a score lies within +-sqrt(D); RoPE's fastest
    # pair turns 1 radian a token, so one back can beat both its neighbours by sqrt(D)(1 - cos 1).
    bound = math.sqrt(32) * (1 - math.cos(1))  # 2.600
    assert bound - 0.02 < best_look_back(True, gap_to_both_neighbours, T=8) <= bound + 1e-4
    assert best_look_back(False, gap_to_both_neighbours, T=8) == pytest.approx(2 * math.sqrt(32), abs=0.02)  # +sqrt(D) against -sqrt(D)


@pytest.mark.slow
def test_in_a_window_of_256_a_rotary_qk_normed_head_gives_the_token_one_back_under_0_3_and_a_learned_one_0_9():
    # The same search for the weight itself: the fastest pair comes round every 2 pi = 6.3 tokens,
    # so holding down the 250 farther positions takes the slower pairs, out of the same budget.
    assert best_look_back(True, weight_one_back, T=256, steps=300) < 0.3
    assert best_look_back(False, weight_one_back, T=256, steps=300) > 0.9


def repeating_stream(period: int, length: int, seed: int = 0) -> np.ndarray:
    """period distinct random tokens, over and over: every window of 2 * period sees its start come back."""
    rng = np.random.default_rng(seed)
    return np.resize(rng.permutation(V)[:period], length).astype(np.uint16)


@pytest.mark.parametrize("knocked_out", [set(), {INDUCTION_HEAD}])
def test_in_context_score_is_below_minus_log_vocab_for_a_copying_model_and_zero_without_its_copy_head(knocked_out):
    model = shift_then_copy_model()
    stream = repeating_stream(N, 4096)
    data = TokenData(CharTokenizer([chr(65 + i) for i in range(V)]), train=stream, val=stream)
    early, late = in_context_positions(2 * N)
    assert (early, late) == (slice(3, 6), slice(29, 32))  # a tenth of the way in, and the last tenth
    with model.hooks(model.knock_out(knocked_out)):
        evaluated = evaluate(model, data, batch_size=8, block_size=2 * N, eval_iters=3, ranks=ONE_PROCESS,
                             precision=Precision("fp32", CPU), seed=0, splits=("val",))
    if knocked_out:
        assert evaluated.in_context == pytest.approx(0.0, abs=1e-3)  # every position at chance
    else:  # early: the next token has not come by yet in the window (a guess at best: log V or
        # worse); late: it came one period before, so the circuit copies it (a loss near 0)
        assert -math.log(V) - 2.0 < evaluated.in_context < -math.log(V)


def test_in_context_positions_stay_inside_short_windows():
    assert in_context_positions(128) == (slice(12, 24), slice(116, 128))
    assert in_context_positions(3) == (slice(1, 2), slice(2, 3))


def test_made_up_names_are_new_letter_strings_and_the_common_stories_are_unchanged():
    common = generate_stories(seed=5, n_chars=20_000)
    assert generate_stories(seed=5, n_chars=20_000, names="common") == common
    made_up = generate_stories(seed=5, n_chars=20_000, names="random")
    assert made_up == generate_stories(seed=5, n_chars=20_000, names="random")  # same seed, same stories
    names = [name for story in made_up for name in re.findall(r"(?:named|called) ([A-Z]\w*)", story)]
    assert len(names) > 20 and all(re.fullmatch(r"[A-Z][a-z]{4,8}", name) for name in names)
    assert len(set(names)) == len(names)  # a new name each time: one only context can tell
    assert not set(names) & set(FEMALE_NAMES + MALE_NAMES)


@pytest.mark.slow
def test_every_run_logs_the_in_context_score_and_the_induction_ablation_beside_the_old_tags(trained_run):
    events = read_events(trained_run)
    tags = set(events.Tags()["scalars"])
    assert [event.step for event in events.Scalars("loss/in_context")] == [0, 10, 20]  # at each evaluation
    heads = {head_scalar_tag(INDUCTION_ABLATION, layer, head) for layer in range(2) for head in range(2)}
    assert heads | {"ablation/induction_loss/intact", "loss/train", "loss/val"} <= tags
    assert [event.step for event in events.Scalars("ablation/induction_loss/intact")] == [0, 10, 20]  # at the attention steps


def test_data_names_random_reaches_the_corpus_and_a_wrong_value_gets_one_line(tmp_path):
    cfg = CorpusSpec(source="stories", seed=3, n_chars=20_000, names="random", val_fraction=0.1, cache_dir=".cache")
    assert load_documents(cfg) == generate_stories(seed=3, n_chars=20_000, names="random")
    result = run_cli("train.py", "data.names=made_up", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: data.names=made_up must be one of common, random"
    assert not (tmp_path / "outputs").exists()


GAME = re.compile(r'(\w+) made up a word, "(\w+)"\. (\w+) said "(\w+)"\. Then all said "(\w+)"\.')


def test_word_games_say_each_made_up_word_three_times_and_word_games_0_leaves_the_stories_alone():
    assert generate_stories(seed=5, n_chars=20_000, names="random", word_games=0) == generate_stories(
        seed=5, n_chars=20_000, names="random")
    stories = generate_stories(seed=5, n_chars=200_000, names="random", word_games=9)
    lines = [line for story in stories for line in story.split("\n")]
    games = [GAME.fullmatch(line) for line in lines if " made up a word, " in line]
    assert games and all(games)
    words = [game[2] for game in games]
    assert all(game[2] == game[4] == game[5] for game in games)  # one word, said three times
    assert all(re.fullmatch(r"[A-Za-z]{6,16}", word) for word in words) and len(set(words)) == len(words)
    for story in stories:  # the story's own hero makes every word up, and a friend says it
        makers = {game[1] for game in GAME.finditer(story)}
        assert len(makers) <= 1 and makers <= set(re.findall(r"\w+", story.split("\n")[0]))
    paragraphs = len(lines) - len(games)
    assert 8 < len(games) / paragraphs < 10  # 9 games a paragraph on average


def test_data_word_games_below_0_gets_one_line(tmp_path):
    result = run_cli("train.py", "data.word_games=-1", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: data.word_games=-1 must be 0 (no games) or more")
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_the_induction_preset_trains_two_layers_with_learned_positions_without_the_smear_on_word_games(tmp_path):
    # The preset's own settings, shortened (a context of 64: its probes and knock-outs cost a quarter):
    # what `python train.py experiment=induction` runs.
    result = run_cli("train.py", "experiment=induction", "data.n_chars=30000", "model.block_size=64", "train.max_steps=4",
                     "train.eval_interval=4", "train.eval_iters=1", "train.attn_log_interval=4", "train.sample_interval=0",
                     "train.batch_size=2", "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    config = Checkpoint.load(tmp_path / "run" / "ckpt_last.pt").config
    model = config["model"]
    assert (model["n_layer"], model["smear"], model["pos"], config["tokenizer"]["kind"]) == (2, False, "learned", "char")
    assert config["data"]["names"] == "random" and config["data"]["word_games"] > 0
    tags = set(read_events(tmp_path / "run").Tags()["scalars"])
    assert {"head_induction/layer_1/head_0", "head_previous_token/layer_0/head_3", "loss/in_context",
            "ablation/induction_loss/layer_0/head_3"} <= tags
    # make docs INDUCTION_RUNS=<this run>: 4 steps form no head, and the pictures say so in one line.
    figures = ROOT / "docs" / "induction_figures.py"
    drawn = run_script(figures, "run", cwd=tmp_path)
    assert drawn.returncode == 2 and drawn.stderr.startswith("error: no head's induction score reached 0.5 by step 4")
    assert len(drawn.stderr.strip().splitlines()) == 1
    to_a_file = run_script(figures, "run", "--out", "run/train.log", cwd=tmp_path)
    assert to_a_file.returncode == 2 and to_a_file.stderr.startswith("error: --out run/train.log is a file, not a folder")
    assert len(to_a_file.stderr.strip().splitlines()) == 1
    under_a_file = run_script(figures, "run", "--out", "run/train.log/x", cwd=tmp_path)
    assert under_a_file.returncode == 2 and under_a_file.stderr.startswith("error: --out run/train.log/x lies under run/train.log")
    assert len(under_a_file.stderr.strip().splitlines()) == 1
    # make docs's README pictures (RUN=latest may be this run): refused in one line, nothing drawn.
    readme = run_script(ROOT / "docs" / "figures.py", "run", cwd=tmp_path)
    assert readme.returncode == 2 and readme.stderr.startswith("error: run read made-up names or word games")
    assert len(readme.stderr.strip().splitlines()) == 1


def nearest(series: dict[str, float], step: int) -> tuple[int, float]:
    """The logged (step, value) of series (keys: steps as text) closest to step."""
    at = min((int(key) for key in series), key=lambda key: abs(key - step))
    return at, series[str(at)]


def induction_page_quotes(record: dict) -> list[str]:
    """What docs/induction.md quotes from docs/induction.json, word for word."""
    (l1, h1), (l0, h0) = record["induction_head"], record["previous_token_head"]
    score, loss, steps = record["induction_score"], record["second_copy_loss"], record["config"]["train"]["max_steps"]
    (before, low), (after, high) = score["before"], score["after"]
    context = record["in_context"]
    (s1, v1), (s2, v2) = nearest(context, before), nearest(context, after)
    best = record["best_previous_token"]
    seeds = sorted(record["seeds"], key=lambda seed: seed["seed"] != 1337)
    return [
        f"| time from the first logged step to the last | {record['seconds']} s (of {steps:,} steps) |",
        f"| the induction head | layer {l1} head {h1}: `head_induction` {low:.3f} at step {before}, {high:.3f} at step "
        f"{after}, {score['last']:.3f} at step {record['step']:,} |",
        f"| the rise | from below 0.05 at step {before} to 0.5 and more at step {after}: {after - before} steps, "
        f"{100 * score['rise_fraction_of_steps']:.1f}% of the run (the scores are logged every "
        f"{record['config']['train']['attn_log_interval']} steps) |",
        f"| `loss/in_context` | {context['0']:.3f} at step 0, {v1:.3f} at step {s1}, {v2:.3f} at step {s2}, "
        f"{context[str(record['step'])]:.3f} at step {record['step']:,} |",
        f"| second-copy loss (`ablation/induction_loss`) | {loss['at_start']:.2f} nats at step 0; at step "
        f"{record['step']:,}, {loss['intact']:.2f} intact, {loss['without_induction_head']:.2f} without the induction head, "
        f"{loss['without_previous_token_head']:.2f} without layer {l0} head {h0} |",
        f"| the circuit's first head | layer {l0} head {h0}: of the heads of layer 0 whose knock-out costs the second copy "
        f"a nat or more, the one that looks back most, `head_previous_token` {record['previous_token_score']:.3f} (the "
        f"highest of any head: {best[2]:.3f}, layer {best[0]} head {best[1]}) |",
        "| seed | " + " | ".join(str(seed["seed"]) for seed in seeds) + " |",
        "| crossed 0.3 at step | " + " | ".join(str(seed["crossed_0.3_at"]) for seed in seeds) + " |",
        "| from below 0.05 to 0.5 and more | " + " | ".join(f"steps {seed['rise'][0]} to {seed['rise'][1]}" for seed in seeds) + " |",
        "| the layer-0 head it reads, at the last step | " + " | ".join(
            f"head {seed['previous_token_head'][1]}, {seed['previous_token_score']:.3f}" for seed in seeds) + " |",
        "| steps run | " + " | ".join(f"{seed['steps']:,}" for seed in seeds) + " |",
    ]


def test_the_induction_page_quotes_the_run_make_docs_recorded_and_that_run_is_the_preset():
    # docs/induction_figures.py (make docs INDUCTION_RUNS=...) writes docs/induction.json from the
    # preset's runs; the page's numbers are that record's, and the record's run is today's preset.
    record = json.loads((ROOT / "docs" / "induction.json").read_text())
    preset, record["config"] = preset_beside_record(record["config"], "experiment=induction")
    assert groups_that_differ(preset, record["config"]) == []
    for key in ("max_steps", "batch_size", "attn_log_interval", "probe_tokens"):
        assert preset["train"][key] == record["config"]["train"][key], key
    page = (ROOT / "docs" / "induction.md").read_text()
    for line in induction_page_quotes(record):
        assert line in page, line
    jump = record["induction_score"]["jump"]
    for quoting in ("docs/induction.md", "docs/attention.md", "configs/experiment/induction.yaml"):
        assert f"between steps {jump[0]} and {jump[1]}" in " ".join((ROOT / quoting).read_text().lower().replace("#", "").split()), quoting
    # The story under the picture, read off the same run's series.
    series = {**record["series"], "in_context": record["in_context"]}
    prose = " ".join(page.split())
    for name, step, quoted, phrase in [
        ("previous_token_head", 0, "0.065", "rising from 0.065 at step 0 to 0.430 at step 200"),
        ("previous_token_head", 200, "0.430", ""),
        ("induction_head", 250, "0.017", "reaches 0.017, 0.263 and 0.620 at steps 250, 300 and 350"),
        ("induction_head", 300, "0.263", ""), ("induction_head", 350, "0.620", ""),
        ("batch_loss", 200, "2.01", "had slowed to 2.01 at step 200 and 1.88 at step 250, drops to 1.01 at step 350"),
        ("batch_loss", 250, "1.88", ""), ("batch_loss", 350, "1.01", ""),
        ("in_context", 200, "-0.007", "falls from -0.007 at step 200 to -0.620 at step 300"), ("in_context", 300, "-0.620", ""),
        ("second_copy_intact", 0, "4.16", "first rises from 4.16 to 5.83 at step 200"),
        ("second_copy_intact", 200, "5.83", ""), ("second_copy_intact", 350, "4.34", "falls to 4.34 at step 350"),
    ]:
        assert f"{series[name][str(step)]:.{len(quoted.split('.')[1])}f}" == quoted, (name, step)
        assert phrase in prose, phrase
    assert len(record["seeds"]) >= 4 and all(seed["crossed_0.3_at"] is not None for seed in record["seeds"])
    for picture in ("induction_scores.png", "induction_map.png"):
        with Image.open(ROOT / "docs" / picture) as image:
            assert image.width <= SHOWN_WIDTH, picture  # shown at its own size, labels readable
