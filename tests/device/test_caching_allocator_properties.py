"""Random malloc / free / empty_cache against the caching-allocator model.

After every step: ``check_invariants()``, plus a brute-force shadow that knows only the live
blocks and the segment list (allocated == sum of live block sizes, reserved == sum of segment
sizes, no two live blocks overlap, free + reserved + non-PyTorch == total). For cudaMalloc
segments, each malloc is also checked against a brute-force best fit: scan every free block,
take the smallest that fits (ties by address) under the max_split_size rules, and predict whether
it is split, or that a fresh segment is needed.
"""

from __future__ import annotations

from fuzz import fuzz_settings, record
from hypothesis import HealthCheck
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvlab.device.caching_allocator import (
    LARGE_BUFFER_BYTES,
    MIN_BLOCK_BYTES,
    SMALL_BUFFER_BYTES,
    SMALL_SIZE_BYTES,
    AllocatorConfig,
    Block,
    CachingAllocatorModel,
    OutOfMemoryError,
    get_allocation_size,
    pool_for,
    round_size,
)
from kvlab.device.events import EventRecorder
from kvlab.units import MiB, align_up

CONFIGS = [
    AllocatorConfig(),
    AllocatorConfig(max_split_size_bytes=24 * MiB),
    AllocatorConfig(max_split_size_bytes=64 * MiB),
    AllocatorConfig(roundup_power2_divisions=4),
    AllocatorConfig(expandable_segments=True),
    AllocatorConfig(expandable_segments=True, max_split_size_bytes=24 * MiB),
]

SIZES = st.one_of(
    st.integers(0, 4096),  # tiny: small pool
    st.integers(4097, 1 * MiB),  # small pool
    st.integers(1 * MiB + 1, 10 * MiB - 1),  # large pool, shares 20 MiB segments
    st.integers(10 * MiB, 48 * MiB),  # large pool, own segment rounded to 2 MiB
    st.sampled_from([1 * MiB, 1 * MiB + 1, 2 * MiB, 10 * MiB - 512, 10 * MiB, 19 * MiB, 20 * MiB, 24 * MiB, 64 * MiB]),
)


class AllocatorMachine(RuleBasedStateMachine):
    @initialize(
        config=st.sampled_from(CONFIGS),
        total_mib=st.sampled_from([64, 160, 512]),
        non_pytorch_mib=st.integers(0, 16),
    )
    def setup(self, config: AllocatorConfig, total_mib: int, non_pytorch_mib: int) -> None:
        record("allocator")
        self.config = config
        self.alloc = CachingAllocatorModel(
            total_mib * MiB, non_pytorch_bytes=non_pytorch_mib * MiB, config=config, recorder=EventRecorder()
        )
        self.live: list[Block] = []

    # ---- brute-force oracles -----------------------------------------------------------------
    def _free_blocks(self) -> list[Block]:
        return [b for seg in self.alloc.segments for b in seg.blocks if not b.allocated]

    def _predicted_fit(self, rounded: int, stream: int) -> Block | None:
        """The cached block torch's get_free_block picks for cudaMalloc segments, by full scan."""
        msplit = self.config.effective_max_split_size_bytes
        fits = [
            b for b in self._free_blocks() if b.pool == pool_for(rounded) and b.stream == stream and b.size >= rounded
        ]
        if not fits:
            return None
        best = min(fits, key=lambda b: (b.size, b.addr))
        if rounded < msplit and best.size >= msplit:
            return None
        if rounded >= msplit and best.size >= rounded + LARGE_BUFFER_BYTES:
            return None
        return best

    def _splits(self, pool: str, block_size: int, rounded: int) -> bool:
        remaining = block_size - rounded
        if pool == "small" or self.config.expandable_segments:
            return remaining >= MIN_BLOCK_BYTES
        return rounded < self.config.effective_max_split_size_bytes and remaining > SMALL_SIZE_BYTES

    # ---- rules -----------------------------------------------------------------------------------
    @rule(size=SIZES, stream=st.sampled_from([0, 0, 0, 1]))
    def malloc(self, size: int, stream: int) -> None:
        rounded = round_size(size, self.config.roundup_power2_divisions)
        expandable = self.config.expandable_segments
        predicted = None if expandable else self._predicted_fit(rounded, stream)
        predicted_addr, predicted_size = (predicted.addr, predicted.size) if predicted else (None, None)
        segments_before = {seg.addr for seg in self.alloc.segments}
        reserved_before = self.alloc.memory_reserved()
        try:
            block = self.alloc.malloc(size, stream)
        except OutOfMemoryError as err:
            self._check_oom(err, size, rounded, stream)
            return
        assert (block.requested_size, block.stream, block.pool) == (size, stream, pool_for(rounded))
        assert block.allocated and block.size >= rounded
        if expandable:
            assert block.size == rounded  # sizes are multiples of 512: expandable blocks always split
        elif predicted_addr is not None:
            assert block.addr == predicted_addr, "best fit picked another block"
            expected_size = rounded if self._splits(block.pool, predicted_size, rounded) else predicted_size
            assert block.size == expected_size
            assert self.alloc.memory_reserved() == reserved_before, "a cache hit changed reserved bytes"
        else:
            assert block.segment.addr not in segments_before, "no cached block fits, yet no new segment"
            alloc_size = get_allocation_size(rounded)
            assert block.segment.size == alloc_size
            assert block.size == (rounded if self._splits(block.pool, alloc_size, rounded) else alloc_size)
        self.live.append(block)

    def _check_oom(self, err: OutOfMemoryError, size: int, rounded: int, stream: int) -> None:
        free_bytes, total = self.alloc.mem_get_info()
        assert (err.requested_bytes, err.free_bytes, err.total_bytes) == (size, free_bytes, total)
        assert err.allocated_bytes == self.alloc.memory_allocated()
        assert self.alloc.recorder.events[-1].action == "oom"
        if self.config.expandable_segments:
            page = SMALL_BUFFER_BYTES if rounded <= SMALL_SIZE_BYTES else LARGE_BUFFER_BYTES
            assert free_bytes < align_up(rounded, page), "OOM although the driver could map the pages"
            self._assert_no_whole_free_page()
        else:
            assert free_bytes < get_allocation_size(rounded), "OOM although cudaMalloc would succeed"
            assert self._predicted_fit(rounded, stream) is None, "OOM although a cached block fits"
            for seg in self.alloc.segments:
                assert any(b.allocated for b in seg.blocks), f"OOM left a fully free {seg!r} cached"

    def _assert_no_whole_free_page(self) -> None:
        for seg in self.alloc.segments:
            if seg.is_expandable:
                for b in seg.blocks:
                    if not b.allocated:
                        first_page = align_up(b.addr - seg.addr, seg.page_bytes)
                        assert first_page + seg.page_bytes > b.end_addr - seg.addr, f"{b!r} holds a whole free page"

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 1 << 16))
    def free(self, index: int) -> None:
        block = self.live.pop(index % len(self.live))
        allocated_before, size = self.alloc.memory_allocated(), block.size
        reserved_before = self.alloc.memory_reserved()
        self.alloc.free(block)  # the block object may now have merged with its neighbours
        assert not block.allocated
        assert self.alloc.memory_allocated() == allocated_before - size
        assert self.alloc.memory_reserved() == reserved_before, "free must not release memory"

    @rule()
    def empty_cache(self) -> None:
        before = self.alloc.memory_reserved()
        released = self.alloc.empty_cache()
        assert released == before - self.alloc.memory_reserved() >= 0
        for seg in self.alloc.segments:
            if not seg.is_expandable:
                assert any(b.allocated for b in seg.blocks), f"empty_cache kept a fully free {seg!r}"
        self._assert_no_whole_free_page()
        if not self.live:
            assert self.alloc.memory_reserved() == 0 and self.alloc.segments == []

    @rule(non_pytorch_mib=st.integers(0, 64))
    def set_non_pytorch(self, non_pytorch_mib: int) -> None:
        value = non_pytorch_mib * MiB
        if value + self.alloc.memory_reserved() <= self.alloc.total_bytes:
            self.alloc.non_pytorch_bytes = value
            assert self.alloc.mem_get_info()[0] == self.alloc.total_bytes - value - self.alloc.memory_reserved()

    # ---- after every step ------------------------------------------------------------------------
    @invariant()
    def books_balance(self) -> None:
        if not hasattr(self, "alloc"):
            return
        a = self.alloc
        a.check_invariants()
        # Shadow model: only the live handles and the segment list.
        assert {id(b) for b in a.active_blocks} == {id(b) for b in self.live}
        assert a.memory_allocated() == sum(b.size for b in self.live)
        assert a.memory_stats()["requested_bytes.all.current"] == sum(b.requested_size for b in self.live)
        assert a.memory_reserved() == sum(seg.size for seg in a.segments)
        ordered = sorted(self.live, key=lambda b: b.addr)
        for left, right in zip(ordered, ordered[1:]):
            assert left.end_addr <= right.addr, f"{left!r} overlaps {right!r}"
        free_bytes, total = a.mem_get_info()
        assert free_bytes >= 0 and free_bytes + a.memory_reserved() + a.non_pytorch_bytes == total
        assert a.memory_allocated() <= a.memory_reserved()
        assert a.max_memory_allocated() >= a.memory_allocated()
        assert a.max_memory_reserved() >= a.memory_reserved()
        events = a.recorder.events
        if events:
            last = events[-1]
            assert (last.allocated_bytes, last.reserved_bytes) == (a.memory_allocated(), a.memory_reserved())


# How many runs: tests/fuzz.py, by profile (KVLAB_FUZZ).
AllocatorMachine.TestCase.settings = fuzz_settings("allocator", suppress_health_check=[HealthCheck.too_slow])
TestCachingAllocatorModel = AllocatorMachine.TestCase
