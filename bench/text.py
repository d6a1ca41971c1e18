"""The text section: the Attention tab's answer to your own text, for the default model on CPU."""

import json
from pathlib import Path

import torch
from omegaconf import OmegaConf

from attention_tab.your_text import THREADS, LoadedModel, answer, model_bytes
from bench.common import ROOT, median_time
from data.dataset import prepare_tokens, probe_ids
from inspection.text_forward import forward_text
from model_io.checkpoint import build_model

ANSWERS_PER_RUN = 10


def default_run_data(cache_dir: Path):
    """The default run's corpus and tokenizer (stories, BPE: 1,274 tokens), built as train.py builds them."""
    data_cfg, tokenizer_cfg = (OmegaConf.to_container(OmegaConf.load(ROOT / f"configs/{name}.yaml"))
                               for name in ("data/stories", "tokenizer/bpe"))
    data_cfg.pop("defaults"), tokenizer_cfg.pop("defaults")  # the schemas Hydra checks them against
    return prepare_tokens({**data_cfg, "cache_dir": str(cache_dir)}, tokenizer_cfg)


def bench_text(repeats: int, work: Path) -> dict:
    """ms per answer to a text of block_size tokens (<|endoftext|> and 127 of a held-out story):
    tokenizing, the forward with attention weights, the top 5 and the losses, and the JSON the
    route sends; intact, and with one head knocked out (two forwards). The default model at
    random init: the same work as a trained one; on the threads the tab runs it on."""
    data = default_run_data(work / "cache")
    tokenizer = data.tokenizer
    config = OmegaConf.load(ROOT / "configs/model/gpt.yaml")
    torch.manual_seed(0)
    model = build_model(config, tokenizer.vocab_size).eval()
    ids = probe_ids(data.val, tokenizer, config.block_size - 1)
    text = tokenizer.decode(ids)
    loaded = LoadedModel(model, tokenizer, Path("ckpt_best.pt"), 0, (0, 0), model_bytes(model))

    def answers(knocked_out: list[tuple[int, int]]) -> None:
        for _ in range(ANSWERS_PER_RUN):
            json.dumps(answer("run", loaded, forward_text(model, tokenizer, text, knocked_out)), allow_nan=False)

    tokens = len(forward_text(model, tokenizer, text).ids)
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        intact_s, knocked_out_s = (median_time(lambda heads=heads: answers(heads), repeats) for heads in ([], [(1, 0)]))
    finally:
        torch.set_num_threads(threads)
    return {"tokens": tokens, "params": model.num_parameters(), "threads": THREADS,
            "answer_ms": 1e3 * intact_s / ANSWERS_PER_RUN, "knocked_out_answer_ms": 1e3 * knocked_out_s / ANSWERS_PER_RUN}
