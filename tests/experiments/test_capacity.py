"""Capacity planning (notebook 06's experiment) on the 5-request trace: the loss map against direct scheduler runs,
the verdict's numbers, and the printed ``kvlab sweep`` command giving the same rows."""

from __future__ import annotations

import json
import shlex

import pytest

from kvlab.cli import main
from kvlab.experiments import capacity
from kvlab.experiments.shortfall_eviction import run
from kvlab.sweep import TIMING_COLUMNS
from kvlab.workloads.mooncake import load_trace, read_records, trace_stats
from tests.conftest import REPO_ROOT

TINY = REPO_ROOT / "data" / "traces" / "mooncake_tiny.jsonl"
POOLS = [7, 12, 30]


@pytest.fixture(scope="module")
def result():
    return capacity.run(TINY, pool_pages=POOLS, max_running=[256, 1], workers=1, progress=False)


def test_loss_map_is_shortfall_minus_full_of_direct_runs(result):
    loss = result.loss_points()
    assert list(loss.index) == [1, 256] and list(loss.columns) == POOLS  # sorted, whatever order was asked
    requests = load_trace(TINY)
    for running in (1, 256):
        for pages in POOLS:
            fix, bug = (run(requests, eviction=m, page_size=512, kv_tokens=pages * 512, max_running=running,
                            progress=False).hit_rate for m in ("shortfall", "full"))
            assert loss.loc[running, pages] == pytest.approx(100 * (fix - bug), abs=1e-3), (running, pages)
    # worked from the README's numbers: at 7 pages the bug loses a 512-token block hit: 3,584 vs 3,072 of 7,501
    assert loss.loc[256, 7] == pytest.approx(100 * 512 / 7501, abs=1e-3)
    assert (loss[[12, 30]] == 0).all().all()


def test_curve_hits_and_verdict(result):
    curve = result.curve()
    assert set(curve["max_running"]) == {256} and len(curve) == 2 * len(POOLS)
    hits = result.hit_rates(1)
    assert list(hits.columns) == ["shortfall", "full"] and list(hits.index) == POOLS
    assert result.ideal_hit_rate == pytest.approx(trace_stats(read_records(TINY)).ideal_hit_rate)
    assert hits["shortfall"].max() <= result.ideal_hit_rate + 1e-6
    assert result.verdict().startswith("Full eviction costs up to 6.83 points of hit rate (pool 7 pages")
    assert "nothing at 4 of the 6 settings" in result.verdict()
    with pytest.raises(ValueError, match=r"max_running=64 is not in the sweep's \(1, 256\)"):
        result.curve(64)


def test_the_printed_command_gives_the_same_rows(result, capsys, tmp_path):
    command = shlex.split(result.cli(out=str(tmp_path / "rows.csv")))
    assert command[:2] == ["kvlab", "sweep"]
    assert main(command[1:] + ["--workers", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["source"] for r in rows} == {command[command.index("--trace") + 1]}  # the path as the command gives it
    strip = [{k: v for k, v in r.items() if k not in TIMING_COLUMNS + ("source",)} for r in rows]
    ours = result.sweep.comparable().drop(columns=["source"]).to_dict(orient="records")
    assert sorted(strip, key=str) == sorted(ours, key=str)


def test_first_requests_only_says_so():
    part = capacity.run(TINY, pool_pages=[30], max_running=[256], num_requests=3, workers=1, progress=False)
    assert part.num_requests == 3 and not part.whole_trace
    assert part.cli().endswith("# on the whole trace; this sweep ran its first 3 requests")
    with pytest.raises(ValueError, match="num_requests must be a positive int, got 0"):
        capacity.run(TINY, pool_pages=[30], num_requests=0, progress=False)
