"""Top-k and top-p (nucleus) filtering of next-token logits, used by GPT.generate()."""

import torch


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
