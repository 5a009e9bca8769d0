"""Figures for notebook 03 (hybrid caches): pure DataFrame -> plotly Figure."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from kvlab.viz.theme import TEMPLATE

_MODE_COLOURS = {"shortfall": "#1f77b4", "full": "#d62728"}


def eviction_cost_bars(df: pd.DataFrame) -> go.Figure:
    """Prefill tokens recomputed beyond shortfall mode, per cache and eviction mode
    (``hybrid_caches.eviction_mode_comparison``'s table: ``cache``, ``mode``,
    ``extra_prefill_tokens``, ``hit_rate``)."""
    missing = {"cache", "mode", "extra_prefill_tokens", "hit_rate"} - set(df.columns)
    if missing:
        raise ValueError(f"eviction_cost_bars: DataFrame lacks columns {sorted(missing)}")
    fig = go.Figure()
    for mode, sub in df.groupby("mode", sort=False):
        fig.add_bar(name=f"{mode} eviction", x=list(sub["cache"]), y=list(sub["extra_prefill_tokens"]),
                    marker_color=_MODE_COLOURS.get(mode), customdata=list(sub["hit_rate"]),
                    hovertemplate="%{x}: %{y} extra prefill tokens<br>hit rate %{customdata:.1%}<extra></extra>")
    fig.update_layout(title="Extra prefill caused by full-num_tokens eviction", barmode="group",
                      xaxis_title="tree", yaxis_title="prefill tokens beyond shortfall mode",
                      template=TEMPLATE, height=360)
    return fig


def swa_pool_bars(event) -> go.Figure:
    """Per-pool view of one SWA pressure event (``hybrid_caches.SWAPressureEvent``): available,
    shortfall and freed tokens for the full and the SWA pool."""
    pools = ["full pool", "SWA pool"]
    fig = go.Figure()
    fig.add_bar(name="available before", x=pools, y=[event.full_available, event.swa_available])
    fig.add_bar(name="shortfall", x=pools, y=[event.full_shortfall, event.swa_shortfall])
    fig.add_bar(name="freed by the tree", x=pools, y=[event.full_evicted, event.swa_evicted])
    fig.add_hline(y=event.need_tokens, line_dash="dot", annotation_text=f"need {event.need_tokens}")
    fig.update_layout(title="SWA tree: one shortfall per pool", barmode="group", yaxis_title="tokens",
                      template=TEMPLATE, height=340)
    return fig
