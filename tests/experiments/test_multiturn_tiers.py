"""Notebook 07's section 7: the multi-turn benchmark on three tiers. The bars drawn, the table and
``kvlab simulate --workload multiturn ... --json``'s ``rounds`` are the same numbers; the drop-off and finding 2 are
read from the runs; the published sglang#33984 table comes out equal."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvlab.experiments import multiturn_tiers as mt
from kvlab.viz.multiturn_plots import round_tier_bars


def _cli_rounds(setting: mt.TierSetting) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "kvlab.cli", "simulate", *setting.cli_args(), "--json"],
                         capture_output=True, text=True, check=True, timeout=300)
    return json.loads(out.stdout)["rounds"]


@pytest.mark.parametrize("setting", [mt.DEFAULT, mt.TierSetting(2.0, "wait_complete")], ids=lambda s: s.label())
def test_drawn_equals_table_equals_cli(setting):
    frame = mt.tier_rounds(mt.run(setting))
    table = mt.rounds_table(frame)
    fig = round_tier_bars(frame)
    bars = [t for t in fig.data if t.type == "bar"]
    drawn = [sum(t.y[i] for t in bars) for i in range(len(frame))]
    cli = _cli_rounds(setting)
    assert [row["round"] for row in cli] == list(frame["round"])
    for i, row in enumerate(cli):
        assert drawn[i] == pytest.approx(row["cache_hit_rate"], abs=1e-6)
        assert float(table["hit rate"].iloc[i]) == row["cache_hit_rate"]
        assert row["cached_tokens"] == sum(int(t.customdata[i]) for t in bars)
        assert row["storage_hit_tokens"] == frame["storage_hit_tokens"].iloc[i]


def test_tiers_add_up_and_storage_serves_late_rounds():
    frame = mt.tier_rounds(mt.run(mt.TierSetting(2.0, "wait_complete")))
    assert (frame["device_hit_tokens"] >= 0).all() and (frame["host_hit_tokens"] >= 0).all()
    total = frame["device_hit_tokens"] + frame["host_hit_tokens"] + frame["storage_hit_tokens"]
    assert (total == frame["cached_tokens"]).all()
    assert list(frame["cache_hit_rate"]) == mt.ideal_rates()  # waits for every page: the ideal, every round
    assert frame["storage_hit_tokens"].iloc[-1] > frame["device_hit_tokens"].iloc[-1] + frame["host_hit_tokens"].iloc[-1]


def test_dropoff_is_best_effort_and_moves_with_host_ratio():
    frame = mt.dropoff_frame(host_ratios=(2.0, 4.0), policies=("best_effort", "wait_complete"))
    by = {(r, p): row for r, p, row in zip(frame["host_ratio"], frame["prefetch_policy"], frame.itertuples())}
    import math

    assert math.isnan(by[(2.0, "wait_complete")].first_round_below_ideal)  # on the ideal throughout
    assert by[(2.0, "best_effort")].prefetch_aborted_tokens > 0
    assert by[(2.0, "best_effort")].first_round_below_ideal < by[(4.0, "best_effort")].first_round_below_ideal
    assert "best_effort" in mt.dropoff_text(frame)


def test_finding2_table_is_bug_fix_difference():
    frame = mt.finding2_frame()
    table = mt.finding2_table(frame)
    assert [c[1] for c in table.columns[:3]] == ["bug (full)", "fix (shortfall)", "fix − bug"]
    bug = frame[(frame["case"] == mt.STORAGE_CASES[0][0]) & (frame["mode"] == "full")].iloc[0]
    fix = frame[(frame["case"] == mt.STORAGE_CASES[0][0]) & (frame["mode"] == "shortfall")].iloc[0]
    assert fix["moved_gib"] - bug["moved_gib"] < 0  # the bug's extra copies
    text = mt.finding2_text(frame)
    assert f"GiB moved −{bug['moved_gib'] - fix['moved_gib']:.2f}" in text and "best_effort" in text
    small = frame[frame["case"] == mt.STORAGE_CASES[1][0]]
    assert (small["mean_ttft_s"].to_numpy() > frame[frame["case"] == mt.STORAGE_CASES[0][0]]["mean_ttft_s"].to_numpy()).all()


def test_published_table_reproduced(tmp_path):
    comparison = mt.published_comparison()
    rows = comparison.as_dict()["rounds"]
    assert [r["simulated_cache_hit_rate"] for r in rows] == list(mt.PUBLISHED_RATES) == mt.ideal_rates()
    path = mt.write_published_table(tmp_path / mt.TABLE_FILE)  # the file for a shell, the same numbers
    out = subprocess.run([sys.executable, "-m", "kvlab.cli", "simulate", "--compare-table", str(path), "--json"],
                         capture_output=True, text=True, check=True, timeout=300)
    assert [r["simulated_cache_hit_rate"] for r in json.loads(out.stdout)["rounds"]] == list(mt.PUBLISHED_RATES)
    with pytest.raises(FileExistsError):
        mt.write_published_table(path)  # never overwrites


def test_published_rates_match_the_shared_file():
    from tests.shared_data import real_data

    shared = real_data("hicache_tables_examples.jsonl")
    if shared is None:
        pytest.skip("../shared/real-data/hicache_tables_examples.jsonl is absent (a clone has no ../shared)")
    records = [json.loads(line) for line in shared.read_text().splitlines() if line.strip()]
    rec = next(r for r in records if r.get("id") == "sglang-issue-33984-ratio2")
    assert tuple(r["cache_hit_rate"] for r in rec["rows"]) == mt.PUBLISHED_RATES
    assert tuple(r["avg_ttft_s"] for r in rec["rows"]) == mt.PUBLISHED_TTFT_S
