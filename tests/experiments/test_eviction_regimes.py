"""Finding 2's regimes: the live panel's default regime holds its claimed gap, the comparison's tables and
series agree with the simulator's totals, and the regime sweeps are what compare / run_workload compute."""

import random

import pytest

from kvlab.experiments import eviction_regimes as er
from kvlab.experiments import hybrid_caches
from kvlab.experiments import shortfall_eviction as se

CHAT = er.Regime("chat, 16-token pages", "multi-turn-chat", (("num_sessions", 8), ("turns", 3)), page_size=16)


@pytest.fixture(scope="module")
def panel():
    return se.panel_comparison(progress=False)


def test_panel_defaults_show_the_gap_they_claim(panel):
    assert panel.gap_points >= se.PANEL_MIN_GAP_POINTS
    assert panel.gap_points == pytest.approx(100 * (panel.shortfall.hit_rate - panel.full.hit_rate))
    assert se.panel_comparison() is panel  # computed once per process
    requests = se.PANEL_DEFAULTS.requests()
    assert len(requests) == 64 * 8 and se.PANEL_DEFAULTS.run_options()["page_size"] == 128


def test_panel_regime_shows_what_the_notebook_says(panel):
    """The fix has more pressure events and more overshoot; the bug keeps more slots free and caches less;
    over-eviction is far larger than the difference in tokens evicted (most of it is evicted early, not extra)."""
    p = panel.pressure_frame()
    fix, bug = p["shortfall"], p["full"]
    assert fix["pressure_events"] > bug["pressure_events"] and fix["overshoot_tokens"] > bug["overshoot_tokens"]
    assert bug["free_tokens_avg"] > fix["free_tokens_avg"] and bug["cached_tokens_avg"] < fix["cached_tokens_avg"]
    assert bug["over_evicted_tokens"] > 3 * (bug["evicted_tokens"] - fix["evicted_tokens"]) > 0
    assert fix["evicted_per_event"] == pytest.approx(fix["evicted_tokens"] / fix["pressure_events"])


def test_summary_frame_and_verdict_are_the_totals_in_words(panel):
    """The bug's column, the fix's, then fix − bug; the account closes in words; the verdict splits the
    bug's extra prefill into its causes, and the parts add up to the whole."""
    fix, bug = panel.shortfall.totals(), panel.full.totals()
    frame = panel.summary_frame()
    assert list(frame.columns) == ["full (the bug)", "shortfall (the fix)", "difference (fix − bug)"]
    hit = frame.loc["hit rate (prompt tokens served from the cache)"]
    assert hit.iloc[0] == f"{bug['hit_rate']:.2%}" and hit.iloc[1] == f"{fix['hit_rate']:.2%}"
    assert hit.iloc[2] == f"+{100 * (fix['hit_rate'] - bug['hit_rate']):.2f} points"
    over = frame.loc["evicted earlier than needed (over-eviction)"]
    assert over.iloc[0] == f"{bug['over_evicted_tokens']:,}" and over.iloc[2] == f"−{bug['over_evicted_tokens']:,}"

    def n(label: str, col: int) -> int:
        return int(frame.loc[label].iloc[col].replace(",", "").replace("−", "-").replace("+", ""))

    for col in (0, 1):  # each arm's account closes as the table states it
        assert (n("prompt tokens served from the cache", col) + n("+ prompt tokens prefilled at first admission", col)
                == n("= prompt tokens of the workload", col) == fix["prompt_tokens"])
        assert (n("+ prompt tokens prefilled at first admission", col)
                + n("+ tokens prefilled again after a retraction", col) == n("= tokens prefilled in all (computed)", col))
    causes = panel.prefill_causes()
    assert causes["extra_prefill"] == causes["lost_hits"] + causes["reprefill"] > 0
    assert causes["reprefill"] > 0 and causes["lost_hits"] > 0  # both causes are present at PANEL_DEFAULTS
    verdict = panel.verdict()
    assert f"costs {panel.gap_points:.2f} points" in verdict and f"{bug['over_evicted_tokens']:,}" in verdict
    assert (f"prefilled {causes['extra_prefill']:,} more tokens: {causes['lost_hits']:,} prompt tokens the fix "
            f"served from the cache (early eviction); {causes['reprefill']:,} more tokens prefilled again after "
            f"retractions") in verdict


def test_identical_arms_get_a_negligible_verdict_not_an_accusation():
    """The tester's case: the panel's multi-turn-chat setting, where both modes hit exactly the same."""
    requests = se.load_requests(workload="multi-turn-chat", seed=0, overrides=dict(num_sessions=16, turns=4))
    c = se.compare(requests, kv_tokens=20_000, progress=False)
    assert c.gap_points == 0 and c.full.totals()["over_evicted_tokens"] > 0
    verdict = c.verdict()
    assert verdict.startswith("Negligible here: the same hit rate") and "earlier than needed" in verdict
    assert c.shortfall.totals()["evicted_tokens"] == c.full.totals()["evicted_tokens"]


def test_cumulative_frame_ends_at_the_totals(panel):
    frame = panel.cumulative_frame()
    for mode, result in panel.arms():
        arm = frame[frame["mode"] == mode]
        t = result.totals()
        first, last = arm.iloc[0], arm.iloc[-1]
        assert (first["time_s"], first["evicted_tokens"], first["pressure_events"]) == (0.0, 0, 0)
        assert last["evicted_tokens"] == t["evicted_tokens"] and last["over_evicted_tokens"] == t["over_evicted_tokens"]
        assert last["pressure_events"] == t["pressure_events"]
        assert last["hit_rate"] == pytest.approx(t["hit_rate"], abs=1e-6)
        assert last["time_s"] == pytest.approx(t["simulated_s"])
        for column in ("time_s", "evicted_tokens", "over_evicted_tokens", "pressure_events", "cached_prompt_tokens"):
            assert arm[column].is_monotonic_increasing, column
        assert set(arm["label"]) == {se.MODE_LABELS[mode]}


def test_distinct_tokens_is_a_trie_count():
    rng = random.Random(3)
    seqs = [[rng.randrange(4) for _ in range(rng.randrange(1, 9))] for _ in range(60)]
    trie: dict = {}
    nodes = 0
    for seq in seqs:
        node = trie
        for t in seq:
            if t not in node:
                node[t] = {}
                nodes += 1
            node = node[t]
    assert er.distinct_tokens(seqs) == nodes
    assert er.distinct_tokens([[1, 2, 3], [1, 2, 4], [5], [1, 2, 3, 4]]) == 6


def test_pool_tokens_are_page_aligned_shares_never_below_one_request():
    from kvlab.experiments.pool_sweep import min_pool_pages

    distinct = er.distinct_prompt_tokens(CHAT)
    assert er.pool_tokens(CHAT, 1.0) == -(-distinct // 16) * 16
    floor = min_pool_pages(er.regime_requests(CHAT), 16) * 16
    assert er.pool_tokens(CHAT, 1e-6) == floor
    with pytest.raises(ValueError, match="pool share must be > 0"):
        er.pool_tokens(CHAT, 0)
    with pytest.raises(ValueError, match="exactly one of workload= or trace="):
        er.Regime("neither").requests()


def test_regime_sweep_rows_are_compare_results_and_are_remembered():
    frame = er.regime_sweep([CHAT], (0.25, 1.5), progress=False)
    assert list(frame["share"]) == [0.25, 1.5] and set(frame["regime"]) == {CHAT.name}
    requests = er.regime_requests(CHAT)
    for row in frame.itertuples():
        c = se.compare(requests, progress=False, **CHAT.run_options(row.kv_tokens))
        fix, bug = c.shortfall.totals(), c.full.totals()
        assert (row.hit_rate_shortfall, row.hit_rate_full) == (fix["hit_rate"], bug["hit_rate"])
        assert row.gap_points == pytest.approx(100 * (fix["hit_rate"] - bug["hit_rate"]))
        assert (row.evicted_full, row.over_evicted_full, row.pressure_events_shortfall) == (
            bug["evicted_tokens"], bug["over_evicted_tokens"], fix["pressure_events"])
    key = (CHAT, int(frame["kv_tokens"].iloc[0]))
    cell = er._MEMO[key]
    er.regime_sweep([CHAT], (0.25,), progress=False)
    assert er._MEMO[key] is cell  # not run again
    table = er.gap_table(frame)
    assert list(table.columns) == ["25%", "150%"] and table.iloc[0, 0] == f"{frame['gap_points'].iloc[0]:.2f}"
    with pytest.raises(ValueError, match="processes must be >= 1"):
        er.regime_sweep([CHAT], processes=0)


@pytest.mark.slow
def test_regime_sweep_in_two_processes_equals_one():
    regime = er.Regime("chat, other seed", "multi-turn-chat", (("num_sessions", 6), ("turns", 3)), page_size=16, seed=5)
    both = er.regime_sweep([regime], (0.3, 0.6), processes=2, progress=False)
    cells = {k: v for k, v in er._MEMO.items() if k[0] == regime}
    for key in cells:
        del er._MEMO[key]
    here = er.regime_sweep([regime], (0.3, 0.6), processes=1, progress=False)
    assert both.equals(here)


def test_hybrid_sweep_averages_notebook_03s_runs():
    frame = er.hybrid_sweep((0.6,), seeds=(0, 1))
    assert list(frame["regime"]) == ["chat replay, plain radix tree", "chat replay, Mamba tree"]
    assert set(frame["group"]) == {f"{er.HYBRID} (mean of 2 seeds)"}
    for row, kind in zip(frame.itertuples(), ("radix", "mamba")):
        hits = {}
        for mode in se.MODES:
            runs = []
            for seed in (0, 1):
                seqs = hybrid_caches.multi_turn_workload(seed=seed, **er.HYBRID_WORKLOAD)
                pool = max(max(len(q) for q in seqs) + 1, round(0.6 * er.distinct_tokens(seqs)))
                runs.append(hybrid_caches.run_workload(kind, mode, seqs, pool_tokens=pool,
                                                       mamba_states=er.HYBRID_MAMBA_STATES).hit_rate)
            hits[mode] = sum(runs) / 2
        assert row.hit_rate_shortfall == pytest.approx(hits["shortfall"])
        assert row.gap_points == pytest.approx(100 * (hits["shortfall"] - hits["full"]))
    with pytest.raises(ValueError, match="at least one seed"):
        er.hybrid_sweep(seeds=())


@pytest.mark.slow
def test_notebook_02s_reading_of_the_regimes_holds():
    """The claims section 3 of notebook 02 makes about its grid."""
    frame = er.regime_sweep(processes=2, progress=False)
    panel_row = frame[frame["regime"] == er.REGIMES[0].name]
    assert panel_row["gap_points"].max() >= se.PANEL_MIN_GAP_POINTS
    assert panel_row.loc[panel_row["share"] == 2 / 3, "kv_tokens"].item() == se.PANEL_DEFAULTS.kv_tokens
    assert frame.loc[frame["page_size"] < 128, "gap_points"].max() < 1.5  # "about a point at most"
    assert (frame.loc[frame["share"] > 1, "gap_points"] == 0).all()
    assert frame.loc[frame["share"] == 1, "gap_points"].abs().max() < 1
    mooncake = frame[frame["regime"].str.startswith("Mooncake")]
    assert mooncake["gap_points"].abs().max() < 0.5
    hybrid = er.hybrid_sweep()
    mamba, plain = (hybrid[hybrid["regime"] == name].set_index("share")["gap_points"]
                    for name in ("chat replay, Mamba tree", "chat replay, plain radix tree"))
    assert (mamba >= plain).all() and mamba.max() < 2 and (mamba[mamba.index >= 0.8] == 0).all()
