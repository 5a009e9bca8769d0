"""The closed loop of bench_multiturn.py (kvlab.sched.arrivals.ClientArrivals) in the scheduler: a client's rounds in
order, each sent only after the previous response; never more than max_parallel in flight; the round barrier; the
fast path's bulk quiet rounds stopping where a finish releases a request (the same records as the reference loop)."""

from __future__ import annotations

from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from kvlab.sched import SchedulerConfig, simulate
from kvlab.sched.arrivals import BARRIER_PAUSE_S, ClosedLoop, round_metrics
from kvlab.sweep.point import closed_loop_options
from kvlab.workloads import make_workload
from tests.fuzz import fuzz_settings, record


def _run(seed=0, page_size=16, kv_tokens=8192, fast=True, host=None, **params):
    reqs = make_workload("multiturn", seed=seed, **params)
    cfg = SchedulerConfig(kv_tokens=kv_tokens, page_size=page_size, fast_decode=fast, hicache_ratio=host,
                          **closed_loop_options(reqs, seed))
    return reqs, simulate(reqs, cfg)


def _check_closed_loop(reqs, result, max_parallel, barrier):
    records = result.records
    assert sorted(r.rid for r in records) == sorted(r.rid for r in reqs)  # every request answered once
    by_client = {}
    for rec in records:
        by_client.setdefault(rec.client, []).append(rec)
        assert rec.arrival_s <= rec.first_token_s <= rec.finish_s
    for recs in by_client.values():
        recs.sort(key=lambda r: r.round)
        for prev, nxt in zip(recs, recs[1:]):
            assert nxt.arrival_s >= prev.finish_s  # sent only after the previous response
    for rec in records:  # right after each send: what is in flight (sent by then, not yet answered)
        in_flight = sum(1 for o in records if o.arrival_s <= rec.arrival_s < o.finish_s)
        assert in_flight <= max_parallel
    if barrier:
        rounds = sorted({r.round for r in records})
        for r in rounds[1:]:
            done = max(o.finish_s for o in records if o.round == r - 1)
            assert min(o.arrival_s for o in records if o.round == r) >= done + BARRIER_PAUSE_S


@fuzz_settings("closed_loop", deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clients=st.integers(1, 6), rounds=st.integers(1, 4), length=st.integers(1, 80), sub=st.integers(0, 40),
       out=st.integers(1, 40), max_parallel=st.integers(1, 5), rate=st.sampled_from([0.5, 4.0, 100.0]),
       policy=st.sampled_from(["random", "fifo"]), barrier=st.booleans(), page=st.sampled_from([1, 4, 16]),
       seed=st.integers(0, 3), consecutive=st.booleans(), host=st.sampled_from([None, 2.0]))
def test_closed_loop_properties(clients, rounds, length, sub, out, max_parallel, rate, policy, barrier, page, seed,
                                consecutive, host):
    """(``host``: with HiCache's host tier, whose copies may hold the loop idle until one lands or a request
    arrives.)"""
    record("closed_loop")
    params = dict(num_clients=clients, num_rounds=rounds, request_length=length, sub_question_input_length=sub,
                  output_length=out, max_parallel=max_parallel, request_rate=rate, ready_queue_policy=policy,
                  enable_round_barrier=barrier, disable_random_sample=consecutive)
    reqs, fast = _run(seed, page, 1024, True, host, **params)
    _check_closed_loop(reqs, fast, max_parallel, barrier)
    _, reference = _run(seed, page, 1024, False, host, **params)
    assert fast.records == reference.records  # the bulk quiet rounds stop where a finish releases a request
    assert fast.totals() == reference.totals()


def test_fifo_one_at_a_time_is_a_chain():
    """max_parallel 1, fifo: each request is sent at a sender wake after the previous response, clients in turn."""
    reqs, result = _run(num_clients=3, num_rounds=2, request_length=32, output_length=8, max_parallel=1,
                        ready_queue_policy="fifo", request_rate=1000.0)
    order = sorted(result.records, key=lambda r: r.arrival_s)
    assert [r.rid for r in order[:3]] == ["mt-0-0", "mt-1-0", "mt-2-0"]  # fifo: the initial queue's order
    for prev, nxt in zip(order, order[1:]):
        assert nxt.arrival_s >= prev.finish_s


def test_ttft_and_cached_tokens_per_request():
    """TTFT is the first token's time less the send; cached tokens are the page-aligned reused prefix."""
    _, result = _run(num_clients=2, num_rounds=3, request_length=100, output_length=5, enable_round_barrier=True,
                     disable_random_sample=True, page_size=16)
    for rec in result.records:
        prev_prompt = 100 + (rec.round - 1) * 105
        assert rec.cached_tokens == (0 if rec.round == 0 else (prev_prompt + 5 - 1) // 16 * 16)
        assert rec.ttft_s > 0 and rec.finish_s > rec.first_token_s  # 5 tokens: 4 decode rounds after the first
    rows = round_metrics(result.records)
    assert [r.requests for r in rows] == [2, 2, 2]
    assert rows[1].cache_hit_rate == 2 * 96 / (2 * 205)


def test_static_runs_keep_their_arrival_times():
    """Without a closed loop, requests arrive at their own times (the records say so)."""
    reqs = make_workload("multi-turn-chat", num_sessions=3, turns=2, request_rate=2.0)
    result = simulate(reqs, SchedulerConfig(kv_tokens=16384, page_size=4))
    assert {r.rid: r.arrival_s for r in result.records} == {r.rid: r.arrival_time_s for r in reqs}


def test_closed_loop_settings_are_checked():
    import pytest

    for bad in (dict(max_parallel=0), dict(request_rate=0), dict(ready_queue_policy="lifo"),
                dict(enable_round_barrier=1)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ClosedLoop(**bad)
