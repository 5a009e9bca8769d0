"""Notebook 02's and 03's eviction figures draw exactly the numbers the experiments computed."""

import pandas as pd
import pytest

from kvlab.experiments import eviction_regimes as er
from kvlab.experiments import hybrid_caches
from kvlab.experiments import shortfall_eviction as se
from kvlab.mem_cache.tree_view import EVICTED, with_evicted
from kvlab.viz import eviction_plots as ep
from kvlab.viz import hybrid_plots


@pytest.fixture(scope="module")
def comparison():
    requests = se.load_requests(workload="generated-shared-prefix", seed=0,
                                overrides=dict(num_groups=8, prompts_per_group=4, output_len=64))
    return se.compare(requests, kv_tokens=8192, page_size=16, progress=False)


def test_cumulative_eviction_draws_both_modes_on_shared_axes(comparison):
    frame = comparison.cumulative_frame()
    fig = ep.cumulative_eviction(frame)
    names = [t.name for t in fig.data]
    assert names.count("shortfall (the fix)") == names.count("full (the bug)") == len(ep.CUMULATIVE_ROWS)
    assert ep.OVER_EVICTED_NAME in names
    for mode, (name, _, _) in ep.MODE_STYLE.items():
        arm = frame[frame["mode"] == mode]
        traces = [t for t in fig.data if t.name == name]
        for trace, (column, _) in zip(traces, ep.CUMULATIVE_ROWS):
            expected = arm[column].round(6).tolist() if column == "hit_rate" else arm[column].tolist()
            assert list(trace.y) == expected and list(trace.x) == arm["time_s"].round(4).tolist()
        # each row holds both modes on one pair of axes
        assert [t.yaxis for t in traces] == ["y", "y2", "y3"]
    over = next(t for t in fig.data if t.name == ep.OVER_EVICTED_NAME)
    assert list(over.y) == frame.loc[frame["mode"] == "full", "over_evicted_tokens"].tolist() and over.yaxis == "y"
    assert fig.layout.xaxis.matches == "x3" or fig.layout.xaxis2.matches == "x3"  # shared time axis
    assert fig.layout.xaxis3.title.text == "simulated time (seconds)"
    assert [fig.layout[f"yaxis{i if i > 1 else ''}"].title.text for i in (1, 2, 3)] == [t for _, t in ep.CUMULATIVE_ROWS]
    with pytest.raises(ValueError, match="lacks columns"):
        ep.cumulative_eviction(frame.drop(columns=["pressure_events"]))


def _sweep_frame():
    rows = []
    for g, regimes in (("A", ("one", "two")), ("B", ("three",))):
        for i, r in enumerate(regimes):
            for j, share in enumerate((0.5, 1.0)):
                gap = 1.25 * i + 0.5 * j
                rows.append(dict(group=g, regime=r, share=share, kv_tokens=1000 * (j + 1), gap_points=gap,
                                 hit_rate_shortfall=0.5, hit_rate_full=0.5 - gap / 100))
    return pd.DataFrame(rows)


def test_regime_heatmap_cells_are_the_gaps():
    frame = _sweep_frame()
    fig = ep.regime_heatmap(frame)
    assert len(fig.data) == 2 and [a.text for a in fig.layout.annotations][:2] == ["A", "B"]
    a, b = fig.data
    assert list(a.y) == ["one", "two"] and list(a.x) == ["50%", "100%"]
    assert [list(r) for r in a.z] == [[0.0, 0.5], [1.25, 1.75]]
    assert [list(r) for r in a.text] == [["0.00", "0.50"], ["1.25", "1.75"]]
    assert list(b.y) == ["three"] and [list(r) for r in b.z] == [[0.0, 0.5]]
    assert a.coloraxis == b.coloraxis == "coloraxis" and fig.layout.coloraxis.cmax == 1.75
    assert a.customdata[1][1][0] == "2,000" and a.customdata[1][1][2] == "48.25%"
    assert "points" in fig.layout.coloraxis.colorbar.title.text
    assert "share of the workload's distinct prompt tokens" in fig.layout.xaxis.title.text


def test_regime_heatmap_of_a_real_sweep():
    regime = er.Regime("chat", "multi-turn-chat", (("num_sessions", 6), ("turns", 3)), page_size=16)
    frame = pd.concat([er.regime_sweep([regime], (0.3, 1.0), progress=False), er.hybrid_sweep((0.3,), seeds=(0,))],
                      ignore_index=True)
    fig = ep.regime_heatmap(frame)
    rows, columns, z = ep.gap_matrix(frame[frame["group"] == er.SCHEDULER])
    assert [list(r) for r in fig.data[0].z] == z and list(fig.data[0].x) == columns == ["30%", "100%"]
    assert list(fig.data[1].z[1]) == frame.loc[frame["regime"] == "chat replay, Mamba tree", "gap_points"].tolist()


def test_icicles_keep_the_scale_and_mark_what_was_evicted():
    events = {mode: se.pressure_event(mode) for mode in se.MODES}
    before = events["shortfall"].frame_before
    fig = ep.radix_icicles_before_after(before, [events["shortfall"].frame_after, events["full"].frame_after],
                                        ["before", "fix", "bug"])
    icicles = [t for t in fig.data if t.type == "icicle"]
    assert len(icicles) == 3
    for trace in icicles:  # one scale: every panel has the before tree's widths
        assert list(trace.values) == before["path_tokens"].tolist() and list(trace.ids) == before["id"].astype(str).tolist()
    for trace, mode in zip(icicles[1:], se.MODES):
        grey = {label for label, colour, hatch in zip(trace.labels, trace.marker.colors, trace.marker.pattern.shape)
                if colour == ep.TREE_STATUS[EVICTED][1] and hatch == "/"}
        assert len(grey) == len(events[mode].destroyed) == {"shortfall": 2, "full": 3}[mode]
    legend = [t.name for t in fig.data if t.type == "scatter"]
    assert legend == ["evictable leaf", "shared prefix (inner node)", "evicted by this event"]
    assert fig.layout.xaxis.visible is False
    with pytest.raises(ValueError, match="3 panels but 2 titles"):
        ep.radix_icicles_before_after(before, [before, before], ["a", "b"])


def test_with_evicted_refuses_frames_of_different_trees():
    event = se.pressure_event("full")
    merged = with_evicted(event.frame_before, event.frame_after)
    assert merged["evicted"].sum() == 3 and (merged.loc[merged["evicted"], "status"] == EVICTED).all()
    assert merged["path_tokens"].equals(event.frame_before["path_tokens"])
    with pytest.raises(ValueError, match="not in the tree before"):
        with_evicted(event.frame_after.iloc[:1], event.frame_before)


def test_eviction_cost_bars_legend_names_the_only_bars_drawn():
    df = hybrid_caches.eviction_mode_comparison()
    fig = hybrid_plots.eviction_cost_bars(df)
    assert len(fig.data) == 1 and fig.data[0].showlegend
    full = df[df["mode"] == "full"]
    assert list(fig.data[0].y) == full["extra_prefill_tokens"].tolist()
    assert list(fig.data[0].x) == ["plain radix tree", "Mamba radix tree"]
    mamba = full[full["cache"] == "mamba"].iloc[0]
    assert fig.data[0].text[1] == f"{mamba['extra_prefill_tokens']:,} tokens ({mamba['extra_prefill_pct']:.2f} %)"
    with pytest.raises(ValueError, match="no mode == 'full' rows"):
        hybrid_plots.eviction_cost_bars(df[df["mode"] == "shortfall"])


def test_icicle_labels_are_readable_or_hidden():
    from kvlab.experiments import shortfall_eviction

    events = {mode: shortfall_eviction.pressure_event(mode) for mode in shortfall_eviction.MODES}
    fig = ep.radix_icicles_before_after(events["shortfall"].frame_before,
                                        [events["shortfall"].frame_after, events["full"].frame_after], ["a", "b", "c"])
    assert fig.layout.uniformtext.minsize >= 10 and fig.layout.uniformtext.mode == "hide"
