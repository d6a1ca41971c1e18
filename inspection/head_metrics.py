"""What each attention head does, in four numbers, computed from its attention weights.

A heatmap shows one head at one step; these numbers follow every head through training
(TensorBoard scalars), so a head can be seen to specialise.

    head_metrics(weights)                 weights (L, H, T, T) of one text -> {name: (L, H)}
        entropy          mean over queries of -sum_s w[t, s] log w[t, s], in nats. 0: each query
                         looks at a single token; the most a causal head can reach is uniform
                         attention over everything visible, log(t + 1) for query t.
        distance         mean over queries of sum_s w[t, s] (t - s): how many tokens back a head
                         looks, on average. 0: each token attends to itself.
        previous_token   mean over queries t >= 1 of w[t, t - 1]: 1 for a head that always
                         looks at the token just before.
    induction_probe(vocab_size, n, seed, avoid)  n random token ids (none in avoid), then the same n again: (2n,)
    run_induction_probe(...)              the rows of it a run scores and ablates: n from train.probe_tokens
                         and block_size, row i seeded train.seed + i
    induction_score(weights, n)           weights (L, H, 2n, 2n) of that probe -> (L, H):
                         the mean weight a query in the second copy puts on the token just
                         after its own token's earlier occurrence (the token to copy next).
                         1 for an ideal induction head; near 0 for the others.
"""

from collections.abc import Collection

import torch

from model.hooks import is_whole_number

METRICS = ("entropy", "distance", "previous_token", "induction")


def head_metrics(weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """weights: (L, H, T, T), each row a query's weights over keys (rows sum to 1)."""
    T = weights.shape[-1]
    weights = weights.to("cpu", torch.float64)  # (L, H, T, T); on the CPU, as Apple's MPS has no float64
    # xlogy(w, w) = w log w, and 0 where w == 0 (the masked future), as the limit says.
    entropy = -torch.special.xlogy(weights, weights).sum(dim=-1)  # (L, H, T): one number per query
    positions = torch.arange(T, dtype=weights.dtype)  # (T,)
    back = (positions.view(T, 1) - positions.view(1, T)).clamp(min=0)  # (T, T): t - s, and 0 for the future
    distance = (weights * back).sum(dim=-1)  # (L, H, T)
    previous = weights.diagonal(offset=-1, dim1=-2, dim2=-1)  # (L, H, T - 1): w[t, t - 1] for t >= 1
    return {
        "entropy": entropy.mean(dim=-1),  # (L, H)
        "distance": distance.mean(dim=-1),  # (L, H)
        "previous_token": previous.mean(dim=-1) if T > 1 else torch.zeros(weights.shape[:2]),  # (L, H)
    }


def induction_probe(vocab_size: int, n: int, seed: int = 0, avoid: Collection[int] = ()) -> list[int]:
    """n random ids (none of `avoid`: the special tokens, data.tokenizer.special_ids), then the same n again."""
    if not is_whole_number(n) or n < 1:
        raise ValueError(f"n={n!r} must be a whole number of at least 1: the probe is n random ids, then the same n again")
    generator = torch.Generator().manual_seed(seed)
    choices = torch.tensor([i for i in range(vocab_size) if i not in avoid], dtype=torch.long)
    if len(choices) == 0:
        raise ValueError(f"every id of the vocabulary ({vocab_size}) is in avoid: none is left to draw the probe from")
    first = choices[torch.randint(len(choices), (n,), generator=generator)]  # (n,)
    return first.repeat(2).tolist()  # (2n,)


def run_induction_probe(vocab_size: int, probe_tokens: int, block_size: int, seed: int, avoid: Collection[int] = (),
                        rows: int = 1) -> torch.Tensor | None:
    """The repeated random tokens a run scores head_induction on (row 0) and its ablation reads (all
    rows): n = min(train.probe_tokens, block_size) // 2 ids twice, row i seeded train.seed + i;
    (rows, 2n), or None where n < 2."""
    n = min(probe_tokens, block_size) // 2
    if n < 2:
        return None
    return torch.tensor([induction_probe(vocab_size, n, seed + i, avoid) for i in range(rows)])  # (rows, 2n)


def induction_score(weights: torch.Tensor, n: int) -> torch.Tensor:
    """weights: (L, H, 2n, 2n) on an induction_probe. Query n + i holds the token first seen
    at position i, which was followed by position i + 1: its weight there, averaged over i."""
    if weights.dim() < 2 or weights.shape[-2:] != (2 * n, 2 * n):
        start = ("; with a start token in front of the probe, leave its row and column out: weights[..., 1:, 1:]"
                 if weights.dim() >= 2 and weights.shape[-2:] == (2 * n + 1, 2 * n + 1) else "")
        raise ValueError(f"induction_score reads weights on an induction_probe of 2n = {2 * n} tokens, (..., {2 * n}, "
                         f"{2 * n}); got shape {tuple(weights.shape)}{start}")  # one off, the scores came out wrong, no word
    i = torch.arange(n)  # (n,)
    return weights.to("cpu", torch.float64)[..., n + i, i + 1].mean(dim=-1)  # (L, H, n) -> (L, H)
