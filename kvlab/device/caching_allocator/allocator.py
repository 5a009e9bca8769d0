"""A CPU model of PyTorch's CUDA caching allocator: one device, streams as plain ints.

It mirrors ``c10/cuda/CUDACachingAllocator.cpp::DeviceCachingAllocator`` step by step, under
torch's own names (``round_size``, ``get_free_block``, ``should_split``, ``alloc_block``,
``free_block``, ``release_cached_blocks``, ``get_allocation_size``), so a learner can read the two
side by side. The "driver" is a single number: it can hand out
``total_bytes - non_pytorch_bytes - reserved`` more bytes, in any shape.

Memory layout, non-expandable (one ``cudaMalloc`` per segment, blocks split and merged inside)::

    segment 0x7f0000000000 (20 MiB, large pool)
    |-- 5 MiB allocated --|-- 3 MiB allocated --|------ 12 MiB free (cached) ------|

Expandable segments (``expandable_segments:True``) are in
:mod:`~kvlab.device.caching_allocator.expandable`.

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

from __future__ import annotations

import operator
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from kvlab.device.caching_allocator import snapshot_export
from kvlab.device.caching_allocator.blocks import Block, BlockPool, Segment, link_before
from kvlab.device.caching_allocator.config import AllocatorConfig
from kvlab.device.caching_allocator.expandable import ExpandableSegments
from kvlab.device.caching_allocator.sizes import (
    BASE_ADDR,
    LARGE_BUFFER_BYTES,
    MAX_NON_SPLIT_ROUNDING_BYTES,
    MIN_BLOCK_BYTES,
    POOLS,
    SEGMENT_ALIGN_BYTES,
    SMALL_BUFFER_BYTES,
    SMALL_SIZE_BYTES,
    get_allocation_size,
    pool_for,
    round_size,
)
from kvlab.device.caching_allocator.stats import STAT_ARRAYS, AllocatorStats
from kvlab.errors import require
from kvlab.units import align_down, align_up, fmt_bytes

if TYPE_CHECKING:
    from kvlab.device.events import EventRecorder

_OOM_ADVICE = (
    "If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
    "See documentation for Memory Management  "
    "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
)
_DEFAULT_CONFIG = AllocatorConfig()  # torch's defaults (frozen, so one shared instance is safe)


# ---- errors -----------------------------------------------------------------------------------------


class OutOfMemoryError(torch.OutOfMemoryError):
    """Raised by :meth:`CachingAllocatorModel.malloc`; ``except torch.OutOfMemoryError`` catches it.

    ``requested_bytes`` is what the caller asked for; ``allocation_bytes`` is the segment size the
    message names ("Tried to allocate"), as torch prints ``get_allocation_size`` there."""

    def __init__(
        self,
        message: str,
        *,
        requested_bytes: int,
        allocation_bytes: int,
        total_bytes: int,
        free_bytes: int,
        allocated_bytes: int,
        reserved_bytes: int,
        device_index: int,
    ) -> None:
        super().__init__(message)
        self.requested_bytes = requested_bytes
        self.allocation_bytes = allocation_bytes
        self.total_bytes = total_bytes
        self.free_bytes = free_bytes
        self.allocated_bytes = allocated_bytes
        self.reserved_bytes = reserved_bytes
        self.device_index = device_index


# ---- the allocator ---------------------------------------------------------------------------


class CachingAllocatorModel(ExpandableSegments, AllocatorStats):
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
        # pointer (kvlab.device.replay gives the address the recorded driver returned).
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
        message = (
            f"CUDA out of memory. Tried to allocate {fmt_bytes(alloc_size)}. "
            f"GPU {self.device_index} has a total capacity of {fmt_bytes(total_bytes)} "
            f"of which {fmt_bytes(free_bytes)} is free. "
            f"Including non-PyTorch memory, this process has {fmt_bytes(total_bytes - free_bytes)} memory in use. "
            f"Of the allocated memory {fmt_bytes(allocated)} is allocated by PyTorch, "
            f"and {fmt_bytes(reserved - allocated)} is reserved by PyTorch but unallocated. {_OOM_ADVICE}"
        )
        raise OutOfMemoryError(
            message,
            requested_bytes=size,
            allocation_bytes=alloc_size,
            total_bytes=total_bytes,
            free_bytes=free_bytes,
            allocated_bytes=allocated,
            reserved_bytes=reserved,
            device_index=self.device_index,
        )

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

    # torch.cuda.memory._snapshot(): a function of the allocator, in snapshot_export.py
    snapshot = snapshot_export.memory_snapshot

    # ---- adopting state that predates the model (a replay seeded mid-run) ------------------------
    def adopt_segment(
        self, addr: int, pool: str, stream: int, blocks: Sequence[tuple[int, int, str]], *, is_expandable: bool = False
    ) -> list[Block]:
        """Take over a segment that existed before this model started (kvlab.device.replay seeds a
        history that starts mid-run this way). ``blocks`` tile the segment from ``addr`` in address
        order as ``(size, requested_size, state)``, state ``"allocated"``, ``"free"`` or, in an
        expandable segment, ``"unmapped"``; adjacent free blocks must already be merged. Stats count it
        as if this allocator had built it (no trace event, no cudaMalloc counted). Returns the allocated
        blocks in address order; :meth:`check_invariants` checks the result."""
        if pool not in POOLS:
            raise ValueError(f"adopt_segment: pool must be one of {POOLS}, got {pool!r}")
        end = addr + sum(size for size, _, _ in blocks)
        for other in self._segments.values():
            if addr < other.addr + other.address_space_bytes and other.addr < end:
                raise ValueError(f"adopt_segment: [{addr:#x}, {end:#x}) overlaps {other!r}")
        page = (SMALL_BUFFER_BYTES if pool == "small" else LARGE_BUFFER_BYTES) if is_expandable else 0
        segment = Segment(addr, 0, pool, stream, is_expandable, address_space_bytes=end - addr, page_bytes=page)
        prev, cursor, allocated = None, addr, []
        for size, requested, state in blocks:
            if state not in ("allocated", "free", "unmapped") or (state == "unmapped" and not is_expandable):
                raise ValueError(f"adopt_segment: block state {state!r} at {cursor:#x} not allowed here")
            block = Block(cursor, size, requested if state == "allocated" else 0, stream, pool, state == "allocated",
                          segment, mapped=state != "unmapped", prev=prev)
            if prev is None:
                segment.head = block
            else:
                prev.next = block
            segment.size += size if block.mapped else 0
            cursor, prev = cursor + size, block
        self._segments[addr] = segment
        for b in segment.iter_all_blocks():
            if b.allocated:
                self._active[b.addr] = b
                allocated.append(b)
                self._stat(pool, ("allocation", 1), ("allocated_bytes", b.size), ("active", 1),
                           ("active_bytes", b.size), ("requested_bytes", b.requested_size))
                if b.size >= self._max_split:
                    self._oversize_allocations.increase(1)
            elif b.mapped:
                self._pools[pool].insert(b)
                if not is_expandable and b.is_split():
                    self._stat(pool, ("inactive_split", 1), ("inactive_split_bytes", b.size))
            else:
                self._pools[pool].insert_unmapped(b)
        self._stat(pool, ("reserved_bytes", segment.size))
        if not is_expandable:
            self._stat(pool, ("segment", 1))
            if segment.size >= self._max_split:
                self._oversize_segments.increase(1)
        self._next_addr = max(self._next_addr, align_up(end, SEGMENT_ALIGN_BYTES))
        return allocated

    def limit_address_space(self, segment: Segment, end: int) -> None:
        """Give up an expandable segment's unmapped address space from ``end`` (rounded down to a page) on:
        a replay learns where the recording's next segment starts and fences this one below it."""
        require(segment.is_expandable, "only an expandable segment has address space to give up", segment=segment)
        new_end = segment.addr + align_down(end - segment.addr, segment.page_bytes)
        if new_end >= segment.addr + segment.address_space_bytes:
            return
        tail = segment.head
        while tail.next is not None:
            tail = tail.next
        require(not tail.mapped and segment.addr < tail.addr <= new_end,
                "only unmapped space after the last mapped page can be given up", segment=segment, tail=tail,
                end=new_end)
        pool = self._pools[segment.pool]
        pool.erase_unmapped(tail)
        if tail.addr < new_end:
            tail.size = new_end - tail.addr
            pool.insert_unmapped(tail)
        else:
            tail.prev.next = None
            tail.prev = None
        segment.address_space_bytes = new_end - segment.addr

    def check_invariants(self) -> None:
        """Walk every segment and pool; raise :class:`~kvlab.errors.InvariantError` naming the first
        broken rule and the values that broke it (a real check, also under ``python -O``)."""
        allocated = {p: 0 for p in POOLS}
        requested = {p: 0 for p in POOLS}
        reserved = {p: 0 for p in POOLS}
        inactive_split = {p: [0, 0] for p in POOLS}
        n_free = {p: 0 for p in POOLS}
        n_unmapped = {p: 0 for p in POOLS}
        n_allocated = n_cuda_segments = 0
        for addr, seg in self._segments.items():
            require(seg.addr == addr, "a segment is filed under its own address", segment=seg, key=addr)
            require(seg.head is not None and seg.head.prev is None, "a segment's head block has no predecessor",
                    segment=seg, head=seg.head)
            pool = self._pools[seg.pool]
            cursor, mapped_bytes, prev = seg.addr, 0, None
            for b in seg.iter_all_blocks():
                require(b.segment is seg and b.prev is prev, "block links: each block points at its segment and "
                        "at the block before it", segment=seg, block=b, prev=prev)
                require(b.addr == cursor, "a segment's blocks tile it with no gap or overlap", segment=seg, block=b,
                        expected_addr=cursor)
                require(b.size > 0 and b.size % MIN_BLOCK_BYTES == 0, "a block's size is a positive multiple of 512",
                        segment=seg, block=b, size=b.size)
                require(b.pool == seg.pool and b.stream == seg.stream, "a block has its segment's pool and stream",
                        segment=seg, block=b)
                if prev is not None and not b.allocated and not prev.allocated:
                    require(b.mapped != prev.mapped, "two adjacent free blocks are merged", segment=seg, block=b,
                            prev=prev)
                if b.allocated:
                    require(b.mapped and self._active.get(b.addr) is b, "an allocated block is mapped and active",
                            segment=seg, block=b)
                    allocated[seg.pool] += b.size
                    requested[seg.pool] += b.requested_size
                    n_allocated += 1
                elif b.mapped:
                    require(pool.blocks.get(b.addr) is b, "a free mapped block is in its pool", segment=seg, block=b,
                            pool=seg.pool)
                    n_free[seg.pool] += 1
                    if not seg.is_expandable and b.is_split():
                        inactive_split[seg.pool][0] += 1
                        inactive_split[seg.pool][1] += b.size
                else:
                    require(seg.is_expandable, "only expandable segments hold unmapped blocks", segment=seg, block=b)
                    require((b.addr - seg.addr) % seg.page_bytes == 0 and b.size % seg.page_bytes == 0,
                            "an unmapped range is page aligned", segment=seg, block=b, page_bytes=seg.page_bytes)
                    require(pool.unmapped.get(b.addr) is b, "an unmapped block is in its pool's unmapped ranges",
                            segment=seg, block=b, pool=seg.pool)
                    n_unmapped[seg.pool] += 1
                if b.mapped:
                    mapped_bytes += b.size
                cursor, prev = b.end_addr, b
            require(cursor - seg.addr == seg.address_space_bytes, "a segment's blocks cover its address space",
                    segment=seg, covered_bytes=cursor - seg.addr, address_space_bytes=seg.address_space_bytes)
            require(mapped_bytes == seg.size, "a segment's size is the sum of its mapped blocks", segment=seg,
                    size=seg.size, mapped_bytes=mapped_bytes)
            if not seg.is_expandable:
                n_cuda_segments += 1
                require(seg.size == seg.address_space_bytes, "a cudaMalloc segment is mapped whole", segment=seg,
                        size=seg.size, address_space_bytes=seg.address_space_bytes)
                if seg.pool == "small":
                    require(seg.size == SMALL_BUFFER_BYTES, "small-pool cudaMalloc segments are 2 MiB", segment=seg,
                            size=seg.size)
            reserved[seg.pool] += seg.size
        require(n_allocated == len(self._active), "every active block is in a segment",
                active=len(self._active), in_segments=n_allocated)
        for p in POOLS:
            pool = self._pools[p]
            require(n_free[p] == len(pool.blocks), "every free block in a pool is in a segment", pool=p,
                    in_pool=len(pool.blocks), in_segments=n_free[p])
            require(n_unmapped[p] == len(pool.unmapped), "every unmapped block in a pool is in a segment", pool=p,
                    in_pool=len(pool.unmapped), in_segments=n_unmapped[p])
            n_keys = 0
            for stream in pool.streams():
                keys = pool.keys(stream)
                require(keys == sorted(keys), "a pool's best-fit index is sorted by (size, addr)", pool=p,
                        stream=stream)
                for size, addr in keys:
                    b = pool.blocks.get(addr)
                    require(b is not None and (b.size, b.stream) == (size, stream),
                            "every best-fit key names a free block of that size and stream", pool=p, stream=stream,
                            key=(size, addr), block=b)
                n_keys += len(keys)
            require(n_keys == len(pool.blocks), "a pool's best-fit index and its blocks agree", pool=p, keys=n_keys,
                    blocks=len(pool.blocks))
            checks = (
                ("allocated_bytes", allocated[p]),
                ("active_bytes", allocated[p]),
                ("requested_bytes", requested[p]),
                ("reserved_bytes", reserved[p]),
                ("inactive_split", inactive_split[p][0]),
                ("inactive_split_bytes", inactive_split[p][1]),
            )
            for name, expected in checks:
                current = self._stats[name][f"{p}_pool"].current
                require(current == expected, "each pool stat's current value matches the blocks",
                        stat=f"{name}.{p}_pool.current", current=current, blocks_say=expected)
        for name in STAT_ARRAYS:
            s = self._stats[name]
            require(s["all"].current == s["small_pool"].current + s["large_pool"].current,
                    "a stat's 'all' entry is small + large", stat=name, all=s["all"].current,
                    small=s["small_pool"].current, large=s["large_pool"].current)
        require(self._stats["allocation"]["all"].current == len(self._active), "allocation count == live blocks",
                allocation=self._stats["allocation"]["all"].current, live_blocks=len(self._active))
        require(self._stats["segment"]["all"].current == n_cuda_segments, "segment count == cudaMalloc segments",
                segment=self._stats["segment"]["all"].current, cuda_segments=n_cuda_segments)
        free_bytes, total = self.mem_get_info()
        require(free_bytes >= 0 and free_bytes + self.memory_reserved() + self._non_pytorch_bytes == total,
                "driver books balance: free + reserved + non-PyTorch == total", free=free_bytes,
                reserved=self.memory_reserved(), non_pytorch=self._non_pytorch_bytes, total=total)
