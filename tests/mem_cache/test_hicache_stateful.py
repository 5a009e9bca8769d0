"""Hypothesis state machine over the device allocator + host pool + HiRadixCache, with a brute-force match oracle.

Each run picks a page size (1 or 4), a write policy, an eviction policy, a load-back eviction mode and a host ratio,
then interleaves serves (match, lock, evict, alloc, insert, unlock), load-backs, device and host evictions, raw
holds, locks, and the transfer clock (``advance`` by a random time, or ``drain``). After every step: the tree's,
the allocator's and the host pool's ``check_invariants()`` (which include: a node with a copy in flight is locked;
the host pool holds exactly the tree's host copies); device slots are conserved (free + cached + held == capacity);
and ``match_prefix`` agrees with a scan over the tree's node list (longest prefix on either tier; the part on the
device), which does not use the match walk.
"""

from __future__ import annotations

import math

from fuzz import fuzz_settings, record
from hypothesis import HealthCheck
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from .hicache_script import WRITE_POLICIES, KvlabHiRunner, path_of


def _digits(length_and_code):
    length, code = length_and_code
    return [(code // 3**i) % 3 for i in range(length)]


tokens = st.tuples(st.integers(2, 24), st.integers(0, 3**24 - 1)).map(_digits)


class HiCacheMachine(RuleBasedStateMachine):
    page_size = 1

    @initialize(write_policy=st.sampled_from(WRITE_POLICIES), policy=st.sampled_from(["lru", "lfu", "fifo"]),
                pages=st.integers(8, 40), host_ratio=st.sampled_from([0.5, 1.0, 2.0, 4.0]),
                lb_mode=st.sampled_from(["shortfall", "full"]))
    def setup(self, write_policy, policy, pages, host_ratio, lb_mode):
        record(f"hicache_page{self.page_size}")
        sc = {"size": pages * self.page_size, "page_size": self.page_size, "policy": policy,
              "write_policy": write_policy, "host_ratio": host_ratio}
        self.runner = KvlabHiRunner(sc, load_back_evict_mode=lb_mode, check=False, bandwidth=1e5)
        self.cache = self.runner.cache
        self.locks, self.n_locks, self.held, self.n_held = [], 0, [], 0

    @rule(seq=tokens, mode=st.sampled_from(["shortfall", "full"]))
    def serve(self, seq, mode):
        expect = self.oracle(seq)
        rec = self.runner.run(["serve", seq, mode])
        assert (rec["hit"], rec["host_hit"]) == expect
        if rec["ok"]:  # the whole page-aligned sequence is now on the device
            assert self.oracle(seq) == (len(seq) // self.page_size * self.page_size, 0)

    @rule(seq=tokens)
    def match(self, seq):
        expect = self.oracle(seq)
        rec = self.runner.run(["match", seq])
        assert (rec["hit"], rec["host_hit"]) == expect

    @rule(seq=tokens, quota=st.none() | st.integers(0, 60))
    def load_back(self, seq, quota):
        hit, host_hit = self.oracle(seq)
        rec = self.runner.run(["load_back", seq, quota])
        assert rec["loaded"] in (0, host_hit)  # all or nothing
        if rec["loaded"]:
            assert self.oracle(seq) == (hit + host_hit, 0)
            assert len(rec["last"]) == hit + host_hit

    @rule(n=st.integers(0, 40))
    def evict(self, n):
        evictable = self.cache.evictable_size()
        host_before = self.cache.host_size()
        r = self.cache.evict(n)
        assert r.evicted_tokens == evictable - self.cache.evictable_size()
        assert r.evicted_tokens >= min(n, evictable)  # whole leaves, until satisfied or none left
        assert r.evicted_tokens == r.demoted_tokens + r.destroyed_tokens
        if self.cache.write_policy != "write_back":
            assert self.cache.host_size() == host_before  # device eviction never costs a host copy here

    @rule(n=st.integers(0, 40))
    def evict_host(self, n):
        before = self.cache.host_size()
        freed = self.cache.evict_host(n)
        assert before - self.cache.host_size() == freed

    @rule(seconds=st.sampled_from([0.0, 1e-4, 1e-3, 1e-2]))
    def advance(self, seconds):
        before = self.cache.now_s
        self.cache.advance(seconds)
        assert math.isclose(self.cache.now_s, before + seconds)
        assert all(op.finish_s > self.cache.now_s for op in self.cache.cache_controller.in_flight())

    @rule()
    def drain(self):
        self.cache.drain()
        assert not self.cache.cache_controller.in_flight()
        assert not self.cache.ongoing_write_through and not self.cache.ongoing_load_back

    @rule(pages=st.integers(1, 4))
    def hold(self, pages):
        if self.runner.run(["hold", pages * self.page_size])["ok"]:
            self.held.append(self.n_held)
        self.n_held += 1

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data):
        h = data.draw(st.sampled_from(self.held))
        self.held.remove(h)
        self.runner.run(["release", h])

    @rule(seq=tokens)
    def lock(self, seq):
        self.runner.run(["lock", seq])
        self.locks.append(self.n_locks)
        self.n_locks += 1

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data):
        h = data.draw(st.sampled_from(self.locks))
        self.locks.remove(h)
        self.runner.run(["unlock", h])

    def oracle(self, seq) -> tuple[int, int]:
        """(device hit, host-only hit) of ``seq`` by scanning every node's full path: the longest page-aligned prefix
        of ``seq`` that ends a cached page on either tier, split where the device part ends."""
        ps, root = self.page_size, self.cache.root_node
        pages = {}  # page-aligned prefix -> on device?
        for node in self.cache.nodes():
            if node is root:
                continue
            path = path_of(node, root)
            start = len(path) - len(node.key)
            for end in range(start + ps, len(path) + 1, ps):
                pages[tuple(path[:end])] = node.value is not None
        hit = dev = 0
        while hit + ps <= len(seq) and tuple(seq[: hit + ps]) in pages:
            hit += ps
            if pages[tuple(seq[:hit])]:
                dev = hit
        return dev, hit - dev

    @invariant()
    def consistent(self):
        cache, alloc = self.cache, self.runner.alloc
        cache.check_invariants()
        alloc.check_invariants()
        held = sum(len(h) for h in self.runner.held if h is not None)
        assert alloc.available_size() + cache.total_size() + held == alloc.size


class PagedHiCacheMachine(HiCacheMachine):
    page_size = 4


_health = [HealthCheck.too_slow, HealthCheck.filter_too_much]
TestHiCacheMachinePage1 = HiCacheMachine.TestCase
TestHiCacheMachinePage1.settings = fuzz_settings("hicache_page1", suppress_health_check=_health)
TestHiCacheMachinePage4 = PagedHiCacheMachine.TestCase
TestHiCacheMachinePage4.settings = fuzz_settings("hicache_page4", suppress_health_check=_health)
