"""The finding-2 panel headless: set the mode, assert on the gauge, table and timelines."""

import pytest

from kvlab.experiments import shortfall_eviction
from kvlab.viz.widgets import ShortfallPanel

SMALL = shortfall_eviction.PanelSettings(  # quicker than PANEL_DEFAULTS; the panel opens on whatever it is given
    workload="generated-shared-prefix",
    overrides=(("num_groups", 16), ("prompts_per_group", 8), ("output_len", 128)), kv_tokens=20_480)


@pytest.fixture(scope="module")
def panel():
    return ShortfallPanel(SMALL)


@pytest.mark.slow
def test_opens_on_the_regime_where_the_bug_shows():
    """With no argument the panel's setting is PANEL_DEFAULTS (notebook 02 section 2's), where full eviction
    costs at least PANEL_MIN_GAP_POINTS of hit rate, and the verdict says so."""
    defaults = shortfall_eviction.PANEL_DEFAULTS
    panel = ShortfallPanel()
    assert panel.settings() == defaults and panel.kv_tokens.value == defaults.kv_tokens
    assert {"slru", "priority"} <= set(panel.policy.options)
    comparison = panel.comparison()
    assert comparison.gap_points >= shortfall_eviction.PANEL_MIN_GAP_POINTS
    assert comparison.verdict() in panel.verdict.value.replace("&#x27;", "'")


def test_mode_toggle_moves_the_gauge_and_verdict(panel):
    comparison = panel.comparison()
    fix, bug = comparison.shortfall.totals(), comparison.full.totals()
    panel.mode.value = "shortfall"
    assert panel.gauge.data[0].value == pytest.approx(100 * fix["hit_rate"], abs=1e-3)
    assert "data-over-evicted='0'" in panel.verdict.value
    panel.mode.value = "full"
    assert panel.gauge.data[0].value == pytest.approx(100 * bug["hit_rate"], abs=1e-3)
    assert panel.gauge.data[0].delta.reference == pytest.approx(100 * fix["hit_rate"], abs=1e-3)
    assert f"data-over-evicted='{bug['over_evicted_tokens']}'" in panel.verdict.value
    assert bug["over_evicted_tokens"] > 0


def test_timelines_end_at_each_modes_hit_rate(panel):
    comparison = panel.comparison()
    hit = {t.name: t for t in panel.timelines.data if t.yaxis == "y3"}  # bottom row: hit rate so far
    assert hit["shortfall (the fix)"].y[-1] == pytest.approx(comparison.shortfall.hit_rate, abs=1e-4)
    assert hit["full (the bug)"].y[-1] == pytest.approx(comparison.full.hit_rate, abs=1e-4)


def test_pool_slider_reruns_both_arms(panel):
    before = panel.comparison()
    panel.kv_tokens.value = 65_536
    after = panel.comparison()
    assert after is not before and after.shortfall.hit_rate > before.shortfall.hit_rate
    panel.kv_tokens.value = 20_480
    assert panel.comparison() is before  # cached


def test_matches_the_experiment_run_directly(panel):
    requests = shortfall_eviction.load_requests(workload="generated-shared-prefix", seed=0,
                                                overrides=dict(SMALL.overrides))
    direct = shortfall_eviction.run(requests, eviction="full", kv_tokens=20_480, progress=False)
    assert direct.totals() == panel.comparison().full.totals()


def test_a_new_setting_shows_computing_until_it_is_drawn():
    """The status line says what is being computed while a setting not seen before runs, then clears;
    a cached setting (the mode toggle) never shows it."""
    panel = ShortfallPanel(SMALL)
    seen: list[str] = []
    panel.status.widget.observe(lambda change: seen.append(change["new"]), names="value")
    panel.mode.value = "full"  # both arms are cached: nothing to compute
    assert seen == []
    panel.kv_tokens.value = 24_576
    assert len(seen) == 2 and "computing both eviction modes on generated-shared-prefix" in seen[0]
    assert "24,576-token pool" in seen[0] and seen[1] == "" == panel.status.widget.value
