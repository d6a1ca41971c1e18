import mmap
import re
import resource
from pathlib import Path

import pytest
import torch

from model.generation import lay_out_for_decoding
from runtime.huge_pages import HUGE_PAGE, huge_page_memory, huge_pages_possible, move_to_huge_pages
from tests.helpers import huge_page_bytes, tiny_gpt

THP_ON = huge_pages_possible()  # Linux with transparent huge pages not switched off: CI's machines, and these


def laid_out_model():
    """A tiny GPT as sample.py holds it for eager decoding on a CPU: weights of 8 MB (a 4,096 x 512
    embedding, tied to the LM head), float32 ones stored transposed."""
    model = tiny_gpt(vocab_size=4096, n_embd=512, n_head=4, n_layer=1).eval()
    lay_out_for_decoding(model)
    return model


def test_moved_weights_keep_their_values_strides_and_ties_so_the_logits_stay_the_same():
    model = laid_out_model()
    idx = torch.randint(0, 4096, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(idx)[0]
    layout = [(name, t.shape, t.stride(), t.dtype) for name, t in [*model.named_parameters(), *model.named_buffers()]]
    assert any(t.stride()[0] == 1 for t in model.parameters() if t.dim() == 2)  # some weights are stored transposed

    assert move_to_huge_pages(model) is THP_ON
    assert [(name, t.shape, t.stride(), t.dtype) for name, t in [*model.named_parameters(), *model.named_buffers()]] == layout
    assert model.lm_head.weight is model.tok_emb.weight  # tied: still one tensor
    with torch.no_grad():
        assert torch.equal(model(idx)[0], before)  # the same numbers, bit for bit


@pytest.mark.skipif(not THP_ON, reason="needs Linux with transparent huge pages (enabled: always or madvise)")
def test_moved_weights_sit_on_huge_pages_in_one_mapping():
    model = laid_out_model()
    move_to_huge_pages(model)
    tensors = [*model.parameters(), *model.buffers()]
    first = min(t.data_ptr() for t in tensors)
    assert first % HUGE_PAGE == 0  # the first starts a huge page
    assert max(t.data_ptr() for t in tensors) - first < sum(t.nbytes for t in tensors) + 64 * len(tensors)  # packed
    assert all(t.data_ptr() % 64 == 0 for t in tensors)  # each on a cache line, as torch's allocator puts them
    assert huge_page_bytes(model.lm_head.weight) >= 4 * HUGE_PAGE  # its 8 MB: the kernel kept its word


@pytest.mark.skipif(not THP_ON, reason="needs Linux with transparent huge pages (enabled: always or madvise)")
def test_even_a_small_piece_of_huge_page_memory_gets_a_huge_page():
    memory = huge_page_memory(1000).fill_(7)  # touched, so the kernel maps it now
    assert memory.data_ptr() % HUGE_PAGE == 0 and memory.numel() == 1000 and int(memory.sum()) == 7000
    assert huge_page_bytes(memory) >= HUGE_PAGE


def test_without_madvise_as_on_macos_the_model_is_left_where_it_is(monkeypatch):
    monkeypatch.delattr(mmap, "MADV_HUGEPAGE", raising=False)  # Python's mmap has it on Linux only
    model = laid_out_model()
    where = [t.data_ptr() for t in model.parameters()]
    assert huge_pages_possible() is False and move_to_huge_pages(model) is False
    assert [t.data_ptr() for t in model.parameters()] == where


@pytest.mark.skipif(not THP_ON, reason="needs Linux with transparent huge pages (enabled: always or madvise)")
def test_under_an_address_space_limit_the_weights_stay_where_they_are_and_still_work():
    model = laid_out_model()
    idx = torch.randint(0, 4096, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(idx)[0]
    where = [t.data_ptr() for t in model.parameters()]
    in_use = int(re.search(r"VmSize:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (in_use + HUGE_PAGE, hard))  # room for 2 MiB more: not for the model's 8 MB
    try:
        moved = move_to_huge_pages(model)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert moved is False and [t.data_ptr() for t in model.parameters()] == where
    with torch.no_grad():
        assert torch.equal(model(idx)[0], before)
