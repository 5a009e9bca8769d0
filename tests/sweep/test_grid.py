"""Bad grids fail before any point runs or any file is written, naming the value; the CLI's rows are
``kvlab simulate``'s totals."""

from __future__ import annotations

import json
import sys

import pytest

from kvlab.cli import main
from kvlab.sweep import COLUMNS, TIMING_COLUMNS, Grid, SweepError, make_engine, run_sweep
from kvlab.workloads.mooncake import load_trace

from .conftest import TINY

TRACE = ["sweep", "--trace", str(TINY)]


@pytest.mark.parametrize(("args", "message"), [
    (["--policy", "lru,xyz"], "--policy: unknown eviction policy 'xyz' (known: fifo, filo, lfu, lru"),
    (["--eviction", "shortfall,lazy"], "--eviction: unknown eviction mode 'lazy' (known: shortfall, full)"),
    # the first pool is fine: the sweep must not run it before finding that the second is too small
    (["--kv-pages", "30,4"], "--kv-pages 4 at --page-size 512 (2,048 tokens) is smaller than one request: "
                             "'mooncake_tiny-2' needs 6 pages"),
    (["--kv-pages", "30", "--page-size", "512,256", "--max-running", "1,0"],
     "--max-running: expected positive integers, got 0"),
    (["--kv-tokens", "15360,5000"], "--kv-tokens 5000 is not a whole number of pages at --page-size 512"),
    (["--kv-pages", "12,twelve"], "--kv-pages: expected positive integers, got 'twelve'"),
    (["--kv-pages", ","], "--kv-pages: expected a comma-separated list, got ','"),
    (["--page-size", "512", "--ray-address", "auto"], "--ray-address auto needs --engine ray"),
    (["--kv-pages", "12", "--workload-param", "num_groups=2"], "--workload-param applies to --workload"),
])
def test_bad_grid_fails_before_any_work(args, message, tmp_path, capsys):
    out = tmp_path / "rows.csv"
    assert main(TRACE + args + ["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not out.exists()  # nothing ran, nothing was written


def test_unreadable_traces_are_named(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(TINY.read_text().replace('"input_length": 2062', '"input_length": -5'))
    cases = [(tmp_path / "missing.jsonl", "missing.jsonl: trace file not found"),
             (bad, "bad.jsonl:3: field 'input_length' must be an integer >= 1, got -5"),
             (tmp_path, str(tmp_path))]
    for trace, message in cases:
        assert main(["sweep", "--trace", str(trace), "--out", str(tmp_path / "rows.csv")]) == 2
        err = capsys.readouterr().err
        assert message in err, err
    assert not (tmp_path / "rows.csv").exists()


def test_unknown_workload_and_engine_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", "--workload", "no-such-workload"])
    assert exit_.value.code == 2 and "'no-such-workload'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(TRACE + ["--engine", "dask"])
    assert "'dask'" in capsys.readouterr().err
    with pytest.raises(SweepError, match="--engine: unknown engine 'dask'"):
        make_engine("dask")


def test_grid_api_names_the_value():
    requests = load_trace(TINY)
    with pytest.raises(SweepError, match=r"--page-size: expected positive integers, got True"):
        Grid(page_sizes=(True,)).points(requests)
    with pytest.raises(SweepError, match="not both"):
        Grid(kv_pages=(10,), kv_tokens=(5120,)).points(requests)
    with pytest.raises(SweepError, match="no requests to sweep"):
        Grid().points([])


def test_ray_missing_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` does where kvlab[ray] is not installed
    with pytest.raises(SweepError, match=r"--engine ray needs Ray, the optional extra kvlab\[ray\]: "
                                         r"pip install 'kvlab\[ray\]'"):
        run_sweep(load_trace(TINY), Grid(page_sizes=(512,), kv_pages=(12,)), engine="ray", progress=False)


def test_rows_are_kvlab_simulate_totals_in_grid_order(capsys):
    assert main(TRACE + ["--kv-pages", "7,30", "--max-running", "1,256", "--workers", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [tuple(r) for r in rows] == [COLUMNS] * 8
    assert [(r["eviction"], r["max_running"], r["kv_pages"]) for r in rows] == [
        (mode, running, pages) for mode in ("shortfall", "full") for running in (1, 256) for pages in (7, 30)]
    for row in rows:
        assert row["source"] == str(TINY) and row["seed"] == 0 and row["page_size"] == 512
        assert row["kv_tokens"] == row["kv_pages"] * 512
        assert main(["simulate", "--trace", str(TINY), "--kv-pages", str(row["kv_pages"]), "--eviction",
                     row["eviction"], "--max-running", str(row["max_running"]), "--json"]) == 0
        totals = json.loads(capsys.readouterr().out)
        assert {k: v for k, v in row.items() if k not in TIMING_COLUMNS} == {
            "source": str(TINY), "seed": 0, "kv_pages": row["kv_pages"], "max_running": row["max_running"],
            "hicache_ratio": 0.0, "hicache_write_policy": "write_through", "hicache_storage_backend": "none",
            "hicache_storage_prefetch_policy": "best_effort", **{k: v for k, v in totals.items() if k in COLUMNS}}
    # the bug costs on this trace at the smallest pool (notebook 06's point), not where the pool holds it all
    small = {r["eviction"]: r for r in rows if r["kv_pages"] == 7 and r["max_running"] == 256}
    assert small["shortfall"]["hit_rate"] > small["full"]["hit_rate"]
    assert small["full"]["over_evicted_tokens"] > 0 == small["shortfall"]["over_evicted_tokens"]


def test_a_ray_address_nobody_answers_at_is_named_at_once(tmp_path, capsys):
    """Ray retries an unreachable address for minutes; kvlab says so in seconds, before starting anything."""
    ray = pytest.importorskip("ray")
    from kvlab.sweep.engine import check_reachable
    from tests.browser.lab import free_port

    port = free_port()  # bound and released: nothing listens there now
    with pytest.raises(SweepError, match=rf"--ray-address ray://127\.0\.0\.1:{port}: no Ray cluster answers there"):
        check_reachable(f"ray://127.0.0.1:{port}")
    check_reachable("auto")  # Ray's own discovery: left to Ray
    if ray.is_initialized():  # a cluster this process joined is used as it is, whatever the address
        return
    out = tmp_path / "rows.csv"
    assert main(TRACE + ["--kv-pages", "12", "--engine", "ray", "--ray-address", f"127.0.0.1:{port}",
                         "--out", str(out)]) == 2
    assert f"--ray-address 127.0.0.1:{port}: no Ray cluster answers there" in capsys.readouterr().err
    assert not out.exists()


def test_hicache_axes_are_kvlab_simulate_with_a_host_tier(capsys):
    """--hicache-ratio / --hicache-write-policy are axes: ratio 0 (no host tier) is one point whatever the
    policies, each ratio > 0 one point per policy, and each row is `kvlab simulate --hicache-ratio R
    --hicache-write-policy P`'s totals."""
    assert main(TRACE + ["--kv-pages", "7", "--eviction", "shortfall", "--hicache-ratio", "0,4",
                         "--hicache-write-policy", "write_through,write_back", "--workers", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["hicache_ratio"], r["hicache_write_policy"]) for r in rows] == [
        (0.0, "write_through"), (4.0, "write_through"), (4.0, "write_back")]
    assert rows[0]["written_to_host_tokens"] == 0 and rows[1]["written_to_host_tokens"] > 0
    for row in rows[1:]:
        assert main(["simulate", "--trace", str(TINY), "--kv-pages", "7", "--hicache-ratio", "4",
                     "--hicache-write-policy", row["hicache_write_policy"], "--json"]) == 0
        totals = json.loads(capsys.readouterr().out)
        assert {k: row[k] for k in totals if k in COLUMNS} == {k: v for k, v in totals.items() if k in COLUMNS}
    with pytest.raises(SweepError, match="--hicache-write-policy: unknown write policy 'later'"):
        Grid(hicache_write_policies=("later",)).checked()
    with pytest.raises(SweepError, match="--hicache-ratio: expected numbers in"):
        Grid(hicache_ratios=(-1.0,)).checked()


def test_storage_axes_are_kvlab_simulate_with_a_storage_tier(capsys):
    """--hicache-storage-backend / --hicache-storage-prefetch-policy are axes: backend none (no storage tier) is
    one point whatever the prefetch policies, each backend one point per policy, and only with a host tier; each row
    is `kvlab simulate --hicache-storage-backend B --hicache-storage-prefetch-policy P`'s totals."""
    multiturn = ["--workload", "multiturn", "--page-size", "64", "--kv-tokens", "8192", "--eviction", "shortfall"]
    for kv in ("num_clients=8", "num_rounds=5", "request_length=1024", "output_length=1", "max_parallel=2",
               "enable_round_barrier=true", "disable_random_sample=true"):
        multiturn += ["--workload-param", kv]
    assert main(["sweep", *multiturn, "--hicache-ratio", "0,2", "--hicache-storage-backend", "none,file",
                 "--hicache-storage-prefetch-policy", "best_effort,wait_complete", "--workers", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["hicache_ratio"], r["hicache_storage_backend"], r["hicache_storage_prefetch_policy"]) for r in rows] == [
        (0.0, "none", "best_effort"), (2.0, "none", "best_effort"), (2.0, "file", "best_effort"),
        (2.0, "file", "wait_complete")]
    assert rows[1]["storage_hit_tokens"] == 0 < rows[3]["storage_hit_tokens"]
    for row in rows[2:]:
        assert main(["simulate", *multiturn, "--hicache-ratio", "2", "--hicache-storage-backend", "file",
                     "--hicache-storage-prefetch-policy", row["hicache_storage_prefetch_policy"], "--json"]) == 0
        totals = json.loads(capsys.readouterr().out)
        assert {k: row[k] for k in totals if k in COLUMNS} == {k: v for k, v in totals.items() if k in COLUMNS}
    with pytest.raises(SweepError, match="--hicache-storage-backend: unknown storage backend 'tape'"):
        Grid(hicache_storage_backends=("tape",)).checked()
    with pytest.raises(SweepError, match="--hicache-storage-prefetch-policy: unknown prefetch policy 'never'"):
        Grid(hicache_storage_prefetch_policies=("never",)).checked()
