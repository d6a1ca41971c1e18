"""Make the README's attention picture from a trained run: `make docs RUN=<run dir>`.

It draws, on the run's own probe text, the head that copies names (the one the recall probe
finds looking back at the earlier mention most) beside the head that most looks one token back.
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data.dataset import prepare_tokens, probe_ids  # noqa: E402
from inspection.head_metrics import head_metrics  # noqa: E402
from inspection.heatmap import render_attention_map  # noqa: E402
from inspection.recall_probe import RecallProbe  # noqa: E402
from training.checkpoint import load_checkpoint, model_from_checkpoint, resolve_checkpoint  # noqa: E402
from training.errors import exit_on_user_error  # noqa: E402
from user_error import UserError  # noqa: E402

ATTENTION_MAPS = Path(__file__).resolve().parent / "attention_maps.png"


def pick_heads(model, tokenizer, data_seed: int, probe_weights: torch.Tensor) -> list[tuple[int, int, str]]:
    """(layer, head, role) of the name-copying head and of the previous-token head."""
    recall = RecallProbe.build(tokenizer, model.config.block_size, seed=data_seed + 1).evaluate(model)
    copier = divmod(int(recall.head_weight.argmax()), recall.head_weight.shape[1])
    previous = head_metrics(probe_weights)["previous_token"]  # (L, H)
    previous[copier] = -1  # the other picture shows another head
    looker = divmod(int(previous.argmax()), previous.shape[1])
    return [(*copier, "looks back at the earlier mention"), (*looker, "looks one token back")]


def attention_maps_figure(run: str, out: Path = ATTENTION_MAPS) -> list[tuple[int, int, str]]:
    checkpoint = load_checkpoint(resolve_checkpoint(run))
    model, tokenizer = model_from_checkpoint(checkpoint)
    config, step = checkpoint["config"], checkpoint["step"]
    if config["data"]["source"] != "stories":
        raise UserError(f"{run} was trained on data={config['data']['source']}; the picture needs a run on the "
                        "built-in stories, where names come back (the default)")
    data = prepare_tokens(config["data"], config["tokenizer"])
    probe = probe_ids(data.val, tokenizer, min(config["train"]["probe_tokens"], model.config.block_size))
    weights = model.attention_weights(torch.tensor([probe]))[:, 0]  # (L, H, T, T)
    heads = pick_heads(model, tokenizer, config["data"]["seed"], weights)
    labels = tokenizer.token_strings(probe)
    maps = [render_attention_map(weights[layer, head].numpy(), labels, f"layer {layer} head {head} at step {step}: {role}")
            for layer, head, role in heads]
    height = max(m.shape[0] for m in maps)
    padded = [np.pad(m, ((0, height - m.shape[0]), (0, 0), (0, 0)), constant_values=255) for m in maps]
    Image.fromarray(np.concatenate(padded, axis=1)).save(out, optimize=True)
    return heads


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run dir or checkpoint of the stories corpus")
    args = parser.parse_args()
    with exit_on_user_error():
        for layer, head, role in attention_maps_figure(args.run):
            print(f"layer {layer} head {head}: {role}")
    print(f"wrote {ATTENTION_MAPS}")
