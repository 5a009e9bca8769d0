"""A CPU model of PyTorch's CUDA caching allocator: one device, streams as plain ints.

It mirrors ``c10/cuda/CUDACachingAllocator.cpp::DeviceCachingAllocator`` step by step, under
torch's own names (``round_size``, ``get_free_block``, ``should_split``, ``alloc_block``,
``free_block``, ``release_cached_blocks``, ``get_allocation_size``), so a learner can read the two
side by side. Each module here reads against one upstream file or one part of it:

==================== =============================================================================
module               upstream
==================== =============================================================================
``sizes``            constants and sizing rules at the top of ``CUDACachingAllocator.cpp``
                     (``kMinBlockSize`` ..., ``round_size``, ``get_allocation_size``, ``get_pool``)
``config``           ``c10/core/AllocatorConfig.cpp`` and ``c10/cuda/CUDAAllocatorConfig.cpp``
                     (``parseArgs``: ``PYTORCH_CUDA_ALLOC_CONF``)
``blocks``           the ``Block`` and ``BlockPool`` structs of ``CUDACachingAllocator.cpp``
``stats``            ``Stat`` / ``DeviceStats`` (``c10/core/CachingDeviceAllocator.h``) and
                     ``torch.cuda.memory_stats()``
``allocator``        ``DeviceCachingAllocator``: ``malloc``, ``free``, ``emptyCache`` and their steps
``oom``              ``malloc``'s out-of-memory message and ``c10::OutOfMemoryError``
``expandable``       ``ExpandableSegment`` and ``find_expandable_block`` / ``map_block`` /
                     ``unmap_block`` / ``release_expandable_segment``
``snapshot_export``  ``DeviceCachingAllocator::snapshot`` and
                     ``torch/csrc/cuda/memory_snapshot.cpp::_memory_snapshot_pickled``
``adopt``            kvlab's own: seeding the model with segments a recording starts with
``invariants``       kvlab's own: ``check_invariants()``
==================== =============================================================================

Imports go one way: ``sizes`` <- ``config``, ``blocks``, ``stats``, ``oom`` <- ``expandable``,
``snapshot_export``, ``adopt``, ``invariants`` <- ``allocator``. Import the public names from this
package (``from kvlab.device.caching_allocator import CachingAllocatorModel``).

Where kvlab differs on purpose (everything else follows torch):
- one device and no CUDA events: ``free`` completes at once (``free_requested`` then
  ``free_completed``), so ``active`` always equals ``allocated``;
- no CUDA graphs / private pools, no ``garbage_collection_threshold``, no per-interval
  ``roundup_power2_divisions`` list, no IPC; the config is fixed for the allocator's lifetime;
- a freed block's ``requested_size`` reads 0 (torch leaves the stale value behind);
- addresses come from a bump pointer and are never reused;
- every allocation gets a fresh :class:`Block` object, so a stale handle can never free
  somebody else's allocation (torch reuses the ``Block*`` when it does not split).
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
