"""The config as Hydra composes it, in-process: every key typed by cli/schema.py, a wrong
type or choice refused in today's words, and choices kept as plain strings where they are saved."""

import itertools
import re
from dataclasses import fields
from importlib.metadata import version

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import cli.checkpoint_commands  # noqa: F401  (stores the schemas of configs/sample.yaml and export.yaml)
from cli.config import plain_config, resumed_config, validate_train_config
from cli.errors import config_error_line
from cli.schema import DATA_SCHEMAS, TOKENIZER_SCHEMAS, LoopSchema, ModelSchema, OptimSchema, Position
from cli.sweep_check import job_overrides
from data.corpus import SOURCES
from data.specs import KIND_KEYS
from model_io.checkpoint import Checkpoint, upgrade
from tests.helpers import ROOT, assert_one_error_line, composed_train_config, run_cli, tiny_config
from user_error import UserError


def composed(config_name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


def refusal(config_name: str, *overrides: str) -> str:
    with pytest.raises(Exception) as raised:
        composed(config_name, *overrides)
    return config_error_line(raised.value)


def test_hydra_and_omegaconf_are_the_versions_the_error_wording_was_written_against():
    pinned = dict(re.findall(r"^(hydra-core|omegaconf)==(\S+)", (ROOT / "requirements.txt").read_text(), re.MULTILINE))
    installed = {package: version(package) for package in ("hydra-core", "omegaconf")}
    assert installed == pinned, (
        "cli/errors.py (config_error_line, MUST_BE) words the errors of these exact versions: re-check "
        "tests/test_bad_input.py's tables against the new ones, then update the pins in requirements.txt"
    )


# The tokenizer options a user picks; "pretrained" is set by init_from (the weights' own tokenizer).
TOKENIZER_OPTIONS = sorted(path.stem for path in (ROOT / "configs" / "tokenizer").glob("*.yaml"))


def test_every_tokenizer_schema_is_an_option_but_the_one_init_from_sets():
    assert set(TOKENIZER_SCHEMAS) == {*TOKENIZER_OPTIONS, "pretrained"}
    # The token cache's key (data/specs.py) holds each option's keys, every one: a key added to a
    # schema and not there would leave two different vocabularies one cache entry.
    assert {kind: tuple(field.name for field in fields(schema)) for kind, schema in TOKENIZER_SCHEMAS.items()} == KIND_KEYS
    assert set(DATA_SCHEMAS) == set(SOURCES)


@pytest.mark.parametrize(("data", "tokenizer"), list(itertools.product(DATA_SCHEMAS, TOKENIZER_OPTIONS)))
def test_every_option_gives_every_key_a_type_and_a_value(data, tokenizer):
    cfg = composed("train", f"data={data}", f"tokenizer={tokenizer}")
    assert OmegaConf.missing_keys(cfg) == set()  # no key the YAML files forgot
    types = {"model": ModelSchema, "data": DATA_SCHEMAS[data], "tokenizer": TOKENIZER_SCHEMAS[tokenizer],
             "optim": OptimSchema, "train": LoopSchema}
    assert {group: OmegaConf.get_type(cfg[group]) for group in types} == types
    assert (cfg.data.source, cfg.tokenizer.kind) == (data, tokenizer)  # the option's name is its discriminator


def test_the_presets_sampling_and_export_configs_are_typed_and_complete():
    for preset in ("shakespeare_char_cpu", "finetune_gpt2", "gpt2_shape", "induction"):
        assert OmegaConf.missing_keys(composed("train", f"experiment={preset}")) == set(), preset
    assert OmegaConf.missing_keys(composed("sample")) == set()
    assert OmegaConf.missing_keys(composed("export")) == set()


def test_the_time_to_quality_preset_resolves_to_nanogpts_shape_with_its_levers(tmp_path):
    result = run_cli("train.py", "experiment=shakespeare_char_cpu", "--cfg", "job", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    assert config["data"]["source"] == "shakespeare" and config["tokenizer"]["kind"] == "char"
    model = config["model"]
    assert (model["n_layer"], model["n_head"], model["n_embd"], model["block_size"]) == (4, 4, 128, 64)
    assert (model["pos"], model["mlp"], config["optim"]["schedule"]) == ("rope", "relu2", "wsd")
    assert config["train"]["batch_size"] == 12 and config["train"]["eval_iters"] >= 200
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("config_name", "override", "message"),
    [
        ("train", "train.max_steps=abc", "train.max_steps=abc must be a whole number"),
        ("train", "train.max_steps=1.5", "train.max_steps=1.5 must be a whole number"),
        ("train", "train.max_steps=true", "train.max_steps=true must be a whole number"),
        ("train", "train.save_interval=1.5", "train.save_interval=1.5 must be a whole number"),
        ("train", "model.dropout=x", "model.dropout=x must be a number"),
        ("train", "model.dropout=true", "model.dropout=true must be a number"),
        ("train", "model.dropout='0.1'", "model.dropout=0.1 must be a number"),  # a quoted string is no number
        ("train", "model.dropout=null", "model.dropout=null must be a number"),
        ("train", "model.bias=maybe", "model.bias=maybe must be true or false"),
        ("train", "model.pos=alibi", "model.pos=alibi must be one of learned, rope"),
        ("train", "train.dtype=fp8", "train.dtype=fp8 must be one of auto, fp32, bf16, fp16"),
        ("train", "train.parallel=zero3", "train.parallel=zero3 must be one of ddp, fsdp"),
        ("train", "debug=shape", "debug=shape is not a debug mode; the one there is: debug=shapes"),
        ("train", "optim.betas=3", "optim.betas=3 must be a list"),
        ("train", "optim.ns_dtype=fp16", "optim.ns_dtype=fp16 must be one of auto, float32, bfloat16"),
        ("train", "model.n_layr=3", "model.n_layr is not an option; check its spelling"),
        ("train", "data=shakespeare data.n_chars=20000", "data.n_chars is not an option of the data chosen; data=stories has it"),
        ("sample", "top_k=lots", "top_k=lots must be a whole number"),
        ("sample", "top_p=x", "top_p=x must be a number"),
        ("sample", "topk=5", "topk is not an option; check its spelling"),
        ("export", "force=maybe", "force=maybe must be true or false"),
    ],
)
def test_a_wrong_type_or_choice_is_refused_while_hydra_composes_in_one_line(config_name, override, message):
    line = refusal(config_name, *override.split())
    assert line.startswith(message) and "\n" not in line


def test_a_refused_value_shows_what_the_config_holds_there_as_the_form_to_give():
    assert refusal("train", "optim.betas=3") == "optim.betas=3 must be a list (the config has optim.betas=[0.9, 0.99])"
    assert refusal("train", "optim.lr=abc") == "optim.lr=abc must be a number (the config has optim.lr=0.003)"
    assert refusal("train", "experiment=induction", "train.max_steps=x") == (
        "train.max_steps=x must be a whole number (the config has train.max_steps=2000)")  # as composed, the preset's
    assert refusal("sample", "top_k=lots") == "top_k=lots must be a whole number"  # null there: no form to copy


def test_a_number_stays_as_given_and_null_turns_top_k_and_top_p_off():
    cfg = composed("train", "optim.lr=1", "model.dropout=0.25")
    assert (cfg.optim.lr, type(cfg.optim.lr), cfg.model.dropout) == (1, int, 0.25)
    sample = composed("sample", "top_k=null", "top_p=null")
    assert (sample.top_k, sample.top_p) == (None, None)


def test_a_choice_is_its_word_in_code_and_a_plain_string_in_the_checkpoint(tmp_path):
    cfg = composed("train", "model.pos=learned")
    assert cfg.model.pos == "learned" and f"{cfg.model.pos}" == "learned" and str(Position.rope) == "rope"
    config = plain_config(cfg)
    assert type(config["model"]["pos"]) is str and type(config["train"]["dtype"]) is str
    torch.save({"config": config}, tmp_path / "ckpt.pt")
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["config"] == config  # weights_only admits no Enum


def saved_config(*overrides: str) -> dict:
    return plain_config(composed("train", *overrides))


def test_a_resumed_config_is_typed_and_takes_the_allowed_overrides():
    cfg = composed("train", "optim.schedule=cosine", "train.max_steps=2000")
    cfg.resume = "run"
    resumed, changes = resumed_config(cfg, saved_config(), ["resume=run", "optim.schedule=cosine", "train.max_steps=2000"])
    assert changes == ["optim.schedule wsd -> cosine", "train.max_steps 800 -> 2000"]
    assert OmegaConf.get_type(resumed.model) is ModelSchema and resumed.resume == "run"
    assert plain_config(resumed) == {**saved_config("optim.schedule=cosine", "train.max_steps=2000"), "resume": "run"}


def resumed_with(saved: dict, *overrides: str, text_hashed: bool = False) -> list[str]:
    """The changes resume=run with overrides makes to a run saved with the config saved."""
    cfg = composed("train", *overrides)
    cfg.resume = "run"
    return resumed_config(cfg, saved, ["resume=run", *overrides], text_hashed)[1]


@pytest.mark.parametrize("override, fixed", [
    ("optim.name=adamw", "optim.name"), ("init_from=gpt2", "init_from"), ("data.val_fraction=0.2", "data"),
    ("model.n_layer=3", "model"), ("++model.n_layer=3", "model"), ("tokenizer=char", "tokenizer")])
def test_a_resumed_run_keeps_its_network_tokens_text_optimizer_and_weights(override, fixed):
    with pytest.raises(UserError, match=rf"^resume: .* would change the {fixed} this run was trained with"):
        resumed_with(saved_config(), override)


def test_a_resumed_run_may_change_how_it_runs_its_attention_included_however_the_key_is_written():
    assert resumed_with(saved_config(), "model.attention=manual", "++train.max_steps=20", "++model.dropout=0.1") == [
        "model.attention sdpa -> manual", "train.max_steps 800 -> 20", "model.dropout 0.0 -> 0.1"]


def test_a_resumed_run_compares_each_key_a_preset_sets_and_takes_the_ones_it_may_change():
    # experiment=<preset> is one override that sets many keys: each was read as "experiment", which
    # no run config holds, so a preset's values were dropped without a word.
    with pytest.raises(UserError, match=r"^resume: tokenizer \(from experiment=induction\) would change the tokenizer "):
        resumed_with(saved_config(), "experiment=induction")  # a group the preset chooses
    with pytest.raises(UserError, match=r"^resume: model.norm=layernorm \(from experiment=induction\) would change the "
                                        r"model this run was trained with \(rmsnorm\)"):
        resumed_with(saved_config("experiment=induction", "model.norm=rmsnorm"), "experiment=induction")
    # The same command again (resume=auto) changes nothing; a value given beside the preset holds.
    assert resumed_with(saved_config("experiment=induction", "optim.lr=1e-3"), "experiment=induction", "optim.lr=1e-3") == []
    assert resumed_with(saved_config("experiment=induction", "optim.lr=1e-3", "train.max_steps=50"), "experiment=induction") == [
        "optim.lr 0.001 -> 0.006", "train.max_steps 50 -> 2000"]


@pytest.mark.slow  # the shared trained run
def test_a_preset_from_a_config_dir_given_on_resume_is_compared_key_by_key_too(trained_run, tmp_path):
    # Presets were read from configs/experiment/ only: one of --config-dir's was dropped without a word.
    (tmp_path / "extra" / "experiment").mkdir(parents=True)
    (tmp_path / "extra" / "experiment" / "mine.yaml").write_text("# @package _global_\nmodel:\n  n_layer: 3\n")
    result = run_cli("train.py", f"resume={trained_run}", "--config-dir", "extra", "experiment=mine", cwd=tmp_path)
    assert_one_error_line(result, "error: resume: model.n_layer=3 (from experiment=mine) would change the model this run was "
                                  "trained with (2); start a new run for that instead")


def test_a_resumed_run_of_a_text_file_takes_the_same_file_however_spelt_and_another_only_if_its_text_is_checked(
        tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "book.txt").write_text("a book")
    saved = saved_config("data=text", f"data.path={tmp_path / 'book.txt'}")  # as train.py saves it: whole
    for same in ("book.txt", '"~/book.txt"', "./sub/../book.txt"):  # ~ quoted, as Hydra needs it (tests/test_bad_input.py)
        assert resumed_with(saved, "data=text", f"data.path={same}") == []
    with pytest.raises(UserError, match="would change the data this run was trained with"):
        resumed_with(saved, "data=text", "data.path=other.txt")  # no hash to check another file's text by
    assert resumed_with(saved, "data=text", 'data.path="~/moved.txt"', text_hashed=True) == [
        f"data.path {tmp_path / 'book.txt'} -> {tmp_path / 'moved.txt'}"]  # saved whole, the ~ expanded
    with pytest.raises(UserError, match=r"^resume: data.path=book.txt would change the data this run was trained with \(null\)"):
        resumed_with(saved_config(), "data.path=book.txt")  # the stories read no file


def test_a_checkpoint_saved_before_smear_eval_train_muons_options_and_data_names_resumes_as_it_was_trained():
    cfg = composed("train")
    cfg.resume = "old"
    old = saved_config("model.smear=true", "train.eval_train=false")
    del old["model"]["smear"], old["train"]["eval_train"], old["optim"]["ns_dtype"], old["optim"]["muon_momentum"]
    del old["data"]["names"], old["data"]["word_games"]
    for key in ("save_interval", "parallel", "keep_checkpoints", "attn_log_at_start"):
        del old["train"][key]
    old = upgrade(Checkpoint(model={}, config=old, tokenizer={})).config  # as Checkpoint.load hands it over
    resumed, changes = resumed_config(cfg, old, ["resume=old"])
    assert resumed.model.smear is False and resumed.train.eval_train is True and changes == []
    assert resumed.data.names == "common" and resumed.data.word_games == 0  # the stories before names=random and games
    # As the loop ran before each key: saves at evaluations alone, DDP, nothing kept, maps drawn at step 0.
    assert (resumed.train.save_interval, resumed.train.parallel, resumed.train.keep_checkpoints,
            resumed.train.attn_log_at_start) == (0, "ddp", [], True)
    assert resumed.optim.ns_dtype == "bfloat16" and resumed.optim.muon_momentum == 0.95  # torch.optim.Muon's
    resumed, changes = resumed_config(cfg, old, ["resume=old", "optim.ns_dtype=auto"])  # how to compute: may change
    assert resumed.optim.ns_dtype == "auto" and changes == ["optim.ns_dtype bfloat16 -> auto"]


@pytest.mark.parametrize("corpus", [["data=stories"], ["data=text", "data.path=book.txt"], ["data=shakespeare"]])
def test_a_run_of_every_corpus_resumes_as_it_was_trained(corpus):
    # The keys added for older checkpoints (model_io/checkpoint.py) are the keys of the run's own corpus:
    # the stories' data.names given to a run of text files was refused, and no such run could resume.
    cfg = composed("train", *corpus)
    cfg.resume = "run"
    saved = upgrade(Checkpoint(model={}, config=saved_config(*corpus), tokenizer={})).config  # as Checkpoint.load hands it over
    resumed, changes = resumed_config(cfg, saved, ["resume=run"])
    assert changes == [] and plain_config(resumed) == {**saved_config(*corpus), "resume": "run"}


def test_a_checkpoint_whose_config_lacks_a_newer_key_is_refused_naming_the_key():
    cfg = composed("train")
    cfg.resume = "old"
    old = saved_config()
    del old["model"]["qk_norm"], old["debug"]  # debug says how to run, not what was run: it may be absent
    with pytest.raises(UserError, match=r"^resume=old: this checkpoint's config has no model.qk_norm \(it was saved "
                                        r"by an older version\); start a new run, or sample from it$"):
        resumed_config(cfg, old, ["resume=old"])
    wrong = saved_config()
    wrong["model"]["pos"] = "alibi"
    with pytest.raises(UserError, match=r"\(model.pos=alibi must be one of learned, rope\)"):
        resumed_config(cfg, wrong, ["resume=old"])


def test_a_sweeps_jobs_are_expanded_in_the_order_hydras_basic_sweeper_runs_them():
    # cli/sweep_check.py checks each job before the first runs; "job #n" must name the job Hydra numbers n.
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    task = ["model.n_head=2,4", "train.batch_size=8,16,32", "optim.lr=1e-3", "+model.extra=a,b", "tokenizer=char",
            "model.n_head=4,8"]  # a key given twice
    hydras = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(task), None)[0]
    assert job_overrides(task) == [list(job) for job in hydras]
    assert len(hydras) == 12 and hydras[1] == ["model.n_head=4", "train.batch_size=8", "optim.lr=0.001", "+model.extra=b",
                                               "tokenizer=char"]


def test_a_window_that_hides_nothing_is_refused_for_a_new_model_and_left_to_a_resumed_one():
    # A run saved before the check keeps its model on resume: refusing it would leave no way on.
    cfg = tiny_config(**{"model.pos": "learned", "model.block_size": 16, "model.window": 16})
    with pytest.raises(UserError, match=r"^model.window=16 hides nothing: no query sees more than model.block_size=16"):
        validate_train_config(cfg)
    validate_train_config(cfg, new_model=False)
    validate_train_config(tiny_config(**{"model.pos": "rope", "model.block_size": 16, "model.window": 16}))


@pytest.mark.parametrize(("key", "edge", "past"), [
    ("optim.decay_fraction", 1.0, 1.01),  # (0, 1]: decaying over the whole run is allowed
    ("data.val_fraction", 0.9, 1.0),  # (0, 1): a train split is left
    ("data.n_chars", 10_000, 9_999),  # the stories' least, as its line says
    ("model.norm_eps", 1e-12, 0.0),  # a positive eps, or null: 0 could divide by 0
    ("train.max_steps", 1, 0),  # 0 only with init_from: random weights trained for no step are no model
])
def test_each_range_takes_its_edge_and_refuses_the_value_past_it(key, edge, past):
    validate_train_config(tiny_config(**{key: edge}))
    with pytest.raises(UserError, match=f"^{re.escape(key)}={past}"):
        validate_train_config(tiny_config(**{key: past}))


def test_a_bpe_of_the_256_bytes_alone_is_allowed_and_one_fewer_refused():
    validate_train_config(composed_train_config(["tokenizer=bpe", "tokenizer.vocab_size=256"]))
    with pytest.raises(UserError, match="^tokenizer.vocab_size=255 must be"):
        validate_train_config(composed_train_config(["tokenizer=bpe", "tokenizer.vocab_size=255"]))
