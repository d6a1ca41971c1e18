"""The hook points against TransformerLens 4, the field's reference: the same GPT-2-shaped weights,
saved by Hugging Face transformers, booted in TransformerLens's TransformerBridge and loaded here,
give the same activations under the same names, the same loss with a head zeroed in both, the
same activation patching (transformer_lens.patching, which takes the bridge) and the same direct
logit attribution (its cache's full residual decomposition through the frozen final norm)."""

import re

import pytest
import torch
import torch.nn.functional as F

from inspection.logit_attribution import logit_attribution
from inspection.patching import logit_difference, patch_heads, patch_residual
from model_io.hf_models import gpt_from_hf
from tests.helpers import tiny_gpt2

NAMES = ["blocks.{l}.attn.hook_q", "blocks.{l}.attn.hook_k", "blocks.{l}.attn.hook_v", "blocks.{l}.attn.hook_attn_scores",
         "blocks.{l}.attn.hook_pattern",
         "blocks.{l}.attn.hook_z", "blocks.{l}.hook_attn_out", "blocks.{l}.hook_resid_mid", "blocks.{l}.mlp.hook_post",
         "blocks.{l}.hook_resid_post", "blocks.{l}.ln1.hook_scale", "blocks.{l}.ln2.hook_normalized"]


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """(this project's GPT, TransformerLens's bridge) on one tiny GPT-2 folder, and tokens."""
    # Imported here: it takes seconds, which only the worker running these tests should pay.
    from transformer_lens.model_bridge import TransformerBridge
    folder = tmp_path_factory.mktemp("gpt2")
    tiny_gpt2(seed=3).save_pretrained(folder)
    bridge = TransformerBridge.boot_transformers(str(folder), device="cpu")
    bridge.enable_compatibility_mode(no_processing=True)  # the weights as saved: no folded norms, no centring
    ours, _ = gpt_from_hf(folder)
    tokens = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    return ours.eval(), bridge.eval(), tokens


def test_the_hook_points_hold_transformer_lens_activations_under_the_same_names(both):
    ours, bridge, tokens = both
    names = [name.format(l=layer) for layer in range(2) for name in NAMES] + ["hook_embed", "ln_final.hook_normalized"]
    with torch.no_grad():
        our_logits, our_cache = ours.run_with_cache(tokens, names=names)
        their_logits, their_cache = bridge.run_with_cache(tokens, names_filter=names)
    for name in names:
        torch.testing.assert_close(our_cache[name], their_cache[name], atol=1e-5, rtol=1e-5, msg=name)
    torch.testing.assert_close(our_logits, their_logits, atol=1e-5, rtol=1e-5)
    # What each head writes: TransformerLens's own split of the attention outputs, head by head.
    # As TransformerLens counts layer: the heads of the layers before it (-1: all of them).
    for layer in (-1, 1, 2):
        ours_stacked, our_labels = our_cache.stack_head_results(layer, return_labels=True)
        theirs_stacked, their_labels = their_cache.stack_head_results(layer=layer, return_labels=True)
        torch.testing.assert_close(ours_stacked, theirs_stacked, atol=1e-5, rtol=1e-5)
        assert our_labels == their_labels
        torch.testing.assert_close(our_cache.stack_activation("pattern", layer), their_cache.stack_activation("pattern", layer))


def test_the_residual_streams_stacks_and_parts_are_transformer_lenss_with_their_labels(both):
    ours, bridge, tokens = both
    with torch.no_grad():
        _, our_cache = ours.run_with_cache(tokens)
        _, their_cache = bridge.run_with_cache(tokens)
        for method, options in (("accumulated_resid", {}), ("accumulated_resid", {"layer": 1, "incl_mid": True}),
                                ("accumulated_resid", {"layer": 1, "mlp_input": True, "apply_ln": True}),
                                ("accumulated_resid", {"apply_ln": True}),  # through the final norm itself: a logit lens
                                ("accumulated_resid", {"layer": 0}), ("decompose_resid", {}),
                                ("decompose_resid", {"layer": 1, "mode": "attn", "mlp_input": True, "apply_ln": True}),
                                ("decompose_resid", {"mode": "mlp", "incl_embeds": False}),
                                ("decompose_resid", {"apply_ln": True}),
                                ("accumulated_resid", {"pos_slice": -1, "apply_ln": True, "incl_mid": True}),  # the last token's
                                ("decompose_resid", {"layer": 1, "pos_slice": slice(2, 5), "apply_ln": True}),
                                ("stack_head_results", {"pos_slice": -1, "apply_ln": True}),
                                ("stack_head_results", {"layer": 1, "apply_ln": True, "incl_remainder": True}),
                                ("accumulated_resid", {"pos_slice": (2, 5), "apply_ln": True, "layer": 1}),  # (start, stop)
                                ("accumulated_resid", {"pos_slice": [0, 3, 7]}),  # some positions, in order
                                ("decompose_resid", {"mode": "mlp", "mlp_input": True})):  # no attention part to add
            stacked, labels = getattr(our_cache, method)(**options, return_labels=True)
            their_stacked, their_labels = getattr(their_cache, method)(**options, return_labels=True)
            assert labels == their_labels, (method, options)
            torch.testing.assert_close(stacked, their_stacked, atol=1e-5, rtol=1e-5, msg=f"{method} {options}")
        parts = our_cache.decompose_resid(layer=1, mlp_input=True)  # what layer 1's MLP norm reads, in parts
        torch.testing.assert_close(parts.sum(0), our_cache["resid_mid", 1], atol=1e-5, rtol=0)  # which add up to it
        torch.testing.assert_close(our_cache.apply_ln_to_stack(parts, 1, mlp_input=True),
                                   their_cache.apply_ln_to_stack(parts, 1, mlp_input=True), atol=1e-5, rtol=1e-5)
        last = parts[:, :, -1]  # (P, B, C): one position, indexed before scaling
        torch.testing.assert_close(our_cache.apply_ln_to_stack(last, 1, mlp_input=True, pos_slice=-1),
                                   their_cache.apply_ln_to_stack(last, 1, mlp_input=True, pos_slice=-1), atol=1e-5, rtol=1e-5)
        final = our_cache["resid_post", -1][:, -1]  # (B, C): one stream, no parts, as TransformerLens also takes it
        torch.testing.assert_close(our_cache.apply_ln_to_stack(final, pos_slice=-1),
                                   their_cache.apply_ln_to_stack(final, pos_slice=-1), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=re.escape(f"a stack of shape {tuple(last.shape)} does not fit the scale of shape "
                                                   f"(2, 12, 1) the norm found: its last dimensions must be (2, 12, {ours.config.n_embd}) "
                                                   f"(C = {ours.config.n_embd}, the model's width), parts first or not; a stack of "
                                                   "some positions takes the pos_slice that picked them")):
        our_cache.apply_ln_to_stack(last, 1, mlp_input=True)  # TransformerLens's pos_slice forgotten: refused, not broadcast


# TransformerLens's short keys: (name, layer), and (name, layer, part) where two parts of a block
# have the name, with its aliases for names and parts.
SHORT_KEYS = [("scale", 0, "ln1"), ("scale", 1, "ln2"), ("normalized", 0, "ln2"), ("pattern", 1), ("attn", 0),
              ("pattern", 0, "a"), ("z", 1, "attn"), ("key", 0), ("query", 1), ("value", 0), ("post", 1, "m"),
              ("mlp_post", 0), ("resid_pre", 1, "b"), ("resid_post", 0, "block"), ("attn_out", 1), ("q", -1),
              "pattern1", "scale1ln2", "z0a", "post1m", "embed"]  # in one word, as TransformerLens also spells them


def test_a_short_key_finds_in_our_cache_what_it_finds_in_transformer_lenss(both):
    ours, bridge, tokens = both
    with torch.no_grad():
        _, our_cache = ours.run_with_cache(tokens)
        _, their_cache = bridge.run_with_cache(tokens)
    for key in SHORT_KEYS:
        torch.testing.assert_close(our_cache[key], their_cache[key], atol=1e-5, rtol=1e-5, msg=str(key))
    assert our_cache.name_of(("scale", 1, "ln2")) == "blocks.1.ln2.hook_scale"  # and not ln1's, which ("scale", 1) gives


def test_a_head_zeroed_through_hook_z_costs_the_same_loss_in_both(both):
    ours, bridge, tokens = both

    def zero_head_1(z, hook):  # (B, T, H, D) in both
        z = z.clone()
        z[:, :, 1] = 0.0
        return z

    hooks = [("blocks.1.attn.hook_z", zero_head_1)]
    with torch.no_grad():
        our_logits, _ = ours.run_with_hooks(tokens, fwd_hooks=hooks)
        their_logits = bridge.run_with_hooks(tokens, fwd_hooks=hooks)
        intact, _ = ours(tokens)
    loss = lambda logits: F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten()).item()  # noqa: E731
    assert loss(our_logits) == pytest.approx(loss(their_logits), abs=1e-5)
    assert not torch.allclose(our_logits, intact, atol=1e-2)  # the head mattered: the test can tell a miss


def test_functions_that_edit_in_place_or_hide_a_whole_row_give_transformer_lenss_logits(both):
    # As TransformerLens's hooks are often written: edit the activation in place, return nothing. Under
    # autograd too, where hook_q is a slice of one split and hook_pattern what softmax's backward reads.
    ours, bridge, tokens = both

    def hide_the_first_key(scores, hook):  # (B, H, T, S): query 0 sees no key at all now
        scores[..., 0] = float("-inf")

    def zero_head_0(q, hook):  # (B, T, H, D)
        q[:, :, 0] = 0.0

    def halve_the_first_weight(pattern, hook):  # (B, H, T, S)
        pattern[..., 0] *= 0.5

    hooks = [("blocks.0.attn.hook_attn_scores", hide_the_first_key), ("blocks.1.attn.hook_q", zero_head_0),
             ("blocks.1.attn.hook_pattern", halve_the_first_weight)]
    our_logits, _ = ours.run_with_hooks(tokens, fwd_hooks=hooks)
    their_logits = bridge.run_with_hooks(tokens, fwd_hooks=hooks)
    assert not our_logits.isnan().any()  # the row with no key attends to nothing, as in TransformerLens
    torch.testing.assert_close(our_logits, their_logits, atol=1e-5, rtol=1e-5)
    our_logits.sum().backward()  # the edits left what autograd saved alone
    assert ours.blocks[1].attn.qkv.weight.grad.isfinite().all()
    ours.zero_grad(set_to_none=True)
    with torch.no_grad():
        intact, _ = ours(tokens)
    assert not torch.allclose(our_logits, intact, atol=1e-2)  # the edits mattered: the test can tell a miss


@pytest.fixture(scope="module")
def corrupted(both):
    """The tokens with one position changed in each row: a clean/corrupted pair for patching."""
    _, _, tokens = both
    corrupted = tokens.clone()
    corrupted[:, 3] = (corrupted[:, 3] + 7) % 300
    return corrupted


def test_patching_heads_and_the_residual_stream_gives_what_transformer_lens_patching_gives(both, corrupted):
    from transformer_lens import patching

    ours, bridge, tokens = both
    metric = logit_difference(-1, 5, 9)
    with torch.no_grad():
        _, clean_cache = bridge.run_with_cache(tokens)
        their_heads = patching.get_act_patch_attn_head_out_all_pos(bridge, corrupted, clean_cache, metric)  # (L, H)
        their_resid = patching.get_act_patch_resid_pre(bridge, corrupted, clean_cache, metric)  # (L, T)
    heads, resid = patch_heads(ours, tokens, corrupted, metric), patch_residual(ours, tokens, corrupted, metric)
    torch.testing.assert_close(heads.patched.float(), their_heads, atol=1e-5, rtol=0)
    torch.testing.assert_close(resid.patched.float(), their_resid, atol=1e-5, rtol=0)
    assert (heads.patched - heads.corrupted).abs().max() > 1e-3  # some patch moved the metric: the test can tell


def test_each_parts_direct_share_is_transformer_lens_decomposition_through_the_frozen_final_norm(both):
    ours, bridge, tokens = both
    with torch.no_grad():
        _, cache = bridge.run_with_cache(tokens)
        stack, labels = cache.get_full_resid_decomposition(layer=-1, return_labels=True, expand_neurons=False)
        scaled = cache.apply_ln_to_stack(stack[:, :, -1], layer=-1, pos_slice=-1)  # (P, B, C): centred, / scale
    direction = ours.lm_head.weight[5] - ours.lm_head.weight[9]  # (C,): the logit difference's direction
    theirs = dict(zip(labels, (scaled * ours.ln_f.weight) @ direction, strict=True))  # the norm's gain, then the unembedding
    theirs["bias"] = theirs["bias"] + direction @ ours.ln_f.bias  # the final norm's bias: in "bias" here
    attribution = logit_attribution(ours, tokens, -1, 5, 9)
    assert set(attribution.shares) == set(theirs)
    for label, share in attribution.shares.items():
        torch.testing.assert_close(share, theirs[label], atol=1e-5, rtol=0, msg=label)
