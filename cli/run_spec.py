"""The door: the composed and checked config becomes one frozen RunSpec (training/specs.py), the
only thing train.py hands the code below it."""

import functools
from pathlib import Path
from typing import Any

from cli.config import composed_train_config, plain_config
from data.specs import CorpusSpec, TokenizerSpec
from model_io.checkpoint import model_spec
from training.specs import DeviceSpec, LoopSpec, OptimSpec, ProbeSpec, RunSpec, StartSpec, StepSpec


def run_spec(cfg: Any, weights: Path | None = None, text_key: str | None = None) -> RunSpec:
    """cfg: the config as cli/config.py checked it (a resumed run's, or with init_from the weights'
    shape and tokenizer); weights: the folder a new run with init_from loads (cli/config.py
    pretrained_config found it), None for random weights or a resumed run's; text_key: a resumed
    run's hash of the text it trained on (its checkpoint's run state), None for a new run."""
    config = plain_config(cfg)
    model, data, optim, train = config["model"], config["data"], config["optim"], config["train"]
    keep = train["keep_checkpoints"]
    return RunSpec(
        model=model_spec(model),
        corpus=CorpusSpec.of({**data, "text_key": text_key}),
        tokenizer=TokenizerSpec.of(config["tokenizer"]),
        optim=OptimSpec(**{key: value for key, value in optim.items() if key != "grad_clip"}
                        | {"betas": tuple(optim["betas"])}),
        step=StepSpec(batch_size=train["batch_size"], block_size=model["block_size"],
                      grad_accum_steps=train["grad_accum_steps"], grad_clip=optim["grad_clip"],
                      skip_nonfinite=train["skip_nonfinite"]),
        loop=LoopSpec(max_steps=train["max_steps"], seed=train["seed"], eval_interval=train["eval_interval"],
                      eval_iters=train["eval_iters"], eval_at_start=train["eval_at_start"],
                      eval_train=train["eval_train"], log_interval=train["log_interval"],
                      save_interval=train["save_interval"],
                      keep_checkpoints=keep if isinstance(keep, str) else tuple(keep or ())),
        probes=ProbeSpec(attn_log_interval=train["attn_log_interval"], attn_log_at_start=train["attn_log_at_start"],
                         probe_tokens=train["probe_tokens"],
                         seed=train["seed"],
                         # held-out stories of another seed, where names come back: the built-in stories only
                         recall_seed=data["seed"] + 1 if data["source"] == "stories" else None,
                         sample_interval=train["sample_interval"], sample_tokens=train["sample_tokens"],
                         sample_temperature=train["sample_temperature"]),
        device=DeviceSpec(device=train["device"], dtype=train["dtype"], compile=train["compile"],
                          parallel=train["parallel"]),
        start=StartSpec(init_from=config["init_from"], weights=weights),
        debug=config.get("debug"),
    )


@functools.cache
def composed_run_spec(*overrides: str) -> RunSpec:
    """The spec train.py builds from configs/ and these overrides for a new run of random weights (none:
    the default run's), for code that builds a run or a part of it without a command line (bench/, docs/):
    the presets, schemas and interpolations apply as they do for train.py."""
    return run_spec(composed_train_config(list(overrides)))
