"""The recall probe with each head knocked out alone (inspection/ablation.py)."""

import pytest
import torch

from data.stories import generate_stories
from data.tokenizer import CharTokenizer
from inspection.ablation import recall_without_each_head
from inspection.recall_probe import RecallProbe
from model import GPT, GPTConfig


@pytest.fixture(scope="module")
def char_probe():
    tokenizer = CharTokenizer(sorted(set("".join(generate_stories(1337, 100_000)))))
    return tokenizer, RecallProbe.build(tokenizer, block_size=128, seed=1338)


def random_name_guesser(tokenizer: CharTokenizer, **options) -> GPT:
    """A random tiny model whose heads matter and whose guesses are capital letters: names start
    with one, so it gets a few names right, and which ones depends on its heads."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(tokenizer.vocab_size, block_size=128, n_layer=2, n_head=2, n_embd=32, tie_head=False, **options))
    capital = torch.tensor([s.isupper() for s in tokenizer.token_strings(list(range(tokenizer.vocab_size)))])  # (vocab,)
    with torch.no_grad():
        model.lm_head.weight.mul_(capital.view(-1, 1))  # every other token's logit is 0
        for block in model.blocks:
            block.attn.proj.weight.mul_(30)  # heads' outputs weigh in the residual stream
    return model


@pytest.mark.parametrize("options", [{}, {"pos": "rope", "qk_norm": True, "smear": True, "mlp": "relu2"}],
                         ids=["gpt2", "default-levers"])
def test_each_heads_score_is_exactly_the_probes_name_recall_with_that_head_knocked_out(char_probe, options):
    tokenizer, probe = char_probe
    model = random_name_guesser(tokenizer, **options)
    ablation = recall_without_each_head(model, probe)
    intact = probe.evaluate(model).accuracy_by_kind["name"]
    slow = torch.zeros(2, 2, dtype=torch.float64)
    for layer, head in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        with model.heads_knocked_out({(layer, head)}):
            slow[layer, head] = probe.evaluate(model).accuracy_by_kind["name"]
    assert ablation.kind == "name" and ablation.intact == intact > 0
    assert torch.equal(ablation.without, slow)  # exactly: the same points, each right or not alike
    assert (slow != intact).any()  # guards a test that passes because no head changes anything
