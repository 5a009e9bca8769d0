"""The allocator model's integrity check: every rule that ties its segments, pools and stats together.

kvlab's own: torch's ``DeviceCachingAllocator`` (``c10/cuda/CUDACachingAllocator.cpp``) has no such
walk. :meth:`InvariantCheck.check_invariants` follows each segment's block list and each pool's best-fit index,
recounts the stats that ``c10/core/CachingDeviceAllocator.h`` defines, and balances the driver's
books. It is the ``check_invariants`` method of
:class:`~kvlab.device.caching_allocator.CachingAllocatorModel` (mixed in); tests call it after every step, and
so does ``replay_snapshot(..., check_invariants=True)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlab.device.caching_allocator.sizes import MIN_BLOCK_BYTES, POOLS, SMALL_BUFFER_BYTES
from kvlab.device.caching_allocator.stats import STAT_ARRAYS
from kvlab.errors import require


@dataclass
class _Tally:
    """What the segment walk counts, per pool, for the pool and stat checks to compare against."""

    allocated: dict = field(default_factory=lambda: {p: 0 for p in POOLS})
    requested: dict = field(default_factory=lambda: {p: 0 for p in POOLS})
    reserved: dict = field(default_factory=lambda: {p: 0 for p in POOLS})
    inactive_split: dict = field(default_factory=lambda: {p: [0, 0] for p in POOLS})
    n_free: dict = field(default_factory=lambda: {p: 0 for p in POOLS})
    n_unmapped: dict = field(default_factory=lambda: {p: 0 for p in POOLS})
    n_allocated: int = 0
    n_cuda_segments: int = 0


class InvariantCheck:
    """The ``check_invariants`` method of :class:`~kvlab.device.caching_allocator.CachingAllocatorModel` (a
    mixin): it reads the allocator's ``_segments``, ``_pools``, ``_active``, ``_stats`` and
    ``_non_pytorch_bytes``."""

    def check_invariants(self) -> None:
        """Walk every segment and pool; raise :class:`~kvlab.errors.InvariantError` naming the first
        broken rule and the values that broke it (a real check, also under ``python -O``)."""
        tally = _Tally()
        for addr, seg in self._segments.items():
            self._invariants_of_segment(addr, seg, tally)
        require(tally.n_allocated == len(self._active), "every active block is in a segment",
                active=len(self._active), in_segments=tally.n_allocated)
        for p in POOLS:
            self._invariants_of_pool(p, tally)
        for name in STAT_ARRAYS:
            s = self._stats[name]
            require(s["all"].current == s["small_pool"].current + s["large_pool"].current,
                    "a stat's 'all' entry is small + large", stat=name, all=s["all"].current,
                    small=s["small_pool"].current, large=s["large_pool"].current)
        require(self._stats["allocation"]["all"].current == len(self._active), "allocation count == live blocks",
                allocation=self._stats["allocation"]["all"].current, live_blocks=len(self._active))
        require(self._stats["segment"]["all"].current == tally.n_cuda_segments,
                "segment count == cudaMalloc segments", segment=self._stats["segment"]["all"].current,
                cuda_segments=tally.n_cuda_segments)
        free_bytes, total = self.mem_get_info()
        require(free_bytes >= 0 and free_bytes + self.memory_reserved() + self._non_pytorch_bytes == total,
                "driver books balance: free + reserved + non-PyTorch == total", free=free_bytes,
                reserved=self.memory_reserved(), non_pytorch=self._non_pytorch_bytes, total=total)

    def _invariants_of_segment(self, addr: int, seg, tally: _Tally) -> None:
        """Check one segment: its block list tiles it, and each block is where its state says; count them."""
        require(seg.addr == addr, "a segment is filed under its own address", segment=seg, key=addr)
        require(seg.head is not None and seg.head.prev is None, "a segment's head block has no predecessor",
                segment=seg, head=seg.head)
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
            self._invariants_of_block_state(seg, b, tally)
            if b.mapped:
                mapped_bytes += b.size
            cursor, prev = b.end_addr, b
        require(cursor - seg.addr == seg.address_space_bytes, "a segment's blocks cover its address space",
                segment=seg, covered_bytes=cursor - seg.addr, address_space_bytes=seg.address_space_bytes)
        require(mapped_bytes == seg.size, "a segment's size is the sum of its mapped blocks", segment=seg,
                size=seg.size, mapped_bytes=mapped_bytes)
        if not seg.is_expandable:
            tally.n_cuda_segments += 1
            require(seg.size == seg.address_space_bytes, "a cudaMalloc segment is mapped whole", segment=seg,
                    size=seg.size, address_space_bytes=seg.address_space_bytes)
            if seg.pool == "small":
                require(seg.size == SMALL_BUFFER_BYTES, "small-pool cudaMalloc segments are 2 MiB", segment=seg,
                        size=seg.size)
        tally.reserved[seg.pool] += seg.size

    def _invariants_of_block_state(self, seg, b, tally: _Tally) -> None:
        """Check that a block is filed where its state says (active, free in its pool, or unmapped); count it."""
        pool = self._pools[seg.pool]
        if b.allocated:
            require(b.mapped and self._active.get(b.addr) is b, "an allocated block is mapped and active",
                    segment=seg, block=b)
            tally.allocated[seg.pool] += b.size
            tally.requested[seg.pool] += b.requested_size
            tally.n_allocated += 1
        elif b.mapped:
            require(pool.blocks.get(b.addr) is b, "a free mapped block is in its pool", segment=seg, block=b,
                    pool=seg.pool)
            tally.n_free[seg.pool] += 1
            if not seg.is_expandable and b.is_split():
                tally.inactive_split[seg.pool][0] += 1
                tally.inactive_split[seg.pool][1] += b.size
        else:
            require(seg.is_expandable, "only expandable segments hold unmapped blocks", segment=seg, block=b)
            require((b.addr - seg.addr) % seg.page_bytes == 0 and b.size % seg.page_bytes == 0,
                    "an unmapped range is page aligned", segment=seg, block=b, page_bytes=seg.page_bytes)
            require(pool.unmapped.get(b.addr) is b, "an unmapped block is in its pool's unmapped ranges",
                    segment=seg, block=b, pool=seg.pool)
            tally.n_unmapped[seg.pool] += 1

    def _invariants_of_pool(self, p: str, tally: _Tally) -> None:
        """Check one pool: its blocks and best-fit index match the segments, and its stats match the blocks."""
        pool = self._pools[p]
        require(tally.n_free[p] == len(pool.blocks), "every free block in a pool is in a segment", pool=p,
                in_pool=len(pool.blocks), in_segments=tally.n_free[p])
        require(tally.n_unmapped[p] == len(pool.unmapped), "every unmapped block in a pool is in a segment", pool=p,
                in_pool=len(pool.unmapped), in_segments=tally.n_unmapped[p])
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
            ("allocated_bytes", tally.allocated[p]),
            ("active_bytes", tally.allocated[p]),
            ("requested_bytes", tally.requested[p]),
            ("reserved_bytes", tally.reserved[p]),
            ("inactive_split", tally.inactive_split[p][0]),
            ("inactive_split_bytes", tally.inactive_split[p][1]),
        )
        for name, expected in checks:
            current = self._stats[name][f"{p}_pool"].current
            require(current == expected, "each pool stat's current value matches the blocks",
                    stat=f"{name}.{p}_pool.current", current=current, blocks_say=expected)
