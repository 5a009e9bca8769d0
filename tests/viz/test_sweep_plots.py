"""The sweep plot: one line and one bar trace per mode, carrying the frame's numbers."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from kvlab.experiments.pool_sweep import sweep
from kvlab.viz.sweep_plots import hit_rate_vs_pool
from kvlab.workloads.mooncake import load_trace
from tests.conftest import REPO_ROOT

TINY = REPO_ROOT / "data" / "traces" / "mooncake_tiny.jsonl"


def test_plot_carries_the_sweep():
    frame = sweep(load_trace(TINY), [12, 7, 30], progress=False).frame
    fig = hit_rate_vs_pool(frame)
    assert isinstance(fig, go.Figure)
    lines = [t for t in fig.data if t.yaxis == "y"]  # top row: hit rate
    bars = [t for t in fig.data if t.yaxis == "y2"]  # bottom row: over-evicted tokens
    assert [t.name for t in lines] == ["shortfall (the fix)", "full (the bug)"]
    for trace, mode in zip(lines, ("shortfall", "full")):
        part = frame[frame["mode"] == mode].sort_values("kv_pages")
        assert list(trace.x) == [7, 12, 30]  # sorted by pool, whatever order was asked
        assert list(trace.y) == part["hit_rate"].round(6).tolist()
        assert [c[0] for c in trace.customdata] == part["kv_tokens"].tolist()
        assert "hit rate" in trace.hovertemplate
    assert len(lines) == len(bars) == 2 and all(isinstance(t, go.Scatter) for t in fig.data)
    for trace, mode in zip(bars, ("shortfall", "full")):
        assert list(trace.x) == [7, 12, 30] and not trace.showlegend
        assert list(trace.y) == frame[frame["mode"] == mode].sort_values("kv_pages")["over_evicted_tokens"].tolist()
    assert fig.layout.xaxis.type == "log"


def test_single_panel_and_unknown_mode_label():
    frame = pd.DataFrame({"mode": ["other"], "kv_pages": [8], "kv_tokens": [4096], "hit_rate": [0.5],
                          "evicted_tokens": [1], "over_evicted_tokens": [0], "prefill_tokens_computed": [2],
                          "retractions": [0]})
    fig = hit_rate_vs_pool(frame, over_evicted=False)
    assert len(fig.data) == 1 and fig.data[0].name == "other" and list(fig.data[0].y) == [0.5]


def test_ideal_line():
    frame = sweep(load_trace(TINY), [7, 30], progress=False).frame
    fig = hit_rate_vs_pool(frame, ideal_hit_rate=0.478)
    (line,) = [s for s in fig.layout.shapes if s.type == "line"]
    assert (line.y0, line.y1) == (0.478, 0.478) and line.yref == "y"
    assert "47.8%" in fig.layout.annotations[-1].text
    assert not hit_rate_vs_pool(frame).layout.shapes
