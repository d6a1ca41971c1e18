"""export.py, through its real command line: a GPT-2-shaped run's folder, and the default run's (in
Qwen3's shape), load in transformers with our logits, our greedy text and our token ids (transformers
is the independent reference), sample.py's dtype=bf16 too; a run
that no architecture holds, and an out folder already in use, are refused in one line. Llama- and
Qwen3-shaped runs: tests/test_hf_llama.py."""

import os
import shutil
import stat
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tokenizers import ByteLevelBPETokenizer
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    GPT2LMHeadModel,
    Qwen3ForCausalLM,
)

from data.hf_tokenizer import encoding_from_hf_folder, pretrained_tokenizer
from data.stories import generate_stories
from data.tokenizer import EOT, TiktokenTokenizer, bpe_encoding
from export import replace_folder, write_hf_folder
from model.generation import terminal_text
from model.gpt import GPT, GPTConfig, eval_mode
from model_io.checkpoint import Checkpoint, build_model
from model_io.hf_models import gpt_from_hf
from model_io.run_files import BEST, LAST
from tests.helpers import NO_PROBES, TINY_GPT2_VOCAB, assert_one_error_line, run_cli, tiny_gpt2, tiny_run
from tests.test_hf_tokenizer import save_family

pytestmark = pytest.mark.slow  # every test exports runs trained (or built) by the module's fixtures

TOLERANCE = 1e-5  # fp32: the same math in another order
PROMPT = "Once upon a time"
NEW_TOKENS = 12  # the prompt and these fit the tiny runs' 32 positions: no sliding window in either
# Any text for the byte-level tokenizers: non-ASCII letters, runs of spaces, tabs, a typed-out "<|endo".
HARD_TEXT = "Café naïve, Straße, 日本語 🙂\n\n\ttabs\t\tand   runs of    spaces don't <|endo"


def train_gpt2_shaped(workdir: Path, tokenizer: str) -> Path:
    result = run_cli("train.py", *tiny_run(NO_PROBES, experiment="gpt2_shape", tokenizer=tokenizer, **{"hydra.run.dir": "run"}),
                     cwd=workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    return workdir / "run"


@pytest.fixture(scope="module")
def char_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_gpt2_shaped(tmp_path_factory.mktemp("char"), "char")


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_gpt2_shaped(tmp_path_factory.mktemp("bpe"), "bpe")


@pytest.fixture(scope="module")
def pretrained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of a Hugging Face GPT-2 folder (tiny random GPT2LMHeadModel, byte-level BPE trained by
    `tokenizers` in GPT-2's vocab.json + merges.txt layout), read by model_io as init_from reads one."""
    folder = tmp_path_factory.mktemp("hf_gpt2")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(generate_stories(seed=3, n_chars=20_000), vocab_size=TINY_GPT2_VOCAB, special_tokens=[EOT],
                            show_progress=False)
    assert bpe.get_vocab_size() == TINY_GPT2_VOCAB
    bpe.save_model(str(folder))
    tiny_gpt2().save_pretrained(folder)
    model, _ = gpt_from_hf(folder)
    tokenizer = TiktokenTokenizer("pretrained", encoding_from_hf_folder(folder))
    model_cfg = {key: value for key, value in asdict(model.config).items() if key != "vocab_size"}
    run = tmp_path_factory.mktemp("pretrained_run")
    Checkpoint(model=model.state_dict(), config={"model": model_cfg}, tokenizer=tokenizer.state()).save(run / BEST)
    return run


def export(run: Path, out: Path, *args: str) -> str:
    """export.py's printout; the export must succeed."""
    result = run_cli("export.py", f"run={run}", f"out={out}", *args, cwd=out.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def refusal(run: Path, out: Path, *args: str) -> str:
    """export.py's one-line error; the export must be refused."""
    result = run_cli("export.py", f"run={run}", f"out={out}", *args, cwd=out.parent)
    assert (result.returncode, result.stdout) == (2, ""), result.stdout + result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    return result.stderr


@pytest.mark.parametrize(("run_name", "hf_class"), [("char_run", GPT2LMHeadModel), ("bpe_run", GPT2LMHeadModel),
                                                   ("pretrained_run", GPT2LMHeadModel), ("trained_run", Qwen3ForCausalLM)],
                         ids=["char_run", "bpe_run", "pretrained_run", "the default run"])
def test_an_exported_run_gives_our_logits_greedy_text_and_token_ids_in_transformers(
    run_name: str, hf_class: type, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    run = request.getfixturevalue(run_name)  # trained_run: train.py's defaults at a tiny size, in Qwen3's shape
    out = tmp_path / "exported"
    umask = os.umask(0o022)
    try:
        printed = export(run, out)
    finally:
        os.umask(umask)
    assert f"AutoModelForCausalLM.from_pretrained('{out}')" in printed
    # Every file as the umask makes it (022 here: readable by all): safetensors alone would leave the
    # weights to their owner (0600).
    assert {stat.S_IMODE(path.stat().st_mode) for path in out.iterdir()} == {0o644}
    theirs = AutoModelForCausalLM.from_pretrained(out).eval()
    their_tokenizer = AutoTokenizer.from_pretrained(out)
    assert type(theirs) is hf_class
    ours, tokenizer = Checkpoint.load(run / BEST).build_model()

    text = PROMPT if run_name == "char_run" else HARD_TEXT  # a char model knows only its corpus' characters
    ids = their_tokenizer(text)["input_ids"]
    assert ids == tokenizer.encode(text)
    assert their_tokenizer.decode(ids) == text

    # sample.py starts after the start token (<|endoftext|> here) and writes past an <|endoftext|>; generate
    # stops at one unless told not to. As docs/export.md gives it, with the exported tokenizer's ids alone.
    idx = torch.tensor([[their_tokenizer.bos_token_id, *their_tokenizer(PROMPT, add_special_tokens=False).input_ids]])
    generated = theirs.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=NEW_TOKENS,
                                do_sample=False, eos_token_id=None)  # (1, T + NEW_TOKENS)
    sampled = run_cli("sample.py", f"run={run}", f"prompt={PROMPT}", f"max_new_tokens={NEW_TOKENS}",
                      "temperature=0", cwd=tmp_path)
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout == terminal_text(their_tokenizer.decode(generated[0, 1:])) + "\n"

    with torch.no_grad(), eval_mode(ours):
        assert (ours(generated)[0] - theirs(generated).logits).abs().max().item() < TOLERANCE


@pytest.mark.parametrize(("run_name", "hf_class"), [("char_run", GPT2LMHeadModel), ("trained_run", Qwen3ForCausalLM)],
                         ids=["gpt2-shaped run", "the default run"])
def test_the_exported_safetensors_holds_exactly_the_tensors_transformers_expects(
    run_name: str, hf_class: type, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # Loading is no check of this: transformers ignores a tensor too many (a tied model's lm_head.weight
    # written as a separate copy) and fills a tied one in. The names must be those of the model
    # transformers builds from the exported config.json, less the tied ones, which a file leaves out.
    run = request.getfixturevalue(run_name)
    out = tmp_path / "exported"
    export(run, out)
    with safe_open(out / "model.safetensors", framework="pt") as file:
        written = set(file.keys())
    config = AutoConfig.from_pretrained(out)
    assert config.tie_word_embeddings  # both shapes tie the LM head to the token embedding
    theirs = AutoModelForCausalLM.from_config(config)
    assert type(theirs) is hf_class
    seen, tied = set(), set()
    for name, tensor in theirs.state_dict(keep_vars=True).items():  # a tied weight: the same Parameter twice
        if id(tensor) in seen:
            tied.add(name)
        seen.add(id(tensor))
    assert tied == {"lm_head.weight"}
    assert written == set(theirs.state_dict()) - tied


def test_sample_py_at_bf16_writes_transformers_greedy_text_at_bf16(pretrained_run: Path, tmp_path: Path) -> None:
    # Both sides' weights in bfloat16, so both compute every matmul in it: the same tokens.
    out = tmp_path / "exported"
    export(pretrained_run, out)
    tokenizer = Checkpoint.load(pretrained_run / BEST).build_model()[1]
    idx = torch.tensor([[tokenizer.eot_id, *tokenizer.encode(PROMPT)]])  # (1, T)
    theirs = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16).eval()
    generated = theirs.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=NEW_TOKENS,
                                do_sample=False, eos_token_id=None)  # (1, T + NEW_TOKENS)
    sample = [f"run={pretrained_run}", f"prompt={PROMPT}", f"max_new_tokens={NEW_TOKENS}"]
    greedy = run_cli("sample.py", *sample, "temperature=0", "dtype=bf16", cwd=tmp_path)
    assert greedy.returncode == 0, greedy.stderr
    assert greedy.stdout == terminal_text(tokenizer.decode(generated[0, 1:].tolist())) + "\n"


def test_sample_py_computes_in_the_dtype_it_is_given_where_float16_overflows_and_fp32_does_not(
        pretrained_run: Path, tmp_path: Path) -> None:
    # The tiny models write the same text at every precision; logits past float16's 65,504 do not:
    # the final norm's gain times 1e6 makes them about 1e5 to 1e6, finite in fp32 and bf16.
    checkpoint = Checkpoint.load(pretrained_run / BEST)
    checkpoint.model["ln_f.weight"] = checkpoint.model["ln_f.weight"] * 1e6
    checkpoint.save(tmp_path / "loud.pt")
    sample = ["run=loud.pt", "max_new_tokens=3", "temperature=0", "device=cpu"]  # the CPU, whose fp16 warning it prints
    for dtype in ("fp32", "bf16", "auto"):  # auto: fp32 on a CPU
        assert run_cli("sample.py", *sample, f"dtype={dtype}", cwd=tmp_path).returncode == 0
    result = run_cli("sample.py", *sample, "dtype=fp16", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr == ("warning: dtype=fp16 on a CPU: slower than fp32 on most CPUs; dtype=fp32 (or bf16 where the "
                             "CPU has it)\nerror: loud.pt: the model's next-token logits are NaN or inf at dtype=fp16 "
                             "(float16, whose largest number is 65,504); sample with dtype=bf16 or fp32\n")


def test_weights_that_hold_nan_are_refused_rather_than_exported(pretrained_run: Path, tmp_path: Path) -> None:
    # A run that diverged, or one byte of the file flipped: transformers would load NaN without a word.
    checkpoint = Checkpoint.load(pretrained_run / BEST)
    checkpoint.model["ln_f.bias"] = torch.full_like(checkpoint.model["ln_f.bias"], float("nan"))
    checkpoint.save(tmp_path / "nan.pt")
    assert refusal(tmp_path / "nan.pt", tmp_path / "exported") == (
        f"error: {tmp_path / 'nan.pt'}: its weights hold NaN or inf (ln_f.bias): the run diverged, or the file is damaged; "
        "export a checkpoint saved before that\n")
    assert not (tmp_path / "exported").exists()


@pytest.mark.parametrize("run_name", ["bpe_run", "pretrained_run"])
def test_an_exported_byte_level_run_reads_back_as_the_same_model_and_tokenizer(
    run_name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # What init_from=<exported folder> reads. (A char run's tokenizer is written as a BPE of characters,
    # which encoding_from_hf_folder, reading byte-level BPEs only, does not read.)
    run = request.getfixturevalue(run_name)
    export(run, tmp_path / "exported")
    ours, tokenizer = Checkpoint.load(run / BEST).build_model()
    back, notes = gpt_from_hf(tmp_path / "exported")
    assert notes == []
    assert encoding_from_hf_folder(tmp_path / "exported").encode_ordinary(HARD_TEXT) == tokenizer.encode(HARD_TEXT)
    idx = torch.tensor([[tokenizer.eot_id, *tokenizer.encode(HARD_TEXT)]])[:, : ours.config.block_size]  # (1, T)
    with torch.no_grad(), eval_mode(ours), eval_mode(back):
        assert torch.equal(ours(idx)[0], back(idx)[0])


def test_generation_pads_with_the_end_token_not_the_start_one_and_the_tokenizer_knows_the_context(tmp_path: Path) -> None:
    tokenizer = pretrained_tokenizer(save_family("llama3", tmp_path / "llama3"))  # as a run from a Llama 3 folder holds it
    assert tokenizer.bos_id != tokenizer.eot_id  # <|begin_of_text|> starts a text, <|end_of_text|> ends one
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=24, n_layer=1, n_head=2, n_embd=16, pos="rope",
                          norm="rmsnorm", mlp="swiglu", qk_norm=False, smear=False))  # a Llama's shape
    write_hf_folder(model, tokenizer, tmp_path / "out")
    config = AutoConfig.from_pretrained(tmp_path / "out")  # the model's own ids, as transformers reads them
    assert (config.bos_token_id, config.eos_token_id) == (tokenizer.bos_id, tokenizer.eot_id)
    generation = GenerationConfig.from_pretrained(tmp_path / "out")
    assert (generation.bos_token_id, generation.eos_token_id, generation.pad_token_id) == (
        tokenizer.bos_id, tokenizer.eot_id, tokenizer.eot_id)  # a finished row of a batch is padded with its end
    assert AutoTokenizer.from_pretrained(tmp_path / "out").model_max_length == 24  # the model's block_size


def test_a_run_no_architecture_holds_is_refused_naming_the_nearest_shape_first_then_each_others_options(trained_run: Path, tmp_path: Path) -> None:
    # The default before it took Qwen3's shape: rope, LayerNorm, relu2, QK-norm, smear.
    saved = Checkpoint.load(trained_run / BEST)
    config = {**saved.config["model"], "norm": "layernorm", "mlp": "relu2", "smear": True}
    model = build_model(config, saved.build_tokenizer().vocab_size)
    run = tmp_path / "run"
    run.mkdir()
    Checkpoint(model=model.state_dict(), config={**saved.config, "model": config}, tokenizer=saved.tokenizer).save(run / BEST)
    message = refusal(run, tmp_path / "exported")
    assert message.startswith(f"error: {run / BEST} fits none of the architectures")  # which checkpoint
    # The nearest first, each option with why, and its preset: what to do comes before the rest.
    assert ("The nearest is GPT-2 (GPT2LMHeadModel), which has no place for model.pos=rope (GPT-2 learns position "
            "embeddings); model.qk_norm=true (GPT-2 does not normalise queries and keys); model.smear=true (GPT-2 has no "
            "smear): train without them, or from its preset, `.venv/bin/python train.py experiment=gpt2_shape`. ") in message
    assert message.endswith("Against the others: Llama: model.norm=layernorm, model.mlp=relu2, model.qk_norm=true, "
                            "model.smear=true (experiment=llama_shape); Qwen3: model.norm=layernorm, model.mlp=relu2, "
                            "model.smear=true (experiment=qwen3_shape); Mistral: model.norm=layernorm, model.mlp=relu2, "
                            "model.qk_norm=true, model.smear=true (experiment=mistral_shape). docs/export.md says why for "
                            "each\n")
    assert list(tmp_path.iterdir()) == [run]


def test_an_earlier_export_is_replaced_only_when_forced(pretrained_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "exported"
    export(pretrained_run, out)
    (out / "config.json").write_text("{}")  # the earlier export, edited: a refusal must leave it so
    assert refusal(pretrained_run, out) == (
        f"error: out={out} holds a model's files (config.json, generation_config.json, model.safetensors and 3 more); "
        "add force=true to replace them, or give a new or empty folder\n")
    assert (out / "config.json").read_text() == "{}"

    out.chmod(0o750)  # a folder of one's group: replaced, it keeps that
    export(pretrained_run, out, "force=true")
    assert [p.name for p in tmp_path.iterdir()] == ["exported"]  # no staging folder left beside it
    assert stat.S_IMODE(out.stat().st_mode) == 0o750
    assert type(AutoModelForCausalLM.from_pretrained(out)) is GPT2LMHeadModel


def test_force_never_deletes_a_folder_that_holds_more_than_a_models_files(pretrained_run: Path, tmp_path: Path) -> None:
    # out=$HOME force=true once deleted a home folder: force replaces a model's files and nothing else.
    home = tmp_path / "home"
    (home / ".pyenv" / "versions").mkdir(parents=True)
    for name in (".bashrc", "config.json", "notes.txt", "tokenizer.json"):
        (home / name).write_text("mine")
    before = sorted(p.relative_to(home) for p in home.rglob("*"))
    for args in ((), ("force=true",)):
        assert refusal(pretrained_run, home, *args) == (
            f"error: out={home} holds .bashrc, .pyenv/, notes.txt, which an export does not write; give a new or empty "
            "folder (force=true replaces only a folder of a model's files, such as an earlier export)\n")
    assert sorted(p.relative_to(home) for p in home.rglob("*")) == before
    assert all((home / name).read_text() == "mine" for name in (".bashrc", "config.json", "notes.txt", "tokenizer.json"))
    # A model folder with a subfolder of its own is not all a model's files either.
    folder = tmp_path / "saved"
    export(pretrained_run, folder)
    (folder / "checkpoints").mkdir()
    assert f"out={folder} holds checkpoints/, which" in refusal(pretrained_run, folder, "force=true")
    assert (folder / "checkpoints").is_dir()
    (folder / "checkpoints").rmdir()  # a folder named as a model's file is a folder all the same
    (folder / "model-00001-of-00002.safetensors" / "mine").mkdir(parents=True)
    assert f"out={folder} holds model-00001-of-00002.safetensors/, which" in refusal(pretrained_run, folder, "force=true")
    assert (folder / "model-00001-of-00002.safetensors" / "mine").is_dir()


def test_force_never_replaces_the_folder_holding_the_checkpoint_or_the_working_folder(pretrained_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(pretrained_run / BEST, run / BEST)
    assert "holds the checkpoint being exported" in refusal(run, run, "force=true")
    assert [p.name for p in run.iterdir()] == [BEST]
    nested = tmp_path / "a" / "b" / "run"  # out=a, two folders above the checkpoint
    nested.mkdir(parents=True)
    shutil.copy(pretrained_run / BEST, nested / BEST)
    assert refusal(nested, tmp_path / "a", "force=true") == (
        f"error: out={tmp_path / 'a'} holds the checkpoint being exported ({nested / BEST}); give another folder\n")
    assert [p.name for p in nested.iterdir()] == [BEST]
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    result = run_cli("export.py", f"run={run}", "out=.", "force=true", cwd=work)
    assert result.returncode == 2 and "holds the working folder" in result.stderr, result.stdout + result.stderr
    assert [p.name for p in work.iterdir()] == ["notes.txt"]
    (work / "sub").mkdir()
    result = run_cli("export.py", f"run={run}", "out=..", "force=true", cwd=work / "sub")  # a folder above it, too
    assert_one_error_line(result, "error: out=.. holds the working folder; give a folder of its own")
    (work / "sub").rmdir()
    for empty in ("out=", "out=' '"):  # left empty, or a quoted blank: not the working folder
        result = run_cli("export.py", f"run={run}", empty, "force=true", cwd=work)
        assert_one_error_line(result, "error: out= is missing: give the folder to write, e.g. out=exported/my_model")
    assert [p.name for p in work.iterdir()] == ["notes.txt"]
    # Nor another run's dir, nor a folder of runs (out=outputs/<date> where out=exported/<name> was meant).
    other = tmp_path / "runs" / "other"
    other.mkdir(parents=True)
    shutil.copy(pretrained_run / BEST, other / LAST)
    for out in (other, other.parent):
        assert f"out={out} holds a run ({other / LAST}), which force=true would delete" in refusal(run, out, "force=true")
    assert [p.name for p in other.iterdir()] == [LAST]


def test_an_export_that_fails_midway_leaves_the_old_folder_and_no_half_written_one(pretrained_run: Path, tmp_path: Path) -> None:
    # A BPE with its own split pattern: the model's files are written first, then its tokenizer is refused.
    tokenizer = TiktokenTokenizer("bpe", bpe_encoding({bytes([b]): b for b in range(256)}, r"\S+|\s+"))
    config = Checkpoint.load(pretrained_run / BEST).config
    model = build_model(config["model"], tokenizer.vocab_size)
    run = tmp_path / "run"
    run.mkdir()
    Checkpoint(model=model.state_dict(), config=config, tokenizer=tokenizer.state()).save(run / BEST)
    out = tmp_path / "exported"
    out.mkdir()
    (out / "config.json").write_text("the earlier export")
    assert "only GPT-2's pattern can be written" in refusal(run, out, "force=true")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "run"]
    assert [p.name for p in out.iterdir()] == ["config.json"] and (out / "config.json").read_text() == "the earlier export"


def test_out_may_be_an_empty_folder_but_never_a_file_and_the_export_lists_what_it_wrote(pretrained_run: Path, tmp_path: Path) -> None:
    mine = tmp_path / "model.bin"
    mine.write_bytes(b"not a folder")
    assert refusal(pretrained_run, mine, "force=true") == f"error: out={mine} is a file; give a folder that is new or empty\n"
    assert mine.read_bytes() == b"not a folder"
    assert refusal(pretrained_run, Path("/dev/null"), "force=true") == ("error: out=/dev/null is neither a file nor a folder; "
                                                                      "give a folder that is new or empty\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    printed = export(pretrained_run, empty)  # no force needed: nothing to replace
    files = sorted(p.name for p in empty.iterdir())
    assert printed.splitlines()[0] == (f"wrote {empty} as a GPT2LMHeadModel, from {pretrained_run / BEST} (step 0): "
                                       f"{', '.join(files)}")  # in order, whatever order the folder lists them in
    assert type(AutoModelForCausalLM.from_pretrained(empty)) is GPT2LMHeadModel


def test_force_replaces_what_save_pretrained_adds_and_a_linked_folder_in_place(pretrained_run: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    export(pretrained_run, target)
    for extra in ("added_tokens.json", "chat_template.jinja"):  # a tokenizer saved by transformers may add these
        (target / extra).write_text("{}")
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    export(pretrained_run, link, "force=true")
    assert link.is_symlink() and link.resolve() == target  # the link stays, the folder it names is replaced
    assert not (target / "chat_template.jinja").exists() and (target / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "target"]  # no staging folder left


def test_a_staging_folder_left_by_a_killed_export_of_the_same_process_id_is_written_over(tmp_path: Path) -> None:
    out = tmp_path / "exported"
    left = tmp_path / f".exported.{os.getpid()}.tmp"
    left.mkdir()
    (left / "half_written.safetensors").write_text("x")
    replace_folder(out, lambda folder: (folder / "config.json").write_text("{}"))
    assert [p.name for p in out.iterdir()] == ["config.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["exported"]
