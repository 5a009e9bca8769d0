"""Sizes and sizing rules of PyTorch's CUDA caching allocator: constants and pure functions.

Mirrors the constants at the top of ``c10/cuda/CUDACachingAllocator.cpp`` (``kMinBlockSize``,
``kSmallSize``, ``kSmallBuffer``, ``kLargeBuffer``, ``kMinLargeAlloc``, ``kRoundLarge``) and the
sizing helpers of ``DeviceCachingAllocator`` in that file: ``round_size``,
``roundup_power2_next_division``, ``get_allocation_size`` and ``get_pool``. Nothing here holds
state, so each rule can be tried with plain numbers.
"""

from __future__ import annotations

from kvlab.units import MiB, align_up

# c10/cuda/CUDACachingAllocator.cpp constants (kMinBlockSize, kSmallSize, ...).
MIN_BLOCK_BYTES = 512  # every size is rounded to a multiple of this
SMALL_SIZE_BYTES = 1 * MiB  # largest "small" request
SMALL_BUFFER_BYTES = 2 * MiB  # small requests are packed into 2 MiB segments (and pages)
LARGE_BUFFER_BYTES = 20 * MiB  # requests of 1-10 MiB share 20 MiB segments (and pages)
MIN_LARGE_ALLOC_BYTES = 10 * MiB  # from here on, a segment is the request rounded to 2 MiB
ROUND_LARGE_BYTES = 2 * MiB
# AcceleratorAllocatorConfig::max_non_split_rounding_size default: an oversize request may take a
# cached block at most this much bigger than itself.
MAX_NON_SPLIT_ROUNDING_BYTES = LARGE_BUFFER_BYTES

UNLIMITED_SPLIT_SIZE = 2**64 - 1  # torch's SIZE_MAX: "max_split_size unset"
BASE_ADDR = 0x7F00_0000_0000  # where the model's first segment starts (a typical CUDA VA)
SEGMENT_ALIGN_BYTES = 2 * MiB

POOLS = ("small", "large")


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """Round ``size`` up to the next of ``divisions`` equal steps between two powers of two.

    Mirrors ``DeviceCachingAllocator::roundup_power2_next_division``: 1.1 MiB with 4 divisions
    lies in [1 MiB, 2 MiB), whose steps are 1, 1.25, 1.5, 1.75 MiB, so it becomes 1.25 MiB.
    """
    if is_power_of_two(size):
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    step = power2_floor >> (divisions.bit_length() - 1)
    if step == 0:
        return power2_floor << 1
    floor = size & ~(step - 1)
    return size if floor == size else floor + step


def round_size(size: int, roundup_power2_divisions: int | None = None) -> int:
    """``DeviceCachingAllocator::round_size``: at least 512 B, a multiple of 512 B, or (with
    divisions > 1 and size > 512 * divisions) the next power-of-two division."""
    if size < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    divisions = roundup_power2_divisions or 0
    if divisions > 1 and size > MIN_BLOCK_BYTES * divisions:
        return roundup_power2_next_division(size, divisions)
    return align_up(size, MIN_BLOCK_BYTES)


def get_allocation_size(size: int) -> int:
    """``DeviceCachingAllocator::get_allocation_size``: the cudaMalloc size for a rounded request."""
    if size <= SMALL_SIZE_BYTES:
        return SMALL_BUFFER_BYTES
    if size < MIN_LARGE_ALLOC_BYTES:
        return LARGE_BUFFER_BYTES
    return align_up(size, ROUND_LARGE_BYTES)


def pool_for(size: int) -> str:
    """``get_pool``: rounded sizes up to 1 MiB live in the small pool."""
    return "small" if size <= SMALL_SIZE_BYTES else "large"

