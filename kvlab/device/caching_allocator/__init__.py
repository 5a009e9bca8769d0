"""A CPU model of PyTorch's CUDA caching allocator (``c10/cuda/CUDACachingAllocator.cpp``).

Its sizes and sizing rules are in :mod:`~kvlab.device.caching_allocator.sizes`, the
``PYTORCH_CUDA_ALLOC_CONF`` parsing (``c10/core/AllocatorConfig.cpp``) in
:mod:`~kvlab.device.caching_allocator.config`, blocks, segments and pools in
:mod:`~kvlab.device.caching_allocator.blocks`, the stats in
:mod:`~kvlab.device.caching_allocator.stats`, expandable segments in
:mod:`~kvlab.device.caching_allocator.expandable`, the ``torch.cuda.memory._snapshot()`` export in
:mod:`~kvlab.device.caching_allocator.snapshot_export`, and the model in
:mod:`~kvlab.device.caching_allocator.allocator`. Import the public names from this package
(``from kvlab.device.caching_allocator import CachingAllocatorModel``).
"""

from kvlab.device.caching_allocator.allocator import CachingAllocatorModel, OutOfMemoryError
from kvlab.device.caching_allocator.blocks import Block, Segment
from kvlab.device.caching_allocator.config import AllocatorConfig
from kvlab.device.caching_allocator.sizes import (
    BASE_ADDR,
    LARGE_BUFFER_BYTES,
    MAX_NON_SPLIT_ROUNDING_BYTES,
    MIN_BLOCK_BYTES,
    MIN_LARGE_ALLOC_BYTES,
    POOLS,
    ROUND_LARGE_BYTES,
    SEGMENT_ALIGN_BYTES,
    SMALL_BUFFER_BYTES,
    SMALL_SIZE_BYTES,
    UNLIMITED_SPLIT_SIZE,
    get_allocation_size,
    pool_for,
    round_size,
    roundup_power2_next_division,
)

__all__ = [
    "BASE_ADDR",
    "LARGE_BUFFER_BYTES",
    "MAX_NON_SPLIT_ROUNDING_BYTES",
    "MIN_BLOCK_BYTES",
    "MIN_LARGE_ALLOC_BYTES",
    "POOLS",
    "ROUND_LARGE_BYTES",
    "SEGMENT_ALIGN_BYTES",
    "SMALL_BUFFER_BYTES",
    "SMALL_SIZE_BYTES",
    "UNLIMITED_SPLIT_SIZE",
    "AllocatorConfig",
    "Block",
    "CachingAllocatorModel",
    "OutOfMemoryError",
    "Segment",
    "get_allocation_size",
    "pool_for",
    "round_size",
    "roundup_power2_next_division",
]
