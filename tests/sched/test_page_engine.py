"""The page engine (``kvlab.sched.page_kv.PageKV`` over a ``PageRadixTree``) against the token-level reference loop:
multi-turn conversations whose later prompts hit earlier outputs, debug runs that check the page accounting after
every step, which memory a configuration gets, and ``RandomOutput``'s lazy draws."""

import random
from dataclasses import dataclass, replace

import numpy as np
import pytest
from fuzz import fuzz_settings, record
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from sim_twins import Req, assert_same, run_both

from kvlab.sched import SchedulerConfig, min_kv_tokens
from kvlab.sched.kv import SchedulerKV
from kvlab.sched.page_kv import PageKV
from kvlab.sched.request import RandomOutput
from kvlab.sched.scheduler import Scheduler
from kvlab.workloads import make_workload
from kvlab.workloads.request import TokenSequence


def aligned_prompt_only_hits(reqs, page_size):
    """An upper bound on the prompt tokens a run can find cached if no output token is ever hit: per request, its
    longest common prefix with any earlier request's prompt (whole pages, at most its prompt less one token)."""
    total = 0
    ordered = sorted(reqs, key=lambda r: r.arrival_time_s)  # (stable: turn order within a session)
    prompts = [list(r.prompt_token_ids) for r in ordered]
    for i, p in enumerate(prompts):
        best = 0
        for q in prompts[:i]:
            n = 0
            lim = min(len(p) - 1, len(q))
            while n < lim and p[n] == q[n]:
                n += 1
            best = max(best, n)
        total += best // page_size * page_size
    return total


@pytest.fixture(scope="module")
def chat():
    return make_workload("multi-turn-chat", seed=3, num_sessions=5, turns=3, system_prompt_len=37, user_len=19,
                         output_len=23, think_time_s=2.0, vocab_size=500)


@pytest.mark.parametrize("mode", ["shortfall", "full"])
@pytest.mark.parametrize("page_size", [2, 4, 16])
def test_multi_turn_chat_hits_earlier_outputs_like_the_reference(chat, page_size, mode):
    """Turn k+1's prompt is turn k's prompt + output + a new message: the page engine (which reads a planned output
    only where a page key reaches into it) hits those outputs exactly as the reference loop does, in a roomy pool
    and in a tight one (evictions, retractions)."""
    assert any(r.output_token_ids is not None and r.turn > 0 for r in chat)
    longest = max(min_kv_tokens(len(r.prompt_token_ids), r.output_len, page_size) for r in chat)
    roomy = SchedulerConfig(kv_tokens=-(-4 * longest // page_size) * page_size * 4, page_size=page_size,
                            eviction=mode, max_running=8)
    ref, fast = run_both(chat, roomy)
    assert_same(ref, fast)
    bound = aligned_prompt_only_hits(chat, page_size)
    assert fast.counts.cached_prompt_tokens > bound  # only output tokens in the tree can give more
    tight = replace(roomy, kv_tokens=-(-longest * 3 // 2 // page_size) * page_size, max_running=3)
    ref, fast = run_both(chat, tight)
    assert_same(ref, fast)
    assert ref.counts.pressure_events > 0


@dataclass(frozen=True)
class ReqOut(Req):
    output_token_ids: object = None


@pytest.mark.parametrize("page_size", [2, 4, 8])
def test_the_same_tokens_stored_as_ranges_or_tuples_hit_alike(page_size):
    """Prompts spelling the same tokens as ``range`` segments (unaligned, continuing each other) or as tuples, and
    a planned output that continues a range: the page engine files equal pages under one id, so it hits exactly
    where the token-level reference does, and more than the first prompt (the later ones hit it)."""
    def seq(*segs):
        return TokenSequence.from_segments(segs)

    base = list(range(100, 100 + 5 * page_size + 3))
    reqs = [
        ReqOut("a", 0.0, seq(range(100, 103), range(103, 100 + 5 * page_size + 3)), 2 * page_size,
               output_token_ids=range(100 + 5 * page_size + 3, 100 + 7 * page_size + 3)),
        ReqOut("b", 1.0, tuple(base) + tuple(range(100 + 5 * page_size + 3, 100 + 6 * page_size + 3)) + (7,), 3),
        ReqOut("c", 2.0, seq(tuple(base[:page_size + 1]), range(base[page_size + 1], base[-1] + 1), (1, 2)), 3),
    ]
    cfg = SchedulerConfig(kv_tokens=64 * page_size, page_size=page_size, max_running=4, debug=True)
    ref, fast = run_both(reqs, cfg)
    assert_same(ref, fast)
    # b (6P + 4 tokens, the first 6P + 3 consecutive) hits whole pages of those, past a's prompt (5P + 3) into its
    # output; c (5P + 5 tokens, 5P + 3 consecutive) hits the whole pages of a's prompt
    def whole(n):
        return n // page_size * page_size

    assert whole(6 * page_size + 3) > len(base)
    assert fast.counts.cached_prompt_tokens == whole(6 * page_size + 3) + whole(5 * page_size + 3)


@pytest.mark.parametrize("page_size", [2, 4])
def test_debug_run_with_retractions_checks_the_page_accounting_every_step(page_size):
    """A tight pool that retracts: every step's invariants (the page engine's page count included) hold, and the
    rows equal the reference loop's."""
    rng = random.Random(page_size)
    shared = tuple(rng.randrange(1, 30) for _ in range(20))
    reqs = [Req(f"r{i}", i * 0.001, shared[: rng.randrange(0, 21)] + tuple(rng.randrange(1, 30)
                                                                         for _ in range(rng.randrange(2, 12))),
                rng.randrange(30, 80)) for i in range(24)]
    need = max(min_kv_tokens(len(r.prompt_token_ids), r.output_len, page_size) for r in reqs)
    cfg = SchedulerConfig(kv_tokens=-(-need * 3 // 2 // page_size) * page_size, page_size=page_size, max_running=6,
                          debug=True)
    ref, fast = run_both(reqs, cfg)
    assert_same(ref, fast)
    assert fast.counts.retractions > 0 and fast.counts.pressure_events > 0


@fuzz_settings("page_engine_debug", suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), page_size=st.sampled_from([2, 3, 4, 8]), mode=st.sampled_from(["shortfall",
                                                                                                   "full"]),
       policy=st.sampled_from(["lru", "lfu", "fifo", "mru", "filo", "priority"]), max_running=st.integers(1, 6),
       chunk=st.sampled_from([8, 32, 8192]))
def test_random_debug_runs_on_the_page_engine(seed, page_size, mode, policy, max_running, chunk):
    """Small random workloads in tight pools (retractions, evictions, chunked prefill), ``debug=True``: invariants
    after every step on the page engine, and the same rows, totals and tree as the reference loop."""
    record("page_engine_debug")
    rng = random.Random(seed)
    reqs = []
    for g in range(rng.randrange(1, 4)):
        prefix = tuple(rng.randrange(1, 20) for _ in range(rng.randrange(1, 30)))
        for i in range(rng.randrange(1, 6)):
            tail = tuple(rng.randrange(1, 20) for _ in range(rng.randrange(1, 15)))
            reqs.append(Req(f"{g}-{i}", rng.random() * 0.02, prefix + tail, rng.randrange(1, 40)))
    need = max(min_kv_tokens(len(r.prompt_token_ids), r.output_len, page_size) for r in reqs)
    kv = -(-need * rng.choice([1, 1.3, 2]) // page_size) * page_size
    cfg = SchedulerConfig(kv_tokens=int(kv), page_size=page_size, eviction=mode, policy=policy, debug=True,
                          max_running=max_running, chunked_prefill_size=max(chunk, page_size))
    ref, fast = run_both(reqs, cfg)
    assert_same(ref, fast)


def test_the_configuration_picks_the_memory():
    reqs = [Req("a", 0.0, (1, 2, 3, 4, 5), 3)]
    cfg = SchedulerConfig(kv_tokens=256, page_size=4)
    assert cfg.fast_decode  # the default
    assert type(Scheduler(cfg, reqs).kv) is PageKV
    assert type(Scheduler(replace(cfg, fast_decode=False), reqs).kv) is SchedulerKV
    assert type(Scheduler(replace(cfg, hicache_ratio=2), reqs).kv) is PageKV  # (with its two-tier tree)
    assert type(Scheduler(replace(cfg, hicache_ratio=2, page_engine=False), reqs).kv) is SchedulerKV
    assert type(Scheduler(replace(cfg, page_size=1), reqs).kv) is SchedulerKV


def full_draw(seed, n):
    return ((np.frombuffer(random.Random(seed).randbytes(4 * n), dtype=np.uint32) >> 2) | 1).tolist()


@fuzz_settings("random_output")
@given(n=st.integers(1, 300), seed=st.text(max_size=8), reads=st.lists(st.one_of(
    st.integers(-320, 320),
    st.builds(slice, st.none() | st.integers(-320, 320), st.none() | st.integers(-320, 320),
              st.none() | st.integers(-7, 7).filter(bool))), max_size=8))
def test_random_output_reads_equal_a_full_draw(n, seed, reads):
    """Any reads, in any order (ints, negative ints, slices of any step): the values of the full draw, and the
    same IndexError out of range, however far earlier reads drew."""
    record("random_output")
    out, full = RandomOutput(seed, n), full_draw(seed, n)
    assert len(out) == n
    for r in reads:
        if isinstance(r, int) and not -n <= r < n:
            with pytest.raises(IndexError):
                out[r]
            continue
        assert out[r] == full[r]
    assert list(out[:]) == full and out[-1] == full[-1]
