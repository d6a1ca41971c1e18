"""The config of the commands that read a checkpoint, sample.py and export.py: the type of every
key (stored in Hydra's ConfigStore when this module is imported, as cli/schema.py does for
train.py's) and sample.py's ranges. Apart from train.py's schema, so that sampling and exporting
import nothing of the training loop's (its schema names the optimizers and schedules it knows)."""

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import MISSING

from model.sampling import sampling_problem
from user_error import require

# OmegaConf's float turns 2 into 2.0 and accepts "3"; a Union keeps a number as given
# (temperature=1 stays 1, model.dropout=1.5 says 1.5) and refuses a string or true.
Number = int | float


@dataclass
class SampleSchema:
    run: str = MISSING
    prompt: str = MISSING
    max_new_tokens: int = MISSING
    temperature: Number = MISSING
    top_k: int | None = MISSING
    top_p: Number | None = MISSING
    num_samples: int = MISSING
    seed: int = MISSING
    use_kv_cache: bool = MISSING
    compile: bool = MISSING
    device: str = MISSING
    dtype: str = MISSING


@dataclass
class ExportSchema:
    run: str = MISSING
    out: str | None = MISSING
    force: bool = MISSING


# The most tokens sample.py and train.py's samples ask for at once (rows x new tokens; more is
# refused): their (rows, tokens) buffer alone is then 800 MB, and a CPU makes some thousands of
# tokens a second. A larger request is a slip of the keyboard, not a sample.
MOST_SAMPLED_TOKENS = 100_000_000


def check_sampling(setting: str, value: object, key: str | None = None) -> None:
    """UserError where generation cannot sample with this value of setting (model/sampling.py
    states each range), naming it as the command's key."""
    problem = sampling_problem(setting, value, key or setting)
    require(problem is None, problem)


def validate_sample_config(cfg: Any, vocab_size: int | None = None) -> None:
    """sample.py's counterpart of validate_train_config, called before the checkpoint is read (so a
    bad value is the only line printed), then again with its vocabulary, top_k's range."""
    for setting in ("max_new_tokens", "temperature", "top_k", "top_p", "num_samples", "seed"):
        check_sampling(setting, cfg[setting])
    require(cfg.num_samples * max(cfg.max_new_tokens, 1) <= MOST_SAMPLED_TOKENS,
            f"num_samples={cfg.num_samples} x max_new_tokens={cfg.max_new_tokens} is more than one command samples "
            f"({MOST_SAMPLED_TOKENS:,} tokens); ask for fewer")
    if vocab_size is not None:
        require(not cfg.top_k or cfg.top_k <= vocab_size,
                f"top_k={cfg.top_k} must be between 1 and the vocabulary size {vocab_size} (or 0: off)")
    require(cfg.use_kv_cache or not cfg.compile,
            "compile=true compiles the cached one-token step: drop use_kv_cache=false, or compile=true")


def prompt_as_typed(prompt: str) -> str:
    """sample.py's prompt as the command line spelt it: Hydra reads prompt=0.10 as the number 0.1
    and prompt=true as True before the schema turns them into the strings "0.1" and "True". A
    prompt Hydra read as text (quoted or not) is its value, escapes and quotes taken off."""
    parser, spelt = OverridesParser.create(), None
    for text in HydraConfig.get().overrides.task:  # the last prompt= given holds, as in the config
        override = parser.parse_override(text)
        if override.key_or_group == "prompt":
            spelt = None if isinstance(override.value(), str) else text.split("=", 1)[1]
    return prompt if spelt is None else spelt


store = ConfigStore.instance()
store.store(name="sample_schema", node=SampleSchema)
store.store(name="export_schema", node=ExportSchema)
