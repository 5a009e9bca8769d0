"""The scheduler with HiCache's host tier (``SchedulerConfig.hicache_ratio`` / ``hicache_size_gib``): invariants
every step, the event-driven decode rounds equal to the reference loop, the device-only run unchanged, host hits
on a shared-prefix workload, the write policies' traffic, both eviction modes with a full host tier, the cost
model's transfer time and the CLI flags."""

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
from sim_twins import Req

from kvlab.mem_cache.hicache.hiradix_cache import HiRadixCache
from kvlab.mem_cache.tree_view import tree_frame
from kvlab.sched import CostModel, SchedulerConfig, simulate

from .simulate_cli import assert_refused, cli


def workload(seed=0, groups=6, per=6, sys_len=96, q_len=24, out=12, gap=0.02):
    """``groups`` system prompts, each asked ``per`` questions, the groups interleaved (round robin), one arrival
    every ``gap`` seconds: a device pool smaller than the groups' prefixes forgets each before it is asked again."""
    rng = random.Random(seed)
    systems = [tuple(rng.randrange(1, 30000) for _ in range(sys_len)) for _ in range(groups)]
    reqs = [Req(f"g{g}-{i}", 0.0, systems[g] + tuple(rng.randrange(1, 30000) for _ in range(q_len)), out)
            for i in range(per) for g in range(groups)]
    return [Req(r.rid, k * gap, r.prompt_token_ids, r.output_len) for k, r in enumerate(reqs)]


BASE = SchedulerConfig(kv_tokens=512, page_size=4, max_running=6)
POLICIES = ("write_through", "write_through_selective", "write_back")

# `simulate(workload(), BASE)` on main before the host tier existed (commit a6406e6), both modes: the run without
# HiCache must give exactly these totals (the host tier's six keys are new, and 0 but device_hit_tokens)
DEVICE_ONLY = {
    "shortfall": dict(requests=36, prompt_tokens=4320, cached_prompt_tokens=0, hit_rate=0.0, hit_pages=0,
                      prompt_pages=1080, evicted_tokens=4224, over_evicted_tokens=0, overshoot_tokens=2816,
                      prefill_tokens_computed=4320, reprefill_tokens=0, retractions=0, aborted=0, pressure_events=66,
                      steps=170, output_tokens=432, simulated_s=1.9878, output_tokens_per_s=217.326),
    "full": dict(requests=36, prompt_tokens=4320, cached_prompt_tokens=0, hit_rate=0.0, hit_pages=0,
                 prompt_pages=1080, evicted_tokens=4224, over_evicted_tokens=1496, overshoot_tokens=2596,
                 prefill_tokens_computed=4320, reprefill_tokens=0, retractions=0, aborted=0, pressure_events=33,
                 steps=170, output_tokens=432, simulated_s=1.9878, output_tokens_per_s=217.326),
}
ROOT = Path(__file__).resolve().parents[2]
HOST_KEYS = ("device_hit_tokens", "host_hit_tokens", "loaded_back_tokens", "written_to_host_tokens",
             "host_evicted_tokens", "transfer_s")


def run(cfg, reqs=None, **changes):
    return simulate(workload() if reqs is None else reqs, replace(cfg, **changes), progress=False)


@pytest.mark.parametrize("mode", ["shortfall", "full"])
def test_device_only_run_is_unchanged(mode):
    res = run(BASE, eviction=mode)
    t = res.totals()
    assert {k: t[k] for k in DEVICE_ONLY[mode]} == DEVICE_ONLY[mode]
    assert {k: t[k] for k in HOST_KEYS} == dict.fromkeys(HOST_KEYS, 0)
    assert not isinstance(res.tree, HiRadixCache)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("mode", ["shortfall", "full"])
def test_invariants_every_step_and_the_fast_rounds_equal_the_reference(mode, policy):
    """A small host tier (1.5 x the device pool) so that host eviction happens too: every invariant of pools,
    tree and host tier holds after every step (debug), and the event-driven decode rounds give the same rows,
    totals, final tree and clock as the reference loop."""
    cfg = replace(BASE, eviction=mode, hicache_ratio=1.5, hicache_write_policy=policy)
    checked = run(cfg, debug=True, fast_decode=False)
    plain, fast = run(cfg, fast_decode=False), run(cfg)
    assert fast.totals() == plain.totals() == checked.totals()
    assert fast.rows == plain.rows
    assert tree_frame(fast.tree).equals(tree_frame(plain.tree))
    assert fast.tree.clock.now == plain.tree.clock.now
    t = fast.totals()
    assert t["host_hit_tokens"] > 0 and t["written_to_host_tokens"] > 0
    assert t["host_evicted_tokens"] > 0  # the host tier filled up
    assert t["cached_prompt_tokens"] == t["device_hit_tokens"] + t["host_hit_tokens"]
    frame = fast.steps_frame()
    for key in HOST_KEYS:
        assert frame[key].sum() == pytest.approx(t[key], abs=1e-5), key
    fast.tree.check_invariants()
    assert not fast.tree.cache_controller.in_flight()  # the run's copies all landed (drained at the end)


def test_fast_rounds_stop_where_a_copy_lands():
    """Long decodes (the quiet rounds the fast path skips) while write-through copies are in flight over a slow
    host link: a copy that lands unlocks its node, which the next row shows, so the skipped rounds must stop
    there."""
    reqs = [Req(r.rid, r.arrival_time_s, r.prompt_token_ids, 40 + 60 * i)
            for i, r in enumerate(workload(groups=2, per=3, gap=0.001))]
    slow = CostModel(device_to_host_bytes_per_s=2e8, host_to_device_bytes_per_s=2e8)
    cfg = replace(BASE, kv_tokens=2048, hicache_ratio=4, cost=slow)
    plain, fast = run(cfg, reqs, fast_decode=False), run(cfg, reqs)
    assert fast.rows == plain.rows and fast.totals() == plain.totals()
    protected = [row["protected_tokens"] for row in plain.rows if row["kind"] == "decode"]
    assert len(set(protected)) > 5  # locks came and went during the decode rounds


@pytest.mark.parametrize("policy,kv_tokens,max_running,out", [
    ("write_through", 256, 4, 40), ("write_through_selective", 384, 6, 80), ("write_back", 256, 6, 60)])
def test_blocked_waiting_heads_are_replayed_with_host_hits_as_the_loop_matches_them(monkeypatch, policy, kv_tokens,
                                                                                   max_running, out):
    """Long outputs in a tight device pool: waiting heads whose prefix is partly on host only are turned down for the
    budget step after step. The fast path replays their matches while the two-tier tree's structure version stands
    (``HiRadixCache.restamp_path``, one step at a time and in bulk over the blocked quiet steps), reporting the
    host hit and the load-back's end node as a walk would; rows, totals, tree and clock equal the reference loop's,
    in both modes."""
    replays = []
    real = HiRadixCache.restamp_path

    def recording(self, node, times=1):
        replays.append((times, self.match_ends(node)[2]))  # (matches replayed, host-only tokens they hit)
        return real(self, node, times)

    monkeypatch.setattr(HiRadixCache, "restamp_path", recording)
    reqs = [Req(r.rid, r.arrival_time_s, r.prompt_token_ids, out + (i % 7) * 5)
            for i, r in enumerate(workload(groups=4, per=5, sys_len=64, q_len=16, gap=0.005))]
    for mode in ("shortfall", "full"):
        cfg = replace(BASE, kv_tokens=kv_tokens, max_running=max_running, eviction=mode, hicache_ratio=2,
                      hicache_write_policy=policy)
        replays.clear()
        fast = run(cfg, reqs, page_engine=False)  # (the token-level memory's replays; the page engine's twin below)
        assert any(times > 1 for times, _ in replays)  # the blocked quiet steps replayed matches in bulk
        assert sum(host > 0 for _, host in replays) > 20  # replayed matches that hit on host
        plain = run(cfg, reqs, fast_decode=False)
        assert fast.totals() == plain.totals()
        assert fast.rows == plain.rows
        assert tree_frame(fast.tree).equals(tree_frame(plain.tree))
        assert fast.tree.clock.now == plain.tree.clock.now
        assert fast.totals()["host_hit_tokens"] > 0
        fast.tree.check_invariants()


@pytest.mark.parametrize("policy,mode", [("write_through", "shortfall"), ("write_back", "full")])
def test_a_replayed_match_loads_its_host_hit_back_at_admission(monkeypatch, policy, mode):
    """The Mooncake sample in a tight pool (100 pages of 512, 16 running): waiting heads are admitted on a replayed
    match (nothing the match reads changed since the check that turned them down) whose prefix is partly on host,
    so the replay's host hit and load-back node drive the load-back; every row, the totals, the tree and its
    clock equal the reference loop's."""
    from kvlab.sched.kv import SchedulerKV
    from kvlab.workloads.mooncake import load_trace

    replayed, loads = {}, []
    real_match, real_load = SchedulerKV.match, SchedulerKV.load_back

    def matching(self, req):
        replayed[id(req)] = self.replayable(req)
        return real_match(self, req)

    def loading(self, req):
        if req.host is not None and req.host.hit_len:
            loads.append(replayed.get(id(req), False))
        return real_load(self, req)

    monkeypatch.setattr(SchedulerKV, "match", matching)
    monkeypatch.setattr(SchedulerKV, "load_back", loading)
    reqs = load_trace(ROOT / "data/traces/mooncake_small.jsonl")
    cfg = SchedulerConfig(kv_tokens=100 * 512, page_size=512, max_running=16, eviction=mode, hicache_ratio=4,
                          hicache_write_policy=policy)
    fast = run(cfg, reqs, page_engine=False)  # (the token-level memory's match and load-back, recorded)
    assert sum(loads) > 5  # load-backs of host hits that a replayed match reported
    plain = run(cfg, reqs, fast_decode=False)
    page = run(cfg, reqs)  # the page engine's two-tier tree, too
    for other in (fast, page):
        assert other.totals() == plain.totals()
        assert other.rows == plain.rows
        assert tree_frame(other.tree).equals(tree_frame(plain.tree))
        assert other.tree.clock.now == plain.tree.clock.now


def test_host_tier_raises_the_hit_rate():
    device_only = run(BASE).totals()
    host = run(BASE, hicache_ratio=4).totals()
    assert device_only["hit_rate"] == 0.0
    assert host["hit_rate"] > 0.4
    assert host["host_hit_tokens"] > 0.9 * host["cached_prompt_tokens"]  # the device pool forgets every prefix
    assert host["loaded_back_tokens"] >= host["host_hit_tokens"]
    assert host["prefill_tokens_computed"] < device_only["prefill_tokens_computed"]


def test_write_policies_differ_as_sglang_writes():
    """write_through backs up every node at insert; write_through_selective on its second hit; write_back only
    what device eviction would destroy. With a device pool that never evicts, write_back writes nothing."""
    big = replace(BASE, kv_tokens=8192)
    written = {p: run(big, hicache_ratio=2, hicache_write_policy=p).totals() for p in POLICIES}
    assert written["write_back"]["written_to_host_tokens"] == 0
    assert written["write_back"]["evicted_tokens"] == 0
    assert written["write_through"]["written_to_host_tokens"] > written["write_through_selective"][
        "written_to_host_tokens"] > 0
    tight = {p: run(BASE, hicache_ratio=4, hicache_write_policy=p).totals() for p in POLICIES}
    wb, wt = tight["write_back"], tight["write_through"]
    assert 0 < wb["written_to_host_tokens"] <= wb["evicted_tokens"]  # only what eviction demotes
    assert wt["written_to_host_tokens"] > wb["written_to_host_tokens"]


def test_full_eviction_costs_hits_once_the_host_tier_is_full():
    """Finding 2 with a host tier: a roomy host tier keeps what the full mode over-evicts (it comes back by
    load-back instead, no hit lost); a host tier too small to hold it loses hits again."""
    cfg = replace(BASE, kv_tokens=768)
    device = {m: run(cfg, eviction=m).totals() for m in ("shortfall", "full")}
    roomy = {m: run(cfg, eviction=m, hicache_ratio=8).totals() for m in ("shortfall", "full")}
    small = {m: run(cfg, eviction=m, hicache_ratio=0.5).totals() for m in ("shortfall", "full")}
    assert device["full"]["hit_rate"] < device["shortfall"]["hit_rate"]  # finding 2 without a host tier
    assert roomy["full"]["over_evicted_tokens"] > 0
    assert roomy["full"]["hit_rate"] == roomy["shortfall"]["hit_rate"]  # no hit lost ...
    assert roomy["full"]["loaded_back_tokens"] > roomy["shortfall"]["loaded_back_tokens"]  # ... traffic instead
    assert small["full"]["host_evicted_tokens"] > small["shortfall"]["host_evicted_tokens"]
    assert small["full"]["hit_rate"] < small["shortfall"]["hit_rate"]


def test_transfer_seconds_are_bytes_over_the_host_link():
    cost = CostModel(kv_bytes_per_token=1000, host_to_device_bytes_per_s=1e6, device_to_host_bytes_per_s=2e6)
    t = run(BASE, hicache_ratio=4, cost=cost).totals()
    expected = t["loaded_back_tokens"] * 1000 / 1e6 + t["written_to_host_tokens"] * 1000 / 2e6
    assert t["transfer_s"] == pytest.approx(expected, abs=1e-5)
    fast_link = run(BASE, hicache_ratio=4).totals()  # 55 GB/s, 128 KiB per token: copies hide under compute
    assert t["simulated_s"] > fast_link["simulated_s"]  # 1 MB/s: the load-backs stretch the prefill steps


def test_config_checks_name_the_field():
    with pytest.raises(ValueError, match="hicache_ratio or hicache_size_gib, not both"):
        SchedulerConfig(kv_tokens=64, hicache_ratio=2, hicache_size_gib=1)
    with pytest.raises(ValueError, match=r"hicache_ratio must be a number in \(0, 1000\], got 0"):
        SchedulerConfig(kv_tokens=64, hicache_ratio=0)
    with pytest.raises(ValueError, match="hicache_write_policy must be one of"):
        SchedulerConfig(kv_tokens=64, hicache_ratio=2, hicache_write_policy="later")
    with pytest.raises(ValueError, match="hicache_size_gib=60000 makes a host pool of"):
        SchedulerConfig(kv_tokens=64, hicache_size_gib=60000)
    # sized as SGLang sizes it: GiB over the bytes per token, one page more than the whole pages
    cfg = SchedulerConfig(kv_tokens=64, page_size=4, hicache_size_gib=1)
    assert cfg.host_pool().size_tokens == (2**30 // 131_072 // 4 + 1) * 4
    assert SchedulerConfig(kv_tokens=64, page_size=4, hicache_ratio=2).host_pool().size_tokens == 132


@pytest.mark.parametrize("args,message", [
    (["--hicache-ratio", "0"], "--hicache-ratio must be in (0, 1000], got 0"),
    (["--hicache-ratio", "x"], "--hicache-ratio: expected a number, got 'x'"),
    (["--hicache-size", "-1"], "--hicache-size must be in (0, 65536], got -1"),
    (["--hicache-ratio", "2", "--hicache-size", "1"], "not allowed with argument --hicache-ratio"),
    (["--hicache-ratio", "2", "--hicache-write-policy", "later"], "argument --hicache-write-policy: invalid choice"),
    (["--hicache-write-policy", "write_back"], "--hicache-write-policy write_back needs a host tier"),
])
def test_cli_refuses_bad_flags_naming_them(capsys, args, message):
    assert_refused(capsys, args, message)


def test_cli_json_and_text_show_the_host_tier(capsys):
    assert cli("--hicache-ratio", "4", "--hicache-write-policy", "write_back", "--json") == 0
    totals = json.loads(capsys.readouterr().out)
    assert all(key in totals for key in HOST_KEYS)
    assert cli("--hicache-size", "2") == 0
    out = capsys.readouterr().out
    assert "host tier (HiCache) · --hicache-size 2 GiB: 16,385 host tokens (2.00 GiB" in out
    assert cli() == 0
    assert "host tier" not in capsys.readouterr().out
