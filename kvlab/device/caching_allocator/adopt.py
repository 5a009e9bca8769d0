"""Seeding the allocator model with state that predates it (a replay that starts mid-run).

kvlab's own, no upstream counterpart: a ``_dump_snapshot`` recording usually starts after the
process has already built segments, so :mod:`kvlab.device.replay.fidelity` hands each segment that exists at
the start to :meth:`SegmentAdoption.adopt_segment`, and :mod:`kvlab.device.replay.engine` calls
:meth:`SegmentAdoption.limit_address_space` to fence an expandable segment below the address where
the recording's next segment starts. Both are methods of
:class:`~kvlab.device.caching_allocator.CachingAllocatorModel` (mixed in); the books they write are
the ones ``DeviceCachingAllocator`` keeps in ``c10/cuda/CUDACachingAllocator.cpp`` (see
:mod:`~kvlab.device.caching_allocator.stats`).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.device.caching_allocator.blocks import Block, BlockPool, Segment
from kvlab.device.caching_allocator.sizes import LARGE_BUFFER_BYTES, POOLS, SEGMENT_ALIGN_BYTES, SMALL_BUFFER_BYTES
from kvlab.errors import require
from kvlab.units import align_down, align_up


class SegmentAdoption:
    """The seeding methods of :class:`~kvlab.device.caching_allocator.CachingAllocatorModel` (a mixin). They
    write the allocator's ``_segments``, ``_active``, ``_pools`` and ``_next_addr`` and count in its books
    (``_stat``, ``_max_split``, ``_oversize_allocations``, ``_oversize_segments``)."""

    _pools: dict[str, BlockPool]
    _segments: dict[int, Segment]
    _active: dict[int, Block]
    _next_addr: int
    _max_split: int

    def adopt_segment(
        self,
        addr: int,
        pool: str,
        stream: int,
        blocks: Sequence[tuple[int, int, str]],
        *,
        is_expandable: bool = False,
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
