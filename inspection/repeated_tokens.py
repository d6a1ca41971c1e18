"""The classic induction demo (Olsson et al., 2022) on a run's model, for the Attention tab: n
random tokens, then the same n again, after the start token (<|endoftext|>). Over the first copy
the model can only guess; over the second, a model with induction heads copies what came after
the token's earlier occurrence, and the loss collapses."""

from collections.abc import Collection
from dataclasses import dataclass

import torch

from data.tokenizer import Tokenizer, special_ids
from inspection.head_metrics import induction_probe, induction_score
from inspection.tab_format import REPEATED_N
from inspection.text_forward import Predictions, TextForward, forward_ids
from model import GPT
from model.hooks import is_whole_number
from user_error import UserError

MAX_N = 128  # GPT-2 small's 144 maps of 257 x 257 weights are 19 MB of float16: the tab's answer stays small
MAX_SEED = 2**31 - 1


@dataclass
class RepeatedForward:
    n: int
    seed: int
    forward: TextForward  # ids: the start token, the n tokens, the same n again: (2n + 1,)
    induction: torch.Tensor  # (L, H) induction_score of the weights read, heads knocked out included


def largest_n(block_size: int) -> int:
    """The longest copy a model reads whole: the start token and 2n tokens within block_size, at most MAX_N."""
    return min(MAX_N, (block_size - 1) // 2)


def default_n(block_size: int) -> int:
    """REPEATED_N, or the largest n the model reads if that is fewer."""
    return min(REPEATED_N, largest_n(block_size))


def repeated_ids(tokenizer: Tokenizer, n: int, seed: int, block_size: int) -> list[int]:
    """The start token (tokenizer.bos_id), n random ids (never a special token), the same n again;
    UserError for an n the model cannot read or a seed out of range."""
    most = largest_n(block_size)
    if most < 2:  # "give 2 to 0 random tokens", for an n the user never sent
        raise UserError(f"this model's block_size={block_size} is too short for repeated random tokens: the start token "
                        "and two copies of at least 2 need model.block_size=5 or more")
    if not 2 <= n <= most:
        raise UserError(f"n={n} is out of range: give 2 to {most} random tokens (this model reads at most "
                        f"{block_size} tokens, <eot> and the n tokens twice)")
    if not 0 <= seed <= MAX_SEED:
        raise UserError(f"seed={seed} is out of range: give a whole number from 0 to {MAX_SEED}")
    return [tokenizer.bos_id, *induction_probe(tokenizer.vocab_size, n, seed, avoid=special_ids(tokenizer))]


def repeated_pair(vocab_size: int, start_id: int, eot_id: int, n: int, seed: int) -> tuple[list[int], list[int], int, int]:
    """A pair to patch an induction head with (inspection/patching.py): (clean, corrupted, answer,
    other). clean is the start token (start_id), n distinct random tokens (neither it nor eot_id),
    then the same n less the last, so that the last query should copy the first copy's last token
    (answer); corrupted puts another token (other, not in clean) in that one place. docs/tools.py
    patches the induction preset's model with it."""
    generator = torch.Generator().manual_seed(seed)
    choices = [i for i in range(vocab_size) if i not in (start_id, eot_id)]
    if not is_whole_number(n) or not 2 <= n < len(choices):
        raise ValueError(f"n={n!r} must be a whole number from 2 to {len(choices) - 1}: n distinct tokens and one more "
                         f"to put in place of the last, from the {len(choices)} that are not special")
    drawn = [choices[i] for i in torch.randperm(len(choices), generator=generator)[: n + 1].tolist()]  # n + 1 distinct
    tokens, other = drawn[:n], drawn[n]
    clean = [start_id, *tokens, *tokens[:-1]]  # (2n,)
    corrupted = [*clean[:n], other, *clean[n + 1 :]]  # the first copy's last token, at position n, changed
    return clean, corrupted, tokens[-1], other


def forward_repeated(model: GPT, tokenizer: Tokenizer, n: int, seed: int,
                     knocked_out: Collection[tuple[int, int]] = (), intact: Predictions | None = None) -> RepeatedForward:
    """The model reads the repeated tokens with the heads in knocked_out switched off (forward_ids)."""
    ids = repeated_ids(tokenizer, n, seed, model.config.block_size)
    forward = forward_ids(model, tokenizer, ids, knocked_out, intact=intact)
    induction = induction_score(forward.weights[..., 1:, 1:], n)  # (L, H): the copies without the start token
    return RepeatedForward(n, seed, forward, induction)


def copy_losses(next_loss: torch.Tensor, n: int) -> tuple[float, float]:
    """next_loss: (2n,), the loss of each token after the start token. The mean loss over the first
    copy, and over the second from its second token on (as inspection.ablation.second_copy_loss:
    the copy's first token followed the start token the first time, so no context gives it away)."""
    return next_loss[:n].mean().item(), next_loss[n + 1:].mean().item()  # (n,), (n - 1,)
