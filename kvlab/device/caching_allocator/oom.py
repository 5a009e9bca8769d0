"""Running out of memory: the allocator model's OOM error and its message.

Mirrors the failure branch of ``DeviceCachingAllocator::malloc`` in
``c10/cuda/CUDACachingAllocator.cpp`` (the "CUDA out of memory. Tried to allocate ..." text, from
the same numbers) and ``c10::OutOfMemoryError`` (``c10/util/Exception.h``), which Python sees as
``torch.OutOfMemoryError``. Counting ``num_ooms`` and recording the ``oom`` trace entry stay with the
allocator's state, in ``CachingAllocatorModel._raise_oom``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlab.units import fmt_bytes

_OOM_ADVICE = (
    "If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
    "See documentation for Memory Management  "
    "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
)


@dataclass(eq=False)
class OutOfMemoryError(torch.OutOfMemoryError):
    """Raised by :meth:`~kvlab.device.caching_allocator.CachingAllocatorModel.malloc`; ``except torch.OutOfMemoryError`` catches it.

    The figures the failure is told by, each an attribute; the message (:func:`oom_message`) is made from them.
    ``requested_bytes`` is what the caller asked for; ``allocation_bytes`` is the segment size the
    message names ("Tried to allocate"), as torch prints ``get_allocation_size`` there."""

    requested_bytes: int
    allocation_bytes: int
    total_bytes: int
    free_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    device_index: int

    def __post_init__(self) -> None:
        super().__init__(oom_message(self.device_index, self.allocation_bytes, self.total_bytes, self.free_bytes,
                                     self.allocated_bytes, self.reserved_bytes))


def oom_message(
    device_index: int, alloc_size: int, total_bytes: int, free_bytes: int, allocated_bytes: int, reserved_bytes: int
) -> str:
    """The text torch raises when ``malloc`` fails: ``alloc_size`` is the segment it tried to get."""
    return (
        f"CUDA out of memory. Tried to allocate {fmt_bytes(alloc_size)}. "
        f"GPU {device_index} has a total capacity of {fmt_bytes(total_bytes)} "
        f"of which {fmt_bytes(free_bytes)} is free. "
        f"Including non-PyTorch memory, this process has {fmt_bytes(total_bytes - free_bytes)} memory in use. "
        f"Of the allocated memory {fmt_bytes(allocated_bytes)} is allocated by PyTorch, "
        f"and {fmt_bytes(reserved_bytes - allocated_bytes)} is reserved by PyTorch but unallocated. "
        f"{_OOM_ADVICE}"
    )
