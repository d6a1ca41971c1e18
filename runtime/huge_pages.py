"""Weights on huge pages for a model that only runs on a CPU, as in sample.py and the tab
(Linux's transparent huge pages, 2 MiB on x86-64).

A decoding step reads every weight once, so its speed is memory's. On 4 KiB pages a 250 MB model
is 61,000 address translations a token, and each miss in the TLB costs a walk of the page tables
(two of them nested inside a virtual machine); on 2 MiB pages it is 120. With the setting many
distributions ship (`madvise` in /sys/kernel/mm/transparent_hugepage/enabled), a process gets
them only where it asks, and torch's allocator does not ask. On a 2-core AMD EPYC VM, GPT-2
small decoded 12% to 14% faster at bf16 and 24% faster at fp32 with its weights on them, and
`x.sum()` read 16% to 32% faster (docs/speed.md, "Weights on huge pages").

Torch has a switch of its own, THP_MEM_ALLOC_ENABLE=1, but it is read once, at torch's first
allocation (so it must be set before `import torch`), and it covers every allocation of 2 MiB or
more; moving the weights once they are loaded depends on no order of imports.
"""

import ctypes
import functools
import mmap
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

THP = Path("/sys/kernel/mm/transparent_hugepage")
ALIGNMENT = 64  # bytes between the start of each tensor placed: a cache line, as torch's allocator aligns
SMALLEST_MODEL = 16 << 20  # bytes: a smaller model sits mostly in the caches, and a huge page would be much of its size


def huge_page_size() -> int:
    """Bytes in a transparent huge page: 2 MiB on x86-64, more on an arm64 kernel of 64 KiB pages."""
    try:
        return int((THP / "hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return 2 << 20


HUGE_PAGE = huge_page_size()


def huge_pages_possible() -> bool:
    """Whether this process can ask for huge pages: Linux's madvise(MADV_HUGEPAGE) (Python's mmap
    has it only there) with transparent huge pages not switched off."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        return "[never]" not in (THP / "enabled").read_text()
    except OSError:
        return False


def huge_page_mapping(nbytes: int) -> tuple[mmap.mmap, int]:
    """An anonymous private mapping advised MADV_HUGEPAGE, and the offset in it of the first huge
    page, from which nbytes fit. It spans whole huge pages, so even a small one gets one (the
    kernel gives a huge page only where all of it is mapped). OSError where it is refused."""
    whole_pages = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    mapping = mmap.mmap(-1, whole_pages + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(mmap.MADV_HUGEPAGE)  # before any page is touched: each is then faulted in whole
    address = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    return mapping, -address % HUGE_PAGE  # mmap aligns to 4 KiB; the first whole huge page starts here


def huge_page_memory(nbytes: int) -> torch.Tensor:
    """nbytes of zeros (uint8, 1-D) starting a huge page (huge_page_mapping), kept mapped while
    this tensor or a view of it lives."""
    mapping, start = huge_page_mapping(nbytes)
    return torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes, offset=start)


def move_to_huge_pages(model: nn.Module) -> bool:
    """Copy model's parameters and buffers into one huge_page_mapping, each keeping its values,
    dtype, shape and strides (lay_out_for_decoding's transposed weights stay so) and getting a
    storage of its own over it (saving or copying a tensor takes its bytes, not the mapping's);
    tied weights stay one tensor. The old memory is handed back to the system as each moves, so
    the peak is the model and one tensor. Returns whether it moved them. It does not where
    huge_pages_possible() says no, for a model under SMALLEST_MODEL bytes, one with a tensor off
    the CPU, two views of one memory or a tensor that is not dense, nor where the mapping is
    refused (an address-space limit): the weights then stay where they are. Moving the model to
    another device or dtype later puts its weights in ordinary memory again."""
    tensors = weight_tensors(model)
    spans = [padded(t.nbytes) for t in tensors]
    if sum(spans) < SMALLEST_MODEL or not huge_pages_possible() or not all(map(movable, tensors)):
        return False
    if len({t.untyped_storage().data_ptr() for t in tensors}) < len(tensors):
        return False  # views of one memory: copied apart, a write through one would not show in the other
    try:
        mapping, start = huge_page_mapping(sum(spans))
    except OSError:  # ENOMEM from mmap: a speed-up is not worth failing for
        return False
    with torch.no_grad():
        for tensor, span in zip(tensors, spans, strict=True):
            memory = torch.frombuffer(mapping, dtype=torch.uint8, count=tensor.nbytes, offset=start)  # holds the mapping
            placed = memory.view(tensor.dtype).as_strided(tensor.shape, tensor.stride())
            placed.copy_(tensor)
            tensor.data = placed
            release_freed_memory()
            start += span
    return True


def weight_tensors(model: nn.Module) -> list[torch.Tensor]:
    """model's parameters and buffers that hold elements, a tied weight once: what a move places."""
    return [t for t in [*model.parameters(), *model.buffers()] if t.numel() > 0]


def movable(tensor: torch.Tensor) -> bool:
    """Whether tensor is a plain CPU tensor whose elements fill its span once each, in any order
    of dimensions (a transposed weight is; a slice with gaps, or an expanded one, is not)."""
    if tensor.device.type != "cpu" or tensor.layout != torch.strided or tensor.is_quantized:
        return False
    dims = sorted((stride, size) for size, stride in zip(tensor.shape, tensor.stride(), strict=True) if size > 1)
    expected = 1
    for stride, size in dims:  # dense: each dimension's stride is the product of the sizes inside it
        if stride != expected:
            return False
        expected *= size
    return True


def release_freed_memory() -> None:
    """Hand the C heap's free memory back to the system (glibc's malloc_trim), where there is one:
    torch's tensors of up to 32 MiB live in that heap, whose freed pages glibc otherwise keeps, so
    a model's old copy would stay resident beside the new one."""
    trim = malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, looked up once (called after each tensor moves); None in another C library."""
    return getattr(ctypes.CDLL(None), "malloc_trim", None)


def padded(nbytes: int) -> int:
    """nbytes rounded up to a whole number of ALIGNMENT."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT
