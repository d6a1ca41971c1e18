"""The recall probe with each head knocked out alone (inspection/ablation.py)."""

import pytest
import torch

import training.jobs
from data.tokenizer import CharTokenizer
from inspection.ablation import recall_without_each_head
from model import GPT, GPTConfig
from tests.helpers import read_events, run_cli, tiny_run


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
        with model.hooks(model.knock_out({(layer, head)})):
            slow[layer, head] = probe.evaluate(model).accuracy_by_kind["name"]
    assert ablation.kind == "name" and ablation.intact == intact > 0
    assert torch.equal(ablation.without, slow)  # exactly: the same points, each right or not alike
    assert (slow != intact).any()  # guards a test that passes because no head changes anything


@pytest.mark.parametrize("bound", [3, 4])
def test_a_model_of_more_heads_than_the_bound_logs_name_recall_but_no_ablation_per_knocked_out_head(tmp_path, monkeypatch,
                                                                                                   bound):
    # The bound is 64 heads (GPT-2 small's 144 heads of 1,024 tokens would cost hours a step on a
    # CPU); lowered here to the tiny run's 4 heads, which it takes, and below them.
    monkeypatch.setattr(training.jobs, "ABLATION_MAX_HEADS", bound)
    result = run_cli("train.py", *tiny_run(**{
        "train.max_steps": 2, "train.eval_interval": 2, "train.attn_log_interval": 2, "train.sample_interval": 0,
        "hydra.run.dir": "run"}), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    tags = read_events(tmp_path / "run").Tags()["scalars"]
    ablation = [tag for tag in tags if tag.startswith("ablation/")]
    assert "recall/accuracy" in tags
    if bound == 4:
        heads = [f"layer_{layer}/head_{head}" for layer in range(2) for head in range(2)]
        assert sorted(ablation) == sorted([f"ablation/recall_name/{h}" for h in heads] + ["ablation/induction_loss/intact"]
                                          + [f"ablation/induction_loss/{h}" for h in heads])
        assert "no ablation" not in result.stdout
    else:
        assert "no ablation/... scalars: this model has 4 heads" in result.stdout and not ablation
