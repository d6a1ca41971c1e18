"""cli/run_spec.py: the composed config becomes one frozen RunSpec (training/specs.py, data/specs.py,
model/gpt.py's GPTConfig), and every value of the config reaches it unchanged."""

import dataclasses
from pathlib import Path

import pytest

from cli.config import composed_train_config, plain_config
from cli.run_spec import run_spec
from tests.helpers import tiny_config

# Where each group of the config lands in the spec; a key of `train` may land in any of these.
TRAIN_SPECS = ("step", "loop", "probes", "device")
GROUP_SPECS = {"model": ("model",), "data": ("corpus",), "tokenizer": ("tokenizer",), "optim": ("optim", "step"),
               "train": TRAIN_SPECS}


def spec_values(spec, parts: tuple[str, ...]) -> dict[str, object]:
    return {field.name: getattr(getattr(spec, part), field.name)
            for part in parts for field in dataclasses.fields(getattr(spec, part))}


@pytest.mark.parametrize("overrides", [[], ["data=text", "data.path=book.txt", "optim.name=adamw",
                                            "train.keep_checkpoints=log", "model.window=16", "tokenizer=char"],
                                        ["data=shakespeare", "tokenizer=gpt2", "train.keep_checkpoints=[0,5]"]],
                         ids=["default", "text, char, adamw, log, window", "shakespeare, gpt2"])
def test_every_value_of_the_config_reaches_the_spec_unchanged(overrides):
    cfg = composed_train_config(overrides)
    spec, config = run_spec(cfg), plain_config(cfg)
    for group, parts in GROUP_SPECS.items():
        values = spec_values(spec, parts)
        for key, value in config[group].items():
            assert key in values, f"{group}.{key} has no place in the spec ({', '.join(parts)})"
            expected = tuple(value) if isinstance(value, list) else value  # lists become tuples: frozen
            assert values[key] == expected and type(values[key]) is type(expected), f"{group}.{key}"
    assert spec.tokenizer.settings() == config["tokenizer"]  # the token cache's key: as the group, nulls too
    assert spec.model.vocab_size is None  # the tokenizer's, once it is built
    assert spec.start.init_from is None and spec.start.weights is None and spec.debug is None


def test_the_spec_is_frozen_all_the_way_down():
    spec = run_spec(tiny_config())
    for part in (spec, spec.model, spec.corpus, spec.tokenizer, spec.optim, spec.step, spec.loop, spec.probes,
                 spec.device, spec.start):
        field = dataclasses.fields(part)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(part, field, getattr(part, field))
    assert isinstance(spec.optim.betas, tuple) and isinstance(spec.loop.keep_checkpoints, tuple)


def test_only_the_built_in_stories_get_a_recall_probe_on_stories_of_another_seed():
    stories = run_spec(tiny_config(**{"data.seed": 5}))
    assert stories.probes.recall_seed == 6  # held out: not the stories the run trains on
    assert run_spec(composed_train_config(["data=text", "data.path=book.txt"])).probes.recall_seed is None


def test_init_from_weights_are_the_folder_the_checks_found_and_a_resumed_run_has_none():
    cfg = tiny_config()
    assert run_spec(cfg, weights=Path("gpt2-folder")).start.weights == Path("gpt2-folder")
    assert run_spec(cfg).start.weights is None
