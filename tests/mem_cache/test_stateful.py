"""Hypothesis state machine over allocator + radix cache, with a naive longest-prefix oracle.

Each run drives one allocator (page size 1 or 4) and one RadixCache through request lifecycles
(admit, decode, finish, abort), raw holds, lock/unlock, direct evictions and
evict_from_tree_cache in both modes. After every step: both check_invariants(); slots are
conserved (free + cached + held by requests == capacity); evictable + protected == cached.
Every match is compared with a brute-force model: a dict from each cached page-aligned prefix to
the slots of its last page, longest prefix found by scanning.
"""

from __future__ import annotations

from fuzz import fuzz_settings, record
from hypothesis import HealthCheck
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvlab.mem_cache import EvictResult, evict_from_tree_cache
from kvlab.units import align_down

from .op_script import POLICIES, KvlabRunner


def _digits(length_and_code):
    """Token list from two draws (length, base-3 code): drawing 20 separate integers per list made
    hypothesis' own bookkeeping the slowest part of a step. Shrinks towards short runs of 0s."""
    length, code = length_and_code
    return [(code // 3**i) % 3 for i in range(length)]


# 3-token vocabulary: random sequences share prefixes (and split nodes) all the time.
tokens = st.tuples(st.integers(2, 20), st.integers(0, 3**20 - 1)).map(_digits)


class CacheMachine(RuleBasedStateMachine):
    page_size = 1

    @initialize(policy=st.sampled_from(POLICIES), pages=st.integers(6, 40),
                mode=st.sampled_from(["shortfall", "full"]))
    def setup(self, policy, pages, mode):
        record(f"radix_page{self.page_size}")
        self.runner = KvlabRunner(pages * self.page_size, self.page_size, policy, mode=mode, check=False)
        self.model: dict[tuple, list[int]] = {}
        self.rid = 0
        self.live: list[int] = []
        self.locks: list[int] = []
        self.n_locks = 0
        self.held: list[int] = []
        self.n_held = 0

    # -- request lifecycle ----------------------------------------------------------------------
    @rule(seq=tokens)
    def admit(self, seq):
        rec = self.runner.run(["req_start", self.rid, seq])
        assert rec["hit"] == self.oracle(seq[:-1])[0]
        if rec["ok"]:
            self.live.append(self.rid)
        self.rid += 1

    @precondition(lambda self: self.live)
    @rule(data=st.data(), tok=st.integers(0, 2))
    def decode(self, data, tok):
        self.runner.run(["req_decode", data.draw(st.sampled_from(self.live)), tok])

    @precondition(lambda self: self.live)
    @rule(data=st.data(), priority=st.integers(0, 2))
    def finish(self, data, priority):
        rid = data.draw(st.sampled_from(self.live))
        self.live.remove(rid)
        req = self.runner.reqs[rid]
        toks, kv, ps = req["tokens"], req["kv"].tolist(), self.page_size
        rec = self.runner.run(["req_finish", rid, priority])
        assert rec["hit"] == self.oracle(toks)[0]
        for end in range(ps, align_down(len(toks), ps) + 1, ps):
            self.model.setdefault(tuple(toks[:end]), kv[end - ps : end])

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort(self, data):
        rid = data.draw(st.sampled_from(self.live))
        self.live.remove(rid)
        self.runner.run(["req_abort", rid])

    # -- raw holds, locks, matches ----------------------------------------------------------------
    @rule(pages=st.integers(1, 4))
    def hold(self, pages):
        rec = self.runner.run(["hold", pages * self.page_size])
        if rec["ok"]:
            self.held.append(self.n_held)
        self.n_held += 1

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data):
        h = data.draw(st.sampled_from(self.held))
        self.held.remove(h)
        self.runner.run(["release", h])

    @rule(seq=tokens)
    def match(self, seq):
        rec = self.runner.run(["match", seq])
        assert (rec["hit"], rec["idx"]) == self.oracle(seq)

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

    # -- eviction ---------------------------------------------------------------------------------
    @rule(n=st.integers(0, 12))
    def evict(self, n):
        before = self.runner.cache.evictable_size()
        r = self.runner.cache.evict(n)
        assert r.evicted_tokens == before - self.runner.cache.evictable_size()
        assert r.evicted_tokens >= min(n, before)  # whole leaves, until satisfied or none left

    @rule(n=st.integers(0, 60), mode=st.sampled_from(["shortfall", "full"]))
    def evict_from_tree(self, n, mode):
        cache, alloc = self.runner.cache, self.runner.alloc
        available, evictable = alloc.available_size(), cache.evictable_size()
        r = evict_from_tree_cache(cache, n, mode=mode)
        shortfall = max(0, n - available)
        requested = 0 if not shortfall else (shortfall if mode == "shortfall" else n)
        assert r == EvictResult.of(shortfall, requested, r.evicted_tokens)
        assert r.evicted_tokens == evictable - cache.evictable_size()
        assert r.evicted_tokens >= min(requested, evictable)
        if evictable >= shortfall:
            assert alloc.available_size() >= n  # the allocation now fits, in both modes
        if mode == "full" and shortfall and evictable >= n:
            assert r.over_evicted_tokens == available  # the bug's damage, exactly

    # -- oracle and invariants --------------------------------------------------------------------
    def oracle(self, seq):
        """Longest cached page-aligned prefix of ``seq`` by scanning the model, and its slots."""
        ps, hit, idx = self.page_size, 0, []
        while hit + ps <= len(seq) and tuple(seq[: hit + ps]) in self.model:
            idx += self.model[tuple(seq[: hit + ps])]
            hit += ps
        return hit, idx

    @invariant()
    def consistent(self):
        cache, alloc = self.runner.cache, self.runner.alloc
        cache.check_invariants()
        alloc.check_invariants()
        self.runner.check_conservation()
        assert cache.evictable_size() + cache.protected_size() == cache.total_size()
        assert all(n.lock_ref >= 0 for n in cache.nodes())
        # evictions drop model entries whose slots left the tree (leaves first, so it stays closed)
        cached = set(cache.all_values_flatten().tolist())
        self.model = {k: v for k, v in self.model.items() if v[0] in cached}


class PagedCacheMachine(CacheMachine):
    page_size = 4


# How many op sequences, of how many steps: tests/fuzz.py, by profile (KVLAB_FUZZ).
_health = [HealthCheck.too_slow, HealthCheck.filter_too_much]
TestCacheMachinePage1 = CacheMachine.TestCase
TestCacheMachinePage1.settings = fuzz_settings("radix_page1", suppress_health_check=_health)
TestCacheMachinePage4 = PagedCacheMachine.TestCase
TestCacheMachinePage4.settings = fuzz_settings("radix_page4", suppress_health_check=_health)
