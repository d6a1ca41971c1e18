"""The helpers train.py wires together: optimizer groups and Muon, heatmaps, checkpoints, the recall logs."""

import os
import random

import numpy as np
import pytest
import torch

from data.tokenizer import CharTokenizer
from inspection.ablation import RecallAblation
from inspection.heatmap import COLORMAP, FUTURE, colour_level, readable_token, render_attention_map
from inspection.recall_probe import RecallScores
from model import GPT, GPTConfig
from model_io.checkpoint import Checkpoint
from model_io.run_files import resolve_checkpoint
from runtime.devices import Machine
from tests.helpers import read_events, run_cli, text_of, tiny_run
from training.optimizer import Muon, build_optimizer, ns_dtype_for, orthogonalise
from training.state import capture_rng_states, restore_rng_states
from training.tensorboard_log import RunLogger
from user_error import UserError


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest_and_both_save_and_load():
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=2, n_head=2, n_embd=8))
    cfg = {"name": "muon", "lr": 1e-3, "weight_decay": 0.1, "betas": [0.9, 0.99]}
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
    cfg = {"name": "muon", "lr": 1e-3, "weight_decay": 0.1, "betas": [0.9, 0.99], "ns_dtype": "bfloat16",
           "muon_momentum": 0.85}
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
    saved_cfg = {"name": "muon", "lr": 1e-3, "weight_decay": 0.1, "betas": [0.9, 0.99], "muon_momentum": 0.95}
    saved = build_optimizer(model, saved_cfg, torch.device("cpu"))
    model(torch.randint(0, 10, (2, 8)), torch.randint(0, 10, (2, 8)))[1].backward()
    saved.step()
    resumed_cfg = {**saved_cfg, "weight_decay": 0.05, "betas": [0.8, 0.95], "muon_momentum": 0.85}  # a resume's overrides
    resumed = build_optimizer(model, resumed_cfg, torch.device("cpu"))
    resumed.load_state_dict(saved.state_dict())
    (adamw_decayed, _), (muon,) = resumed.optimizers[0].param_groups, resumed.optimizers[1].param_groups
    assert adamw_decayed["weight_decay"] == muon["weight_decay"] == 0.05 and adamw_decayed["betas"] == (0.8, 0.95)
    assert muon["momentum"] == 0.85
    muon_state = resumed.optimizers[1].state_dict()["state"]
    assert len(muon_state) == 4 and all(s["momentum_buffer"].abs().sum() > 0 for s in muon_state.values())  # the state came


def test_weight_decay_applies_to_matrices_only():
    model = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=8, bias=True))
    optimizer = build_optimizer(model, {"lr": 1e-3, "weight_decay": 0.1, "betas": [0.9, 0.99]}, torch.device("cpu"))
    decayed, plain = optimizer.param_groups  # one AdamW, two groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decayed["params"]) and all(p.dim() == 1 for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))


def test_readable_token_marks_spaces_and_newlines():
    assert readable_token(" the") == "·the"
    assert readable_token("\n") == "\\n"
    assert readable_token("a\tb") == "a\\tb"
    assert readable_token("é", unicode_ok=False) == "\\xe9"
    assert readable_token("é", unicode_ok=True) == "é"
    assert readable_token("") == "∅"


def test_colour_scale_is_square_root_from_0_to_1():
    assert colour_level(np.array([0.0, 0.25, 1.0])).tolist() == [0, 128, 255]


def test_a_map_of_a_model_gone_nan_is_still_drawn():
    # train.skip_nonfinite=true goes on logging after the weights became NaN.
    assert colour_level(np.array([np.nan, 0.25])).tolist() == [0, 128]
    image = render_attention_map(np.full((3, 3), np.nan), ["a", "b", "c"], "nan")
    assert image.ndim == 3 and image.shape[2] == 3


def test_heatmap_colours_each_cell_by_its_weight_and_greys_the_future():
    weights = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    image = render_attention_map(weights, ["a", "b", "c"], "title")
    # The grid is the block of non-white pixels whose colours are colormap or FUTURE entries;
    # find the top-left cell's colour (weight 1.0) and the top-right cell's colour (future).
    bright, future = tuple(COLORMAP[255]), FUTURE
    pixels = {tuple(p) for p in image.reshape(-1, 3)}
    assert bright in pixels and future in pixels and tuple(COLORMAP[0]) in pixels
    ys, xs = np.nonzero((image == bright).all(-1))
    fy, fx = np.nonzero((image == future).all(-1))
    assert fx.mean() > xs.min() and fy.mean() < ys.max()  # the future sits up and to the right


def small_checkpoint(tmp_path, name="ckpt_last.pt"):
    tokenizer = CharTokenizer.from_text("abc \n")
    model_cfg = dict(n_layer=1, n_head=2, n_embd=8, block_size=8, dropout=0.0, bias=False, attention="sdpa")
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, **model_cfg))
    optimizer = torch.optim.AdamW(model.parameters())
    path = tmp_path / name
    Checkpoint(model=model.state_dict(), optimizer=optimizer.state_dict(), step=7, best_val_loss=1.5,
               config={"model": model_cfg}, tokenizer=tokenizer.state(),
               run_state={"rng": capture_rng_states(np.random.default_rng(0))}).save(path)
    return path, model


def test_a_checkpoint_round_trips_the_model_and_tokenizer(tmp_path):
    path, model = small_checkpoint(tmp_path)
    checkpoint = Checkpoint.load(path)
    assert checkpoint.step == 7 and checkpoint.best_val_loss == 1.5
    loaded, tokenizer = checkpoint.build_model()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert tokenizer.decode(tokenizer.encode("cab")) == "cab"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt_last.pt"]  # no temporary file left behind


def test_every_random_generator_draws_the_same_after_a_checkpoint_round_trip(tmp_path):
    def draws(batch_rng):
        return (random.random(), np.random.rand(), batch_rng.integers(1 << 30), torch.rand(1).item(),
                torch.nn.functional.dropout(torch.ones(64), 0.5).tolist())

    batch_rng = np.random.default_rng(3)
    batch_rng.integers(10, size=5)  # move it away from its seed
    path = tmp_path / "ckpt_last.pt"
    model = GPT(GPTConfig(vocab_size=5, n_layer=1, n_head=1, n_embd=4, block_size=4))
    Checkpoint(model=model.state_dict(), optimizer=torch.optim.AdamW(model.parameters()).state_dict(), step=1,
               best_val_loss=1.0, config={}, tokenizer=CharTokenizer.from_text("abcd").state(),
               run_state={"rng": capture_rng_states(batch_rng)}).save(path)
    expected = draws(batch_rng)
    assert draws(batch_rng) != expected  # the generators really moved on

    fresh_rng = np.random.default_rng(99)
    restore_rng_states(Checkpoint.load(path).run_state["rng"][0], fresh_rng)  # weights_only=True inside
    assert draws(fresh_rng) == expected


def test_saving_over_a_checkpoint_replaces_it_whole(tmp_path):
    # Guards the rename: a reader holding the old file (here a hard link) keeps its bytes, and
    # the name then points at a new file. Writing over the old file in place fails both.
    path, _ = small_checkpoint(tmp_path)
    first = path.read_bytes()
    os.link(path, tmp_path / "held_by_a_reader.pt")
    small_checkpoint(tmp_path)  # a new random model: other bytes
    assert (tmp_path / "held_by_a_reader.pt").read_bytes() == first
    assert path.stat().st_ino != (tmp_path / "held_by_a_reader.pt").stat().st_ino
    assert path.read_bytes() != first and Checkpoint.load(path).step == 7


def test_a_save_reaches_the_disk_before_it_replaces_the_old_checkpoint(tmp_path, monkeypatch):
    # Guards the fsync: after a power cut, a renamed file whose bytes were still only in the page
    # cache can be empty. The real fsync and rename run; the test only records their order.
    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        real_fsync(fd)

    def replace(src, dst) -> None:
        calls.append(("replace", os.path.basename(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    small_checkpoint(tmp_path)
    assert calls == [("fsync", ".ckpt_last.pt.tmp"), ("replace", ".ckpt_last.pt.tmp")]


def test_broken_or_foreign_checkpoints_get_clear_errors(tmp_path):
    path, _ = small_checkpoint(tmp_path)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    with pytest.raises(UserError, match="truncated.pt is not a readable checkpoint"):
        Checkpoint.load(truncated)
    text = tmp_path / "notes.pt"
    text.write_text("hello")
    with pytest.raises(UserError, match="notes.pt is not a readable checkpoint"):
        Checkpoint.load(text)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(2)}, foreign)
    with pytest.raises(UserError, match="not a checkpoint of this project"):
        Checkpoint.load(foreign)


def test_resolve_checkpoint_prefers_best_in_a_run_dir(tmp_path):
    small_checkpoint(tmp_path, "ckpt_last.pt")
    assert resolve_checkpoint(str(tmp_path)).name == "ckpt_last.pt"
    small_checkpoint(tmp_path, "ckpt_best.pt")
    assert resolve_checkpoint(str(tmp_path)).name == "ckpt_best.pt"
    with pytest.raises(UserError, match="does not exist"):
        resolve_checkpoint(str(tmp_path / "missing"))
    empty = tmp_path / "empty_run"
    empty.mkdir()
    with pytest.raises(UserError, match="has no ckpt_best.pt or ckpt_last.pt"):
        resolve_checkpoint(str(empty))


def test_the_recall_and_ablation_logs_name_each_head_and_the_three_that_look_most_and_are_needed_most(tmp_path):
    weight = torch.tensor([[0.10, 0.50, 0.00], [0.30, 0.05, 0.20]], dtype=torch.float64)  # (L, H) = (2, 3)
    without = torch.tensor([[0.80, 0.85, 0.10], [0.84, 0.40, 0.83]], dtype=torch.float64)
    logger = RunLogger(tmp_path)
    logger.recall(5, RecallScores(0.5, {"name": 0.8, "item": 0.2}, weight))
    logger.ablation(5, RecallAblation("name", 0.83, without))
    logger.close()
    events = read_events(tmp_path)
    scalar = {tag: events.Scalars(tag)[0].value for tag in events.Tags()["scalars"]}
    for layer in range(2):
        for head in range(3):
            assert scalar[f"recall_heads/layer_{layer}/head_{head}"] == pytest.approx(weight[layer, head].item())
            assert scalar[f"ablation/recall_name/layer_{layer}/head_{head}"] == pytest.approx(without[layer, head].item())
    assert scalar["recall/accuracy_name"] == pytest.approx(0.8)
    assert text_of(events, "recall/top_heads") == ("weight on the earlier mention: "
                                                   "layer 0 head 1: 0.50, layer 1 head 0: 0.30, layer 1 head 2: 0.20")
    assert text_of(events, "ablation/top_heads") == ("name recall 0.83 with every head; without "
                                                     "layer 0 head 2: 0.10, layer 1 head 1: 0.40, layer 0 head 0: 0.80")
