"""The Attention tab's three tools on a run's model, less the HTTP: the logit lens and direct logit
attribution on the tokens the views show (your text, or the repeated random tokens), and
activation patching on two prompts of your own. Each answer is the JSON the page reads; the
numbers are those of inspection/logit_lens.py, logit_attribution.py and patching.py."""

import math
from collections.abc import Collection

import torch

from attention_tab.live_model import LoadedModel, checkpoint_fields, finite, token_labels
from inspection.heatmap import readable_token
from inspection.logit_attribution import check_position, logit_attribution
from inspection.logit_lens import lens_summary
from inspection.name_swap import STORY, name_swap, one_token_names
from inspection.patching import knock_out_effects, logit_difference, patch_heads, patch_residual
from inspection.repeated_tokens import default_n, repeated_ids
from inspection.text_forward import TOP_K, check_heads, single_token, text_ids
from user_error import UserError

# Patching's layers x positions grid runs a forward of the prompt per layer and position: 64 tokens
# take about 1 s on the default model (docs/speed.md), and the tab answers one request at a time.
MAX_PATCH_TOKENS = 64  # the prompt's own tokens, as the user counts them: <eot> before them is one more
Source = dict  # the tokens a tool reads: {"text": str}, or {"n": int | None, "seed": int} for the repeated tokens


def source_ids(loaded: LoadedModel, source: Source) -> list[int]:
    """The ids the text or repeated route reads for the same source: the start token first."""
    block_size = loaded.model.config.block_size
    if "text" in source:
        return text_ids(loaded.tokenizer, source["text"], block_size)
    n = default_n(block_size) if source["n"] is None else source["n"]
    return repeated_ids(loaded.tokenizer, n, source["seed"], block_size)


def number(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no NaN: a model gone non-finite


def labels_of(loaded: LoadedModel, ids) -> list[str]:
    return [readable_token(piece) for piece in loaded.tokenizer.token_strings(list(ids))]


def lens_answer(run: str, loaded: LoadedModel, source: Source, knocked_out: Collection[tuple[int, int]]) -> dict:
    """The logit lens on the source, with the heads knocked out that the views show knocked out:
        run, checkpoint, step, labels [T], knocked_out, vocab_size
        next_log_prob  [L][T - 1]: log p(the token that came next) after each layer
        next_rank      [L][T - 1]: its rank, 1 for the likeliest (tokens tied with it do not count)
        top            {tokens [L][T][k], probs [L][T][k]}: the k likeliest after each layer
    After the last layer these are the model's own numbers (the text route's next)."""
    model, heads = loaded.model, sorted(set(knocked_out))
    check_heads(model, heads)
    ids = source_ids(loaded, source)
    idx = torch.tensor([ids], device=next(model.parameters()).device)  # (1, T)
    with model.hooks(model.knock_out(heads)):
        lens = lens_summary(model, idx, TOP_K)
    return {**checkpoint_fields(run, loaded), "labels": labels_of(loaded, ids), "knocked_out": [list(h) for h in heads],
            "vocab_size": loaded.tokenizer.vocab_size, "next_log_prob": finite(lens.next_log_prob),
            "next_rank": lens.next_rank.tolist(), "top": {"tokens": token_labels(loaded.tokenizer, lens.top_ids), "probs": finite(lens.top_probs)}}  # (L, T, k)


def typed_token(loaded: LoadedModel, text: str, field: str) -> dict:
    """{id, label} of a token typed in a field; UserError naming the field and the pieces when
    the run's tokenizer makes it more than one token."""
    try:
        token = single_token(loaded.tokenizer, text)
    except UserError as err:
        raise UserError(f"{field}: {err}") from None
    return {"id": token, "label": labels_of(loaded, [token])[0]}


def against_token(loaded: LoadedModel, other: str, target: dict) -> dict | None:
    """The token typed to score against ({id, label}), or None when none was; UserError when it is
    the scored token itself (its logit less its own is 0 on any text)."""
    against = typed_token(loaded, other, "against") if other else None
    if against and against["id"] == target["id"]:
        raise UserError(f"against: {against['label']!r} is the token scored, and a logit less itself is 0; type another "
                        "token, or leave against empty")
    return against


def attribution_answer(run: str, loaded: LoadedModel, source: Source, knocked_out: Collection[tuple[int, int]],
                       position: int, token: str = "", other: str = "") -> dict:
    """Direct logit attribution at one query of the source: each part's share of the logit of
    `token` (empty: the token that came next) after position, less `other`'s when typed; and
    what knocking out each head alone costs that logit (difference), through every path:
        run, checkpoint, step, labels [T], knocked_out, position (0 .. T - 1)
        token, other  {id, label}; other null for a logit, not a difference
        logit         the model's own logit (difference); the shares add up to it
        heads [L][H], mlp [L]   each head's and each MLP's direct share
        parts         [[label, share], ...]: the embeddings ("embed", "pos_embed", "smear") and "bias"
        knock_out     [L][H]: the logit (difference) intact, less with that head knocked out"""
    model, heads = loaded.model, sorted(set(knocked_out))
    check_heads(model, heads)
    ids = source_ids(loaded, source)
    position = check_position(position, len(ids))
    if token:
        target = typed_token(loaded, token, "token")
    elif position == len(ids) - 1:
        raise UserError(f"token {position} is the last one: nothing came after it; type the token to score there, "
                        "or pin an earlier query")
    else:
        target = {"id": ids[position + 1], "label": labels_of(loaded, [ids[position + 1]])[0]}
    against = against_token(loaded, other, target)
    other_id = against["id"] if against else None
    idx = torch.tensor([ids], device=next(model.parameters()).device)  # (1, T)
    with model.hooks(model.knock_out(heads)):
        attribution = logit_attribution(model, idx, position, target["id"], other_id)
        # A causal model's logit at position reads no later token: the knock-outs run on the tokens up to it.
        effects = knock_out_effects(model, idx[:, : position + 1], logit_difference(-1, target["id"], other_id))  # (L, H)
    shares = {label: share.item() for label, share in attribution.shares.items()}  # (B,) = (1,) each
    L = len(model.blocks)
    layer_labels = {f"L{layer}H{head}" for layer in range(L) for head in range(model.config.n_head)}
    layer_labels |= {f"{layer}_mlp_out" for layer in range(L)}
    return {**checkpoint_fields(run, loaded), "labels": labels_of(loaded, ids), "knocked_out": [list(h) for h in heads],
            "position": position, "token": target, "other": against, "logit": number(attribution.logit.item()),
            "heads": finite(attribution.heads()[..., 0]), "mlp": [number(shares[f"{layer}_mlp_out"]) for layer in range(L)],
            "parts": [[label, number(share)] for label, share in shares.items() if label not in layer_labels],
            "knock_out": finite(effects)}


def prompt_ids(loaded: LoadedModel, text: str, which: str) -> torch.Tensor:
    """(1, T): the start token and the prompt's ids; UserError naming the prompt, and for more than
    MAX_PATCH_TOKENS of its own (patching runs a forward of the prompt for each layer and position).
    Every message counts the prompt's tokens without the start token, as the user typed them."""
    try:
        ids = text_ids(loaded.tokenizer, text, loaded.model.config.block_size)
    except UserError as err:
        raise UserError(f"the {which} prompt: {err}") from None
    if len(ids) - 1 > MAX_PATCH_TOKENS:
        raise UserError(f"the {which} prompt is {len(ids) - 1} tokens; the tab patches at most {MAX_PATCH_TOKENS} "
                        "(a forward of the prompt for each layer and position): shorten it, or call "
                        "inspection.patching.patch_residual from Python")
    return torch.tensor([ids], device=next(loaded.model.parameters()).device)


def patch_example(run: str, loaded: LoadedModel) -> dict:
    """The prompts the patching tool starts from, in words the run's tokenizer reads: the name swap
    of inspection/name_swap.py (its stories' sentence, with the first two of their names that
    are one token each): run, checkpoint, step, and clean, corrupted, token, other as text; or,
    where the tokenizer has no such names or the model's block_size cannot hold the sentence, those
    four null and `why` saying so (the page asks on its own for every run: no example is an answer,
    not a bad request)."""
    try:
        names = one_token_names(loaded.tokenizer)[:2]
    except UserError:  # a tokenizer without a space (a character one): no name is a word of its own
        names = []
    try:
        if len(names) < 2:
            raise UserError("this run's tokenizer makes no two of the stories' names one token each: type two prompts of "
                            "your own")
        answer, other = names
        # UserError when the swapped prompt has another length, or does not fit in the model's block_size
        name_swap(loaded.tokenizer, answer, other, block_size=loaded.model.config.block_size)
    except UserError as err:
        return {**checkpoint_fields(run, loaded), "clean": None, "corrupted": None, "token": None, "other": None,
                "why": str(err)}
    return {**checkpoint_fields(run, loaded), "clean": STORY.format(answer=answer, other=other),
            "corrupted": STORY.format(answer=other, other=answer), "token": " " + answer, "other": " " + other, "why": None}


def patch_answer(run: str, loaded: LoadedModel, clean: str, corrupted: str, token: str, other: str = "") -> dict:
    """Activation patching from the clean prompt into the corrupted one (the same number of
    tokens), the metric the logit of `token` less `other`'s at the last token:
        run, checkpoint, step
        labels        {clean [T], corrupted [T]}
        token, other  {id, label}; other null: the metric is token's logit alone
        clean, corrupted   the metric on each prompt
        caution       null, or a line to read beside the shares: the metric barely moves between the prompts
        heads         [L][H]: the share of clean - corrupted that one head's output (at every
                      position) taken from the clean run restores: 0 nothing, 1 all
        residual      [L][T]: the same for the residual stream entering layer l, at one position"""
    clean_idx, corrupted_idx = prompt_ids(loaded, clean, "clean"), prompt_ids(loaded, corrupted, "corrupted")
    if clean_idx.shape != corrupted_idx.shape:  # counted as prompt_ids counts them: without the start token
        raise UserError(f"the clean prompt is {clean_idx.shape[1] - 1} tokens and the corrupted one {corrupted_idx.shape[1] - 1}: "
                        "patching swaps activations position by position, so give prompts of the same length")
    target = typed_token(loaded, token, "token")
    against = against_token(loaded, other, target)
    metric = logit_difference(-1, target["id"], against["id"] if against else None)
    heads = patch_heads(loaded.model, clean_idx, corrupted_idx, metric)  # (L, H)
    residual = patch_residual(loaded.model, clean_idx, corrupted_idx, metric)  # (L, T)
    return {**checkpoint_fields(run, loaded),
            "labels": {"clean": labels_of(loaded, clean_idx[0].tolist()), "corrupted": labels_of(loaded, corrupted_idx[0].tolist())},
            "token": target, "other": against, "clean": number(heads.clean), "corrupted": number(heads.corrupted),
            "caution": heads.caution,
            "heads": finite(heads.fraction), "residual": finite(residual.fraction)}
