"""Figures for notebook 03 (hybrid caches): pure DataFrame -> plotly Figure."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from kvlab.viz.theme import BUG_COLOUR, TEMPLATE

TREE_NAMES = {"radix": "plain radix tree", "mamba": "Mamba radix tree"}


def eviction_cost_bars(df: pd.DataFrame) -> go.Figure:
    """Prefill tokens full eviction (the bug) recomputed beyond shortfall eviction (the fix), one bar per
    tree (``hybrid_caches.eviction_mode_comparison``'s table: ``cache``, ``mode``, ``extra_prefill_tokens``,
    ``extra_prefill_pct``, ``hit_rate``). Only the full-mode rows are drawn — the shortfall rows are the
    zero they are measured from — so the one legend entry names exactly the bars there are."""
    missing = {"cache", "mode", "extra_prefill_tokens", "extra_prefill_pct", "hit_rate"} - set(df.columns)
    if missing:
        raise ValueError(f"eviction_cost_bars: DataFrame lacks columns {sorted(missing)}")
    full = df[df["mode"] == "full"]
    if full.empty:
        raise ValueError("eviction_cost_bars: the table has no mode == 'full' rows to draw")
    base = df[df["mode"] == "shortfall"].set_index("cache")["hit_rate"]
    extra = [int(v) for v in full["extra_prefill_tokens"]]
    fig = go.Figure(go.Bar(
        name="full eviction (the bug), beyond shortfall eviction (the fix)",
        x=[TREE_NAMES.get(c, c) for c in full["cache"]], y=extra, marker_color=BUG_COLOUR, showlegend=True,
        text=[f"{e:,} tokens ({p:.2f} %)" for e, p in zip(extra, full["extra_prefill_pct"])], textposition="outside",
        customdata=[[f"{h:.2%}", f"{base.get(c, float('nan')):.2%}"] for c, h in zip(full["cache"], full["hit_rate"])],
        hovertemplate="%{x}: %{y:,} extra prefill tokens<br>hit rate %{customdata[0]} (the bug) → "
                      "%{customdata[1]} (the fix)<extra></extra>"))
    fig.update_layout(title="Extra prefill caused by full eviction (the bug)", xaxis_title="radix tree",
                      yaxis_title="prefill tokens beyond shortfall eviction", template=TEMPLATE, height=360,
                      legend=dict(orientation="h", y=-0.25), yaxis=dict(rangemode="tozero", tickformat=",d"))
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
                      xaxis_title="KV pool",
                      template=TEMPLATE, height=340)
    return fig
