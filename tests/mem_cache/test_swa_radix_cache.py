"""SWARadixCache: worked cases (tombstones, window-limited matches, SWA locks, per-pool eviction)."""

import pytest

from kvlab.mem_cache import (
    SWARadixCache,
    SWATokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
    evict_from_tree_cache,
    match_alloc_insert,
)
from kvlab.mem_cache.evict_policy import EvictParams
from kvlab.mem_cache.radix_cache import LockRefError


def make(full=64, swa=32, window=4):
    alloc = SWATokenToKVPoolAllocator(full, swa, page_size=1)
    return alloc, SWARadixCache(alloc, sliding_window_size=window)


def serve(cache, alloc, seq):
    return match_alloc_insert(cache, seq).cached_len


def test_insert_frees_duplicates_itself_and_counts_both_pools():
    alloc, cache = make()
    serve(cache, alloc, [1, 2, 3, 4, 5, 6])
    dup = alloc.alloc(6)
    assert cache.insert([1, 2, 3, 4, 5, 6], dup) == 6  # all six were cached: the tree frees ours
    assert alloc.full_available_size() == 64 - 6 and alloc.swa_available_size() == 32 - 6
    assert cache.full_evictable_size() == cache.swa_evictable_size() == 6
    cache.check_invariants()


def test_swa_eviction_tombstones_internal_node_and_match_needs_a_window():
    alloc, cache = make(window=4)
    serve(cache, alloc, [1, 2, 3, 4, 5, 6, 7, 8, 10, 11])
    serve(cache, alloc, [1, 2, 3, 4, 5, 6, 7, 8, 20, 21])
    # make the shared node the SWA LRU: touch both leaves' paths after it
    cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 10, 11])
    cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 20, 21])
    cache.evict(EvictParams(num_tokens=0, swa_num_tokens=8))
    inner = cache.root_node.children[1]
    assert inner.swa_tombstone and len(inner.key) == 8
    # SWA LRU order: leaf [10, 11] (older), then the inner node: the leaf is deleted (2 + 2), the
    # inner node tombstoned (8 SWA); leaf [20, 21] keeps both sides
    assert alloc.full_available_size() == 64 - 10 and alloc.swa_available_size() == 32 - 2
    cache.check_invariants()
    # 2 tokens after the tombstone < window 4: the match falls back to the root
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 10, 11]).device_prefix_len == 0


def test_tombstone_recovered_by_insert():
    alloc, cache = make(window=4)
    serve(cache, alloc, [1, 2, 3, 4, 5, 6, 7, 8, 10, 11])
    serve(cache, alloc, [1, 2, 3, 4, 5, 6, 7, 8, 20, 21])
    cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 10, 11])
    cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 20, 21])
    cache.evict(EvictParams(num_tokens=0, swa_num_tokens=8))
    serve(cache, alloc, [1, 2, 3, 4, 5, 6, 7, 8, 10, 11])  # re-prefilled: the node adopts the new SWA KV
    assert not cache.root_node.children[1].swa_tombstone
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 10, 11]).device_prefix_len == 10
    cache.check_invariants()
    alloc.check_invariants()


def test_swa_lock_covers_only_the_window():
    alloc, cache = make(window=4)
    serve(cache, alloc, list(range(1, 9)))
    serve(cache, alloc, list(range(1, 9)) + [30, 31, 32, 33, 34])
    m = cache.match_prefix(list(range(1, 9)) + [30, 31, 32, 33, 34])
    lock = cache.lock(m.last_device_node)
    assert cache.full_protected_size() == 13 and cache.swa_protected_size() == 5
    cache.unlock(lock)
    assert cache.full_protected_size() == cache.swa_protected_size() == 0
    with pytest.raises(LockRefError):
        cache.dec_lock_ref(m.last_device_node)


def test_evict_from_tree_cache_asks_each_pool_for_its_shortfall():
    alloc, cache = make(full=64, swa=16)
    serve(cache, alloc, list(range(1, 13)))
    held = alloc.alloc(alloc.swa_available_size())
    ev = evict_from_tree_cache(cache, 3, mode="full")  # the SWA arm: shortfall in both modes
    assert (ev.shortfall_tokens, ev.swa_shortfall_tokens) == (0, 3)
    assert ev.swa_evicted_tokens >= 3
    alloc.free(held)
    cache.check_invariants()


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="SWATokenToKVPoolAllocator"):
        SWARadixCache(TokenToKVPoolAllocator(8), sliding_window_size=4)
    with pytest.raises(ValueError, match="sliding_window_size"):
        SWARadixCache(SWATokenToKVPoolAllocator(8, 8, 1), sliding_window_size=0)
