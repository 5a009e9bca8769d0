"""Allocator tests: SGLang's slot order, padding slot, errors, free groups, paged extend/decode, SWA."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.mem_cache import (
    DoubleFreeError,
    InvariantError,
    PagedTokenToKVPoolAllocator,
    SWATokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)
from kvlab.units import tokens_to_pages


def t(*xs):
    return torch.tensor(xs, dtype=torch.int64)


def test_fresh_pool_reserves_slot_zero_and_reports_its_size():
    a = TokenToKVPoolAllocator(8)
    assert a.available_size() == 8 and a.used_size() == 0
    got = a.alloc(8)
    assert got.tolist() == list(range(1, 9)) and a.alloc(1) is None
    a.check_invariants()


def test_token_free_appends_to_the_tail():
    a = TokenToKVPoolAllocator(6)
    first = a.alloc(3)
    a.free(first[1:2])  # slot 2 goes behind 4, 5, 6
    assert a.alloc(4).tolist() == [4, 5, 6, 2]
    a.check_invariants()


def test_paged_free_prepends_whole_pages():
    a = PagedTokenToKVPoolAllocator(16, 4)
    assert a.available_size() == 16
    x = a.alloc(8)
    assert x.tolist() == list(range(4, 12))  # pages 1 and 2; page 0 is padding
    a.free(t(9))  # any index inside page 2 frees the whole page
    assert a.available_size() == 12
    assert a.alloc(4).tolist() == [8, 9, 10, 11]  # most recently freed page first
    a.check_invariants()


def test_alloc_returns_none_when_short_and_changes_nothing():
    a = PagedTokenToKVPoolAllocator(16, 4)
    a.alloc(12)
    assert a.alloc(8) is None and a.available_size() == 4
    a.check_invariants()


def test_page_size_that_does_not_fit_is_rejected():
    with pytest.raises(ValueError, match="does not fit page_size 4"):
        PagedTokenToKVPoolAllocator(10, 4)
    with pytest.raises(ValueError, match="does not fit"):
        PagedTokenToKVPoolAllocator(2, 4)
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        PagedTokenToKVPoolAllocator(8, 0)
    with pytest.raises(ValueError, match="multiple of page_size 4"):
        PagedTokenToKVPoolAllocator(16, 4).alloc(6)


def test_freeing_twice_is_a_clear_error():
    a = TokenToKVPoolAllocator(8)
    x = a.alloc(3)
    a.free(x)
    with pytest.raises(DoubleFreeError, match="double free of slot 1"):
        a.free(x[:1])
    with pytest.raises(DoubleFreeError, match="padding"):
        a.free(t(0))
    with pytest.raises(DoubleFreeError, match="out of range"):
        a.free(t(9))
    y = a.alloc(2)
    with pytest.raises(DoubleFreeError, match="twice in one free"):
        a.free(torch.cat([y, y]))
    a.check_invariants()  # the failed frees changed nothing

    p = PagedTokenToKVPoolAllocator(16, 4)
    x = p.alloc(8)
    p.free(x[:4])
    with pytest.raises(DoubleFreeError, match="double free of page 1"):
        p.free(x[2:3])
    p.check_invariants()


def test_free_group_defers_and_still_catches_double_frees():
    a = TokenToKVPoolAllocator(8)
    x = a.alloc(4)
    a.free_group_begin()
    with pytest.raises(RuntimeError, match="nested"):
        a.free_group_begin()
    a.free(x[:2])
    assert a.available_size() == 4  # deferred frees do not show yet
    with pytest.raises(DoubleFreeError, match="queued in the open free group"):
        a.free(x[1:3])
    a.free(x[2:])
    a.check_invariants()
    a.free_group_end()
    assert a.available_size() == 8
    with pytest.raises(RuntimeError, match="without free_group_begin"):
        a.free_group_end()
    a.check_invariants()


def test_paged_free_group_order_matches_sglang():
    """free() piles re-free through unique (sorted) pages; free_segment() piles go in row order,
    prepended last."""
    a = PagedTokenToKVPoolAllocator(32, 4)
    x = a.alloc(24)  # pages 1..6
    a.free_group_begin()
    a.free(x[16:24])  # pages 5, 6 via free()
    a.free_segment(torch.cat([x[8:12], x[0:4]]), start_pos=0)  # pages 3, 1 via free_segment
    a.free_group_end()
    assert a.free_pages.tolist() == [3, 1, 5, 6, 7, 8]
    a.check_invariants()


def test_free_segment_needs_a_page_aligned_start():
    a = PagedTokenToKVPoolAllocator(16, 4)
    x = a.alloc(8)
    with pytest.raises(ValueError, match="not page-aligned"):
        a.free_segment(x[2:], start_pos=2)
    a.free_segment(x[4:], start_pos=4)
    assert a.free_pages.tolist()[0] == 2


def test_need_sort_stages_frees_and_sorts_when_short():
    a = TokenToKVPoolAllocator(6, need_sort=True)
    x = a.alloc(6)
    a.free(x[[4, 0, 2]])
    assert a.available_size() == 3 and len(a.free_pages) == 0
    assert a.alloc(3).tolist() == [1, 3, 5]
    a.check_invariants()


def test_check_invariants_catches_a_corrupted_free_list():
    a = TokenToKVPoolAllocator(8)
    a.alloc(2)
    a.free_pages = torch.cat([a.free_pages, t(3)])
    with pytest.raises(InvariantError, match="twice"):
        a.check_invariants()


def test_is_allocated():
    a = PagedTokenToKVPoolAllocator(16, 4)
    x = a.alloc(4)
    assert a.is_allocated(torch.cat([x, t(0, 8, 99)])).tolist() == [True] * 4 + [False] * 3


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 8), st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=5))
def test_alloc_extend_places_each_token_at_its_page_offset(ps, reqs):
    """Each request first holds ``prefix`` tokens (allocated by alloc_extend from nothing), then
    extends by ``extra``. Every token at position p must sit at page offset p % ps, on a page the
    request owns, consecutive positions of a page on one page; new pages come off the free list in
    order; nothing is handed out twice."""
    a = PagedTokenToKVPoolAllocator(ps * 128, ps)  # roomy: <= 5 requests of <= 40 tokens
    rows = []
    for prefix, _ in reqs:
        got = a.alloc_extend(t(0), t(0), t(prefix), t(prefix), t(-1), prefix) if prefix else t()
        rows.append(got)
    pre = [p for p, _ in reqs]
    seq = [p + e for p, e in reqs]
    last = [int(r[-1]) if len(r) else -1 for r in rows]
    expected_pages = a.free_pages[: a.num_new_pages(pre, seq)].tolist()
    out = a.alloc_extend(t(*pre), t(*pre), t(*seq), t(*seq), t(*last), sum(seq) - sum(pre))
    assert out is not None and len(out) == sum(seq) - sum(pre)
    new_pages, off = [], 0
    for i, (p, s) in enumerate(zip(pre, seq)):
        row = torch.cat([rows[i], out[off : off + s - p]])
        off += s - p
        assert (row % ps).tolist() == [pos % ps for pos in range(s)]
        for pos in range(1, s):
            if pos % ps:
                assert int(row[pos]) == int(row[pos - 1]) + 1
        pages = []
        for x in (row[p:] // ps).tolist():
            if x not in pages and x != (last[i] // ps if last[i] >= 0 else None):
                pages.append(x)
        new_pages += pages
        assert len(pages) == tokens_to_pages(s, ps) - tokens_to_pages(p, ps)
    assert new_pages == expected_pages
    everything = torch.cat(rows + [out])
    assert len(torch.unique(everything)) == len(everything)
    assert bool(a.is_allocated(everything).all())
    a.check_invariants()


def test_a_pool_too_large_for_the_slot_table_hands_out_the_same_slots(monkeypatch):
    """Pools up to _SLOT_TABLE_MAX slots gather page slots from a table, larger ones compute them: same slots."""
    import kvlab.mem_cache.allocator as allocator_module

    a = PagedTokenToKVPoolAllocator(64, 4)
    first = a.alloc(12)
    assert a._slot_table is not None
    monkeypatch.setattr(allocator_module, "_SLOT_TABLE_MAX", 0)
    b = PagedTokenToKVPoolAllocator(64, 4)
    assert b.alloc(12).tolist() == first.tolist() == list(range(4, 16))
    for x in (a, b):
        x.free_segment(torch.tensor([8, 9, 10, 11, 4, 5, 6, 7]), start_pos=0)  # pages 2, 1 back to the head
    got = [x.alloc_extend([2], [2], [12], [12], [13], 10) for x in (a, b)]  # page 3 continues, then pages 2, 1
    assert got[0].tolist() == got[1].tolist() == [14, 15, 8, 9, 10, 11, 4, 5, 6, 7]
    assert b._slot_table is None
    for x in (a, b):
        x.check_invariants()


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_a_copied_allocator_keeps_its_masks_and_their_views_together(how):
    """The free path reads bytearray masks, the invariant checks tensor views of them: a copy shares neither with
    the original and keeps the two in step."""
    import copy
    import pickle

    a = PagedTokenToKVPoolAllocator(32, 4)
    x = a.alloc(8)
    b = pickle.loads(pickle.dumps(a)) if how == "pickle" else copy.deepcopy(a)
    b.free(x[:4])
    assert b.available_size() == 28 and a.available_size() == 24
    assert bool(b._page_free[1]) and not bool(a._page_free[1])
    b.check_invariants()
    a.check_invariants()
    with pytest.raises(DoubleFreeError, match="double free of page 1"):
        b.free(x[:4])


def test_alloc_extend_returns_none_when_pages_run_short():
    a = PagedTokenToKVPoolAllocator(8, 4)
    assert a.alloc_extend(t(0), t(0), t(9), t(9), t(-1), 9) is None
    assert a.available_size() == 8
    with pytest.raises(ValueError, match="last_loc"):
        a.alloc_extend(t(3), t(3), t(5), t(5), t(-1), 2)
    with pytest.raises(NotImplementedError):
        TokenToKVPoolAllocator(8).alloc_extend()


def test_alloc_decode_opens_a_page_only_on_a_page_boundary():
    a = PagedTokenToKVPoolAllocator(32, 4)
    r0 = a.alloc_extend(t(0), t(0), t(4), t(4), t(-1), 4)  # full page: next token opens a page
    r1 = a.alloc_extend(t(0), t(0), t(2), t(2), t(-1), 2)  # room left on its page
    out = a.alloc_decode(t(5, 3), t(5, 3), t(int(r0[-1]), int(r1[-1])))
    assert out.tolist() == [3 * 4, int(r1[-1]) + 1]  # r0 on page 1, r1 on page 2, new page 3
    assert a.available_size() == 32 - 12
    a.alloc(20)
    assert a.alloc_decode(t(9), t(9), t(int(out[0]) + 3)) is None
    a.check_invariants()


@given(st.lists(st.integers(1, 12), min_size=1, max_size=6), st.integers(0, 6), st.booleans())
@settings(max_examples=60, deadline=None)
def test_alloc_decode_pages_is_alloc_decodes_page_take(seq_lens, n_freed, need_sort):
    """Two allocators in the same state (staged frees included, with need_sort): alloc_decode and the page
    take by count hand out the same pages and leave the same free list."""
    ps = 4
    pair = [PagedTokenToKVPoolAllocator(64, ps, need_sort=need_sort) for _ in range(2)]
    for a in pair:
        held = a.alloc(40)
        a.free(held[: ps * n_freed])  # staged in release_pages when need_sort
    a, b = pair
    last = [s - 2 if s % ps != 1 else 0 for s in seq_lens]  # only the non-openers' last_loc is read
    slots = a.alloc_decode(t(*seq_lens), t(*seq_lens), t(*last))
    pages = b.alloc_decode_pages(len(seq_lens), a.num_decode_pages(seq_lens))
    assert (slots is None) == (pages is None)
    if pages is not None:
        opened = [int(x) // ps for x, s in zip(slots, seq_lens) if s % ps == 1]
        assert pages.tolist() == opened
    assert a.free_pages.tolist() == b.free_pages.tolist()
    assert a.release_pages.tolist() == b.release_pages.tolist()
    a.check_invariants()
    b.check_invariants()
    with pytest.raises(ValueError, match="num_pages"):
        b.alloc_decode_pages(1, 2)


def test_swa_allocator_pairs_full_and_swa_slots():
    a = SWATokenToKVPoolAllocator(size=16, size_swa=8, page_size=1)
    assert (a.size, a.size_full, a.size_swa, a.available_size()) == (8, 16, 8, 8)
    x = a.alloc(6)
    assert a.translate_loc_from_full_to_swa(x).tolist() == list(range(1, 7))
    assert (a.full_available_size(), a.swa_available_size()) == (10, 2)
    assert a.alloc(3) is None  # the SWA side is short
    a.free_swa(x[:2])  # sliding window moved on: SWA KV gone, full KV kept
    assert (a.full_available_size(), a.swa_available_size()) == (10, 4)
    a.check_invariants()
    with pytest.raises(ValueError, match="still has an SWA peer"):
        a.free_full(x[2:3])
    a.free_full(x[:2])
    a.free(x[2:])
    assert (a.full_available_size(), a.swa_available_size()) == (16, 8)
    with pytest.raises(DoubleFreeError, match="no SWA peer"):
        a.free(x[2:3])
    with pytest.raises(NotImplementedError, match="page_size > 1"):
        a.alloc_decode(t(2), t(2), t(1))
    a.check_invariants()


def test_swa_allocator_paged_extend_and_groups():
    a = SWATokenToKVPoolAllocator(size=32, size_swa=16, page_size=4)
    full = a.alloc_extend(t(0), t(0), t(6), t(6), t(-1), 6)
    swa = a.translate_loc_from_full_to_swa(full)
    assert (full % 4).tolist() == (swa % 4).tolist() == [0, 1, 2, 3, 0, 1]
    more = a.alloc_decode(t(7), t(7), t(int(full[-1])))
    assert int(a.translate_loc_from_full_to_swa(more)) == int(swa[-1]) + 1
    assert translate_last(a) == -1
    a.free_group_begin()
    a.free(torch.cat([full, more]))
    assert a.available_size() == 8
    a.free_group_end()
    assert (a.full_available_size(), a.swa_available_size()) == (32, 16)
    a.check_invariants()


def translate_last(a):
    return int(a.translate_loc_from_full_to_swa(t(-1)))
