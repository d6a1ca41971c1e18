"""--help: train.py and sample.py list their options with the project's own text, and the values
the rest of the command line would give."""

import pytest

from tests.helpers import run_cli, spawn_cli


@pytest.mark.parametrize("script", [pytest.param("train.py", marks=pytest.mark.slow),  # a Python process of its own
                                    "sample.py"])
def test_help_lists_the_options_with_the_projects_own_text(tmp_path, script):
    # train.py's own start, as a user runs it; sample.py's in this process (the same Hydra help, read the same way)
    result = spawn_cli(script, "--help", cwd=tmp_path) if script == "train.py" else run_cli(script, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{script}: ")
    assert f"Usage: python {script} [key=value ...]" in result.stdout
    if script == "train.py":
        assert "tokenizer: bpe, char, gpt2" in result.stdout  # the groups and their options
        assert "  n_head: 4\n" in result.stdout and "resume: null" in result.stdout
        overridden = run_cli(script, "model.n_head=8", "--help", cwd=tmp_path)
        assert "  n_head: 8\n" in overridden.stdout  # the values this command line would use
    else:
        assert "use_kv_cache: true" in result.stdout
    assert list(tmp_path.iterdir()) == []  # asking for help writes nothing


def test_key_value_arguments_on_both_sides_of_a_flag_are_read_as_one_command_line(tmp_path):
    # argparse, as Hydra calls it, reads them in one run only: the second would be its usage text.
    result = run_cli("train.py", "model.n_layer=3", "--cfg", "job", "model.n_head=1", "train.max_steps=7", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "  n_layer: 3\n" in result.stdout and "  n_head: 1\n" in result.stdout and "  max_steps: 7\n" in result.stdout
    refused = run_cli("train.py", "model.n_layer=3", "--run", "model.n_head=0", cwd=tmp_path)  # --run: Hydra's default mode
    assert (refused.returncode, refused.stderr) == (2, "error: model.n_head=0 must be at least 1\n")  # checked as usual
    assert list(tmp_path.iterdir()) == []


def test_a_shell_completion_script_is_printed_for_the_action_asked(tmp_path):
    result = run_cli("train.py", "--shell-completion", "install=bash", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "hydra_bash_completion()" in result.stdout


def test_removing_the_preset_group_is_no_preset_as_leaving_it_out_is(tmp_path):
    result = run_cli("train.py", "~experiment", "--cfg", "job", cwd=tmp_path)  # experiment's default is null
    assert result.returncode == 0 and "  n_layer: 4\n" in result.stdout, result.stderr
