"""The type of every config key, and the choices of the keys that pick from a list.

Hydra checks each value against these while it composes the config, before train.py or
sample.py runs: model.n_layer=abc, model.bias=maybe or model.pos=alibi stops there, and
cli/errors.py words the refusal. Here every key has a type and no value (`???`): the
values, and what each key means, live in configs/ alone. The ranges (at least 1, in [0, 1),
...) are checked in cli/config.py.

Each schema is stored in Hydra's ConfigStore when this module is imported (cli/config.py
imports it). configs/train.yaml extends it through its defaults list (sample.py's and export.py's
schemas: cli/checkpoint_commands.py); so does each option of the groups whose options have different keys (data, tokenizer),
e.g. configs/data/stories.yaml starts with `- /data_stories_schema@_here_`. The schemas are
stored outside any group so that `--help` does not list them as options.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from cli.checkpoint_commands import Number  # one definition, beside sample.py's schema
from data.stories import NAME_KINDS
from model.attention import ATTENTION_PATHS
from model.gpt import MLPS, NORMS, POSITIONS
from runtime.precision import DTYPES
from training.data_parallel import PARALLELS
from training.lr_schedule import SCHEDULES
from training.optimizer import NS_DTYPES, OPTIMIZERS


class Choice(str, Enum):
    """A value picked from a fixed list. It is a str, so cfg.model.pos == "rope" holds, and it
    prints as its value; name and value are the same word, so the YAML Hydra writes and
    plain_config() (cli/config.py) hold that word."""

    def __str__(self) -> str:  # f-strings use it too
        return self.value

    @classmethod
    def refusal(cls, key: str, value: Any) -> str:
        """The error for a value that is not one of the choices."""
        return f"{key}={value} must be one of {', '.join(cls)}"


def choices(name: str, values: Iterable[str]) -> type[Choice]:
    """A Choice of the values, in their order, from the list the code that uses them keeps."""
    return Choice(name, [(value, value) for value in values], module=__name__, qualname=name)


Attention = choices("Attention", ATTENTION_PATHS)
Position = choices("Position", POSITIONS)
Norm = choices("Norm", NORMS)
MLP = choices("MLP", MLPS)
Optimizer = choices("Optimizer", OPTIMIZERS)
NSDtype = choices("NSDtype", NS_DTYPES)
Schedule = choices("Schedule", SCHEDULES)
Dtype = choices("Dtype", DTYPES)
Parallel = choices("Parallel", PARALLELS)
Names = choices("Names", NAME_KINDS)


class DebugMode(Choice):
    shapes = "shapes"  # every tensor's shape through one forward, then stop

    @classmethod
    def refusal(cls, key: str, value: Any) -> str:
        return f"{key}={value} is not a debug mode; the one there is: debug=shapes"


@dataclass
class ModelSchema:
    n_layer: int = MISSING
    n_head: int = MISSING
    n_embd: int = MISSING
    block_size: int = MISSING
    dropout: Number = MISSING
    bias: bool = MISSING
    attention: Attention = MISSING
    pos: Position = MISSING
    norm: Norm = MISSING
    mlp: MLP = MISSING
    tie_head: bool = MISSING
    qk_norm: bool = MISSING
    smear: bool = MISSING
    n_kv_head: int | None = MISSING
    head_dim: int | None = MISSING
    window: int | None = MISSING
    mlp_hidden: int | None = MISSING
    rope_theta: Number = MISSING
    rope_scaling: Any = MISSING  # null, or the four numbers of Llama 3.1's scaling: checked in cli/config.py (OmegaConf 2.3
    # cannot merge a dict given on the command line into a typed dict that is null)
    norm_eps: Number | None = MISSING


@dataclass
class TextSchema:
    """The keys every corpus has; the other two corpora add their own."""

    source: str = MISSING
    path: str | None = MISSING
    val_fraction: Number = MISSING
    cache_dir: str = MISSING


@dataclass
class StoriesSchema(TextSchema):
    seed: int = MISSING
    n_chars: int = MISSING
    names: Names = MISSING
    word_games: Number = MISSING


@dataclass
class TextFilesSchema(TextSchema):
    text_field: str = MISSING


@dataclass
class ShakespeareSchema(TextSchema):
    url: str = MISSING
    sha256: str = MISSING


@dataclass
class BPESchema:
    kind: str = MISSING
    vocab_size: int = MISSING


@dataclass
class CharSchema:
    kind: str = MISSING


@dataclass
class GPT2Schema:
    kind: str = MISSING
    url: str | None = MISSING


@dataclass
class OptimSchema:
    name: Optimizer = MISSING
    lr: Number = MISSING
    min_lr: Number = MISSING
    schedule: Schedule = MISSING
    decay_fraction: Number = MISSING
    warmup_steps: int = MISSING
    weight_decay: Number = MISSING
    betas: list[Any] = MISSING  # two Numbers, checked with their range (OmegaConf 2.3 hands out a list's
    # int | float items as nodes, not numbers)
    grad_clip: Number = MISSING
    muon_momentum: Number = MISSING
    ns_dtype: NSDtype = MISSING


@dataclass
class LoopSchema:
    max_steps: int = MISSING
    batch_size: int = MISSING
    grad_accum_steps: int = MISSING
    eval_interval: int = MISSING
    save_interval: int = MISSING
    keep_checkpoints: Any = MISSING  # a list of whole numbers, or the word log: checked in cli/config.py (OmegaConf
    # has no type for "a list or a word")
    eval_iters: int = MISSING
    eval_at_start: bool = MISSING
    eval_train: bool = MISSING
    log_interval: int = MISSING
    attn_log_interval: int = MISSING
    attn_log_at_start: bool = MISSING
    sample_interval: int = MISSING
    sample_tokens: int = MISSING
    sample_temperature: Number = MISSING
    probe_tokens: int = MISSING
    device: str = MISSING
    dtype: Dtype = MISSING
    compile: bool = MISSING
    parallel: Parallel = MISSING
    skip_nonfinite: bool = MISSING
    seed: int = MISSING


# The options of the groups whose keys differ from option to option, by the name of the
# option, which is also the value of its data.source or tokenizer.kind.
DATA_SCHEMAS = {"stories": StoriesSchema, "shakespeare": ShakespeareSchema, "text": TextFilesSchema}
@dataclass
class PretrainedSchema:
    """The tokenizer of the weights init_from starts from: no config option picks it, train.py sets it."""

    kind: str = MISSING
    path: str = MISSING  # the Hugging Face folder (vocab.json and merges.txt, or tokenizer.json)
    files_sha256: str = MISSING  # of those files: a changed folder never reuses cached ids


TOKENIZER_SCHEMAS = {"bpe": BPESchema, "char": CharSchema, "gpt2": GPT2Schema, "pretrained": PretrainedSchema}


@dataclass
class TrainSchema:
    # A group with one schema holds it from the start (a MISSING one would trip OmegaConf 2.3's
    # merge of its int | float fields when Hydra composes).
    model: ModelSchema = field(default_factory=ModelSchema)
    data: Any = MISSING  # one of DATA_SCHEMAS, named by configs/data/<option>.yaml
    tokenizer: Any = MISSING  # one of TOKENIZER_SCHEMAS, named by configs/tokenizer/<option>.yaml
    optim: OptimSchema = field(default_factory=OptimSchema)
    train: LoopSchema = field(default_factory=LoopSchema)
    resume: str | None = MISSING
    init_from: str | None = MISSING
    debug: DebugMode | None = MISSING


def typed_train_config(config: dict[str, Any]) -> DictConfig:
    """A saved run's plain config, checked against the schemas of its own data and tokenizer
    options as Hydra checks a new one; a key it lacks is left missing (???)."""
    schema = TrainSchema(data=DATA_SCHEMAS[config["data"]["source"]](), tokenizer=TOKENIZER_SCHEMAS[config["tokenizer"]["kind"]]())
    return OmegaConf.merge(OmegaConf.structured(schema), config)


store = ConfigStore.instance()
store.store(name="train_schema", node=TrainSchema)
for group, options in (("data", DATA_SCHEMAS), ("tokenizer", TOKENIZER_SCHEMAS)):
    for option, node in options.items():
        store.store(name=f"{group}_{option}_schema", node=node)
