"""training/optimizer.py: AdamW's groups, Muon for the blocks' matrices (against torch.optim.Muon),
its Newton-Schulz iterations and their dtype, and a saved state loaded back."""

from dataclasses import replace

import torch

from model import GPT, GPTConfig
from runtime.devices import Machine
from tests.helpers import optim_spec, run_cli, tiny_run
from training.optimizer import Muon, build_optimizer, ns_dtype_for, orthogonalise


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest_and_both_save_and_load():
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=2, n_head=2, n_embd=8))
    cfg = optim_spec(name="muon", lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99), ns_dtype="auto")
    optimizer = build_optimizer(model, cfg, torch.device("cpu"))
    adamw, muon = optimizer.optimizers
    assert isinstance(adamw, torch.optim.AdamW) and isinstance(muon, Muon) and muon.ns_dtype == torch.float32
    hidden = {id(p) for name, p in model.named_parameters() if name.startswith("blocks.") and p.dim() == 2}
    assert {id(p) for g in muon.param_groups for p in g["params"]} == hidden  # qkv, proj, fc, proj of each block
    assert len(hidden) == 8
    model(torch.randint(0, 10, (2, 8)), torch.randint(0, 10, (2, 8)))[1].backward()
    optimizer.step()
    again = build_optimizer(model, cfg, torch.device("cpu"))
    again.load_state_dict(optimizer.state_dict())
    assert again.state_dict()["optimizers"][1]["state"].keys() == muon.state_dict()["state"].keys()


def muon_moves(optimizer_class: type, steps: int = 3, **options: object) -> list[torch.Tensor]:
    """How far each of the blocks' matrices of a seeded model moves in `steps` Muon steps on
    seeded batches."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32))
    hidden = [p for name, p in model.named_parameters() if name.startswith("blocks.") and p.dim() == 2]
    start = [p.detach().clone() for p in hidden]
    optimizer = optimizer_class(hidden, lr=3e-3, weight_decay=0.1, adjust_lr_fn="match_rms_adamw", **options)
    for _ in range(steps):
        tokens = torch.randint(0, 32, (4, 16))
        model(tokens, tokens)[1].backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach() - before for p, before in zip(hidden, start, strict=True)]


def test_our_muon_in_bfloat16_steps_as_torch_optim_muon_and_in_float32_within_its_rounding():
    torch_muon = muon_moves(torch.optim.Muon)
    for ns_dtype, tolerance in ((torch.bfloat16, 1e-3), (torch.float32, 0.15)):
        ours = muon_moves(Muon, ns_dtype=ns_dtype)
        for theirs, mine in zip(torch_muon, ours, strict=True):
            # measured against how far the matrix moved: bfloat16's rounding moves it by up to ~5%
            assert (mine - theirs).norm() <= tolerance * theirs.norm()


def test_orthogonalise_treats_each_matrix_of_a_batch_as_if_alone():
    torch.manual_seed(0)
    matrices = [torch.randn(96, 32), torch.randn(32, 96), torch.randn(32, 96), torch.randn(32, 32)]
    coefficients = (3.4445, -4.7750, 2.0315)
    together = orthogonalise(matrices, coefficients, 5, 1e-7, torch.float32)
    for matrix, result in zip(matrices, together, strict=True):
        alone, = orthogonalise([matrix], coefficients, 5, 1e-7, torch.float32)
        assert result.shape == matrix.shape and torch.allclose(result, alone, atol=1e-5)
    transposed, = orthogonalise([matrices[0].T], coefficients, 5, 1e-7, torch.float32)
    assert torch.allclose(transposed, together[0].T, atol=1e-5)
    for result in together[:3]:  # a random non-square matrix's singular values all end near 1
        singular_values = torch.linalg.svdvals(result)
        assert singular_values.min() > 0.6 and singular_values.max() < 1.2
    assert together[0].dtype == torch.float32
    in_bfloat16, = orthogonalise([matrices[1]], coefficients, 5, 1e-7, torch.bfloat16)
    assert in_bfloat16.dtype == torch.float32 and not torch.equal(in_bfloat16, together[1])  # computed in bf16


def test_ns_dtype_auto_is_bfloat16_on_a_gpu_with_native_bf16_else_float32_and_the_config_reaches_muon():
    a100, t4 = Machine(cuda_count=1, cuda_bf16=True), Machine(cuda_count=1, cuda_bf16=False)
    assert ns_dtype_for("auto", torch.device("cpu"), a100) == torch.float32  # train.device=cpu on a GPU machine
    assert ns_dtype_for("auto", torch.device("cuda"), a100) == torch.bfloat16
    assert ns_dtype_for("auto", torch.device("cuda"), t4) == torch.float32  # no native bf16: emulated, slow
    assert ns_dtype_for("bfloat16", torch.device("cuda"), t4) == torch.bfloat16  # asked for: given
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=8))
    cfg = optim_spec(name="muon", ns_dtype="bfloat16", muon_momentum=0.85)
    muon = build_optimizer(model, cfg, torch.device("cpu")).optimizers[1]
    assert muon.ns_dtype == torch.bfloat16 and muon.param_groups[0]["momentum"] == 0.85


def test_muon_in_bfloat16_on_a_cpu_says_it_is_slow_without_avx512_bf16_and_how_to_use_float32(tmp_path):
    result = run_cli("train.py", *tiny_run(**{
        "train.device": "cpu", "optim.ns_dtype": "bfloat16", "train.max_steps": 1, "train.attn_log_interval": 0,
        "train.sample_interval": 0, "hydra.run.dir": "run"}), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "note: optim.ns_dtype=bfloat16 (a run saved before the option resumes with it)" in result.stdout
    assert "optim.ns_dtype=auto runs them in float32" in result.stdout


def test_loading_a_saved_state_keeps_the_hyperparameters_the_optimizers_were_built_with():
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=8))
    saved_cfg = optim_spec(name="muon", lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99), muon_momentum=0.95)
    saved = build_optimizer(model, saved_cfg, torch.device("cpu"))
    model(torch.randint(0, 10, (2, 8)), torch.randint(0, 10, (2, 8)))[1].backward()
    saved.step()
    resumed_cfg = replace(saved_cfg, weight_decay=0.05, betas=(0.8, 0.95), muon_momentum=0.85)  # a resume's overrides
    resumed = build_optimizer(model, resumed_cfg, torch.device("cpu"))
    resumed.load_state_dict(saved.state_dict())
    (adamw_decayed, _), (muon,) = resumed.optimizers[0].param_groups, resumed.optimizers[1].param_groups
    assert adamw_decayed["weight_decay"] == muon["weight_decay"] == 0.05 and adamw_decayed["betas"] == (0.8, 0.95)
    assert muon["momentum"] == 0.85
    muon_state = resumed.optimizers[1].state_dict()["state"]
    assert len(muon_state) == 4 and all(s["momentum_buffer"].abs().sum() > 0 for s in muon_state.values())  # the state came


def test_weight_decay_applies_to_matrices_only():
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=8, bias=True))
    optimizer = build_optimizer(model, optim_spec(name="adamw", lr=1e-3, weight_decay=0.1), torch.device("cpu"))
    decayed, plain = optimizer.param_groups  # one AdamW, two groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decayed["params"]) and all(p.dim() == 1 for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))
