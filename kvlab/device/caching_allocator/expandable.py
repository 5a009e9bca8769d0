"""Expandable segments (``expandable_segments:True``) in the allocator model.

Mirrors the expandable-segment half of ``c10/cuda/CUDACachingAllocator.cpp``: the
``ExpandableSegment`` struct (address space reserved once, ``map`` / ``unmap`` of whole pages on
demand) and the ``DeviceCachingAllocator`` methods that drive it, ``find_expandable_block``,
``try_allocate_expandable_block``, ``map_block``, ``unmap_block`` and
``release_expandable_segment``. One segment per (pool, stream) reserves virtual address space for
1 1/8 of the device (torch: ``max_handles`` pages of ``segment_size``) and maps 2 MiB (small) /
20 MiB (large) pages; unmapped address space is held by ``mapped=False`` blocks, which the pool
keeps apart from the free ones (torch's ``BlockPool::unmapped``)::

    |-- alloc --|-- free --|======= unmapped =======|-- alloc --|====== unmapped ======...|
"""

from __future__ import annotations

from kvlab.device.caching_allocator.blocks import Block, BlockPool, Segment, link_after, link_before
from kvlab.device.caching_allocator.sizes import LARGE_BUFFER_BYTES, SMALL_BUFFER_BYTES
from kvlab.errors import require
from kvlab.units import align_down, align_up, div_ceil


class ExpandableSegments:
    """The expandable-segment methods of :class:`~kvlab.device.caching_allocator.CachingAllocatorModel`
    (a mixin). It works on the allocator's ``_pools`` and ``_segments`` and uses its driver
    (``_bump``, ``_driver_free_bytes``), its books (``_stat``, ``_counters``, ``_record``) and
    ``_try_merge_blocks``."""

    total_bytes: int
    _pools: dict[str, BlockPool]
    _segments: dict[int, Segment]
    _counters: dict[str, int]

    def _find_expandable_block(self, pool: BlockPool, stream: int, size: int) -> Block:
        """The lowest-address run of free + unmapped space with room for ``size``; a new segment
        (address space for 1 1/8 of the device) when none has room."""
        for addr in pool.unmapped_addrs(stream):
            candidate = pool.unmapped[addr]
            if candidate.prev is not None and not candidate.prev.allocated:
                candidate = candidate.prev  # the free block just before may grow into it
            room, b = 0, candidate
            while room < size and b is not None and not b.allocated:
                room += b.size
                b = b.next
            if room >= size:
                return candidate
        page = SMALL_BUFFER_BYTES if pool.is_small else LARGE_BUFFER_BYTES
        address_space = div_ceil(self.total_bytes + self.total_bytes // 8, page) * page
        segment = Segment(
            self._bump(address_space), 0, pool.name, stream, True, address_space_bytes=address_space, page_bytes=page
        )
        block = Block(segment.addr, address_space, 0, stream, pool.name, False, segment, mapped=False)
        segment.head = block
        self._segments[segment.addr] = segment
        pool.insert_unmapped(block)
        return block

    def _try_allocate_expandable_block(self, pool: BlockPool, stream: int, size: int) -> Block | None:
        candidate = self._find_expandable_block(pool, stream, size)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:  # free -> unmapped: map the rest and merge
            following = candidate.next
            require(following is not None and not following.mapped,
                    "a free expandable block too small for the request is followed by unmapped space",
                    block=candidate, following=following, size=size)
            if not self._map_block(following, min(size - candidate.size, following.size)):
                return None
            candidate = following
        pool.erase(candidate)
        return candidate

    def _map_block(self, to_map: Block, size: int) -> bool:
        """Map whole pages covering ``size`` bytes at the start of an unmapped block (all or
        nothing, like torch's cuMemCreate loop), then merge with free neighbours."""
        segment, pool = to_map.segment, self._pools[to_map.pool]
        require(not to_map.mapped and 0 < size <= to_map.size,
                "_map_block maps part of an unmapped block (0 < size <= block size)", block=to_map, size=size)
        require((to_map.addr - segment.addr) % segment.page_bytes == 0, "an unmapped block starts on a page",
                block=to_map, page_bytes=segment.page_bytes)
        mapped_bytes = align_up(size, segment.page_bytes)
        if mapped_bytes > self._driver_free_bytes():
            return False
        mapped_addr = to_map.addr
        pool.erase_unmapped(to_map)
        to_map.mapped = True
        if mapped_bytes < to_map.size:
            rest = Block(
                to_map.addr + mapped_bytes, to_map.size - mapped_bytes, 0, to_map.stream, pool.name, False, segment,
                mapped=False,
            )
            link_after(rest, to_map)
            pool.insert_unmapped(rest)
            to_map.size = mapped_bytes
        self._try_merge_blocks(to_map, to_map.prev, pool)
        self._try_merge_blocks(to_map, to_map.next, pool)
        pool.insert(to_map)
        segment.size += mapped_bytes
        self._stat(pool.name, ("reserved_bytes", mapped_bytes))
        self._counters["num_device_alloc"] += 1
        self._record("segment_map", mapped_addr, mapped_bytes, to_map.stream)
        return True

    def _unmap_block(self, block: Block) -> None:
        """Unmap the whole pages inside a free expandable block; the partial pages at either end
        stay mapped as free blocks."""
        segment, pool = block.segment, self._pools[block.pool]
        page = segment.page_bytes
        begin = segment.addr + align_up(block.addr - segment.addr, page)
        end = segment.addr + align_down(block.end_addr - segment.addr, page)
        if begin >= end:
            return
        pool.erase(block)
        if begin > block.addr:
            before = Block(block.addr, begin - block.addr, 0, block.stream, pool.name, False, segment)
            link_before(before, block)
            pool.insert(before)
        if end < block.end_addr:
            after = Block(end, block.end_addr - end, 0, block.stream, pool.name, False, segment)
            link_after(after, block)
            pool.insert(after)
        block.addr, block.size, block.mapped = begin, end - begin, False
        self._try_merge_blocks(block, block.prev, pool)
        self._try_merge_blocks(block, block.next, pool)
        pool.insert_unmapped(block)
        segment.size -= end - begin
        self._stat(pool.name, ("reserved_bytes", -(end - begin)))
        self._counters["num_device_free"] += 1
        self._record("segment_unmap", begin, end - begin, block.stream)

    def _release_expandable_segment(self, block: Block) -> None:
        """Drop an expandable segment whose address space is entirely unmapped."""
        segment = block.segment
        require(not block.mapped and block.size == segment.address_space_bytes and segment.size == 0,
                "an expandable segment is released only when its whole address space is unmapped", block=block,
                segment=segment)
        self._pools[block.pool].erase_unmapped(block)
        del self._segments[segment.addr]
