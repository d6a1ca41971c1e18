"""Activation patching: does the answer depend on this activation, at this place?

Two prompts of the same length: a clean one ("When Mary and John went to the shop, John gave a
drink to", answer " Mary") and a corrupted one that changes the answer (the names swapped). A
metric reads the logits, e.g. the logit difference " Mary" - " John" at the last position. Run
the corrupted prompt with one activation taken from the clean run: the share of the clean
metric that comes back says how much of the answer that one activation carries.

    restored = (metric(patched) - metric(corrupted)) / (metric(clean) - metric(corrupted))

0: the patch brought nothing back; 1: all of it. The patched runs go through the model's hook
points (blocks.{l}.attn.hook_z, blocks.{l}.hook_resid_pre) and run as a few batches, many
patches to a batch, not one forward each. A knock-out is a patch too: zeros for the head's z.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from inspection.logit_attribution import Tokens, check_position, real_logit
from model import GPT, ActivationCache, eval_mode
from model.hooks import can_take, parameters_of
from user_error import UserError

Metric = Callable[[torch.Tensor], torch.Tensor | float]  # logits (B, T, V) -> one number
LOGIT_BUDGET = 2**25  # floats of logits in one patched batch (128 MB): a batch holds LOGIT_BUDGET // (B * T * V) patches
# A logit difference that moves less than this between the two prompts: the model barely tells
# them apart, and every fraction divides by that move (Restored.caution says so).
SMALL_GAP = 1.0


@dataclass
class Restored:
    """What patching found: the restored fraction of each patch, and the two runs it is measured between."""

    fraction: torch.Tensor  # (L, H) or (L, T): 0 nothing restored, 1 all of it
    clean: float  # the metric on the clean prompt
    corrupted: float  # the metric on the corrupted prompt
    patched: torch.Tensor  # the metric with each patch, the fraction's numerator plus `corrupted`

    @property
    def caution(self) -> str | None:
        """One line to read beside the fractions where the metric moves by less than SMALL_GAP
        between the prompts (set for a logit difference, logit_difference's metric); None where it
        moves more, or is not a number (the fractions show that themselves)."""
        gap = self.clean - self.corrupted
        if not math.isfinite(gap) or abs(gap) >= SMALL_GAP:
            return None
        return (f"the metric moves by only {gap:+.3g} between the two prompts, and each fraction divides by that: "
                "they say little where the model barely tells the prompts apart")


def logit_difference(position: int, token: Tokens, other: Tokens | None = None) -> Metric:
    """The metric logits (B, T, V) -> the logit of token less other's at position, averaged
    over the batch (just token's logit with no other)."""

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return real_logit(logits[:, check_position(position, logits.shape[1])], token, other).mean()

    return metric


def score(metric: Metric, logits: torch.Tensor) -> float:
    """metric(logits) as a float; UserError unless metric is a function of the logits alone that
    gives one number."""
    check_metric(metric)
    given = metric(logits)
    try:
        value = torch.as_tensor(given)
    except (TypeError, RuntimeError, ValueError):  # None (a forgotten return), a str
        value = None
    if value is None or value.dtype == torch.bool or value.is_complex() or not value.numel():
        raise UserError(f"the metric returned {repr(given)[:40]}, not a number: return one from it, "
                        "e.g. return (logits[:, -1, a] - logits[:, -1, b]).mean()")
    if value.numel() != 1:
        raise UserError(f"the metric gave a tensor of shape {tuple(value.shape)}, not one number: average it over "
                        "the batch (.mean())")
    return float(value)


def check_metric(metric: object) -> None:
    """UserError unless metric can be called with the logits alone, as metric(logits)."""
    if not callable(metric):
        raise UserError(f"the metric is a {type(metric).__name__}, not a function: pass a function of the logits "
                        "(B, T, V) that gives one number, e.g. logit_difference(position, token, other)")
    if not can_take(metric, None):
        raise UserError(f"the metric takes {parameters_of(metric)}, but it is called with the logits alone: give "
                        "it its other arguments first (functools.partial), or pass what logit_difference(position, "
                        "token, other) returns")


@torch.no_grad()
def patched_metrics(model: GPT, idx: torch.Tensor, patches: list[tuple[str, tuple, torch.Tensor]],
                    metric: Metric) -> torch.Tensor:
    """metric on idx (B, T) run once per patch, each patch (hook name, index, source): at that
    hook point, activation[:, *index] becomes source[:, *index], source shaped like the
    activation. Many patches share a batch; returns (len(patches),)."""
    B, T = idx.shape
    per_batch = max(1, LOGIT_BUDGET // (B * T * model.lm_head.weight.shape[0]))
    values = []
    with eval_mode(model):
        for start in range(0, len(patches), per_batch):
            chunk = patches[start : start + per_batch]  # patch n edits rows n * B .. (n + 1) * B - 1
            edits: dict[str, list[tuple[int, tuple, torch.Tensor]]] = {}
            for n, (name, index, source) in enumerate(chunk):
                edits.setdefault(name, []).append((n * B, index, source))
            fwd_hooks = [(name, copy_in(at, B)) for name, at in edits.items()]
            logits, _ = model.run_with_hooks(idx.repeat(len(chunk), 1), fwd_hooks)  # (n * B, T, V)
            values += [score(metric, logits[n * B : (n + 1) * B]) for n in range(len(chunk))]
    return torch.tensor(values, dtype=torch.float64)


def copy_in(edits: list[tuple[int, tuple, torch.Tensor]], B: int) -> Callable[[torch.Tensor, object], torch.Tensor]:
    """A hook function that, for each (row, index, source) of edits, writes source[:, *index]
    into rows row .. row + B - 1 of the activation at index."""

    def patch(activation: torch.Tensor, hook: object) -> torch.Tensor:
        activation = activation.clone()  # (n * B, T, ...): n patched copies of the batch
        for row, index, source in edits:
            activation[(slice(row, row + B), *index)] = source[(slice(None), *index)]  # rows row .. row + B - 1
        return activation

    return patch


def check_pair(model: GPT, clean: torch.Tensor, corrupted: torch.Tensor) -> None:
    """ValueError, as the model says it (GPT.check_token_ids) but naming the prompt, where either is
    no batch of its token ids (a text, a list, one row); UserError unless the two have the same shape (B, T)."""
    for name, ids in (("clean", clean), ("corrupted", corrupted)):
        model.check_token_ids(ids, name)
    if clean.shape[1] != corrupted.shape[1]:
        raise UserError(f"the clean prompt has {clean.shape[1]} tokens and the corrupted one {corrupted.shape[1]}: "
                        "patching swaps activations position by position, so give prompts of the same length")
    if clean.shape[0] != corrupted.shape[0]:
        rows = [f"{n} prompt{'' if n == 1 else 's'}" for n in (clean.shape[0], corrupted.shape[0])]
        raise UserError(f"clean holds {rows[0]} and corrupted {rows[1]}: row i of each makes a pair, so give as many of each")


@torch.no_grad()
def baselines(model: GPT, clean: torch.Tensor, corrupted: torch.Tensor, metric: Metric,
              names: Callable[[str], bool]) -> tuple[ActivationCache, float, float]:
    """The clean run's activations at `names`, and the metric on both prompts; UserError when the
    metric does not tell them apart (there is nothing to restore)."""
    check_pair(model, clean, corrupted)
    with eval_mode(model):
        clean_logits, cache = model.run_with_cache(clean, names=names)
        corrupted_logits, _ = model(corrupted)
    clean_value, corrupted_value = score(metric, clean_logits), score(metric, corrupted_logits)
    for prompt, value in (("clean", clean_value), ("corrupted", corrupted_value)):
        if not math.isfinite(value):
            raise UserError(f"the metric is {value} on the {prompt} prompt: every fraction would be NaN; make it finite "
                            "(a log of 0, or a logit of a token filtered out, gives -inf)")
    if abs(clean_value - corrupted_value) < 1e-6:
        raise UserError(f"the metric is {clean_value:.4g} on both prompts: there is nothing to restore; make the "
                        "corrupted prompt change the answer (swap the names, say)")
    return cache, clean_value, corrupted_value


def restored_fraction(patched: torch.Tensor, clean: float, corrupted: float, shape: tuple) -> Restored:
    """patched: (P,) the metric with each patch -> Restored, its fraction and patched viewed as shape."""
    fraction = (patched - corrupted) / (clean - corrupted) + 0.0  # + 0.0: nothing restored prints as 0, not -0
    return Restored(fraction.view(shape), clean, corrupted, patched.view(shape))


def patch_heads(model: GPT, clean: torch.Tensor, corrupted: torch.Tensor, metric: Metric) -> Restored:
    """For each head: corrupted, with that head's output z (blocks.{l}.attn.hook_z[:, :, h]) taken
    from the clean run at every position. fraction (L, H)."""
    cache, clean_value, corrupted_value = baselines(model, clean, corrupted, metric, lambda name: name.endswith("attn.hook_z"))
    L, H = len(model.blocks), model.config.n_head
    patches = [(f"blocks.{layer}.attn.hook_z", (slice(None), head), cache["z", layer])  # z: (B, T, H, D)
               for layer in range(L) for head in range(H)]
    return restored_fraction(patched_metrics(model, corrupted, patches, metric), clean_value, corrupted_value, (L, H))


def patch_residual(model: GPT, clean: torch.Tensor, corrupted: torch.Tensor, metric: Metric) -> Restored:
    """For each layer and position: corrupted, with the residual stream entering block l
    (blocks.{l}.hook_resid_pre) at that one position taken from the clean run. fraction (L, T)."""
    cache, clean_value, corrupted_value = baselines(model, clean, corrupted, metric,
                                                    lambda name: name.endswith("hook_resid_pre"))
    L, T = len(model.blocks), clean.shape[1]
    # Up to the first token where the prompts differ, a causal model computes the same stream on
    # both: patching there changes nothing (restores 0), and costs no forward.
    differs = (clean != corrupted).any(dim=0).cumsum(dim=0) > 0  # (T,): at or after the first difference
    positions = differs.nonzero().flatten().tolist()
    patches = [(f"blocks.{layer}.hook_resid_pre", (position,), cache["resid_pre", layer])  # (B, T, C)
               for layer in range(L) for position in positions]
    patched = torch.full((L, T), corrupted_value, dtype=torch.float64)  # (L, T)
    patched[:, positions] = patched_metrics(model, corrupted, patches, metric).view(L, len(positions))
    return restored_fraction(patched, clean_value, corrupted_value, (L, T))


@torch.no_grad()
def knock_out_effects(model: GPT, idx: torch.Tensor, metric: Metric) -> torch.Tensor:
    """(L, H): the metric on idx intact, less the metric with that head knocked out (its z zeroed,
    as GPT.knock_out does): what the model loses without the head, through every path."""
    with eval_mode(model):
        intact = score(metric, model(idx)[0])
    L, H = len(model.blocks), model.config.n_head
    B, T = idx.shape
    zeros = torch.zeros(B, T, H, model.blocks[0].attn.head_dim, device=idx.device, dtype=model.lm_head.weight.dtype)  # (B, T, H, D)
    patches = [(f"blocks.{layer}.attn.hook_z", (slice(None), head), zeros) for layer in range(L) for head in range(H)]
    return intact - patched_metrics(model, idx, patches, metric).view(L, H)  # (L, H)
