"""The twin test of the page engine's storage tier (L3): ``PageKV`` over a ``PageHiRadixTree`` with the storage mixin
(page keys hashed per page) against the token-level memory (``SchedulerKV`` over a ``HiRadixCache``), on the same
requests: every row, every total (the four storage totals included), the clock, the final tree at token level (its
nodes' storage keys too) and the store itself are equal, under the three prefetch policies, the three write
policies, both eviction modes, a store kept across runs, and random multi-turn workloads (hypothesis) checked after
every step."""

import random
from dataclasses import replace

import pytest
from fuzz import fuzz_settings, record
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from sim_twins import assert_same

from kvlab.mem_cache.hicache.page_hiradix import PageHiRadixTree
from kvlab.mem_cache.hicache.storage import HiCacheStorage
from kvlab.sched import SchedulerConfig, min_kv_tokens, simulate
from kvlab.sched.kv import SchedulerKV
from kvlab.sched.page_kv import PageKV

from .test_storage_sched import STORAGE_KEYS, turns

BASE = SchedulerConfig(kv_tokens=2048, page_size=64, hicache_ratio=1.0, hicache_storage_backend="file")


def twins(reqs, cfg, store=None):
    """(the token-level reference loop, the token-level fast path, the page engine, checked every step)."""
    stores = [None, None, None] if store is None else [store() for _ in range(3)]
    ref = simulate(reqs, replace(cfg, fast_decode=False), progress=False, storage=stores[0])
    token = simulate(reqs, replace(cfg, page_engine=False), progress=False, storage=stores[1])
    page = simulate(reqs, replace(cfg, debug=True), progress=False, storage=stores[2])
    assert isinstance(ref.memory, SchedulerKV) and isinstance(token.memory, SchedulerKV)
    assert isinstance(page.memory, PageKV) and isinstance(page.memory.tree, PageHiRadixTree)
    for other in (token, page):
        assert_same(ref, other)  # rows, totals (the storage four among them), tree at token level, clock
        hexes = other.memory.storage.hex_keys, ref.memory.storage.hex_keys  # (keys as SGLang's hex: each store interns its own)
        assert {x.id: hexes[0](x.hash_value) for x in other.tree.nodes()} == {x.id: hexes[1](x.hash_value)
                                                                              for x in ref.tree.nodes()}
        assert other.memory.storage.keys() == ref.memory.storage.keys()  # the store, in LRU order
        ctl, ref_ctl = other.memory.tree.storage_controller, ref.memory.tree.storage_controller
        assert ctl.totals == ref_ctl.totals and ctl.now_s == ref_ctl.now_s
    return page.totals()


@pytest.mark.parametrize("prefetch", ["best_effort", "wait_complete", "timeout"])
@pytest.mark.parametrize("mode", ["shortfall", "full"])
def test_page_engine_storage_equals_the_token_level_memory(prefetch, mode):
    """Multi-turn clients whose history the device and host pools forget between turns: backups to storage,
    prefetches (landed, cut short, revoked) and storage hits all happen, and the page engine equals the token-level
    runs row by row."""
    t = twins(turns(), replace(BASE, eviction=mode, hicache_storage_prefetch_policy=prefetch))
    assert t["written_to_storage_tokens"] > 0
    if prefetch == "best_effort":
        assert t["prefetch_aborted_tokens"] > 0
    else:
        assert t["storage_hit_tokens"] > 0 and t["prefetched_tokens"] > 0


@pytest.mark.parametrize("write_policy", ["write_through_selective", "write_back"])
def test_write_policies(write_policy):
    t = twins(turns(rounds=4), replace(BASE, hicache_write_policy=write_policy,
                                       hicache_storage_prefetch_policy="wait_complete"))
    assert t["written_to_storage_tokens"] > 0


def test_a_kept_store_and_a_bounded_one():
    """A store filled by an earlier run (``/flush_cache`` between the runs), and a store too small for the run
    (the file backend's LRU evictor at work): the page engine reads and evicts the same keys."""
    reqs = turns(rounds=2)
    first = simulate(reqs, replace(BASE, page_engine=False), progress=False)
    keys = first.memory.storage.keys()

    def kept():
        store = HiCacheStorage(first.memory.storage.page_bytes)
        store.batch_set(keys)
        return store

    t = twins(reqs, replace(BASE, hicache_storage_prefetch_policy="wait_complete"), store=kept)
    assert t["storage_hit_tokens"] > 0
    small = replace(BASE, hicache_storage_prefetch_policy="wait_complete", hicache_storage_size_gb=0.5)
    twins(turns(), small)


def random_case(seed, page_size, mode, write_policy, prefetch, ratio, threshold, chunk):
    """Random multi-turn clients in a tight pool (a few pages over the longest request's need)."""
    rng = random.Random(seed)
    # (about half the examples hit storage under wait_complete: the host pool forgets between turns 5 s apart)
    reqs = turns(clients=rng.randrange(2, 7), rounds=rng.randrange(2, 5), first=rng.randrange(4, 60),
                 sub=rng.randrange(0, 20), out=rng.randrange(1, 6), gap=rng.choice([0.0, 0.001, 5.0, 5.0]), seed=seed)
    need = max(min_kv_tokens(len(r.prompt_token_ids), r.output_len, page_size) for r in reqs)
    kv = -(-need * rng.choice([1, 1.3, 2]) // page_size) * page_size
    cfg = replace(BASE, kv_tokens=int(kv), page_size=page_size, eviction=mode, hicache_ratio=ratio,
                  hicache_write_policy=write_policy, hicache_storage_prefetch_policy=prefetch,
                  prefetch_threshold=threshold, chunked_prefill_size=max(chunk, page_size), max_running=4)
    return reqs, cfg


@fuzz_settings("page_storage_twin", suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), page_size=st.sampled_from([2, 4, 8]), mode=st.sampled_from(["shortfall", "full"]),
       write_policy=st.sampled_from(["write_through", "write_through_selective", "write_back"]),
       prefetch=st.sampled_from(["best_effort", "wait_complete", "timeout"]), ratio=st.sampled_from([0.5, 1.0]),
       threshold=st.sampled_from([0, 4, 16]), chunk=st.sampled_from([16, 8192]))
def test_random_workloads_equal_the_token_level_memory(seed, page_size, mode, write_policy, prefetch, ratio,
                                                       threshold, chunk):
    """Random multi-turn clients in tight pools: the page engine with host and storage tiers, checked after every
    step, gives the token-level reference loop's rows, totals, tree, store and clock."""
    record("page_storage_twin")
    twins(*random_case(seed, page_size, mode, write_policy, prefetch, ratio, threshold, chunk))


@pytest.mark.parametrize("case", [(9685, 2, "full", "best_effort", 0.5, 0, 16),
                                  (7174, 4, "shortfall", "wait_complete", 0.5, 16, 16),
                                  (7530, 4, "shortfall", "wait_complete", 0.5, 0, 8192)])
def test_write_back_in_a_few_pages_with_storage_does_not_run_out(case):
    """write_back with a storage tier in a pool of a few pages: a device leaf counted evictable whose copy finds the
    host pool full of host-protected copies (this eviction's staged ones, or ones on their way to storage) waits for
    them to land and is written back, where the prefill used to fail with "Prefill out of memory" (both memories)."""
    seed, page_size, mode, prefetch, ratio, threshold, chunk = case
    t = twins(*random_case(seed, page_size, mode, "write_back", prefetch, ratio, threshold, chunk))
    assert t["written_to_storage_tokens"] > 0


def test_storage_totals_are_in_the_rows_of_the_page_engine():
    t = twins(turns(rounds=2), replace(BASE, hicache_storage_prefetch_policy="wait_complete"))
    assert set(STORAGE_KEYS) <= set(t)


def test_a_storage_run_on_the_page_engine_imports_no_torch():
    """``kvlab simulate --json`` with host and storage tiers runs on counts: torch is never imported."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, io, contextlib\nfrom kvlab.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    rc = main(['simulate', '--workload', 'multi-turn-chat', '--page-size', '16', '--kv-pages', '256',"
            " '--hicache-ratio', '2', '--hicache-storage-backend', 'file', '--json'])\n"
            "assert not rc, rc\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2], check=True)
    assert out.stdout.strip() == "False", out.stderr
