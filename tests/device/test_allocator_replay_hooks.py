"""The allocator model's hooks for replaying a recording: segment addresses chosen from outside, a segment
that predates the model adopted as it was, an expandable segment's address space fenced."""

from __future__ import annotations

import pytest

from kvlab.device.caching_allocator import AllocatorConfig, CachingAllocatorModel
from kvlab.units import GiB, MiB

BASE = 0x7A00_0000_0000


def test_segment_address_source_chooses_each_new_segment_address():
    model = CachingAllocatorModel(80 * GiB)
    wanted = [BASE + 0x4000_0000, BASE]
    model.segment_address_source = lambda space: wanted.pop(0)
    a, b = model.malloc(12 * MiB), model.malloc(30 * MiB)
    assert (a.addr, b.addr) == (BASE + 0x4000_0000, BASE)
    assert [s.addr for s in model.segments] == [BASE, BASE + 0x4000_0000]
    model.check_invariants()


def test_adopted_segment_behaves_as_if_the_model_had_built_it():
    model = CachingAllocatorModel(80 * GiB)
    layout = [(5 * MiB, 5 * MiB - 100, "allocated"), (3 * MiB, 0, "free"), (4 * MiB, 4 * MiB, "allocated"),
              (8 * MiB, 0, "free")]
    live = model.adopt_segment(BASE, "large", 0, layout)
    model.check_invariants()
    assert [(b.addr - BASE, b.size, b.requested_size) for b in live] == [(0, 5 * MiB, 5 * MiB - 100),
                                                                       (8 * MiB, 4 * MiB, 4 * MiB)]
    assert (model.memory_allocated(), model.memory_reserved()) == (9 * MiB, 20 * MiB)
    stats = model.memory_stats()
    assert stats["segment.all.current"] == 1 and stats["num_device_alloc"] == 0
    assert (stats["inactive_split.large_pool.current"], stats["inactive_split_bytes.large_pool.current"]) == (
        2, 11 * MiB)
    fit = model.malloc(3 * MiB - 512)  # best fit: the 3 MiB hole, not the 8 MiB tail; 512 B left is kept
    assert fit.addr == BASE + 5 * MiB and fit.size == 3 * MiB
    model.free(live[1])  # merges with the free tail
    model.check_invariants()
    assert [b.size for b in model.segments[0].blocks] == [5 * MiB, 3 * MiB, 12 * MiB]
    with pytest.raises(ValueError, match="overlaps"):
        model.adopt_segment(BASE + 10 * MiB, "large", 0, [(20 * MiB, 0, "free")])
    with pytest.raises(ValueError, match="block state 'unmapped'"):
        model.adopt_segment(BASE + GiB, "large", 0, [(20 * MiB, 0, "unmapped")])


def test_limit_address_space_fences_an_expandable_segment():
    model = CachingAllocatorModel(80 * GiB, config=AllocatorConfig(expandable_segments=True))
    model.adopt_segment(BASE, "large", 0, [(40 * MiB, 40 * MiB, "allocated"), (20 * MiB, 0, "free"),
                                           (90 * GiB, 0, "unmapped")], is_expandable=True)
    model.check_invariants()
    segment = model.segments[0]
    model.limit_address_space(segment, BASE + 100 * MiB + 5)  # rounded down to a 20 MiB page
    model.check_invariants()
    assert segment.address_space_bytes == 100 * MiB
    assert model.malloc(35 * MiB).addr == BASE + 40 * MiB  # 20 MiB free + one more page fits below the fence
    far = model.malloc(60 * MiB)  # no room left below the fence: a new segment
    assert far.segment is not segment and far.addr >= BASE + 100 * MiB
    model.check_invariants()
    with pytest.raises(Exception, match="only unmapped space"):
        model.limit_address_space(segment, BASE + 20 * MiB)
