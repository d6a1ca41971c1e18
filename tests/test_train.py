"""One tiny run of train.py, end to end: what it leaves in its run dir, that its val loss falls,
and a run on character tokens that logs, learns and samples as the default BPE run does."""

import shlex

import pytest
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from data.stories import generate_stories
from tests.helpers import (
    assert_one_error_line,
    last_values,
    read_events,
    recomputed_last_step_scalars,
    run_cli,
    text_of,
    tiny_run,
)
from user_error import command_argument

pytestmark = pytest.mark.slow  # every test reads the shared trained run


def test_training_writes_both_checkpoints_a_log_and_the_config(trained_run):
    for name in ("ckpt_last.pt", "ckpt_best.pt", "train.log", ".hydra/config.yaml"):
        assert (trained_run / name).is_file(), name
    assert list(trained_run.glob("events.out.tfevents.*"))
    checkpoint = torch.load(trained_run / "ckpt_last.pt", weights_only=True)
    assert checkpoint["step"] == 20
    assert checkpoint["config"]["model"]["n_layer"] == 2
    assert checkpoint["tokenizer"]["kind"] == "bpe"  # the default
    log = (trained_run / "train.log").read_text()
    assert "step 20: train loss" in log and "val loss" in log
    assert "precision: fp32 (train.dtype=auto: fp32 on a CPU, where bf16 and fp16 gain little or are much slower)" in log
    # Guards ckpt_best saved at the wrong evaluation or with a stale best_val_loss: the lowest val loss logged.
    val = {e.step: e.value for e in read_events(trained_run).Scalars("loss/val") if e.step > 0}
    best = torch.load(trained_run / "ckpt_best.pt", weights_only=True)
    assert best["step"] == min(val, key=val.get)
    assert best["best_val_loss"] == pytest.approx(val[best["step"]]) == checkpoint["best_val_loss"]


def test_the_val_loss_falls_during_the_tiny_run(trained_run):
    val = [e.value for e in read_events(trained_run).Scalars("loss/val")]
    assert val[-1] < val[0] - 0.3


def test_a_tiny_char_run_trains_logs_labelled_maps_and_samples(tmp_path):
    # On the CPU: its logged figures are recomputed below on the CPU in fp32, to 1e-5.
    result = run_cli("train.py", *tiny_run(**{"tokenizer": "char", "train.device": "cpu", "hydra.run.dir": "run"}), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = tmp_path / "run"
    assert "(char)" in (run_dir / "train.log").read_text()
    assert not (tmp_path / ".cache" / "bpe").exists()
    events = read_events(run_dir)
    assert {f"attention/layer_{layer}/head_{h}" for layer in range(2) for h in range(2)} <= set(events.Tags()["images"])
    assert [image.step for image in events.Images("attention/layer_1/head_1")] == [0, 10, 20]
    labels = text_of(events, "attention/probe").split(" | ")
    assert len(labels) == 24 and all(len(label) == 1 for label in labels)  # one character each, a space as ·
    assert "".join(labels).replace("·", " ").startswith(("Once upon", "There once", "Long ago"))
    losses = [e.value for e in events.Scalars("loss/val")]
    assert losses[-1] < losses[0] - 0.3
    # The recall probe reads character tokens too; guards a probe built on other stories than the held-out ones.
    expected = recomputed_last_step_scalars(run_dir)
    assert "recall/accuracy_name" in expected
    assert last_values(events, expected) == pytest.approx(expected, abs=1e-5)
    name = events.Scalars("recall/accuracy_name")[-1]  # and the last line says it, as TensorBoard has it
    assert f", name recall {name.value:.1%} at step {name.step}; checkpoints" in result.stdout and name.step == 20
    sampled = run_cli("sample.py", f"run={run_dir}", "prompt=Once upon", "max_new_tokens=20", cwd=tmp_path)
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout.startswith("Once upon") and len(sampled.stdout.rstrip("\n")) >= len("Once upon") + 20
    unknown = run_cli("sample.py", f"run={run_dir}", "prompt='Once upon a time ☃'", cwd=tmp_path)
    assert_one_error_line(unknown, "never saw in training: '☃'")  # a character outside the char vocabulary
    assert "  sample: .venv/bin/python sample.py run=run prompt='Once upon a time'\n" in result.stdout  # the last lines


def test_the_closing_hint_leaves_out_a_prompt_the_runs_characters_cannot_write(tmp_path):
    (tmp_path / "book.txt").write_text("".join(generate_stories(3, 30_000)).lower())  # no capital O
    lower = {"tokenizer": "char", "data": "text", "data.path": "book.txt", "data.n_chars": None, "train.max_steps": 2,
             "train.eval_interval": 2, "train.attn_log_interval": 0, "train.sample_interval": 0, "hydra.run.dir": "my run"}
    result = run_cli("train.py", *tiny_run(lower), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("  sample: .venv/bin/python sample.py 'run=my run'\n")  # quoted: a space in the folder
    command = shlex.split(result.stdout.splitlines()[-1].removeprefix("  sample: "))  # a command that runs as printed
    assert command[:2] == [".venv/bin/python", "sample.py"]
    sampled = run_cli("sample.py", *command[2:], "max_new_tokens=5", cwd=tmp_path)
    assert sampled.returncode == 0, sampled.stderr
    assert "  watch:  .venv/bin/tensorboard --logdir .\n" in result.stdout
    assert "recall" not in result.stdout  # a text of the user's has no recall probe


@pytest.mark.parametrize("folder", ["outputs/2026-11-28/19-03-35", "../my run", "../josé", "a,b", "it's", "(x)", "a=b",
                                    "a:b", 'say "hi"', "x${y}", "[1]"])
def test_a_printed_command_argument_reads_back_as_the_folder_through_the_shell_and_hydra(folder):
    # The closing lines' and the stop's commands are pasted: the shell splits them, then Hydra parses the
    # value (a comma would be a sweep, a colon or a quote an error) and OmegaConf resolves it.
    argument = command_argument("run", folder)
    (word,) = shlex.split(argument)  # one argument for the shell
    parsed = OverridesParser.create().parse_overrides([word])[0]
    assert parsed.key_or_group == "run" and OmegaConf.create({"run": parsed.value()}).run == folder
    assert (argument == f"run={folder}") == (folder == "outputs/2026-11-28/19-03-35")  # quoted only where needed


def test_a_run_shorter_than_its_warmup_says_its_learning_rate_never_peaks(tmp_path):
    quick = {"train.eval_interval": 3, "train.attn_log_interval": 0, "train.sample_interval": 0, "hydra.run.dir": "run"}
    short = run_cli("train.py", *tiny_run(quick, **{"train.max_steps": 3, "optim.warmup_steps": 5}), cwd=tmp_path)
    assert short.returncode == 0, short.stderr
    assert ("note: optim.warmup_steps=5 is more than train.max_steps=3: the learning rate never reaches optim.lr=0.01; "
            "lower optim.warmup_steps for so short a run") in short.stdout
    enough = run_cli("train.py", *tiny_run(quick, **{"train.max_steps": 3, "optim.warmup_steps": 1, "hydra.run.dir": "run2"}),
                     cwd=tmp_path)  # (3 would be noted too, as it never decays: tests/test_lr_schedule.py)
    assert enough.returncode == 0 and "optim.warmup_steps" not in enough.stdout
