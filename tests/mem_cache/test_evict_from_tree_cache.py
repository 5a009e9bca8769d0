"""Regression tests for SGLang's eviction-amount bug (PR #32016) and the EvictResult accounting."""

from __future__ import annotations

import pytest

from kvlab.mem_cache import (
    EvictResult,
    PagedTokenToKVPoolAllocator,
    RadixCache,
    SWATokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
    evict_from_tree_cache,
)


def _cached_leaves(pool_tokens: int, leaves: int, leaf_tokens: int, page_size: int = 1):
    """A pool holding ``leaves`` disjoint cached sequences of ``leaf_tokens`` each (LRU order =
    insertion order); everything else free."""
    if page_size == 1:
        alloc = TokenToKVPoolAllocator(pool_tokens)
    else:
        alloc = PagedTokenToKVPoolAllocator(pool_tokens, page_size)
    cache = RadixCache(token_to_kv_pool_allocator=alloc, page_size=page_size)
    for i in range(leaves):
        tokens = [1000 * (i + 1) + j for j in range(leaf_tokens)]
        assert cache.insert(tokens, alloc.alloc(leaf_tokens)) == 0
    return alloc, cache


def test_standard_arm_evicts_the_shortfall_and_full_mode_over_evicts_by_available():
    """The worked example (SGLang's own numbers: docs/semantics.md#worked-example-one-pressure-event).

    Pool of 40 slots; four finished requests cached 8 tokens each, so the tree holds 32 evictable
    tokens in four 8-token leaves and 8 slots are free. A new request needs 12 slots:

    ===========================  ==========================  ==================================
    quantity                     mode="shortfall" (>=0.5.17)  mode="full" (<=0.5.16, the bug)
    ===========================  ==========================  ==================================
    shortfall = 12 - 8           4                           4
    asked of the tree            4                           12
    evicted (whole 8-tok leaves) 8  (1 leaf)                 16 (2 leaves)
    over_evicted = min(ev, ask)  0                           min(16, 12) - 4 = 8 = available
      - shortfall
    overshoot = ev - ask         4  (leaf granularity)       4
    available afterwards         16                          24
    ===========================  ==========================  ==================================

    Both modes make the 12-slot allocation fit; the bug destroys one extra cached leaf.
    """
    alloc, cache = _cached_leaves(40, leaves=4, leaf_tokens=8)
    assert (alloc.available_size(), cache.evictable_size()) == (8, 32)
    fixed = evict_from_tree_cache(cache, 12, mode="shortfall")
    assert fixed == EvictResult(shortfall_tokens=4, requested_tokens=4, evicted_tokens=8,
                                over_evicted_tokens=0, overshoot_tokens=4)
    assert (alloc.available_size(), cache.evictable_size()) == (16, 24)

    alloc, cache = _cached_leaves(40, leaves=4, leaf_tokens=8)
    buggy = evict_from_tree_cache(cache, 12, mode="full")
    assert buggy == EvictResult(shortfall_tokens=4, requested_tokens=12, evicted_tokens=16,
                                over_evicted_tokens=8, overshoot_tokens=4)
    assert buggy.over_evicted_tokens == 8 == 40 - 32  # exactly what was available
    assert (alloc.available_size(), cache.evictable_size()) == (24, 16)
    assert alloc.alloc(12) is not None  # the predicate outcome is the same in both modes


@pytest.mark.parametrize("available", [0, 1, 5, 17, 29])
def test_at_token_granularity_shortfall_is_exact_and_full_over_evicts_available(available):
    """With 1-token leaves there is no leaf overshoot: shortfall mode evicts exactly the
    shortfall; full mode evicts exactly ``available`` more."""
    need = 30
    cached = 64 - available
    alloc, cache = _cached_leaves(64, leaves=cached, leaf_tokens=1)
    r = evict_from_tree_cache(cache, need, mode="shortfall")
    shortfall = max(0, need - available)
    assert (r.evicted_tokens, r.over_evicted_tokens, r.overshoot_tokens) == (shortfall, 0, 0)

    alloc, cache = _cached_leaves(64, leaves=cached, leaf_tokens=1)
    r = evict_from_tree_cache(cache, need, mode="full")
    assert r.evicted_tokens == need == r.shortfall_tokens + available
    assert (r.over_evicted_tokens, r.overshoot_tokens) == (available, 0)


def test_nothing_is_evicted_when_the_pool_already_fits():
    alloc, cache = _cached_leaves(40, leaves=2, leaf_tokens=8)
    for mode in ("shortfall", "full"):
        assert evict_from_tree_cache(cache, alloc.available_size(), mode=mode) == EvictResult()
    assert cache.evictable_size() == 16


def test_over_eviction_is_capped_by_what_the_tree_could_evict():
    """Only 6 evictable tokens: the bug cannot destroy more than exist."""
    alloc, cache = _cached_leaves(16, leaves=1, leaf_tokens=6)  # 10 free
    r = evict_from_tree_cache(cache, 14, mode="full")  # shortfall 4, asks 14, tree has 6
    assert (r.shortfall_tokens, r.requested_tokens, r.evicted_tokens) == (4, 14, 6)
    assert (r.over_evicted_tokens, r.overshoot_tokens) == (2, 0)
    r = evict_from_tree_cache(cache, 20, mode="shortfall")  # tree is empty now
    assert (r.shortfall_tokens, r.evicted_tokens, r.over_evicted_tokens) == (4, 0, 0)


def test_locked_prefixes_are_never_evicted():
    alloc, cache = _cached_leaves(40, leaves=4, leaf_tokens=8)
    locked = cache.match_prefix([1000 + j for j in range(8)]).last_device_node  # the LRU leaf
    cache.inc_lock_ref(locked)
    r = evict_from_tree_cache(cache, 40, mode="full")
    assert r.evicted_tokens == 24 and cache.protected_size() == 8
    cache.check_invariants()


def test_paged_pool_evicts_whole_pages():
    alloc, cache = _cached_leaves(64, leaves=3, leaf_tokens=12, page_size=4)  # 28 free
    r = evict_from_tree_cache(cache, 30, mode="shortfall")
    assert (r.shortfall_tokens, r.evicted_tokens, r.overshoot_tokens) == (2, 12, 10)
    assert alloc.available_size() == 40
    alloc.check_invariants()
    cache.check_invariants()


def test_swa_arm_uses_per_pool_shortfalls_in_both_modes():
    """SWA pool smaller than the full pool: the SWA side is the one short."""
    for mode in ("shortfall", "full"):
        alloc = SWATokenToKVPoolAllocator(size=40, size_swa=24, page_size=1)
        cache = RadixCache(token_to_kv_pool_allocator=alloc)
        for i in range(2):
            cache.insert([100 * (i + 1) + j for j in range(8)], alloc.alloc(8))
        assert (alloc.full_available_size(), alloc.swa_available_size()) == (24, 8)
        r = evict_from_tree_cache(cache, 12, mode=mode)
        assert (r.shortfall_tokens, r.requested_tokens) == (0, 0)
        assert (r.swa_shortfall_tokens, r.swa_requested_tokens) == (4, 4)
        assert (r.evicted_tokens, r.over_evicted_tokens, r.overshoot_tokens) == (8, 0, 4)
        assert alloc.swa_available_size() == 16
        alloc.check_invariants()
        cache.check_invariants()


def test_bad_mode_is_a_value_error_naming_it():
    alloc, cache = _cached_leaves(16, leaves=1, leaf_tokens=4)
    with pytest.raises(ValueError, match="'shortfal'"):
        evict_from_tree_cache(cache, 1, mode="shortfal")
    with pytest.raises(ValueError, match="'FULL'"):
        evict_from_tree_cache(None, 1, mode="FULL")


def test_no_tree_or_a_disabled_tree_evicts_nothing():
    assert evict_from_tree_cache(None, 5) == EvictResult()
    alloc = TokenToKVPoolAllocator(8)
    cache = RadixCache(token_to_kv_pool_allocator=alloc, disable=True)
    alloc.alloc(8)
    assert evict_from_tree_cache(cache, 4, mode="full") == EvictResult()


def test_evict_result_decomposes_the_evicted_tokens():
    for shortfall, requested, evicted in [(4, 4, 8), (4, 12, 16), (4, 12, 6), (4, 12, 2), (0, 0, 0)]:
        r = EvictResult.of(shortfall, requested, evicted)
        needed = min(evicted, shortfall)
        assert needed + r.over_evicted_tokens + r.overshoot_tokens == evicted
        assert r.num_tokens_evicted == evicted
