"""The event-driven decode path (``fast_decode=True``) against the plain step-by-step loop: every step row,
every total and the final tree must be identical, on the shipped Mooncake trace at block granularity and on
random workloads (retractions, chunked prefill, every policy, both eviction modes)."""

import random
from array import array
from dataclasses import replace
from pathlib import Path

import pytest
from fuzz import fuzz_settings, record
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from sim_twins import Req, assert_same, run_both

from kvlab.sched import SchedulerConfig, min_kv_tokens, simulate
from kvlab.sched.result import QuietRun
from kvlab.workloads.mooncake import CONVERSATION_TRACE_SHAPE, generate_trace, load_trace, records_to_requests

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["shortfall", "full"])
@pytest.mark.parametrize("pages,max_running", [(64, 64), (200, 256)])
def test_mooncake_trace_at_block_granularity(mode, pages, max_running):
    reqs = load_trace(ROOT / "data/traces/mooncake_small.jsonl")
    longest = max(r.prompt_len + r.output_len for r in reqs)
    pages = max(pages, -(-2 * longest // 512))  # at least two of the longest request
    cfg = SchedulerConfig(kv_tokens=pages * 512, page_size=512, eviction=mode, max_running=max_running)
    plain, fast = run_both(reqs, cfg)
    assert_same(plain, fast)
    assert plain.counts.pressure_events > 0
    if max_running == 64:  # the tight pool retracts, so the fallback to the plain round is exercised too
        assert plain.counts.retractions > 0


@pytest.fixture(scope="module")
def conversation_requests():
    """The first 160 requests of a trace shaped like Mooncake's conversation trace (benchmarks/bench_fast_decode.py
    runs all 12,031): prompts up to ~100k tokens, 512-token blocks shared by roots and earlier turns."""
    return records_to_requests(generate_trace(160, **CONVERSATION_TRACE_SHAPE))


@pytest.mark.parametrize("mode", ["shortfall", "full"])
def test_conversation_shaped_trace_same_totals_as_the_reference_loop(conversation_requests, mode):
    """Issue 16's settings (page 512, 16 running) with the pool cut to 1.1 times what the longest request needs
    alone, so the run evicts, over-evicts in the full mode, and retracts: every row and total identical."""
    reqs = conversation_requests
    need = max(min_kv_tokens(r.prompt_len, r.output_len, 512) for r in reqs)
    cfg = SchedulerConfig(kv_tokens=-(-int(1.1 * need) // 512) * 512, page_size=512, eviction=mode, max_running=16)
    plain, fast = run_both(reqs, cfg)
    assert_same(plain, fast)
    # the fast path wrote its quiet decode steps as QuietRun records, expanded into those same rows on reading
    quiet = [e for e in fast.step_log if type(e) is QuietRun]
    assert quiet and len(fast.step_log) + sum(e.steps - 1 for e in quiet) == len(plain.rows)
    assert not any(type(e) is QuietRun for e in plain.step_log)  # the reference loop writes a row per step
    assert plain.counts.pressure_events > 0 and plain.counts.retractions > 0
    assert (plain.counts.over_evicted_tokens > 0) == (mode == "full")


@fuzz_settings("fast_decode", suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    page_size=st.sampled_from([2, 4, 8]),
    mode=st.sampled_from(["shortfall", "full"]),
    policy=st.sampled_from(["lru", "lfu", "fifo", "mru", "filo", "priority"]),
    groups=st.integers(1, 5),
    max_running=st.integers(1, 10),
    chunk=st.sampled_from([16, 64, 8192]),
    long_outputs=st.booleans(),
    host=st.sampled_from([None, (1.5, "write_through"), (4, "write_back"), (2, "write_through_selective")]),
)
def test_random_workloads_match_the_plain_loop(seed, page_size, mode, policy, groups, max_running, chunk,
                                               long_outputs, host):
    """... with HiCache's host tier too (``host``: ratio and write policy, or None): the fast rounds stop where a
    copy lands, as the loop's per-step poll would see it."""
    record("fast_decode")
    rng = random.Random(seed)
    reqs = []
    for g in range(groups):
        prefix = tuple(rng.randrange(1, 50) for _ in range(rng.randrange(1, 40)))
        for i in range(rng.randrange(1, 6)):
            tail = tuple(rng.randrange(1, 50) for _ in range(rng.randrange(1, 20)))
            out = rng.randrange(1, 60 if long_outputs else 12)
            reqs.append(Req(f"{g}-{i}", rng.random() * 0.05, prefix + tail, out))
    longest = max(len(r.prompt_token_ids) + r.output_len for r in reqs)
    kv = max(8 * rng.randrange(8, 40), longest + 3 * page_size) // page_size * page_size + page_size
    cfg = SchedulerConfig(kv_tokens=kv, page_size=page_size, eviction=mode, policy=policy, max_running=max_running,
                          chunked_prefill_size=max(chunk, page_size))
    if host:
        cfg = replace(cfg, hicache_ratio=host[0], hicache_write_policy=host[1])
    plain, fast = run_both(reqs, cfg)
    assert_same(plain, fast)


def test_clipped_outputs_count_the_clip_until_they_fall_under_it(monkeypatch):
    """Outputs longer than CLIP_MAX_NEW_TOKENS enter the prefill budget's offset clipped; the fast path
    tracks when each falls under the clip. A small clip makes that happen within a short run."""
    import kvlab.sched.config as sched_config

    monkeypatch.setattr(sched_config, "CLIP_MAX_NEW_TOKENS", 5)
    rng = random.Random(3)
    reqs = [Req(f"r{i}", i * 0.01, tuple(rng.randrange(1, 40) for _ in range(rng.randrange(4, 30))),
                rng.randrange(1, 30)) for i in range(30)]
    cfg = SchedulerConfig(kv_tokens=160, page_size=4, max_running=6)
    plain, fast = run_both(reqs, cfg)
    assert_same(plain, fast)


def test_both_paths_ask_for_the_same_prefix_matches(monkeypatch):
    """The fast path asks for every match the reference loop asks for (same tokens, same order; the quiet steps
    in which a waiting head is turned down again ask for theirs in bulk, ``SchedulerKV.replay_matches_of``), so a
    side effect added to the walk reaches both; it walks the tree for fewer of them: a waiting request matched
    again while the tree's structure is unchanged is replayed, and the rows, tree and clock stay identical
    (``assert_same``). The fast path runs on the page engine (``PageKV`` over a ``PageRadixTree``), the reference
    loop on the token-level memory (``SchedulerKV`` over a ``RadixCache``)."""
    from kvlab.mem_cache.page_tree import PageRadixTree
    from kvlab.mem_cache.radix_cache import RadixCache
    from kvlab.sched.kv import SchedulerKV
    from kvlab.sched.page_kv import PageKV

    asked: list = []
    walked: list = []

    def tokens(req):  # (the page engine emits placeholders: its planned tokens are in its PageState)
        out = req.page.output_tokens[: len(req.output_ids)] if req.page is not None else req.output_ids
        return bytes(array("q", list(req.prompt) + list(out)))

    for memory, tree in ((SchedulerKV, RadixCache), (PageKV, PageRadixTree)):
        real_match, real_walk, real_replays = memory.match, tree.match_prefix, memory.replay_matches_of

        def asking(self, req, real_match=real_match):
            asked.append(tokens(req))
            return real_match(self, req)

        def replaying(self, req, times, real_replays=real_replays):  # the quiet steps' checks, replayed in bulk
            asked.extend([tokens(req)] * times)
            return real_replays(self, req, times)

        def walking(self, *key, real_walk=real_walk):
            walked.append(key)
            return real_walk(self, *key)

        monkeypatch.setattr(memory, "match", asking)
        monkeypatch.setattr(memory, "replay_matches_of", replaying)
        monkeypatch.setattr(tree, "match_prefix", walking)
    reqs = load_trace(ROOT / "data/traces/mooncake_small.jsonl")
    longest = max(r.prompt_len + r.output_len for r in reqs)
    cfg = SchedulerConfig(kv_tokens=max(64, -(-2 * longest // 512)) * 512, page_size=512, max_running=64)
    seen, results = {}, {}
    for fast in (False, True):
        asked.clear()
        walked.clear()
        results[fast] = simulate(reqs, replace(cfg, fast_decode=fast), progress=False)
        seen[fast] = (list(asked), len(walked))
    assert seen[True][0] == seen[False][0]
    assert len(seen[False][0]) > len(reqs)  # waiting heads are matched again while they wait
    assert seen[False][1] == len(seen[False][0])  # the reference loop walks the tree for every one
    assert seen[True][1] < seen[False][1]  # the fast path replays some
    assert_same(results[False], results[True])


@pytest.mark.parametrize("clip,page_size,max_running,pages,prompt,output", [
    (3, 4, 4, 24, 40, 30), (12, 4, 2, 24, 40, 30), (12, 8, 4, 48, 120, 100), (4096, 4, 4, 24, 40, 30)])
def test_blocked_waiting_head_quiet_steps_match_the_plain_loop(monkeypatch, clip, page_size, max_running, pages,
                                                               prompt, output):
    """Long outputs in a tight pool: the waiting head is turned down for the budget for many steps in a row, and the
    fast path runs those steps in bulk (``FastDecode.quiet_steps(blocked=...)``), stopping before the check that
    admits it (the new-token ratio decays each round) and before an output falls under the clip (a small clip makes
    that happen inside such runs). Every row, the tree and its clock equal the reference loop's, in both modes."""
    import kvlab.sched.config as sched_config
    from kvlab.sched.fast_decode import FastDecode

    monkeypatch.setattr(sched_config, "CLIP_MAX_NEW_TOKENS", clip)
    bulk = []
    real = FastDecode.quiet_steps

    def counting(self, running, waiting, until_s, max_steps, blocked=None):
        steps = real(self, running, waiting, until_s, max_steps, blocked)
        if blocked is not None:
            bulk.append(steps)
        return steps

    monkeypatch.setattr(FastDecode, "quiet_steps", counting)
    for seed in range(3):
        rng = random.Random(seed)
        shared = tuple(rng.randrange(1, 40) for _ in range(prompt // 2))
        reqs = [Req(f"r{i}", i * 0.002, shared[: rng.randrange(0, len(shared))]
                    + tuple(rng.randrange(1, 40) for _ in range(rng.randrange(4, prompt))),
                    rng.randrange(output // 4, output)) for i in range(40)]
        cfg = SchedulerConfig(kv_tokens=pages * page_size, page_size=page_size, max_running=max_running,
                              eviction=("shortfall", "full")[seed % 2])
        plain, fast = run_both(reqs, cfg)
        assert_same(plain, fast)
    assert sum(bulk) > 0  # the bulk path ran


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_a_match_walks_the_input_capped_one_short_whatever_key_it_passes(monkeypatch, page_size):
    """``SchedulerKV.match`` passes all of ``fill_ids`` (no copy) when that truncates to the same whole pages as
    SGLang's key, ``fill_ids[:len - 1]`` page-aligned: every walk covers exactly that key's pages, and at page
    size > 1 the shortcut is taken (a prompt that does not end at a page end)."""
    from kvlab.mem_cache.radix_cache import RadixCache
    from kvlab.sched.kv import SchedulerKV
    from kvlab.units import align_down

    keys, caps = [], []
    real_walk, real_match = RadixCache.match_prefix, SchedulerKV.match

    def walk(self, key):
        keys.append(len(key))
        return real_walk(self, key)

    def match(self, req):
        real_match(self, req)
        caps.append(align_down(len(req.fill_ids) - 1, page_size))

    monkeypatch.setattr(RadixCache, "match_prefix", walk)
    monkeypatch.setattr(SchedulerKV, "match", match)
    rng = random.Random(page_size)
    reqs = [Req(f"r{i}", i * 0.01, tuple(rng.randrange(1, 9) for _ in range(rng.randrange(2, 70))), 3)
            for i in range(40)]
    cfg = SchedulerConfig(kv_tokens=4096, page_size=page_size, max_running=8, fast_decode=False)  # walks every match
    simulate(reqs, cfg, progress=False)
    assert len(keys) == len(caps) >= 40
    assert [align_down(n, page_size) for n in keys] == caps  # the pages each walk covers
    assert any(n > cap for n, cap in zip(keys, caps)) == (page_size > 1)  # fill_ids itself, not a slice
