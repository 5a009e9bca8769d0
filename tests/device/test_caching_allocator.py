"""Worked cases for the caching-allocator model, one rule per test (docs/semantics.md#pytorch-cuda-caching-allocator).

Every number is derived by hand in the docstring. Addresses count from ``BASE_ADDR``; segments
come from a bump pointer, so the n-th segment starts where the previous one ended (2 MiB aligned).
"""

from __future__ import annotations

import random
import time

import pytest
import torch

from kvlab.device.caching_allocator import (
    BASE_ADDR,
    AllocatorConfig,
    Block,
    CachingAllocatorModel,
    OutOfMemoryError,
    get_allocation_size,
    round_size,
)
from kvlab.device.events import EventRecorder
from kvlab.units import GiB, MiB

BASE = BASE_ADDR


def make(total_bytes: int = 8 * GiB, **config) -> CachingAllocatorModel:
    return CachingAllocatorModel(total_bytes, config=AllocatorConfig(**config), recorder=EventRecorder())


def layout(segment) -> list[tuple[int, bool]]:
    """(size in bytes, allocated?) of each mapped block, in address order."""
    return [(b.size, b.allocated) for b in segment.blocks]


def actions(alloc: CachingAllocatorModel) -> list[str]:
    return [e.action for e in alloc.recorder.events]


# ---- rounding and pools ------------------------------------------------------------------------


def test_round_size_512_minimum_and_multiple():
    """round_size: < 512 -> 512; else the next multiple of 512. 0 and 1 -> 512, 513 -> 1024,
    1000 -> 1024, 1536 stays 1536."""
    assert [round_size(n) for n in (0, 1, 511, 512, 513, 1000, 1536)] == [512, 512, 512, 512, 1024, 1024, 1536]
    a = make()
    block = a.malloc(1000)
    assert (block.size, block.requested_size) == (1024, 1000)
    a.check_invariants()


def test_round_size_power2_divisions():
    """roundup_power2_divisions:4 splits [2^k, 2^(k+1)) into 4 steps.
    1,153,434 B (~1.1 MiB) lies in [1 MiB, 2 MiB): steps 1, 1.25, 1.5, 1.75 MiB -> 1.25 MiB
    = 1,310,720 B (plain rounding gives 1,153,536). 1200 B is not > 512*4 = 2048, so it keeps
    plain rounding (1536). Powers of two stay put. With 8 divisions, 5 MiB + 1 in [4, 8) MiB
    (steps of 512 KiB) becomes 5.5 MiB."""
    size = 1_153_434
    assert round_size(size) == 1_153_536
    assert round_size(size, 4) == 1_310_720
    assert round_size(1200, 4) == 1536
    assert round_size(2 * MiB, 4) == 2 * MiB
    assert round_size(5 * MiB + 1, 8) == 5 * MiB + 512 * 1024
    a = make(roundup_power2_divisions=4)
    block = a.malloc(size)
    # 1.25 MiB > 1 MiB: large pool, 20 MiB segment.
    assert (block.size, block.pool, a.memory_reserved()) == (1_310_720, "large", 20 * MiB)


def test_small_pool_boundary_is_1mib():
    """malloc(1 MiB) rounds to 1,048,576 <= 1 MiB: small pool, 2 MiB segment. malloc(1 MiB + 1)
    rounds to 1 MiB + 512: large pool, 20 MiB segment. Reserved 2 + 20 = 22 MiB."""
    a = make()
    small = a.malloc(1 * MiB)
    assert (small.pool, small.segment.size, a.memory_reserved()) == ("small", 2 * MiB, 2 * MiB)
    large = a.malloc(1 * MiB + 1)
    assert (large.size, large.pool, large.segment.size) == (1 * MiB + 512, "large", 20 * MiB)
    assert a.memory_reserved() == 22 * MiB
    a.check_invariants()


def test_large_segment_sizes_10mib_boundary():
    """get_allocation_size: <= 1 MiB -> 2 MiB; < 10 MiB -> 20 MiB; else rounded up to 2 MiB.
    10 MiB - 512 -> 20 MiB segment; 10 MiB -> a 10 MiB segment; 10 MiB + 1 (rounded 10 MiB + 512)
    -> 12 MiB. (Each on a fresh allocator: the first one's 10 MiB + 512 B remainder would hold
    the second.)"""
    assert get_allocation_size(1 * MiB) == 2 * MiB
    assert get_allocation_size(10 * MiB - 512) == 20 * MiB
    assert get_allocation_size(10 * MiB) == 10 * MiB
    assert get_allocation_size(10 * MiB + 512) == 12 * MiB
    sizes = [make().malloc(n).segment.size for n in (10 * MiB - 512, 10 * MiB, 10 * MiB + 1)]
    assert sizes == [20 * MiB, 10 * MiB, 12 * MiB]


# ---- best fit ----------------------------------------------------------------------------------


def test_best_fit_takes_the_smallest_block_that_fits():
    """Cached whole segments of 12, 14 and 16 MiB (reserved 42 MiB). malloc(11 MiB) takes the
    12 MiB one (smallest >= 11 MiB); the 1 MiB remainder is not > 1 MiB, so the whole 12 MiB block
    is handed out. malloc(13 MiB) then takes the 14 MiB one. Reserved stays 42 MiB."""
    a = make()
    blocks = [a.malloc(n * MiB) for n in (12, 14, 16)]
    addrs = [b.addr for b in blocks]
    for b in blocks:
        a.free(b)
    got = a.malloc(11 * MiB)
    assert (got.addr, got.size) == (addrs[0], 12 * MiB)
    got = a.malloc(13 * MiB)
    assert (got.addr, got.size) == (addrs[1], 14 * MiB)
    assert a.memory_reserved() == 42 * MiB
    assert a.memory_allocated() == 26 * MiB


def test_best_fit_ties_go_to_the_lowest_address():
    """Two cached 12 MiB segments at BASE and BASE + 12 MiB, freed high one first. malloc(12 MiB)
    still gets BASE: ties on size are broken by address, not by freeing order."""
    a = make()
    low, high = a.malloc(12 * MiB), a.malloc(12 * MiB)
    assert (low.addr, high.addr) == (BASE, BASE + 12 * MiB)
    a.free(high)
    a.free(low)
    assert a.malloc(12 * MiB).addr == BASE


def test_cached_blocks_serve_only_their_stream():
    """A cached 20 MiB segment on stream 0 does not serve a 5 MiB request on stream 1: a new 20 MiB
    segment is cudaMalloc'ed, reserved 40 MiB."""
    a = make()
    a.free(a.malloc(5 * MiB, stream=0))
    other = a.malloc(5 * MiB, stream=1)
    assert other.segment.stream == 1 and a.memory_reserved() == 40 * MiB
    a.check_invariants()


# ---- splitting ---------------------------------------------------------------------------------


def test_small_pool_splits_when_remainder_at_least_512():
    """malloc(1000) -> 1024 B from a 2 MiB small segment; the 2,096,128 B remainder (>= 512) stays
    cached. malloc(1 MiB) splits it again (1 MiB - 1024 B left), and malloc(1 MiB - 1024) takes the
    rest exactly. allocated 1024 -> 2 MiB, reserved 2 MiB throughout."""
    a = make()
    first = a.malloc(1000)
    assert layout(first.segment) == [(1024, True), (2 * MiB - 1024, False)]
    assert (a.memory_allocated(), a.memory_reserved()) == (1024, 2 * MiB)
    second = a.malloc(1 * MiB)
    assert second.addr == BASE + 1024
    assert layout(first.segment) == [(1024, True), (1 * MiB, True), (1 * MiB - 1024, False)]
    last = a.malloc(1 * MiB - 1024)
    assert (last.addr, last.pool) == (BASE + 1 * MiB + 1024, "small")
    assert layout(first.segment) == [(1024, True), (1 * MiB, True), (1 * MiB - 1024, True)]
    assert (a.memory_allocated(), a.memory_reserved()) == (2 * MiB, 2 * MiB)


def test_large_pool_splits_only_with_more_than_1mib_left():
    """19 MiB -> segment align_up(19 MiB, 2 MiB) = 20 MiB; remainder 1 MiB is not > 1 MiB, so the
    whole 20 MiB block is allocated: allocated_bytes 20 MiB, requested_bytes 19 MiB.
    19 MiB - 512 leaves 1 MiB + 512 > 1 MiB: split, allocated 19 MiB - 512."""
    a = make()
    whole = a.malloc(19 * MiB)
    assert (whole.size, whole.requested_size) == (20 * MiB, 19 * MiB)
    stats = a.memory_stats()
    assert stats["allocated_bytes.all.current"] == 20 * MiB
    assert stats["requested_bytes.all.current"] == 19 * MiB
    b = make()
    split = b.malloc(19 * MiB - 512)
    assert layout(split.segment) == [(19 * MiB - 512, True), (1 * MiB + 512, False)]
    assert b.memory_allocated() == 19 * MiB - 512


def test_requests_under_10mib_split_a_20mib_segment():
    """Three 5 MiB requests share one 20 MiB segment: 20 -> 5 + 15 -> 5 + 5 + 10 -> 5 + 5 + 5 + 5.
    allocated 15 MiB, reserved 20 MiB."""
    a = make()
    blocks = [a.malloc(5 * MiB) for _ in range(3)]
    assert [b.addr - BASE for b in blocks] == [0, 5 * MiB, 10 * MiB]
    assert layout(blocks[0].segment) == [(5 * MiB, True)] * 3 + [(5 * MiB, False)]
    assert (a.memory_allocated(), a.memory_reserved()) == (15 * MiB, 20 * MiB)


# ---- max_split_size ----------------------------------------------------------------------------


def test_max_split_size_request_below_never_takes_an_oversize_block():
    """max_split_size 40 MiB, a cached 64 MiB segment. malloc(30 MiB) (< 40 MiB) may not take the
    64 MiB block (>= 40 MiB): a new 30 MiB segment, reserved 94 MiB. Without the option it takes
    and splits the 64 MiB block (remainder 34 MiB > 1 MiB): reserved stays 64 MiB."""
    for config, reserved in ((dict(max_split_size_bytes=40 * MiB), 94 * MiB), ({}, 64 * MiB)):
        a = make(**config)
        a.free(a.malloc(64 * MiB))
        a.malloc(30 * MiB)
        assert a.memory_reserved() == reserved, config
        a.check_invariants()


def test_max_split_size_oversize_request_rounds_up_by_less_than_20mib():
    """max_split_size 40 MiB, a cached 64 MiB segment. malloc(50 MiB) (>= 40 MiB) may take it
    since 64 < 50 + 20: the whole 64 MiB is allocated (oversize blocks are never split).
    malloc(42 MiB) may not (64 >= 42 + 20): a new 42 MiB segment. Both count as oversize."""
    a = make(max_split_size_bytes=40 * MiB)
    a.free(a.malloc(64 * MiB))
    block = a.malloc(50 * MiB)
    assert (block.size, a.memory_reserved()) == (64 * MiB, 64 * MiB)
    a.free(block)
    block = a.malloc(42 * MiB)
    assert (block.size, a.memory_reserved()) == (42 * MiB, 106 * MiB)
    stats = a.memory_stats()
    assert stats["oversize_allocations.current"] == 1
    assert stats["oversize_segments.current"] == 2
    assert stats["max_split_size"] == 40 * MiB
    assert make().memory_stats()["max_split_size"] == -1


def test_max_split_size_frees_one_oversize_block_before_everything():
    """release_available_cached_blocks: total 200 MiB; cached: a 2 MiB small segment, 64 MiB and
    100 MiB oversize segments (reserved 166, driver free 34 MiB). malloc(36 MiB): no cached block
    may serve it, 36 > 34 fails; the smallest cached block >= max(36, 40) = 40 MiB is the 64 MiB
    one: it alone is cudaFree'd (free 98 MiB) and the retry succeeds. The 2 and 100 MiB segments
    stay cached: reserved 2 + 100 + 36 = 138 MiB, and this is not counted as an alloc retry."""
    a = make(200 * MiB, max_split_size_bytes=40 * MiB)
    for block in [a.malloc(1000), a.malloc(64 * MiB), a.malloc(100 * MiB)]:
        a.free(block)
    assert a.mem_get_info()[0] == 34 * MiB
    a.recorder.clear()
    a.malloc(36 * MiB)
    assert a.memory_reserved() == 138 * MiB
    assert [(e.action, e.size) for e in a.recorder.events] == [
        ("segment_free", 64 * MiB),
        ("segment_alloc", 36 * MiB),
        ("alloc", 36 * MiB),
    ]
    assert a.memory_stats()["num_alloc_retries"] == 0


def test_max_split_size_frees_several_oversize_blocks_largest_first():
    """No single cached block >= 100 MiB: torch frees oversize blocks from the largest down until
    enough is released. total 200 MiB, live 60 MiB, cached 64 and 48 MiB (driver free 28 MiB).
    malloc(100 MiB): frees 64 (64 < 100), then 48 (112 >= 100), then cudaMallocs 100 MiB.
    reserved 60 + 100 = 160 MiB."""
    a = make(200 * MiB, max_split_size_bytes=40 * MiB)
    cached = [a.malloc(64 * MiB), a.malloc(48 * MiB)]
    a.malloc(60 * MiB)
    for block in cached:
        a.free(block)
    a.recorder.clear()
    a.malloc(100 * MiB)
    assert [(e.action, e.size // MiB) for e in a.recorder.events] == [
        ("segment_free", 64),
        ("segment_free", 48),
        ("segment_alloc", 100),
        ("alloc", 100),
    ]
    assert a.memory_reserved() == 160 * MiB


# ---- free and merge ----------------------------------------------------------------------------


def test_free_merges_with_free_neighbours():
    """a, b, c = 5 MiB each in one 20 MiB segment, 5 MiB left. free(a): [f5 b5 c5 f5];
    free(c) merges with the tail: [f5 b5 f10]; free(b) merges both sides: [f20]."""
    a = make()
    x, y, z = (a.malloc(5 * MiB) for _ in range(3))
    segment = x.segment
    a.free(x)
    assert layout(segment) == [(5 * MiB, False), (5 * MiB, True), (5 * MiB, True), (5 * MiB, False)]
    a.free(z)
    assert layout(segment) == [(5 * MiB, False), (5 * MiB, True), (10 * MiB, False)]
    a.free(y)
    assert layout(segment) == [(20 * MiB, False)]
    a.check_invariants()


def test_merging_never_crosses_segments():
    """x = 5 MiB in segment 1 (20 MiB at BASE); y = 16 MiB does not fit the 15 MiB remainder, so it
    gets segment 2 (16 MiB at BASE + 20 MiB: address-adjacent). After both frees the cached blocks
    are 20 MiB and 16 MiB, not one 36 MiB block, so malloc(36 MiB) needs a third segment:
    reserved 20 + 16 + 36 = 72 MiB."""
    a = make()
    x, y = a.malloc(5 * MiB), a.malloc(16 * MiB)
    assert y.addr == BASE + 20 * MiB
    a.free(x)
    a.free(y)
    assert [layout(s) for s in a.segments] == [[(20 * MiB, False)], [(16 * MiB, False)]]
    a.malloc(36 * MiB)
    assert a.memory_reserved() == 72 * MiB


# ---- empty_cache and fragmentation ----------------------------------------------------------


def test_empty_cache_keeps_a_segment_pinned_by_one_live_block():
    """Two 5 MiB blocks in a 20 MiB segment; free one. empty_cache() releases 0 bytes: the live
    5 MiB pins all 20 MiB (allocated 5 MiB, reserved 20 MiB). After the last free it releases
    20 MiB."""
    a = make()
    x, y = a.malloc(5 * MiB), a.malloc(5 * MiB)
    a.free(x)
    assert a.empty_cache() == 0
    assert (a.memory_allocated(), a.memory_reserved()) == (5 * MiB, 20 * MiB)
    a.free(y)
    assert a.empty_cache() == 20 * MiB
    assert a.memory_reserved() == 0 and a.segments == []


def test_allocation_order_changes_reserved_bytes():
    """Same blocks, 4 MiB and 16 MiB (allocated 20 MiB either way). 4 then 16: 4 MiB splits a
    20 MiB segment and 16 MiB fills the remainder exactly: reserved 20 MiB. 16 then 4: 16 MiB gets
    its own 16 MiB segment, 4 MiB a new 20 MiB one: reserved 36 MiB."""
    first = make()
    first.malloc(4 * MiB)
    first.malloc(16 * MiB)
    second = make()
    second.malloc(16 * MiB)
    second.malloc(4 * MiB)
    assert first.memory_allocated() == second.memory_allocated() == 20 * MiB
    assert (first.memory_reserved(), second.memory_reserved()) == (20 * MiB, 36 * MiB)


def test_oom_although_cached_free_memory_is_enough():
    """total 64 MiB. Three 20 MiB segments, each [4 MiB live | 16 MiB freed] (reserved 60, driver
    free 4 MiB, cached free 48 MiB). malloc(24 MiB): no cached block >= 24 MiB, cudaMalloc(24 MiB)
    fails, release_cached_blocks frees nothing (every segment is pinned), retry fails -> OOM.
    Allocated 12 MiB, reserved-but-unallocated 48 MiB, twice the request."""
    a = make(64 * MiB)
    pinned, freed = [], []
    for _ in range(3):
        pinned.append(a.malloc(4 * MiB))
        freed.append(a.malloc(16 * MiB))
    assert len(a.segments) == 3 and a.mem_get_info()[0] == 4 * MiB
    for block in freed:
        a.free(block)
    with pytest.raises(OutOfMemoryError) as info:
        a.malloc(24 * MiB)
    err = info.value
    assert (err.allocated_bytes, err.reserved_bytes, err.free_bytes) == (12 * MiB, 60 * MiB, 4 * MiB)
    assert "Tried to allocate 24.00 MiB" in str(err)
    assert "48.00 MiB is reserved by PyTorch but unallocated" in str(err)
    stats = a.memory_stats()
    assert (stats["num_alloc_retries"], stats["num_ooms"]) == (1, 1)
    a.check_invariants()


def test_retry_after_release_cached_blocks():
    """total 64 MiB; cached: a 2 MiB small segment and a 40 MiB segment (driver free 22 MiB).
    malloc(50 MiB): no cached block fits, 50 > 22 fails, release_cached_blocks frees 40 then 2 MiB
    (large pool first), the retry cudaMallocs 50 MiB. num_alloc_retries 1, reserved 50 MiB."""
    a = make(64 * MiB)
    a.free(a.malloc(1000))
    a.free(a.malloc(40 * MiB))
    a.recorder.clear()
    a.malloc(50 * MiB)
    assert [(e.action, e.size) for e in a.recorder.events] == [
        ("segment_free", 40 * MiB),
        ("segment_free", 2 * MiB),
        ("segment_alloc", 50 * MiB),
        ("alloc", 50 * MiB),
    ]
    stats = a.memory_stats()
    assert (stats["num_alloc_retries"], stats["num_device_free"], stats["num_device_alloc"]) == (1, 2, 3)
    assert a.memory_reserved() == 50 * MiB


# ---- OOM -----------------------------------------------------------------------------------------


def test_oom_message_and_fields():
    """total 2 GiB (2048 MiB), non-PyTorch 148 MiB, 1800 MiB live: the driver has
    2048 - 148 - 1800 = 100 MiB free, so malloc(200 MiB) fails. The process uses 1948 MiB
    (1.90 GiB), 1800 MiB = 1.76 GiB is allocated, nothing is cached (0 bytes). The OOM is recorded
    as an "oom" event (addr = free bytes, size = rounded request) and counted."""
    recorder = EventRecorder()
    a = CachingAllocatorModel(2 * GiB, non_pytorch_bytes=148 * MiB, recorder=recorder)
    a.malloc(1800 * MiB)
    with pytest.raises(torch.OutOfMemoryError) as info:
        a.malloc(200 * MiB)
    err = info.value
    assert isinstance(err, OutOfMemoryError)
    assert str(err).startswith(
        "CUDA out of memory. Tried to allocate 200.00 MiB. GPU 0 has a total capacity of 2.00 GiB of which "
        "100.00 MiB is free. Including non-PyTorch memory, this process has 1.90 GiB memory in use. "
        "Of the allocated memory 1.76 GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch "
        "but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    )
    assert (err.requested_bytes, err.allocation_bytes) == (200 * MiB, 200 * MiB)
    assert (err.total_bytes, err.free_bytes) == (2 * GiB, 100 * MiB)
    assert (err.allocated_bytes, err.reserved_bytes, err.device_index) == (1800 * MiB, 1800 * MiB, 0)
    last = recorder.events[-1]
    assert (last.action, last.addr, last.size) == ("oom", 100 * MiB, 200 * MiB)
    assert a.memory_stats()["num_ooms"] == 1
    oom_entry = a.snapshot()["device_traces"][0][-1]
    assert oom_entry["action"] == "oom" and oom_entry["device_free"] == 100 * MiB


def test_oom_names_the_segment_size_torch_tried_to_allocate():
    """On a 16 MiB device (GPU 2), malloc(5 MiB) needs a 20 MiB segment: torch's message says
    "Tried to allocate 20.00 MiB" (get_allocation_size), the error keeps the 5 MiB request."""
    a = CachingAllocatorModel(16 * MiB, device_index=2)
    with pytest.raises(OutOfMemoryError) as info:
        a.malloc(5 * MiB)
    assert "Tried to allocate 20.00 MiB. GPU 2 has a total capacity of 16.00 MiB" in str(info.value)
    assert (info.value.requested_bytes, info.value.allocation_bytes) == (5 * MiB, 20 * MiB)
    a.check_invariants()
    assert a.malloc(1 * MiB).size == 1 * MiB  # the allocator still works after an OOM


# ---- expandable segments -------------------------------------------------------------------


def test_expandable_segments_reuse_a_grown_segment():
    """30 MiB, free, then 32 MiB. cudaMalloc segments: the cached 30 MiB segment cannot hold 32 MiB,
    so reserved = 30 + 32 = 62 MiB. Expandable: 30 MiB maps two 20 MiB pages (40 MiB) and splits
    off 10 MiB; after the free the 40 MiB block holds 32 MiB: reserved 40 MiB."""
    plain, grown = make(), make(expandable_segments=True)
    for a in (plain, grown):
        a.free(a.malloc(30 * MiB))
        a.malloc(32 * MiB)
    assert (plain.memory_reserved(), grown.memory_reserved()) == (62 * MiB, 40 * MiB)
    assert [(e.action, e.size // MiB) for e in grown.recorder.events][:2] == [("segment_map", 40), ("alloc", 30)]
    assert all(s.is_expandable for s in grown.segments)
    grown.check_invariants()


def test_expandable_segment_grows_in_pages_and_merges_across_them():
    """Five 5 MiB blocks: four fill the first 20 MiB page, the fifth maps a second page right after
    it (BASE + 20 MiB): one segment, 40 MiB mapped. Freed, they merge into one 40 MiB block, so
    malloc(40 MiB) needs no new memory (reserved 40 MiB). With cudaMalloc segments the two cached
    20 MiB segments cannot merge: malloc(40 MiB) adds a 40 MiB segment (reserved 80 MiB)."""
    grown = make(expandable_segments=True)
    blocks = [grown.malloc(5 * MiB) for _ in range(5)]
    assert blocks[4].addr == BASE + 20 * MiB
    assert len(grown.segments) == 1 and grown.segments[0].size == 40 * MiB
    for b in blocks:
        grown.free(b)
    assert layout(grown.segments[0]) == [(40 * MiB, False)]
    grown.malloc(40 * MiB)
    assert grown.memory_reserved() == 40 * MiB

    plain = make()
    for b in [plain.malloc(5 * MiB) for _ in range(5)]:
        plain.free(b)
    plain.malloc(40 * MiB)
    assert plain.memory_reserved() == 80 * MiB


def test_expandable_empty_cache_unmaps_only_whole_free_pages():
    """a = 5 MiB maps page 0 [BASE, +20). b = 30 MiB: the 15 MiB free tail of page 0 grows by one
    more page (segment_map at BASE + 20 MiB), b = [BASE + 5, BASE + 35). After free(b) the free
    block is [BASE + 5, BASE + 40): empty_cache unmaps only page 1 (20 MiB); page 0 stays mapped,
    pinned by a. Freeing a and emptying again unmaps page 0 and drops the segment."""
    a = make(expandable_segments=True)
    x = a.malloc(5 * MiB)
    y = a.malloc(30 * MiB)
    assert y.addr == BASE + 5 * MiB
    assert a.memory_reserved() == 40 * MiB
    a.free(y)
    a.recorder.clear()
    assert a.empty_cache() == 20 * MiB
    assert [(e.action, e.addr - BASE, e.size) for e in a.recorder.events] == [("segment_unmap", 20 * MiB, 20 * MiB)]
    assert layout(a.segments[0]) == [(5 * MiB, True), (15 * MiB, False)]
    a.check_invariants()
    a.free(x)
    assert a.empty_cache() == 20 * MiB
    assert (a.memory_reserved(), a.segments) == (0, [])


def test_expandable_hole_is_reported_as_two_segments_and_refilled_first():
    """x, y, z = 20 MiB each map pages 0, 1, 2 exactly. free(y) + empty_cache unmaps page 1:
    reserved 40 MiB, and the snapshot (like torch's) shows two segments, one per mapped range:
    [BASE, +20 MiB) and [BASE + 40 MiB, +20 MiB). The next 20 MiB request maps the lowest hole
    (BASE + 20 MiB) rather than growing the end."""
    a = make(expandable_segments=True)
    x, y, z = (a.malloc(20 * MiB) for _ in range(3))
    assert [b.addr - BASE for b in (x, y, z)] == [0, 20 * MiB, 40 * MiB]
    a.free(y)
    assert a.empty_cache() == 20 * MiB
    ranges = [(s["address"] - BASE, s["total_size"], s["is_expandable"]) for s in a.snapshot()["segments"]]
    assert ranges == [(0, 20 * MiB, True), (40 * MiB, 20 * MiB, True)]
    assert a.malloc(20 * MiB).addr == BASE + 20 * MiB
    assert a.memory_reserved() == 60 * MiB
    a.check_invariants()


def test_expandable_small_pool_uses_2mib_pages():
    """Small requests map 2 MiB pages. 1000 B maps page 0 (reserved 2 MiB); 1 MiB fits the
    2 MiB - 1024 B remainder. A second 1 MiB does not fit the 1 MiB - 1024 B left: that free tail
    grows into a newly mapped page 1, so the block starts at BASE + 1 MiB + 1024 and straddles the
    page boundary. One small segment, 4 MiB mapped."""
    a = make(expandable_segments=True)
    a.malloc(1000)
    assert a.memory_reserved() == 2 * MiB
    assert a.malloc(1 * MiB).addr == BASE + 1024
    third = a.malloc(1 * MiB)
    assert (third.pool, third.addr) == ("small", BASE + 1 * MiB + 1024)
    assert [(s.pool, s.size) for s in a.segments] == [("small", 4 * MiB)]
    assert [e.action for e in a.recorder.events].count("segment_map") == 2
    a.check_invariants()


# ---- stats, snapshot, events ----------------------------------------------------------------


def test_stats_peaks_accumulators_and_reset():
    """a = 12 MiB (own 12 MiB segment), b = 4 MiB (20 MiB segment): allocated 16, reserved 32 MiB.
    free(a): allocated 4 MiB; peaks stay 16 / 32 MiB; allocated_bytes.all.allocated = 16 MiB,
    .freed = 12 MiB. reset_peak_memory_stats sets peaks to current (4 / 32 MiB). A 1000 B small
    request then moves the small-pool stats only: 1024 B allocated, 1000 B requested."""
    a = make()
    x = a.malloc(12 * MiB)
    a.malloc(4 * MiB)
    a.free(x)
    assert (a.memory_allocated(), a.max_memory_allocated()) == (4 * MiB, 16 * MiB)
    assert (a.memory_reserved(), a.max_memory_reserved()) == (32 * MiB, 32 * MiB)
    stats = a.memory_stats()
    assert (stats["allocated_bytes.all.allocated"], stats["allocated_bytes.all.freed"]) == (16 * MiB, 12 * MiB)
    assert stats["allocated_bytes.small_pool.peak"] == 0
    assert stats["segment.all.current"] == 2 and stats["num_device_alloc"] == 2
    a.reset_peak_memory_stats()
    assert (a.max_memory_allocated(), a.max_memory_reserved()) == (4 * MiB, 32 * MiB)
    a.malloc(1000)
    stats = a.memory_stats()
    assert stats["allocated_bytes.small_pool.current"] == 1024
    assert stats["requested_bytes.small_pool.current"] == 1000
    assert stats["allocated_bytes.all.peak"] == 4 * MiB + 1024
    assert stats["active_bytes.all.current"] == stats["allocated_bytes.all.current"]
    assert stats["reserved_bytes.small_pool.current"] == 2 * MiB
    assert list(stats) == sorted(stats)
    a.reset_accumulated_memory_stats()
    assert a.memory_stats()["allocated_bytes.all.allocated"] == 0


def test_inactive_split_stats():
    """Three 5 MiB blocks in a 20 MiB segment: the 5 MiB tail is an inactive split block. Freeing
    the middle one adds a second: inactive_split 2, inactive_split_bytes 10 MiB."""
    a = make()
    _, middle, _ = (a.malloc(5 * MiB) for _ in range(3))
    assert a.memory_stats()["inactive_split.all.current"] == 1
    a.free(middle)
    stats = a.memory_stats()
    assert (stats["inactive_split.all.current"], stats["inactive_split_bytes.all.current"]) == (2, 10 * MiB)
    a.check_invariants()


def test_snapshot_schema():
    """1000 B at BASE (2 MiB small segment) and 5 MiB at BASE + 2 MiB (20 MiB segment): two
    segments sorted by address, each an allocated block followed by an inactive remainder."""
    a = make()
    a.malloc(1000)
    a.malloc(5 * MiB)
    snap = a.snapshot()
    assert set(snap) >= {"segments", "device_traces", "allocator_settings"}
    small, large = snap["segments"]
    assert small == {
        "device": 0,
        "address": BASE,
        "total_size": 2 * MiB,
        "allocated_size": 1024,
        "active_size": 1024,
        "requested_size": 1000,
        "stream": 0,
        "segment_type": "small",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": [
            {"address": BASE, "size": 1024, "requested_size": 1000, "state": "active_allocated", "frames": []},
            {"address": BASE + 1024, "size": 2 * MiB - 1024, "requested_size": 0, "state": "inactive", "frames": []},
        ],
    }
    assert (large["address"], large["total_size"], large["segment_type"]) == (BASE + 2 * MiB, 20 * MiB, "large")
    assert [b["state"] for b in large["blocks"]] == ["active_allocated", "inactive"]
    (trace,) = snap["device_traces"]
    assert [t["action"] for t in trace] == ["segment_alloc", "alloc", "segment_alloc", "alloc"]
    assert set(trace[1]) == {"action", "addr", "size", "stream", "time_us", "frames"}
    assert trace[1]["size"] == 1000  # requested, not rounded
    settings = snap["allocator_settings"]
    assert settings["expandable_segments"] is False and settings["max_split_size"] == -1
    assert make(expandable_segments=True, max_split_size_bytes=128 * MiB).snapshot()["allocator_settings"][
        "PYTORCH_CUDA_ALLOC_CONF"
    ] == "max_split_size_mb:128,expandable_segments:True"


def test_events_carry_actions_sizes_and_totals():
    """malloc(1000) on stream 3 inside phase "load", free, empty_cache. Events (action, size,
    allocated after, reserved after): segment_alloc 2 MiB (0, 2 MiB); alloc 1000 (1024, 2 MiB);
    free_requested 1000 (0, 2 MiB); free_completed 1000 (0, 2 MiB); segment_free 2 MiB (0, 0)."""
    a = make()
    with a.recorder.phase("load"):
        block = a.malloc(1000, stream=3)
    a.free(block)
    a.empty_cache()
    rows = [(e.action, e.addr, e.size, e.allocated_bytes, e.reserved_bytes, e.stream) for e in a.recorder.events]
    assert rows == [
        ("segment_alloc", BASE, 2 * MiB, 0, 2 * MiB, 3),
        ("alloc", BASE, 1000, 1024, 2 * MiB, 3),
        ("free_requested", BASE, 1000, 0, 2 * MiB, 3),
        ("free_completed", BASE, 1000, 0, 2 * MiB, 3),
        ("segment_free", BASE, 2 * MiB, 0, 0, 3),
    ]
    assert [e.phase for e in a.recorder.events[:2]] == ["load", "load"]


# ---- bad input -------------------------------------------------------------------------------------


def test_bad_input_errors():
    a = make(64 * MiB)
    with pytest.raises(ValueError, match="malloc size"):
        a.malloc(-1)
    with pytest.raises(TypeError):
        a.malloc(1.5)
    with pytest.raises(ValueError, match="stream"):
        a.malloc(10, stream=-1)
    block = a.malloc(10)
    a.free(block)
    with pytest.raises(ValueError, match="double free"):
        a.free(block)
    foreign = make(64 * MiB).malloc(10)
    with pytest.raises(ValueError, match="not allocated by this allocator"):
        a.free(foreign)
    with pytest.raises(TypeError):
        a.free("0x7f0000000000")
    with pytest.raises(ValueError, match="non_pytorch_bytes"):
        a.non_pytorch_bytes = 63 * MiB  # 2 MiB are reserved: 63 + 2 > 64
    a.non_pytorch_bytes = 62 * MiB
    assert a.mem_get_info() == (0, 64 * MiB)
    with pytest.raises(ValueError, match="total_bytes"):
        CachingAllocatorModel(0)
    with pytest.raises(ValueError, match="max_split_size"):
        AllocatorConfig(max_split_size_bytes=10 * MiB)
    with pytest.raises(ValueError, match="roundup_power2_divisions"):
        AllocatorConfig(roundup_power2_divisions=3)


def test_a_stale_handle_cannot_free_a_reused_block():
    """free(x), then y reuses x's exact bytes (same address). free(x) again is a double free, and y
    stays allocated."""
    a = make()
    x = a.malloc(12 * MiB)
    a.free(x)
    y = a.malloc(12 * MiB)
    assert y.addr == x.addr and y is not x
    with pytest.raises(ValueError, match="double free"):
        a.free(x)
    assert y.allocated and a.memory_allocated() == 12 * MiB


def test_malloc_zero_rounds_to_512():
    """DeviceCachingAllocator::malloc(0) rounds to 512 B like any request."""
    assert make().malloc(0).size == 512


def test_check_invariants_catches_corruption():
    a = make()
    block = a.malloc(5 * MiB)
    a.check_invariants()
    block.size += 512
    with pytest.raises(AssertionError, match="gap or overlap|allocated_bytes"):
        a.check_invariants()


# ---- config ------------------------------------------------------------------------------------


def test_allocator_config_from_env():
    """"expandable_segments:True,max_split_size_mb:128" -> expandable, 128 MiB; spaces and empty
    items are ignored; options the model cannot honour raise ValueError naming key and value."""
    config = AllocatorConfig.from_env("expandable_segments:True,max_split_size_mb:128")
    assert config == AllocatorConfig(max_split_size_bytes=128 * MiB, expandable_segments=True)
    assert AllocatorConfig.from_env(" roundup_power2_divisions:4 , ,") == AllocatorConfig(roundup_power2_divisions=4)
    assert AllocatorConfig.from_env("") == AllocatorConfig()
    assert AllocatorConfig.from_env("expandable_segments:false,backend:native") == AllocatorConfig()
    assert AllocatorConfig.from_env("max_split_size_mb:20").max_split_size_bytes == 20 * MiB
    assert AllocatorConfig.from_env(config.to_env()) == config
    bad = {
        "max_split_size_mb:abc": "max_split_size_mb:abc",
        "max_split_size_mb:19": "max_split_size_mb:19",
        "expandable_segments:yes": "expandable_segments:yes",
        "roundup_power2_divisions:3": "roundup_power2_divisions:3",
        "roundup_power2_divisions:[256:1,>:4]": "roundup_power2_divisions:[256:1,>:4]",
        "garbage_collection_threshold:0.6": "garbage_collection_threshold:0.6",
        "backend:cudaMallocAsync": "backend:cudaMallocAsync",
        "foo:1": "foo:1",
        "expandable_segments": "expandable_segments",
    }
    for conf, named in bad.items():
        with pytest.raises(ValueError, match=named.replace("[", r"\[").replace("]", r"\]")):
            AllocatorConfig.from_env(conf)


# ---- speed ---------------------------------------------------------------------------------------


def test_100k_malloc_free_is_fast():
    """100,000 random malloc/free calls over both pools on an 80 GiB device: O(log n) best fit
    keeps this to about a second of CPU."""
    rng = random.Random(0)
    a = CachingAllocatorModel(80 * GiB)
    live: list[Block] = []
    start = time.process_time()
    for _ in range(100_000):
        if live and rng.random() < 0.48:
            i = rng.randrange(len(live))
            live[i], live[-1] = live[-1], live[i]
            a.free(live.pop())
        else:
            size = rng.randrange(1, 1 << 20) if rng.random() < 0.6 else rng.randrange(1 << 20, 64 << 20)
            try:
                live.append(a.malloc(size))
            except OutOfMemoryError:
                pass
    elapsed = time.process_time() - start
    a.check_invariants()
    assert elapsed < 10.0, f"100k operations took {elapsed:.1f} s of CPU"
