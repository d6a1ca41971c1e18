"""The fixed-shape one-token step (model/decode_step.py) against GPT.forward with caches, and
the sampler both paths share (model/sampling.py)."""

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from model import decode_step
from model.decode_step import (
    CompiledDecodeStep,
    bfloat16_pairs_dot,
    inductor_options,
    one_row_linear,
    one_token_logits,
    reads_bfloat16_pairs,
)
from model.generation import generate_tokens
from model.sampling import SMALLEST_TEMPERATURE, choose_next_token
from tests.helpers import ARCHITECTURE_OPTIONS, lively, tiny_gpt


@pytest.mark.parametrize("options", ARCHITECTURE_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "gpt2")
def test_the_one_token_step_gives_the_cached_forwards_logits_and_fills_the_same_slot(options):
    model = tiny_gpt(block_size=16, **options).eval()
    tokens = torch.randint(0, 65, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        caches = model.new_caches()
        model(tokens[:, :5], caches=caches)  # 5 tokens in the caches, as generation's first call leaves them
        slots = [cache.k.clone() for cache in caches.layers] + [cache.v.clone() for cache in caches.layers]
        last_embedding = caches.last_embedding if options.get("smear") else torch.zeros(2, 1, 32)
        for position in range(5, 9):  # four steps, each one token further into the window
            token = tokens[:, position : position + 1]  # (B, 1)
            expected, _ = model(token, caches=caches)  # (B, 1, V)
            logits, last_embedding = one_token_logits(model, token, torch.tensor([position]), last_embedding, slots)
            torch.testing.assert_close(logits, expected[:, -1], atol=1e-5, rtol=1e-4)
        n_layer = len(caches.layers)
        for cache, k_slots, v_slots in zip(caches.layers, slots[:n_layer], slots[n_layer:], strict=True):
            torch.testing.assert_close(k_slots[:, :, :9], cache.k[:, :, :9], atol=1e-6, rtol=1e-5)  # keys written where the cache has them
            torch.testing.assert_close(v_slots[:, :, :9], cache.v[:, :, :9], atol=1e-6, rtol=1e-5)  # and values
            assert not k_slots[:, :, 9:].any() and not v_slots[:, :, 9:].any()  # and nothing past them


def test_a_compiled_step_is_refused_while_functions_are_attached_to_hook_points():
    model = tiny_gpt(block_size=16).eval()
    with model.hooks(model.knock_out({(1, 0)})), pytest.raises(
            ValueError, match=r"functions are attached .* calls none of them: generate without it \(compile=False\)"):
        CompiledDecodeStep(model, batch_size=2, temperature=0.0, top_k=None, top_p=None)  # before any compiling


@pytest.mark.parametrize(("temperature", "expected"), [(1.0, [1 / 6, 2 / 6, 3 / 6, 0.0]), (0.5, [1 / 14, 4 / 14, 9 / 14, 0.0])])
def test_choosing_from_uniform_noise_follows_the_probabilities(temperature, expected):
    # 20,000 draws from softmax([0, ln 2, ln 3, -inf-ish] / temperature): at 1, (1/6, 2/6, 3/6, 0); at
    # 0.5 the probabilities squared and normalised, (1, 4, 9, 0) / 14. Each frequency within 0.015.
    logits = torch.log(torch.tensor([[1.0, 2.0, 3.0, 1e-9]])).expand(20_000, 4)
    uniform = torch.rand(20_000, 4, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(choose_next_token(logits, temperature, None, None, uniform)[:, 0], minlength=4)
    torch.testing.assert_close(counts / 20_000, torch.tensor(expected), atol=0.015, rtol=0)


def test_a_uniform_draw_of_exactly_zero_still_picks_a_kept_token():
    # torch.rand can return 0.0; with top_k=1 only token 2 may come out, whatever its draw.
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5]])
    uniform = torch.tensor([[0.5, 0.5, 0.0, 0.5]])
    assert choose_next_token(logits, 1.0, 1, None, uniform).tolist() == [[2]]
    assert choose_next_token(logits, 1.0, None, 0.5, uniform).tolist() == [[2]]  # top_p keeps token 2 alone too


def test_choosing_at_temperature_zero_takes_the_likeliest_and_ignores_the_noise():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    assert choose_next_token(logits, 0.0, None, None, None).tolist() == [[1], [0]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_smallest_temperature_allowed_takes_the_likeliest_of_logits_as_large_as_1e4(dtype):
    # sample.py refuses a temperature between 0 and SMALLEST_TEMPERATURE (logits divided by 1e-45
    # overflow, and every draw was token 0, as NaN's argmax is); the smallest it takes still
    # divides into float32, and fp16's logits (whose largest is 65504) are divided in float32 too.
    logits = torch.tensor([[0.1, 2.0, -1.0], [-1e4, 9000.0, 1e4], [-3.0, -2.5, -2.0]]).to(dtype)
    uniform = torch.rand(3, 3, generator=torch.Generator().manual_seed(0))
    assert choose_next_token(logits, SMALLEST_TEMPERATURE, None, None, uniform).tolist() == [[1], [2], [2]]


def test_bfloat16_read_in_pairs_multiplies_each_element_by_its_own_weight():
    # Whole numbers small enough that every product and sum is exact in float32, so the result
    # must equal the exact one: a half widened wrongly, or an element paired with its neighbour's
    # weight, changes it.
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(-8, 9, (1, 1, 6), generator=generator).to(torch.bfloat16)  # (1, 1, in)
    weight = torch.randint(-8, 9, (5, 6), generator=generator).to(torch.bfloat16)  # (out, in)
    bias = torch.randint(-8, 9, (5,), generator=generator).to(torch.bfloat16)
    exact = x.double() @ weight.double().T  # (1, 1, out)
    assert reads_bfloat16_pairs(weight)
    assert bfloat16_pairs_dot(x, weight).dtype == torch.float32
    assert torch.equal(bfloat16_pairs_dot(x, weight).double(), exact)
    assert torch.equal(one_row_linear(x, weight, bias), (exact + bias.double()).to(torch.bfloat16))  # rounded once
    # Every bit of each value, widened: times the identity, x comes back as float32 bit for bit, and
    # a one-hot x picks out a column of the weight, both halves of each pair alike.
    x, weight = torch.randn(1, 1, 8, generator=generator).to(torch.bfloat16), torch.randn(8, 8, generator=generator).to(torch.bfloat16)
    assert torch.equal(bfloat16_pairs_dot(x, torch.eye(8, dtype=torch.bfloat16)), x.float())
    for i in range(8):
        one_hot = torch.nn.functional.one_hot(torch.tensor([[i]]), 8).to(torch.bfloat16)  # (1, 1, in)
        assert torch.equal(bfloat16_pairs_dot(one_hot, weight), weight[:, i].float().view(1, 1, 8))
    # An odd width has no pairs, and float32 needs no widening: both multiply as they are.
    assert not reads_bfloat16_pairs(weight[:, :5]) and not reads_bfloat16_pairs(weight.float())
    assert torch.equal(one_row_linear(x[..., :5], weight[:, :5]), (x[..., :5].double() @ weight[:, :5].double().T).to(torch.bfloat16))


@pytest.mark.compile
def test_a_one_row_bf16_step_reads_bfloat16_in_pairs_and_draws_with_the_float32_noise_sampling_gives_it(monkeypatch):
    # uniform_noise draws float32 whatever the weights' dtype. A step built for bf16 noise read its
    # bytes as bf16: sample.py compile=true dtype=bf16 wrote nonsense while eager bf16 wrote stories.
    # One row, as sample.py's default num_samples=1: its one-row matmuls read bfloat16 in pairs, and
    # the step stores their input's widened halves once.
    model = lively(tiny_gpt(block_size=16)).to(torch.bfloat16)
    asked = []
    monkeypatch.setattr(decode_step, "inductor_options", lambda pairs: asked.append(pairs) or inductor_options(pairs))
    step, code = run_and_get_code(CompiledDecodeStep, model, batch_size=1, temperature=1.0, top_k=None, top_p=None)
    assert asked == [True]
    assert any("Vectorized<int32_t>::loadu" in text for text in code)  # the weights read as int32, two bfloat16 each
    prompt = torch.randint(0, 65, (1, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        likeliest = model(prompt)[0][0, -1].argmax().item()  # after the 5th token, eager
    assert likeliest not in (3, 60)
    for chosen in (3, 60, None):
        caches = model.new_caches()
        with torch.no_grad():
            model(prompt[:, :4], caches=caches)  # the step takes in the 5th token
        uniform = torch.full((1, 65), 0.5)  # (B, V) float32, as uniform_noise draws it
        if chosen is not None:
            uniform[0, chosen] = 1 - 2**-24  # -log(u) near 0: this token's draw wins by far
        # With the same noise everywhere, the draw is the likeliest token, as the eager logits have it.
        assert step(prompt[:, 4:], caches, uniform).item() == (likeliest if chosen is None else chosen)


@pytest.mark.compile
def test_a_compiled_step_generates_the_eager_tokens_and_refuses_other_settings(monkeypatch):
    # Learned positions and smear (the CLI test covers rope), top_p, a prompt longer than
    # block_size and 25 new tokens: the context slides at block_size 8 and the caches are refilled
    # several times. In multi-query form (one key/value head for 4 query heads, which once failed to
    # compile), with a window of 6 (a ring of 6 slots), QK-norm and SwiGLU; lively, so that the
    # tokens depend on the context. tests/test_grouped_attention.py compiles the grouped-query form.
    model = lively(tiny_gpt(block_size=8, n_head=4, n_kv_head=1, window=6, qk_norm=True, mlp="swiglu", smear=True))
    prompt = torch.randint(0, 65, (2, 11), generator=torch.Generator().manual_seed(0))
    settings = dict(temperature=1.0, top_k=None, top_p=0.9)
    asked = []
    monkeypatch.setattr(decode_step, "inductor_options", lambda pairs: asked.append(pairs) or inductor_options(pairs))
    step, code = run_and_get_code(CompiledDecodeStep, model, batch_size=2, **settings)  # and the code Inductor wrote
    assert asked == [False]  # float32, two rows: nothing read in pairs
    # The attention in the step's own loops: no call of torch's fused attention kernel, which costs
    # more than one query row's work (docs/speed.md: 1 of 13.7 ms a token of GPT-2 small at bf16).
    assert code and not any("scaled_dot_product" in text for text in code)
    compiled = generate_tokens(model, prompt, 25, **settings, generator=torch.Generator().manual_seed(3), decode_step=step)
    eager = generate_tokens(model, prompt, 25, **settings, generator=torch.Generator().manual_seed(3))
    assert torch.equal(compiled, eager) and len(set(compiled[0, 11:].tolist())) > 5
    from_int32 = generate_tokens(model, prompt.int(), 25, **settings, generator=torch.Generator().manual_seed(3),
                                 decode_step=step)  # the ids the forward takes too, the step built for int64's
    assert torch.equal(from_int32, eager)
    with pytest.raises(ValueError, match="this CompiledDecodeStep was built for another model or for"):
        generate_tokens(model, prompt, 5, temperature=0.5, top_p=0.9, decode_step=step)
    with pytest.raises(ValueError, match="use_kv_cache=False"):  # the step reads and writes the caches
        generate_tokens(model, prompt, 5, **settings, use_kv_cache=False, decode_step=step)
    with pytest.raises(ValueError, match="functions are attached to this model's hook points"), model.hooks(model.knock_out({(0, 1)})):
        generate_tokens(model, prompt, 5, **settings, decode_step=step)  # it was built with every head
    with pytest.raises(ValueError, match="^this CompiledDecodeStep was built for the model's weights in torch.float32 on "
                                         "cpu; they are torch.bfloat16 on cpu now: build the step again$"):
        generate_tokens(model.to(torch.bfloat16), prompt, 5, **settings, decode_step=step)
