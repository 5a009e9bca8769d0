"""The prefix-cache contract (``BasePrefixCache``) and the one match -> alloc -> insert helper.

Every tree is checked structurally against the protocol and then driven through the protocol's
methods only; ``match_alloc_insert`` is checked on worked cases (duplicates freed, the own prefix
survives its own eviction, a failed allocation leaves nothing behind) and against a brute-force
longest-common-prefix oracle.
"""

from types import SimpleNamespace

import pytest
import torch
from fuzz import fuzz_settings, record
from hypothesis import given
from hypothesis import strategies as st

from kvlab.errors import LockRefError
from kvlab.mem_cache import (
    BasePrefixCache,
    EvictParams,
    MambaPool,
    MambaRadixCache,
    PagedTokenToKVPoolAllocator,
    RadixCache,
    SWARadixCache,
    SWATokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
    match_alloc_insert,
)


def _radix(size=64):
    return RadixCache(token_to_kv_pool_allocator=TokenToKVPoolAllocator(size))


def _swa(size=64):
    return SWARadixCache(SWATokenToKVPoolAllocator(size, size, page_size=1), sliding_window_size=2)


def _mamba(size=64):
    return MambaRadixCache(TokenToKVPoolAllocator(size), MambaPool(8))


MAKERS = {"radix": _radix, "swa": _swa, "mamba": _mamba}


def _available(cache):
    a = cache.token_to_kv_pool_allocator
    return a.full_available_size() if isinstance(a, SWATokenToKVPoolAllocator) else a.available_size()


@pytest.mark.parametrize("kind", MAKERS)
def test_every_tree_satisfies_the_protocol_structurally(kind):
    assert isinstance(MAKERS[kind](), BasePrefixCache)


# The contract's members, spelled out: a namespace holding all of them is a BasePrefixCache.
CONTRACT = ("req_to_token_pool", "token_to_kv_pool_allocator", "page_size", "disable", "root_node", "kind",
            "state_pool", "reset", "match_prefix", "insert_slots", "nodes", "inc_lock_ref", "dec_lock_ref", "lock",
            "unlock", "evict", "evictable_size", "protected_size", "total_size", "path_device_indices",
            "pretty_print", "check_invariants")


@pytest.mark.parametrize("missing", CONTRACT)
def test_an_object_missing_part_of_the_contract_is_not_a_prefix_cache(missing):
    cache = _radix()
    assert isinstance(SimpleNamespace(**{n: getattr(cache, n) for n in CONTRACT}), BasePrefixCache)
    assert not isinstance(SimpleNamespace(**{n: getattr(cache, n) for n in CONTRACT if n != missing}),
                          BasePrefixCache)


def _drive(cache: BasePrefixCache) -> None:
    """Uses only what BasePrefixCache promises (plus the helper, which takes any BasePrefixCache)."""
    capacity = _available(cache)
    for key in ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7, 8], [9, 9, 9, 9]):
        assert match_alloc_insert(cache, key).out_cache_loc is not None
        cache.check_invariants()
    assert cache.total_size() == 6 + 2 + 4  # [1..4] shared, [5, 6], [7, 8], [9 x 4]
    assert _available(cache) + cache.total_size() == capacity
    m = cache.match_prefix([1, 2, 3, 4, 5, 6, 0])
    assert m.device_prefix_len == 6
    assert torch.equal(cache.path_device_indices(m.last_device_node), m.device_indices)
    lock = cache.lock(m.last_device_node)
    assert cache.protected_size() == 6 and cache.evictable_size() == 6
    res = cache.evict(EvictParams(num_tokens=100))
    assert res.evicted_tokens == 6  # everything unlocked; the locked path stays
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).device_prefix_len == 6
    cache.check_invariants()
    cache.unlock(lock)
    with pytest.raises(LockRefError):
        cache.unlock(lock)  # unlocked twice
    assert cache.evict(100).evicted_tokens == 6
    assert cache.total_size() == 0 and _available(cache) == capacity
    assert cache.pretty_print().endswith("#tokens: 0")
    cache.check_invariants()


@pytest.mark.parametrize("kind", MAKERS)
def test_behaviour_through_the_protocol_only(kind):
    _drive(MAKERS[kind]())


def test_helper_frees_the_duplicates_insert_finds():
    """Matching ``len - 1`` tokens of a cached key allocates one slot that insert finds cached."""
    cache = _radix(16)
    key = [1, 2, 3, 4]
    match_alloc_insert(cache, key)
    r = match_alloc_insert(cache, key, max_prefix_len=len(key) - 1)
    assert (r.prefix_len, len(r.out_cache_loc), r.cached_len) == (3, 1, 4)
    alloc = cache.token_to_kv_pool_allocator
    assert alloc.available_size() + cache.total_size() == 16  # the duplicate went back
    assert cache.protected_size() == 0
    cache.check_invariants()
    alloc.check_invariants()


@pytest.mark.parametrize("mode", ["shortfall", "full"])
def test_helper_locks_its_prefix_against_its_own_eviction(mode):
    """Two 2-token leaves in a 6-slot pool; the next request extends [1, 1] by 4 tokens. ``"full"`` asks
    the tree for all 4, more than the other leaf holds: unlocked, the request's own prefix would go too."""
    cache = _radix(6)
    alloc = cache.token_to_kv_pool_allocator
    for key in ([1, 1], [2, 2]):
        match_alloc_insert(cache, key)
    r = match_alloc_insert(cache, [1, 1, 5, 5, 5, 5], mode=mode)
    assert r.prefix_len == 2 and r.out_cache_loc is not None
    assert (r.evict.shortfall_tokens, r.evict.requested_tokens) == (2, 2 if mode == "shortfall" else 4)
    assert r.evict.evicted_tokens == 2  # [2, 2] only
    assert cache.match_prefix([1, 1, 5, 5, 5, 5]).device_prefix_len == 6
    assert alloc.available_size() == 0 and cache.total_size() == 6
    cache.check_invariants()
    alloc.check_invariants()


@pytest.mark.parametrize("kind", MAKERS)
def test_failed_allocation_leaves_nothing_behind(kind):
    cache = MAKERS[kind](8)
    before = _available(cache)
    r = match_alloc_insert(cache, list(range(12)))
    assert r.out_cache_loc is None and r.cached_len == 0
    assert cache.total_size() == 0 and cache.protected_size() == 0 and _available(cache) == before
    cache.check_invariants()


def test_mamba_state_already_there_is_handed_back():
    cache = _mamba()
    match_alloc_insert(cache, [1, 2, 3])
    r = match_alloc_insert(cache, [1, 2, 3])
    assert (r.prefix_len, r.cached_len, r.mamba_exist) == (3, 3, True)
    assert cache.mamba_pool.used_size() == cache.mamba_total_size() == 1
    cache.check_invariants()
    cache.mamba_pool.check_invariants()


@pytest.mark.parametrize("kind", MAKERS)
def test_insert_slots_is_one_insert_every_tree_takes(kind):
    """The contract's insert: the caller's duplicates past ``prev_prefix_len`` go back to the pool on every tree
    (a plain RadixCache's own ``insert`` leaves them to the caller), and a state slot is taken exactly where the
    tree has a ``state_pool``."""
    cache = MAKERS[kind]()
    assert cache.kind == kind
    alloc, states = cache.token_to_kv_pool_allocator, cache.state_pool
    assert (states is not None) == (kind == "mamba")

    def slot():
        return None if states is None else int(states.alloc(1)[0])

    capacity = _available(cache)
    res = cache.insert_slots([1, 2, 3, 4], alloc.alloc(4), state_slot=slot())
    assert res == (0, False)
    dup = alloc.alloc(4)  # a second request computed the same four tokens itself
    res = cache.insert_slots([1, 2, 3, 4], dup, state_slot=slot())
    assert res.prefix_len == 4 and res.state_exist == (kind == "mamba")
    assert _available(cache) + cache.total_size() == capacity  # the four duplicates were freed
    assert not bool(alloc.is_allocated(dup).any())
    assert {n.id for n in cache.nodes()} == {cache.root_node.id, *(n.id for n in cache.root_node.children.values())}
    cache.check_invariants()
    wrong = 7 if states is None else None
    with pytest.raises(ValueError, match="state_slot"):
        cache.insert_slots([5, 6], alloc.alloc(2), state_slot=wrong)


def test_every_allocator_is_a_kv_allocator():
    from kvlab.mem_cache.allocator import KVAllocator

    for alloc in (TokenToKVPoolAllocator(16), PagedTokenToKVPoolAllocator(16, 4),
                  SWATokenToKVPoolAllocator(16, 16, page_size=1)):
        assert isinstance(alloc, KVAllocator)
    assert not isinstance(MambaPool(4), KVAllocator)  # a state pool is not a token-slot allocator


def test_key_must_be_whole_pages():
    cache = RadixCache(token_to_kv_pool_allocator=PagedTokenToKVPoolAllocator(32, 4), page_size=4)
    with pytest.raises(ValueError, match="whole number of pages"):
        match_alloc_insert(cache, [1, 2, 3, 4, 5])
    assert match_alloc_insert(cache, list(range(8))).cached_len == 0 and cache.total_size() == 8


def _lcp(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@fuzz_settings("match_alloc_insert")
@given(keys=st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=10), st.booleans()),
                     min_size=1, max_size=25))
def test_helper_matches_a_longest_common_prefix_oracle(keys):
    """A pool that never runs short: every key stays cached, so the hit is the longest common prefix with
    any earlier key, the tree holds one token per distinct prefix, and no slot leaks or stays locked."""
    record("match_alloc_insert")
    cache = _radix(512)
    seen, prefixes = [], set()
    for key, short in keys:
        limit = len(key) - 1 if short else None
        r = match_alloc_insert(cache, key, max_prefix_len=limit)
        probe = key[:limit]
        assert r.prefix_len == max((_lcp(probe, s) for s in seen), default=0)
        assert r.cached_len == max((_lcp(key, s) for s in seen), default=0)
        seen.append(key)
        prefixes.update(tuple(key[:i]) for i in range(1, len(key) + 1))
        assert cache.total_size() == len(prefixes)
        assert cache.token_to_kv_pool_allocator.available_size() + cache.total_size() == 512
        assert cache.protected_size() == 0
        cache.check_invariants()
