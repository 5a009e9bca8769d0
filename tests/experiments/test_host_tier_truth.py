"""Issue 35: notebook 07 says what its numbers say. Section 2's claims are computed from the shipped trace (not a
toy where the policies rank otherwise), section 3 draws a curve per write policy, one host-link bandwidth prices
every copy, sizes are in one unit family, section 1's header stands over its own columns, a bug is shown before its
fix with fix − bug after them, and the README's HiCache headline is computed where notebook 07 and the report show
it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvlab.experiments import host_tier as ht
from kvlab.experiments import host_tier_sweep as hts

ROOT = Path(__file__).resolve().parents[2]
NB07 = (ROOT / "notebooks" / "07_host_tier.py").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def sizes():
    """Sections 2 and 3's runs: the shipped trace at 157 pages, every policy, host ratios 0 to 8."""
    return hts.host_sweep(kv_pages=[hts.CURVE_POOL_PAGES], host_ratios=hts.CURVE_HOST_RATIOS, policies=hts.POLICIES,
                          processes=1)


def _section(number: int) -> str:
    return NB07.split(f"# ## {number} ·")[1].split("# ## ")[0]


# ---- section 2: the claims are the shipped trace's ------------------------------------------------------------------
def test_section_2_ranks_the_policies_from_the_shipped_trace(sizes):
    numbers = hts.policy_numbers(sizes)
    assert sorted(set(numbers["host_ratio"])) == list(hts.POLICY_HOST_RATIOS)
    verdict = hts.policy_verdict(numbers)
    for ratio in hts.POLICY_HOST_RATIOS:
        at = numbers[numbers["host_ratio"] == ratio].set_index("write_policy")["hit_rate"]
        ranking = hts.policy_ranking(numbers, ratio)
        assert [r for _, r in ranking] == sorted(at, reverse=True)
        best, worst = ranking[0][0], ranking[-1][0]
        assert f"{best} gets the most hits" in verdict and f"over {worst}" in verdict
    # the numbers: at ratio 1 write_back and write_through_selective beat write_through by 6-9 points
    ratio1 = dict(hts.policy_ranking(numbers, 1.0))
    assert ratio1["write_back"] > ratio1["write_through_selective"] > ratio1["write_through"]
    assert "host ratio 1: write_back 35.61% > write_through_selective 32.92% > write_through 26.24%" in verdict


def test_section_2_runs_the_shipped_trace_and_claims_no_ranking_in_prose():
    """The 60-turn toy ranked the policies otherwise; its prose ("the same hits as write_through", "the lowest hit
    rate") contradicted the shipped trace. Section 2 now runs the trace and prints the ranking it computes."""
    section = _section(2)
    assert "host_tier_sweep.host_sweep(" in section and "policy_verdict(" in section
    assert "policy_runs(" not in section
    for claim in ("the same hits as", "the lowest hit rate", "the most hits:", "the fewest hits"):
        assert claim not in section, claim


# ---- section 3: one curve per policy, and why ---------------------------------------------------------------------------
def test_section_3_draws_the_curve_per_write_policy(sizes):
    from kvlab.viz import host_tier_plots

    frame = hts.hit_rate_frame(sizes, hts.CURVE_POOL_PAGES)
    curve = hts.curve_table(sizes)
    fig = host_tier_plots.hit_rate_vs_host_size(frame)
    lines = {t.name: t for t in fig.data}
    assert set(lines) == set(hts.POLICIES)
    for policy in hts.POLICIES:
        assert list(lines[policy].y) == curve[f"hit rate, {policy}"].round(6).tolist()
        assert list(lines[policy].x) == curve["host pool (GiB)"].tolist()
    gains = {p: curve.loc[1.0, f"{p}: points over no host tier"] for p in hts.POLICIES}
    assert min(gains, key=gains.get) == "write_through" and gains["write_back"] - gains["write_through"] > 5
    text = hts.host_gain_text(curve)
    assert "write_through gains least" in text and "duplicates what the device holds" in text
    assert f"write_back {'+' if gains['write_back'] > 0 else ''}{gains['write_back']:.2f} points" in text
    assert "policies=host_tier_sweep.POLICIES" in _section(3) and "host_gain_text(" in _section(3)


# ---- one host-link bandwidth -----------------------------------------------------------------------------------------
def test_one_host_link_bandwidth_prices_every_copy():
    """Sections 1-2 and the live panel used a 25 GB/s placeholder, sections 3-4 and the CLI 55 GB/s."""
    from kvlab.mem_cache.hicache.cache_controller import DEFAULT_HOST_DEVICE_BYTES_PER_S
    from kvlab.sched.config import SchedulerConfig
    from kvlab.viz.tree_widget import HostTierPanel

    scheduler = SchedulerConfig(kv_tokens=4096, hicache_ratio=2.0).cost
    figures = {scheduler.host_to_device_bytes_per_s, scheduler.device_to_host_bytes_per_s,
               DEFAULT_HOST_DEVICE_BYTES_PER_S}
    cache, _ = ht.make_cache(4096)  # sections 1 and 2's trees
    panel = HostTierPanel(start_requests=1, seed=0)
    for ctl in (cache.cache_controller, panel.demo.cache.cache_controller):
        figures |= {ctl.d2h_bytes_per_s, ctl.h2d_bytes_per_s}
    assert len(figures) == 1
    (bandwidth,) = figures
    assert f"{bandwidth / 1e9:g} GB/s" in ht.host_link_text()
    assert NB07.count("host_link_text()") == 1  # stated once on screen


# ---- units and section 1's header ----------------------------------------------------------------------------------
def test_sizes_are_binary_and_bandwidth_is_stated_in_gb_per_s(sizes):
    """Issue 35: MB and GB beside GiB and MiB. Every table of notebook 07 names sizes in MiB or GiB."""
    events = ht.pressure_events()
    finding2 = hts.finding2_frame(hts.host_sweep(kv_pages=[hts.CURVE_POOL_PAGES], host_ratios=(0.0, 1.0),
                                                 policies=hts.POLICIES, processes=1))
    labels = [*ht.events_table(events).index, *hts.policy_table(hts.policy_numbers(sizes)).columns,
              *hts.curve_table(sizes).columns, *hts.finding2_table(finding2).columns]
    words = " ".join(labels) + " " + hts.finding2_verdict(finding2) + " " + ht.host_link_text()
    assert not re.search(r"\b[MG]B\b(?!/s)", words), words
    assert "MiB written to host" in labels and any("GiB" in label for label in labels)
    assert not re.search(r"\b[MG]B\b(?!/s)", NB07), "notebook 07's prose names sizes in MB or GB"


def test_section_1_header_stands_over_its_own_columns():
    """The transposed table had a three-level header whose spans put policy names over other columns. Each column
    now carries one flat label naming its policy, host pool and mode, the bug's column before the fix's."""
    events = ht.pressure_events()
    table = ht.events_table(events)
    frame = ht.events_frame(events)
    assert table.columns.nlevels == 1 and len(table.columns) == len(events)
    for label in table.columns:
        policy, host, mode = label.split(" · ")
        row = frame[(frame["write policy"] == policy) & (frame["eviction"] == mode)
                    & (frame["host pool (tokens)"] == int(host.split()[1].replace(",", "")))]
        assert len(row) == 1 and table[label]["destroyed"] == row.iloc[0]["destroyed"]
    modes = [label.split(" · ")[2] for label in table.columns]
    assert modes == ["full (the bug)", "shortfall (the fix)"] * len(ht.EVENT_SCENARIOS)
    assert ".set_index(" not in _section(1)


# ---- order and sign ------------------------------------------------------------------------------------------------
def test_finding2_table_is_bug_fix_then_fix_minus_bug_with_signs():
    finding2 = hts.finding2_frame(hts.host_sweep(kv_pages=[78], host_ratios=(0.0, 1.0), policies=("write_back",),
                                                 processes=1))
    table = hts.finding2_table(finding2)
    columns = list(table.columns)
    assert columns.index("hit rate, bug (full)") < columns.index("hit rate, fix (shortfall)") < columns.index(
        "hit rate, fix − bug")
    device = table[table["host tier"] == "none"].iloc[0]
    assert device["hit rate, fix − bug"].startswith("+")  # the fix hits more: a positive fix − bug, never a "loss"
    verdict = hts.finding2_verdict(finding2)
    assert "points less than the fix (fix − bug: +" in verdict and "costs up to" not in verdict


def test_notebooks_show_the_bug_first_and_never_a_plus_on_a_loss():
    """Notebook 02 printed "51.88% → 46.55%" (fix → bug) beside its headline's "46.55 % → 51.88 %"; notebooks 02 and
    07 drew the fix's icicle before the bug's; notebook 06 printed a loss as "+0.58"."""
    nb02 = (ROOT / "notebooks" / "02_shortfall_eviction.py").read_text(encoding="utf-8")
    nb06 = (ROOT / "notebooks" / "06_capacity_planning.py").read_text(encoding="utf-8")
    for source in (nb02, NB07):
        assert "hit_rate_shortfall:.2%} → {row.hit_rate_full" not in source
        assert re.search(r'"after full eviction \(the bug\)", "after shortfall eviction \(the fix\)"', source)
    assert "hit rate {row.hit_rate_full:.2%} → {row.hit_rate_shortfall:.2%}" in nb02
    for line in (nb02 + nb06 + NB07).splitlines():
        if re.search(r"\b(loss|lost|loses)\b", line):
            assert ":+" not in line.split("(fix − bug")[0], line


def test_hover_and_tables_of_notebooks_02_and_03_put_the_bug_first():
    from kvlab.experiments import hybrid_caches
    from kvlab.viz import hybrid_plots
    from kvlab.viz.eviction_plots import regime_heatmap

    df = hybrid_caches.eviction_mode_comparison()
    assert list(hybrid_caches.comparison_table(df)["eviction"])[:2] == ["full (the bug)", "shortfall (the fix)"]
    hover = hybrid_plots.eviction_cost_bars(df).data[0].hovertemplate
    assert hover.index("(the bug)") < hover.index("(the fix)")
    regimes = hts.regime_frame(hts.finding2_frame(hts.host_sweep(kv_pages=[78], host_ratios=(0.0,), processes=1)),
                               1000)
    hover = regime_heatmap(regimes).data[0].hovertemplate
    assert hover.index("full (the bug)") < hover.index("shortfall (the fix)")


# ---- the README's HiCache headline, computed -----------------------------------------------------------------------
def test_the_readme_hicache_headline_is_computed_in_notebook_07_and_the_report():
    from kvlab.report.summary import _hicache_summary, headlines

    line = next(x for x in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
                if x.startswith("# HiCache's host tier"))
    shown = re.search(r"hit rate (\d+\.\d\d %) → (\d+\.\d\d %)", line).groups()
    head = hts.hicache_headline()
    assert (head.kv_pages, head.host_ratio) == (hts.HEADLINE_POOL_PAGES, hts.HEADLINE_HOST_RATIO)
    assert f"hit rate {shown[0]} → {shown[1]}" in head.text()
    assert "hicache_headline().text()" in NB07
    summary = {"hicache_host_tier": _hicache_summary()}
    (report,) = [h for h in headlines({**_finding_stubs(), **summary}) if h.title.startswith("HiCache")]
    assert (report.rows[0][1], report.rows[0][2]) == shown and report.rows[0][3].startswith("+")


def _finding_stubs() -> dict:
    arm = {"max_total_num_tokens": 1, "max_req_input_len": 1, "available_bytes": 1, "accepted": True,
           "prompt_tokens": 1, "error": None}
    f1 = {"without_gc": arm, "with_gc": arm, "preset": "p", "model": "m", "tp_size": 1, "device_description": "d",
          "source": "s"}
    sim = {"hit_rate": 0.5, "over_evicted_tokens": 0, "prefill_tokens_computed": 1}
    f2 = {"full": sim, "shortfall": sim, "overrides": {}, "workload": "w", "seed": 0, "kv_tokens": 1,
          "device_description": "d", "source": "s"}
    return {"finding1_kv_pool_sizing": f1, "finding2_shortfall_eviction": f2}
