"""The Attention tab's text box, less the HTTP (attention_tab/live_model.py): a run's name leads
only to a folder under TensorBoard's logdir, and its model is cached within a bound."""

import argparse
import base64
import os
import re
import shutil

import numpy as np
import pytest
import torch
from tensorboard.plugins.base_plugin import FlagsError

import runtime.huge_pages
from attention_tab.live_model import LoadedModel, ModelCache, checkpoint_in, finite, model_bytes, text_answer
from attention_tab.plugin import DTYPES, TAB_DEVICE_TYPES, AttentionLoader
from attention_tab.run_folders import init_from, logdir_roots, run_folder
from data.tokenizer import CharTokenizer
from inspection.heatmap import hidden_cells
from inspection.repeated_tokens import forward_repeated
from inspection.text_forward import forward_text
from model_io.checkpoint import Checkpoint
from model_io.run_files import kept_checkpoint_path
from runtime.devices import DEVICE_TYPES
from runtime.huge_pages import huge_pages_possible
from runtime.precision import WEIGHT_DTYPES
from tests.helpers import hydra_run_folders, moved_to_huge_pages, save_circuit, tiny_gpt
from user_error import UserError

# Hydra's run folders, a secret beside them and a link out to it: tests/helpers.py's builder.
LOGDIR = [hydra_run_folders]


def test_under_logdir_a_run_is_its_folder_relative_to_the_logdir(logdir):
    roots = logdir_roots(str(logdir / "outputs"), "")
    assert run_folder("2026-01-02/03-04-05", roots) == logdir / "outputs/2026-01-02/03-04-05"
    assert run_folder(".", roots) == logdir / "outputs"  # event files in the logdir itself


def test_under_logdir_spec_a_run_is_its_folder_under_the_group_its_name_starts_with(logdir, monkeypatch):
    monkeypatch.chdir(logdir)  # make tensorboard's spec: relative folders
    roots = logdir_roots("", "outputs:outputs,multirun:multirun")
    assert run_folder("outputs/2026-01-02/03-04-05", roots) == logdir / "outputs/2026-01-02/03-04-05"
    assert run_folder("multirun/2026-01-02/03-04-05/0", roots) == logdir / "multirun/2026-01-02/03-04-05/0"
    assert run_folder("outputs/.", roots) == logdir / "outputs"
    unnamed = logdir_roots("", f"{logdir / 'outputs'},{logdir / 'multirun'}")  # groups without a name
    assert run_folder("2026-01-02/03-04-05/0", unnamed) == logdir / "multirun/2026-01-02/03-04-05/0"
    # A group whose name begins another's: its runs are found under its own folder, not the other's
    # (runs12/2026-01-02 is not the group runs' run 2/2026-01-02).
    (logdir / "multirun" / "2026-01-02").mkdir(exist_ok=True)
    (logdir / "outputs" / "2" / "2026-01-02").mkdir(parents=True, exist_ok=True)
    prefixed = logdir_roots("", "runs:outputs,runs12:multirun")
    assert run_folder("runs12/2026-01-02", prefixed) == logdir / "multirun/2026-01-02"
    assert run_folder("runs/2/2026-01-02", prefixed) == logdir / "outputs/2/2026-01-02"


def test_a_logdir_given_with_a_tilde_is_the_home_folders(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # --logdir=~/runs, which a shell leaves unexpanded after =
    (tmp_path / "runs" / "a").mkdir(parents=True)
    assert run_folder("a", logdir_roots("~/runs", "")) == tmp_path / "runs" / "a"


def test_a_logdir_reached_through_a_link_finds_its_runs_and_still_none_outside(logdir, tmp_path):
    link = tmp_path / "runs-link"  # ~/runs pointing at a bigger disk, say
    link.symlink_to(logdir / "outputs")
    roots = logdir_roots(str(link), "")
    assert run_folder("2026-01-02/03-04-05", roots) == logdir / "outputs/2026-01-02/03-04-05"
    with pytest.raises(UserError, match="is not a folder under TensorBoard's logdir"):
        run_folder("outputs-escape", roots)  # the link out of outputs to the secret


def test_the_tab_reads_init_from_in_the_runs_saved_config_and_nothing_from_one_it_cannot_read(tmp_path):
    config = tmp_path / ".hydra" / "config.yaml"
    assert init_from(tmp_path) is None  # no config: not a run train.py made
    config.parent.mkdir()
    for text, expected in [("init_from: gpt2\ntrain:\n  max_steps: 0\n", "gpt2"), ("train:\n  max_steps: 0\n", None),
                           ("init_from: [gpt2\n", None), ("- init_from\n", None)]:  # cut short; a list, not a mapping
        config.write_text(text)
        assert init_from(tmp_path) == expected, text


@pytest.mark.parametrize("run", ["..", "../secret", "2026-01-02/../../secret", "/etc", "{logdir}/secret",
                                 "outputs-escape", "nope"])
def test_a_name_that_leads_out_of_the_logdir_or_nowhere_is_refused(logdir, run):
    with pytest.raises(UserError, match=f"run '{run.format(logdir=logdir)}' is not a folder under TensorBoard's logdir"):
        run_folder(run.format(logdir=logdir), logdir_roots(str(logdir / "outputs"), ""))
    with pytest.raises(UserError, match="is not a folder under TensorBoard's logdir"):
        run_folder(f"outputs/{run.format(logdir=logdir)}", logdir_roots("", f"outputs:{logdir / 'outputs'}"))


def copy_run(trained_run, folder, *names: str):
    folder.mkdir(parents=True)
    for name in names:
        shutil.copy(trained_run / name, folder / name)
    return folder


@pytest.mark.slow
def test_the_cache_reads_ckpt_best_else_ckpt_last_and_reloads_a_checkpoint_written_again(trained_run, tmp_path):
    cache = ModelCache(max_bytes=2**30)
    run = copy_run(trained_run, tmp_path / "run", "ckpt_last.pt")
    first = cache.get(run, "run")
    assert first.checkpoint.name == "ckpt_last.pt" and first.step == 20
    assert cache.get(run, "run") is first  # kept
    shutil.copy(trained_run / "ckpt_best.pt", run / "ckpt_best.pt")
    best = cache.get(run, "run")
    assert best.checkpoint.name == "ckpt_best.pt" and best is not first
    os.utime(run / "ckpt_best.pt", ns=(0, 0))  # the same name written again (a run still training)
    assert cache.get(run, "run") is not best
    assert list(cache.models) == [run / "ckpt_last.pt", run / "ckpt_best.pt"]  # by file: a checkpoint of each


@pytest.mark.slow
def test_the_cache_keeps_the_models_used_last_within_its_bound_in_bytes(trained_run, tmp_path):
    runs = [copy_run(trained_run, tmp_path / name, "ckpt_best.pt") for name in "abc"]
    model = ModelCache(2**30).get(runs[0], "a").model
    size = model_bytes(model)
    assert size == 4 * model.num_parameters()  # float32: the tied embedding once (rotary angles are computed, not kept)
    cache = ModelCache(max_bytes=2 * size)
    a = cache.get(runs[0], "a")
    cache.get(runs[1], "b")
    assert cache.get(runs[0], "a") is a  # a used again: b is now the least recently used
    cache.get(runs[2], "c")
    assert list(cache.models) == [runs[0] / "ckpt_best.pt", runs[2] / "ckpt_best.pt"]
    tiny = ModelCache(max_bytes=size - 1)  # a model bigger than the bound answers, and is not kept
    assert tiny.get(runs[0], "a").step == 20 and not tiny.models


@pytest.mark.slow
def test_a_step_loads_the_checkpoint_the_run_kept_there_beside_its_best_within_the_same_bound(trained_run, tmp_path):
    run = copy_run(trained_run, tmp_path / "run", "ckpt_best.pt")
    kept = Checkpoint.load(run / "ckpt_best.pt")
    kept.step = 10
    kept_checkpoint_path(run, 10).parent.mkdir()
    kept.save(kept_checkpoint_path(run, 10))
    size = model_bytes(ModelCache(2**30).get(run, "run").model)
    cache = ModelCache(max_bytes=size)  # room for one model
    at_10 = cache.get(run, "run", step=10)
    assert (at_10.checkpoint, at_10.step) == (kept_checkpoint_path(run, 10), 10)
    assert cache.get(run, "run").step == 20 and list(cache.models) == [run / "ckpt_best.pt"]  # the kept one went out
    with pytest.raises(UserError, match=r"run 'run' kept no checkpoint at step 20; its kept steps are \[10\]"):
        cache.get(run, "run", step=20)
    shutil.rmtree(run / "checkpoints")
    with pytest.raises(UserError, match=r"run 'run' kept no checkpoint at step 10; it kept none \(train.keep_checkpoints"):
        cache.get(run, "run", step=10)


@pytest.mark.slow
def test_a_run_with_no_checkpoint_yet_is_refused_saying_when_it_will_have_one(trained_run, tmp_path):
    (tmp_path / "young").mkdir()
    (tmp_path / "young" / "ckpt_best.pt").symlink_to(trained_run / "ckpt_best.pt")  # a link out of the run is no checkpoint
    with pytest.raises(UserError, match=re.escape("run 'young' has no checkpoint yet (ckpt_best.pt or ckpt_last.pt, or one it "
                                                  "keeps); a run saves its first checkpoint at its first evaluation "
                                                  "after step 0")):
        ModelCache(2**30).get(tmp_path / "young", "young")
    # Before its first save a run may have kept checkpoints (train.keep_checkpoints=[0, ...]): the newest answers.
    for step in (0, 10):
        kept_checkpoint_path(tmp_path / "young", step).parent.mkdir(exist_ok=True)
        shutil.copy(trained_run / "ckpt_best.pt", kept_checkpoint_path(tmp_path / "young", step))
    assert ModelCache(2**30).get(tmp_path / "young", "young").checkpoint == kept_checkpoint_path(tmp_path / "young", 10)


def test_a_checkpoint_edited_by_hand_is_one_line_the_tab_answers_with_not_a_model_without_positions(trained_run, tmp_path):
    # model.pos=alibi once built a model with no positions at all, and a model group of text an HTTP 500.
    for name, edit, words in [("alibi", lambda c: c["config"]["model"].update(pos="alibi"),
                               "the checkpoint's config does not describe a model this version can build (pos='alibi' "
                               "is not one of ('learned', 'rope'))"),
                              ("text", lambda c: c["config"].update(model="four layers"),
                               "ckpt_best.pt is not a checkpoint of this project (its config's model is str, not a "
                               "group of settings)")]:
        edited = torch.load(trained_run / "ckpt_best.pt", weights_only=True)
        edit(edited)
        (tmp_path / name).mkdir()
        torch.save(edited, tmp_path / name / "ckpt_best.pt")
        with pytest.raises(UserError, match=re.escape(words)):
            ModelCache(2**30).get(tmp_path / name, name)


def tensorboard_flags(*args: str) -> argparse.Namespace:
    """The tab's flags as TensorBoard parses and then fixes them."""
    parser = argparse.ArgumentParser()
    AttentionLoader().define_flags(parser)
    flags = parser.parse_args(args)
    flags.samples_per_plugin = {}
    AttentionLoader().fix_flags(flags)
    return flags


def test_the_text_box_runs_on_the_cpu_in_fp32_with_512_mb_of_models_unless_told_otherwise():
    flags = tensorboard_flags()
    assert (flags.attention_tab_device, flags.attention_tab_dtype, flags.attention_tab_cache_mb) == ("cpu", "fp32", 512)
    assert tensorboard_flags("--attention_tab_dtype", "bf16").attention_tab_dtype == "bf16"
    assert tuple(WEIGHT_DTYPES) == DTYPES  # the flag's choices, written without torch, are the precisions runtime/ knows
    flags = tensorboard_flags("--attention_tab_device", "cuda:1", "--attention_tab_cache_mb", "0")
    assert (flags.attention_tab_device, flags.attention_tab_cache_mb) == ("cuda:1", 0)
    for device in ("gpu", "xpu", "cpux", "cuda:1x"):  # xpu: a torch device this project does not run on (runtime/devices.py)
        with pytest.raises(FlagsError, match=f"--attention_tab_device={device} is not a device; give cpu, cuda, cuda:<index> or mps"):
            tensorboard_flags("--attention_tab_device", device)
    assert TAB_DEVICE_TYPES == DEVICE_TYPES
    with pytest.raises(FlagsError, match="--attention_tab_cache_mb=-1 must be at least 0"):
        tensorboard_flags("--attention_tab_cache_mb", "-1")


@pytest.mark.slow
def test_a_bf16_cache_runs_the_model_in_bf16_with_the_fp32_numbers_to_two_digits(trained_run, monkeypatch):
    monkeypatch.setattr(runtime.huge_pages, "SMALLEST_MODEL", 0)  # this model is too small to gain, but moves here
    text = "Once upon a time, there was a boy named Leo. One day, Leo"
    read = {}
    for dtype in ("fp32", "bf16"):
        loaded = ModelCache(2**30, dtype=dtype).get(trained_run, "run")
        assert {p.dtype for p in loaded.model.parameters()} == {getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[dtype])}
        assert moved_to_huge_pages(loaded.model) is huge_pages_possible()  # Linux: as sample.py puts them
        assert loaded.n_bytes == model_bytes(loaded.model)  # half the bytes against the cache's bound
        read[dtype] = loaded.read(text, [(1, 0)])
    fp32, bf16 = read["fp32"], read["bf16"]
    assert not torch.equal(bf16.predictions.log_probs.float(), fp32.predictions.log_probs)
    torch.testing.assert_close(bf16.predictions.log_probs.float(), fp32.predictions.log_probs, atol=0.15, rtol=0.03)


def test_an_answer_names_the_models_window_so_the_page_greys_the_keys_it_hides(tmp_path):
    tokenizer = CharTokenizer(list("abcdefgh"))
    for window in (None, 3):
        model = tiny_gpt(vocab_size=tokenizer.vocab_size, window=window).eval()
        loaded = LoadedModel(model, tokenizer, tmp_path / "ckpt_best.pt", 0, (0, 0), model_bytes(model))
        answer = text_answer("run", loaded, "abcdefg", [])
        assert answer["window"] == window
        T = len(answer["labels"])
        weights = np.frombuffer(base64.b64decode(answer["weights"]), dtype="<f2").reshape(answer["shape"])
        assert ((weights == 0) == hidden_cells(T, window)).all()  # what the page greys is what the model hid


def counting_forwards(trained_run):
    """The run's best model as the tab holds it, and a list that grows by one at each of its forwards."""
    model, tokenizer = Checkpoint.load(trained_run / "ckpt_best.pt").build_model()
    loaded = LoadedModel(model, tokenizer, trained_run / "ckpt_best.pt", 0, (0, 0), model_bytes(model))
    forwards = []
    model.lm_head.register_forward_hook(lambda *_: forwards.append(1))
    return loaded, forwards


@pytest.mark.slow
def test_knocking_heads_out_after_reading_a_text_runs_one_forward_with_the_same_numbers(trained_run):
    loaded, forwards = counting_forwards(trained_run)
    model, tokenizer = loaded.model, loaded.tokenizer
    text = "Once upon a time, there was a boy named Leo. One day, Leo"
    loaded.read(text, [])
    assert len(forwards) == 1
    knocked = loaded.read(text, [(1, 0)])
    assert len(forwards) == 2  # the knocked-out model's forward only: the intact numbers were kept
    fresh = forward_text(model, tokenizer, text, [(1, 0)])  # both forwards, from scratch
    assert torch.equal(knocked.intact.log_probs, fresh.intact.log_probs)
    assert torch.equal(knocked.predictions.log_probs, fresh.predictions.log_probs)
    other = loaded.read(text, [(0, 1)])  # another head knocked out: the intact numbers are still the intact model's
    assert torch.equal(other.intact.log_probs, fresh.intact.log_probs)
    assert torch.equal(other.predictions.log_probs, forward_text(model, tokenizer, text, [(0, 1)]).predictions.log_probs)
    before = len(forwards)
    loaded.read(text + " went", [(1, 0)])  # another text: its intact numbers are computed anew
    assert len(forwards) == before + 2


@pytest.mark.slow
def test_knocking_heads_out_on_the_repeated_tokens_also_runs_one_forward_with_the_same_numbers(trained_run):
    loaded, forwards = counting_forwards(trained_run)
    model, tokenizer = loaded.model, loaded.tokenizer
    loaded.read_repeated(8, 3, [])
    knocked = loaded.read_repeated(8, 3, [(1, 0)])
    assert len(forwards) == 2  # the knocked-out model's forward only: the intact numbers were kept
    fresh = forward_repeated(model, tokenizer, 8, 3, [(1, 0)])  # both forwards, from scratch
    assert torch.equal(knocked.forward.intact.log_probs, fresh.forward.intact.log_probs)
    assert torch.equal(knocked.induction, fresh.induction)
    before = len(forwards)
    loaded.read_repeated(8, 4, [(1, 0)])  # another seed: other tokens, whose intact numbers are computed anew
    assert len(forwards) == before + 2


def test_the_tab_patches_prompts_of_at_most_its_bound_and_says_so_in_one_line(tmp_path, monkeypatch):
    from attention_tab import tools

    save_circuit(tmp_path / "circuit")
    loaded = ModelCache(2**30).get(tmp_path / "circuit", "circuit")
    monkeypatch.setattr(tools, "MAX_PATCH_TOKENS", 7)  # the circuit reads 40 tokens: the bound, made smaller
    assert tools.patch_answer("circuit", loaded, "abcdeab", "abXdeab", "c", "X")["heads"]  # 7 tokens (8 with <eot>): patched
    with pytest.raises(UserError) as caught:
        tools.patch_answer("circuit", loaded, "abcdefab", "abXdefab", "c", "X")
    assert str(caught.value) == ("the clean prompt is 8 tokens; the tab patches at most 7 (a forward of the "
                                 "prompt for each layer and position): shorten it, or call inspection.patching.patch_residual "
                                 "from Python")


def test_numbers_a_model_gone_non_finite_gives_are_none_in_the_answer_which_json_cannot_hold_otherwise():
    assert finite(torch.tensor([[1.5, float("inf")], [float("-inf"), float("nan")]])) == [[1.5, None], [None, None]]


def test_a_kept_checkpoint_that_links_out_of_its_run_is_not_loaded(tmp_path):
    (tmp_path / "elsewhere.pt").write_bytes(b"not the run's")
    kept = kept_checkpoint_path(tmp_path / "run", 100)
    kept.parent.mkdir(parents=True)
    kept.symlink_to(tmp_path / "elsewhere.pt")
    with pytest.raises(UserError, match=r"run 'run' kept no checkpoint at step 100"):
        checkpoint_in(tmp_path / "run", "run", 100)
