"""The pool-size sweep on the shipped Mooncake trace: the curve's shape, the two modes against each
other, each row against a direct scheduler run, and the errors a user meets first."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvlab.experiments.pool_sweep import (
    COLUMNS,
    PoolSizeError,
    default_pool_pages,
    main,
    sweep,
)
from kvlab.experiments.shortfall_eviction import run
from kvlab.units import div_ceil
from kvlab.workloads.mooncake import TraceFormatError, load_trace, read_records, trace_stats
from tests.conftest import REPO_ROOT

SMALL = REPO_ROOT / "data" / "traces" / "mooncake_small.jsonl"
TINY = REPO_ROOT / "data" / "traces" / "mooncake_tiny.jsonl"
N_REQUESTS = 60  # the first 60 arrivals keep the 12 runs at ~15 s on the slow simulator


@pytest.fixture(scope="module")
def requests():
    return load_trace(SMALL)[:N_REQUESTS]


@pytest.fixture(scope="module")
def result(requests):
    return sweep(requests, progress=False)


def _file_lines(path, n):
    return [json.loads(line) for line in path.read_text().splitlines()[:n]]


def test_default_pools_span_one_request_to_every_block(requests):
    """Worked from the JSON, not from kvlab's Request: the smallest pool holds the longest
    prompt+output plus SGLang's padding page; the largest adds every distinct hash id."""
    lines = sorted(_file_lines(SMALL, 200), key=lambda d: d["timestamp"])[:N_REQUESTS]
    longest = max(d["input_length"] + max(1, d["output_length"]) for d in lines)
    low = div_ceil(longest, 512) + 1
    unique = len({h for d in lines for h in d["hash_ids"]})
    pools = default_pool_pages(requests)
    assert pools[0] == low
    assert pools[-1] == unique + low
    assert len(pools) == 6 and pools == sorted(set(pools))
    ratios = [b / a for a, b in zip(pools, pools[1:])]
    assert max(ratios) / min(ratios) < 1.05  # log-spaced


def test_frame_is_tidy(result):
    frame = result.frame
    assert tuple(frame.columns) == COLUMNS
    assert len(frame) == 12 and set(frame["mode"]) == {"shortfall", "full"}
    assert (frame["kv_tokens"] == frame["kv_pages"] * 512).all()
    assert result.pivot().shape == (6, 2) and list(result.pivot().columns) == ["shortfall", "full"]


def test_shortfall_hit_rate_rises_with_the_pool(result, requests):
    fix = result.frame[result.frame["mode"] == "shortfall"].sort_values("kv_pages")
    rates = fix["hit_rate"].tolist()
    assert all(b >= a - 0.005 for a, b in zip(rates, rates[1:])), rates  # "-ish": admission order may shift
    assert rates[-1] > rates[0] + 0.1
    # A pool that can cache every block reaches, and cannot beat, an infinite cache (trace_stats'
    # ceiling, computed from the records by a separate trie walk); totals round to 6 places.
    records = sorted(read_records(SMALL), key=lambda r: r.timestamp_ms)[:N_REQUESTS]
    ideal = trace_stats(records).ideal_hit_rate
    assert ideal - 0.01 <= rates[-1] <= ideal + 1e-6
    assert (fix["over_evicted_tokens"] == 0).all()


def test_shortfall_never_loses_to_full_under_pressure(result):
    pivot = result.pivot("hit_rate")
    over = result.pivot("over_evicted_tokens")
    pressured = over["full"] > 0
    assert pressured.sum() >= 4, over
    assert (pivot.loc[pressured, "shortfall"] >= pivot.loc[pressured, "full"] - 1e-12).all(), pivot
    evicted = result.pivot("evicted_tokens")
    assert (evicted["full"] >= evicted["shortfall"]).all(), evicted


def test_a_row_is_a_direct_scheduler_run(result, requests):
    pages = int(result.frame["kv_pages"].iloc[2])
    totals = run(requests, eviction="full", page_size=512, kv_tokens=pages * 512, progress=False).totals()
    row = result.frame[(result.frame["mode"] == "full") & (result.frame["kv_pages"] == pages)].iloc[0]
    for column in COLUMNS[2:]:
        assert row[column] == totals[column], column


@pytest.mark.parametrize(
    ("pools", "message"),
    [
        ([4], r"pool_pages\[0\] = 4 pages \(2048 tokens\) is smaller than one request: 'mooncake_tiny-2' needs 6 pages"),
        ([100, 0], r"pool_pages\[1\]: expected a positive int \(pages\), got 0"),
        ([100, "64"], r"pool_pages\[1\]: expected a positive int \(pages\), got '64'"),
        ([True], r"pool_pages\[0\]: expected a positive int"),
        ([], "pool_pages is empty"),
    ],
)
def test_bad_pool_sizes(pools, message):
    with pytest.raises(PoolSizeError, match=message):
        sweep(load_trace(TINY), pools, progress=False)


def test_numpy_pool_sizes_are_ints():
    import numpy as np

    pools = np.array([30, 7, 30])  # sorted and run once each
    frame = sweep(load_trace(TINY), list(pools), modes=("shortfall",), progress=False).frame
    assert frame["kv_pages"].tolist() == [7, 30] and all(type(p) is int for p in frame["kv_pages"].tolist())
    with pytest.raises(PoolSizeError, match=r"pool_pages\[0\]: expected a positive int \(pages\), got 7\.5"):
        sweep(load_trace(TINY), [7.5], progress=False)


def test_bad_mode_and_no_requests():
    with pytest.raises(ValueError, match="modes must be a non-empty subset"):
        sweep(load_trace(TINY), [10], modes=("lazy",), progress=False)
    with pytest.raises(ValueError, match="no requests to sweep"):
        sweep([], [10], progress=False)


def _bad_trace(tmp_path):
    lines = TINY.read_text().splitlines()
    lines[2] = lines[2].replace('"input_length": 2062', '"input_length": -5')
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_malformed_trace_line_is_named(tmp_path, capsys):
    path = _bad_trace(tmp_path)
    with pytest.raises(TraceFormatError, match=r"bad\.jsonl:3: field 'input_length' must be an integer >= 1, got -5"):
        sweep(load_trace(path), progress=False)
    assert main(["--trace", str(path)]) == 2
    assert f"{path}:3: field 'input_length'" in capsys.readouterr().err
    assert main(["--trace", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    assert main(["--trace", str(tmp_path)]) == 2  # a folder, not a file
    assert str(tmp_path) in capsys.readouterr().err
    assert main(["--trace", str(TINY), "--pages", "3"]) == 2
    assert "smaller than one request" in capsys.readouterr().err


@pytest.mark.slow
def test_module_cli_json():
    out = subprocess.run([sys.executable, "-m", "kvlab.experiments.pool_sweep", "--trace", str(TINY), "--points", "3",
                          "--json"], capture_output=True, text=True, check=True, cwd=REPO_ROOT).stdout
    doc = json.loads(out)
    assert doc["num_requests"] == 5 and doc["page_size"] == 512
    assert [(r["mode"], r["kv_pages"]) for r in doc["rows"]] == [
        (m, p) for m in ("shortfall", "full") for p in default_pool_pages(load_trace(TINY), 512, 3)]
    direct = run(load_trace(TINY), eviction="shortfall", page_size=512,
                 kv_tokens=doc["rows"][0]["kv_pages"] * 512, progress=False).totals()
    assert doc["rows"][0]["hit_rate"] == direct["hit_rate"]
