"""MambaRadixCache: worked cases (resume only where a state exists, tombstones, eviction passes)."""

import pytest

from kvlab.mem_cache import (
    MambaPool,
    MambaRadixCache,
    TokenToKVPoolAllocator,
    ensure_mamba_capacity,
    evict_from_tree_cache,
    match_alloc_insert,
)
from kvlab.mem_cache.memory_pool import DoubleFreeError


def make(size=64, states=8):
    alloc = TokenToKVPoolAllocator(size)
    return alloc, MambaRadixCache(alloc, MambaPool(states))


def serve(cache, alloc, seq):
    return match_alloc_insert(cache, seq)


def test_split_point_has_no_state_so_a_branch_cannot_resume_there():
    alloc, cache = make()
    serve(cache, alloc, [1, 2, 3, 4, 5, 6])
    m = cache.match_prefix([1, 2, 3, 9])  # KV matches 3 tokens, but no snapshot exists after token 3
    assert m.device_prefix_len == 0 and m.last_device_node is cache.root_node
    assert cache.root_node.children[1].mamba_value is None  # the split made a mamba tombstone
    cache.check_invariants()


def test_hit_resumes_from_deepest_state_and_insert_fills_tombstone():
    alloc, cache = make()
    serve(cache, alloc, [1, 2, 3, 4, 5, 6])
    serve(cache, alloc, [1, 2, 3, 7, 8])
    r = serve(cache, alloc, [1, 2, 3])  # the state after token 3 is computed: the tombstone gets it
    assert r.prefix_len == 0 and r.cached_len == 3 and not r.mamba_exist  # no state to resume: all recomputed
    assert cache.match_prefix([1, 2, 3, 9]).device_prefix_len == 3
    assert cache.mamba_evictable_size() == 3
    cache.check_invariants()


def test_full_eviction_frees_states_and_tombstone_ancestors():
    alloc, cache = make(states=8)
    serve(cache, alloc, [1, 2, 3, 4, 5, 6])
    serve(cache, alloc, [1, 2, 3, 7, 8])
    res = cache.evict(100)
    assert res.evicted_tokens == 8 and res.mamba_num_evicted == 2
    assert alloc.available_size() == 64 and cache.mamba_pool.available_size() == 8
    cache.check_invariants()


def test_mamba_pass_tombstones_internal_nodes_and_counts_only_its_own_frees():
    alloc, cache = make(states=3)
    serve(cache, alloc, [1, 2, 3])
    serve(cache, alloc, [1, 2, 3, 4, 5])
    serve(cache, alloc, [1, 2, 3, 4, 5, 6])
    ev = ensure_mamba_capacity(cache, 1)  # the oldest state, the inner node's, goes
    assert ev.mamba_num_evicted == 1 and cache.root_node.children[1].mamba_value is None
    assert cache.full_evictable_size() == 6  # its KV stays
    cache.check_invariants()


def test_over_eviction_on_a_mamba_tree():
    alloc, cache = make(size=20, states=8)
    serve(cache, alloc, list(range(1, 9)))
    serve(cache, alloc, list(range(11, 19)))
    short = evict_from_tree_cache(cache, 6, mode="shortfall")
    assert short.shortfall_tokens == 2 and short.evicted_tokens == 8 and short.mamba_num_evicted == 1
    cache.check_invariants()


def test_pool_misuse_is_reported():
    pool = MambaPool(2)
    s = pool.alloc(1)
    pool.free(s)
    with pytest.raises(DoubleFreeError):
        pool.free(s)
    alloc, cache = make()
    with pytest.raises(ValueError, match="not allocated"):
        cache.insert([1, 2], alloc.alloc(2), 5)
