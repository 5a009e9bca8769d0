"""Stateful property tests (hypothesis) for SWARadixCache and MambaRadixCache: any sequence of
serve (``match_alloc_insert``) / lock / unlock / evict / hold keeps every check_invariants() true and
the pools conserved."""

from fuzz import fuzz_settings, record
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvlab.mem_cache import (
    MambaPool,
    MambaRadixCache,
    SWARadixCache,
    SWATokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
    match_alloc_insert,
)
from kvlab.mem_cache.evict_policy import EvictParams

tokens = st.lists(st.integers(0, 5), min_size=1, max_size=12)


class _Machine(RuleBasedStateMachine):
    suite = ""  # tests/fuzz.py's name for the subclass

    def __init__(self):
        super().__init__()
        record(self.suite)  # hypothesis makes one machine per example
        self.locks, self.held = [], []

    @rule(i=st.integers(0, 20))
    def unlock(self, i):
        if self.locks:
            node, res = self.locks.pop(i % len(self.locks))
            self._unlock(node, res)

    @rule(n=st.integers(1, 20))
    def hold(self, n):
        out = self.alloc.alloc(n)
        if out is not None:
            self.held.append(out)

    @precondition(lambda self: self.held)
    @rule()
    def release(self):
        self.alloc.free(self.held.pop())

    @rule(seq=tokens)
    def lock(self, seq):
        m = self.cache.match_prefix(seq)
        self.locks.append((m.last_device_node, self._lock(m.last_device_node)))


class SWAMachine(_Machine):
    suite = "swa_radix"

    def __init__(self):
        super().__init__()
        self.alloc = SWATokenToKVPoolAllocator(48, 24, page_size=1)
        self.cache = SWARadixCache(self.alloc, sliding_window_size=3)

    def _lock(self, node):
        return self.cache.inc_lock_ref(node)

    def _unlock(self, node, res):
        self.cache.dec_lock_ref(node, res)

    @rule(seq=tokens)
    def serve(self, seq):
        match_alloc_insert(self.cache, seq, max_prefix_len=len(seq) - 1)

    @rule(full=st.integers(0, 10), swa=st.integers(0, 10))
    def evict(self, full, swa):
        self.cache.evict(EvictParams(num_tokens=full, swa_num_tokens=swa))

    @invariant()
    def consistent(self):
        self.cache.check_invariants()
        self.alloc.check_invariants()
        held = sum(len(h) for h in self.held)
        assert self.alloc.full_available_size() + self.cache.total_size() + held == 48
        assert self.alloc.swa_available_size() + self.cache.swa_total_size() + held == 24


class MambaMachine(_Machine):
    suite = "mamba_radix"

    def __init__(self):
        super().__init__()
        self.alloc = TokenToKVPoolAllocator(48)
        self.cache = MambaRadixCache(self.alloc, MambaPool(4))

    def _lock(self, node):
        return self.cache.inc_lock_ref(node)

    def _unlock(self, node, res):
        self.cache.dec_lock_ref(node)

    @rule(seq=tokens, mode=st.sampled_from(["shortfall", "full"]))
    def serve(self, seq, mode):
        match_alloc_insert(self.cache, seq, max_prefix_len=len(seq) - 1, mode=mode)

    @rule(full=st.integers(0, 10), states=st.integers(0, 3))
    def evict(self, full, states):
        self.cache.evict(full, mamba_num=states)

    @invariant()
    def consistent(self):
        self.cache.check_invariants()
        self.alloc.check_invariants()
        self.cache.mamba_pool.check_invariants()
        held = sum(len(h) for h in self.held)
        assert self.alloc.available_size() + self.cache.total_size() + held == 48
        assert self.cache.mamba_pool.available_size() + self.cache.mamba_total_size() == 4


# How many op sequences, of how many steps: tests/fuzz.py, by profile (KVLAB_FUZZ).
TestSWAStateful = SWAMachine.TestCase
TestSWAStateful.settings = fuzz_settings("swa_radix")
TestMambaStateful = MambaMachine.TestCase
TestMambaStateful.settings = fuzz_settings("mamba_radix")
