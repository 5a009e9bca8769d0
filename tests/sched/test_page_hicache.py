"""The twin test of the page engine's host tier: ``PageKV`` over a ``PageHiRadixTree`` (page ids and counts, no slot
tensors) against the token-level memory (``SchedulerKV`` over a ``HiRadixCache`` and a host pool of slots), on the
same requests: every row, every total (the host tier's traffic included), the clock and the final tree at token
level are equal, under the three write policies, both eviction modes, a host pool sized by ratio and by size, a
Mooncake trace with 512-token pages, and random workloads (hypothesis) checked after every step."""

import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from fuzz import fuzz_settings, record
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from sim_twins import Req, assert_same

from kvlab.mem_cache.hicache.hiradix_cache import HiRadixCache
from kvlab.mem_cache.hicache.page_hiradix import PageHiRadixTree
from kvlab.sched import SchedulerConfig, min_kv_tokens, simulate
from kvlab.sched.kv import SchedulerKV
from kvlab.sched.page_kv import PageKV

from .test_hicache_sched import BASE, HOST_KEYS, POLICIES, workload

ROOT = Path(__file__).resolve().parents[2]


def twins(reqs, cfg):
    """(the token-level reference loop, the token-level fast path, the page engine) on ``cfg``; the page engine's
    run checks every invariant after every step."""
    ref = simulate(reqs, replace(cfg, fast_decode=False), progress=False)
    token = simulate(reqs, replace(cfg, page_engine=False), progress=False)
    page = simulate(reqs, replace(cfg, debug=True), progress=False)
    assert isinstance(ref.memory, SchedulerKV) and isinstance(token.memory, SchedulerKV)
    assert isinstance(page.memory, PageKV) and isinstance(page.memory.tree, PageHiRadixTree)
    return ref, token, page


def assert_twins(ref, token, page):
    for other in (token, page):
        assert_same(ref, other)  # rows, totals, tree (token level), clock
    assert isinstance(page.tree, HiRadixCache)
    frames = [r.steps_frame() for r in (ref, page)]
    for key in HOST_KEYS:  # the host tier's traffic, step by step
        assert frames[0][key].tolist() == frames[1][key].tolist(), key
    # and as the copy clock counted it: tokens and seconds each way, write-back waits, copies refused for room
    ref_ctl, page_ctl = ref.tree.cache_controller, page.memory.tree.cache_controller
    assert page_ctl.totals == ref_ctl.totals and page_ctl.now_s == ref_ctl.now_s
    assert page.tree.cache_controller.totals == ref_ctl.totals
    assert not page_ctl.in_flight()  # the run's copies all landed (drained at the end)


SIZES = {"ratio": {"hicache_ratio": 1.5}, "size": {"hicache_size_gib": 0.09}}  # 0.09 GiB: 737 tokens of 131,072 B


@pytest.mark.parametrize("sizing", sorted(SIZES))
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("mode", ["shortfall", "full"])
def test_page_engine_host_tier_equals_the_token_level_memory(mode, policy, sizing):
    """Six groups of shared system prompts in a device pool too small for them and a host pool of ~1.5 times it:
    backups, demotions, host evictions and load-backs all happen, and the page engine's run equals the token-level
    runs row by row."""
    cfg = replace(BASE, eviction=mode, hicache_write_policy=policy, **SIZES[sizing])
    ref, token, page = twins(workload(), cfg)
    assert_twins(ref, token, page)
    t = page.totals()
    assert t["host_hit_tokens"] > 0 and t["written_to_host_tokens"] > 0 and t["host_evicted_tokens"] > 0
    assert t["loaded_back_tokens"] >= t["host_hit_tokens"] and t["transfer_s"] > 0


@pytest.mark.parametrize("policy,mode", [("write_through", "shortfall"), ("write_through_selective", "full"),
                                         ("write_back", "shortfall")])
def test_mooncake_trace_with_512_token_pages(policy, mode):
    """The Mooncake sample (page 512, 100 device pages, host ratio 2): the engine's shapes at real page size."""
    from kvlab.workloads.mooncake import load_trace

    reqs = load_trace(ROOT / "data/traces/mooncake_small.jsonl")
    cfg = SchedulerConfig(kv_tokens=100 * 512, page_size=512, max_running=16, eviction=mode, hicache_ratio=2,
                          hicache_write_policy=policy)
    ref, token, page = twins(reqs, cfg)
    assert_twins(ref, token, page)
    assert page.totals()["host_hit_tokens"] > 0


@fuzz_settings("page_hicache_twin", suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), page_size=st.sampled_from([2, 3, 4, 8]),
       mode=st.sampled_from(["shortfall", "full"]), write_policy=st.sampled_from(POLICIES),
       policy=st.sampled_from(["lru", "lfu", "fifo", "mru", "filo", "priority"]), max_running=st.integers(1, 6),
       chunk=st.sampled_from([8, 32, 8192]), ratio=st.sampled_from([0.5, 1.0, 2.0, 4.0]))
def test_random_workloads_equal_the_token_level_memory(seed, page_size, mode, write_policy, policy, max_running, chunk,
                                                       ratio):
    """Random groups of shared prefixes in tight pools (retractions, evictions, chunked prefill, a host pool from
    half to four times the device pool): the page engine with its host tier, checked after every step, gives the
    token-level reference loop's rows, totals, tree and clock."""
    record("page_hicache_twin")
    rng = random.Random(seed)
    reqs = []
    for g in range(rng.randrange(1, 6)):  # (about half the examples hit on host and load back)
        prefix = tuple(rng.randrange(1, 20) for _ in range(rng.randrange(1, 40)))
        for i in range(rng.randrange(1, 10)):
            tail = tuple(rng.randrange(1, 20) for _ in range(rng.randrange(1, 15)))
            reqs.append(Req(f"{g}-{i}", rng.random() * 0.05, prefix + tail, rng.randrange(1, 40)))
    need = max(min_kv_tokens(len(r.prompt_token_ids), r.output_len, page_size) for r in reqs)
    kv = -(-need * rng.choice([1, 1.3, 2]) // page_size) * page_size
    cfg = SchedulerConfig(kv_tokens=int(kv), page_size=page_size, eviction=mode, policy=policy, debug=True,
                          max_running=max_running, chunked_prefill_size=max(chunk, page_size), hicache_ratio=ratio,
                          hicache_write_policy=write_policy)
    ref = simulate(reqs, replace(cfg, fast_decode=False, debug=False), progress=False)
    page = simulate(reqs, cfg, progress=False)
    assert isinstance(page.memory, PageKV)
    assert_same(ref, page)


@pytest.mark.parametrize("flags", [["--hicache-ratio", "1.5"],
                                   ["--hicache-size", "0.2", "--hicache-write-policy", "write_back", "--eviction", "full"]])
def test_cli_json_with_a_host_tier_is_the_token_level_memorys(capsys, flags):
    """``kvlab simulate --json`` with a host tier (the page engine) prints the totals of the token-level memory."""
    from kvlab.cli import main
    from kvlab.sweep.point import load_requests

    assert not main(["simulate", "--workload", "multi-turn-chat", "--page-size", "16", "--kv-pages", "150", *flags,
                     "--json"])
    printed = json.loads(capsys.readouterr().out)
    given = dict(zip(flags[::2], flags[1::2]))
    cfg = SchedulerConfig(kv_tokens=150 * 16, page_size=16, page_engine=False,
                          eviction=given.get("--eviction", "shortfall"),
                          hicache_ratio=float(given["--hicache-ratio"]) if "--hicache-ratio" in given else None,
                          hicache_size_gib=float(given["--hicache-size"]) if "--hicache-size" in given else None,
                          hicache_write_policy=given.get("--hicache-write-policy", "write_through"))
    token = simulate(load_requests(workload="multi-turn-chat", trace=None, seed=0, overrides={}), cfg, progress=False)
    assert printed == json.loads(json.dumps(token.totals()))
    assert printed["host_hit_tokens"] > 0


def test_a_host_tier_run_on_the_page_engine_imports_no_torch():
    """``kvlab simulate --json`` with a host tier runs on counts: torch is never imported."""
    code = ("import sys, io, contextlib\nfrom kvlab.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    rc = main(['simulate', '--workload', 'multi-turn-chat', '--page-size', '16', '--kv-pages', '256',"
            " '--hicache-ratio', '2', '--json'])\n"
            "assert not rc, rc\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False", out.stderr


# ---- the pool bound: 2^26 tokens for the token-level memory, 2^40 for the page engine (counts, not tables) --------

def test_the_page_engine_takes_a_pool_beyond_the_token_level_bound(capsys):
    """An unlimited cache, asked of the page engine: a pool of 2^40 tokens runs (with and without a host tier) and
    hits what a pool big enough to never evict hits; its tree is readable at token level. The token-level memory
    keeps its 2^26 bound, and beyond 2^40 is refused with exit 2 naming the flag."""
    from kvlab.cli import main
    from kvlab.sched.config import MAX_PAGE_ENGINE_POOL_TOKENS, MAX_POOL_TOKENS

    args = ["simulate", "--workload", "few-shot", "--page-size", "64", "--json"]
    assert main([*args, "--kv-tokens", str(MAX_PAGE_ENGINE_POOL_TOKENS)]) in (0, None)
    huge = json.loads(capsys.readouterr().out)
    assert main([*args, "--kv-tokens", str(MAX_POOL_TOKENS)]) in (0, None)
    roomy = json.loads(capsys.readouterr().out)
    assert huge["evicted_tokens"] == roomy["evicted_tokens"] == 0
    assert huge["cached_prompt_tokens"] == roomy["cached_prompt_tokens"] > 0
    assert main([*args, "--kv-tokens", str(MAX_PAGE_ENGINE_POOL_TOKENS), "--hicache-ratio", "2"]) in (0, None)
    assert json.loads(capsys.readouterr().out)["cached_prompt_tokens"] == huge["cached_prompt_tokens"]
    reqs = workload()
    for extra in ({}, {"hicache_ratio": 2.0}):
        res = simulate(reqs, SchedulerConfig(kv_tokens=MAX_PAGE_ENGINE_POOL_TOKENS, page_size=4, **extra),
                       progress=False)
        res.tree.check_invariants()
        assert res.tree.total_size() > 0
    for argv, named in ((["--kv-tokens", str(MAX_PAGE_ENGINE_POOL_TOKENS + 64)], "--kv-tokens"),
                        (["--kv-pages", str(MAX_PAGE_ENGINE_POOL_TOKENS // 32)], "--kv-pages"),
                        (["--page-size", "1", "--kv-tokens", str(MAX_POOL_TOKENS + 1)], "at most 67,108,864")):
        with pytest.raises(SystemExit) as exit_:
            code = main([*args, *argv])
            raise SystemExit(code)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert named in err and "Traceback" not in err, err
    with pytest.raises(ValueError, match="2\\^26"):  # the token-level memory at page size > 1 (the reference loop)
        SchedulerConfig(kv_tokens=MAX_POOL_TOKENS + 4, page_size=4, fast_decode=False)
    assert SchedulerConfig(kv_tokens=MAX_POOL_TOKENS + 4, page_size=4).counts_only
