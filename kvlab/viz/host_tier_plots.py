"""Figures for the host tier (notebook 07): pure functions, DataFrames in, ``plotly.graph_objects.Figure`` out.

- :func:`host_tier_icicles`: two-tier trees before a pressure event and after it in each eviction mode, one row
  per scenario (write policy, host pool), coloured by residency, what the event destroyed kept grey and hatched
  (``host_tier.pressure_events()``).
- :func:`policy_bars`: what each write policy moved and kept, both modes (``host_tier.policy_numbers()``).
- :func:`hit_rate_vs_host_size`: hit rate against host pool size, one line per eviction mode and series
  (``host_tier_sweep.hit_rate_frame``).
- :func:`host_regime_heatmap`: finding 2 with a host tier (``host_tier_sweep.regime_frame``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.mem_cache.tree_view import EVICTED, with_evicted
from kvlab.viz.eviction_plots import MODE_STYLE
from kvlab.viz.plots import RESIDENCY_COLOURS, RESIDENCY_NAMES, icicle_geometry
from kvlab.viz.theme import TEMPLATE

DESTROYED_STYLE = ("destroyed by this event (gone from both tiers)", "#c7c7c7", "/")
ROOT_COLOUR = "#eeeeee"


def _need(frame: pd.DataFrame, columns: set, what: str) -> None:
    missing = columns - set(frame.columns)
    if missing:
        raise ValueError(f"{what}: the table lacks columns {sorted(missing)}")


def residency_icicle_trace(frame: pd.DataFrame) -> go.Icicle:
    """An icicle of a two-tier ``tree_frame`` (or ``with_evicted``) table: width = ``path_tokens``, colour by
    ``residency`` (:data:`~kvlab.viz.plots.RESIDENCY_COLOURS`), destroyed nodes grey and hatched."""
    _need(frame, {"id", "parent_id", "path_tokens", "label", "status", "tokens", "residency"},
          "residency_icicle_trace")
    colours, hatches, words = [], [], []
    for status, residency in zip(frame["status"], frame["residency"]):
        if status == EVICTED:
            name, colour, hatch = DESTROYED_STYLE
        elif residency:
            name, colour, hatch = RESIDENCY_NAMES[residency], RESIDENCY_COLOURS[residency], ""
        else:
            name, colour, hatch = "root", ROOT_COLOUR, ""
        colours.append(colour)
        hatches.append(hatch)
        words.append(name)
    return go.Icicle(
        **icicle_geometry(frame), branchvalues="total", sort=False,
        marker=dict(colors=colours, pattern=dict(shape=hatches, fgcolor="#7f7f7f")),
        customdata=[[int(t), w] for t, w in zip(frame["tokens"], words)],
        hovertemplate="%{label}<br>%{customdata[0]:,} tokens on this node<br>%{customdata[1]}<extra></extra>",
        tiling=dict(orientation="v"), root=dict(color=ROOT_COLOUR), leaf=dict(opacity=1.0),
    )


def host_tier_icicles(rows: Sequence[tuple[str, pd.DataFrame, Sequence[pd.DataFrame]]],
                      columns: Sequence[str], height_per_row: int = 250) -> go.Figure:
    """One row per scenario: ``(row title, tree before, [tree after, ...])``, each panel the tree before the event
    at one scale with what the event destroyed kept in place, grey and hatched (``tree_view.with_evicted``).
    ``columns``: the panel titles of a row, ``before`` first. A legend names the colours."""
    if not rows:
        raise ValueError("host_tier_icicles: no scenarios to draw")
    ncols = len(columns)
    titles = []
    for title, _before, afters in rows:
        if len(afters) + 1 != ncols:
            raise ValueError(f"host_tier_icicles: row {title!r} has {len(afters) + 1} panels but {ncols} columns")
        titles += [f"{title}<br>{c}" for c in columns]
    fig = make_subplots(rows=len(rows), cols=ncols, specs=[[{"type": "domain"}] * ncols] * len(rows),
                        subplot_titles=titles, vertical_spacing=0.12 / max(1, len(rows) - 1) + 0.04)
    drawn = set()
    for r, (_title, before, afters) in enumerate(rows, 1):
        frames = [before] + [with_evicted(before, after) for after in afters]
        for c, frame in enumerate(frames, 1):
            fig.add_trace(residency_icicle_trace(frame), row=r, col=c)
            drawn |= {EVICTED if s == EVICTED else res for s, res in zip(frame["status"], frame["residency"])}
    legend = [(RESIDENCY_NAMES[k], colour, "") for k, colour in RESIDENCY_COLOURS.items() if k in drawn]
    if EVICTED in drawn:
        legend.append(DESTROYED_STYLE)
    for name, colour, hatch in legend:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, showlegend=True,
                                 marker=dict(symbol="square", size=14, color=colour,
                                             line=dict(color="#7f7f7f", width=1 if hatch else 0))))
    fig.update_annotations(font_size=12)
    fig.update_layout(xaxis=dict(visible=False), yaxis=dict(visible=False), template=TEMPLATE,
                      height=80 + height_per_row * len(rows), margin=dict(t=60, l=10, r=10, b=10),
                      legend=dict(orientation="h", y=-0.02), plot_bgcolor="rgba(0,0,0,0)")
    return fig


POLICY_BARS = (  # column of policy_numbers(), title
    ("written_to_host_tokens", "tokens written to host"),
    ("loaded_back_tokens", "tokens loaded back"),
    ("destroyed_tokens", "tokens destroyed by eviction"),
    ("hit_rate", "hit rate (device + loaded back)"),
)


def policy_bars(frame: pd.DataFrame, title: str = "Write policies on the same requests") -> go.Figure:
    """Small multiples, one per quantity (:data:`POLICY_BARS`): a bar per write policy and eviction mode, the
    number written on the bar. ``frame``: ``host_tier.policy_numbers()``."""
    _need(frame, {"write_policy", "mode"} | {c for c, _ in POLICY_BARS}, "policy_bars")
    fig = make_subplots(rows=1, cols=len(POLICY_BARS), subplot_titles=[t for _, t in POLICY_BARS],
                        horizontal_spacing=0.06)
    policies = list(dict.fromkeys(frame["write_policy"]))
    for mode, (name, colour, _dash) in MODE_STYLE.items():
        arm = frame[frame["mode"] == mode].set_index("write_policy")
        if arm.empty:
            continue
        for col, (column, _t) in enumerate(POLICY_BARS, 1):
            values = [float(arm.loc[p, column]) for p in policies]
            text = [f"{v:.1%}" if column == "hit_rate" else f"{int(v):,}" for v in values]
            fig.add_trace(go.Bar(x=[p.replace("_selective", "<br>selective") for p in policies], y=values, name=name, legendgroup=mode, showlegend=col == 1,
                                 marker_color=colour, text=text, textposition="outside", textfont_size=10,
                                 hovertemplate=f"{name}<br>%{{x}}: %{{text}}<extra></extra>"), row=1, col=col)
        fig.update_yaxes(tickformat=".0%", row=1, col=len(POLICY_BARS))
    fig.update_xaxes(tickangle=0)
    fig.update_layout(title=title, template=TEMPLATE, barmode="group", height=430,
                      legend=dict(orientation="h", y=-0.25), margin=dict(t=80, l=50, r=20, b=90))
    return fig


def hit_rate_vs_host_size(frame: pd.DataFrame, title: str = "Hit rate against host pool size") -> go.Figure:
    """One line per eviction mode (and ``series`` when the frame has one): x = ``host_gib`` (the host pool in GiB;
    0 = no host tier), y = ``hit_rate``; hover names the host ratio and the tokens loaded back. ``frame``: one row
    per run with ``mode``, ``host_gib``, ``host_ratio``, ``hit_rate``, ``loaded_back_tokens``."""
    _need(frame, {"mode", "host_gib", "host_ratio", "hit_rate", "loaded_back_tokens"}, "hit_rate_vs_host_size")
    fig = go.Figure()
    series = list(dict.fromkeys(frame["series"])) if "series" in frame else [None]
    for s in series:
        part = frame if s is None else frame[frame["series"] == s]
        for mode, (name, colour, dash) in MODE_STYLE.items():
            arm = part[part["mode"] == mode].sort_values("host_gib")
            if arm.empty:
                continue
            label = name if s is None else f"{s}, {name}"
            fig.add_trace(go.Scatter(
                x=arm["host_gib"].round(3).tolist(), y=arm["hit_rate"].round(6).tolist(), name=label,
                mode="lines+markers", line=dict(color=colour, dash=dash, width=2),
                customdata=[[f"{r:g}", f"{int(t):,}"] for r, t in zip(arm["host_ratio"], arm["loaded_back_tokens"])],
                hovertemplate=(f"{label}<br>host pool %{{x:.2f}} GiB (ratio %{{customdata[0]}})<br>hit rate "
                               "%{y:.2%}<br>%{customdata[1]} tokens loaded back<extra></extra>")))
    fig.update_xaxes(title_text="host pool (GiB; 0 = no host tier)", rangemode="tozero")
    fig.update_yaxes(title_text="hit rate (device + loaded back)", tickformat=".0%", rangemode="tozero")
    fig.update_layout(title=title, template=TEMPLATE, height=420, legend=dict(orientation="h", y=-0.2),
                      margin=dict(t=60, l=70, r=20, b=80))
    return fig


def host_regime_heatmap(frame: pd.DataFrame) -> go.Figure:
    """The regime map of finding 2 with a host tier (``host_tier_sweep.regime_frame``): one panel per write policy
    (the device-only runs first), a row per host ratio, a column per device pool; each cell the hit-rate points full
    eviction loses (shortfall − full). Notebook 02's ``regime_heatmap``, titled for the host tier."""
    from kvlab.viz.eviction_plots import regime_heatmap

    fig = regime_heatmap(frame, title="Hit rate lost to full eviction (the bug) with a host tier, in points")
    fig.update_xaxes(title_text="device KV pool, as a share of the trace's distinct prompt pages")
    return fig
