"""Worked cases for the host tier: the host pool's sizing, the transfer clock, each write policy, demotion, host
eviction, load-back and its eviction rule, in-flight protection, and check_invariants catching broken state.

The numbers are SGLang 0.5.16's (``HostKVCache.__init__``, ``HiRadixCache``); tests/mem_cache/
test_differential_hicache.py runs SGLang's own classes on random scripts, these pin the behaviour in words.
"""

from __future__ import annotations

import heapq
import math
import random

import pytest
import torch

from kvlab.errors import DoubleFreeError, InvariantError, LockRefError
from kvlab.mem_cache import EvictParams, PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator, evict_from_tree_cache
from kvlab.mem_cache.base_prefix_cache import EvictResult
from kvlab.mem_cache.hicache.cache_controller import FINISH_TOLERANCE_S
from kvlab.mem_cache.hicache.hiradix_cache import HiRadixCache
from kvlab.mem_cache.hicache.memory_pool_host import HostKVCache, auto_hicache_ratio, host_pool_size
from kvlab.mem_cache.memory_pool import ReqToTokenPool
from kvlab.mem_cache.request_flows import SimpleReq
from kvlab.units import GiB

from .hicache_script import KvlabHiRunner, path_of, random_scenario

BPT = 1000  # bytes per token: a 10-token copy at 1e6 B/s takes 10 ms


def make(size=40, host_tokens=None, ratio=2.0, page_size=1, policy="write_through", lb_mode="shortfall", bw=1e6):
    alloc = TokenToKVPoolAllocator(size) if page_size == 1 else PagedTokenToKVPoolAllocator(size, page_size)
    if host_tokens is not None:  # the pool SGLang builds for this ratio has host_tokens // ps + 1 pages
        ratio = (host_tokens - page_size + 0.5) / size
    host = HostKVCache(size, BPT, page_size, hicache_ratio=ratio)
    cache = HiRadixCache(None, alloc, host, page_size, write_policy=policy, load_back_evict_mode=lb_mode,
                         d2h_bytes_per_s=bw, h2d_bytes_per_s=bw)
    return alloc, host, cache


def serve(cache, alloc, tokens):
    """Match, allocate the rest, insert: the tree then owns every page-aligned token of ``tokens``."""
    m = cache.match_prefix(tokens)
    new = alloc.alloc(len(tokens) // cache.page_size * cache.page_size - m.device_prefix_len)
    assert new is not None
    cache.insert(tokens, torch.cat([m.device_indices, new]))
    cache.check_invariants()


def residency(cache):
    return {tuple(n.key): n.residency for n in cache.nodes() if n is not cache.root_node}


# -- the host pool ------------------------------------------------------------------------------------------
def test_host_pool_is_sized_like_sglang():
    # ratio: int(device * ratio), then one page more than the floor in pages (even when already aligned)
    assert host_pool_size(1000, 128, 1, hicache_ratio=2.0).size_tokens == 2001
    assert host_pool_size(1000, 128, 64, hicache_ratio=2.0).size_tokens == (2000 // 64 + 1) * 64 == 2048
    assert host_pool_size(1024, 128, 64, hicache_ratio=2.0).size_tokens == 2048 + 64
    # --hicache-size is decimal GB and overrides the ratio
    s = host_pool_size(1000, 128 * 1024, 16, hicache_ratio=2.0, hicache_size_gb=1)
    assert (s.source, s.requested_tokens, s.size_tokens) == ("size", 10**9 // (128 * 1024), (7629 // 16 + 1) * 16)
    # the minimum: never empty, whatever the ratio
    tiny = host_pool_size(10, 128, 4, hicache_ratio=0.01)
    assert (tiny.requested_tokens, tiny.size_tokens, tiny.num_pages) == (0, 4, 1)


@pytest.mark.parametrize("kwargs, word", [
    (dict(hicache_ratio=0), "hicache_ratio"), (dict(hicache_ratio=-1), "hicache_ratio"),
    (dict(hicache_size_gb=-1), "hicache_size_gb"), (dict(page_size=0), "page_size"),
])
def test_host_pool_sizing_rejects_bad_input_by_name(kwargs, word):
    with pytest.raises(ValueError, match=word):
        host_pool_size(100, 128, **{"page_size": 1, **kwargs})


def test_host_pool_needs_host_memory_beyond_the_reserve():
    HostKVCache(1000, 10**6, 1, hicache_ratio=1.0, host_available_bytes=11 * GiB)  # 1 GB after 10 GiB: fits
    with pytest.raises(ValueError, match="not enough host memory.*10 GiB reserve"):
        HostKVCache(1000, 10**6, 1, hicache_ratio=2.0, host_available_bytes=11 * GiB)


def test_host_pool_smaller_than_device_is_flagged_not_refused():
    assert HostKVCache(100, 8, 1, hicache_ratio=0.5).smaller_than_device
    assert not HostKVCache(100, 8, 1, hicache_ratio=2.0).smaller_than_device


def test_auto_ratio_shrinks_to_the_budget():
    assert auto_hicache_ratio(2.0, 10 * GiB, 100 * GiB) == 2.0
    assert auto_hicache_ratio(2.0, 10 * GiB, 10 * GiB) == pytest.approx(0.95)
    with pytest.raises(ValueError, match="no host memory"):
        auto_hicache_ratio(2.0, 10 * GiB, 0)


def test_host_slots_come_from_the_head_and_frees_join_the_tail_late():
    host = HostKVCache(4, 8, 1, hicache_ratio=1.0)  # 5 slots: 0..4
    a = host.alloc(2)
    assert a.tolist() == [0, 1]
    host.free(a)
    assert host.alloc(3).tolist() == [2, 3, 4]  # staged frees are used only when the free list runs short
    assert host.alloc(2).tolist() == [0, 1]
    assert host.alloc(1) is None
    with pytest.raises(DoubleFreeError):
        host.free(torch.tensor([7]))
    host.free(torch.tensor([0]))
    with pytest.raises(DoubleFreeError, match="double free"):
        host.free(torch.tensor([0]))
    host.check_invariants()


# -- write policies and the transfer clock ------------------------------------------------------------------
def test_write_through_backs_up_on_insert_and_locks_until_the_copy_lands():
    alloc, host, cache = make(bw=1e6)
    serve(cache, alloc, list(range(10)))
    node = cache.match_prefix(list(range(10))).last_device_node
    assert node.residency == "both" and node.lock_ref == 1  # in flight: protected from device eviction
    assert cache.evict(10).evicted_tokens == 0
    cache.advance(0.009)  # 10 tokens x 1000 B / 1e6 B/s = 10 ms: not yet
    assert node.lock_ref == 1
    cache.advance(0.001)
    assert node.lock_ref == 0 and cache.now_s == pytest.approx(0.010)
    r = cache.evict(10)
    assert (r.evicted_tokens, r.demoted_tokens, r.destroyed_tokens) == (10, 10, 0)
    assert node.residency == "host" and alloc.available_size() == 40 and host.used_size() == 10


def test_copies_queue_on_one_channel():
    alloc, host, cache = make(bw=1e6)
    serve(cache, alloc, [1] * 10)
    serve(cache, alloc, [2] * 20)
    ctl = cache.cache_controller
    ops = list(ctl.write_queue)
    assert [(op.start_s, op.finish_s) for op in ops] == [(0.0, pytest.approx(0.01)), (pytest.approx(0.01),
                                                                                       pytest.approx(0.03))]
    assert ctl.due_s == ops[0].finish_s - FINISH_TOLERANCE_S  # the earliest copy's finish: a poll before it acks none
    cache.advance(0.002)
    assert list(ctl.write_queue) == ops and not ctl.ack_write_queue and cache.now_s == pytest.approx(0.002)
    cache.advance(0.018)
    assert [len(n.key) for n in cache.nodes() if n.lock_ref and n is not cache.root_node] == [20]
    assert ctl.due_s == ops[1].finish_s - FINISH_TOLERANCE_S
    assert cache.drain() == pytest.approx(0.01)
    assert ctl.totals.written_tokens == 30 and ctl.due_s == math.inf
    ctl.check_invariants()
    for clock in (cache.now_s, cache.now_s + 1):  # a NaN clock is refused whether the clock would move or not
        with pytest.raises(ValueError, match="NaN"):
            ctl.poll(math.nan)
        ctl.poll(clock)
    assert ctl.now_s == cache.now_s == pytest.approx(1.03)
    ctl.poll(0.5)  # the clock never moves back
    assert ctl.now_s == pytest.approx(1.03)


def test_write_through_selective_waits_for_the_second_hit():
    alloc, host, cache = make(policy="write_through_selective")
    serve(cache, alloc, list(range(10)))
    assert residency(cache) == {tuple(range(10)): "device"}
    serve(cache, alloc, list(range(10)))  # second insert of the same prefix: hit count 2
    assert residency(cache) == {tuple(range(10)): "both"}
    cache.drain()
    # unbacked nodes are destroyed by device eviction under the write-through policies
    serve(cache, alloc, list(range(10)) + [99] * 10)
    r = cache.evict(20)
    assert (r.demoted_tokens, r.destroyed_tokens) == (10, 10)
    assert residency(cache) == {tuple(range(10)): "host"}


def test_write_through_backs_up_only_below_a_backed_up_parent():
    alloc, host, cache = make(policy="write_through_selective")
    serve(cache, alloc, list(range(10)))
    serve(cache, alloc, list(range(10)) + [50] * 5)  # parent hit twice -> backed up; child hit once
    serve(cache, alloc, [7] * 5)
    serve(cache, alloc, [7] * 5 + [8] * 5)  # splits nothing; [7]*5 hit twice now
    assert residency(cache)[tuple(range(10))] == "both"
    assert residency(cache)[(50,) * 5] == "device"
    cache.check_invariants()


def test_write_back_writes_on_eviction_and_the_eviction_waits_for_the_copy():
    alloc, host, cache = make(policy="write_back", bw=1e6)
    serve(cache, alloc, list(range(20)))
    assert residency(cache) == {tuple(range(20)): "device"} and host.used_size() == 0
    r = cache.evict(5)
    assert (r.evicted_tokens, r.written_back_tokens, r.demoted_tokens, r.destroyed_tokens) == (20, 20, 20, 0)
    assert residency(cache) == {tuple(range(20)): "host"}
    assert cache.now_s == pytest.approx(0.02) and cache.cache_controller.totals.stall_s == pytest.approx(0.02)
    assert alloc.available_size() == 40  # device slots freed only after the copy


def test_write_back_with_a_full_host_drops_the_leaf_and_its_host_subtree():
    alloc, host, cache = make(policy="write_back", host_tokens=10)
    serve(cache, alloc, [1] * 10)
    cache.evict(10)  # written back: fills the host pool
    serve(cache, alloc, [2] * 10)
    serve(cache, alloc, [1] * 10)  # recomputed: the host-only node takes the new device slots (both tiers now)
    serve(cache, alloc, [1] * 10 + [3] * 10)
    r = cache.evict(40)
    # [3]*10: no host room even after host eviction (the only host copy belongs to a device node) -> dropped;
    # then [2]*10 the same; [1]*10 is backed up -> demoted
    assert (r.destroyed_tokens, r.demoted_tokens, r.written_back_tokens) == (20, 10, 0)
    assert residency(cache) == {(1,) * 10: "host"}
    cache.check_invariants()


# -- matches, host eviction, load-back ------------------------------------------------------------------------
def demoted_chain(**kw):
    """[0..9] on both tiers, [0..9]+[10..19] on host only (demoted), copies landed."""
    alloc, host, cache = make(**kw)
    serve(cache, alloc, list(range(20)))
    serve(cache, alloc, list(range(10)) + [77] * 10)  # split: [0..9] shared
    cache.drain()
    cache.match_prefix(list(range(10)) + [77] * 10)  # the [77] leaf is most recent: [10..19] goes first
    cache.evict(10)
    assert residency(cache) == {tuple(range(10)): "both", tuple(range(10, 20)): "host", (77,) * 10: "both"}
    return alloc, host, cache


def test_match_reports_device_and_host_hits():
    alloc, host, cache = demoted_chain()
    m = cache.match_prefix(list(range(20)) + [5])
    assert (m.device_prefix_len, m.host_hit_length) == (10, 10)
    assert list(m.last_host_node.key) == list(range(10, 20))
    assert list(m.last_device_node.key) == list(range(10))
    m = cache.match_prefix(list(range(15)))  # ends inside the host-only node: split there
    assert (m.device_prefix_len, m.host_hit_length) == (10, 5)
    cache.check_invariants()


def test_host_eviction_takes_host_only_leaves_only():
    alloc, host, cache = demoted_chain()
    assert cache.evict_host(100) == 10  # the device nodes' host copies are not host-evictable
    assert residency(cache) == {tuple(range(10)): "both", (77,) * 10: "both"}
    assert cache.host_evicted_tokens == 10
    cache.check_invariants()


def test_load_back_brings_the_path_back_and_locks_it_until_the_copy_lands():
    alloc, host, cache = demoted_chain(bw=1e6)
    t0 = cache.now_s
    m = cache.match_prefix(list(range(20)))
    values, last = cache.init_load_back(m.best_match_node)
    assert len(values) == 10 and last is m.last_host_node and last.residency == "both"
    assert last.lock_ref == 1 and cache.evict(100).evicted_tokens == 10  # only the [77] leaf could go
    cache.advance(0.01)
    assert last.lock_ref == 0 and cache.now_s == pytest.approx(t0 + 0.01)
    assert cache.match_prefix(list(range(20))).device_prefix_len == 20


def test_load_back_below_the_threshold_or_over_the_quota_is_skipped():
    alloc, host, cache = demoted_chain()
    cache.load_back_threshold = 11
    m = cache.match_prefix(list(range(20)))
    assert cache.load_back(m.last_host_node).reason == "below_threshold"
    cache.load_back_threshold = 10
    # the quota counts the evictable tokens the load pins ([0..9]: 10 of them) against it
    assert cache.load_back(m.last_host_node, mem_quota=19).reason == "over_quota"
    assert cache.load_back(m.last_host_node, mem_quota=20).loaded_tokens == 10
    cache.check_invariants()


@pytest.mark.parametrize("mode, evicted", [("shortfall", 5), ("full", 10)])
def test_load_back_evicts_the_shortfall_or_the_whole_load(mode, evicted):
    """0.5.23 evicts ``need - available``; 0.5.16 tried to allocate and, on failure, evicted the whole load."""
    alloc, host, cache = demoted_chain(lb_mode=mode, size=40)
    for tokens in ([40 + i] * 5 for i in range(3)):  # 15 more device tokens in 5-token leaves: 5 slots stay free
        serve(cache, alloc, tokens)
    cache.drain()
    cache.match_prefix(list(range(10)) + [77] * 10)  # the [77] leaf is now the most recent: the small ones go first
    assert alloc.available_size() == 5
    r = cache.load_back(cache.match_prefix(list(range(20))).last_host_node)
    assert r.loaded_tokens == 10
    assert (r.evict.shortfall_tokens, r.evict.requested_tokens, r.evict.evicted_tokens) == (5, 10 if mode == "full"
                                                                                          else 5, evicted)
    assert r.evict.over_evicted_tokens == (5 if mode == "full" else 0)
    cache.check_invariants()


# -- locks and invariants -------------------------------------------------------------------------------------
def test_locking_a_host_only_node_or_unlocking_twice_raises():
    alloc, host, cache = demoted_chain()
    host_only = cache.match_prefix(list(range(20))).last_host_node
    with pytest.raises(LockRefError, match="not on the device"):
        cache.inc_lock_ref(host_only)
    dev = cache.match_prefix(list(range(10))).last_device_node
    cache.inc_lock_ref(dev)
    cache.dec_lock_ref(dev)
    with pytest.raises(LockRefError, match="not locked"):
        cache.dec_lock_ref(dev)


def test_check_invariants_catches_broken_state():
    alloc, host, cache = demoted_chain()
    node = cache.match_prefix(list(range(20))).last_host_node
    node.host_value = None  # a node on neither tier
    with pytest.raises(InvariantError, match="on the device or on host"):
        cache.check_invariants()
    alloc, host, cache = demoted_chain()
    host.alloc(3)  # host slots nobody in the tree owns
    with pytest.raises(InvariantError, match="host pool holds exactly"):
        cache.check_invariants()
    alloc, host, cache = make()
    serve(cache, alloc, list(range(10)))
    next(n for n in cache.nodes() if n is not cache.root_node).lock_ref = 0  # a copy in flight, unprotected
    cache.protected_size_, cache.evictable_size_ = 0, 10
    for n in cache.nodes():
        if n is not cache.root_node:
            cache.leaf_index.push(n)
    with pytest.raises(InvariantError, match="backup in flight is locked"):
        cache.check_invariants()
    alloc, host, cache = make(bw=1e6)
    serve(cache, alloc, list(range(10)))
    cache.cache_controller.due_s = math.inf  # a copy in flight the clock would never ack
    with pytest.raises(InvariantError, match="due_s is the earliest copy's finish"):
        cache.check_invariants()


@pytest.mark.parametrize("kwargs, word", [
    (dict(write_policy="write_around"), "write_policy"), (dict(load_back_evict_mode="some"), "load_back_evict_mode"),
    (dict(d2h_bytes_per_s=0), "d2h_bytes_per_s"),
])
def test_bad_configuration_is_named(kwargs, word):
    alloc = TokenToKVPoolAllocator(16)
    with pytest.raises(ValueError, match=word):
        HiRadixCache(None, alloc, HostKVCache(16, 8, 1), **kwargs)


def test_paged_tree_moves_whole_pages():
    alloc, host, cache = make(size=64, page_size=4, policy="write_back")
    serve(cache, alloc, list(range(18)))  # 16 tokens cached (4 pages); the unaligned tail is not
    assert cache.total_size() == 16
    assert cache.evict(EvictParams(num_tokens=4)).written_back_tokens == 16
    assert cache.match_prefix(list(range(18))).host_hit_length == 16
    cache.check_invariants()


def test_the_two_tier_tree_keeps_the_prefix_cache_contract():
    """Anything written against ``BasePrefixCache`` (the glue, the views) takes a HiRadixCache: both eviction modes
    of ``evict_from_tree_cache`` work on it, and its text view marks each node's tier."""
    from kvlab.mem_cache import BasePrefixCache

    for mode, requested in (("shortfall", 6), ("full", 10)):
        alloc, host, cache = demoted_chain()
        assert isinstance(cache, BasePrefixCache)
        held = alloc.alloc(alloc.available_size() - 4)
        r = evict_from_tree_cache(cache, 10, mode=mode)
        assert (r.shortfall_tokens, r.requested_tokens) == (6, requested)
        alloc.free(held)
        cache.check_invariants()
    text = cache.pretty_print()
    assert " host" in text and " both" in text


def test_insert_slots_frees_the_callers_duplicates_and_refuses_a_state_slot():
    """The contract's insert: the second request's slots for the prefix already on the device go back to the
    allocator; the tree owns the rest. A recurrent-state slot has no place in a two-tier KV tree."""
    alloc, _, cache = make()
    assert cache.insert_slots(list(range(8)), alloc.alloc(8)).prefix_len == 0
    free_before = alloc.available_size()
    result = cache.insert_slots(list(range(12)), alloc.alloc(12))
    assert result.prefix_len == 8
    assert alloc.available_size() == free_before - 12 + 8  # the 8 duplicates are back
    assert cache.total_size() == 12
    cache.check_invariants()
    with pytest.raises(ValueError, match="state_slot"):
        cache.insert_slots(list(range(4)), alloc.alloc(4), state_slot=0)


# -- speed (issue 21 item 7): the long-lived leaf heaps, the held-path insert, the host pool's page lists ---------
class PerCallHeapify(HiRadixCache):
    """0.5.16's eviction as kvlab ran it before issue 21 item 7: a heap of every evictable leaf built on each
    ``evict`` / ``evict_host`` call (the oracle for the long-lived heaps, which must pop the same victims)."""

    def evict(self, params):
        num_tokens = params if isinstance(params, int) else params.num_tokens
        heap = [(self._prio(n), n) for n in self.evictable_leaves]
        heapq.heapify(heap)
        staged, evicted = [], 0
        while evicted < num_tokens and heap:
            _, x = heapq.heappop(heap)
            if x.lock_ref > 0:
                continue
            if x.host_value is not None:
                evicted += self._evict_backuped(x)
            elif self.write_policy != "write_back":
                evicted += self._evict_regular(x)
            elif self.write_backup(x, write_back=True) > 0:
                x.protect_host()
                staged.append((x, x.value))
                evicted += self._detach_backuped(x)
            else:
                self._flush_staged(staged)
                evicted += self._drop_subtree_no_host(x)
            parent = x.parent
            if parent is not self.root_node and all(c.value is None for c in parent.children.values()):
                heapq.heappush(heap, (self._prio(parent), parent))
        self._flush_staged(staged)
        return EvictResult.of(num_tokens, num_tokens, evicted)

    def evict_host(self, num_tokens):
        heap = [(self._prio(n), n) for n in self.evictable_host_leaves]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, x = heapq.heappop(heap)
            if x.value is not None or x.host_ref_counter > 0:
                continue
            freed += self.cache_controller.evict_host(x.host_value)
            parent = x.parent
            del parent.children[self._key_of(x.key)]
            self.host_leaf_index.discard(x)
            x.host_value = None
            self._update_host_leaf_status(parent)
            if not parent.children and parent.value is None:
                heapq.heappush(heap, (self._prio(parent), parent))
        self.host_evicted_tokens += freed
        return freed


class PlainWalk(HiRadixCache):
    """Insert walks every node from the root, comparing tokens (the oracle for the held-path walk)."""

    def _held_path(self, held, held_len):
        return None


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("policy", ["lru", "lfu", "mru"])
@pytest.mark.parametrize("write_policy", ["write_through", "write_through_selective", "write_back"])
def test_long_lived_heaps_evict_what_a_heap_per_call_evicts(page_size, policy, write_policy):
    """Random scripts (device and host eviction, load-backs, locks, copies in flight) give the same record after
    every op whether the leaves are heapified per call or kept in one heap per tier across calls."""
    for seed in range(2):
        sc = random_scenario(7000 + seed, page_size, policy, write_policy, n_ops=120)
        fast = KvlabHiRunner(sc)  # check_invariants() after every op (the heaps agree with the tree)
        oracle = KvlabHiRunner(sc, check=False)
        c = fast.cache
        oracle.cache = PerCallHeapify(None, oracle.alloc, oracle.host, page_size, write_policy=write_policy,
                                      eviction_policy=policy, load_back_evict_mode="full", d2h_bytes_per_s=1e6,
                                      h2d_bytes_per_s=1e6)
        assert type(c) is HiRadixCache and c.load_back_evict_mode == "full"
        for i, op in enumerate(sc["ops"]):
            assert fast.run(op) == oracle.run(op), f"seed {seed}, op {i} {op[0]}"


def test_check_invariants_catches_a_leaf_without_a_live_heap_entry():
    alloc, host, cache = demoted_chain()
    leaf = next(iter(cache.evictable_host_leaves))
    leaf.last_access_time += 100  # its sort key changed without a fresh heap entry: it would be popped too early
    with pytest.raises(InvariantError, match="host leaf has a live heap entry"):
        cache.check_invariants()
    alloc, host, cache = make()
    serve(cache, alloc, list(range(10)))
    cache.drain()  # the backup lands: the leaf is evictable again
    leaf = next(iter(cache.evictable_leaves))
    leaf.hit_count += 1  # not in the LRU key: nothing to re-push
    cache.check_invariants()
    cache.leaf_index.heap.clear()
    with pytest.raises(InvariantError, match="device leaf has a live heap entry"):
        cache.check_invariants()


def _flow(cache_cls, page_size, write_policy, seed):
    """Requests over shared prefixes through the scheduler's request flows: match, load back, a chunked prefill
    (``cache_unfinished_req``), the rest of the prompt, then ``cache_finished_req``; two requests in flight at a
    time. Returns the state after every step."""
    rng = random.Random(seed)
    size = 64 * page_size if page_size > 1 else 96
    alloc = TokenToKVPoolAllocator(size) if page_size == 1 else PagedTokenToKVPoolAllocator(size, page_size)
    host = HostKVCache(size, BPT, page_size, hicache_ratio=2.0)
    pool = ReqToTokenPool(size=4, max_context_len=128)
    cache = cache_cls(pool, alloc, host, page_size, write_policy=write_policy, d2h_bytes_per_s=1e6,
                      h2d_bytes_per_s=1e6)
    roots = [[rng.randrange(1, 9) for _ in range(rng.randrange(8, 40))] for _ in range(3)]
    states, running = [], []

    def state(tag):
        nodes = sorted((path_of(n, cache.root_node), n.residency, n.lock_ref, n.hit_count, n.last_access_time)
                       for n in cache.nodes() if n is not cache.root_node)
        return (tag, nodes, cache.clock.now, alloc.available_size(), host.free_slots.tolist(),
                [r.prefix_indices.tolist() for r in running])

    def make_room(n):
        if alloc.available_size() < n:
            cache.evict(n - alloc.available_size())
        return alloc.alloc(n)

    for i in range(14):
        prompt = rng.choice(roots)[: rng.randrange(4, 40)] + [rng.randrange(1, 9) for _ in range(rng.randrange(1, 12))]
        r = SimpleReq(i, origin_input_ids=prompt, output_ids=[rng.randrange(1, 9) for _ in range(rng.randrange(1, 6))])
        pool.alloc([r])
        m = cache.match_prefix(prompt[:-1])
        loaded, last = cache.init_load_back(m.best_match_node)
        prefix = torch.cat([m.device_indices, loaded])
        cache.inc_lock_ref(last)
        r.last_node, r.cache_protected_len = last, len(prefix)
        kv_len = len(prompt) + len(r.output_ids) - 1  # the last output token's KV is never computed
        new = make_room(-(-(kv_len - len(prefix)) // page_size) * page_size)  # whole pages
        if new is None:
            cache.dec_lock_ref(last)
            pool.free(r)
            continue
        row = torch.cat([prefix, new])[:kv_len]
        pool.write((r.req_pool_idx, slice(0, kv_len)), row.to(torch.int32))
        cut = len(prefix) + (len(prompt) - len(prefix)) // 2
        for fill, chunked in ((prompt[:cut], True), (prompt, False)):
            r.fill_ids = fill
            cache.cache_unfinished_req(r, chunked=chunked)
            states.append(state(f"unfinished {i}"))
        running.append(r)
        cache.advance(0.003)
        if len(running) > 1:
            done = running.pop(0)
            cache.cache_finished_req(done)
            pool.free(done)
            states.append(state(f"finished {done.rid}"))
        cache.check_invariants()
    return states


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("write_policy", ["write_through", "write_through_selective", "write_back"])
def test_insert_over_a_held_path_does_what_the_walk_from_the_root_does(page_size, write_policy):
    """``cache_unfinished_req`` / ``cache_finished_req`` skip comparing the path a request holds; every node's
    residency, locks, hit count and access time, the clock, both pools and each request's prefix are the same as
    when insert walks from the root."""
    for seed in range(3):
        fast, plain = _flow(HiRadixCache, page_size, write_policy, seed), _flow(PlainWalk, page_size, write_policy, seed)
        assert len(fast) > 10
        for a, b in zip(fast, plain, strict=True):
            assert a == b


def test_host_pool_frees_whole_pages_of_what_it_handed_out():
    host = HostKVCache(20, 8, 4, hicache_ratio=1.0)  # 6 pages: slots 0..23
    a, b, c = host.alloc(8), host.alloc(4), host.alloc(8)  # pages 0 1 | 2 | 3 4
    host.free(b)
    host.free(a[4:])  # a split half: whole pages of an allocation
    mixed = host.alloc(12)  # page 5 (never used), then the staged 2, 1: three runs
    assert mixed.tolist() == [*range(20, 24), *range(8, 12), *range(4, 8)]
    assert host.available_size() == 0
    with pytest.raises(ValueError, match="not whole pages"):
        host.free(mixed[2:6])
    with pytest.raises(ValueError, match="not whole pages"):
        host.free(torch.tensor([1, 0, 2, 3]))  # a whole page's slots, out of order
    host.free(mixed[4:8])  # page 2 of the concatenation
    with pytest.raises(DoubleFreeError, match="double free"):
        host.free(torch.tensor([8, 9, 10, 11]))  # the same page, as a tensor of its own
    host.free(mixed.clone()[8:])  # page 1, from a copy: checked slot by slot
    host.free(torch.cat([a[:4], c]))  # pages 0, 3, 4 from other tensors
    host.free(mixed[:4])
    assert host.available_size() == host.size
    host.check_invariants()
    del mixed
    assert not host._issued  # a concatenation is forgotten when its last view goes


# -- the match replay (the simulator's fast path): structure_version and restamp_path ----------------------------
def _full_state(cache):
    """Everything a match reads or writes: each node's path, residency, lock, access time and hit count, the clock,
    and the order each tier's heap would evict its leaves in."""
    nodes = sorted((path_of(n, cache.root_node), n.residency, n.lock_ref, n.last_access_time, n.hit_count)
                   for n in cache.nodes())
    order = [[n.id for n in sorted(leaves, key=cache._prio)]
             for leaves in (cache.evictable_leaves, cache.evictable_host_leaves)]
    return nodes, cache.clock.now, order


def _found(cache, m):
    return (m.device_indices.tolist(), path_of(m.last_device_node, cache.root_node), m.device_prefix_len,
            path_of(m.last_host_node, cache.root_node), m.host_hit_length)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("write_policy", ["write_through", "write_through_selective", "write_back"])
def test_a_match_repeated_while_the_structure_version_stands_is_its_replay(page_size, write_policy):
    """Twin trees run the same random script (device and host eviction, backups, load-backs, copies landing, locks).
    After every op both match a few of the script's keys, some of them several times: one always walks; the other,
    while ``structure_version`` is what it was after its last walk of that key, replays it (``restamp_path`` from
    the walk's end, ``match_ends`` for the tiers' ends) and reuses the device prefix that walk found. Whatever
    the script did in between, what the replay reports equals the walk's, and the trees, clocks and eviction
    orders stay equal; replays happen, with host hits among them."""
    replayed = host_hits = 0
    for seed in range(3):
        sc = random_scenario(9100 + seed, page_size, "lru", write_policy, n_ops=100)
        walker, replayer = KvlabHiRunner(sc, check=False), KvlabHiRunner(sc)
        keys = [op[1] for op in sc["ops"] if op[0] in ("serve", "load_back", "match")]
        rng = random.Random(seed)
        memo = {}
        for i, op in enumerate(sc["ops"]):
            assert walker.run(op) == replayer.run(op), f"seed {seed}, op {i} {op[0]}"
            for key in rng.sample(keys, min(3, len(keys))):
                times = rng.choice([1, 1, 3])
                for _ in range(times):
                    walked = _found(walker.cache, walker.cache.match_prefix(key))
                c = replayer.cache
                k = tuple(key)
                if k in memo and memo[k][0] == c.structure_version:
                    _, end, indices = memo[k]
                    c.restamp_path(end, times)
                    dev, host, hit = c.match_ends(end)
                    found = (indices, path_of(dev, c.root_node), len(indices), path_of(host, c.root_node), hit)
                    replayed += 1
                    host_hits += hit > 0
                else:
                    for _ in range(times):
                        m = c.match_prefix(key)
                    found = _found(c, m)
                    end = m.last_host_node if m.host_hit_length else m.last_device_node
                    memo[k] = (c.structure_version, end, found[0])
                assert found == walked, f"seed {seed}, op {i}: replayed match of {key}"
                assert _full_state(c) == _full_state(walker.cache), f"seed {seed}, op {i}: after matching {key}"
            replayer.cache.check_invariants()
    assert replayed > 50 and host_hits > 5


def test_structure_version_moves_with_everything_a_match_reads():
    """A new node, a split, a backup, a demotion, a load-back, a host eviction and a host-only node adopting
    recomputed slots each change what a match walks or finds, and each moves the version; a walk that splits
    nothing and a copy landing (a lock released) do not."""
    alloc, host, cache = make(size=20, ratio=2.0)
    key = list(range(12))
    seen = [cache.structure_version]

    def moved():
        seen.append(cache.structure_version)
        return seen[-1] != seen[-2]

    cache.insert(key, alloc.alloc(12))  # a new node, its backup issued at once (write_through)
    assert moved() and cache.root_node.children[0].host_value is not None
    cache.drain()  # the backup lands: the node's lock goes
    assert not moved()
    assert cache.match_prefix(key).device_prefix_len == 12 and not moved()  # no split
    cache.evict(12)  # demoted: host only
    assert moved() and cache.match_prefix(key).host_hit_length == 12 and not moved()
    m = cache.match_prefix(key)
    assert cache.load_back(m.best_match_node).loaded_tokens == 12
    assert moved() and cache.match_prefix(key).device_prefix_len == 12
    cache.drain()
    cache.evict(12)
    assert moved()
    assert cache.evict_host(12) == 12  # the host copy freed: the node is gone
    assert moved() and cache.match_prefix(key).host_hit_length == 0
    cache.insert(key, alloc.alloc(12))
    cache.drain()
    cache.evict(12)
    assert moved()
    cache.insert(key, alloc.alloc(12))  # the host-only node adopts the recomputed slots
    assert moved() and cache.match_prefix(key).device_prefix_len == 12 and not moved()
    cache.match_prefix(key[:6])  # splits the node
    assert moved()
    cache.check_invariants()
    # write_through_selective: the second hit backs a node up, with no node made; the walk's best match node moves
    alloc, host, cache = make(size=20, ratio=2.0, policy="write_through_selective")
    cache.insert(key, alloc.alloc(12))
    assert cache.match_prefix(key).best_match_node is cache.root_node
    seen.append(cache.structure_version)
    cache.insert(key, cache.match_prefix(key).device_indices)  # the second hit
    assert moved() and cache.match_prefix(key).best_match_node is cache.root_node.children[0]
