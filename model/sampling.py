"""Choosing the next token from the model's next-token logits: greedy, or a draw after
temperature, top-k and top-p. Eager generation and the compiled decode step both choose here."""

import math

import torch

from model.hooks import is_whole_number

DIVERGED = "the model's next-token logits are NaN or inf: its weights have diverged"
# The smallest temperature above 0 (greedy) that sampling takes (sample.py and train.py refuse one
# between): logits divided by one below it may overflow float32 (at most 3.4e38) and leave softmax
# nothing but NaN, whose draws are token 0 every time. Logits reach some tens, or 1e4 for a model
# far gone: 1e4 / 1e-30 is still a float32. (The division is in float32 at every precision.)
SMALLEST_TEMPERATURE = 1e-30


def sampling_problem(setting: str, value: object, key: str | None = None) -> str | None:
    """Why generation cannot sample with this value of one of its settings (generate_tokens's
    max_new_tokens, temperature, top_k, top_p; generate_text's num_samples and seed too), in one line
    naming it as key (the command's own key, e.g. train.sample_temperature); None where it can. The
    one statement of their ranges: sample.py, train.py and check_sampling_settings all ask here."""
    shown = f"{setting}={value!r}" if key is None else f"{key}={value}"
    none = "None" if key is None else "null"  # as Python spells it, or the command line
    number = isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)
    if setting == "max_new_tokens" and (not is_whole_number(value) or value < 0):
        return f"{shown} must be a whole number, 0 or more"
    if setting == "temperature" and (not number or not 0 <= value < math.inf):
        return f"{shown} must be 0 (greedy) or a number from {SMALLEST_TEMPERATURE:g} up"
    if setting == "temperature" and 0 < value < SMALLEST_TEMPERATURE:
        return (f"{shown} is too small to divide float32 logits by; give 0 for greedy decoding, or at least "
                f"{SMALLEST_TEMPERATURE:g}")
    if setting == "top_k" and value is not None and (not is_whole_number(value) or value < 0):
        return f"{shown} must be a whole number, 1 or more (0 or {none}: off)"
    if setting == "top_p" and value is not None and (not number or not 0 < value <= 1):
        return f"{shown} must be in (0, 1] (1.0 or {none}: off)"
    if setting == "num_samples" and (not is_whole_number(value) or value < 1):
        return f"{shown} must be at least 1" if is_whole_number(value) else f"{shown} must be a whole number, at least 1"
    if setting == "seed" and (not is_whole_number(value) or not 0 <= value < 2**63):  # what torch's generator takes
        return f"{shown} must be a whole number from 0 to {2**63 - 1}"
    return None


def check_sampling_settings(max_new_tokens: object, temperature: object, top_k: object, top_p: object) -> None:
    """ValueError, in one line, for settings generate_tokens cannot sample with (sample.py and
    train.py say the same of theirs first, as the command's own error; a notebook gets it here)."""
    settings = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p}
    for setting, value in settings.items():
        if problem := sampling_problem(setting, value):
            raise ValueError(problem)


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Set to -inf every logit outside the top_k likeliest and outside the smallest set
    whose probabilities reach top_p. logits: (B, V); returns (B, V).
    top_k keeps tokens tied with the k-th likeliest too. top_k None or 0 and top_p None or
    1.0 leave the logits unchanged."""
    if top_k:
        k = min(top_k, logits.size(-1))
        kth_largest = torch.topk(logits, k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))  # (B, V)
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)  # (B, V), (B, V)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)  # (B, V)
        # Probability mass of the tokens ranked before each token: a token stays while that
        # mass is below top_p. The likeliest token always stays, whatever top_p is.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # (B, V)
        drop_sorted = mass_before >= top_p  # (B, V)
        drop_sorted[:, 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # (B, V) back in vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))  # (B, V)
    return logits


def uniform_noise(
    batch_size: int, vocab_size: int, temperature: float, generator: torch.Generator | None, device: torch.device
) -> torch.Tensor | None:
    """The random numbers choose_next_token needs for one step: (B, V) uniform in [0, 1), or
    None at temperature 0 (greedy draws nothing)."""
    if temperature == 0:
        return None
    return torch.rand(batch_size, vocab_size, generator=generator, device=device)  # (B, V)


def choose_next_token(
    logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None, uniform: torch.Tensor | None
) -> torch.Tensor:
    """The next token (B, 1) for next-token logits (B, V): the likeliest at temperature 0, else a
    draw from softmax(filter_logits(logits / temperature)), made from uniform (B, V)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    probs = torch.softmax(filter_logits(logits.float() / temperature, top_k, top_p), dim=-1)  # (B, V), in float32
    # -log(u) of a uniform u is an Exp(1) draw, and the token whose probability divided by its
    # own Exp(1) draw is largest is distributed as the probabilities say (the Gumbel-max trick,
    # as torch.multinomial draws one sample). Everything here is elementwise: it compiles into
    # one loop, and torch.rand is several times cheaper than drawing Exp(1) numbers directly.
    # torch.rand can return exactly 0, whose -log is inf: a kept token's ratio would be 0, no
    # better than a filtered one's, so u is kept above 0.
    exponential = -torch.log(uniform.clamp_min(torch.finfo(uniform.dtype).tiny))  # (B, V)
    return (probs / exponential).argmax(dim=-1, keepdim=True)  # (B, 1)
