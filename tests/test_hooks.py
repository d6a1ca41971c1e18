"""The hook points (model/hooks.py): every name the docs list is in the model with its shape, the
cache holds what the forward really used, a function that hands back a tensor changes what comes
after, and bad names get one clear line. TransformerLens's numbers: tests/test_transformer_lens.py."""

import math
import re
import shutil

import pytest
import torch

from model.gpt import GPTConfig
from tests.helpers import ARCHITECTURE_OPTIONS, ROOT, lively, tiny_gpt

B, T, C, H, L = 2, 9, 32, 2, 2


def documented_points(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """{name with {l}: shape} from docs/hooks.md's table of names, its letters at config's sizes."""
    letters = {"B": B, "T": T, "S": T, "C": C, "H": H, "K": config.kv_heads, "D": config.head_size,
               "F": config.hidden_size, "1": 1}
    rows = re.findall(r"^\| `([\w.{}]+)` \| \(([\w, ]+)\) \|", (ROOT / "docs" / "hooks.md").read_text(), flags=re.MULTILINE)
    return {name: tuple(letters[letter.strip()] for letter in shape.split(",")) for name, shape in rows}


@pytest.mark.parametrize("options", ARCHITECTURE_OPTIONS[1:], ids=lambda options: ",".join(f"{k}={v}" for k, v in options.items()))
def test_every_hook_point_the_docs_list_is_in_the_model_with_its_shape(options):
    model = tiny_gpt(**options).eval()
    documented = documented_points(model.config)
    assert len(documented) >= 20
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.randint(0, 65, (B, T)))
    expected = {name.format(l=layer): shape for name, shape in documented.items() for layer in range(L)}
    assert set(model.hook_dict) <= set(expected)  # no point the docs leave out
    assert set(cache) == set(model.hook_dict)  # names=None: every point, each reached once
    for name, activation in cache.items():
        assert tuple(activation.shape) == expected[name], name
    # The points that only some models have are there exactly when their option is on.
    config = model.config
    assert ("smear.hook_out" in cache) == config.smear and ("hook_pos_embed" in cache) == (config.pos == "learned")
    assert ("blocks.0.attn.hook_rot_q" in cache) == (config.pos == "rope" or config.qk_norm)
    assert ("blocks.0.mlp.hook_pre_linear" in cache) == (config.mlp == "swiglu")


def test_the_cache_holds_what_the_forward_used_step_by_step():
    model = tiny_gpt(bias=True, pos="rope", qk_norm=True).eval()
    idx = torch.randint(0, 65, (B, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, cache = model.run_with_cache(idx)
        plain, _ = model(idx)
        torch.testing.assert_close(logits, plain, atol=1e-5, rtol=1e-5)  # the manual path, equal to rounding
        last = cache["resid_post", -1]  # (B, T, C)
        torch.testing.assert_close(model.lm_head(model.ln_f(last)), logits, atol=1e-5, rtol=1e-5)
        for layer, block in enumerate(model.blocks):
            q, k, v = (cache[name, layer].transpose(1, 2) for name in ("rot_q", "rot_k", "v"))  # (B, H, T, D)
            future = torch.ones(T, T, dtype=torch.bool).triu(1)
            scores = (q @ k.transpose(-2, -1) / math.sqrt(C // H)).masked_fill(future, float("-inf"))  # (B, H, T, T)
            torch.testing.assert_close(cache["attn_scores", layer], scores, atol=1e-5, rtol=1e-5)  # -inf where hidden
            pattern = scores.softmax(-1)
            torch.testing.assert_close(cache["pattern", layer], pattern, atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(cache["z", layer], (pattern @ v).transpose(1, 2), atol=1e-6, rtol=1e-5)  # (B, T, H, D)
            # The heads' results and the output projection's bias add up to what attention adds.
            heads = cache.stack_head_results()[layer * H : (layer + 1) * H]  # (H, B, T, C)
            torch.testing.assert_close(heads.sum(0) + block.attn.proj.bias, cache["attn_out", layer], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(cache["resid_mid", layer], cache["resid_pre", layer] + cache["attn_out", layer])
            torch.testing.assert_close(cache["resid_post", layer], cache["resid_mid", layer] + cache["mlp_out", layer])
    assert cache.stack_head_results(return_labels=True)[1] == ["L0H0", "L0H1", "L1H0", "L1H1"]
    assert cache["embed"] is cache["hook_embed"] and cache["pattern", 1] is cache["blocks.1.attn.hook_pattern"]
    assert cache.stack_activation("pattern").shape == (L, B, H, T, T)


def test_a_function_that_hands_back_a_tensor_changes_what_the_forward_computes_after_it():
    model = tiny_gpt(smear=True).eval()
    idx = torch.randint(0, 65, (B, T), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, _ = model.run_with_hooks(idx, fwd_hooks=[("blocks.1.hook_resid_post", lambda x, hook: torch.zeros_like(x))])
        assert torch.equal(logits, model.lm_head(model.ln_f(torch.zeros(B, T, C))))  # nothing before it is left
        # Every query looking evenly at every key, the future too: each head's output is the mean value.
        uniform = lambda pattern, hook: torch.full_like(pattern, 1 / T)  # noqa: E731
        _, cache = model.run_with_cache(idx, names=["blocks.0.attn.hook_v", "blocks.0.attn.hook_z"],
                                        fwd_hooks=[("blocks.0.attn.hook_pattern", uniform)])
        torch.testing.assert_close(cache["z", 0], cache["v", 0].mean(dim=1, keepdim=True).expand(B, T, H, C // H))
        # A test on names attaches to every point it accepts: here both layers' patterns.
        seen = []
        model.run_with_hooks(idx, fwd_hooks=[(lambda name: name.endswith("hook_pattern"), lambda x, hook: seen.append(hook.layer()))])
    assert seen == [0, 1] and not model.has_hooks()
    assert model.hook_dict["hook_embed"].layer() is None and model.hook_dict["ln_final.hook_normalized"].layer() is None


def test_functions_are_detached_after_run_with_hooks_even_when_one_raises():
    model = tiny_gpt()

    def fail(activation, hook):
        raise RuntimeError(f"stopped at {hook.name}")

    with pytest.raises(RuntimeError, match="stopped at blocks.0.hook_resid_mid"):
        model.run_with_hooks(torch.zeros(1, 3, dtype=torch.long), fwd_hooks=[("blocks.0.hook_resid_mid", fail)])
    assert not model.has_hooks()


def test_reset_hooks_detaches_what_add_hook_attached_and_whose_remover_was_lost():
    model = tiny_gpt().eval()
    idx = torch.randint(0, 65, (B, T), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        intact, _ = model(idx)
        for _ in range(2):  # a notebook cell run twice
            model.blocks[0].attn.hook_z.add_hook(lambda z, hook: torch.zeros_like(z))
        assert model.has_hooks() and not torch.equal(model(idx)[0], intact)
        model.reset_hooks()
        assert not model.has_hooks() and torch.equal(model(idx)[0], intact)


def test_the_cache_keeps_what_a_point_handed_on_though_a_later_function_edits_that_tensor_in_place():
    model = tiny_gpt().eval()
    idx = torch.randint(0, 65, (B, T), generator=torch.Generator().manual_seed(5))

    def add_in_place(x, hook):  # at blocks.1.hook_resid_pre: the very tensor blocks.0.hook_resid_post handed on
        x += 100.0

    with torch.no_grad():  # as the docs advise: no copy from autograd's side
        _, plain = model.run_with_cache(idx, names=["blocks.0.hook_resid_post"])
        _, edited = model.run_with_cache(idx, names=["blocks.0.hook_resid_post", "blocks.1.hook_resid_pre"],
                                         fwd_hooks=[("blocks.1.hook_resid_pre", add_in_place)])
    torch.testing.assert_close(edited["resid_post", 0], plain["resid_post", 0], atol=0, rtol=0)
    torch.testing.assert_close(edited["resid_pre", 1], plain["resid_post", 0] + 100.0)


def test_a_model_gone_nan_stays_nan_with_a_function_reading_hook_attn_scores():
    # A row a function hides whole attends to nothing (tests/test_transformer_lens.py); a NaN of the
    # model's own is not hidden by that, nor by the cache, which reads every point.
    model = tiny_gpt(attention="manual").eval()
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight[0] = float("nan")  # head 0's first query channel
        idx = torch.randint(0, 65, (B, T), generator=torch.Generator().manual_seed(4))
        assert model(idx)[0].isnan().any()
        assert model.run_with_hooks(idx, fwd_hooks=[("blocks.0.attn.hook_attn_scores", lambda s, hook: None)])[0].isnan().any()
        assert model.run_with_cache(idx)[0].isnan().any()


def test_an_unknown_name_is_refused_with_the_near_ones_before_anything_is_attached():
    model = tiny_gpt()
    message = re.escape("no hook point named 'blocks.0.attn.hook_patern' in this model: did you mean "
                        "blocks.0.attn.hook_pattern")
    keep = lambda x, hook: None  # noqa: E731
    with pytest.raises(ValueError, match=message), model.hooks([("blocks.0.hook_resid_pre", keep), ("blocks.0.attn.hook_patern", keep)]):
        pass
    assert not model.has_hooks()  # the good name before it was not left attached
    with pytest.raises(ValueError, match="no hook point named 'blocks.7.hook_resid_pre' in this model: did you mean"):
        model.run_with_cache(torch.zeros(1, 3, dtype=torch.long), names=["blocks.7.hook_resid_pre"])
    # A test that picks nothing (a capital Z): the knock-out ran nowhere and the logits came out unchanged.
    nowhere = ("^" + re.escape(f"the test on names picks none of this model's {len(model.hook_dict)} hook points; "
                               "list(model.hook_dict) names them all, e.g. 'blocks.0.attn.hook_z'") + "$")
    with pytest.raises(ValueError, match=nowhere), model.hooks([(lambda name: name.endswith("attn.hook_Z"), keep)]):
        pass
    with pytest.raises(ValueError, match=nowhere):
        model.run_with_cache(torch.zeros(1, 3, dtype=torch.long), names=lambda name: name.startswith("block.0"))
    assert not model.has_hooks()


def test_run_with_cache_takes_transformer_lenss_names_filter_and_says_in_one_line_what_names_are():
    model = tiny_gpt()
    idx = torch.zeros(1, 3, dtype=torch.long)
    _, cache = model.run_with_cache(idx, names_filter=lambda name: name.endswith("hook_q"))  # TransformerLens's keyword
    assert list(cache) == ["blocks.0.attn.hook_q", "blocks.1.attn.hook_q"]
    short = ("no hook point named 'scores': here a point is named in full, e.g. blocks.0.attn.hook_attn_scores; every "
             "layer's: lambda name: name.endswith('hook_attn_scores')")  # as cache["scores", 0] would find it
    for names, error, message in [
        ("scores", ValueError, short),
        (3, TypeError, "names=3: give a name, a list of names or a test on names (None: every point), e.g. "
                       "names=['blocks.0.attn.hook_pattern']"),
        (lambda activation, hook: True, TypeError, "the test on names takes (activation, hook): it is called with one "
                                                   "argument, a hook point's name, and returns whether to pick it (a hook "
                                                   "function goes in fwd_hooks)"),
    ]:
        with pytest.raises(error, match="^" + re.escape(message) + "$"):
            model.run_with_cache(idx, names=names)
    with pytest.raises(ValueError, match="^names and names_filter are two words for one thing: give one of them$"):
        model.run_with_cache(idx, names="hook_embed", names_filter="hook_embed")
    assert not model.has_hooks()


@pytest.mark.parametrize(("options", "name", "why"), [
    ({"pos": "rope"}, "hook_pos_embed", "this model has no position embeddings: its positions are rotary (model.pos=rope)"),
    ({"pos": "learned", "qk_norm": False}, "blocks.1.attn.hook_rot_k", "this model has neither rotary positions nor QK-norm"),
    ({}, "blocks.0.attn.hook_result", "no forward here makes each head's output through W_O"),
    ({}, "blocks.0.hook_result", "no forward here makes each head's output through W_O"),  # attn. left out: the same
    ({}, "blocks.0.hook_v_input", "the heads' inputs are not split here: every head reads ln1's output (its hook_normalized "
     "times its gain, plus its bias if it has one); one head's own queries, keys and values are blocks.<l>.attn.hook_q, hook_k and hook_v "
     "at [:, :, head]"),
    ({"mlp": "gelu"}, "blocks.0.mlp.hook_pre_linear", "this model's MLP is not gated (model.mlp is not swiglu)"),
    ({"pos": "rope"}, "blocks.5.attn.hook_rot_q", "did you mean blocks.1.attn.hook_rot_q"),  # no layer 5: no reason
])
def test_a_transformer_lens_name_this_model_lacks_says_why_and_where_to_look(options, name, why):
    model = tiny_gpt(**options)
    with pytest.raises(ValueError, match="^" + re.escape(f"no hook point named {name!r} in this model: {why}")):
        model.run_with_cache(torch.zeros(1, 3, dtype=torch.long), names=[name])
    _, cache = model.run_with_cache(torch.zeros(1, 3, dtype=torch.long), names=["hook_embed"])
    with pytest.raises(KeyError) as caught:
        cache[name]
    assert caught.value.args[0].startswith(f"no hook point for {name!r} in this model: {why}")  # as run_with_cache says
    assert str(caught.value) == caught.value.args[0]  # printed as written: a plain KeyError's shows in quotes
    # Each name is there where the model has what it names (hook_result nowhere: stack_head_results() computes it).
    lacking = {"hook_pos_embed": {"pos": "learned"}, "blocks.1.attn.hook_rot_k": {"pos": "rope"},
               "blocks.0.mlp.hook_pre_linear": {"mlp": "swiglu"}}
    if name in lacking:
        assert name in tiny_gpt(**lacking[name]).hook_dict


def test_a_function_that_returns_another_shape_is_one_line_naming_its_point_and_the_shape_it_must_keep():
    model = tiny_gpt()
    one_head = lambda z, hook: z[:, :, 0]  # noqa: E731  # (B, T, D) for (B, T, H, D)
    with pytest.raises(ValueError, match="^" + re.escape("the function at blocks.0.attn.hook_z returned shape (1, 3, 16): it must "
                                                         "return None or a tensor of the activation's shape (1, 3, 2, 16)") + "$"):
        model.run_with_hooks(torch.zeros(1, 3, dtype=torch.long), fwd_hooks=[("blocks.0.attn.hook_z", one_head)])
    with pytest.raises(ValueError, match="^the function at blocks.1.hook_resid_post returned float: it must"):
        model.run_with_hooks(torch.zeros(1, 3, dtype=torch.long), fwd_hooks=[("blocks.1.hook_resid_post", lambda x, hook: 0.0)])
    assert not model.has_hooks()


def test_a_cache_asked_for_a_name_it_did_not_keep_says_what_it_holds_and_how_to_ask():
    model = tiny_gpt()
    _, cache = model.run_with_cache(torch.zeros(1, 3, dtype=torch.long), names=["blocks.1.attn.hook_z"])
    with pytest.raises(KeyError, match=re.escape("this cache did not record 'blocks.0.attn.hook_pattern': it holds "
                                                 "blocks.1.attn.hook_z. Ask run_with_cache for it: names=[")):
        cache["pattern", 0]
    with pytest.raises(KeyError, match=re.escape("no hook point for ('patern', 0) in this model: did you mean")):
        cache["patern", 0]


@pytest.mark.slow
def test_the_hooks_pages_example_runs_on_a_trained_run(trained_run, tmp_path, monkeypatch):
    example = re.search(r"^```py\n(.*?)^```", (ROOT / "docs" / "hooks.md").read_text(), flags=re.MULTILINE | re.DOTALL)[1]
    assert 'resolve_checkpoint("latest")' in example
    shutil.copytree(trained_run, tmp_path / "outputs" / "run")
    monkeypatch.chdir(tmp_path)  # where "latest" looks: outputs/ under the working folder
    names: dict = {}
    exec(compile(example, "docs/hooks.md", "exec"), names)
    assert names["results"].shape[0] == len(names["labels"]) == 4  # 2 layers x 2 heads
    assert names["part_labels"][0] == "embed" and names["part_labels"][-2:] == ["1_attn_out", "1_mlp_out"]
    with torch.no_grad():  # the last layer's lens: the logits (the example's last logits have heads knocked out)
        torch.testing.assert_close(names["lens"][-1], names["model"](names["idx"])[0], atol=1e-4, rtol=1e-5)
    assert set(names["cache"]) == {"blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"}
    assert not names["model"].has_hooks()


def test_a_cache_refuses_a_layer_the_model_lacks_counting_from_either_end():
    model = tiny_gpt()  # 2 layers
    _, cache = model.run_with_cache(torch.zeros(1, 3, dtype=torch.long))
    assert cache["pattern", -1] is cache["pattern", 1] and cache["pattern", -2] is cache["pattern", 0]  # as a list's index
    for layer in (2, -3):  # -3 once wrapped round to layer 1
        with pytest.raises(KeyError, match=re.escape(f"layer {layer} of ('pattern', {layer}) is not in this model: its 2 "
                                                     "layers are 0 to 1 (or -2 to -1 from the end)")):
            cache["pattern", layer]
    _, cache = tiny_gpt(n_layer=1).run_with_cache(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(KeyError, match=re.escape("layer 1 of ('pattern', 1) is not in this model: its one layer is 0 (or -1)")):
        cache["pattern", 1]


def test_a_stack_takes_the_layers_before_the_one_given_and_refuses_others_in_one_line():
    model = tiny_gpt()  # 2 layers of 2 heads
    _, cache = model.run_with_cache(torch.zeros(1, 3, dtype=torch.long))
    first, labels = cache.stack_head_results(1, return_labels=True)  # as TransformerLens counts: layer 0's heads
    assert labels == ["L0H0", "L0H1"] and torch.equal(first, cache.stack_head_results(None)[:2])
    assert cache.stack_activation("scale", 1, "ln2").shape == (1, 1, 3, 1)
    assert torch.equal(cache.stack_activation("scale", -1, "ln2")[1], cache["scale", 1, "ln2"])  # ln2's, not ln1's
    for layer in (0, 3, True, -2, 1.0):  # True was return_labels when it came first
        with pytest.raises(ValueError, match=re.escape(f"layer={layer!r}: a stack takes the layers before it, so layer "
                                                       "is 1 to 2 (-1 or None: all 2), as in TransformerLens; for the "
                                                       "labels, return_labels=True")):
            cache.stack_head_results(layer)
    with pytest.raises(ValueError, match=re.escape("layer=0: a stack takes the layers before it")):
        cache.stack_activation("pattern", 0)
    for full, instead in (("blocks.1.attn.hook_pattern", "for 'blocks.1.attn.hook_pattern', cache.stack_activation('pattern')"),
                          ("hook_resid_post", "for 'hook_resid_post', cache.stack_activation('resid_post')"),  # a block's, unnamed
                          ("blocks.0.ln2.hook_scale", "for 'blocks.0.ln2.hook_scale', cache.stack_activation('scale', part='ln2')"),
                          ("hook_embed", "'hook_embed' is one activation, not one per layer: read cache['hook_embed']"),
                          ("ln_final.hook_scale", "'ln_final.hook_scale' is one activation, not one per layer: read "
                                                  "cache['ln_final.hook_scale']"),
                          ("hook_nothing", "no hook point of this model is named 'hook_nothing': docs/hooks.md lists them all")):
        with pytest.raises(ValueError, match="^" + re.escape("stack_activation takes a short name, the same in every layer, "
                                                             f"not a hook point's: {instead}") + "$"):
            cache.stack_activation(full)
    assert torch.equal(cache.stack_activation("scale", part="ln2")[0], cache["blocks.0.ln2.hook_scale"])  # what the line gives


@pytest.mark.parametrize("options", [dict(norm="layernorm", pos="learned", bias=True), dict(norm="rmsnorm", pos="rope", smear=True)],
                         ids=["layernorm, learned positions, biases", "rmsnorm, rotary, smear"])
def test_the_parts_of_the_final_stream_through_apply_ln_to_stack_add_up_to_what_the_final_norm_makes(options):
    # TransformerLens's linear picture of the final norm: each part centred (LayerNorm) and divided by
    # the scale the norm found for the whole stream; with the norm's gain and bias, the sum is its output.
    # (tests/test_transformer_lens.py compares the stacks themselves with TransformerLens's, on GPT-2.)
    model = lively(tiny_gpt(**options)).eval()
    with torch.no_grad():
        logits, cache = model.run_with_cache(torch.randint(0, 65, (2, 9), generator=torch.Generator().manual_seed(0)))
        parts, labels = cache.decompose_resid(return_labels=True)  # (P, B, T, C)
        assert labels[:2] == (["embed", "pos_embed"] if options["pos"] == "learned" else ["embed", "smear"])
        torch.testing.assert_close(parts.sum(0), cache["resid_post", -1], atol=1e-5, rtol=0)  # the parts add up
        gain, bias = model.ln_f.weight, getattr(model.ln_f, "bias", None)  # (C,) each; RMSNorm and bias=false: no bias
        bias = 0 if bias is None else bias
        through = cache.apply_ln_to_stack(parts).sum(0) * gain + bias  # (B, T, C)
        torch.testing.assert_close(through, cache["ln_final.hook_normalized"] * gain + bias, atol=1e-5, rtol=1e-5)
        lens = cache.accumulated_resid(apply_ln=True)  # (L + 1, B, T, C): the last, the final norm's own output
        torch.testing.assert_close(lens[-1] @ model.lm_head.weight.T, logits, atol=1e-4, rtol=1e-5)
    with pytest.raises(ValueError, match=re.escape("layer=3: a residual stack ends at the stream entering a layer, 0 to 2")):
        cache.accumulated_resid(3)
    _, one = model.run_with_cache(torch.zeros(1, 9, dtype=torch.long))  # one text: (1, T, 1) would broadcast silently
    for stack, message in ((one.accumulated_resid()[:, :, -1], "a stack of shape (3, 1, 32) does not fit the scale of "
                            "shape (1, 9, 1) the norm found"),
                           (one.accumulated_resid(pos_slice=slice(0, 4)), "a stack of shape (3, 1, 4, 32) does not fit")):
        with pytest.raises(ValueError, match="^" + re.escape(message)):
            one.apply_ln_to_stack(stack)
    assert one.apply_ln_to_stack(one.accumulated_resid()[:, :, -1], pos_slice=-1).shape == (3, 1, 32)  # with its pos_slice
    for stack, shape in ((one.accumulated_resid(), "(3, 1, 9, 32)"), (cache.accumulated_resid()[None], "(1, 3, 2, 9, 32)")):
        with pytest.raises(ValueError, match="^" + re.escape(f"a stack of shape {shape} does not fit the scale of shape (2, 9, 1)")):
            cache.apply_ln_to_stack(stack)  # another batch's stack, or one dimension too many, broadcasts no more
    lens = one.accumulated_resid(apply_ln=True)
    with model.hooks([("ln_final.hook_scale", lambda scale, hook: scale * 2)]):  # about the forward's stream, not the lens's
        torch.testing.assert_close(one.accumulated_resid(apply_ln=True), lens, atol=0, rtol=0)
    # pos_slice as TransformerLens takes it: (start, stop, step), positions in the order given, whole numbers only.
    whole = cache.accumulated_resid()  # (L + 1, B, T, C)
    assert torch.equal(cache.accumulated_resid(pos_slice=(0, 8, 2)), whole[:, :, 0:8:2])
    assert torch.equal(cache.accumulated_resid(pos_slice=[7, 0]), whole[:, :, [7, 0]])
    heads = cache.stack_head_results(incl_remainder=True, pos_slice=-1)  # (L * H + 1, B, C): the remainder at that position too
    torch.testing.assert_close(heads.sum(0), cache["resid_post", -1][:, -1], atol=1e-5, rtol=0)
    for call, message in ((lambda: one.decompose_resid(0, incl_embeds=False), "layer=0 without the embeddings leaves no part"),
                          (lambda: one.accumulated_resid(pos_slice=[0.5]), "pos_slice=[0.5]: give a position (an int"),
                          (lambda: one.decompose_resid(-1, mlp_input=True), "mlp_input=True adds the attention output a layer's MLP"),
                          (lambda: one.accumulated_resid(pos_slice="last"), "pos_slice='last': give a position (an int"),
                          # Past the text, or keeping nothing: torch's IndexError, or an empty stack, before.
                          (lambda: one.stack_head_results(pos_slice=9), "pos_slice=9 is past the 9 positions of this text: "
                                                                        "give positions from -9 to 8"),
                          (lambda: one.accumulated_resid(pos_slice=[0, -10]), "pos_slice=[0, -10] is past the 9 positions"),
                          (lambda: one.accumulated_resid(pos_slice=(5, 2)), "pos_slice=(5, 2) keeps none of the 9 positions"),
                          (lambda: one.accumulated_resid(pos_slice=slice(100, 200)), "pos_slice=slice(100, 200, None) keeps none"),
                          (lambda: one.accumulated_resid(pos_slice=[]), "pos_slice=[] lists no position: give at least one"),
                          # A slice or tuple that is no positions: Python's own words, about steps and arguments.
                          (lambda: one.accumulated_resid(pos_slice=slice(None, None, -1)), "pos_slice=slice(None, None, -1): "
                           "start, stop and step are whole numbers (or None), the step 1 or more"),
                          (lambda: one.accumulated_resid(pos_slice=(0, 3, 0)), "pos_slice=(0, 3, 0): start, stop and step"),
                          (lambda: one.accumulated_resid(pos_slice=("a", "b")), "pos_slice=('a', 'b'): start, stop and step"),
                          (lambda: one.accumulated_resid(pos_slice=(1, 2, 3, 4)), "pos_slice=(1, 2, 3, 4): a tuple is (start, "
                           "stop) or (start, stop, step), as slice() takes"),
                          # The model's width too: a stack of 7 dims on a model of 32 was divided without a word.
                          (lambda: one.apply_ln_to_stack(torch.zeros(3, 1, 9, 7)), "a stack of shape (3, 1, 9, 7) does not fit")):
        with pytest.raises(ValueError, match="^" + re.escape(message)):
            call()
    assert torch.equal(one.accumulated_resid(pos_slice=[-1, 0]), one.accumulated_resid()[:, :, [8, 0]])  # from the end too


def test_a_cache_key_of_another_form_says_which_forms_there_are():
    model = tiny_gpt()
    _, cache = model.run_with_cache(torch.zeros(1, 3, dtype=torch.long))
    assert cache["scale", 1, "ln2"] is cache["blocks.1.ln2.hook_scale"] is not cache["scale", 1]  # ("scale", 1): ln1's
    forms = "a cache's key is a name, (name, layer) or (name, layer, part of the block), e.g. 'blocks.0.ln2.hook_scale'"
    for key in [("pattern",), ("pattern", 0, "attn", 1), 5, (0, "pattern")]:  # once a ValueError from unpacking
        with pytest.raises(KeyError, match=re.escape(forms)):
            cache[key]
    parts = "is attn, mlp, ln1, ln2 or block (or TransformerLens's a, attention, m, b, blocks): e.g. ('scale', 0, 'ln2')"
    for key in [("scale", 0, "ln3"), ("scale", 0, 2)]:
        with pytest.raises(KeyError, match=re.escape(f"the part of a block in {key!r} {parts}")):
            cache[key]
    with pytest.raises(KeyError, match=re.escape("('scale', None, 'ln2') names a part of a block but no layer: give one, "
                                                 "e.g. ('scale', 0, 'ln2')")):
        cache["scale", None, "ln2"]
    for true in (True, torch.tensor(True)):  # once layer 1, as knock_out refuses it
        with pytest.raises(KeyError, match=re.escape(f"layer {true!r} of ('pattern', {true!r}) is not a whole number")):
            cache["pattern", true]


def test_a_layer_given_as_text_and_one_pair_not_in_a_list_are_one_line_each():
    model = tiny_gpt()
    _, cache = model.run_with_cache(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(KeyError, match=re.escape("layer '1' of ('pattern', '1') is not a whole number: give it as an int, "
                                                 "e.g. ('pattern', 1)")):
        cache["pattern", "1"]
    usage = "fwd_hooks is a list of (name, function) pairs, e.g. fwd_hooks=[(name, function)]"
    keep = lambda z, hook: None  # noqa: E731
    for fwd_hooks, what in [(("blocks.0.attn.hook_z", keep), ": put the one pair in a list"),
                            ("blocks.0.attn.hook_z", ", not a name alone"), ([keep], ": <function"),
                            (["blocks.0.attn.hook_z"], ": 'blocks.0.attn.hook_z' is not such a pair"),
                            ([(keep, "blocks.0.attn.hook_z")], ": (<lambda>, 'blocks.0.attn.hook_z') has them the other way round")]:
        with pytest.raises(ValueError, match="^" + re.escape(usage + what)):
            model.run_with_hooks(torch.zeros(1, 3, dtype=torch.long), fwd_hooks=fwd_hooks)
    for where in (3, None):  # a layer number for a name: once an error from inside the re module
        with pytest.raises(TypeError, match="^" + re.escape(f"{where!r} is a {type(where).__name__}: a hook point is named by a string")):
            model.run_with_hooks(torch.zeros(1, 3, dtype=torch.long), fwd_hooks=[(where, keep)])


def test_a_hook_that_is_not_a_two_argument_function_is_one_line_before_anything_is_attached():
    model, ids = tiny_gpt(), torch.zeros(1, 3, dtype=torch.long)
    keep = lambda x, hook: None  # noqa: E731
    one_argument = lambda x: x * 0  # noqa: E731
    with pytest.raises(TypeError, match="^" + re.escape("the function for 'blocks.0.hook_resid_mid' takes (x): a hook function is "
                                                        "called with two arguments, (activation, hook), and returns None")):
        model.run_with_hooks(ids, fwd_hooks=[("blocks.0.hook_resid_pre", keep), ("blocks.0.hook_resid_mid", one_argument)])
    assert not model.has_hooks()  # the good pair before it was not left attached
    with pytest.raises(TypeError, match="^" + re.escape("the hook for 'blocks.0.attn.hook_z' is a Tensor, not a function: "
                                                        "pass the function itself")):
        model.run_with_cache(ids, fwd_hooks=[(lambda name: name.endswith("hook_z"), one_argument(torch.ones(1)))])
    # A class where its instance was meant.
    class Recorder:
        def __init__(self) -> None:
            self.names: list[str] = []

        def __call__(self, x: torch.Tensor, hook) -> None:
            self.names.append(hook.name)

        def read(self, x: torch.Tensor, hook) -> None:
            self.names.append(hook.name)

    with pytest.raises(TypeError, match="^" + re.escape("the hook for 'blocks.0.hook_resid_mid' is the class Recorder: pass "
                                                        "an instance of it")):
        model.run_with_hooks(ids, fwd_hooks=[("blocks.0.hook_resid_mid", Recorder)])
    # Those a hook may be: defaults and *args take the two arguments, as do a class's instance and a bound method.
    recorder = Recorder()
    model.run_with_hooks(ids, fwd_hooks=[("blocks.0.hook_resid_mid", lambda x, hook, scale=1.0: None),
                                         ("blocks.1.hook_resid_mid", lambda *args: None),
                                         ("blocks.0.hook_resid_post", recorder), ("blocks.1.hook_resid_post", recorder.read)])
    assert recorder.names == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]


def test_a_function_that_returns_another_dtype_is_one_line_naming_its_point():
    model = tiny_gpt()
    to_double = lambda z, hook: z.double()  # noqa: E731
    with pytest.raises(ValueError, match="^" + re.escape("the function at blocks.0.attn.hook_z returned a torch.float64 tensor on "
                                                         "cpu: the model goes on with torch.float32 on cpu, so return .to(activation)")):
        model.run_with_hooks(torch.zeros(1, 3, dtype=torch.long), fwd_hooks=[("blocks.0.attn.hook_z", to_double)])
    with pytest.raises(ValueError, match="^" + re.escape("the function at blocks.0.hook_resid_mid returned a torch.float32 tensor on meta")):
        model.run_with_hooks(torch.zeros(1, 3, dtype=torch.long), fwd_hooks=[("blocks.0.hook_resid_mid", lambda x, hook: x.to("meta"))])
    # Under autocast a layer's activations are bf16 and the stream float32: a function that hands
    # back float32 (from a float32 run's cache, say) is cast by the next layer, as before.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        clean = model(torch.zeros(1, 3, dtype=torch.long))[0]
        patched = model.run_with_hooks(torch.zeros(1, 3, dtype=torch.long), fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: z.float())])[0]
    assert torch.equal(patched, clean)
    assert not model.has_hooks()
