"""RadixCache unit tests: match/insert/split, pages, locks, victim order per policy, request flows."""

from __future__ import annotations

import pytest
import torch

from kvlab.mem_cache import (
    EvictParams,
    InvariantError,
    LockRefError,
    PagedTokenToKVPoolAllocator,
    RadixCache,
    ReqToTokenPool,
    SimpleReq,
    TokenToKVPoolAllocator,
    release_kv_cache,
)
from kvlab.mem_cache.evict_policy import EVICTION_POLICIES, get_eviction_strategy


def make(size=64, page_size=1, policy="lru"):
    alloc = TokenToKVPoolAllocator(size) if page_size == 1 else PagedTokenToKVPoolAllocator(size, page_size)
    return alloc, RadixCache(token_to_kv_pool_allocator=alloc, page_size=page_size, eviction_policy=policy)


def put(cache, alloc, tokens, priority=0):
    """Cache ``tokens`` the way a finished request does; returns the already-cached length."""
    m = cache.match_prefix(tokens)
    kv = torch.cat([m.device_indices, alloc.alloc(len(tokens) - m.device_prefix_len)])
    done = cache.insert(tokens, kv, priority=priority)
    alloc.free(kv[m.device_prefix_len : done])
    cache.check_invariants()
    alloc.check_invariants()
    return done


def test_insert_then_match_returns_the_stored_slots():
    alloc, cache = make()
    kv = alloc.alloc(5)
    assert cache.insert([1, 2, 3, 4, 5], kv) == 0
    m = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert m.device_prefix_len == m.prefix_len == 5
    assert m.device_indices.tolist() == kv.tolist()
    assert cache.match_prefix([9]).device_prefix_len == 0
    assert cache.match_prefix([]).last_device_node is cache.root_node
    assert (cache.evictable_size(), cache.protected_size(), cache.total_size()) == (5, 0, 5)


def test_insert_reports_the_already_cached_prefix():
    cache = RadixCache()
    cache.insert([1, 2, 3], torch.tensor([10, 11, 12]))
    assert cache.insert([1, 2, 3, 4], torch.tensor([20, 21, 22, 23])) == 3
    # the tree kept its own slots for the shared part; only the new token's slot was stored
    assert cache.match_prefix([1, 2, 3, 4]).device_indices.tolist() == [10, 11, 12, 23]
    assert cache.insert([1, 2, 3], torch.tensor([30, 31, 32])) == 3
    assert cache.total_size() == 4


def test_match_splits_the_node_it_ends_inside():
    cache = RadixCache()  # tree only: values are just numbers
    cache.insert([1, 2, 3, 4, 5], torch.tensor([11, 12, 13, 14, 15]))
    m = cache.match_prefix([1, 2, 3, 9])
    assert m.device_prefix_len == 3 and m.device_indices.tolist() == [11, 12, 13]
    upper = m.last_device_node
    assert list(upper.key) == [1, 2, 3] and len(upper.children) == 1
    (lower,) = upper.children.values()
    assert list(lower.key) == [4, 5] and lower.value.tolist() == [14, 15]
    assert cache.evictable_leaves == {lower}
    cache.check_invariants()


def test_insert_splits_on_divergence_and_adds_a_sibling():
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], torch.tensor([1, 2, 3, 4]))
    assert cache.insert([1, 2, 7, 8], torch.tensor([5, 6, 7, 8])) == 2
    text = cache.pretty_print()
    assert text.splitlines() == [
        "0 [] r=1",
        "  2 [1, 2] r=0",
        "    2 [3, 4] r=0",
        "    2 [7, 8] r=0",
        "#tokens: 6",
    ]
    assert len(cache.evictable_leaves) == 2
    cache.check_invariants()


def test_page_size_aligns_keys_and_splits_on_page_boundaries():
    alloc, cache = make(size=64, page_size=4)
    kv = alloc.alloc(12)
    assert cache.insert(list(range(1, 11)), kv[:10]) == 0  # 10 tokens -> 8 cached (2 pages)
    assert cache.total_size() == 8
    assert cache.match_prefix(list(range(1, 12))).device_prefix_len == 8
    # diverging inside the second page: the match (and the split) stops at the page boundary
    m = cache.match_prefix([1, 2, 3, 4, 5, 6, 99, 100])
    assert m.device_prefix_len == 4 and len(m.last_device_node.key) == 4
    # a first page that differs in any token is a different child of the root
    assert cache.match_prefix([1, 2, 3, 99, 5, 6, 7, 8]).device_prefix_len == 0
    assert cache.insert([1, 2, 3], kv[:3]) == 0 and cache.total_size() == 8  # shorter than a page
    alloc.free(kv[8:])
    cache.check_invariants()
    alloc.check_invariants()


def test_children_are_keyed_by_first_page():
    alloc, cache = make(size=64, page_size=2)
    cache.insert([5, 6, 7, 8], alloc.alloc(4))
    cache.insert([5, 9, 7, 8], alloc.alloc(4))  # same first token, another first page: a sibling
    assert len(cache.root_node.children) == 2
    assert sorted(list(c.key[:2]) for c in cache.root_node.children.values()) == [[5, 6], [5, 9]]
    assert cache.match_prefix([5, 9, 7, 8, 1]).device_prefix_len == 4
    cache.check_invariants()


def test_lock_moves_tokens_between_evictable_and_protected():
    alloc, cache = make()
    put(cache, alloc, [1, 2, 3, 4, 5, 6, 7, 8])
    put(cache, alloc, [1, 2, 3, 4, 9, 10, 11])
    m = cache.match_prefix([1, 2, 3, 4, 9, 99])  # splits [9,10,11] -> [9] + [10,11]
    assert cache.inc_lock_ref(m.last_device_node) == -5
    assert (cache.evictable_size(), cache.protected_size()) == (6, 5)
    r = cache.evict(EvictParams(num_tokens=100))
    assert r.evicted_tokens == 6 and cache.total_size() == 5  # the locked path survives
    assert cache.dec_lock_ref(m.last_device_node) == 5
    assert (cache.evictable_size(), cache.protected_size()) == (5, 0)
    cache.check_invariants()


def test_nested_locks_count_per_node():
    alloc, cache = make()
    put(cache, alloc, [1, 2, 3, 4])
    put(cache, alloc, [1, 2, 5, 6])
    shared = cache.match_prefix([1, 2]).last_device_node
    leaf = cache.match_prefix([1, 2, 3, 4]).last_device_node
    cache.inc_lock_ref(leaf)
    cache.inc_lock_ref(shared)
    assert (shared.lock_ref, leaf.lock_ref) == (2, 1)
    cache.dec_lock_ref(leaf)
    assert (cache.evictable_size(), cache.protected_size()) == (4, 2)
    cache.dec_lock_ref(shared)
    assert cache.protected_size() == 0
    cache.check_invariants()


def test_unlocking_an_unlocked_node_is_a_clear_error():
    alloc, cache = make()
    put(cache, alloc, [1, 2, 3])
    node = cache.match_prefix([1, 2, 3]).last_device_node
    with pytest.raises(LockRefError, match="not locked"):
        cache.dec_lock_ref(node)
    cache.inc_lock_ref(node)
    cache.dec_lock_ref(node)
    with pytest.raises(LockRefError, match="unlocked twice"):
        cache.dec_lock_ref(node)
    assert node.lock_ref == 0 and cache.evictable_size() == 3  # nothing half-applied
    cache.check_invariants()


def test_locking_an_evicted_or_foreign_node_is_an_error():
    alloc, cache = make()
    put(cache, alloc, [1, 2, 3])
    node = cache.match_prefix([1, 2, 3]).last_device_node
    cache.evict(EvictParams(num_tokens=1))
    with pytest.raises(LockRefError, match="evicted"):
        cache.inc_lock_ref(node)
    other_alloc, other = make()
    put(other, other_alloc, [4, 5])
    with pytest.raises(LockRefError, match="another tree"):
        cache.inc_lock_ref(other.match_prefix([4, 5]).last_device_node)


def test_lock_and_unlock_wrappers():
    alloc, cache = make()
    put(cache, alloc, [1, 2])
    lock = cache.lock(cache.match_prefix([1, 2]).last_device_node)
    assert cache.protected_size() == 2
    cache.unlock(lock)
    assert cache.protected_size() == 0


def _victims(policy: str) -> list[int]:
    """Three 2-token leaves A, B, C with distinct creation order, recency, hits and priority:

    - created A, B, C in that order; A inserted 3 times (hit_count 3), B and C once;
    - B matched last, so last access A < C < B;
    - priorities A=2, B=0, C=1.
    Evicting one token at a time frees one leaf each; returns the leaves' first tokens in order.
    """
    alloc, cache = make(policy=policy)
    for _ in range(3):
        put(cache, alloc, [10, 11], priority=2)
    put(cache, alloc, [20, 21], priority=0)
    put(cache, alloc, [30, 31], priority=1)
    cache.match_prefix([20, 21])
    order = []
    for _ in range(3):
        before = {n.key[0] for n in cache.root_node.children.values()}
        assert cache.evict(EvictParams(num_tokens=1)).evicted_tokens == 2
        (gone,) = before - {n.key[0] for n in cache.root_node.children.values()}
        order.append(gone)
        cache.check_invariants()
    return order


@pytest.mark.parametrize(
    "policy, expected",
    [
        ("lru", [10, 30, 20]),  # oldest access first
        ("mru", [20, 30, 10]),  # newest access first
        ("fifo", [10, 20, 30]),  # oldest creation first
        ("filo", [30, 20, 10]),  # newest creation first
        ("lfu", [30, 20, 10]),  # fewest hits, then LRU: C(1) before B(1, newer), A(3) last
        ("priority", [20, 30, 10]),  # lowest priority first
        ("slru", [30, 20, 10]),  # A has 3 >= 2 hits: protected segment, evicted last
    ],
)
def test_each_policy_picks_victims_in_sglang_order(policy, expected):
    assert _victims(policy) == expected


def test_every_registered_policy_is_covered():
    assert set(EVICTION_POLICIES) == {"lru", "lfu", "fifo", "mru", "filo", "priority", "slru"}
    with pytest.raises(ValueError, match="'bogus'"):
        get_eviction_strategy("bogus")


def test_a_parent_that_becomes_a_leaf_joins_the_candidates():
    alloc, cache = make()
    put(cache, alloc, [1, 2, 3])
    put(cache, alloc, [1, 2, 4])  # tree: [1,2] -> {[3], [4]}
    put(cache, alloc, [7, 8, 9])  # most recently used
    r = cache.evict(EvictParams(num_tokens=4))
    # LRU: [3] (1), then [4] (1) -- after which [1,2] is a leaf older than [7,8,9] -> [1,2] (2)
    assert r.evicted_tokens == 4 and cache.match_prefix([7, 8, 9]).device_prefix_len == 3
    assert cache.match_prefix([1, 2]).device_prefix_len == 0
    cache.check_invariants()


def test_evict_overshoots_by_less_than_one_leaf_and_stops_when_empty():
    alloc, cache = make()
    put(cache, alloc, list(range(1, 11)))
    r = cache.evict(EvictParams(num_tokens=3))
    assert (r.requested_tokens, r.evicted_tokens, r.overshoot_tokens) == (3, 10, 7)
    assert cache.evict(5).evicted_tokens == 0
    assert alloc.available_size() == 64


def test_evict_cost_does_not_rescan_all_leaves(monkeypatch):
    """SGLang computes a priority for every evictable leaf on every evict() call; kvlab computes
    one only when a leaf becomes evictable or its fields change."""
    from kvlab.mem_cache.evict_policy import LRUStrategy

    calls = 0
    prio = LRUStrategy().get_priority  # (a field reader: node -> priority)

    def counting(strategy, node):
        nonlocal calls
        calls += 1
        return prio(node)

    monkeypatch.setattr(LRUStrategy, "get_priority", counting)  # before the tree binds it
    alloc, cache = make(size=5000)
    for i in range(5000):
        cache.insert([i], alloc.alloc(1))
    assert calls >= 5000  # one per leaf as it became evictable: the counter sees the tree's calls
    calls = 0
    for _ in range(100):
        assert cache.evict(EvictParams(num_tokens=1)).evicted_tokens == 1
    assert calls == 0  # no rescans; the first 100 inserted (LRU) are gone
    assert cache.match_prefix([99]).device_prefix_len == 0
    assert cache.match_prefix([100]).device_prefix_len == 1
    cache.check_invariants()


def test_touching_a_leaf_reorders_it():
    alloc, cache = make()
    for t in (1, 2, 3):
        put(cache, alloc, [t, t])
    cache.match_prefix([1, 1])  # now 2 is the LRU leaf
    cache.evict(1)
    assert cache.match_prefix([2, 2]).device_prefix_len == 0
    assert cache.match_prefix([1, 1]).device_prefix_len == 2
    cache.check_invariants()


def test_check_invariants_catches_corruption():
    alloc, cache = make()
    put(cache, alloc, [1, 2, 3])
    cache.evictable_size_ += 1
    with pytest.raises(InvariantError, match="counters"):
        cache.check_invariants()
    cache.evictable_size_ -= 1
    leaf = next(iter(cache.evictable_leaves))
    cache.leaf_index.discard(leaf)
    with pytest.raises(InvariantError, match="evictable-leaf index"):
        cache.check_invariants()


def test_page_size_that_does_not_fit_the_allocator():
    with pytest.raises(ValueError, match="does not fit"):
        RadixCache(token_to_kv_pool_allocator=TokenToKVPoolAllocator(16), page_size=4)


def test_disabled_cache_is_a_no_op():
    alloc = TokenToKVPoolAllocator(16)
    cache = RadixCache(token_to_kv_pool_allocator=alloc, disable=True)
    assert cache.insert([1, 2], alloc.alloc(2)) == 0
    assert cache.match_prefix([1, 2]).device_prefix_len == 0
    assert cache.evict(5).evicted_tokens == 0 and cache.total_size() == 0


def test_value_none_stores_token_ids_and_short_values_are_rejected():
    cache = RadixCache()
    cache.insert([7, 8, 9])
    assert cache.match_prefix([7, 8, 9]).device_indices.tolist() == [7, 8, 9]
    with pytest.raises(ValueError, match="2 values"):
        cache.insert([1, 2, 3], torch.tensor([1, 2]))


def _req_setup(page_size=1, size=64):
    alloc, cache = make(size=size, page_size=page_size)
    pool = ReqToTokenPool(size=4, max_context_len=32)
    cache.req_to_token_pool = pool
    return alloc, cache, pool


def _admit(cache, alloc, pool, req, tokens):
    """Scheduler side of admission: match (capped at input-1), lock, allocate the rest, write row."""
    pool.alloc([req])
    m = cache.match_prefix(tokens[:-1])
    cache.inc_lock_ref(m.last_device_node)
    req.last_node, req.cache_protected_len, req.prefix_indices = m.last_device_node, m.device_prefix_len, m.device_indices
    new = alloc.alloc(len(tokens) - m.device_prefix_len)
    pool.write((req.req_pool_idx, slice(0, len(tokens))), torch.cat([m.device_indices, new]).to(torch.int32))


def test_cache_finished_req_inserts_frees_duplicates_and_unlocks():
    alloc, cache, pool = _req_setup()
    a = SimpleReq("a", origin_input_ids=[1, 2, 3, 4], output_ids=[5, 6])
    _admit(cache, alloc, pool, a, [1, 2, 3, 4, 5])  # KV for prompt + first output token
    release_kv_cache(a, cache)  # caches (input + output)[:-1] = 5 tokens
    assert cache.total_size() == 5 and alloc.available_size() == 59
    assert a.req_pool_idx is None and pool.available_size() == 4

    b = SimpleReq("b", origin_input_ids=[1, 2, 3, 4, 5, 9], output_ids=[10])
    _admit(cache, alloc, pool, b, [1, 2, 3, 4, 5, 9])
    assert b.cache_protected_len == 5 and cache.protected_size() == 5
    release_kv_cache(b, cache)
    assert cache.total_size() == 6 and cache.protected_size() == 0
    assert alloc.available_size() + cache.total_size() == 64
    cache.check_invariants()
    alloc.check_invariants()
    pool.check_invariants()


def test_cache_finished_req_with_pages_frees_the_unaligned_tail():
    alloc, cache, pool = _req_setup(page_size=4)
    r = SimpleReq("r", origin_input_ids=list(range(1, 10)), output_ids=[50])
    pool.alloc([r])
    kv = alloc.alloc(12)[:9]  # 9 tokens of KV on 3 pages
    pool.write((r.req_pool_idx, slice(0, 9)), kv.to(torch.int32))
    r.last_node = cache.root_node
    cache.cache_finished_req(r)  # 9 tokens: 8 into the tree, the 1-token tail page freed
    assert cache.total_size() == 8 and alloc.available_size() == 56
    cache.check_invariants()
    alloc.check_invariants()


def test_cache_unfinished_req_moves_the_lock_and_repoints_the_row():
    alloc, cache, pool = _req_setup()
    put(cache, alloc, [1, 2, 3])  # someone else cached [1,2,3] with other slots
    r = SimpleReq("r", origin_input_ids=[1, 2, 3, 4, 5, 6])
    pool.alloc([r])
    own = alloc.alloc(4)  # the request computed [1,2,3,4] itself (no match at admission)
    pool.write((r.req_pool_idx, slice(0, 4)), own.to(torch.int32))
    r.fill_ids, r.last_node = [1, 2, 3, 4], cache.root_node
    cache.cache_unfinished_req(r, chunked=True)
    assert r.cache_protected_len == 4 and r.last_node.lock_ref == 1
    assert cache.protected_size() == 4 and cache.evictable_size() == 0
    tree_slots = cache.match_prefix([1, 2, 3, 4]).device_indices
    assert pool.req_to_token[r.req_pool_idx, :4].tolist() == tree_slots.tolist()
    assert r.prefix_indices.tolist() == tree_slots.tolist()
    assert alloc.available_size() + cache.total_size() == 64  # the 3 duplicates were freed
    r.output_ids = [7]
    r.origin_input_ids = [1, 2, 3, 4]
    cache.cache_finished_req(r, kv_len_to_handle=4)
    assert cache.protected_size() == 0
    cache.check_invariants()
    alloc.check_invariants()
