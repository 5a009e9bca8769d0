"""The scheduler with HiCache's storage tier (L3) behind its host tier: a multi-turn run whose device and host pools
forget each conversation before its next turn, so the turns' history comes back from storage when the prefetch
policy lets it; hits add up across the three tiers; invariants every step; the reference loop equal to the fast
path; a store kept across runs (``/flush_cache``); the config and CLI refusals."""

from __future__ import annotations

import json
import random

import pytest

from kvlab.cli import main
from kvlab.sched import SchedulerConfig, simulate
from kvlab.workloads.request import Request

from .simulate_cli import assert_refused, cli

STORAGE_KEYS = ("storage_hit_tokens", "prefetched_tokens", "prefetch_aborted_tokens", "written_to_storage_tokens")


def turns(clients=6, rounds=3, first=512, sub=128, out=8, gap=12.0, seed=0):
    """bench_multiturn-like: each client resends its whole history (first prompt, then per round an answer and a
    new question), one client every ``gap / clients`` seconds, a round every ``gap`` (the server idles between)."""
    rng = random.Random(seed)
    history = {c: [rng.randrange(1, 30000) for _ in range(first)] for c in range(clients)}
    reqs = []
    for r in range(rounds):
        for c in range(clients):
            if r:
                history[c] += [rng.randrange(1, 30000) for _ in range(sub)]
            answer = [rng.randrange(1, 30000) for _ in range(out)]
            reqs.append(Request(f"c{c}-r{r}", r * gap + c * gap / clients, list(history[c]), out,
                                output_token_ids=answer))
            history[c] += answer
    return reqs


BASE = SchedulerConfig(kv_tokens=2048, page_size=64, hicache_ratio=1.0, debug=True)


def run(policy=None, reqs=None, **kw):
    storage = {} if policy is None else dict(hicache_storage_backend="file", hicache_storage_prefetch_policy=policy)
    cfg = SchedulerConfig(**{**BASE.__dict__, **storage, **kw})
    return simulate(reqs or turns(), cfg)


@pytest.fixture(scope="module")
def results():
    return {p: run(p) for p in (None, "best_effort", "wait_complete", "timeout")}


def test_storage_hits_appear_and_depend_on_the_prefetch_policy(results):
    plain, best, wait = (results[p].totals() for p in (None, "best_effort", "wait_complete"))
    assert plain["cached_prompt_tokens"] == plain["device_hit_tokens"] + plain["host_hit_tokens"]
    assert all(plain[k] == 0 for k in STORAGE_KEYS)
    # best_effort: an idle server schedules a request as it arrives, before any page has landed
    assert best["storage_hit_tokens"] == best["prefetched_tokens"] == 0 and best["prefetch_aborted_tokens"] > 0
    # wait_complete: later turns' history comes back from storage, where the host pool (ratio 1, full of copies of
    # what is on the device, which host eviction cannot free) has room for the pages
    assert wait["storage_hit_tokens"] > 0 and wait["prefetch_aborted_tokens"] < best["prefetch_aborted_tokens"]
    assert wait["hit_rate"] > best["hit_rate"] >= plain["hit_rate"]
    assert results["timeout"].totals()["storage_hit_tokens"] == wait["storage_hit_tokens"]  # (ms, under 2 s)


@pytest.mark.parametrize("policy", ["best_effort", "wait_complete", "timeout"])
def test_hits_add_up_across_the_three_tiers(results, policy):
    t = results[policy].totals()
    assert t["cached_prompt_tokens"] == t["device_hit_tokens"] + t["host_hit_tokens"] + t["storage_hit_tokens"]
    assert t["storage_hit_tokens"] <= t["prefetched_tokens"] <= t["loaded_back_tokens"] + t["prefetched_tokens"]
    assert t["written_to_storage_tokens"] > 0
    rows = results[policy].rows
    for key in STORAGE_KEYS:
        assert sum(r[key] for r in rows) == t[key]
    assert all(r["cached_prompt_tokens"] >= 0 and r["device_hit_tokens"] >= 0 for r in rows)


def test_a_zero_timeout_gives_up_like_best_effort():
    t = run("timeout", prefetch_timeout_base=0.0, prefetch_timeout_per_ki_token=0.0).totals()
    assert t["storage_hit_tokens"] == 0 and t["prefetch_aborted_tokens"] > 0


def test_reference_loop_equals_the_fast_path():
    fast, ref = run("wait_complete", debug=False), run("wait_complete", debug=False, fast_decode=False)
    assert fast.totals() == ref.totals()


def test_a_kept_store_serves_the_next_run():
    """``/flush_cache`` between two runs of the same requests empties the device and host, not storage: the second
    run's first turns hit storage too."""
    from kvlab.mem_cache.hicache.storage import HiCacheStorage

    reqs = turns(rounds=1)
    cfg = SchedulerConfig(**{**BASE.__dict__, "hicache_storage_backend": "file",
                             "hicache_storage_prefetch_policy": "wait_complete"})
    store = HiCacheStorage(cfg.page_size * cfg.cost.kv_bytes_per_token)
    first = simulate(reqs, cfg, storage=store).totals()
    second = simulate(reqs, cfg, storage=store).totals()
    assert first["storage_hit_tokens"] == 0 and len(store) > 0
    assert second["storage_hit_tokens"] == sum((len(r.prompt_token_ids) - 1) // 64 * 64 for r in reqs)


def test_config_refuses_storage_without_a_host_tier():
    with pytest.raises(ValueError, match="needs a host tier"):
        SchedulerConfig(kv_tokens=64, hicache_storage_backend="file")
    with pytest.raises(ValueError, match="hicache_storage_prefetch_policy must be one of"):
        SchedulerConfig(kv_tokens=64, hicache_ratio=2, hicache_storage_backend="file",
                        hicache_storage_prefetch_policy="eventually")


@pytest.mark.parametrize("args,message", [
    (["--hicache-storage-backend", "file"], "--hicache-storage-backend file needs a host tier"),
    (["--hicache-ratio", "2", "--hicache-storage-backend", "s3"], "argument --hicache-storage-backend: invalid choice"),
    (["--hicache-ratio", "2", "--prefetch-timeout-base", "1"], "--prefetch-timeout-base 1.0 needs a storage tier"),
    (["--hicache-ratio", "2", "--hicache-storage-backend", "file", "--hicache-storage-size", "-1"],
     "--hicache-storage-size must be a finite number >= 0, got -1"),
    (["--hicache-ratio", "2", "--hicache-storage-backend", "file", "--prefetch-threshold", "2.5"],
     "--prefetch-threshold must be a whole number of tokens, got 2.5"),
])
def test_cli_refuses_bad_storage_flags_naming_them(capsys, args, message):
    assert_refused(capsys, args, message)


def test_cli_json_shows_the_storage_tier(capsys):
    assert cli("--hicache-ratio", "1", "--hicache-storage-backend", "mooncake", "--hicache-storage-prefetch-policy",
               "wait_complete", "--json") == 0
    totals = json.loads(capsys.readouterr().out)
    assert totals["written_to_storage_tokens"] > 0
    assert totals["cached_prompt_tokens"] == sum(totals[k] for k in ("device_hit_tokens", "host_hit_tokens",
                                                                     "storage_hit_tokens"))


def test_simulate_storage_choices_are_the_registries():
    from kvlab.cli.simulate import SIMULATE_PREFETCH_POLICIES, SIMULATE_STORAGE_BACKENDS
    from kvlab.mem_cache.hicache.storage import PREFETCH_POLICIES, STORAGE_BACKENDS

    assert SIMULATE_STORAGE_BACKENDS == STORAGE_BACKENDS
    assert SIMULATE_PREFETCH_POLICIES == PREFETCH_POLICIES


def test_cli_text_names_the_storage_tier_and_compare_runs_it(capsys):
    assert cli("--hicache-ratio", "1", "--hicache-storage-backend", "hf3fs", "--hicache-storage-size", "2") == 0
    out = capsys.readouterr().out
    assert "storage tier (L3) · --hicache-storage-backend hf3fs: 2 GB, 10 GB/s read" in out and "(assumed)" in out
    assert "storage_hit_tokens" in out
    assert cli("--hicache-ratio", "1", "--hicache-storage-backend", "file", "--compare", "--json") == 0
    assert "written_to_storage_tokens" in capsys.readouterr().out


def test_rounds_split_cached_tokens_by_tier(capsys):
    """``kvlab simulate --workload multiturn``'s ``rounds``: each round's cached tokens split into device, host and
    storage hits, which add up to the round's cached tokens and, over the rounds, to the run's totals; the text
    table prints the same split."""
    args = ["simulate", "--workload", "multiturn", "--page-size", "64", "--kv-tokens", "8192", "--hicache-ratio",
            "2", "--hicache-storage-backend", "file", "--hicache-storage-prefetch-policy", "wait_complete"]
    for kv in ("num_clients=8", "num_rounds=5", "request_length=1024", "output_length=1", "max_parallel=2",
               "enable_round_barrier=true", "disable_random_sample=true"):
        args += ["--workload-param", kv]
    assert main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rounds = data["rounds"]
    for row in rounds:
        assert row["device_hit_tokens"] + row["host_hit_tokens"] + row["storage_hit_tokens"] == row["cached_tokens"]
        assert min(row["device_hit_tokens"], row["host_hit_tokens"], row["storage_hit_tokens"]) >= 0
    for key in ("device_hit_tokens", "host_hit_tokens", "storage_hit_tokens"):
        assert sum(row[key] for row in rounds) == data[key] > 0
    assert main(args) == 0
    text = capsys.readouterr().out
    last = rounds[-1]
    assert (f"hits {last['device_hit_tokens']:,} / {last['host_hit_tokens']:,} / {last['storage_hit_tokens']:,}"
            in text)


def test_storage_traffic_is_in_the_row_of_the_step_it_happens():
    """A backup that lands in storage while nothing else moves (a decode step opening a page, after the quiet rounds
    ran past the landing) shows in that step's row, not in the next one with host-tier traffic; and the totals
    count every backup landed during the run, however late."""
    prompt = list(range(1, 641))  # 10 pages of 64, inserted after the prefill, backed up to host, then to storage
    req = Request("long", 0.0, prompt, 300, output_token_ids=[7] * 300)
    result = simulate([req], SchedulerConfig(kv_tokens=4096, page_size=64, hicache_ratio=1.0, debug=True,
                                             hicache_storage_backend="file"))
    host_keys = ("written_to_host_tokens", "loaded_back_tokens", "host_evicted_tokens")
    landed = [r for r in result.rows if r["written_to_storage_tokens"]]
    assert [(r["kind"], r["written_to_storage_tokens"]) for r in landed] == [("decode", 10 * 64)]
    assert all(landed[0][k] == 0 for k in host_keys)
    assert result.totals()["written_to_storage_tokens"] == 10 * 64


def test_a_backup_landing_after_the_last_host_traffic_is_counted():
    """Write-back: the only host copy is an eviction's (the second request's prefill makes room), and its backup to
    storage lands during the decode steps after it, when nothing else moves: that step's row and the run's totals
    count it (they missed it when only host-tier traffic opened a step's row)."""
    first = Request("a", 0.0, list(range(1, 641)), 1, output_token_ids=[5])
    second = Request("b", 1.0, list(range(1001, 1641)), 40, output_token_ids=[9] * 40)
    result = simulate([first, second], SchedulerConfig(kv_tokens=64 * 14, page_size=64, hicache_ratio=2.0, debug=True,
                                                       hicache_write_policy="write_back",
                                                       hicache_storage_backend="file"))
    moved = [(r["kind"], r["written_to_host_tokens"], r["written_to_storage_tokens"]) for r in result.rows
             if r["written_to_host_tokens"] or r["written_to_storage_tokens"]]
    assert moved == [("prefill", 640, 0), ("decode", 0, 640)]
    assert result.totals()["written_to_storage_tokens"] == 640
