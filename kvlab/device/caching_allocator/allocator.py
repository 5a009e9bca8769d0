"""The allocator model's core: ``DeviceCachingAllocator`` for one device, streams as plain ints.

Mirrors ``c10/cuda/CUDACachingAllocator.cpp::DeviceCachingAllocator`` step by step, under torch's
own names: ``malloc`` (``get_free_block``, ``alloc_block``, ``release_available_cached_blocks``,
``release_cached_blocks``, then OOM), ``alloc_found_block`` with ``should_split``, ``free`` /
``free_block`` with ``try_merge_blocks``, and ``release_block``. The halves that torch keeps in the
same class live beside this file: expandable segments in
:mod:`~kvlab.device.caching_allocator.expandable`, the stats in
:mod:`~kvlab.device.caching_allocator.stats` (both mixed in), the OOM message in
:mod:`~kvlab.device.caching_allocator.oom`, and the snapshot export, the replay
seeding and the integrity check in :mod:`~kvlab.device.caching_allocator.snapshot_export`,
:mod:`~kvlab.device.caching_allocator.adopt` and :mod:`~kvlab.device.caching_allocator.invariants`
(mixed in the same way). The package docstring lists where kvlab differs on purpose.

The "driver" is a single number: it can hand out ``total_bytes - non_pytorch_bytes - reserved``
more bytes, in any shape. Memory layout, non-expandable (one ``cudaMalloc`` per segment, blocks
split and merged inside)::

    segment 0x7f0000000000 (20 MiB, large pool)
    |-- 5 MiB allocated --|-- 3 MiB allocated --|------ 12 MiB free (cached) ------|
"""

from __future__ import annotations

import operator
from bisect import bisect_left
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvlab.device.caching_allocator.adopt import SegmentAdoption
from kvlab.device.caching_allocator.blocks import Block, BlockPool, Segment, link_before
from kvlab.device.caching_allocator.config import AllocatorConfig
from kvlab.device.caching_allocator.expandable import ExpandableSegments
from kvlab.device.caching_allocator.invariants import InvariantCheck
from kvlab.device.caching_allocator.oom import OutOfMemoryError
from kvlab.device.caching_allocator.sizes import (
    BASE_ADDR,
    MAX_NON_SPLIT_ROUNDING_BYTES,
    MIN_BLOCK_BYTES,
    POOLS,
    SEGMENT_ALIGN_BYTES,
    SMALL_SIZE_BYTES,
    get_allocation_size,
    pool_for,
    round_size,
)
from kvlab.device.caching_allocator.snapshot_export import SnapshotExport
from kvlab.device.caching_allocator.stats import AllocatorStats
from kvlab.errors import require
from kvlab.units import align_up

if TYPE_CHECKING:
    from kvlab.device.events import EventRecorder

_DEFAULT_CONFIG = AllocatorConfig()  # torch's defaults (frozen, so one shared instance is safe)


class CachingAllocatorModel(ExpandableSegments, AllocatorStats, SnapshotExport, SegmentAdoption, InvariantCheck):
    """``DeviceCachingAllocator`` for one device, on the CPU. See the module docstring."""

    def __init__(
        self,
        total_bytes: int,
        *,
        non_pytorch_bytes: int = 0,
        config: AllocatorConfig = _DEFAULT_CONFIG,
        recorder: EventRecorder | None = None,
        device_index: int = 0,
    ) -> None:
        if not isinstance(total_bytes, int) or total_bytes <= 0:
            raise ValueError(f"total_bytes must be a positive int, got {total_bytes!r}")
        if not isinstance(config, AllocatorConfig):
            raise TypeError(f"config must be an AllocatorConfig, got {type(config).__name__}")
        self.total_bytes = total_bytes
        self.config = config
        self.recorder = recorder
        self.device_index = device_index
        self._max_split = config.effective_max_split_size_bytes
        self._pools = {name: BlockPool(name) for name in POOLS}
        self._segments: dict[int, Segment] = {}  # addr -> segment
        self._active: dict[int, Block] = {}  # addr -> allocated block
        self._next_addr = BASE_ADDR
        # Hook: ``f(address_space_bytes) -> addr`` chooses each new segment's address instead of the bump
        # pointer (kvlab.device.replay.engine gives the address the recorded driver returned).
        self.segment_address_source: Callable[[int], int] | None = None
        self._init_stats()
        self._non_pytorch_bytes = 0
        self.non_pytorch_bytes = non_pytorch_bytes

    # ---- the driver ------------------------------------------------------------------------
    @property
    def non_pytorch_bytes(self) -> int:
        """CUDA context, NCCL buffers, other processes: device memory the allocator cannot use."""
        return self._non_pytorch_bytes

    @non_pytorch_bytes.setter
    def non_pytorch_bytes(self, value: int) -> None:
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"non_pytorch_bytes must be a non-negative int, got {value!r}")
        if value + self.memory_reserved() > self.total_bytes:
            raise ValueError(
                f"non_pytorch_bytes={value} does not fit: total {self.total_bytes}, "
                f"reserved by PyTorch {self.memory_reserved()}"
            )
        self._non_pytorch_bytes = value

    def mem_get_info(self) -> tuple[int, int]:
        """``cudaMemGetInfo``: (free, total) as the driver sees the device."""
        return self.total_bytes - self._non_pytorch_bytes - self.memory_reserved(), self.total_bytes

    def _driver_free_bytes(self) -> int:
        return self.mem_get_info()[0]

    def _bump(self, size: int) -> int:
        if self.segment_address_source is not None:  # a replay hands out the recorded addresses
            return self.segment_address_source(size)
        addr = self._next_addr
        self._next_addr = align_up(addr + size, SEGMENT_ALIGN_BYTES)
        return addr

    def _record(self, action: str, addr: int, size: int, stream: int) -> None:
        if self.recorder is not None:
            self.recorder.record(
                action,
                addr,
                size,
                stream=stream,
                allocated_bytes=self.memory_allocated(),
                reserved_bytes=self.memory_reserved(),
                device=self.device_index,
            )

    # ---- public entry points -----------------------------------------------------------------
    def malloc(self, size: int, stream: int = 0) -> Block:
        """``DeviceCachingAllocator::malloc``. ``size`` is the requested bytes.

        Order of attempts, as in torch: a cached block (``get_free_block``); a new segment
        (``alloc_block``); free oversize cached blocks and retry (only with max_split_size set);
        free every fully free segment (``release_cached_blocks``) and retry; else OOM.
        Size 0 is rounded to 512 B like any request (torch's outer ``allocate`` skips it instead).
        """
        size = operator.index(size)
        stream = operator.index(stream)
        if size < 0:
            raise ValueError(f"malloc size must be >= 0 bytes, got {size}")
        if stream < 0:
            raise ValueError(f"stream must be a non-negative int, got {stream}")
        rounded = self.round_size(size)
        pool = self._pools[pool_for(rounded)]
        alloc_size = get_allocation_size(rounded)

        block = self.get_free_block(pool, stream, rounded)
        if block is None:
            block = self.alloc_block(pool, stream, rounded, alloc_size, is_retry=False)
        if block is None and self.release_available_cached_blocks(pool, stream, rounded):
            block = self.alloc_block(pool, stream, rounded, alloc_size, is_retry=False)
        if block is None and self.release_cached_blocks():
            block = self.alloc_block(pool, stream, rounded, alloc_size, is_retry=True)
        if block is None:
            self._raise_oom(size, rounded, alloc_size, stream)
        return self._alloc_found_block(block, pool, rounded, size, self.should_split(block, rounded))

    def free(self, block: Block) -> None:
        """``DeviceCachingAllocator::free``: stats drop at once, then ``free_block`` merges."""
        if not isinstance(block, Block):
            raise TypeError(f"free() takes a Block, got {type(block).__name__}")
        if not block.allocated:
            raise ValueError(f"double free: {block!r} is not allocated")
        if self._active.get(block.addr) is not block:
            raise ValueError(f"{block!r} was not allocated by this allocator")
        del self._active[block.addr]
        block.allocated = False
        self._stat(block.pool, ("allocation", -1), ("allocated_bytes", -block.size))
        if block.size >= self._max_split:
            self._oversize_allocations.decrease(1)
        self._record("free_requested", block.addr, block.requested_size, block.stream)
        self.free_block(block)

    def empty_cache(self) -> int:
        """``emptyCache``: release every fully free segment (and unmap free expandable pages).
        Returns the bytes given back to the driver."""
        before = self.memory_reserved()
        self.release_cached_blocks()
        return before - self.memory_reserved()

    # ---- torch's internal steps ------------------------------------------------------------
    def round_size(self, size: int) -> int:
        return round_size(size, self.config.roundup_power2_divisions)

    def get_free_block(self, pool: BlockPool, stream: int, size: int) -> Block | None:
        """Best fit: the smallest cached block >= size on this stream (ties: lowest address),
        subject to the max_split_size rules; removed from the pool when found."""
        keys = pool.keys(stream)
        i = bisect_left(keys, (size, 0))
        if i == len(keys):
            return None
        block = pool.blocks[keys[i][1]]
        if self.config.expandable_segments:
            # torch treats a free block followed by unmapped space as big as it could grow, and
            # walks on while the next candidate's expandable size is smaller.
            def expandable_size(b: Block) -> int:
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

            while i + 1 < len(keys):
                candidate = pool.blocks[keys[i + 1][1]]
                if expandable_size(candidate) >= expandable_size(block):
                    break
                block, i = candidate, i + 1
        # Do not return an oversized block for a request below max_split_size ...
        if size < self._max_split and block.size >= self._max_split:
            return None
        # ... and let an oversize request round up into a cached block only a little.
        if size >= self._max_split and block.size >= size + MAX_NON_SPLIT_ROUNDING_BYTES:
            return None
        pool.erase(block)
        return block

    def should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.pool == "small" or self.config.expandable_segments:
            return remaining >= MIN_BLOCK_BYTES
        return size < self._max_split and remaining > SMALL_SIZE_BYTES

    def alloc_block(
        self, pool: BlockPool, stream: int, size: int, alloc_size: int, *, is_retry: bool
    ) -> Block | None:
        """cudaMalloc a new ``alloc_size`` segment (or, expandable, map pages for ``size``).
        Returns its one free block, not in the pool, or None when the driver is out of memory."""
        if is_retry:
            self._counters["num_alloc_retries"] += 1
        if self.config.expandable_segments:
            return self._try_allocate_expandable_block(pool, stream, size)
        if alloc_size > self._driver_free_bytes():
            return None
        segment = Segment(self._bump(alloc_size), alloc_size, pool.name, stream, address_space_bytes=alloc_size)
        block = Block(segment.addr, alloc_size, 0, stream, pool.name, False, segment)
        segment.head = block
        self._segments[segment.addr] = segment
        self._stat(pool.name, ("segment", 1), ("reserved_bytes", alloc_size))
        if alloc_size >= self._max_split:
            self._oversize_segments.increase(1)
        self._counters["num_device_alloc"] += 1
        self._record("segment_alloc", segment.addr, alloc_size, stream)
        return block

    def _alloc_found_block(self, block: Block, pool: BlockPool, size: int, orig_size: int, split: bool) -> Block:
        """``alloc_found_block``: carve ``size`` bytes off the front of ``block`` (or hand it out
        whole) and count it allocated."""
        already_split = block.is_split()
        expandable = block.segment.is_expandable
        new = Block(block.addr, size if split else block.size, orig_size, block.stream, pool.name, True, block.segment)
        link_before(new, block)
        if split:
            # The old block object stays behind as the free remainder.
            block.addr += size
            block.size -= size
            pool.insert(block)
            if not expandable:
                if already_split:
                    self._stat(pool.name, ("inactive_split_bytes", -size))
                else:
                    self._stat(pool.name, ("inactive_split_bytes", block.size), ("inactive_split", 1))
        else:
            # Unlink the old object: the allocation gets a fresh handle.
            new.next = block.next
            if block.next is not None:
                block.next.prev = new
            block.prev = block.next = None
            if already_split and not expandable:
                self._stat(pool.name, ("inactive_split_bytes", -new.size), ("inactive_split", -1))
        self._active[new.addr] = new
        self._stat(
            pool.name,
            ("allocation", 1),
            ("allocated_bytes", new.size),
            ("active", 1),
            ("active_bytes", new.size),
            ("requested_bytes", orig_size),
        )
        if new.size >= self._max_split:
            self._oversize_allocations.increase(1)
        self._record("alloc", new.addr, orig_size, new.stream)
        return new

    def free_block(self, block: Block) -> None:
        """Return a block to its pool, merging with free neighbours of the same segment."""
        self._record("free_completed", block.addr, block.requested_size, block.stream)
        pool = self._pools[block.pool]
        original_size, requested_size = block.size, block.requested_size
        net_blocks = net_bytes = 0
        for candidate in (block.prev, block.next):
            subsumed = self._try_merge_blocks(block, candidate, pool)
            if subsumed:
                net_blocks -= 1
                net_bytes -= subsumed
        block.requested_size = 0
        pool.insert(block)
        if block.is_split():
            net_blocks += 1
            net_bytes += block.size
        if not block.segment.is_expandable:  # torch leaves expandable segments out of inactive_split
            if net_blocks or net_bytes:
                self._stat(block.pool, ("inactive_split", net_blocks), ("inactive_split_bytes", net_bytes))
        self._stat(block.pool, ("active", -1), ("active_bytes", -original_size), ("requested_bytes", -requested_size))

    def _try_merge_blocks(self, dst: Block, src: Block | None, pool: BlockPool) -> int:
        """Absorb neighbour ``src`` into ``dst`` when it is free and equally (un)mapped.
        ``dst`` must not be in the pool (its key changes). Returns the bytes absorbed."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        if src.mapped:
            pool.erase(src)
        else:
            pool.erase_unmapped(src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
            else:
                dst.segment.head = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        src.prev = src.next = None
        return src.size

    def release_available_cached_blocks(self, pool: BlockPool, stream: int, size: int) -> bool:
        """With max_split_size set: cudaFree one cached oversize block big enough for the request,
        or several, largest first, until enough is freed. Expandable blocks are skipped (as in
        current torch), so with expandable segments this never frees anything."""
        if self.config.max_split_size_bytes is None or self.config.expandable_segments:
            return False
        key_size = max(size, self._max_split)
        keys = pool.keys(stream)
        i = bisect_left(keys, (key_size, 0))
        if i < len(keys):
            self.release_block(pool.blocks[keys[i][1]])
            return True
        released, j = 0, i - 1
        while released < key_size and j >= 0 and keys[j][0] >= self._max_split:
            block = pool.blocks[keys[j][1]]
            released += block.size
            self.release_block(block)  # removes keys[j]; keys[:j] keep their indices
            j -= 1
        return released >= key_size

    def release_cached_blocks(self) -> bool:
        """cudaFree every cached block that is a whole segment; unmap free expandable pages."""
        self._counters["num_sync_all_streams"] += 1  # synchronize_and_free_events: no events here
        for name in ("large", "small"):
            self._release_blocks(self._pools[name])
        return True

    def _release_blocks(self, pool: BlockPool) -> None:
        to_unmap = []
        for stream in pool.streams():
            for _, addr in list(pool.keys(stream)):
                block = pool.blocks[addr]
                if block.segment.is_expandable:
                    to_unmap.append(block)
                elif not block.is_split():
                    self.release_block(block)
        for block in to_unmap:
            self._unmap_block(block)
            if not block.mapped and not block.is_split():
                self._release_expandable_segment(block)

    def release_block(self, block: Block) -> None:
        """cudaFree a cached block that is a whole non-expandable segment."""
        segment = block.segment
        require(not segment.is_expandable and not block.is_split() and not block.allocated,
                "release_block frees only a free block that is a whole cudaMalloc segment", block=block,
                segment=segment)
        pool = self._pools[block.pool]
        pool.erase(block)
        del self._segments[segment.addr]
        self._stat(pool.name, ("segment", -1), ("reserved_bytes", -block.size))
        if block.size >= self._max_split:
            self._oversize_segments.decrease(1)
        self._counters["num_device_free"] += 1
        self._record("segment_free", block.addr, block.size, block.stream)

    # ---- OOM ------------------------------------------------------------------------------------
    def _raise_oom(self, size: int, rounded: int, alloc_size: int, stream: int) -> None:
        free_bytes, total_bytes = self.mem_get_info()
        self._counters["num_ooms"] += 1
        # torch records the free device memory in the addr slot and the rounded size.
        self._record("oom", free_bytes, rounded, stream)
        allocated, reserved = self.memory_allocated(), self.memory_reserved()
        raise OutOfMemoryError(requested_bytes=size, allocation_bytes=alloc_size, total_bytes=total_bytes,
                               free_bytes=free_bytes, allocated_bytes=allocated, reserved_bytes=reserved,
                               device_index=self.device_index)

    # ---- inspection ----------------------------------------------------------------------------
    @property
    def segments(self) -> list[Segment]:
        """Segments holding device memory, in address order. (An expandable segment whose pages
        are all unmapped keeps only address space, as in torch, and is not listed.)"""
        return [self._segments[a] for a in sorted(self._segments) if self._segments[a].size > 0]

    @property
    def active_blocks(self) -> list[Block]:
        """Allocated blocks in address order."""
        return [self._active[a] for a in sorted(self._active)]
