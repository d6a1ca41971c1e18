"""The config's checks: the range of every value (types and choices are checked earlier, by
Hydra, against cli/schema.py), and a resumed run's config."""

import hashlib
import math
from dataclasses import fields
from enum import Enum
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError

from cli.checkpoint_commands import MOST_SAMPLED_TOKENS, check_sampling
from cli.errors import CONFIGS, refused_value_line
from cli.schema import typed_train_config
from model.attention import ROPE_SCALING_KEYS, head_split_problem, rope_scaling_problem
from model.gpt import GPTConfig
from model_io.hf_models import gpt_config_from_hf, resolve_pretrained
from model_io.run_files import LOG_SPACED
from user_error import UserError, as_typed, require

SEEDS = 2**32  # train.seed seeds numpy too, whose seeds are 0 .. 2**32 - 1
FLOAT32_TINY = 1.1754943508222875e-38  # torch.finfo(torch.float32).tiny: under it float32 loses precision, then all of it


def validate_train_config(cfg: Any, new_model: bool = True) -> None:
    """UserError for the first value out of its range, naming it and a fix. new_model: False for a
    resumed run, whose model is the saved one (a check of a model's shape added since it was saved
    would refuse a run that can no longer change it)."""
    optim, train = cfg.optim, cfg.train
    validate_model_config(cfg.model, new_model)
    require(0 < optim.lr < math.inf, f"optim.lr={optim.lr} must be a number greater than 0, e.g. optim.lr=1e-3")
    for key, example in (("lr", "optim.lr=1e-3"), ("grad_clip", "optim.grad_clip=1.0, or 0 for none")):  # denormals
        require(not 0 < optim[key] < FLOAT32_TINY, f"optim.{key}={optim[key]} is under float32's smallest normal number "
                f"({FLOAT32_TINY:.3g}): float32 holds it as 0, or with a few bits of precision; give one such as {example}")
    require(0 < optim.decay_fraction <= 1, f"optim.decay_fraction={optim.decay_fraction} must be in (0, 1], e.g. 0.2")
    require(0 <= optim.min_lr <= optim.lr, f"optim.min_lr={optim.min_lr} must be between 0 and optim.lr={optim.lr}")
    require(optim.weight_decay >= 0, f"optim.weight_decay={optim.weight_decay} must be 0 or more")
    require(optim.warmup_steps >= 0, f"optim.warmup_steps={optim.warmup_steps} must be 0 or more")
    require(optim.grad_clip >= 0, f"optim.grad_clip={optim.grad_clip} must be 0 (off) or more")
    require(0 <= optim.muon_momentum < 1, f"optim.muon_momentum={optim.muon_momentum} must be in [0, 1), e.g. optim.muon_momentum=0.95")
    betas = list(optim.betas)
    require(len(betas) == 2 and all(isinstance(b, int | float) and 0 <= b < 1 for b in betas),
            f"optim.betas={betas} must be two numbers in [0, 1), e.g. optim.betas=[0.9,0.99]")
    require(train.max_steps >= 1 or (train.max_steps == 0 and cfg.init_from),
            f"train.max_steps={train.max_steps} must be at least 1 (0 only with init_from: the weights as they came)")
    for key in ("batch_size", "grad_accum_steps", "eval_interval", "eval_iters", "log_interval", "probe_tokens"):
        require(train[key] >= 1, f"train.{key}={train[key]} must be at least 1")
    require(train.save_interval >= 0, f"train.save_interval={train.save_interval} must be 0 (only at evaluations) or more")
    check_keep_checkpoints(train.keep_checkpoints)
    for key in ("attn_log_interval", "sample_interval", "sample_tokens"):
        require(train[key] >= 0, f"train.{key}={train[key]} must be 0 (off) or more")
    require(train.sample_tokens <= MOST_SAMPLED_TOKENS,
            f"train.sample_tokens={train.sample_tokens} is more than one sample may be ({MOST_SAMPLED_TOKENS:,} tokens); ask for fewer")
    check_sampling("temperature", train.sample_temperature, "train.sample_temperature")
    require(0 <= train.seed < SEEDS, f"train.seed={train.seed} must be a whole number from 0 to {SEEDS - 1}")
    require(0 < cfg.data.val_fraction < 1, f"data.val_fraction={cfg.data.val_fraction} must be between 0 and 1, e.g. 0.1")
    require(bool(str(cfg.data.cache_dir).strip()),  # data.cache_dir= with nothing after it: the working folder
            "data.cache_dir= is empty; give the folder that keeps the token cache (the default is .cache)")
    if cfg.tokenizer.kind == "bpe":
        require(
            256 <= cfg.tokenizer.vocab_size <= 2**20,
            f"tokenizer.vocab_size={cfg.tokenizer.vocab_size} must be a whole number from 256 (the single bytes) to 1048576, "
            "e.g. tokenizer.vocab_size=2048",
        )
    if cfg.data.source == "stories":
        require(cfg.data.get("path") is None,  # a file given without data=text would be left unread
                f"data.path={cfg.data.path} is not read by data=stories, the built-in stories; add data=text to train on "
                "your file (data=shakespeare to read a local copy of tiny shakespeare)")
        require(cfg.data.n_chars >= 10_000,
                f"data.n_chars={cfg.data.n_chars} must be a whole number of at least 10000 (the default is 1000000)")
        require(cfg.data.word_games >= 0,
                f"data.word_games={cfg.data.word_games} must be 0 (no games) or more: the word games after each paragraph, on average (e.g. 9)")


def validate_new_run_config(cfg: Any, overrides: list[str]) -> None:
    """validate_train_config for a new run from these command-line overrides: a refused model value
    that the experiment preset set, not the command line, is said as set by that preset (a user
    who typed experiment=qwen3_shape model.n_head=3 never typed the model.n_kv_head=2 refused)."""
    try:
        validate_train_config(cfg)
    except UserError as error:
        raise UserError(with_its_preset(str(error), cfg, overrides)) from None


def with_its_preset(line: str, cfg: Any, overrides: list[str]) -> str:
    """line, a check's refusal; where it starts with model.<key>=<value> that the experiment preset
    on the command line set and the command line did not, with ", set by experiment=<preset>," after it."""
    typed, preset = command_line_choices(overrides)
    key = line.split("=", 1)[0].removeprefix("model.") if line.startswith("model.") else None
    if not preset or key is None or f"model.{key}" in typed or key not in cfg.model:
        return line
    given = f"model.{key}={as_typed(plain(cfg.model[key]))}"
    if not line.startswith(given) or plain(cfg.model[key]) != preset_model_values(preset).get(key, object()):
        return line
    return f"{given}, set by experiment={preset},{line.removeprefix(given)}"


def validate_model_config(model: Any, new_model: bool) -> None:
    """validate_train_config's checks of the model's shape and options (cfg.model)."""
    for key in ("n_layer", "n_head", "n_embd", "block_size"):
        require(model[key] >= 1, f"model.{key}={model[key]} must be at least 1")
    for key in ("n_kv_head", "head_dim", "window", "mlp_hidden"):
        require(model[key] is None or model[key] >= 1, f"model.{key}={model[key]} must be at least 1, or null")
    problem = head_split_problem(model.n_embd, model.n_head, model.n_kv_head, model.head_dim, key="model.")
    require(problem is None, problem or "")
    require(not new_model or model.window is None or model.window < model.block_size or model.pos == "rope",
            f"model.window={model.window} hides nothing: no query sees more than model.block_size={model.block_size} "
            f"tokens, and with model.pos={model.pos} generation never looks further back; pick a window under "
            f"{model.block_size}, or null")
    require(0 < model.rope_theta < math.inf, f"model.rope_theta={model.rope_theta} must be a number greater than 0, e.g. 10000")
    require(model.norm_eps is None or 0 < model.norm_eps < 1,
            f"model.norm_eps={model.norm_eps} must be a small number greater than 0, e.g. 1e-6, or null")
    check_rope_scaling(model.rope_scaling, model.pos)
    require(0 <= model.dropout < 1, f"model.dropout={model.dropout} must be in [0, 1), e.g. 0.1")
    head_size = model.n_embd // model.n_head if model.head_dim is None else model.head_dim
    require(model.pos != "rope" or head_size % 2 == 0,
            f"model.pos=rope needs an even head size (it turns each pair of dimensions); "
            f"{'model.head_dim' if model.head_dim else 'n_embd // n_head'} is {head_size}: make it even, e.g. "
            f"{f'model.head_dim={head_size + 1}' if model.head_dim else f'model.n_embd={(head_size + 1) * model.n_head}'}")


def check_rope_scaling(scaling: Any, pos: str) -> None:
    """model.rope_scaling: null, or Llama 3.1's four numbers as rope_speeds can use them, with rotary positions."""
    example = "'model.rope_scaling={factor:8,low_freq_factor:1,high_freq_factor:4,original_max_position_embeddings:8192}'"
    if scaling is None:
        return
    require(OmegaConf.is_dict(scaling) and set(scaling) == set(ROPE_SCALING_KEYS),
            f"model.rope_scaling={scaling} must be null or Llama 3.1's four positive numbers, e.g. {example}")
    require(pos == "rope", f"model.rope_scaling={scaling} scales rotary positions, and model.pos={pos}; drop it, or "
                           "set model.pos=rope")
    if problem := rope_scaling_problem(dict(scaling)):
        name, reason = problem
        raise UserError(f"model.rope_scaling.{name}={scaling[name]}: {reason}, e.g. {example}")


# Each kept checkpoint is a whole copy of the weights: a list longer than this is more likely a
# mistake than a plan (train.keep_checkpoints=log keeps 32 at a billion steps).
MAX_KEPT_CHECKPOINTS = 200


def check_keep_checkpoints(keep: Any) -> None:
    """train.keep_checkpoints: [] (off), a list of steps of at least 0, or log."""
    shown = "[" + ",".join(str(step) for step in keep) + "]" if OmegaConf.is_list(keep) else keep
    usage = "give a list of steps, e.g. train.keep_checkpoints=[0,50,100], or train.keep_checkpoints=log"
    if keep is None or keep == LOG_SPACED:
        return
    require(OmegaConf.is_list(keep),
            f"train.keep_checkpoints={shown} is neither a list of steps nor {LOG_SPACED}: {usage}"
            + (f" (train.keep_checkpoints=[{keep}] keeps step {keep} alone)" if type(keep) is int and keep >= 0 else ""))
    for step in keep:
        require(type(step) is int, f"train.keep_checkpoints={shown} holds {step}, which is not a whole number of steps; {usage}")
        require(step >= 0, f"train.keep_checkpoints={shown} holds {step}: a step is 0 (the weights before any update) or more")
    count = len(set(keep))
    require(count <= MAX_KEPT_CHECKPOINTS,
            f"train.keep_checkpoints lists {count} steps, more than the {MAX_KEPT_CHECKPOINTS} a run keeps (each is a "
            f"whole copy of the weights); list fewer, or train.keep_checkpoints={LOG_SPACED}")


# What a resumed run may not change: the network, its tokens, the text it learns from, and
# which optimizer holds its state. (model.dropout and model.attention change no weight: a run may
# go on with others, as a run from pretrained weights may choose them.)
FIXED_ON_RESUME = ("model", "tokenizer", "data", "optim.name", "init_from")
FREE_ON_RESUME = ("model.dropout", "model.attention", "data.cache_dir")  # (the cache: where, not what)


def changes_setting(key: str, new: Any, old: Any) -> bool:
    """Whether new, given for key, differs from a run's saved old (changes_in)."""
    return bool(changes_in(key, new, old))


def changes_in(key: str, new: Any, old: Any) -> list[tuple[str, Any, Any]]:
    """Each (key, new, old) where new, given for key, differs from a run's saved old. A data.path
    naming the same file from another folder is no change (a run saves its path whole: train.py);
    a group chosen again (data=text data.path=book.txt) changes where its values do, each named."""
    if key == "data.path" and isinstance(new, str) and isinstance(old, str):
        return [] if Path(new).expanduser().resolve() == Path(old).resolve() else [(key, new, old)]
    if isinstance(new, dict) and isinstance(old, dict) and new.keys() == old.keys():
        return [change for name in new for change in changes_in(f"{key}.{name}", new[name], old[name])]
    return [] if new == old else [(key, new, old)]


def keys_set_by(override: str) -> list[str]:
    """The keys an override gives: its own, or for experiment=<preset> each key the preset's file
    sets and each group it chooses (a resumed run compares them one by one with its own)."""
    key, _, name = override.partition("=")
    key = key.lstrip("+~")
    path = preset_file(name) if key == "experiment" else None
    if path is None:
        return [key]
    preset = OmegaConf.to_container(OmegaConf.load(path))
    groups = [choice.split("/")[-1] for entry in preset.pop("defaults", []) if isinstance(entry, dict) for choice in entry]
    preset.pop("hydra", None)

    def leaves(node: Any, prefix: str) -> list[str]:
        if not isinstance(node, dict):
            return [prefix]
        return [leaf for name, value in node.items() for leaf in leaves(value, f"{prefix}.{name}" if prefix else name)]

    return [*groups, *leaves(preset, "")]


def preset_file(name: str) -> Path | None:
    """The file of experiment=<name>: the first experiment/<name>.yaml along Hydra's search path, a
    --config-dir's among its folders, as Hydra found it; configs/ alone outside a command."""
    folders = [CONFIGS]
    if HydraConfig.initialized():
        folders = [Path(source.path) for source in HydraConfig.get().runtime.config_sources if source.schema == "file"]
    return next((path for folder in folders if (path := folder / "experiment" / f"{name}.yaml").is_file()), None)


def resumed_config(cfg: Any, saved: dict[str, Any], overrides: list[str], text_hashed: bool = False) -> tuple[Any, list[str]]:
    """The saved run's config, with the command line's overrides that differ from it applied.
    Returns (config, ["train.max_steps 1500 -> 3000", ...]); UserError for an override
    that would change the model, tokenizer or data.
    text_hashed: the checkpoint keeps a hash of its text, so data.path may change (a moved corpus,
    another machine's path): the text read there is refused unless it is the same."""
    resumed = checked_saved_config(saved, cfg.resume)
    free = (*FREE_ON_RESUME, "data.path") if text_hashed else FREE_ON_RESUME
    changes = []
    given = [(override, key) for override in overrides for key in keys_set_by(override)]
    for override, key_given in given:
        if key_given == "resume" or key_given.startswith("hydra"):
            continue
        new_value, old_value = plain(OmegaConf.select(cfg, key_given)), plain(OmegaConf.select(resumed, key_given))
        for key, new, old in changes_in(key_given, new_value, old_value):
            fixed = next((f for f in FIXED_ON_RESUME if key == f or key.startswith(f + ".") or f.startswith(key + ".")), None)
            asked = f"{key}={as_typed(new)}" if "." in key else override  # the value that holds, where a key came twice
            if not override.lstrip("+~").startswith(f"{key_given}="):  # a key of experiment=<preset>'s
                asked = f"{asked if '.' in key else key} (from {override})"
            require(
                fixed is None or key in free,
                f"resume: {asked} would change the {fixed} this run was trained with"
                f"{f' ({as_typed(old)})' if '.' in key else ''}; start a new run for that instead",
            )
            if key == "data.path" and new:  # kept whole, as a new run keeps it (train.py)
                new = str(Path(new).expanduser().absolute())
            OmegaConf.update(resumed, key, new, merge=False, force_add=True)
            changes.append(f"{key} {old} -> {new}")
    return resumed, changes


def checked_run_config(cfg: Any, overrides: list[str], saved: dict[str, Any] | None = None, text_hashed: bool = False,
                       folder: Path | None = None) -> tuple[Any, list[str], Path | None]:
    """A run's config as it starts, checked: by train.py, and by a sweep's check of each job before
    any runs (cli/sweep_check.py). saved: the config of the checkpoint it goes on from, whose values
    the overrides may change where a resume allows (text_hashed: resumed_config's); None: a new run,
    in init_from's shape where it has one (folder: init_from's, where it is already found). Returns
    (the config, its changes for the log, the weights' folder of a new run from init_from or None)."""
    if saved is not None:
        resumed, changes = resumed_config(cfg, saved, overrides, text_hashed)
        check_text_still_there(resumed, saved, text_hashed)
        validate_train_config(resumed, new_model=False)
        return resumed, changes, None
    weights, changes = None, []
    if cfg.init_from is not None:  # a new run from pretrained weights: their shape, their tokenizer
        weights, changes = pretrained_config(cfg, overrides, folder)
    validate_new_run_config(cfg, overrides)
    return cfg, changes, weights


def check_text_still_there(resumed: Any, saved: dict[str, Any], text_hashed: bool) -> None:
    """UserError, in one line, for a resumed run whose text file (data.path, as saved) is no longer where it
    was, saying how to go on: give its new place, where the checkpoint keeps a hash to check the text by. (A
    new data.path given on the command line is checked as any is, when the corpus is read.)"""
    path = OmegaConf.select(resumed, "data.path")
    unchanged = path == saved.get("data", {}).get("path") and resumed.data.source != "stories"  # (stories read no file)
    if path and unchanged and not Path(path).expanduser().exists():
        how = (f"if it moved, give resume={resumed.resume} data.path=<where it is now> (the text is checked against the "
               "run's)" if text_hashed else "put it back there (this checkpoint keeps no hash to check a moved one by)")
        raise UserError(f"resume: data.path={path}, the text this run trained on, does not exist; {how}")


# What the weights fix, and what a run starting from them may still choose (model.block_size
# crops the context; model.dropout and model.attention change no weight).
SHAPE_FROM_WEIGHTS = tuple(field.name for field in fields(GPTConfig)
                           if field.name not in ("vocab_size", "block_size", "dropout", "attention"))
MODEL_DEFAULTS = CONFIGS / "model" / "gpt.yaml"


def pretrained_config(cfg: Any, overrides: list[str], folder: Path | None = None) -> tuple[Path, list[str]]:
    """A new run with init_from: cfg's model group becomes the shape of the weights and its
    tokenizer theirs (in place). A model value asked for (on the command line, by the experiment
    preset, or by a config where it differs from configs/model/gpt.yaml) that contradicts the
    weights, or any tokenizer choice, is refused. Returns the weights' folder and notes for the
    log (a cropped context). folder: init_from's, where it is already found (a sweep's check)."""
    folder = folder or resolve_pretrained(cfg.init_from)
    typed, preset = command_line_choices(overrides)
    tokenizer_choice = next((typed[key] for key in typed if key == "tokenizer" or key.startswith("tokenizer.")), None)
    require(tokenizer_choice is None, f"init_from={cfg.init_from} brings its own tokenizer (from {folder}); "
                                      f"drop {tokenizer_choice}")
    defaults = OmegaConf.load(MODEL_DEFAULTS)
    preset_values = preset_model_values(preset) if preset else {}

    def asked(key: str) -> bool:
        return f"model.{key}" in typed or key in preset_values or plain(cfg.model[key]) != defaults[key]

    block_size = cfg.model.block_size if asked("block_size") else None
    shape, notes = gpt_config_from_hf(folder, block_size=block_size, dropout=cfg.model.dropout)
    for key in SHAPE_FROM_WEIGHTS:
        weights_value = getattr(shape, key)
        if asked(key) and plain(cfg.model[key]) != weights_value:
            given = f"model.{key}={as_typed(plain(cfg.model[key]))}"
            weights = f"the weights of init_from={cfg.init_from}, which have model.{key}={as_typed(weights_value)}"
            if f"model.{key}" not in typed and key in preset_values:  # a value the user did not type: say whence
                raise UserError(f"{given}, set by experiment={preset}, contradicts {weights}; leave experiment={preset} "
                                "out: with init_from the shape comes from the weights")
            raise UserError(f"{given} contradicts {weights}; drop it: the shape comes from the weights")
        cfg.model[key] = weights_value
    cfg.model.block_size = shape.block_size
    cfg.tokenizer = {"kind": "pretrained", "path": str(folder), "files_sha256": tokenizer_files_sha256(folder)}
    return folder, notes


def command_line_choices(overrides: list[str]) -> tuple[dict[str, str], str]:
    """The keys the command line set, each with its override as typed (+ and ~ aside), and the
    experiment preset it named ("" for none)."""
    typed = {override.split("=", 1)[0].lstrip("+~"): override for override in overrides}
    return typed, typed.get("experiment", "").split("=", 1)[-1]


def preset_model_values(preset: str, folder: Path = CONFIGS / "experiment") -> dict[str, Any]:
    """The model values folder/<preset>.yaml sets, the presets it extends included (mistral_shape
    extends llama_shape), in Hydra's order: its own values where _self_ stands in its defaults list,
    else last. {} for a preset from elsewhere."""
    path = folder / f"{preset}.yaml"
    if not path.is_file():
        return {}
    own = OmegaConf.load(path)
    defaults = list(own.get("defaults", []))
    values: dict[str, Any] = {}
    for entry in defaults if "_self_" in defaults else [*defaults, "_self_"]:
        if entry == "_self_":
            values.update(plain(own.get("model", {})))
        elif isinstance(entry, str) and "/" not in entry:  # another preset of the group
            values.update(preset_model_values(entry, folder))
    return values


def tokenizer_files_sha256(folder: Path) -> str:
    """One hash of the tokenizer files a Hugging Face folder holds (tokenizer_config.json says whether a
    start token comes first)."""
    names = [name for name in ("tokenizer.json", "vocab.json", "merges.txt") if (folder / name).is_file()]
    require(bool(names), f"{folder} has no tokenizer: a Hugging Face folder holds tokenizer.json (or GPT-2's "
                         f"vocab.json and merges.txt)")
    if (folder / "tokenizer_config.json").is_file():
        names.append("tokenizer_config.json")
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode() + (folder / name).read_bytes())
    return digest.hexdigest()


def checked_saved_config(saved: dict[str, Any], resume: str) -> DictConfig:
    """The checkpoint's config, typed and checked against cli/schema.py as a new run's is (Checkpoint.load has
    added the keys that came after it was saved)."""
    fix = "start a new run, or sample from it"
    try:
        resumed = typed_train_config({"debug": None, **saved, "resume": resume})  # how to run, not what was run
    except OmegaConfBaseException as err:  # a key or value this version does not know
        detail = isinstance(err, ValidationError) and refused_value_line(err) or str(err).splitlines()[0]
        raise UserError(f"resume={resume}: this checkpoint's config does not fit this version of train.py ({detail}); {fix}") from None
    except KeyError as err:  # a data.source or tokenizer.kind this version has no schema for
        raise UserError(f"resume={resume}: this checkpoint's config names {err}, which this version of train.py does not know; {fix}") from None
    missing = sorted(OmegaConf.missing_keys(resumed))
    require(not missing, f"resume={resume}: this checkpoint's config has no {', '.join(missing)} (it was saved by an older version); {fix}")
    return resumed


def composed_train_config(overrides: list[str]) -> DictConfig:
    """The config train.py composes from configs/ and these overrides, for code that builds a run
    without its command line (the benchmark's GPU section)."""
    from hydra import compose, initialize_config_dir  # only here: train.py gets Hydra's from @hydra.main

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=overrides)


def plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    return plain_config(value) if OmegaConf.is_config(value) else value


def plain_config(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain dicts, lists, strings and numbers (a choice as its word), resolved:
    what a checkpoint, whose loading admits nothing else, and TensorBoard keep."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
