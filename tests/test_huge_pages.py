import io
import mmap
import re
import resource
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import runtime.huge_pages
from model.generation import lay_out_for_decoding
from runtime.huge_pages import (
    HUGE_PAGE,
    SMALLEST_MODEL,
    huge_page_mapping,
    huge_page_memory,
    huge_pages_possible,
    move_to_huge_pages,
)
from tests.helpers import huge_page_bytes, moved_to_huge_pages, tiny_gpt

THP_ON = huge_pages_possible()  # Linux with transparent huge pages not switched off: CI's machines, and these
needs_thp = pytest.mark.skipif(not THP_ON, reason="needs Linux with transparent huge pages (enabled: always or madvise)")


def laid_out_model():
    """A tiny GPT as sample.py holds it for eager decoding on a CPU, just over SMALLEST_MODEL: 29 MB
    of weights (an 8,192 x 512 embedding, tied to the LM head), float32 ones stored transposed."""
    model = tiny_gpt(vocab_size=8192, n_embd=512, n_head=4, n_layer=1).eval()
    lay_out_for_decoding(model)
    return model


def status(field: str) -> int:
    """A field of this process's /proc/self/status, in bytes (VmRSS, VmHWM, VmSize)."""
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def test_moved_weights_keep_their_values_strides_and_ties_so_the_logits_stay_the_same():
    model = laid_out_model()
    idx = torch.randint(0, 8192, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(idx)[0]
    layout = [(name, t.shape, t.stride(), t.dtype) for name, t in [*model.named_parameters(), *model.named_buffers()]]
    assert any(t.stride()[0] == 1 for t in model.parameters() if t.dim() == 2)  # some weights are stored transposed

    assert move_to_huge_pages(model) is THP_ON is moved_to_huge_pages(model)
    assert [(name, t.shape, t.stride(), t.dtype) for name, t in [*model.named_parameters(), *model.named_buffers()]] == layout
    assert model.lm_head.weight is model.tok_emb.weight  # tied: still one tensor
    with torch.no_grad():
        assert torch.equal(model(idx)[0], before)  # the same numbers, bit for bit


@needs_thp
def test_moved_weights_sit_on_huge_pages_each_with_a_storage_of_its_own_bytes():
    model = laid_out_model()
    move_to_huge_pages(model)
    assert all(t.data_ptr() % 64 == 0 for t in model.parameters())  # each on a cache line, as torch's allocator puts them
    assert huge_page_bytes(model.lm_head.weight) >= 8 * HUGE_PAGE  # its 16 MiB: the kernel kept its word
    # Saved or copied, a small tensor takes its own bytes, not the whole mapping's.
    bias = model.blocks[0].ln_1.weight
    assert bias.untyped_storage().nbytes() == bias.nbytes == 512 * 4
    saved = io.BytesIO()
    torch.save(bias, saved)
    assert len(saved.getvalue()) < 10_000


@needs_thp
def test_even_a_small_piece_of_huge_page_memory_gets_a_huge_page():
    memory = huge_page_memory(1000).fill_(7)  # touched, so the kernel maps it now
    assert memory.data_ptr() % HUGE_PAGE == 0 and memory.numel() == 1000 and int(memory.sum()) == 7000
    assert huge_page_bytes(memory) >= HUGE_PAGE
    mapping, start = huge_page_mapping(HUGE_PAGE + 1)  # a byte past one huge page: two whole ones from start, and slack
    assert len(mapping) == 3 * HUGE_PAGE and start < HUGE_PAGE


@needs_thp
def test_moving_hands_the_old_copy_back_so_the_peak_is_the_model_and_about_one_tensor():
    # 40 weights of 4 MiB: glibc keeps tensors of this size in its heap once a larger one has been
    # freed (as loading a checkpoint frees some), and holds on to freed heap pages unless trimmed.
    freed = torch.ones(64 << 20, dtype=torch.uint8)
    del freed
    model = nn.ParameterList(nn.Parameter(torch.full((1024, 1024), float(i))) for i in range(40))  # 160 MiB
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) counts from here
    resident = status("VmRSS")
    assert move_to_huge_pages(model)
    assert status("VmHWM") - resident < 24 << 20  # one 4 MiB tensor and a huge page or two of slack; not 160 MiB
    assert [float(p.detach()[0, 0]) for p in model] == [float(i) for i in range(40)]


def test_small_models_shared_memory_and_tensors_with_gaps_are_left_where_they_are(monkeypatch):
    small = tiny_gpt()
    assert sum(t.nbytes for t in small.parameters()) < SMALLEST_MODEL and move_to_huge_pages(small) is False

    monkeypatch.setattr(runtime.huge_pages, "SMALLEST_MODEL", 0)
    base = torch.randn(4096, 1024)
    views = nn.Module()
    views.a, views.b = nn.Parameter(base[:2048]), nn.Parameter(base[1024:])  # one memory: a write to one shows in the other
    gaps = nn.Module()
    gaps.register_buffer("every_other", torch.randn(1024, 2048)[:, ::2])
    expanded = nn.Module()
    expanded.register_buffer("one_row", torch.randn(1, 1024).expand(4096, 1024))
    for model in (views, gaps, expanded):
        where = [t.data_ptr() for t in [*model.parameters(), *model.buffers()]]
        assert move_to_huge_pages(model) is False
        assert [t.data_ptr() for t in [*model.parameters(), *model.buffers()]] == where


def test_without_madvise_as_on_macos_the_model_is_left_where_it_is(monkeypatch):
    monkeypatch.delattr(mmap, "MADV_HUGEPAGE", raising=False)  # Python's mmap has it on Linux only
    model = laid_out_model()
    where = [t.data_ptr() for t in model.parameters()]
    assert huge_pages_possible() is False and move_to_huge_pages(model) is False
    assert [t.data_ptr() for t in model.parameters()] == where


@needs_thp
def test_under_an_address_space_limit_the_weights_stay_where_they_are_and_still_work():
    model = laid_out_model()
    idx = torch.randint(0, 8192, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(idx)[0]
    where = [t.data_ptr() for t in model.parameters()]
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (status("VmSize") + HUGE_PAGE, hard))  # room for one huge page more, not 29 MB
    try:
        moved = move_to_huge_pages(model)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert moved is False and [t.data_ptr() for t in model.parameters()] == where
    with torch.no_grad():
        assert torch.equal(model(idx)[0], before)


def test_huge_pages_are_possible_where_the_kernel_gives_them_on_request():
    setting = Path("/sys/kernel/mm/transparent_hugepage/enabled")  # e.g. "always [madvise] never": the choice in brackets
    chosen = re.search(r"\[(\w+)\]", setting.read_text()).group(1) if setting.is_file() else "never"
    assert huge_pages_possible() is (hasattr(mmap, "MADV_HUGEPAGE") and chosen in ("always", "madvise"))


def test_a_kernel_without_transparent_huge_pages_gets_none_and_2_mib_is_the_page_size_it_reports(monkeypatch, tmp_path):
    monkeypatch.setattr(runtime.huge_pages, "THP", tmp_path / "no_transparent_hugepage")  # a kernel built without them
    assert huge_pages_possible() is False and runtime.huge_pages.huge_page_size() == 2 << 20


def test_a_tensor_is_movable_when_its_elements_fill_its_span_once_on_the_cpu():
    movable = runtime.huge_pages.movable
    assert movable(torch.zeros(2, 3, 4)) and movable(torch.zeros(2, 3, 4).transpose(0, 2))  # in any order of dimensions
    assert movable(torch.zeros(1, 8).as_strided((1, 8), (999, 1)))  # a dimension of one: its stride is never used
    assert not movable(torch.zeros(4, 4)[:, :2]) and not movable(torch.zeros(1, 4).expand(3, 4))  # gaps; each element thrice
    assert not movable(torch.zeros(4, device="meta"))
    with warnings.catch_warnings():  # torch 2.13 deprecates quantized tensors, which a model may still hold
        warnings.simplefilter("ignore", UserWarning)
        assert not movable(torch.quantize_per_tensor(torch.zeros(4), scale=0.1, zero_point=0, dtype=torch.quint8))


def test_a_model_moves_from_its_smallest_size_up_and_odd_sized_tensors_each_start_a_cache_line(monkeypatch):
    model = nn.Module()
    model.bias = nn.Parameter(torch.arange(3.0))  # 12 bytes: the next tensor starts 64 bytes on, not 12
    model.weight = nn.Parameter(torch.arange(4096.0).view(64, 64))
    model.register_buffer("empty", torch.zeros(0))  # holds nothing, and shares no memory
    model.register_buffer("also_empty", torch.zeros(0, 3))
    assert move_to_huge_pages(nn.Linear(1024, 2048)) is False  # 8 MiB: under SMALLEST_MODEL, 16 MiB
    monkeypatch.setattr(runtime.huge_pages, "SMALLEST_MODEL", 64 + 4096 * 4 + 1)
    assert move_to_huge_pages(model) is False
    monkeypatch.setattr(runtime.huge_pages, "SMALLEST_MODEL", 64 + 4096 * 4)  # exactly the model's padded bytes
    assert move_to_huge_pages(model) is THP_ON
    if THP_ON:
        assert model.weight.data_ptr() - model.bias.data_ptr() == 64 and model.bias.data_ptr() % HUGE_PAGE == 0
    assert torch.equal(model.bias, torch.arange(3.0)) and torch.equal(model.weight, torch.arange(4096.0).view(64, 64))
