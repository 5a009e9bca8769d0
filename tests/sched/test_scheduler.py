"""The scheduler simulator over real pools and the radix cache: both eviction modes, invariants, bad input."""

import random

import pytest
from fuzz import fuzz_settings, record
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from sim_twins import Req

from kvlab.sched import SchedulerConfig, simulate


def shared_prefix(groups, per, sys_len, q_len, out, seed=0):
    rng = random.Random(seed)
    systems = [tuple(rng.randrange(1, 32000) for _ in range(sys_len)) for _ in range(groups)]
    reqs = [Req(f"g{g}-{i}", 0.0, systems[g] + tuple(rng.randrange(1, 32000) for _ in range(q_len)), out)
            for g in range(groups) for i in range(per)]
    rng.shuffle(reqs)
    return reqs


@pytest.fixture(scope="module")
def both_modes():
    reqs = shared_prefix(16, 8, 2048, 128, 256)
    return {mode: simulate(reqs, SchedulerConfig(kv_tokens=20_000, eviction=mode, max_running=32), progress=False)
            for mode in ("shortfall", "full")}


def test_full_eviction_over_evicts_and_loses_hits(both_modes):
    fix, bug = both_modes["shortfall"].totals(), both_modes["full"].totals()
    assert fix["over_evicted_tokens"] == 0
    assert bug["over_evicted_tokens"] > 0
    assert bug["hit_rate"] < fix["hit_rate"]
    assert bug["prefill_tokens_computed"] > fix["prefill_tokens_computed"]
    for t in (fix, bug):
        assert t["requests"] == 128 and t["output_tokens"] == 128 * 256


def test_step_frame_adds_up(both_modes):
    res = both_modes["full"]
    frame = res.steps_frame()
    assert frame["over_evicted_tokens"].sum() == res.counts.over_evicted_tokens
    assert frame["evicted_tokens"].sum() == res.counts.evicted_tokens
    assert frame["hit_tokens"].sum() == res.counts.cached_prompt_tokens
    assert frame["finished"].sum() == 128
    assert (frame["available_tokens"] + frame["evictable_tokens"] + frame["protected_tokens"] <= 20_000).all()


def test_max_running_one_replays_one_at_a_time():
    reqs = shared_prefix(3, 3, 64, 16, 8)
    res = simulate(reqs, SchedulerConfig(kv_tokens=4096, max_running=1), progress=False)
    assert res.steps_frame()["running"].max() <= 1
    # one group's later requests hit its system prompt: at least (3 groups × 2 repeats) × 64 tokens
    assert res.counts.cached_prompt_tokens >= 6 * 64


@fuzz_settings("scheduler", suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    page_size=st.sampled_from([1, 4]),
    mode=st.sampled_from(["shortfall", "full"]),
    policy=st.sampled_from(["lru", "lfu", "fifo", "mru", "filo"]),
    groups=st.integers(1, 4),
    max_running=st.integers(1, 8),
    chunk=st.sampled_from([16, 64, 8192]),
)
def test_random_workloads_keep_every_invariant(seed, page_size, mode, policy, groups, max_running, chunk):
    record("scheduler")
    rng = random.Random(seed)
    reqs = []
    for g in range(groups):
        prefix = tuple(rng.randrange(1, 50) for _ in range(rng.randrange(1, 40)))
        for i in range(rng.randrange(1, 5)):
            tail = tuple(rng.randrange(1, 50) for _ in range(rng.randrange(1, 20)))
            reqs.append(Req(f"{g}-{i}", rng.random(), prefix + tail, rng.randrange(1, 12)))
    longest = max(len(r.prompt_token_ids) + r.output_len for r in reqs)
    kv = max(64, 8 * rng.randrange(8, 40), longest + 2 * page_size + 1)  # the longest request must fit
    kv = -(-kv // page_size) * page_size
    cfg = SchedulerConfig(kv_tokens=kv, page_size=page_size, eviction=mode, policy=policy, max_running=max_running,
                          chunked_prefill_size=max(chunk, page_size), debug=True)
    res = simulate(reqs, cfg, progress=False)
    if res.counts.aborted == 0:
        assert res.counts.output_tokens == sum(r.output_len for r in reqs)
    tree, alloc = res.tree, res.tree.token_to_kv_pool_allocator
    # all requests done: every slot is either free or cached in the tree, and nothing is locked
    assert alloc.available_size() + tree.total_size() == kv
    assert tree.protected_size() == 0
    tree.check_invariants()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(kv_tokens=100, page_size=16), "kv_tokens=100 is not a multiple of page_size=16"),
        (dict(kv_tokens=64, eviction="half"), "eviction must be one of"),
        (dict(kv_tokens=0), "kv_tokens must be a positive int, got 0"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SchedulerConfig(**kwargs)


def test_a_pool_one_token_short_of_admission_is_refused_up_front():
    # page 1: 57 + 6 tokens fit a 64-token pool, but admission wants 57 + 6 + 1 < free + evictable <= 64
    reqs = [Req("edge", 0.0, tuple(range(1, 58)), 6)]
    # the message's numbers agree with the pool it refuses (issue 37: it said "needs 63 tokens" of a 64-token pool)
    with pytest.raises(ValueError, match=r"KV pool of 64 tokens is smaller than one request: 'edge' needs 65 tokens: "
                                         r"to be admitted, prompt 57 \+ output 6 \+ one page \(1\) must be less"):
        simulate(reqs, SchedulerConfig(kv_tokens=64), progress=False)
    res = simulate(reqs, SchedulerConfig(kv_tokens=65), progress=False)  # one more token: it runs
    assert res.counts.output_tokens == 6


def test_pool_smaller_than_one_request():
    reqs = [Req("big", 0.0, tuple(range(1, 200)), 10)]
    with pytest.raises(ValueError, match="smaller than one request: 'big' needs 211 tokens"):
        simulate(reqs, SchedulerConfig(kv_tokens=128), progress=False)


@pytest.mark.parametrize(("prompt", "output", "page_size"), [(1344, 1664, 64), (2062, 117, 512), (199, 10, 1),
                                                              (57, 6, 1), (3000, 9000, 64), (100, 0, 16)])
def test_the_pool_refusal_says_the_page_rounding_and_its_numbers_agree(prompt, output, page_size):
    """Issue 37: "KV pool of 3072 tokens is smaller than one request: … needs 3008 tokens". The pool named as
    needed is the smallest that runs the request, and the message shows it in pages of the page size."""
    import re

    from kvlab.sched.config import min_kv_tokens

    need = min_kv_tokens(prompt, output, page_size)
    reqs = [Req("r", 0.0, tuple(range(1, prompt + 1)), output)]
    with pytest.raises(ValueError) as refused:
        simulate(reqs, SchedulerConfig(kv_tokens=need - page_size, page_size=page_size), progress=False)
    shown = f"{need // page_size:,} pages of {page_size} = {need:,} tokens" if page_size > 1 else f"{need:,} tokens"
    assert f"'r' needs {shown}: " in str(refused.value), str(refused.value)
    numbers = [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", str(refused.value).split(": ", 1)[1])]
    assert max(numbers) == need  # no larger number than the one it asks for, none that contradicts it
    assert simulate(reqs, SchedulerConfig(kv_tokens=need, page_size=page_size), progress=False).counts.requests == 1


def test_totals_are_typed_and_the_json_keeps_its_keys(both_modes):
    """SimResult.counts is a Totals (attributes, not string keys); totals() is the JSON of docs/architecture.md#public-contracts, in the CLI's
    key order, built from it."""
    from dataclasses import fields

    from kvlab.sched import Totals

    res = both_modes["full"]
    assert isinstance(res.counts, Totals)
    assert res.counts.as_dict() == {f.name: getattr(res.counts, f.name) for f in fields(Totals)}
    t = res.totals()
    assert list(t) == ["requests", "prompt_tokens", "cached_prompt_tokens", "hit_rate", "hit_pages", "prompt_pages",
                       "evicted_tokens", "over_evicted_tokens", "overshoot_tokens", "prefill_tokens_computed",
                       "reprefill_tokens", "retractions", "aborted", "pressure_events", "steps", "output_tokens",
                       "device_hit_tokens", "host_hit_tokens", "loaded_back_tokens", "written_to_host_tokens",
                       "host_evicted_tokens", "transfer_s", "storage_hit_tokens", "prefetched_tokens", "prefetch_aborted_tokens",
                       "written_to_storage_tokens", "simulated_s", "output_tokens_per_s", "eviction", "page_size",
                       "kv_tokens", "policy"]
    counted = {k: v for k, v in res.counts.as_dict().items() if k in t}
    assert counted == {k: t[k] for k in counted} and len(counted) == len(res.counts.as_dict())
    assert t["hit_rate"] == round(res.counts.cached_prompt_tokens / res.counts.prompt_tokens, 6)


def test_components_work_outside_a_run():
    """Every counter exists from construction (a prefill scheduled or a request finished outside ``run`` used to
    raise AttributeError: the step counters first appeared inside the loop). One prefill step by hand: the batch
    is admitted with its hits noted, runs, and the requests that are not done start decoding."""
    from kvlab.sched import Scheduler

    reqs = shared_prefix(1, 3, 32, 8, 4)
    sched = Scheduler(SchedulerConfig(kv_tokens=4096), reqs)
    sched.waiting.extend(sched.arrivals.pending)
    sched.arrivals.pending.clear()
    assert (sched.ledger.step_hits, sched.ledger.step_finished, sched.ledger.totals.steps) == (0, 0, 0)
    batch = sched.prefill.schedule(sched.waiting, sched.running, None, lambda: 0.0)
    assert len(batch.reqs) == 3 and batch.chunked is None and not sched.waiting
    started = sched.prefill.run(batch)
    assert started == batch.reqs and all(len(r.output_ids) == 1 for r in started)
    assert sched.ledger.totals.prefill_tokens_computed == 3 * 40 and sched.ledger.totals.output_tokens == 3
    sched.kv.finish(started[0])
    assert sched.ledger.step_finished == 1
    sched.running.extend(started[1:])
    sched.check_invariants()


def test_totals_keys_are_declared_once(both_modes):
    """``totals()`` is keyed by TOTALS_KEYS; a sweep's columns are its RESULT_KEYS (the config keys apart)."""
    from kvlab.sched import RESULT_KEYS, TOTALS_KEYS
    from kvlab.sweep.point import TOTAL_COLUMNS

    assert list(both_modes["full"].totals()) == list(TOTALS_KEYS)
    assert TOTAL_COLUMNS == RESULT_KEYS == TOTALS_KEYS[: len(RESULT_KEYS)]
    assert set(TOTALS_KEYS) - set(RESULT_KEYS) == {"eviction", "page_size", "kv_tokens", "policy"}


@pytest.mark.parametrize("collecting", [True, False])
def test_the_cyclic_collector_is_paused_for_the_loop_and_restored(monkeypatch, collecting):
    """Scheduler.run pauses gc for the loop (its rows and nodes would be rescanned by every collection) and leaves
    it as it found it, on or off; the run leaves no cyclic garbage behind (this workload makes none)."""
    import gc

    from kvlab.sched.ledger import Ledger

    seen = []
    real = Ledger.end_step

    def recording(self, *args, **kwargs):
        seen.append(gc.isenabled())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Ledger, "end_step", recording)
    reqs = shared_prefix(4, 4, 256, 32, 16)
    gc.collect()
    (gc.enable if collecting else gc.disable)()
    try:
        res = simulate(reqs, SchedulerConfig(kv_tokens=4096, max_running=8), progress=False)
        assert gc.isenabled() is collecting
    finally:
        gc.enable()
    assert seen and not any(seen)
    assert res.totals()["requests"] == 16
    assert gc.collect() == 0


def test_prefix_indices_after_caching_an_unfinished_request_are_the_rows_slots_when_read_later():
    """``cache_unfinished_req`` hands a SimReq its ``prefix_indices`` as runs (the tree path's values, then a copy
    of the partial page) concatenated only when read: read after the row has been reused, they are still the
    slots the row held right after the call (the tree's for whole pages, the request's own for the last one)."""
    import torch

    from kvlab.sched import Scheduler

    reqs = shared_prefix(2, 3, 37, 6, 4)  # 43-token prompts: whole pages of 8 and a partial one
    # the token-level memory (the reference loop's; the fast path at page size > 1 holds no slot ids)
    sched = Scheduler(SchedulerConfig(kv_tokens=4096, page_size=8, fast_decode=False), reqs)
    sched.waiting.extend(sched.arrivals.pending)
    sched.arrivals.pending.clear()
    batch = sched.prefill.schedule(sched.waiting, sched.running, None, lambda: 0.0)
    rows = sched.kv.req_to_token
    expected = {}
    real = sched.kv.tree.cache_unfinished_req

    def recording(req, chunked=False):
        real(req, chunked)
        assert "_prefix_runs" in req.__dict__  # deferred, not concatenated
        expected[req.rid] = rows[req.req_pool_idx, : len(req.fill_ids)].to(torch.int64)  # a copy

    sched.kv.tree.cache_unfinished_req = recording
    started = sched.prefill.run(batch)
    assert len(started) == 6 and len(expected) == 6
    rows.fill_(-1)  # the rows change (as a reused row would) before anyone reads prefix_indices
    for req in started:
        assert torch.equal(req.prefix_indices, expected[req.rid]), req.rid
        assert len(req.prefix_indices) == 43 and int(req.prefix_indices.min()) > 0
