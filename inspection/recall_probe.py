"""The recall probe (stories corpus): does the model write again a name or item it has seen?

In the built-in stories, characters are named again after they are introduced, and a packed
item comes back as "the rope" when it solves a friend's problem. Writing such a mention
right needs attention: the clue is only in the earlier text. The probe measures exactly that.

Held-out stories (generated with a seed the training corpus does not use) are cut into
windows of block_size tokens, each story starting after the start token as in training. A
*recall point* is the first token of a mention whose word already appeared earlier in the
same window: a character's name, or a packed item written as "the <item>". There the model,
having read everything before, must predict that token.

    recall_points(text) -> [RecallPoint]        where, in plain text, the repeats are
    RecallProbe.build(tokenizer, block_size, seed) -> RecallProbe
    probe.evaluate(model) -> RecallScores       (probe.scores(logits, weights) does the same from
                                                a forward's outputs):
        accuracy           share of recall points where the model's likeliest next token is right
        accuracy_by_kind   the same for names and for items
        head_weight        (L, H): the weight each head puts, from the predicting position, on
                           the earlier mention's tokens (averaged over recall points): the heads
                           that look back at what is to be copied
"""

import re
from bisect import bisect_right
from dataclasses import dataclass

import torch

from data.stories import FEMALE_NAMES, ITEMS, MALE_NAMES, generate_stories
from data.tokenizer import Tokenizer
from model import GPT, eval_mode
from model.hooks import is_pattern
from user_error import UserError

NAME_PATTERN = re.compile(r"\b(" + "|".join(FEMALE_NAMES + MALE_NAMES) + r")\b")
ITEM_WORDS = "|".join(item.name for item in ITEMS)
ITEM_PATTERN = re.compile(r"\b(" + ITEM_WORDS + r")\b")  # any mention, e.g. in the packing list
ITEM_RECALL_PATTERN = re.compile(r"\bthe (" + ITEM_WORDS + r")\b")  # "the rope": the packed one, again


@dataclass(frozen=True)
class RecallPoint:
    start: int  # character offsets of the repeated mention
    end: int
    earlier_start: int  # the most recent earlier mention of the same word
    earlier_end: int
    kind: str  # "name" or "item"


def recall_points(text: str) -> list[RecallPoint]:
    """Every repeated mention in text, with the latest earlier mention of the same word."""
    points = []
    for kind, pattern, earlier_pattern in (("name", NAME_PATTERN, NAME_PATTERN), ("item", ITEM_RECALL_PATTERN, ITEM_PATTERN)):
        for match in pattern.finditer(text):
            word, start, end = match.group(1), match.start(1), match.end(1)
            earlier = [m for m in earlier_pattern.finditer(text, 0, start) if m.group(1) == word]
            if earlier:
                points.append(RecallPoint(start, end, earlier[-1].start(1), earlier[-1].end(1), kind))
    return sorted(points, key=lambda p: p.start)


@dataclass
class RecallScores:
    accuracy: float
    accuracy_by_kind: dict[str, float]
    head_weight: torch.Tensor  # (L, H)


class RecallProbe:
    def __init__(self, windows: torch.Tensor, targets: list[tuple[int, int, int, int, str]]) -> None:
        self.windows = windows  # (N, T) token ids
        # (window, position of the mention's first token, earlier mention's first and last+1 token, kind)
        self.targets = targets

    @classmethod
    def build(cls, tokenizer: Tokenizer, block_size: int, seed: int, max_windows: int = 96) -> "RecallProbe":
        windows, targets = [], []
        for story in generate_stories(seed, n_chars=200_000):
            try:
                ids = [tokenizer.bos_id, *tokenizer.encode(story)]
            except UserError:  # a char vocabulary from a small corpus may lack a letter of this story
                continue
            # Where each token starts in the story (stories are ASCII: the pieces add up exactly, less
            # the space a Llama 2 tokenizer spells before a text, its "▁": the offset starts it at -1).
            pieces = tokenizer.token_strings(ids[1:])
            starts, offset = [-1], len(story) - sum(map(len, pieces))  # the start token holds no text
            for piece in pieces:
                starts.append(offset)
                offset += len(piece)
            points = [(p, *(bisect_right(starts, c) - 1 for c in (p.start, p.earlier_start, p.earlier_end - 1)))
                      for p in recall_points(story)]  # each with its token, and the earlier mention's tokens
            for w0 in range(0, len(ids) - block_size + 1, block_size):  # whole windows, side by side
                for point, token, first, last in points:
                    if w0 <= first and last < token < w0 + block_size:  # both inside, the earlier one before
                        targets.append((len(windows), token - w0, first - w0, last + 1 - w0, point.kind))
                windows.append(ids[w0 : w0 + block_size])
                if len(windows) == max_windows:
                    return cls(torch.tensor(windows), targets)
        return cls(torch.tensor(windows), targets)

    @torch.no_grad()
    def evaluate(self, model: GPT, chunk: int | None = None) -> RecallScores:
        """Runs model (its own weights, eval mode) on the windows, a few at a time: chunk windows,
        by default 2,048 tokens' worth (16 of the default 128), as GPT-2's 50,257-token logits of
        16 windows of 1,024 would take 3.3 GB."""
        device = next(model.parameters()).device
        chunk = chunk or max(1, 2048 // self.windows.shape[1])
        reads = []
        with eval_mode(model):
            for lo in range(0, len(self.windows), chunk):
                windows = self.windows[lo : lo + chunk].to(device)  # (n, T)
                logits, cache = model.run_with_cache(windows, names=is_pattern)  # (n, T, vocab)
                weights = cache.stack_activation("pattern")  # (L, n, H, T, T)
                reads += self.read(logits.cpu(), weights.cpu(), first_window=lo)
        return summarise(reads)

    def scores(self, logits: torch.Tensor, weights: torch.Tensor) -> RecallScores:
        """logits: (N, T, vocab) and weights: (L, N, H, T, T) of all windows at once."""
        return summarise(self.read(logits, weights, first_window=0))

    def read(self, logits: torch.Tensor, weights: torch.Tensor, first_window: int) -> list[tuple[str, bool, torch.Tensor]]:
        """(kind, right or not, (L, H) weight on the earlier mention) for the recall points of
        windows first_window, first_window + 1, ... (as many as logits holds)."""
        windows = list(range(first_window, first_window + logits.shape[0]))
        next_logits, targets = self.before_points(logits, windows)  # (P, vocab)
        reads = []
        for (window, position, first, end, kind), hit in zip(targets, self.right(next_logits, targets), strict=True):
            looks = weights[:, window - first_window, :, position - 1, first:end].sum(dim=-1)  # (L, H): weight on the earlier mention
            reads.append((kind, hit.item(), looks))
        return reads

    def before_points(self, per_token: torch.Tensor, windows: list[int], kind: str | None = None) -> tuple[torch.Tensor, list]:
        """per_token (n, T, ...) of the probe's windows `windows` (one row each, in that order)
        read just before each of their recall points (of one kind, or all): what the model had
        when it predicted the mention. Returns (P, ...) and those P targets."""
        row = {window: n for n, window in enumerate(windows)}
        targets = [t for t in self.targets if t[0] in row and kind in (None, t[-1])]
        rows = torch.tensor([row[window] for window, *_ in targets], dtype=torch.long)  # (P,)
        positions = torch.tensor([position - 1 for _, position, *_ in targets], dtype=torch.long)  # (P,)
        return per_token[rows.to(per_token.device), positions.to(per_token.device)], targets

    def right(self, next_logits: torch.Tensor, targets: list) -> torch.Tensor:
        """(P,) bool: whether the likeliest next token of next_logits (P, vocab) is the first
        token of each target's mention."""
        answers = torch.tensor([self.windows[window, position].item() for window, position, *_ in targets], dtype=torch.long)  # (P,)
        return next_logits.argmax(dim=-1).cpu() == answers


def accuracy(hits: list[bool]) -> float:
    """The share of recall points where the model was right."""
    return sum(hits) / len(hits)


def summarise(reads: list[tuple[str, bool, torch.Tensor]]) -> RecallScores:
    by_kind: dict[str, list[bool]] = {}
    for kind, hit, _ in reads:
        by_kind.setdefault(kind, []).append(hit)
    return RecallScores(
        accuracy=accuracy([hit for _, hit, _ in reads]),
        accuracy_by_kind={kind: accuracy(hits) for kind, hits in sorted(by_kind.items())},
        head_weight=torch.stack([looks for _, _, looks in reads]).double().mean(dim=0),  # (L, H)
    )
