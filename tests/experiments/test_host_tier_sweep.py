"""Notebook 07's sections 3 and 4 and notebook 06's host axis (kvlab.experiments.host_tier_sweep): the scheduler
with a host tier on the shipped trace, finding 2's regime cells, and the sweep's numbers equal to what
``kvlab simulate`` prints for the same point."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from kvlab.experiments import host_tier_sweep as hts


@pytest.fixture(scope="module")
def small_pool_sweep():
    """The shipped trace at its smallest default pool (78 pages): device only, and a write-through host pool 4x."""
    return hts.host_sweep(kv_pages=[78], host_ratios=(0.0, 4.0), policies=("write_through",), processes=1)


def test_the_regime_cell_where_the_bug_costs_nothing_is_really_zero(small_pool_sweep):
    f2 = hts.finding2_frame(small_pool_sweep).set_index("write_policy")
    device, host = f2.loc[hts.DEVICE_ONLY], f2.loc["write_through"]
    assert device["gap_points"] > 0 and device["lost_hit_tokens"] > 0  # without a host tier the bug costs hits
    assert host["gap_points"] == 0 and host["lost_hit_tokens"] == 0  # with one, exactly none ...
    assert host["hit_rate_shortfall"] == host["hit_rate_full"] > device["hit_rate_shortfall"]
    assert host["extra_evicted_tokens"] > 0  # ... though it still evicts early: demoted, then loaded back
    regime = hts.regime_frame(hts.finding2_frame(small_pool_sweep), hts.unique_prompt_pages())
    cell = regime[regime["write_policy"] == "write_through"].iloc[0]
    assert (cell["gap_points"], cell["regime"], cell["group"]) == (0, "host ratio 4", "host tier, write_through")
    assert cell["share"] == 78 / hts.unique_prompt_pages()


def test_a_sweep_point_is_the_schedulers_own_run(small_pool_sweep):
    """The notebook's numbers are ``kvlab.sched.simulate``'s for the point's config (what ``kvlab simulate`` runs)."""
    from kvlab.sched import SchedulerConfig, simulate

    row = small_pool_sweep[(small_pool_sweep["host_ratio"] == 4.0) & (small_pool_sweep["mode"] == "full")].iloc[0]
    config = SchedulerConfig(kv_tokens=78 * 512, page_size=512, max_running=16, eviction="full", hicache_ratio=4.0,
                             hicache_write_policy="write_through")
    totals = simulate(hts.trace_requests(), config, progress=False).totals()
    for key in ("hit_rate", "device_hit_tokens", "host_hit_tokens", "loaded_back_tokens", "written_to_host_tokens",
                "host_evicted_tokens"):
        assert row[key] == totals[key], key
    assert row["host_tokens"] == config.host_pool().size_tokens
    assert row["moved_gib"] == pytest.approx(
        (totals["written_to_host_tokens"] + totals["loaded_back_tokens"]) * config.cost.kv_bytes_per_token / 2**30)
    point = hts.HostPoint(78, 4.0, "write_through", "full")
    assert point.cli_args() == ["--trace", "data/traces/mooncake_small.jsonl", "--kv-pages", "78", "--page-size",
                                "512", "--max-running", "16", "--eviction", "full", "--hicache-ratio", "4",
                                "--hicache-write-policy", "write_through"]
    assert hts.HostPoint(78, 1 / 3, "write_back", "full").cli_args(trace="t.jsonl")[1::2][-2:] == [
        "0.3333333333333333", "write_back"]  # the ratio reads back exactly


def test_host_sweep_names_bad_axes():
    with pytest.raises(ValueError, match="write policy must be one of.*got 'write_around'"):
        hts.host_sweep(kv_pages=[78], policies=("write_around",))
    with pytest.raises(ValueError, match="host ratio must be a number >= 0.*got -1"):
        hts.host_sweep(kv_pages=[78], host_ratios=(-1,))


def test_capacity_gains_a_host_axis():
    from kvlab.experiments import capacity

    result = capacity.run(pool_pages=[78], max_running=[16], num_requests=60, workers=1, progress=False)
    axis = capacity.host_axis(result, [4], processes=1)
    rates = axis.hit_rates()
    device = result.hit_rates(16)
    assert rates[(0.0, "shortfall")].tolist() == device["shortfall"].tolist()  # the sweep's own rows
    assert axis.gain_points().loc[78, 4.0] > 0  # a host pool adds hits at a pool that turns over
    assert "--hicache-ratio 4 --hicache-write-policy write_through" in axis.cli(78, 4)
    with pytest.raises(ValueError, match="at least one ratio > 0"):
        capacity.host_axis(result, [0])


# ---- notebook 07's numbers are kvlab simulate's: the CLI, run on the points the tables and figures show -----------
POOL = hts.CURVE_POOL_PAGES  # 157 pages: a column of section 4's regime map and section 3's device pool
CLI_POINTS = (
    hts.HostPoint(POOL, 0.0, hts.DEVICE_ONLY, "full"),  # the device-only server
    hts.HostPoint(POOL, 4.0, "write_through", "shortfall"),  # a host pool 4x, both eviction modes
    hts.HostPoint(POOL, 4.0, "write_through", "full"),
    hts.HostPoint(POOL, 1.0, "write_back", "full"),  # write_back at ratio 1 (run from a shell below)
)
CLI_KEYS = ("hit_rate", "cached_prompt_tokens", "device_hit_tokens", "host_hit_tokens", "loaded_back_tokens",
            "written_to_host_tokens", "host_evicted_tokens", "transfer_s", "evicted_tokens", "over_evicted_tokens",
            "prompt_tokens")


@pytest.fixture(scope="module")
def notebook_sweep():
    """The notebook's sweep rows at these points (sections 3 and 4 share the 157-page runs)."""
    sweeps = [hts.host_sweep(kv_pages=[POOL], host_ratios=ratios, policies=(policy,), processes=1)
              for ratios, policy in (((0.0, 4.0), "write_through"), ((1.0,), "write_back"))]
    return pd.concat(sweeps, ignore_index=True)


def _cli_json(point: hts.HostPoint, capsys) -> dict:
    from kvlab.cli import main

    assert main(["simulate", *point.cli_args(), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_tables_and_figures_show_what_kvlab_simulate_prints(notebook_sweep, capsys):
    from kvlab.viz import host_tier_plots

    cli = {p: _cli_json(p, capsys) for p in CLI_POINTS}
    for point, totals in cli.items():  # every number of the sweep's row is the CLI's
        row = notebook_sweep.set_index(["host_ratio", "write_policy", "mode"]).loc[
            (point.host_ratio, point.write_policy, point.mode)]
        assert {k: row[k] for k in CLI_KEYS} == {k: totals[k] for k in CLI_KEYS}, point
        assert (totals["kv_tokens"], totals["eviction"]) == (POOL * 512, point.mode)
    dev, fix, bug, wb = (cli[p] for p in CLI_POINTS)
    assert fix["host_hit_tokens"] > 0 and wb["written_to_host_tokens"] > 0 and dev["host_hit_tokens"] == 0

    curve = hts.curve_table(notebook_sweep, POOL, ("write_through",))  # section 3's table ...
    assert curve.loc[4.0, "hit rate, write_through"] == fix["hit_rate"]
    assert curve.loc[0.0, "hit rate, write_through"] == notebook_sweep.query(
        "host_ratio == 0 and mode == 'shortfall'")["hit_rate"].iloc[0]
    figure = host_tier_plots.hit_rate_vs_host_size(hts.hit_rate_frame(notebook_sweep, POOL, ("write_through",)))
    drawn = {t.name: dict(zip(t.x, t.y)) for t in figure.data}  # ... and its figure
    assert sorted(drawn["write_through"].values())[-1] == fix["hit_rate"]
    finding2 = hts.finding2_frame(notebook_sweep).set_index(["host_ratio", "write_policy"])  # section 4's table ...
    wt = finding2.loc[(4.0, "write_through")]
    assert (wt["hit_rate_shortfall"], wt["hit_rate_full"]) == (fix["hit_rate"], bug["hit_rate"])
    assert wt["gap_points"] == round(100 * (fix["hit_rate"] - bug["hit_rate"]), 4)
    assert wt["lost_hit_tokens"] == fix["cached_prompt_tokens"] - bug["cached_prompt_tokens"]
    assert wt["extra_evicted_tokens"] == bug["evicted_tokens"] - fix["evicted_tokens"]
    assert wt["extra_transfer_s"] == round(bug["transfer_s"] - fix["transfer_s"], 6)
    assert finding2.loc[(1.0, "write_back"), "hit_rate_full"] == wb["hit_rate"]
    words = hts.finding2_table(finding2.reset_index()).set_index("host tier")
    assert words.loc["ratio 1, write_back", "hit rate, bug (full)"] == f"{wb['hit_rate']:.2%}"
    assert words.loc["none", "hit rate, bug (full)"] == f"{dev['hit_rate']:.2%}"
    regime = hts.regime_frame(finding2.reset_index(), hts.unique_prompt_pages())  # ... and its regime map
    heat = host_tier_plots.host_regime_heatmap(regime)
    cell = {tuple(t.y): t.z for t in heat.data}[("host ratio 4",)]
    assert cell[0][0] == round(100 * (fix["hit_rate"] - bug["hit_rate"]), 4)


def test_the_printed_command_runs_in_a_shell(notebook_sweep):
    """One real ``python -m kvlab simulate`` process: the write_back point's command line gives its sweep row."""
    point = CLI_POINTS[-1]
    out = subprocess.run([sys.executable, "-m", "kvlab", "simulate", *point.cli_args(), "--json"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    totals = json.loads(out)
    row = notebook_sweep[notebook_sweep["write_policy"] == "write_back"].set_index("mode").loc["full"]
    assert {k: row[k] for k in CLI_KEYS} == {k: totals[k] for k in CLI_KEYS}
    assert totals["written_to_host_tokens"] > 0 and totals["eviction"] == "full"
