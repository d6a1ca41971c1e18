"""The name-swap example (Wang et al., 2022): a prompt whose next token is one of two names, and
the same prompt with the names swapped, the pair that patching (inspection/patching.py) reads.

The classic sentence, "When Mary and John went to the shop, John gave a drink to" (" Mary"), is
English the default model never read; its stories say the same thing their own way (STORY), and
that is the form docs/tools.md and notebooks/name_swap.ipynb run it on. Each name must be one
token: patching swaps activations token for token, and the metric reads one logit per name.
"""

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from data.stories import FEMALE_NAMES
from data.tokenizer import Tokenizer, encoded_if_writable
from inspection.patching import Metric, logit_difference
from user_error import UserError

CLASSIC = "When {answer} and {other} went to the shop, {other} gave a drink to"
STORY = "On the way, {answer} met a girl named {other}. {other} looked sad. {other} hugged"
NAMES = ("Mia", "Lily")  # two of data/stories.py's girls (STORY says "a girl"), one BPE token each in the default run


@dataclass
class NameSwap:
    clean: torch.Tensor  # (1, T): <|endoftext|>, then the prompt; the next token should be `answer`
    corrupted: torch.Tensor  # (1, T): the same with the two names swapped; it should be `other`
    answer: int  # the id of " " + the answer's name
    other: int  # the id of " " + the other name
    pieces: list[str]  # the clean prompt's tokens, as text

    def metric(self) -> Metric:
        """logit(answer) - logit(other) at the last position: positive on the clean prompt."""
        return logit_difference(-1, self.answer, self.other)


def one_token_names(tokenizer: Tokenizer, names: Iterable[str] = FEMALE_NAMES) -> list[str]:
    """The names that are one token each with a space before them, as they stand in a sentence (none
    that the tokenizer cannot write: a character tokenizer of a corpus without their letters)."""
    if isinstance(names, str):  # its letters would be the names
        raise UserError(f"names={names!r} is one text: give a list of names, e.g. [{names!r}]")
    return [name for name in names if len(encoded_if_writable(tokenizer, " " + name)) == 1]


def filled(template: str, answer: str, other: str) -> str:
    """template with its {answer} and {other} filled in; UserError for any other field it asks for."""
    try:
        return template.format(answer=answer, other=other)
    except (KeyError, IndexError, ValueError) as error:  # {foo}, {0}, a lone {
        raise UserError(f"the template {template!r} cannot be filled ({type(error).__name__}: {error}): it may name "
                        "{answer} and {other} alone, and a brace of its own is written twice ({{ or }})") from None


def name_swap(tokenizer: Tokenizer, answer: str = NAMES[0], other: str = NAMES[1], template: str = STORY,
              block_size: int | None = None) -> NameSwap:
    """The clean prompt (template with answer and other) and the corrupted one (the names swapped),
    as token ids after the start token (<|endoftext|>); UserError unless each name is one token, and
    unless the prompt fits in block_size tokens where the model's is given."""
    for name in (answer, other):
        if not name.strip():
            raise UserError(f"a name is {name!r}: give two names, each one token for this run's tokenizer")
    answer, other = answer.strip(), other.strip()  # " Mia" is Mia: the template puts the space before each name
    if answer == other:
        raise UserError(f"both names are {answer!r}: swapped, the prompt is the same, so give two different names")
    for name in (answer, other):
        pieces = tokenizer.token_strings(tokenizer.encode(" " + name))
        if len(pieces) != 1:
            examples = one_token_names(tokenizer)[:4]
            which = f"only {examples[0]} is" if examples else "none is"
            instead = (f"pick names that are, e.g. {', '.join(examples)}" if len(examples) >= 2 else
                       f"of the stories' names {which} one token for it, and the swap needs two (a character tokenizer, "
                       "or a small BPE, spells names out): use a run whose BPE holds them, as the default run's does")
            raise UserError(f"{' ' + name!r} is {len(pieces)} tokens for this run's tokenizer ({pieces}), not one: {instead}")
    clean_text, corrupted_text = filled(template, answer, other), filled(template, other, answer)
    if clean_text == corrupted_text:
        raise UserError(f"the template {template!r} reads the same with the names swapped, so there is nothing to patch: "
                        "name {answer} and {other} in it, e.g. 'On the way, {answer} met {other}. {other} hugged'")
    clean = [tokenizer.bos_id, *tokenizer.encode(clean_text)]
    corrupted = [tokenizer.bos_id, *tokenizer.encode(corrupted_text)]
    if len(clean) != len(corrupted):  # each name is one token after a space (above): one stands where none comes before it
        raise UserError(f"the prompt is {len(clean)} tokens with the names one way round and {len(corrupted)} the other: "
                        "patching needs prompts of the same length, and each name is one token only after a space; put "
                        "a space before each {answer} and {other} in the template (not at its start)")
    if block_size is not None and len(clean) > block_size:
        raise UserError(f"the name swap's prompt is {len(clean) - 1} tokens after the start token, and this model reads "
                        f"at most {block_size - 1} (its block_size is {block_size}): use shorter prompts (a template of your own, or "
                        "two typed in the Attention tab)")
    ids = [tokenizer.encode(" " + name)[0] for name in (answer, other)]
    return NameSwap(torch.tensor([clean]), torch.tensor([corrupted]), *ids, tokenizer.token_strings(clean))
