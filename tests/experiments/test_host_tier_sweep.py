"""Notebook 07's sections 3 and 4 and notebook 06's host axis (kvlab.experiments.host_tier_sweep): the scheduler
with a host tier on the shipped trace, finding 2's regime cells, and the sweep's numbers equal to what
``kvlab simulate`` prints for the same point."""

from __future__ import annotations

import pytest

from kvlab.experiments import host_tier_sweep as hts


@pytest.fixture(scope="module")
def small_pool_sweep():
    """The shipped trace at its smallest default pool (78 pages): device only, and a write-through host pool 4x."""
    return hts.host_sweep(kv_pages=[78], host_ratios=(0.0, 4.0), policies=("write_through",))


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
    assert row["moved_gb"] == pytest.approx(
        (totals["written_to_host_tokens"] + totals["loaded_back_tokens"]) * config.cost.kv_bytes_per_token / 1e9)
    point = hts.HostPoint(78, 4.0, "write_through", "full")
    assert point.cli_args() == ["--kv-pages", "78", "--page-size", "512", "--max-running", "16", "--eviction", "full",
                                "--hicache-ratio", "4", "--hicache-write-policy", "write_through"]


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
