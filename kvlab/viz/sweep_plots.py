"""Pure plots of a KV pool-size sweep (``kvlab.experiments.pool_sweep.SweepResult.frame``)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

MODE_STYLE = {  # mode -> (legend label, colour): the fix solid blue, the bug dashed red, as in notebook 02
    "shortfall": ("shortfall (the fix)", "#1f77b4", "solid"),
    "full": ("full (the bug)", "#d62728", "dash"),
}


def hit_rate_vs_pool(frame: pd.DataFrame, *, over_evicted: bool = True, ideal_hit_rate: float | None = None) -> go.Figure:
    """Hit rate against pool size (log x), one line per mode; below it, over-evicted tokens per mode
    (``fig.data``: per mode, its hit-rate line, then its over-evicted line on the second row).

    Hover shows the pool in pages and tokens and what each run evicted and recomputed. ``ideal_hit_rate``
    (e.g. ``trace_stats(records).ideal_hit_rate``) draws the infinite-cache ceiling as a dotted line."""
    rows = 2 if over_evicted else 1
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        row_heights=[0.65, 0.35] if over_evicted else None,
                        subplot_titles=("prefix-cache hit rate", "over-evicted tokens")[:rows])
    for mode, part in frame.groupby("mode", sort=False):
        part = part.sort_values("kv_pages")
        label, colour, dash = MODE_STYLE.get(mode, (mode, None, "solid"))
        custom = part[["kv_tokens", "evicted_tokens", "over_evicted_tokens", "prefill_tokens_computed"]].values.tolist()
        fig.add_trace(
            go.Scatter(
                x=part["kv_pages"].tolist(), y=part["hit_rate"].round(6).tolist(), name=label, mode="lines+markers",
                legendgroup=mode, line=dict(color=colour, dash=dash), customdata=custom,
                hovertemplate=(f"<b>{label}</b><br>pool: %{{x}} pages (%{{customdata[0]:,}} tokens)"
                               "<br>hit rate: %{y:.2%}<br>evicted: %{customdata[1]:,} tokens"
                               "<br>over-evicted: %{customdata[2]:,} tokens"
                               "<br>prefill computed: %{customdata[3]:,} tokens<extra></extra>"),
            ),
            row=1, col=1,
        )
        if over_evicted:
            # markers, not bars: a bar's width is in data units, so on a log axis the bars would be
            # uneven (wide at small pools, slivers at large ones)
            fig.add_trace(
                go.Scatter(x=part["kv_pages"].tolist(), y=part["over_evicted_tokens"].tolist(), name=label,
                           mode="lines+markers", legendgroup=mode, showlegend=False,
                           line=dict(color=colour, dash=dash),
                           hovertemplate=f"{label}<br>pool: %{{x}} pages<br>over-evicted: %{{y:,}} tokens<extra></extra>"),
                row=2, col=1,
            )
    if ideal_hit_rate is not None:
        fig.add_hline(y=ideal_hit_rate, line=dict(color="#555", dash="dot", width=1), row=1, col=1,
                      annotation_text=f"infinite cache {ideal_hit_rate:.1%}", annotation_position="top left")
    fig.update_xaxes(type="log")
    fig.update_xaxes(title_text="KV pool size (pages)", row=rows, col=1)
    fig.update_yaxes(title_text="hit rate", tickformat=".0%", rangemode="tozero", row=1, col=1)
    if over_evicted:
        fig.update_yaxes(title_text="tokens", rangemode="tozero", row=2, col=1)
    fig.update_layout(title="Hit rate against KV pool size", hovermode="closest", height=600 if over_evicted else 420)
    return fig
