"""Weights on 2 MiB pages for a model that only runs on a CPU, as in sample.py and the tab
(Linux's transparent huge pages).

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

import mmap

import torch
from torch import nn

HUGE_PAGE = 2 << 20  # bytes: x86-64's and most arm64 kernels' transparent huge page
ALIGNMENT = 64  # bytes between the start of each tensor placed: a cache line, as torch's allocator aligns


def huge_pages_possible() -> bool:
    """Whether this process can ask for huge pages: Linux's madvise(MADV_HUGEPAGE) (Python's mmap
    has it only there) with transparent huge pages not switched off."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as setting:
            return "[never]" not in setting.read()
    except OSError:
        return False


def huge_page_memory(nbytes: int) -> torch.Tensor:
    """nbytes of zeros (uint8, 1-D) starting a huge page, in an anonymous private mapping advised
    MADV_HUGEPAGE, kept mapped while any tensor viewing it lives. It spans whole huge pages, so
    even a small one gets one (the kernel gives a huge page only where all 2 MiB are mapped)."""
    whole_pages = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    mapping = mmap.mmap(-1, whole_pages + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(mmap.MADV_HUGEPAGE)  # before any page is touched: each is then faulted in 2 MiB at a time
    memory = torch.frombuffer(mapping, dtype=torch.uint8)  # holds a reference to the mapping
    skip = -memory.data_ptr() % HUGE_PAGE  # mmap aligns to 4 KiB; the first whole huge page starts here
    return memory[skip : skip + nbytes]


def move_to_huge_pages(model: nn.Module) -> bool:
    """Copy model's parameters and buffers into one huge_page_memory, each keeping its values,
    dtype, shape and strides (lay_out_for_decoding's transposed weights stay so), tied weights
    still one tensor. Returns whether it did: not where huge_pages_possible() says no, nor for a
    model with a tensor off the CPU, nor where the mapping is refused (an address-space limit): the
    weights then stay where they are. For a model that only runs from now on: one that trains, or
    moves to another device or dtype, gets ordinary memory again."""
    tensors = [*model.parameters(), *model.buffers()]  # a tied weight once
    if not tensors or any(t.device.type != "cpu" for t in tensors) or not huge_pages_possible():
        return False
    spans = [padded(extent(t) * t.element_size()) for t in tensors]
    try:
        memory = huge_page_memory(sum(spans))
    except OSError:  # ENOMEM from mmap: a speed-up is not worth failing for
        return False
    start = memory.storage_offset()  # bytes into the mapping: where the next tensor goes
    with torch.no_grad():
        for tensor, span in zip(tensors, spans, strict=True):
            placed = torch.empty(0, dtype=tensor.dtype).set_(
                memory.untyped_storage(), start // tensor.element_size(), tensor.shape, tensor.stride())
            placed.copy_(tensor)
            tensor.data = placed  # the old memory is freed here: the peak is the model and one tensor
            start += span
    return True


def extent(tensor: torch.Tensor) -> int:
    """The elements from tensor's first to its last, whatever its strides (positive, as a
    module's are): what a copy with the same strides needs."""
    if tensor.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True))


def padded(nbytes: int) -> int:
    """nbytes rounded up to a whole number of ALIGNMENT."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT
