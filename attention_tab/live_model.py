"""A run's model, live in TensorBoard's process: its checkpoint's model kept in a cache bounded by
bytes, and its answers to the text and repeated routes as JSON, less the HTTP
(the tools' answers: attention_tab/tools.py). Loads torch, so the plugin imports it on the
first such request rather than at TensorBoard's start."""

import base64
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attention_tab.run_folders import is_inside
from data.tokenizer import Tokenizer
from inspection.heatmap import readable_token
from inspection.repeated_tokens import RepeatedForward, copy_losses, default_n, forward_repeated
from inspection.text_forward import Predictions, TextForward, forward_text
from model import GPT
from model_io.checkpoint import Checkpoint
from model_io.run_files import BEST, LAST, WHEN_SAVED, kept_checkpoints, model_checkpoints
from runtime.huge_pages import move_to_huge_pages
from runtime.precision import WEIGHT_DTYPES
from user_error import UserError, quoted

# torch threads in TensorBoard's process. The tab's models are small, and a run training beside
# TensorBoard keeps the cores busy: there one thread answers many times faster than two threads
# fighting the trainer's for the cores (docs/speed.md, "The Attention tab", measures both).
THREADS = 1


def checkpoint_in(folder: Path, run: str, step: int | None = None) -> Path:
    """The run's model_checkpoint (its ckpt_best.pt, else ..., as sample.py picks), of those inside
    its folder; with a step, the model-only checkpoint the run kept at that step (train.keep_checkpoints)."""
    if step is not None:
        kept = kept_checkpoints(folder)
        path = kept.get(step)
        if path is None or not is_inside(str(path), str(folder)):
            steps = f"its kept steps are {sorted(kept)}" if kept else "it kept none (train.keep_checkpoints keeps them)"
            raise UserError(f"run {quoted(run)} kept no checkpoint at step {step}; {steps}")
        return path
    found = [path for path in model_checkpoints(folder) if is_inside(str(path), str(folder))]
    if found:
        return found[0]
    raise UserError(f"run {quoted(run)} has no checkpoint yet ({BEST} or {LAST}, or one it keeps); {WHEN_SAVED}")


@dataclass
class LoadedModel:
    model: GPT
    tokenizer: Tokenizer
    checkpoint: Path
    step: int
    version: tuple[int, int]  # the file's (mtime_ns, size): a run still training writes a new one
    n_bytes: int
    last_intact: tuple[tuple, Predictions] | None = None  # the intact model's numbers on the last sequence read

    def read(self, text: str, knocked_out: Collection[tuple[int, int]]) -> TextForward:
        """forward_text, reusing the intact numbers of the same text read before: knocking heads
        out after reading a text costs one forward, not two (at GPT-2 small's size, half the time)."""
        sequence = ("text", text)
        forward = forward_text(self.model, self.tokenizer, text, knocked_out, intact=self.kept_intact(sequence))
        return self.keep_intact(sequence, forward)

    def read_repeated(self, n: int | None, seed: int, knocked_out: Collection[tuple[int, int]]) -> RepeatedForward:
        """forward_repeated, reusing the intact numbers as read does; n None: default_n."""
        n = default_n(self.model.config.block_size) if n is None else n
        sequence = ("repeated", n, seed)
        repeated = forward_repeated(self.model, self.tokenizer, n, seed, knocked_out, intact=self.kept_intact(sequence))
        self.keep_intact(sequence, repeated.forward)
        return repeated

    def kept_intact(self, sequence: tuple) -> Predictions | None:
        return self.last_intact[1] if self.last_intact and self.last_intact[0] == sequence else None

    def keep_intact(self, sequence: tuple, forward: TextForward) -> TextForward:
        self.last_intact = (sequence, forward.intact or forward.predictions)
        return forward


def model_bytes(model: GPT) -> int:
    """Bytes of the parameters (the tied embedding counted once) and buffers."""
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


class ModelCache:
    """The models of the checkpoint files asked for (a run's best or last, or one it kept along
    the way), least recently used first out once they pass max_bytes together; a file's model
    is loaded again when the file changes. One reads at a time: knocking heads out attaches
    functions to the shared model."""

    def __init__(self, max_bytes: int, device: str = "cpu", dtype: str = "fp32") -> None:
        self.max_bytes, self.device, self.dtype = max_bytes, device, WEIGHT_DTYPES[dtype]
        self.models: OrderedDict[Path, LoadedModel] = OrderedDict()
        self.lock = threading.Lock()

    @classmethod
    def in_tensorboard(cls, flags) -> "ModelCache":
        """The plugin's cache, as TensorBoard's flags set it; torch in that process then runs on THREADS threads."""
        torch.set_num_threads(THREADS)
        return cls(flags.attention_tab_cache_mb * 2**20, flags.attention_tab_device, flags.attention_tab_dtype)

    def get(self, folder: Path, run: str, step: int | None = None) -> LoadedModel:
        """The model of the run's checkpoint (checkpoint_in: step None, its best else last)."""
        path = checkpoint_in(folder, run, step)
        stat = path.stat()
        version = (stat.st_mtime_ns, stat.st_size)
        loaded = self.models.pop(path, None)
        if loaded is None or loaded.version != version:
            loaded = self.load(path, version)
        self.models[path] = loaded  # the most recently used is last
        while self.models and sum(m.n_bytes for m in self.models.values()) > self.max_bytes:
            self.models.popitem(last=False)  # a model bigger than the bound alone answers, and is not kept
        return loaded

    def load(self, path: Path, version: tuple[int, int]) -> LoadedModel:
        checkpoint = Checkpoint.load(path)  # weights_only
        model, tokenizer = checkpoint.build_model()
        try:
            model.to(self.device, self.dtype).eval().requires_grad_(False)
        except (RuntimeError, AssertionError) as err:  # no such device here, or torch built without it
            raise UserError(f"cannot run the model on --attention_tab_device={self.device} ({err}); "
                            "leave it at cpu") from None
        move_to_huge_pages(model)  # on a CPU each forward reads every weight: faster from 2 MiB pages
        return LoadedModel(model, tokenizer, path, int(checkpoint.step), version, model_bytes(model))

    def ask(self, folder: Path, run: str, step: int | None, make: Callable[[LoadedModel], dict]) -> dict:
        """make(the model of the run's checkpoint at step) -> an answer, one at a time."""
        with self.lock:
            return make(self.get(folder, run, step))


def checkpoint_fields(run: str, loaded: LoadedModel) -> dict:
    """What every answer says of the model that gave it: run, checkpoint (the file's name), step
    (the checkpoint's), window (the model's: a query sees its W most recent keys; null: all)."""
    return {"run": run, "checkpoint": loaded.checkpoint.name, "step": loaded.step, "window": loaded.model.config.window}


def text_answer(run: str, loaded: LoadedModel, text: str, knocked_out: Collection[tuple[int, int]]) -> dict:
    """The answer to one text: forward_text's numbers as the tab reads them."""
    return answer(run, loaded, loaded.read(text, knocked_out))


def repeated_tokens_answer(run: str, loaded: LoadedModel, n: int | None, seed: int,
                           knocked_out: Collection[tuple[int, int]]) -> dict:
    """The answer to n repeated random tokens: forward_repeated's numbers as the tab reads them."""
    return repeated_answer(run, loaded, loaded.read_repeated(n, seed, knocked_out))


def answer(run: str, loaded: LoadedModel, forward: TextForward) -> dict:
    """JSON for the tab:
        run, checkpoint (file name: ckpt_best.pt, step_000250.pt), step (the checkpoint's),
        shape [L, H, T, T], labels [T],
        weights       base64 of float16 little-endian (L, H, T, T), as the weights route sends
        knocked_out   [[layer, head], ...]
        next          {tokens [T][k], probs [T][k], loss [T - 1]}: the top next tokens after each
                      token, and the loss (nats) of the one that came next
        intact        null, or with heads knocked out the intact model's next, plus
                      probs_of_top [T][k]: its probabilities of next's tokens."""
    L, H, T, _ = forward.weights.shape
    weights = forward.weights.to("cpu", torch.float16).numpy().astype("<f2")
    intact = None
    if forward.intact is not None:
        intact = {**predictions_json(forward.intact, loaded.tokenizer),
                  "probs_of_top": finite(forward.intact_top_probs)}
    return {**checkpoint_fields(run, loaded), "shape": [L, H, T, T], "labels": forward.labels, "weights": base64.b64encode(weights.tobytes()).decode("ascii"),
            "knocked_out": [list(pair) for pair in forward.knocked_out],
            "next": predictions_json(forward.predictions, loaded.tokenizer), "intact": intact}


def repeated_answer(run: str, loaded: LoadedModel, repeated: RepeatedForward) -> dict:
    """answer's JSON for the repeated tokens, and:
        n, seed      the sequence: the start token, n random tokens, the same n again (T = 2n + 1)
        induction    [L][H]: each head's induction score on the weights sent
        copy_loss    {first, second}: the mean loss over the first copy, and over the second from
                     its second token on; intact_copy_loss: the intact model's, or null."""
    forward, n = repeated.forward, repeated.n

    def copies(predictions: Predictions) -> dict:
        first, second = finite(torch.tensor(copy_losses(predictions.next_loss, n)))
        return {"first": first, "second": second}

    return {**answer(run, loaded, forward), "n": n, "seed": repeated.seed, "induction": finite(repeated.induction),
            "copy_loss": copies(forward.predictions),
            "intact_copy_loss": copies(forward.intact) if forward.intact is not None else None}


def token_labels(tokenizer: Tokenizer, ids: torch.Tensor) -> list:
    """Token ids of any shape as nested lists of the labels the tab prints, in the same shape."""
    pieces = tokenizer.token_strings(ids.cpu().flatten().tolist())
    return np.array([readable_token(piece) for piece in pieces], dtype=object).reshape(tuple(ids.shape)).tolist()


def predictions_json(predictions: Predictions, tokenizer: Tokenizer) -> dict:
    return {"tokens": token_labels(tokenizer, predictions.top_ids), "probs": finite(predictions.top_probs),  # (T, k) each
            "loss": finite(predictions.next_loss)}


def finite(values: torch.Tensor) -> list:
    """Nested lists of floats, None where a model gone non-finite gives NaN or inf (JSON has neither)."""
    if values.dim() > 1:
        return [finite(row) for row in values]
    return [value if np.isfinite(value) else None for value in values.tolist()]
